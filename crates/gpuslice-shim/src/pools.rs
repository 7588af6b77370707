//! Memory the driver holds in pools the shim cannot reserve for before a
//! call: stream-ordered pools and the per-device graph pool. Their charges
//! are settled to what the driver reports (on growth, and on a refusal,
//! see [`crate::resident`]); the hooks that allocate from them are in
//! [`crate::hooks`].

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use gpuslice_ledger::MAX_DEVICES;

use crate::cuda::*;
use crate::driver::{relaxed, Relaxed};
use crate::real::Real;
use crate::state::{self, Target};
use crate::sys::log_line;
use crate::table::{pack, unpack, Handles};

static DEVICE_GET_MEM_POOL: Real = Real::named(c"cuDeviceGetMemPool");
static DEVICE_GET_DEFAULT_MEM_POOL: Real = Real::named(c"cuDeviceGetDefaultMemPool");
static POOL_GET_ATTRIBUTE: Real = Real::named(c"cuMemPoolGetAttribute");
static GRAPH_MEM_ATTRIBUTE: Real = Real::named(c"cuDeviceGetGraphMemAttribute");

/// A memory pool we have seen, and what the ledger holds for it: the
/// pool's reserved memory (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`) as of
/// the last settle.
pub struct PoolEntry {
    /// The pool's handle; null when the entry is free; the entry's own
    /// address while a destroyed pool drains (no driver handle can equal it).
    pub pool: AtomicPtr<c_void>,
    pub dev: AtomicUsize,
    pub charged: AtomicU64,
    /// Allocations from the pool not freed yet, and [`DRAINING`] once the
    /// pool is destroyed: the driver keeps a destroyed pool's memory until
    /// its last allocation is freed, and the charge stays until then.
    live: AtomicU64,
}

const DRAINING: u64 = 1 << 63;

const MAX_POOLS: usize = 64;
static POOLS: [PoolEntry; MAX_POOLS] = [const {
    PoolEntry {
        pool: AtomicPtr::new(std::ptr::null_mut()),
        dev: AtomicUsize::new(0),
        charged: AtomicU64::new(0),
        live: AtomicU64::new(0),
    }
}; MAX_POOLS];

/// Pointers allocated from a pool we track → the pool's index in [`POOLS`]
/// (packed as the device field), so that a free after the pool's destroy
/// finds what it drains.
static POOLED: Handles = Handles::new(14, 20);

impl PoolEntry {
    fn index(&self) -> usize {
        (self as *const PoolEntry as usize - POOLS.as_ptr() as usize)
            / std::mem::size_of::<PoolEntry>()
    }

    fn draining(&self) -> bool {
        self.live.load(Ordering::Acquire) & DRAINING != 0
    }

    /// Records an allocation the driver just made from this pool.
    pub fn allocated(&self, ptr: CUdeviceptr) {
        self.live.fetch_add(1, Ordering::AcqRel);
        if !POOLED.insert(ptr, pack(self.index(), 0)) {
            // Untracked: its free cannot be told apart; the pool may be
            // released before it at a destroy (logged once).
            self.live.fetch_sub(1, Ordering::AcqRel);
            if POOLED_FULL_LOGGED.swap(true, Ordering::Relaxed) {
                return;
            }
            log_line("pool allocation table full: a destroyed pool may be released early");
        }
    }

    /// One outstanding allocation less; the last of a destroyed pool
    /// releases its charge.
    fn freed(&self) {
        if self.live.fetch_sub(1, Ordering::AcqRel) == DRAINING | 1 {
            self.finish();
        }
    }

    /// Releases the charge and frees the entry.
    fn finish(&self) {
        let charged = self.charged.swap(0, Ordering::AcqRel);
        state::release(self.dev.load(Ordering::Acquire), charged);
        self.live.store(0, Ordering::Release);
        self.pool.store(std::ptr::null_mut(), Ordering::Release);
    }
}

static POOLED_FULL_LOGGED: AtomicBool = AtomicBool::new(false);

/// Around a free of `ptr` not charged on its own: when it came from a pool
/// we track, the pool has one allocation less once the driver agrees.
pub fn free_pooled(ptr: CUdeviceptr, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(v) = POOLED.remove(ptr) else {
        return call();
    };
    let rc = call();
    if rc == CUDA_SUCCESS {
        POOLS[unpack(v).0].freed();
    } else {
        POOLED.insert(ptr, v);
    }
    rc
}

/// After the driver destroyed `pool`: its charge goes now when nothing
/// allocated from it is outstanding, else at the last free (the driver
/// keeps the memory until then, `cuMemPoolDestroy`'s documentation and
/// the H200: bench/results/mempool-20261203T1752Z.json).
pub fn destroyed(pool: CUmemoryPool) {
    let Some(e) = find_pool(pool) else { return };
    e.pool
        .store(e as *const PoolEntry as *mut c_void, Ordering::Release);
    if e.live.fetch_or(DRAINING, Ordering::AcqRel) == 0 {
        e.finish();
    }
}

pub fn pool_entry(pool: CUmemoryPool, dev: usize) -> Option<&'static PoolEntry> {
    if let Some(e) = find_pool(pool) {
        return Some(e);
    }
    for e in &POOLS {
        if e.pool
            .compare_exchange(
                std::ptr::null_mut(),
                pool,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            e.dev.store(dev, Ordering::Release);
            e.live.store(0, Ordering::Release);
            return Some(e);
        }
    }
    None
}

pub fn find_pool(pool: CUmemoryPool) -> Option<&'static PoolEntry> {
    POOLS
        .iter()
        .find(|e| e.pool.load(Ordering::Acquire) == pool)
}

pub fn pool_attr(pool: CUmemoryPool, attr: c_int) -> Option<u64> {
    // SAFETY: cuMemPoolGetAttribute(pool, attr, void*).
    let f = unsafe { POOL_GET_ATTRIBUTE.func::<pfn::MemPoolGetAttribute>() }?;
    let mut v: u64 = 0;
    // SAFETY: both attributes we read are cuuint64_t.
    (unsafe { f(pool, attr, (&mut v as *mut u64).cast()) } == CUDA_SUCCESS).then_some(v)
}

pub fn device_mem_pool(dev: usize) -> Option<CUmemoryPool> {
    // SAFETY: cuDeviceGetMemPool(CUmemoryPool*, CUdevice).
    let f = unsafe { DEVICE_GET_MEM_POOL.func::<pfn::DeviceGetMemPool>() }?;
    let mut p: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { f(&mut p, dev as CUdevice) };
    (rc == CUDA_SUCCESS && !p.is_null()).then_some(p)
}

/// The capped device whose default or current pool `pool` is (a pool the
/// program got from `cuDeviceGetDefaultMemPool` / `cuDeviceGetMemPool`
/// rather than made), asked of the driver the first time the pool is seen.
pub fn device_of_pool(pool: CUmemoryPool) -> Option<CUdevice> {
    // SAFETY: cuDeviceGetDefaultMemPool has cuDeviceGetMemPool's prototype.
    let default = unsafe { DEVICE_GET_DEFAULT_MEM_POOL.func::<pfn::DeviceGetMemPool>() };
    let caps = &crate::state::shim().caps;
    (0..MAX_DEVICES)
        .filter(|&d| caps[d] != gpuslice_ledger::UNLIMITED)
        .find(|&d| {
            let is_default = default.is_some_and(|f| {
                let mut p: CUmemoryPool = std::ptr::null_mut();
                // SAFETY: valid out-pointer; an ordinal the driver lacks is
                // its to refuse.
                unsafe { f(&mut p, d as CUdevice) == CUDA_SUCCESS && p == pool }
            });
            is_default || device_mem_pool(d) == Some(pool)
        })
        .map(|d| d as CUdevice)
}

/// Brings the pool's charge to its reserved memory now; `hold` is what the
/// caller reserved beforehand and is counted as already charged.
pub fn settle_pool(e: &PoolEntry, t: Target, hold: u64) {
    let pool = e.pool.load(Ordering::Acquire);
    let old = e.charged.load(Ordering::Acquire);
    let now =
        relaxed(|| pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)).unwrap_or(old + hold);
    let old = e.charged.swap(now, Ordering::AcqRel);
    t.adjust(now as i128 - old as i128 - hold as i128);
}

/// What a stream-ordered pool grows by when an allocation does not fit its
/// free reserve: what is missing, rounded up to this step (32 MiB on the
/// H200, driver 580: bench/results/mempool-20261203T1752Z.json).
pub const POOL_GROWTH_STEP: u64 = 32 << 20;

/// What to hold before allocating `size` from a pool with `reserved` bytes
/// reserved, `used` of them in use: nothing when the free reserve covers
/// it, else what the pool will grow by.
pub fn pool_growth(reserved: u64, used: u64, size: u64) -> u64 {
    let free = reserved.saturating_sub(used);
    if free >= size {
        0
    } else {
        (size - free)
            .div_ceil(POOL_GROWTH_STEP)
            .saturating_mul(POOL_GROWTH_STEP)
    }
}

/// [`settle_pool`] after an allocation for which `hold` was reserved,
/// except that growth beyond `hold` is charged only within the cap: false
/// when it does not fit (nothing more charged; the caller undoes the
/// allocation with [`undo_growth`]).
pub fn settle_pool_within(e: &PoolEntry, t: Target, hold: u64) -> bool {
    let pool = e.pool.load(Ordering::Acquire);
    let old = e.charged.load(Ordering::Acquire);
    let now = relaxed(|| pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    let extra = now.map_or(0, |now| now.saturating_sub(old.saturating_add(hold)));
    if extra > 0 && !t.reserve(extra) {
        return false;
    }
    settle_pool(e, t, hold + extra);
    true
}

static FREE_ASYNC: Real = Real::named(c"cuMemFreeAsync");
static STREAM_SYNCHRONIZE: Real = Real::named(c"cuStreamSynchronize");
static CTX_SYNCHRONIZE: Real = Real::named(c"cuCtxSynchronize");
static POOL_TRIM_TO: Real = Real::named(c"cuMemPoolTrimTo");

/// Takes back an allocation whose pool grew past the cap: frees it on its
/// stream, waits for the free, and trims the pool back to `keep` (its
/// reserve before the allocation), so the memory is the driver's again.
pub fn undo_growth(pool: CUmemoryPool, ptr: CUdeviceptr, stream: CUstream, keep: u64) {
    // SAFETY: the signatures of cuMemFreeAsync, cuStreamSynchronize,
    // cuCtxSynchronize and cuMemPoolTrimTo; the pointer was just allocated
    // on `stream` and nothing else has it yet.
    unsafe {
        if let Some(free) = FREE_ASYNC.func::<pfn::MemFreeAsync>() {
            free(ptr, stream);
        }
        // The NULL stream: the per-thread one of a `_ptsz` caller orders
        // with it, and the context's synchronisation covers both.
        if stream.is_null() {
            if let Some(sync) = CTX_SYNCHRONIZE.func::<pfn::CtxSynchronize>() {
                sync();
            }
        } else if let Some(sync) = STREAM_SYNCHRONIZE.func::<pfn::StreamSynchronize>() {
            sync(stream);
        }
        if let Some(trim) = POOL_TRIM_TO.func::<pfn::MemPoolTrimTo>() {
            relaxed(|| trim(pool, keep.min(usize::MAX as u64) as usize));
        }
    }
}

/// Graph memory (allocation nodes, e.g. captured cudaMallocAsync) lives in
/// a per-device graph pool that grows when a graph is launched or
/// uploaded. It cannot be reserved before the launch; it is charged right
/// after, from `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
static GRAPH_CHARGED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

pub fn settle_graph(t: Target) {
    // SAFETY: cuDeviceGetGraphMemAttribute(CUdevice, attr, void*).
    let Some(f) = (unsafe { GRAPH_MEM_ATTRIBUTE.func::<pfn::DeviceGetGraphMemAttribute>() }) else {
        return;
    };
    let mut now: u64 = 0;
    // SAFETY: the attribute is a cuuint64_t.
    let rc = relaxed(|| unsafe {
        f(
            t.dev as CUdevice,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
            (&mut now as *mut u64).cast(),
        )
    });
    if rc != CUDA_SUCCESS {
        return;
    }
    let old = GRAPH_CHARGED[t.dev].swap(now, Ordering::AcqRel);
    t.adjust(now as i128 - old as i128);
}

/// Re-reads every pool and the graph pool of `t`'s device (they may have
/// shrunk without a call we see, e.g. auto-trim at synchronisation).
pub fn settle_device(t: Target) {
    let _mode = Relaxed::new();
    for e in &POOLS {
        if !e.pool.load(Ordering::Acquire).is_null()
            && !e.draining()
            && e.dev.load(Ordering::Acquire) == t.dev
        {
            settle_pool(e, t, 0);
        }
    }
    settle_graph(t);
}

/// Graph launches come every step of a graph-captured loop; the graph
/// pool grows on an exec's first launch and is then reused, so it is
/// re-read at most every [`GRAPH_SETTLE_EVERY_NS`] (growth shows up that
/// much later at most; a refusal re-reads it at once).
const GRAPH_SETTLE_EVERY_NS: u64 = 10_000_000;
static LAST_GRAPH_SETTLE: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

pub fn settle_graph_now_and_then(t: Target) {
    let now = crate::driver::coarse_now_ns();
    let last = LAST_GRAPH_SETTLE[t.dev].load(Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last) < GRAPH_SETTLE_EVERY_NS {
        return;
    }
    LAST_GRAPH_SETTLE[t.dev].store(now.max(1), Ordering::Relaxed);
    settle_graph(t);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn growth_is_what_the_h200_s_pool_grew_by() {
        // bench/results/mempool-20261203T1752Z.json: (reserved, used, size)
        // → what the reserve grew by.
        let used = 10_492 * MIB + 300 * 1024;
        for (reserved, used, size, grew) in [
            (0, 0, MIB, 32 * MIB),
            (32 * MIB, 28 * MIB + 300 * 1024, 16 * MIB, 32 * MIB),
            (96 * MIB, 92 * MIB + 300 * 1024, 256 * MIB, 256 * MIB),
            (10_496 * MIB, used, 33 * MIB, 32 * MIB),
            (32 * MIB, MIB, 3 * MIB + 1, 0),
        ] {
            assert_eq!(
                pool_growth(reserved, used, size),
                grew,
                "{reserved} {used} {size}"
            );
        }
    }
}
