//! Hot-plug: GPUs appearing or disappearing while the plugin runs are
//! rediscovered and re-published without a restart.
//!
//! What is watched: the names in the host's `/proc/driver/nvidia/gpus`
//! (one directory per GPU the driver bound) and its `/dev/nvidia<minor>`
//! nodes, together the host's [`fingerprint`]. inotify (rustix) wakes the
//! watcher on a change in either directory; procfs sends no inotify
//! events, so the fingerprint is also compared every `poll` interval.
//! When it moved, discovery runs again (after a short settling pause, as
//! a GPU's nodes and directory appear one by one) and a changed
//! inventory is sent on.
//!
//! GPU indexes are bus-order positions (`gpuslice_core::discover`): a GPU
//! leaving renumbers those after it, as CUDA and NVML do.
//!
//! NVML enumerates the GPUs at its first initialisation in a process, and
//! the XID watcher keeps it initialised: discovery in the plugin still
//! hears of a GPU that left from NVML. Which GPUs the driver has bound is
//! procfs's to say, so a rediscovered inventory keeps only those
//! ([`bound_only`]).

use gpuslice_core::{HostRoot, Inventory};
use rustix::fs::inotify;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

/// How long events are let settle before discovery runs.
const SETTLE: Duration = Duration::from_millis(100);

/// How long after a failed rediscovery it is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// What identifies the host's GPUs cheaply: the sorted names of
/// `<root>/proc/driver/nvidia/gpus/*` and `<root>/dev/nvidia<digits>`.
pub fn fingerprint(root: &HostRoot) -> Vec<String> {
    let names = |dir: &Path, keep: &dyn Fn(&str) -> bool| -> Vec<String> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| keep(n))
            .collect()
    };
    let mut out: Vec<String> = names(&root.nvidia_proc().join("gpus"), &|_| true)
        .into_iter()
        .map(|n| format!("proc:{n}"))
        .collect();
    let gpu_node = |n: &str| {
        n.strip_prefix("nvidia")
            .is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
    };
    out.extend(
        names(&root.dev(), &gpu_node)
            .into_iter()
            .map(|n| format!("dev:{n}")),
    );
    out.sort();
    out
}

/// `inv` without the GPUs the driver no longer lists in
/// `<root>/proc/driver/nvidia/gpus`, renumbered in bus order.
pub fn bound_only(root: &HostRoot, mut inv: Inventory) -> Inventory {
    let bound: Vec<String> = std::fs::read_dir(root.nvidia_proc().join("gpus"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .map(|n| n.to_ascii_lowercase())
        .collect();
    inv.gpus
        .retain(|g| bound.contains(&g.pci_bus_id.to_ascii_lowercase()));
    inv.gpus.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    for (i, g) in inv.gpus.iter_mut().enumerate() {
        g.index = i as u32;
    }
    inv
}

/// The inotify instance over the watched directories; None when inotify
/// cannot be had (then polling alone notices changes).
struct Watches {
    fd: AsyncFd<rustix::fd::OwnedFd>,
    dirs: Vec<PathBuf>,
}

impl Watches {
    fn new(root: &HostRoot) -> Option<Self> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
            .map_err(|e| tracing::warn!("hot-plug: no inotify ({e}); polling only"))
            .ok()?;
        // SAFETY: `fd` is the open inotify descriptor just made, owned by
        // the AsyncFd from here on: nothing else closes or replaces it.
        let fd = unsafe { AsyncFd::register(fd) }
            .map_err(|e| tracing::warn!("hot-plug: inotify: {e}; polling only"))
            .ok()?;
        let w = Watches {
            fd,
            dirs: vec![root.nvidia_proc().join("gpus"), root.dev()],
        };
        w.add();
        Some(w)
    }

    /// (Re-)adds the watches: a directory missing now (no driver loaded)
    /// or re-created since (a module reload) is taken up at the next poll.
    fn add(&self) {
        let flags = inotify::WatchFlags::CREATE
            | inotify::WatchFlags::DELETE
            | inotify::WatchFlags::MOVE
            | inotify::WatchFlags::DELETE_SELF;
        for d in &self.dirs {
            let _ = inotify::add_watch(self.fd.get_ref(), d, flags);
        }
    }

    /// Reads every pending event (what they say is not needed: the
    /// fingerprint is compared anyway).
    fn drain(&self) {
        let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
        let mut r = inotify::Reader::new(self.fd.get_ref(), &mut buf);
        while r.next().is_ok() {}
    }

    async fn wait(&self) {
        match self.fd.readable().await {
            Ok(mut guard) => {
                self.drain();
                guard.clear_ready();
            }
            // Not expected; do not spin.
            Err(_) => std::future::pending().await,
        }
    }
}

/// Watches `root` for GPUs appearing or disappearing and sends each new
/// inventory (`rediscover`'s, when it differs from the one on `tx`).
/// Returns when every receiver of `tx` is gone.
///
/// It rediscovers once at start: the inventory on `tx` was discovered
/// before the watches existed, and a GPU that came or went in between
/// sends no event the watches could see. A failed rediscovery is tried
/// again after `RETRY` (1 s), not left to the next event or poll.
pub async fn watch<F>(root: HostRoot, poll: Duration, rediscover: F, tx: watch::Sender<Inventory>)
where
    F: Fn() -> anyhow::Result<Inventory> + Send + Sync + Clone + 'static,
{
    let watches = Watches::new(&root);
    let mut last = fingerprint(&root);
    // Some(delay): rediscover after `delay` whatever the fingerprint says.
    let mut due: Option<Duration> = Some(Duration::ZERO);
    loop {
        tokio::select! {
            _ = async {
                match (&watches, due) {
                    (Some(w), None) => w.wait().await,
                    _ => std::future::pending().await,
                }
            } => {}
            _ = tokio::time::sleep(due.unwrap_or(poll)) => {
                if let Some(w) = &watches {
                    w.add();
                }
            }
            _ = tx.closed() => return,
        }
        if due.is_none() && fingerprint(&root) == last {
            continue;
        }
        tokio::time::sleep(SETTLE).await;
        if let Some(w) = &watches {
            w.drain();
        }
        let now = fingerprint(&root);
        match tokio::task::spawn_blocking(rediscover.clone()).await {
            Ok(Ok(inv)) => {
                last = now;
                due = None;
                send_if_changed(&tx, bound_only(&root, inv));
            }
            Ok(Err(e)) => {
                tracing::warn!("hot-plug: rediscovering the GPUs: {e:#}");
                due = Some(RETRY);
            }
            Err(e) => {
                tracing::warn!("hot-plug: rediscovering the GPUs: {e}");
                due = Some(RETRY);
            }
        }
    }
}

fn send_if_changed(tx: &watch::Sender<Inventory>, inv: Inventory) {
    let changed = tx.send_if_modified(|cur| {
        let changed = *cur != inv;
        if changed {
            *cur = inv;
        }
        changed
    });
    if changed {
        tracing::info!(
            "hot-plug: the host's GPUs changed, {} now",
            tx.borrow().gpus.len()
        );
    }
}

/// Takes every new inventory up for the rest of the plugin: the driver
/// prepares claims against the GPUs there now, and the XID watcher starts
/// over on them (GPU indexes may have moved), every GPU healthy, as after
/// a restart. Returns when the inventory's sender is gone.
pub async fn apply(
    mut changes: watch::Receiver<Inventory>,
    driver: std::sync::Arc<crate::driver::Driver>,
    health: gpuslice_health::Config,
    nvml_lib: Option<PathBuf>,
    tx: watch::Sender<gpuslice_health::Snapshot>,
    watcher: gpuslice_health::Watcher,
) {
    let mut watcher = Some(watcher);
    while changes.changed().await.is_ok() {
        let inv = changes.borrow_and_update().clone();
        driver.set_inventory(inv.clone());
        // Its drop joins its thread: off the runtime. Gone before the
        // health is cleared, so no event of the old numbering follows.
        let old = watcher.take();
        let _ = tokio::task::spawn_blocking(move || drop(old)).await;
        tx.send_modify(|s| s.unhealthy.clear());
        watcher = Some(gpuslice_health::start(
            &inv,
            &health,
            nvml_lib.clone(),
            tx.clone(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_names_gpu_dirs_and_nodes_only() {
        let h = gpuslice_testkit::temphost::TempHost::new();
        assert!(fingerprint(&h.root()).is_empty());
        h.mkdir("proc/driver/nvidia/gpus/0000:01:00.0");
        for n in ["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia12", "tty0"] {
            h.write(&format!("dev/{n}"), "");
        }
        assert_eq!(
            fingerprint(&h.root()),
            ["dev:nvidia0", "dev:nvidia12", "proc:0000:01:00.0"]
        );
    }
}
