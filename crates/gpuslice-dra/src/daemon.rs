//! `gpuslice dra`'s lifecycle: build the driver on the discovered GPUs,
//! serve it, publish the node's ResourceSlices (again on every health
//! change, as the device plugin sees XIDs, on every GPU appearing or
//! disappearing ([`crate::hotplug`], checked at least every
//! [`HOTPLUG_POLL`]), and every [`RESYNC`], which also
//! puts right slices changed or deleted behind its back), and stop on SIGTERM or SIGINT (removing the sockets, so the
//! kubelet sees the plugin go). The checkpoint, the claims' CDI specs and
//! the ResourceSlices stay: a restarted plugin takes them up again.

use crate::apiserver::ApiTarget;
use crate::driver::{Driver, Options};
use crate::publish::{follow, SharedPolicy};
use crate::server::{serve, Sockets};
use anyhow::{Context, Result};
use std::sync::Arc;
use std::time::Duration;

/// How often the published slices are compared with what should be there.
pub const RESYNC: Duration = Duration::from_secs(60);
/// How often the host's GPUs are compared with the last discovery when
/// no inotify event came (procfs sends none).
pub const HOTPLUG_POLL: Duration = Duration::from_secs(1);

/// Discovers the host's GPUs again (hot-plug).
pub type Rediscover = Arc<dyn Fn() -> Result<gpuslice_core::Inventory> + Send + Sync>;

pub struct DaemonOptions {
    pub driver: Options,
    pub rediscover: Rediscover,
    pub sockets: Sockets,
    /// Where the API server is; the client connects on the daemon's runtime.
    pub api: ApiTarget,
    pub policy: SharedPolicy,
}

pub fn run(opts: DaemonOptions) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    opts.policy.validate()?;
    let inventory = opts.driver.inventory.clone();
    let host_root = opts.driver.host_root.clone();
    let rediscover = opts.rediscover.clone();
    let health = gpuslice_k8s::plugin::config::Health::default();
    let (driver_name, node) = (opts.driver.driver_name.clone(), opts.driver.pool.clone());
    rt.block_on(async move {
        let api = Arc::new(opts.api.connect().await?);
        let driver = Arc::new(Driver::new(opts.driver, api.clone())?);
        let prepared = driver.prepared().await.len();
        let served = serve(driver.clone(), &opts.sockets)?;
        tracing::info!(
            "serving {} ({} prepared claims from the checkpoint); registration at {}",
            served.dra_socket.display(),
            prepared,
            served.registration_socket.display()
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        // Health: the device plugin's XID watcher (NVML events); without
        // NVML every GPU stays healthy.
        let (tx, rx) = tokio::sync::watch::channel(Default::default());
        let watcher = gpuslice_k8s::plugin::health::start(&inventory, &health, None, tx.clone());
        let (inv_tx, inv_rx) = tokio::sync::watch::channel(inventory);
        tokio::spawn(crate::hotplug::apply(
            inv_rx.clone(),
            driver.clone(),
            health,
            None,
            tx,
            watcher,
        ));
        let rescan = crate::hotplug::watch(host_root, HOTPLUG_POLL, move || rediscover(), inv_tx);
        let publisher = follow(
            api.as_ref(),
            &driver_name,
            &node,
            inv_rx,
            &opts.policy,
            rx,
            RESYNC,
        );
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = publisher => {}
            _ = rescan => {}
        }
        drop(served);
        anyhow::Ok(())
    })
}
