//! What the DRA driver's test modules share: the node they publish for,
//! this node's pool as the API double holds it, and the publisher run as
//! the plugin runs it.

use fakegpu::FakeHost;
use gpuslice_core::discover::DiscoverOptions;
use gpuslice_core::{HostRoot, Inventory};
use gpuslice_dra::apiserver::KubeApi;
use gpuslice_dra::driver::{ClaimRef, Options};
use gpuslice_dra::feed::NodeFeed;
use gpuslice_dra::publish::{follow, slice_name, SharedPolicy};
use gpuslice_dra::DRIVER_NAME;
use gpuslice_health::Snapshot;
use gpuslice_testkit::fakeapi::FakeApiServer;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use tokio::sync::watch;

/// The node whose pool the tests publish and whose claims they prepare.
pub const NODE: &str = "node-a";

/// The API double and a client of it (no token).
pub async fn fake_api() -> (FakeApiServer, KubeApi) {
    let fake = FakeApiServer::start().await;
    let api = KubeApi::new(&fake.url, None).unwrap();
    (fake, api)
}

/// Slice 0 of [`NODE`]'s pool, once published.
pub fn pool_slice(api: &FakeApiServer) -> Option<Value> {
    api.slices().remove(&slice_name(NODE, DRIVER_NAME, 0))
}

/// Slice 0 of [`NODE`]'s pool, which must be published.
pub fn published_slice(api: &FakeApiServer) -> Value {
    pool_slice(api).expect("slice 0 published")
}

/// The devices of slice 0 of [`NODE`]'s pool (none before it is published).
pub fn published_devices(api: &FakeApiServer) -> Vec<Value> {
    pool_slice(api)
        .and_then(|s| s["spec"]["devices"].as_array().cloned())
        .unwrap_or_default()
}

/// The names of `devices` (a slice's `spec.devices`).
pub fn device_names<'a>(devices: impl IntoIterator<Item = &'a Value>) -> Vec<String> {
    devices
        .into_iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

/// The names of the devices published for [`NODE`] now.
pub fn published_names(api: &FakeApiServer) -> Vec<String> {
    device_names(&published_devices(api))
}

/// Publishes [`NODE`]'s pool as the plugin does, from `inventory` and
/// `health`, with a resync of an hour: only the watch and the feed make it
/// write. It ends when either feed's sender goes.
pub fn follow_for_an_hour(
    api: KubeApi,
    policy: SharedPolicy,
    inventory: watch::Receiver<Inventory>,
    health: watch::Receiver<Snapshot>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        follow(
            &api,
            DRIVER_NAME,
            NodeFeed::enforced(NODE, policy, inventory, health),
            Duration::from_secs(3600),
        )
        .await
    })
}

/// The driver's options for [`NODE`]'s `inventory` on `host_root`, its
/// CDI specs and state below `dir`, without the shim: a test sets what it
/// needs otherwise with `..`.
pub fn driver_options(host_root: HostRoot, inventory: Inventory, dir: &Path) -> Options {
    Options {
        driver_name: DRIVER_NAME.into(),
        pool: NODE.into(),
        host_root,
        inventory,
        cdi_dir: dir.join("cdi"),
        state_dir: dir.join("state"),
        shim: None,
        hook: None,
        strip_host_root: false,
        policy: SharedPolicy::default(),
        refuse_unenforceable: false,
        claims_dir: None,
    }
}

/// A claim in namespace `ns` as the driver's own API names it
/// (`Driver::prepare` without a kubelet).
pub fn claim_ref(name: &str, uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// A fake host of `gpus` GPUs, the guard that serves its fake NVML to this
/// process (keep it as long as the host), its root, and the discovery
/// options that read it through NVML as the plugin does.
pub fn nvml_host(
    gpus: u32,
) -> (
    FakeHost,
    gpuslice_testkit::fakenvml::Serve,
    HostRoot,
    DiscoverOptions,
) {
    let h = FakeHost::builder().gpus(gpus).build().unwrap();
    let nvml = gpuslice_testkit::fakenvml::serve(h.root());
    let root = HostRoot::new(h.root());
    let opts = DiscoverOptions {
        nvml_lib: Some(h.nvml_lib()),
        ..DiscoverOptions::default()
    };
    (h, nvml, root, opts)
}

/// Waits (10 s at most) until the XID watcher that sends on `health`
/// watches the driver's events.
pub async fn wait_for_the_xid_watcher(health: &mut watch::Receiver<Snapshot>) {
    tokio::time::timeout(
        Duration::from_secs(10),
        health.wait_for(|s| s.watching == "events"),
    )
    .await
    .expect("the XID watcher runs")
    .unwrap();
}
