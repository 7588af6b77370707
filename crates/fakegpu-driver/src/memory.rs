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
//! A process that is gone (or a zombie) holds nothing, as with the real
//! driver, which frees a process's memory when its file descriptors close.
//! Allocation capacity is still checked against this process's own use.

use std::collections::BTreeMap;
use std::path::PathBuf;
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
}

static LEDGER: Mutex<Ledger> = Mutex::new(Ledger {
    used: BTreeMap::new(),
    allocations: BTreeMap::new(),
    next: BASE_ADDRESS,
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
    let ptr = l.next;
    let span = size.div_ceil(ALIGN).max(1) * ALIGN;
    l.next = l.next.saturating_add(span);
    l.used.insert(key, total);
    l.allocations.insert(ptr, (key, size));
    publish(&l);
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
    publish(&l);
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

/// Rewrites this process's usage file (called with the ledger locked, so
/// writes never interleave).
fn publish(l: &Ledger) {
    let Some(dir) = usage_dir() else { return };
    let text: String = l
        .used
        .iter()
        .filter(|(_, &v)| v > 0)
        .map(|(k, v)| format!("{} {} {v}\n", k.gpu_minor, k.gi.map_or(-1, i64::from)))
        .collect();
    let path = dir.join(std::process::id().to_string());
    let _ = std::fs::write(path, text);
}

/// Whether `pid` still runs (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| !matches!(state, "Z" | "X" | "x")),
        Err(_) => false,
    }
}

/// Every live process's bytes on `key`'s GPU (a whole GPU when `key.gi` is
/// None, its MIG instances included; else that instance), by pid, as NVML
/// reports per-process usage. This process is read from memory.
pub fn processes(gpu_minor: u32, gi: Option<u32>) -> BTreeMap<u32, u64> {
    let matches = |k: &MemKey| k.gpu_minor == gpu_minor && (gi.is_none() || k.gi == gi);
    let mut out = BTreeMap::new();
    let me = std::process::id();
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
        if pid == me || !alive(pid) {
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
