//! What each interposed driver call does around the real one.
//!
//! Pattern: find the target (capped device of the current context, or the
//! device the call names); reserve in the ledger *before* the driver call;
//! call; on failure give the reservation back; on success remember what was
//! charged for the returned handle so the matching free releases it.
//! Anything uncapped passes straight through.
//!
//! Stream capture: a stream-ordered allocation on a capturing stream is a
//! graph allocation node, not memory; it passes through uncharged (the
//! graph's memory is charged when it is launched). The pool and
//! graph-memory queries the shim makes for itself are *potentially unsafe*
//! calls that the driver refuses while the calling thread is prohibited by
//! a capture (its own, or another thread's in global mode), invalidating
//! that capture; they run with the thread's capture mode relaxed.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use gpuslice_ledger::MAX_DEVICES;

use crate::compute;
use crate::cuda::*;
use crate::driver::{capturing, relaxed};
use crate::pools::{
    destroyed, device_mem_pool, device_of_pool, find_pool, free_pooled, pool_attr, pool_entry,
    pool_growth, settle_device, settle_graph, settle_graph_now_and_then, settle_pool,
    settle_pool_within, undo_growth, PoolEntry,
};
use crate::real::{real_fn, Real};
use crate::resident::{target, target_current};
use crate::state::{self, shim, target_no_context, Target};
use crate::sys::log_line;
use crate::table::{pack, unpack, Handles};

/// Device pointers from cuMemAlloc/Pitch/Managed (and async allocations
/// when no pool could be identified): 16 K slots in cache, then 1 M.
static PTRS: Handles = Handles::new(14, 20);
/// VMM handles from cuMemCreate.
static HANDLES: Handles = Handles::new(12, 18);
/// CUDA arrays and mipmapped arrays.
static ARRAYS: Handles = Handles::new(10, 16);

// Non-interposed driver functions the hooks call.
static ARRAY_REQUIREMENTS: Real = Real::named(c"cuArrayGetMemoryRequirements");
static MIPMAP_REQUIREMENTS: Real = Real::named(c"cuMipmappedArrayGetMemoryRequirements");
static ARRAY_DESTROY: Real = Real::named(c"cuArrayDestroy");
static MIPMAP_DESTROY: Real = Real::named(c"cuMipmappedArrayDestroy");
static MEM_FREE: Real = Real::named(c"cuMemFree_v2");
static STREAM_GET_DEVICE: Real = Real::named(c"cuStreamGetDevice");

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to).saturating_mul(to)
}

static TABLE_FULL_LOGGED: AtomicUsize = AtomicUsize::new(0);

/// The one path of an allocation charged to `t`: reserves `est` before
/// the driver `call`; on failure gives it back; on success `made` says
/// which handle was made and what it takes, the charge is settled to that
/// (the rest reserved, or the allocation undone with `undo` and refused
/// when it does not fit) and remembered in `table` for the matching free.
fn charged(
    t: Target,
    table: &Handles,
    est: u64,
    call: impl FnOnce() -> CUresult,
    made: impl FnOnce() -> (u64, u64),
    undo: impl FnOnce(u64),
) -> CUresult {
    if !t.reserve(est) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = call();
    if rc != CUDA_SUCCESS {
        t.release(est);
        return rc;
    }
    let (key, actual) = made();
    if actual > est {
        if t.ledger.reserve(t.slot, t.dev, actual - est).is_err() {
            undo(key);
            t.release(est);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else {
        t.release(est - actual);
    }
    if !table.insert(key, pack(t.dev, actual))
        && TABLE_FULL_LOGGED.fetch_add(1, Ordering::Relaxed) == 0
    {
        log_line("allocation table full: further allocations stay charged until exit");
    }
    rc
}

/// [`charged`] for a call that takes exactly `bytes` and writes the
/// handle it made at `out` on success.
///
/// # Safety
/// `out` is valid for a read once `call` has succeeded.
unsafe fn charged_exact<H: Copy + Into<u64>>(
    t: Target,
    table: &Handles,
    bytes: u64,
    out: *const H,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // SAFETY: read only after the call succeeded (caller contract).
    let made = || (unsafe { *out }.into(), bytes);
    charged(t, table, bytes, call, made, |_| {})
}

/// Around a free: forget the handle first (the driver may hand the same
/// address to another thread right after), release on success, restore on
/// failure.
fn untrack(table: &Handles, key: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    untrack_or(table, key, call, |call| call())
}

/// [`untrack`], with `absent` making the call when `key` is not in `table`.
fn untrack_or<C: FnOnce() -> CUresult>(
    table: &Handles,
    key: u64,
    call: C,
    absent: impl FnOnce(C) -> CUresult,
) -> CUresult {
    let Some(v) = table.remove(key) else {
        return absent(call);
    };
    let rc = call();
    if rc == CUDA_SUCCESS {
        let (dev, bytes) = unpack(v);
        state::release(dev, bytes);
    } else {
        table.insert(key, v);
    }
    rc
}

// ------------------------------------------------------------ plain

/// # Safety
/// C contract of `cuMemAlloc_v2`.
pub unsafe fn mem_alloc(real: &Real, dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    let f = real_fn!(real, pfn::MemAlloc);
    let Some(t) = target_current().filter(|_| size > 0 && !dptr.is_null()) else {
        // SAFETY: caller contract.
        return unsafe { f(dptr, size) };
    };
    // SAFETY: caller contract (`dptr` is written on success).
    unsafe { charged_exact(t, &PTRS, size as u64, dptr, || f(dptr, size)) }
}

/// # Safety
/// C contract of `cuMemAllocManaged`.
pub unsafe fn mem_alloc_managed(
    real: &Real,
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    let f = real_fn!(real, pfn::MemAllocManaged);
    // Managed memory can migrate; it is charged to the current device,
    // where it is first touched in the common case.
    let Some(t) = target_current().filter(|_| size > 0 && !dptr.is_null()) else {
        // SAFETY: caller contract.
        return unsafe { f(dptr, size, flags) };
    };
    // SAFETY: caller contract (`dptr` is written on success).
    unsafe { charged_exact(t, &PTRS, size as u64, dptr, || f(dptr, size, flags)) }
}

/// Charges the pitch the driver returns × height: reserves an estimate
/// (width rounded to 512 bytes) first, then settles to the real figure,
/// freeing the allocation again when the difference does not fit.
///
/// # Safety
/// C contract of `cuMemAllocPitch_v2`.
pub unsafe fn mem_alloc_pitch(
    real: &Real,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let f = real_fn!(real, pfn::MemAllocPitch);
    let ok = !dptr.is_null() && !pitch.is_null() && width > 0 && height > 0;
    let Some(t) = target_current().filter(|_| ok) else {
        // SAFETY: caller contract.
        return unsafe { f(dptr, pitch, width, height, elem) };
    };
    let est = round_up(width as u64, 512).saturating_mul(height as u64);
    // SAFETY: caller contract.
    let call = || unsafe { f(dptr, pitch, width, height, elem) };
    // SAFETY: both written by the driver on success.
    let made = || unsafe { (*dptr, (*pitch as u64).saturating_mul(height as u64)) };
    let undo = |ptr| {
        // SAFETY: cuMemFree_v2(CUdeviceptr) on the pointer just made.
        if let Some(free) = unsafe { MEM_FREE.func::<pfn::MemFree>() } {
            // SAFETY: frees what the driver just returned.
            unsafe { free(ptr) };
        }
    };
    charged(t, &PTRS, est, call, made, undo)
}

/// # Safety
/// C contract of `cuMemFree_v2`.
pub unsafe fn mem_free(real: &Real, dptr: CUdeviceptr) -> CUresult {
    let f = real_fn!(real, pfn::MemFree);
    // cuMemFree also frees stream-ordered allocations.
    // SAFETY: caller contract.
    untrack_or(
        &PTRS,
        dptr,
        || unsafe { f(dptr) },
        |call| free_pooled(dptr, call),
    )
}

// ------------------------------------------------------------ pools

/// The device a stream-ordered allocation lands on: a created stream's
/// own (the context it was made in), asked of the driver; the current
/// context's for the default streams (NULL, `CU_STREAM_LEGACY`,
/// `CU_STREAM_PER_THREAD`) or where the driver cannot tell (before CUDA
/// 12.8, no `cuStreamGetDevice`).
fn stream_target(stream: CUstream) -> Option<Target> {
    if stream as usize > 2 {
        // SAFETY: cuStreamGetDevice(CUstream, CUdevice*).
        if let Some(f) = unsafe { STREAM_GET_DEVICE.func::<pfn::StreamGetDevice>() } {
            let mut dev: CUdevice = 0;
            // SAFETY: valid out-pointer; a bad stream is the driver's to refuse.
            if unsafe { f(stream, &mut dev) } == CUDA_SUCCESS {
                return target(dev);
            }
        }
    }
    target_current()
}

/// Stream-ordered allocation from `pool` on `stream`: holds what the pool
/// will grow by ([`pool_growth`]) before the call, then settles to the
/// pool's reserved memory. A pool that grew more than held and past the
/// cap (a driver with another growth step, a fragmented reserve) has the
/// allocation taken back and the call fails with OOM: the pool's physical
/// size never passes the cap.
fn pooled(
    t: Target,
    e: &PoolEntry,
    (pool, stream): (CUmemoryPool, CUstream),
    dptr: *mut CUdeviceptr,
    size: usize,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let (reserved, used) = relaxed(|| {
        let reserved = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT).unwrap_or(0);
        let used = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT).unwrap_or(reserved);
        (reserved, used)
    });
    let hold = pool_growth(reserved, used, size as u64);
    if hold > 0 && !t.reserve(hold) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = call();
    if rc != CUDA_SUCCESS {
        t.release(hold);
        return rc;
    }
    // SAFETY: callers pass a non-null dptr, written by the driver on success.
    let ptr = unsafe { *dptr };
    if !settle_pool_within(e, t, hold) {
        undo_growth(pool, ptr, stream, reserved);
        settle_pool(e, t, hold);
        state::refused(t.dev, size as u64, t.ledger.used(t.dev), shim().caps[t.dev]);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    e.allocated(ptr);
    rc
}

/// # Safety
/// C contract of `cuMemAllocAsync` (either stream flavour).
pub unsafe fn mem_alloc_async(
    real: &Real,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    let f = real_fn!(real, pfn::MemAllocAsync);
    let Some(t) = stream_target(stream).filter(|_| size > 0 && !dptr.is_null()) else {
        // SAFETY: caller contract.
        return unsafe { f(dptr, size, stream) };
    };
    if capturing(stream) {
        // A graph allocation node: charged when the graph is launched.
        // SAFETY: caller contract.
        return unsafe { f(dptr, size, stream) };
    }
    match device_mem_pool(t.dev).and_then(|p| pool_entry(p, t.dev).map(|e| (p, e))) {
        // SAFETY: caller contract.
        Some((pool, e)) => pooled(t, e, (pool, stream), dptr, size, || unsafe {
            f(dptr, size, stream)
        }),
        // SAFETY: caller contract (`dptr` is written on success).
        None => unsafe { charged_exact(t, &PTRS, size as u64, dptr, || f(dptr, size, stream)) },
    }
}

/// # Safety
/// C contract of `cuMemAllocFromPoolAsync` (either stream flavour).
pub unsafe fn mem_alloc_from_pool_async(
    real: &Real,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let f = real_fn!(real, pfn::MemAllocFromPoolAsync);
    // A host pool holds no device memory; a pool made through
    // cuMemPoolCreate is charged to its device; a device's default (or
    // current) pool to that device, whichever context is current; any
    // other to the current context's device.
    let t = if HOST_POOLS.get(pool as u64).is_some() || !shim().active() {
        None
    } else {
        match find_pool(pool) {
            Some(e) => target(e.dev.load(Ordering::Acquire) as CUdevice),
            None => device_of_pool(pool).map_or_else(target_current, target),
        }
    };
    let Some(t) = t.filter(|_| size > 0 && !dptr.is_null() && !pool.is_null()) else {
        // SAFETY: caller contract.
        return unsafe { f(dptr, size, pool, stream) };
    };
    if capturing(stream) {
        // A graph allocation node: charged when the graph is launched.
        // SAFETY: caller contract.
        return unsafe { f(dptr, size, pool, stream) };
    }
    let Some(e) = pool_entry(pool, t.dev) else {
        // Pool table full: charge the allocation itself.
        // SAFETY: caller contract (`dptr` is written on success).
        return unsafe {
            charged_exact(t, &PTRS, size as u64, dptr, || f(dptr, size, pool, stream))
        };
    };
    // SAFETY: caller contract.
    pooled(t, e, (pool, stream), dptr, size, || unsafe {
        f(dptr, size, pool, stream)
    })
}

/// # Safety
/// C contract of `cuMemFreeAsync` (either stream flavour).
pub unsafe fn mem_free_async(real: &Real, dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let f = real_fn!(real, pfn::MemFreeAsync);
    // Pool memory stays reserved by its pool after a free: its charge moves
    // only when the pool's reserve does (settles), or with a destroyed
    // pool's last allocation. Pointers charged individually are released
    // here.
    // SAFETY: caller contract.
    untrack_or(
        &PTRS,
        dptr,
        || unsafe { f(dptr, stream) },
        |call| free_pooled(dptr, call),
    )
}

/// # Safety
/// C contract of `cuMemPoolTrimTo`.
pub unsafe fn mem_pool_trim_to(real: &Real, pool: CUmemoryPool, keep: usize) -> CUresult {
    let f = real_fn!(real, pfn::MemPoolTrimTo);
    // SAFETY: caller contract.
    let rc = unsafe { f(pool, keep) };
    if rc == CUDA_SUCCESS && shim().active() {
        if let Some(e) = find_pool(pool) {
            if let Some(t) = target(e.dev.load(Ordering::Acquire) as CUdevice) {
                settle_pool(e, t, 0);
            }
        }
    }
    rc
}

/// Pools made on the host: not charged.
static HOST_POOLS: Handles = Handles::new(6, 10);

/// # Safety
/// C contract of `cuMemPoolCreate`.
pub unsafe fn mem_pool_create(
    real: &Real,
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    let f = real_fn!(real, pfn::MemPoolCreate);
    // SAFETY: caller contract.
    let rc = unsafe { f(pool, props) };
    if rc != CUDA_SUCCESS || !shim().active() {
        return rc;
    }
    // SAFETY: the driver accepted both: `props` a CUmemPoolProps, `pool`
    // written.
    let (Some(p), Some(&made)) = (unsafe { props.as_ref() }, unsafe { pool.as_ref() }) else {
        return rc;
    };
    // Device memory, and managed memory the way cuMemAllocManaged is
    // charged: on the pool's device, else (a managed pool with no device
    // location) the current device at each allocation. Host memory: never.
    match (p.alloc_type, p.location_type) {
        (
            CU_MEM_ALLOCATION_TYPE_PINNED | CU_MEM_ALLOCATION_TYPE_MANAGED,
            CU_MEM_LOCATION_TYPE_DEVICE,
        ) => {
            if let Some(t) = target_no_context(p.location_id) {
                let _ = pool_entry(made, t.dev);
            }
        }
        (CU_MEM_ALLOCATION_TYPE_MANAGED, _) => {}
        _ => {
            HOST_POOLS.insert(made as u64, 1);
        }
    }
    rc
}

/// # Safety
/// C contract of `cuMemPoolDestroy`.
pub unsafe fn mem_pool_destroy(real: &Real, pool: CUmemoryPool) -> CUresult {
    let f = real_fn!(real, pfn::MemPoolDestroy);
    // SAFETY: caller contract.
    let rc = unsafe { f(pool) };
    if rc == CUDA_SUCCESS {
        HOST_POOLS.remove(pool as u64);
        destroyed(pool);
    }
    rc
}

// ------------------------------------------------------------ graphs

/// # Safety
/// C contract of `cuGraphLaunch` / `cuGraphUpload` (either stream flavour).
pub unsafe fn graph_launch(real: &Real, exec: CUgraphExec, stream: CUstream) -> CUresult {
    let f = real_fn!(real, pfn::GraphLaunch);
    // SAFETY: caller contract.
    let rc = compute::launch(stream, real, compute::Kind::Graph, || unsafe {
        f(exec, stream)
    });
    if rc == CUDA_SUCCESS && shim().memory_active {
        if let Some(t) = target_current() {
            settle_graph_now_and_then(t);
        }
    }
    rc
}

/// # Safety
/// C contract of `cuGraphUpload` (either stream flavour).
pub unsafe fn graph_upload(real: &Real, exec: CUgraphExec, stream: CUstream) -> CUresult {
    let f = real_fn!(real, pfn::GraphUpload);
    // SAFETY: caller contract.
    let rc = unsafe { f(exec, stream) };
    if rc == CUDA_SUCCESS {
        if let Some(t) = target_current() {
            settle_graph(t);
        }
    }
    rc
}

// ------------------------------------------------------------ launches

// `cuLaunchKernel` and `cuLaunchCooperativeKernel`: the same grid
// arguments, the first with a trailing `extra`; both metered as kernels.
macro_rules! grid_launch_hook {
    ($(#[$doc:meta])* $name:ident, $pfn:ident $(, $extra:ident)?) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name(
            real: &Real,
            func: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shmem: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
            $($extra: *mut *mut c_void,)?
        ) -> CUresult {
            let f = real_fn!(real, pfn::$pfn);
            // SAFETY: caller contract.
            compute::launch(stream, real, compute::Kind::Kernel, || unsafe {
                f(func, gx, gy, gz, bx, by, bz, shmem, stream, params $(, $extra)?)
            })
        }
    };
}

grid_launch_hook!(
    /// # Safety
    /// C contract of `cuLaunchKernel` (either stream flavour).
    launch_kernel,
    LaunchKernel,
    extra
);
grid_launch_hook!(
    /// # Safety
    /// C contract of `cuLaunchCooperativeKernel` (either stream flavour).
    launch_cooperative,
    LaunchCooperativeKernel
);

/// # Safety
/// C contract of `cuLaunchKernelEx` (either stream flavour).
pub unsafe fn launch_kernel_ex(
    real: &Real,
    config: *const LaunchConfig,
    func: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let f = real_fn!(real, pfn::LaunchKernelEx);
    // SAFETY: config null or valid (caller contract); the driver rejects null.
    let Some(c) = (unsafe { config.as_ref() }) else {
        // SAFETY: caller contract.
        return unsafe { f(config, func, params, extra) };
    };
    // SAFETY: caller contract.
    compute::launch(c.stream, real, compute::Kind::Kernel, || unsafe {
        f(config, func, params, extra)
    })
}

/// # Safety
/// C contract of `cuDeviceGraphMemTrim`.
pub unsafe fn device_graph_mem_trim(real: &Real, dev: CUdevice) -> CUresult {
    let f = real_fn!(real, pfn::DeviceGraphMemTrim);
    // SAFETY: caller contract.
    let rc = unsafe { f(dev) };
    if rc == CUDA_SUCCESS && shim().active() {
        if let Some(t) = target(dev) {
            settle_graph(t);
        }
    }
    rc
}

// ------------------------------------------------------------ VMM

/// # Safety
/// C contract of `cuMemCreate`.
pub unsafe fn mem_create(
    real: &Real,
    handle: *mut u64,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let f = real_fn!(real, pfn::MemCreate);
    // SAFETY: prop is null or a valid CUmemAllocationProp (caller contract).
    let dev = unsafe { prop.as_ref() }
        .filter(|p| p.location_type == CU_MEM_LOCATION_TYPE_DEVICE)
        .map(|p| p.location_id);
    let t = match dev {
        Some(d) if !handle.is_null() && size > 0 && shim().active() => target(d),
        _ => None,
    };
    let Some(t) = t else {
        // Host-located or uncapped: pass through.
        // SAFETY: caller contract.
        return unsafe { f(handle, size, prop, flags) };
    };
    // SAFETY: caller contract (`handle` is written on success).
    unsafe {
        charged_exact(t, &HANDLES, size as u64, handle, || {
            f(handle, size, prop, flags)
        })
    }
}

/// # Safety
/// C contract of `cuMemRelease`.
pub unsafe fn mem_release(real: &Real, handle: u64) -> CUresult {
    let f = real_fn!(real, pfn::MemRelease);
    {
        let mut m = mappings();
        if m.count.contains_key(&handle) {
            // Still mapped: the driver frees the memory at the last unmap,
            // so the charge moves aside until then.
            let Some(v) = HANDLES.remove(handle) else {
                drop(m);
                // SAFETY: caller contract.
                return unsafe { f(handle) };
            };
            // SAFETY: caller contract.
            let rc = unsafe { f(handle) };
            if rc == CUDA_SUCCESS {
                m.released.insert(handle, v);
            } else {
                HANDLES.insert(handle, v);
            }
            return rc;
        }
    }
    // SAFETY: caller contract.
    untrack(&HANDLES, handle, || unsafe { f(handle) })
}

/// The mappings of charged VMM handles (what the driver keeps a handle
/// alive by). Mapping is rare (a segment grows or shrinks), so a lock
/// serves here, off the allocation path.
struct Mappings {
    /// mapped address → (size, handle).
    at: BTreeMap<u64, (u64, u64)>,
    /// charged handle → its number of mappings.
    count: BTreeMap<u64, u32>,
    /// handles released while mapped → their charge (packed), released at
    /// their last unmap.
    released: BTreeMap<u64, u64>,
}

static MAPPINGS: Mutex<Mappings> = Mutex::new(Mappings {
    at: BTreeMap::new(),
    count: BTreeMap::new(),
    released: BTreeMap::new(),
});

fn mappings() -> MutexGuard<'static, Mappings> {
    MAPPINGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// # Safety
/// C contract of `cuMemMap`.
pub unsafe fn mem_map(
    real: &Real,
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    let f = real_fn!(real, pfn::MemMap);
    // SAFETY: caller contract.
    let rc = unsafe { f(ptr, size, offset, handle, flags) };
    if rc == CUDA_SUCCESS && HANDLES.get(handle).is_some() {
        let mut m = mappings();
        m.at.insert(ptr, (size as u64, handle));
        *m.count.entry(handle).or_insert(0) += 1;
    }
    rc
}

/// # Safety
/// C contract of `cuMemUnmap`.
pub unsafe fn mem_unmap(real: &Real, ptr: CUdeviceptr, size: usize) -> CUresult {
    let f = real_fn!(real, pfn::MemUnmap);
    // SAFETY: caller contract.
    let rc = unsafe { f(ptr, size) };
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let end = ptr.saturating_add(size as u64);
    let mut m = mappings();
    while let Some((&at, &(_, handle))) = m.at.range(ptr..end).next() {
        m.at.remove(&at);
        let left = m.count.get_mut(&handle).map_or(0, |n| {
            *n = n.saturating_sub(1);
            *n
        });
        if left == 0 {
            m.count.remove(&handle);
            if let Some(v) = m.released.remove(&handle) {
                let (dev, bytes) = unpack(v);
                state::release(dev, bytes);
            }
        }
    }
    rc
}

// ------------------------------------------------------------ arrays

#[derive(Clone, Copy)]
enum ArrayKind {
    Plain,
    Mipmapped,
}

fn array_requirements(kind: ArrayKind, arr: CUarray, dev: usize) -> Option<u64> {
    let real = match kind {
        ArrayKind::Plain => &ARRAY_REQUIREMENTS,
        ArrayKind::Mipmapped => &MIPMAP_REQUIREMENTS,
    };
    // SAFETY: cu[Mipmapped]ArrayGetMemoryRequirements(req*, handle, dev):
    // one prototype (a CUmipmappedArray is a handle like a CUarray).
    let f = unsafe { real.func::<pfn::ArrayGetMemoryRequirements>() }?;
    let mut req = ArrayMemoryRequirements::default();
    // SAFETY: valid out-pointer.
    let rc = unsafe { f(&mut req, arr, dev as CUdevice) };
    (rc == CUDA_SUCCESS && req.size > 0).then_some(req.size as u64)
}

fn array_destroy_real(kind: ArrayKind, arr: CUarray) {
    let real = match kind {
        ArrayKind::Plain => &ARRAY_DESTROY,
        ArrayKind::Mipmapped => &MIPMAP_DESTROY,
    };
    // SAFETY: cu[Mipmapped]ArrayDestroy(handle), on the array the driver
    // just created.
    unsafe { real.undo(arr) };
}

/// The driver backs a plain array with whole 2 MiB pages (the H200: a
/// 256 KiB array took 2 MiB, an 85.3 MiB mipmapped one 86 MiB;
/// bench/results/memphys-20261203T1704Z.json, `arrays`).
const ARRAY_GRANULE: u64 = 2 << 20;

/// Reserves an estimate (width × height × depth × channels × element size,
/// summed over mip levels, rounded up to [`ARRAY_GRANULE`]), creates, then
/// settles to the driver's memory requirements when it reports them (the
/// H200's reports them only for deferred-mapping arrays, which are not
/// charged); destroys the array again when the real size does not fit.
fn array_common(
    t: Target,
    kind: ArrayKind,
    est: u64,
    arr: *mut CUarray,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let est = round_up(est, ARRAY_GRANULE);
    let made = || {
        // SAFETY: arr non-null (checked by callers); written on success.
        let handle = unsafe { *arr };
        let actual = array_requirements(kind, handle, t.dev).unwrap_or(est);
        (handle as u64, actual)
    };
    let undo = |handle| array_destroy_real(kind, handle as CUarray);
    charged(t, &ARRAYS, est, call, made, undo)
}

fn extent(w: usize, h: usize, d: usize, format: c_int, channels: c_uint) -> u64 {
    (w.max(1) as u64)
        .saturating_mul(h.max(1) as u64)
        .saturating_mul(d.max(1) as u64)
        .saturating_mul(u64::from(channels.max(1)))
        .saturating_mul(format_bytes(format))
}

/// What the array creations share: `call` passes through uncharged without
/// a target, an out-pointer or a descriptor, or when `deferred` (no memory
/// until mapped); otherwise the array is charged `estimate` of its
/// descriptor.
///
/// # Safety
/// `desc` is null or valid (the creation's C contract).
unsafe fn create_array<D>(
    kind: ArrayKind,
    arr: *mut CUarray,
    desc: *const D,
    deferred: impl FnOnce(&D) -> bool,
    estimate: impl FnOnce(&D) -> u64,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // SAFETY: desc null or valid (caller contract).
    let d = unsafe { desc.as_ref() };
    let t = target_current().filter(|_| !arr.is_null());
    match (t, d) {
        (Some(t), Some(d)) if !deferred(d) => array_common(t, kind, estimate(d), arr, call),
        _ => call(),
    }
}

/// A deferred-mapping array: no memory until it is mapped.
fn is_deferred(d: &Array3DDescriptor) -> bool {
    d.flags & CUDA_ARRAY3D_DEFERRED_MAPPING != 0
}

/// # Safety
/// C contract of `cuArrayCreate_v2`.
pub unsafe fn array_create(
    real: &Real,
    arr: *mut CUarray,
    desc: *const ArrayDescriptor,
) -> CUresult {
    let f = real_fn!(real, pfn::ArrayCreate);
    let estimate = |d: &ArrayDescriptor| extent(d.width, d.height, 1, d.format, d.num_channels);
    // SAFETY: caller contract (desc and the call's arguments).
    unsafe {
        create_array(
            ArrayKind::Plain,
            arr,
            desc,
            |_| false,
            estimate,
            || f(arr, desc),
        )
    }
}

/// # Safety
/// C contract of `cuArray3DCreate_v2`.
pub unsafe fn array3d_create(
    real: &Real,
    arr: *mut CUarray,
    desc: *const Array3DDescriptor,
) -> CUresult {
    let f = real_fn!(real, pfn::Array3DCreate);
    let estimate =
        |d: &Array3DDescriptor| extent(d.width, d.height, d.depth, d.format, d.num_channels);
    // SAFETY: caller contract (desc and the call's arguments).
    unsafe {
        create_array(ArrayKind::Plain, arr, desc, is_deferred, estimate, || {
            f(arr, desc)
        })
    }
}

/// # Safety
/// C contract of `cuMipmappedArrayCreate`.
pub unsafe fn mipmapped_create(
    real: &Real,
    arr: *mut CUarray,
    desc: *const Array3DDescriptor,
    levels: c_uint,
) -> CUresult {
    let f = real_fn!(real, pfn::MipmappedArrayCreate);
    let estimate = |d: &Array3DDescriptor| {
        (0..levels.clamp(1, 64)).fold(0u64, |sum, l| {
            let shrink = |v: usize| if v == 0 { 0 } else { (v >> l).max(1) };
            sum.saturating_add(extent(
                shrink(d.width),
                shrink(d.height),
                shrink(d.depth),
                d.format,
                d.num_channels,
            ))
        })
    };
    // SAFETY: caller contract (desc and the call's arguments).
    unsafe {
        create_array(
            ArrayKind::Mipmapped,
            arr,
            desc,
            is_deferred,
            estimate,
            || f(arr, desc, levels),
        )
    }
}

/// # Safety
/// C contract of `cuArrayDestroy` or `cuMipmappedArrayDestroy` (the same
/// prototype; the array is untracked either way).
pub unsafe fn array_destroy(real: &Real, arr: CUarray) -> CUresult {
    let f = real_fn!(real, pfn::ArrayDestroy);
    // SAFETY: caller contract.
    untrack(&ARRAYS, arr as u64, || unsafe { f(arr) })
}

// ------------------------------------------------------------ mem info

/// (total, free) as the slice sees device `t`: total = min(cap, real
/// total), free = min(real free, cap − used), never underflowing.
fn slice_view(t: Target, real_total: u64, real_free: u64) -> (u64, u64) {
    settle_device(t);
    crate::resident::settle_later(t);
    let cap = shim().caps[t.dev];
    let total = cap.min(real_total);
    let left = total.saturating_sub(t.ledger.used(t.dev));
    (total, real_free.min(left))
}

/// # Safety
/// C contract of `cuMemGetInfo_v2`.
pub unsafe fn mem_get_info(real: &Real, free: *mut usize, total: *mut usize) -> CUresult {
    let f = real_fn!(real, pfn::MemGetInfo);
    // The driver's own handling of null pointers and errors comes first.
    // SAFETY: caller contract.
    let rc = unsafe { f(free, total) };
    // SAFETY: as the driver left them.
    unsafe { slice_mem_info(rc, free, total, |&v| v as u64, |v| v as usize) }
}

/// # Safety
/// C contract of `cuMemGetInfo` (the 32-bit ABI).
pub unsafe fn mem_get_info_v1(real: &Real, free: *mut c_uint, total: *mut c_uint) -> CUresult {
    let f = real_fn!(real, pfn::MemGetInfoV1);
    // SAFETY: caller contract.
    let rc = unsafe { f(free, total) };
    let narrow = |v: u64| v.min(u64::from(c_uint::MAX)) as c_uint;
    // SAFETY: as the driver left them.
    unsafe { slice_mem_info(rc, free, total, |&v| u64::from(v), narrow) }
}

/// What a `cuMemGetInfo*` returns (`rc`), its (free, total) rewritten in
/// place on success to the slice's view of the current device, if any;
/// `widen` and `narrow` convert from and to the ABI's integers.
///
/// # Safety
/// `free` and `total` null or valid, as the driver just left them.
unsafe fn slice_mem_info<T>(
    rc: CUresult,
    free: *mut T,
    total: *mut T,
    widen: impl Fn(&T) -> u64,
    narrow: impl Fn(u64) -> T,
) -> CUresult {
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let Some(t) = target_current() else { return rc };
    // SAFETY: non-null pointers were just written by the driver.
    unsafe {
        let real_total = total.as_ref().map_or(u64::MAX, &widen);
        let real_free = free.as_ref().map_or(u64::MAX, &widen);
        let (t_total, t_free) = slice_view(t, real_total, real_free);
        if let Some(v) = total.as_mut() {
            *v = narrow(t_total);
        }
        if let Some(v) = free.as_mut() {
            *v = narrow(t_free);
        }
    }
    rc
}

/// The cap of device ordinal `dev`, when it has one.
fn cap_of(dev: CUdevice) -> Option<u64> {
    let s = shim();
    s.ledger.as_ref()?;
    let d = usize::try_from(dev).ok().filter(|&d| d < MAX_DEVICES)?;
    Some(s.caps[d]).filter(|&c| c != gpuslice_ledger::UNLIMITED)
}

/// # Safety
/// C contract of `cuDeviceTotalMem_v2`: the total is the cap (what
/// `torch.cuda.get_device_properties().total_memory` reports).
pub unsafe fn device_total_mem(real: &Real, bytes: *mut usize, dev: CUdevice) -> CUresult {
    let f = real_fn!(real, pfn::DeviceTotalMem);
    // SAFETY: caller contract.
    let rc = unsafe { f(bytes, dev) };
    // SAFETY: as the driver left it.
    unsafe { capped_total(rc, bytes, dev, |&v| v as u64, |v| v as usize) }
}

/// # Safety
/// C contract of `cuDeviceTotalMem` (the pre-3.2, 32-bit ABI).
pub unsafe fn device_total_mem_v1(real: &Real, bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    let f = real_fn!(real, pfn::DeviceTotalMemV1);
    // SAFETY: caller contract.
    let rc = unsafe { f(bytes, dev) };
    // SAFETY: as the driver left it.
    unsafe { capped_total(rc, bytes, dev, |&v| u64::from(v), |v| v as c_uint) }
}

/// What a `cuDeviceTotalMem*` returns (`rc`), its total lowered on success
/// to the cap of `dev`, if any; `widen` and `narrow` convert from and to
/// the ABI's integer (the lowered total fits: it is at most the driver's).
///
/// # Safety
/// `bytes` as the driver just left it: valid when `rc` is success.
unsafe fn capped_total<T>(
    rc: CUresult,
    bytes: *mut T,
    dev: CUdevice,
    widen: impl Fn(&T) -> u64,
    narrow: impl Fn(u64) -> T,
) -> CUresult {
    if rc == CUDA_SUCCESS {
        if let Some(cap) = cap_of(dev) {
            // SAFETY: written by the driver on success.
            unsafe { *bytes = narrow(widen(&*bytes).min(cap)) };
        }
    }
    rc
}
