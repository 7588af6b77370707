//! `gpuslice dra`: the kubelet side of a Kubernetes DRA driver.
//!
//! The plugin registers with the kubelet's plugin watcher
//! (`pluginregistration.v1`, type `DRAPlugin`, services `v1.DRAPlugin` and
//! `v1beta1.DRAPlugin`: [`server`]) and serves `NodePrepareResources` /
//! `NodeUnprepareResources` in both versions. Preparing a claim reads it
//! from the API server ([`apiserver`]), turns its allocation results for
//! this driver into slices ([`claim`]), writes one CDI spec per claim with
//! exactly the consumed memory and compute ([`driver`]) and checkpoints it
//! on disk ([`checkpoint`]) so that a restarted plugin still knows it.
//!
//! The node's devices are published as ResourceSlices ([`publish`]):
//! whole GPUs, pre-created MIG devices, and per GPU a shared device with
//! consumable `memory` and `compute`.
//!
//! An unhealthy GPU (critical XID) stays in the pool with its devices
//! tainted `NoSchedule` until it recovers; GPUs appearing or disappearing
//! are rediscovered and re-published without a restart ([`hotplug`]).

pub mod apiserver;
pub mod checkpoint;
pub mod claim;
pub mod claimfs;
pub mod daemon;
pub mod driver;
pub mod feed;
pub mod health;
pub mod hotplug;
pub mod podcheck;
pub mod policy;
pub mod publish;
pub mod quantity;
pub mod server;

/// An error and its sources on one line, as the kubelet and the log get
/// it: the errors here keep their cause as a source, not in their text.
pub fn one_line(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let m = s.to_string();
        if !out.contains(&m) {
            out = format!("{out}: {m}");
        }
        src = s.source();
    }
    out.replace('\n', " ")
}

/// A module of each generated proto package: `module => "package"`.
macro_rules! proto_modules {
    ($($module:ident => $package:literal),* $(,)?) => {
        $(
            pub mod $module {
                tonic::include_proto!($package);
            }
        )*
    };
}

/// The generated kubelet APIs.
#[allow(clippy::all, missing_docs)]
pub mod api {
    proto_modules! {
        v1 => "k8s.io.kubelet.pkg.apis.dra.v1",
        v1beta1 => "k8s.io.kubelet.pkg.apis.dra.v1beta1",
        registration => "pluginregistration",
    }
    /// `k8s.io/kubelet/pkg/apis/dra-health`, by version.
    pub mod health {
        proto_modules! {
            v1alpha1 => "v1alpha1",
            v1beta1 => "v1beta1",
            v1 => "v1",
        }
    }
}

/// The driver name: `spec.devices.requests[].deviceClassName`'s classes
/// select it, allocation results name it, CDI kinds are derived from it.
pub const DRIVER_NAME: &str = "gpu.gpuslice.io";
/// The registration's plugin type.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The services served, as the registration lists them (newest first).
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];
/// The CDI kind of claim devices: `gpuslice.dev/claim=<name>`.
pub const CDI_VENDOR: &str = "gpuslice.dev";
pub const CDI_CLASS: &str = "claim";
