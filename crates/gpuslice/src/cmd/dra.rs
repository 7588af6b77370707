//! `gpuslice dra`: the DRA kubelet plugin (gpuslice-dra). It registers
//! with the kubelet's plugin watcher and prepares claims into slices with
//! one CDI spec each, and publishes the node's ResourceSlices (docs/dra.md).

use anyhow::{Context, Result};
use clap::Args;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::HostRoot;
use gpuslice_dra::apiserver::ApiTarget;
use gpuslice_dra::daemon::{self, DaemonOptions};
use gpuslice_dra::driver::Options;
use gpuslice_dra::publish::SharedPolicy;
use gpuslice_dra::server::Sockets;
use gpuslice_ledger::limits::MemorySize;
use std::path::PathBuf;

use crate::global::Global;

#[derive(Debug, Args)]
pub struct DraArgs {
    /// This node's name: the pool the scheduler allocates from.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,

    /// The DRA driver name (allocation results and DeviceClasses name it).
    #[arg(long, default_value = gpuslice_dra::DRIVER_NAME)]
    pub driver_name: String,

    /// The API server (`https://HOST[:PORT]`, or `http://` for a test double); default: the
    /// kubeconfig ($KUBECONFIG, ~/.kube/config) if any, else the pod's service account.
    #[arg(long, value_name = "URL", env = "GPUSLICE_DRA_API_SERVER")]
    pub api_server: Option<String>,

    /// A file holding the bearer token to show the API server (re-read as it rotates), in
    /// place of the inferred credentials.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// The kubelet's plugins directory (the DRA socket goes in `<DIR>/<driver>/dra.sock`).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet/plugins")]
    pub plugins_dir: PathBuf,

    /// The kubelet's plugin registry directory (`<DIR>/<driver>-reg.sock`).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub registry_dir: PathBuf,

    /// Where each prepared claim's CDI spec is written.
    #[arg(long, value_name = "DIR", default_value = gpuslice_cdi::DYNAMIC_DIR)]
    pub cdi_dir: PathBuf,

    /// Where the checkpoint of prepared claims is kept.
    #[arg(long, value_name = "DIR", env = DRA_STATE_DIR_ENV, default_value = gpuslice_dra::checkpoint::DEFAULT_DIR)]
    pub state_dir: PathBuf,

    /// Write CDI host paths relative to --host-root (the plugin runs in a pod with the host mounted there).
    #[arg(long)]
    pub strip_host_root: bool,

    /// GPU memory is requested in multiples of this (a multiple of 1MiB). A request that names
    /// no memory or compute takes all of the GPU's (the whole GPU).
    #[arg(long, value_name = "SIZE", default_value = "1MiB")]
    pub memory_step: MemorySize,

    /// The gpuslice binary the claims' CDI hooks run (the params overlay, the
    /// driver's memory limits), as this plugin sees it: the runtime runs it
    /// on the host, so in a pod a copy on the host (under --host-root, which
    /// --strip-host-root removes in the specs), with gpuslice-full beside it.
    /// Default: this binary.
    #[arg(long, value_name = "PATH")]
    pub hook: Option<PathBuf>,

    /// Refuse to prepare a claim reserved for a pod its caps cannot hold against (privileged,
    /// CAP_SYS_ADMIN, hostPID, hostIPC, hostNetwork); without it such a claim is prepared and marked.
    #[arg(long)]
    pub refuse_unenforceable: bool,
}

/// The variable naming the DRA plugin's state directory, for `dra`,
/// `slices` and `exporter` alike.
pub const DRA_STATE_DIR_ENV: &str = "GPUSLICE_DRA_STATE_DIR";

/// The DRA plugin's state directory as `slices` and `exporter` find it:
/// `$GPUSLICE_DRA_STATE_DIR`, else the default below the host root.
pub fn state_dir(global: &Global) -> PathBuf {
    std::env::var_os(DRA_STATE_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            global
                .host_root
                .join(gpuslice_dra::checkpoint::DEFAULT_DIR.trim_start_matches('/'))
        })
}

/// The node name and the directories, checked before anything is made:
/// a relative directory would be taken below the working directory, a
/// missing CDI directory would hold specs no runtime reads.
fn check_paths(args: &DraArgs) -> Result<()> {
    let name = &args.node_name;
    let dns = !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|l| !l.is_empty() && !l.starts_with('-') && !l.ends_with('-'))
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !dns {
        anyhow::bail!("--node-name {name:?}: a node's name (a DNS subdomain: lowercase letters, digits, '-' and '.'), as `kubectl get nodes` lists it");
    }
    for (flag, dir) in [
        ("--plugins-dir", &args.plugins_dir),
        ("--registry-dir", &args.registry_dir),
        ("--cdi-dir", &args.cdi_dir),
        ("--state-dir", &args.state_dir),
    ] {
        if !dir.is_absolute() {
            anyhow::bail!("{flag} {}: an absolute path is required", dir.display());
        }
    }
    if let Some(hook) = args
        .hook
        .as_ref()
        .filter(|p| !p.is_absolute() || !p.is_file())
    {
        anyhow::bail!(
            "--hook {}: not an absolute path to a file; expected the host's copy of the gpuslice binary as this plugin sees it (e.g. /host/usr/local/lib/gpuslice/gpuslice)",
            hook.display()
        );
    }
    if !args.cdi_dir.is_dir() {
        anyhow::bail!(
            "--cdi-dir {}: no such directory; it must be one the container runtime reads CDI specs from (containerd, CRI-O: /etc/cdi, /var/run/cdi)",
            args.cdi_dir.display()
        );
    }
    Ok(())
}

pub fn run(global: &Global, args: &DraArgs) -> Result<i32> {
    // Bad flags fail before the (slower) discovery.
    let api = ApiTarget::new(args.api_server.as_deref(), args.token_file.as_deref())?;
    let policy = SharedPolicy {
        memory_step: args.memory_step.0,
    };
    policy.validate()?;
    check_paths(args)?;
    let shim = crate::shim::find().map_err(|e| {
        anyhow::anyhow!("the shim: {e}; without it no share of a GPU can be capped (set GPUSLICE_SHIM to libgpuslice.so)")
    })?;
    if let Some(why) = daemon::enforcement_problem(Some(&shim)) {
        anyhow::bail!(
            "{why}; set GPUSLICE_SHIM to a root-owned libgpuslice.so others cannot write"
        );
    }
    let host_root = HostRoot::new(&global.host_root);
    let inventory =
        discover(&host_root, &DiscoverOptions::default()).context("discovering the GPUs")?;
    let driver = Options {
        driver_name: args.driver_name.clone(),
        pool: args.node_name.clone(),
        host_root: host_root.clone(),
        inventory,
        cdi_dir: args.cdi_dir.clone(),
        state_dir: args.state_dir.clone(),
        shim: Some(shim),
        hook: match &args.hook {
            Some(p) => Some(p.clone()), // checked by check_paths
            None => std::env::current_exe()
                .ok()
                .and_then(|p| p.canonicalize().ok()),
        },
        strip_host_root: args.strip_host_root,
        policy,
        refuse_unenforceable: args.refuse_unenforceable,
        claims_dir: None,
    };
    let again = host_root.clone();
    daemon::run(DaemonOptions {
        driver,
        rediscover: std::sync::Arc::new(move || {
            discover(&again, &DiscoverOptions::default()).context("rediscovering the GPUs")
        }),
        sockets: Sockets {
            plugins_dir: args.plugins_dir.clone(),
            registry_dir: args.registry_dir.clone(),
        },
        api,
        enforcer: super::enforce::enforcer_policy(&gpuslice_policy::Caller::detect()?),
    })?;
    Ok(0)
}
