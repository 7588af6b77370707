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
use crate::feed::{Enforcement, NodeFeed};
use crate::publish::follow;
use crate::server::{serve, Sockets};
use anyhow::{Context, Result};
use std::sync::Arc;
use std::time::Duration;

/// How often the published slices are compared with what should be there.
pub const RESYNC: Duration = Duration::from_secs(60);
/// How often the host's GPUs are compared with the last discovery when
/// no inotify event came (procfs sends none).
pub const HOTPLUG_POLL: Duration = Duration::from_secs(1);
/// How often the claims' ledgers are reaped of dead containers' processes.
pub const REAP_EVERY: Duration = Duration::from_secs(5);
/// How often the shim is checked for what enforcement needs.
pub const ENFORCEMENT_POLL: Duration = Duration::from_secs(5);

/// Why shared claims' caps cannot be enforced on this node: no shim was
/// found at start, or the shim that the claims' containers preload is
/// missing, not a regular file, or not root's alone (a file others may
/// write is a shim a tenant can replace). Such a node's devices are
/// reported Unhealthy and tainted `gpuslice.io/unenforced`, so the
/// scheduler places no claim that Prepare would refuse or could not cap.
pub fn enforcement_problem(shim: Option<&std::path::Path>) -> Enforcement {
    use std::os::unix::fs::MetadataExt;
    let Some(shim) = shim else {
        return Some(
            "no shim (libgpuslice.so beside gpuslice, or $GPUSLICE_SHIM) was found at start".into(),
        );
    };
    let m = match std::fs::metadata(shim) {
        Ok(m) => m,
        Err(e) => return Some(format!("the shim {} is missing: {e}", shim.display())),
    };
    if !m.is_file() {
        return Some(format!("the shim {} is not a regular file", shim.display()));
    }
    if m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Some(format!(
            "the shim {} is not root's alone (uid {}, mode {:o}): a tenant could replace it",
            shim.display(),
            m.uid(),
            m.mode() & 0o7777
        ));
    }
    None
}

/// Discovers the host's GPUs again (hot-plug).
pub type Rediscover = Arc<dyn Fn() -> Result<gpuslice_core::Inventory> + Send + Sync>;

pub struct DaemonOptions {
    pub driver: Options,
    pub rediscover: Rediscover,
    pub sockets: Sockets,
    /// Where the API server is; the client connects on the daemon's runtime.
    pub api: ApiTarget,
    /// Root's enforcer over the claims' capped slices
    /// (`gpuslice_k8s::enforcer`): what it does with a GPU process the
    /// shim does not hold; None: off (policy `root_enforcer = "off"`).
    pub enforcer: Option<gpuslice_ledger::enforcer::Unshimmed>,
}

pub fn run(opts: DaemonOptions) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let policy = opts.driver.policy;
    policy.validate()?;
    let inventory = opts.driver.inventory.clone();
    let host_root = opts.driver.host_root.clone();
    let rediscover = opts.rediscover.clone();
    let health = gpuslice_health::Config::default();
    let (driver_name, node) = (opts.driver.driver_name.clone(), opts.driver.pool.clone());
    let shim = opts.driver.shim.clone();
    rt.block_on(async move {
        let api = Arc::new(opts.api.connect().await?);
        // A wrong node name would publish a pool no scheduler uses and
        // never be told: it ends the plugin at once, with the reason.
        api.own_slices_by(&node).await?;
        let driver = Arc::new(Driver::new(opts.driver, api.clone())?);
        let prepared = driver.prepared().await.len();
        let _enforcer = match opts.enforcer {
            Some(policy) => {
                let watched = driver.clone();
                let slices = move || watched.watched_slices();
                Some(gpuslice_k8s::enforcer::spawn(policy, None, slices)?)
            }
            None => None,
        };
        // Health: the device plugin's XID watcher (NVML events); without
        // NVML no GPU's health is known (the kubelet hears Unknown).
        let (tx, rx) = tokio::sync::watch::channel(Default::default());
        let watcher = gpuslice_health::start(&inventory, &health, None, tx.clone());
        let (inv_tx, inv_rx) = tokio::sync::watch::channel(inventory);
        let (enf_tx, enf_rx) = tokio::sync::watch::channel(enforcement_problem(shim.as_deref()));
        let feed = NodeFeed {
            pool: node.clone(),
            policy,
            inventory: inv_rx.clone(),
            xids: rx,
            enforcement: enf_rx,
        };
        let served = serve(driver.clone(), &opts.sockets, feed.clone())?;
        tracing::info!(
            "serving {} ({} prepared claims from the checkpoint); registration at {}",
            served.dra_socket.display(),
            prepared,
            served.registration_socket.display()
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::spawn(crate::hotplug::apply(
            inv_rx.clone(),
            driver.clone(),
            health,
            None,
            tx,
            watcher,
        ));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ENFORCEMENT_POLL).await;
                let now = enforcement_problem(shim.as_deref());
                enf_tx.send_if_modified(|v| {
                    let changed = *v != now;
                    if changed {
                        match &now {
                            Some(why) => tracing::error!("slices are not enforced: {why}"),
                            None => tracing::info!("slices are enforced again"),
                        }
                        *v = now.clone();
                    }
                    changed
                });
            }
        });
        let reaping = driver.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REAP_EVERY).await;
                reaping.reap_ledgers().await;
            }
        });
        let rescan = crate::hotplug::watch(host_root, HOTPLUG_POLL, move || rediscover(), inv_tx);
        let publisher = follow(api.as_ref(), &driver_name, feed, RESYNC);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_shim_must_be_there_and_root_s_alone() {
        assert!(enforcement_problem(None).unwrap().contains("no shim"));
        let dir = tempfile::tempdir().unwrap();
        let shim = dir.path().join("libgpuslice.so");
        assert!(enforcement_problem(Some(&shim))
            .unwrap()
            .contains("is missing"));
        std::fs::write(&shim, b"").unwrap();
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o644)).unwrap();
        let root =
            std::fs::metadata(&shim).is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
        assert_eq!(enforcement_problem(Some(&shim)).is_none(), root);
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(enforcement_problem(Some(&shim))
            .unwrap()
            .contains("not root's alone"));
        assert!(enforcement_problem(Some(dir.path()))
            .unwrap()
            .contains("not a regular file"));
    }
}
