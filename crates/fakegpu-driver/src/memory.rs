//! Per-device memory accounting of this process.
//!
//! The real driver keeps device memory per GPU; the fake keeps byte counts
//! per device in process memory, shared by the CUDA and NVML halves (one
//! object backs both sonames), so the shim's accounting can be checked
//! against what "the driver" saw. Other processes' allocations are not seen.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

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
    true
}

/// Bytes in use on exactly `key`.
pub fn used(key: MemKey) -> u64 {
    ledger().used.get(&key).copied().unwrap_or(0)
}

/// Bytes in use on a GPU, its MIG instances included.
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
