//! This process's pid in the host's PID namespace: the number NVML's
//! per-process accounting knows it by on drivers that report host pids
//! whatever the caller's namespace (NVIDIA/nvidia-docker#1483; driver 580
//! translates them instead, docs/shim.md "Which pid is ours"), while a
//! slice with a PID namespace of its own sees only its inner pids (its
//! `/proc`'s `NSpid` has one entry).
//!
//! Found, in this order:
//! 1. the slice's **host-pid resolver** at `/run/gpuslice/slice/hostpid`
//!    ([`RecordPaths::in_slice`], [`crate::limits::HOSTPID_FILE`]): a unix socket
//!    the launcher (in the host's PID namespace) serves; it answers each
//!    connection with the connecting process's pid as the kernel gives it
//!    to the launcher (`SO_PEERCRED`, translated into the reader's
//!    namespace), 4 bytes little-endian, and closes. Exact, and it cannot
//!    be forged for another process: the kernel names the connector;
//! 2. else the outermost entry of `NSpid` when it has more than one (a
//!    `/proc` mounted outside the process's own namespace: the pid in the
//!    namespace of that `/proc`'s mounter, the host's if it mounted it);
//! 3. else `getpid()`: exact in the host's namespace; inside a container
//!    with its own PID namespace and no resolver it is the inner pid
//!    ([`HostPid::exact`] says which).
//!
//! Resolved once per process and cached; a forked child (another
//! `getpid()`) resolves its own.

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::limits::RecordPaths;

/// How long a resolver answer may take (the launcher answers from its
/// poll loop at once; a launcher that is gone refuses the connection).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// This process's host pid, and whether it is known to be exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPid {
    pub pid: u32,
    /// From the resolver, from a nested `NSpid`, or `getpid()` in the
    /// initial PID namespace; false for `getpid()` in a namespace of
    /// unknown depth (a container without a resolver).
    pub exact: bool,
}

/// Why the host pid could not be found.
#[derive(Debug, thiserror::Error)]
#[error("host pid resolver {path}: {source}")]
pub struct ResolveError {
    pub path: String,
    pub source: io::Error,
}

/// Asks the resolver at `path` for the caller's host pid.
pub fn ask(path: &Path) -> io::Result<u32> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(RESOLVE_TIMEOUT))?;
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    match u32::from_le_bytes(b) {
        0 => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "answered 0 (the caller is outside the resolver's PID namespace)",
        )),
        pid => Ok(pid),
    }
}

/// Steps 2 and 3 of the module docs, from the text of `/proc/self/status`
/// (None: no `NSpid` line), `getpid()` and whether we are in the initial
/// PID namespace.
pub fn from_status(status: Option<&str>, getpid: u32, initial_ns: bool) -> HostPid {
    let nspid: Vec<u32> = status
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("NSpid:")))
        .map(|v| {
            v.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    match nspid.first() {
        Some(&outer) if nspid.len() > 1 => HostPid {
            pid: outer,
            exact: true,
        },
        _ => HostPid {
            pid: getpid,
            exact: initial_ns,
        },
    }
}

fn resolve() -> Result<HostPid, ResolveError> {
    let path = RecordPaths::in_slice().hostpid;
    if path.symlink_metadata().is_ok() {
        return ask(&path)
            .map(|pid| HostPid { pid, exact: true })
            .map_err(|source| ResolveError {
                path: path.display().to_string(),
                source,
            });
    }
    let status = std::fs::read_to_string("/proc/self/status").ok();
    let initial = crate::procfs::own_pid_namespace() == crate::procfs::INITIAL_PID_NAMESPACE;
    Ok(from_status(status.as_deref(), std::process::id(), initial))
}

/// Cache: `getpid() << 32 | host pid`, bit 31 of the low word set when
/// exact; the low word all ones for a failure; 0 when empty. Keyed by
/// `getpid()` so that a forked child resolves again (an atomic: safe
/// across fork, no lock a forking thread could hold).
static CACHE: AtomicU64 = AtomicU64::new(0);
const FAILED: u64 = 0xFFFF_FFFF;
const EXACT: u64 = 1 << 31;

/// This process's host pid (module docs); an error when the slice has a
/// resolver that does not answer: then nothing is known (falling back to
/// the inner pid could name an unrelated host process).
pub fn host_pid() -> Result<HostPid, ResolveError> {
    let me = u64::from(std::process::id());
    let c = CACHE.load(Ordering::Acquire);
    if c != 0 && c >> 32 == me {
        return match c & 0xFFFF_FFFF {
            FAILED => Err(ResolveError {
                path: RecordPaths::in_slice().hostpid.display().to_string(),
                source: io::Error::other("did not answer earlier"),
            }),
            low => Ok(HostPid {
                pid: (low & !EXACT) as u32,
                exact: low & EXACT != 0,
            }),
        };
    }
    let r = resolve();
    let low = match &r {
        // Pids stay below 2^22 (pid_max), clear of the flag bit.
        Ok(h) if u64::from(h.pid) < EXACT => u64::from(h.pid) | if h.exact { EXACT } else { 0 },
        _ => FAILED,
    };
    CACHE.store(me << 32 | low, Ordering::Release);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn nested_nspid_gives_the_outermost_else_getpid() {
        for (status, getpid, initial_ns, pid, exact) in [
            (
                Some("Name:\tx\nNSpid:\t4242\t7\t2\nNSsid:\t1\n"),
                2,
                false,
                4242,
                true,
            ),
            (Some("NSpid:\t2\n"), 2, false, 2, false),
            (None, 9, true, 9, true),
        ] {
            assert_eq!(
                from_status(status, getpid, initial_ns),
                HostPid { pid, exact },
                "{status:?}"
            );
        }
    }

    #[test]
    fn outside_a_slice_it_is_getpid() {
        // The test runs on the host: no resolver at the fixed place.
        if RecordPaths::in_slice().hostpid.exists() {
            return;
        }
        let h = host_pid().unwrap();
        assert_eq!(h.pid, std::process::id());
        assert_eq!(host_pid().unwrap(), h, "cached");
    }

    #[test]
    fn a_forked_child_resolves_its_own() {
        if RecordPaths::in_slice().hostpid.exists() {
            return;
        }
        assert_eq!(host_pid().unwrap().pid, std::process::id());
        let (mut rx, tx) = std::os::unix::net::UnixStream::pair().unwrap();
        // SAFETY: the child only reads procfs, writes to its socket and
        // _exits (glibc's fork handlers keep malloc usable in it).
        let child = unsafe { libc::fork() };
        if child == 0 {
            let mine = host_pid().map_or(0, |h| h.pid);
            let _ = (&tx).write_all(&mine.to_le_bytes());
            // SAFETY: plain _exit of the forked child.
            unsafe { libc::_exit(0) };
        }
        drop(tx);
        let mut b = [0u8; 4];
        rx.read_exact(&mut b).unwrap();
        // SAFETY: reaps the child forked above.
        unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
        assert_eq!(
            u32::from_le_bytes(b),
            child as u32,
            "not the parent's cached pid"
        );
    }

    #[test]
    fn a_resolver_that_is_gone_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s");
        drop(std::os::unix::net::UnixListener::bind(&p).unwrap());
        assert!(ask(&p).is_err());
    }
}
