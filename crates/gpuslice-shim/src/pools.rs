//! Memory the driver holds in pools the shim cannot reserve for before a
//! call: stream-ordered pools and the per-device graph pool. Their charges
//! are settled to what the driver reports (on growth, and on a refusal,
//! see [`crate::resident`]); the hooks that allocate from them are in
//! [`crate::hooks`].

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use gpuslice_ledger::MAX_DEVICES;

use crate::cuda::*;
use crate::driver::{relaxed, Relaxed};
use crate::real::Real;
use crate::state::Target;

static DEVICE_GET_MEM_POOL: Real = Real::named(c"cuDeviceGetMemPool");
static POOL_GET_ATTRIBUTE: Real = Real::named(c"cuMemPoolGetAttribute");
static GRAPH_MEM_ATTRIBUTE: Real = Real::named(c"cuDeviceGetGraphMemAttribute");

/// A memory pool we have seen, and what the ledger holds for it: the
/// pool's reserved memory (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`) as of
/// the last settle.
pub struct PoolEntry {
    pub pool: AtomicPtr<c_void>,
    pub dev: AtomicUsize,
    pub charged: AtomicU64,
}

const MAX_POOLS: usize = 64;
static POOLS: [PoolEntry; MAX_POOLS] = [const {
    PoolEntry {
        pool: AtomicPtr::new(std::ptr::null_mut()),
        dev: AtomicUsize::new(0),
        charged: AtomicU64::new(0),
    }
}; MAX_POOLS];

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
        if !e.pool.load(Ordering::Acquire).is_null() && e.dev.load(Ordering::Acquire) == t.dev {
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
