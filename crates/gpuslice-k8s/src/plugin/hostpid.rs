//! The host-pid resolver of shared replicas: the same socket `gpuslice
//! run`'s launcher serves ([`gpuslice_isolate::hostpid`]), served here for
//! every container the plugin gives a replica, mounted read-only at the
//! slice's fixed place (`/run/gpuslice/slice/hostpid`).
//!
//! The plugin runs in the host's PID namespace (`hostPID: true`), so the
//! kernel translates each connector's pid into a host pid for it, which is
//! what NVML reports; a container's own PID namespace hides it. One socket
//! serves every replica: the answer is only ever the connector's own pid.
//!
//! It lives as long as the plugin process (a config reload keeps it: a
//! container's bind mount holds the socket's inode, which a new socket
//! would not be). After a plugin restart, containers started earlier hold
//! the old, dead socket: their processes stay unmeasured (the shim keeps
//! its estimates, and says so), as they were without a resolver.

use gpuslice_isolate::hostpid::Resolver;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Paths this process serves.
static SERVED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// Serves the resolver at `path` for the life of this process, unless it
/// already does; a leftover socket (an earlier plugin's) is replaced.
pub fn ensure(path: &Path) -> std::io::Result<()> {
    let mut served = SERVED.lock().unwrap_or_else(|e| e.into_inner());
    let served = served.get_or_insert_with(HashSet::new);
    if served.contains(path) {
        return Ok(());
    }
    if path.symlink_metadata().is_ok() {
        std::fs::remove_file(path)?;
    }
    let resolver = Resolver::bind(path)?;
    std::thread::Builder::new()
        .name("hostpid".into())
        .spawn(move || {
            if let Err(e) = resolver.serve_forever() {
                tracing::warn!("host-pid resolver: {e}; no longer served");
            }
        })?;
    served.insert(path.to_path_buf());
    Ok(())
}

/// Whether this process serves the resolver at `path`.
pub fn served(path: &Path) -> bool {
    SERVED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|s| s.contains(path))
}
