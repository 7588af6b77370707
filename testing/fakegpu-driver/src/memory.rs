//! Per-device memory accounting of this process.
//!
//! The real driver keeps device memory per GPU; the fake keeps byte counts
//! per device in process memory, shared by the CUDA and NVML halves (one
//! object backs both sonames), so the shim's accounting can be checked
//! against what "the driver" saw.
//!
//! Like the real driver, which knows every process's memory, each process
//! publishes what it holds (`<root>/.fakegpu/usage/<pid>`, one line
//! `minor gi bytes` per key, rewritten on every change) so that NVML's
//! per-process usage and device totals cover all processes ([`processes`]).
//! Allocation capacity is still checked against this process's own use.
//!
//! As with drivers that report host pids whatever the caller's PID
//! namespace (NVIDIA/nvidia-docker#1483; driver 580 translates them into
//! the caller's namespace instead, which this fake does not model yet), a
//! process is known by its pid in the **host's** PID namespace, from
//! inside a container or a `gpuslice run` slice too. The real kernel module simply knows it;
//! this in-process fake learns it the way a process can
//! ([`gpuslice_ledger::hostpid`]: the slice's host-pid resolver, else the
//! outermost `NSpid`, else `getpid()`), so NVML lists host pids inside and
//! outside a slice alike.
//!
//! A process that is gone (or a zombie) holds nothing, as with the real
//! driver, which frees a process's memory when its file descriptors close:
//! each process holds a POSIX write lock on its usage file for its life
//! (released by the kernel when it exits or execs; not inherited by a
//! forked child), and a file nobody holds locked is a dead process's. No
//! `/proc` is read, so the answer does not depend on the reader's PID
//! namespace.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// A unit of device memory: a whole GPU, or one MIG GPU instance of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MemKey {
    pub gpu_minor: u32,
    pub gi: Option<u32>,
}

/// First fake device address; addresses only grow, never reused, so a
/// double free or a stale pointer is always detected.
const BASE_ADDRESS: u64 = 0x7f00_0000_0000;
/// Allocation granularity, like the driver's.
const ALIGN: u64 = 512;

struct Ledger {
    used: BTreeMap<MemKey, u64>,
    allocations: BTreeMap<u64, (MemKey, u64)>,
    next: u64,
    /// This process's usage file, locked, with the `getpid()` it was
    /// opened by (a forked child opens its own).
    published: Option<(File, u32)>,
}

static LEDGER: Mutex<Ledger> = Mutex::new(Ledger {
    used: BTreeMap::new(),
    allocations: BTreeMap::new(),
    next: BASE_ADDRESS,
    published: None,
});

fn ledger() -> MutexGuard<'static, Ledger> {
    // A panic while holding the lock leaves consistent maps (every update is
    // a single insert/remove pair), so poisoning is ignored.
    LEDGER.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, PartialEq, Eq)]
pub enum AllocError {
    OutOfMemory,
}

/// Reserves `size` bytes on `key` whose capacity is `capacity`; returns the
/// fake device address.
pub fn alloc(key: MemKey, capacity: u64, size: u64) -> Result<u64, AllocError> {
    let mut l = ledger();
    let used = l.used.get(&key).copied().unwrap_or(0);
    let total = match used.checked_add(size) {
        Some(total) if total <= capacity => total,
        _ => return Err(AllocError::OutOfMemory),
    };
    // R615+: the hard limit of a cgroup this process is in (not on MIG).
    if key.gi.is_none() {
        if let Some(limit) = cgroup_limit(&l, key.gpu_minor) {
            let held = cgroup_used(&l, key.gpu_minor, &limit.path);
            if held.saturating_add(size) > limit.hard {
                return Err(AllocError::OutOfMemory);
            }
        }
    }
    let ptr = l.next;
    let span = size.div_ceil(ALIGN).max(1) * ALIGN;
    l.next = l.next.saturating_add(span);
    l.used.insert(key, total);
    l.allocations.insert(ptr, (key, size));
    publish(&mut l);
    Ok(ptr)
}

/// Releases an allocation; false when `ptr` is not one.
pub fn free(ptr: u64) -> bool {
    let mut l = ledger();
    let Some((key, size)) = l.allocations.remove(&ptr) else {
        return false;
    };
    if let Some(used) = l.used.get_mut(&key) {
        *used = used.saturating_sub(size);
    }
    publish(&mut l);
    true
}

/// `<root>/.fakegpu/usage`, when this is a fake host (else nothing is
/// published and only this process is seen).
fn usage_dir() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let host = crate::host::Host::from_env();
        let fake = host.path(".fakegpu");
        if !fake.is_dir() {
            return None;
        }
        let dir = fake.join("usage");
        // World-writable and sticky like /tmp: processes of any user publish.
        if std::fs::create_dir_all(&dir).is_ok() {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
        }
        Some(dir)
    })
    .as_ref()
}

/// The pid the driver knows this process by (module docs).
fn host_pid() -> u32 {
    gpuslice_ledger::hostpid::host_pid().map_or(std::process::id(), |h| h.pid)
}

/// `fcntl(fd, cmd, whole-file lock of type ty)`; the lock record back.
fn posix_lock(fd: &File, cmd: libc::c_int, ty: libc::c_int) -> std::io::Result<libc::flock> {
    // SAFETY: an all-zero flock is valid (whole file from offset 0).
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = ty as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: F_SETLK/F_GETLK read and write only the flock passed.
    if unsafe { libc::fcntl(fd.as_raw_fd(), cmd, &mut l) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(l)
}

/// This process's usage file, opened and locked once per process.
fn own_file<'a>(l: &'a mut Ledger, dir: &Path) -> Option<&'a File> {
    let me = std::process::id();
    if l.published.as_ref().is_some_and(|(_, by)| *by != me) {
        // Forked: the parent's file and lock stay the parent's (closing
        // our copy releases only locks this process holds: none).
        l.published = None;
    }
    if l.published.is_none() {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(dir.join(host_pid().to_string()))
            .ok()?;
        posix_lock(&f, libc::F_SETLK, libc::F_WRLCK).ok()?;
        l.published = Some((f, me));
    }
    l.published.as_ref().map(|(f, _)| f)
}

/// The hard limit that binds this process on GPU `minor` (R615+ fakes).
fn cgroup_limit(_l: &Ledger, minor: u32) -> Option<crate::partitions::Limit> {
    if !crate::partitions::supported() {
        return None;
    }
    let mine = crate::partitions::own_cgroups(std::iter::once(minor));
    crate::partitions::binding(minor, &mine)
}

/// What this process holds on GPU `minor` (whole-GPU keys).
fn whole_gpu_used(l: &Ledger, minor: u32) -> u64 {
    l.used
        .iter()
        .filter(|(k, _)| k.gpu_minor == minor && k.gi.is_none())
        .map(|(_, v)| v)
        .sum()
}

/// What the processes of cgroup `path` hold on GPU `minor` (whole-GPU
/// keys): this process's own, and every live process whose usage file
/// says it is in that cgroup.
fn cgroup_used(l: &Ledger, minor: u32, path: &str) -> u64 {
    let mine = whole_gpu_used(l, minor);
    let me = host_pid();
    let others: u64 = usage_dir()
        .and_then(|d| std::fs::read_dir(d).ok())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str() != Some(&me.to_string()) && alive(&e.path()))
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            if !text
                .lines()
                .any(|line| line.strip_prefix("cg ") == Some(path))
            {
                return 0;
            }
            text.lines()
                .filter_map(|line| {
                    let mut f = line.split_whitespace();
                    let m: u32 = f.next()?.parse().ok()?;
                    let g: i64 = f.next()?.parse().ok()?;
                    let v: u64 = f.next()?.parse().ok()?;
                    (m == minor && g < 0).then_some(v)
                })
                .sum()
        })
        .sum();
    mine + others
}

/// Bytes of cgroup `path` on GPU `minor`, for NVML's `currentUsed`.
pub fn cgroup_usage(minor: u32, path: &str) -> u64 {
    let l = ledger();
    let me_in = crate::partitions::own_cgroups(std::iter::once(minor))
        .iter()
        .any(|p| p == path);
    let total = cgroup_used(&l, minor, path);
    if me_in {
        total
    } else {
        total - whole_gpu_used(&l, minor)
    }
}

/// (total, free) for `key` as `cuMemGetInfo` reports them inside a
/// limited cgroup (R615+): the hard limit is the total; None outside one.
pub fn limited_info(key: MemKey) -> Option<(u64, u64)> {
    if key.gi.is_some() {
        return None;
    }
    let l = ledger();
    let limit = cgroup_limit(&l, key.gpu_minor)?;
    let held = cgroup_used(&l, key.gpu_minor, &limit.path);
    Some((limit.hard, limit.hard.saturating_sub(held)))
}

/// Rewrites this process's usage file (called with the ledger locked, so
/// writes never interleave).
fn publish(l: &mut Ledger) {
    let Some(dir) = usage_dir() else { return };
    let mut text: String = l
        .used
        .iter()
        .filter(|(_, &v)| v > 0)
        .map(|(k, v)| format!("{} {} {v}\n", k.gpu_minor, k.gi.map_or(-1, i64::from)))
        .collect();
    // The limited cgroups it is in (R615+ fakes): what the real kernel
    // module knows of each process.
    let minors: Vec<u32> = l.used.keys().map(|k| k.gpu_minor).collect();
    for cg in crate::partitions::own_cgroups(minors.into_iter()) {
        text.push_str(&format!("cg {cg}\n"));
    }
    if let Some(f) = own_file(l, dir) {
        let _ = f.set_len(0);
        let _ = f.write_all_at(text.as_bytes(), 0);
    }
}

/// Whether the process that published `path` still runs: it holds the
/// file's lock until it exits (module docs).
fn alive(path: &Path) -> bool {
    let Ok(f) = File::open(path) else {
        return false;
    };
    posix_lock(&f, libc::F_GETLK, libc::F_WRLCK)
        .is_ok_and(|l| l.l_type != libc::F_UNLCK as libc::c_short)
}

/// Every live process's bytes on `key`'s GPU (a whole GPU when `key.gi` is
/// None, its MIG instances included; else that instance), by pid, as NVML
/// reports per-process usage. This process is read from memory.
pub fn processes(gpu_minor: u32, gi: Option<u32>) -> BTreeMap<u32, u64> {
    let matches = |k: &MemKey| k.gpu_minor == gpu_minor && (gi.is_none() || k.gi == gi);
    let mut out = BTreeMap::new();
    let me = host_pid();
    let mine: u64 = ledger()
        .used
        .iter()
        .filter(|(k, _)| matches(k))
        .map(|(_, v)| v)
        .sum();
    if mine > 0 {
        out.insert(me, mine);
    }
    let Some(dir) = usage_dir() else { return out };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me || !alive(&e.path()) {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let bytes: u64 = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let minor: u32 = f.next()?.parse().ok()?;
                let g: i64 = f.next()?.parse().ok()?;
                let v: u64 = f.next()?.parse().ok()?;
                let k = MemKey {
                    gpu_minor: minor,
                    gi: u32::try_from(g).ok(),
                };
                matches(&k).then_some(v)
            })
            .sum();
        if bytes > 0 {
            out.insert(pid, bytes);
        }
    }
    out
}

/// Bytes in use on exactly `key`.
pub fn used(key: MemKey) -> u64 {
    ledger().used.get(&key).copied().unwrap_or(0)
}

/// Bytes in use on a GPU, its MIG instances included.
#[cfg(test)]
pub fn used_on_gpu(gpu_minor: u32) -> u64 {
    ledger()
        .used
        .iter()
        .filter(|(k, _)| k.gpu_minor == gpu_minor)
        .map(|(_, v)| v)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_and_capacity() {
        // A minor no other test uses, since the ledger is process-wide.
        let key = MemKey {
            gpu_minor: 900,
            gi: None,
        };
        let a = alloc(key, 1000, 600).unwrap();
        assert_eq!(alloc(key, 1000, 600), Err(AllocError::OutOfMemory));
        let b = alloc(key, 1000, 400).unwrap();
        assert!(b > a);
        assert_eq!(used(key), 1000);
        assert!(free(a));
        assert!(!free(a), "double free is detected");
        assert_eq!(used_on_gpu(900), 400);
        assert!(free(b));
        assert_eq!(used(key), 0);
    }
}
