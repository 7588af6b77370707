//! The rest of the allocation surface the shim interposes, so its tests can
//! drive every path: pitch, managed, stream-ordered pools, VMM, arrays,
//! graph memory nodes, and the 32-bit `cuMemGetInfo`.
//!
//! Every byte of device memory any of these hold goes through
//! [`memory::alloc`] on the device's key, so `cuMemGetInfo` and NVML see it.
//! Pools grow their reserve in 32 MiB steps, by what an allocation needs
//! beyond the free reserve (as the H200's driver 580 does,
//! bench/results/mempool-20261203T1752Z.json), and keep it until trimmed;
//! a pool destroyed with allocations outstanding keeps its memory until
//! the last of them is freed (the CUDA documentation, and the H200); graph
//! memory is reserved by the first launch (or upload) of an exec with
//! allocation nodes and released by `cuDeviceGraphMemTrim` once no exec
//! needs it — as the real driver does. While a stream captures (see
//! [`super::capture`]), stream-ordered allocations on it become allocation
//! nodes of the graph the capture ends with; synchronous allocations and
//! frees, pool attribute reads and trims, and graph-memory queries and trims
//! are potentially unsafe calls there.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Mutex, MutexGuard};

use super::*;

pub(super) const POOL_STEP: u64 = 32 << 20;
/// VMM address reservations are aligned to the allocation granularity.
const VA_STEP: u64 = 2 << 20;
const ARRAY_ALIGN: u64 = 64 << 10;

type Handle = *mut c_void;

#[derive(Default)]
struct Pool {
    dev: usize,
    /// A host-located or managed pool: its memory is not the device's.
    host: bool,
    reserved: u64,
    used: u64,
    reserved_high: u64,
    used_high: u64,
    /// Device memory backing the reserve (addresses from `memory::alloc`).
    chunks: Vec<(u64, u64)>,
    /// Live allocations: address → size.
    live: BTreeMap<u64, u64>,
}

#[derive(Default)]
struct Graphs {
    next: usize,
    /// graph → bytes of its allocation nodes (device of the current context).
    graphs: BTreeMap<usize, (usize, u64)>,
    /// exec → (device, bytes, launched).
    execs: BTreeMap<usize, (usize, u64, bool)>,
    /// Per device: graph pool chunks.
    reserve: BTreeMap<usize, Vec<(u64, u64)>>,
}

#[derive(Default)]
struct Ext {
    pools: BTreeMap<usize, Pool>,
    /// Pools destroyed with allocations outstanding: their handles are
    /// invalid, their memory stays until the last allocation is freed.
    draining: BTreeMap<usize, Pool>,
    default_pool: BTreeMap<usize, usize>,
    next_pool: usize,
    next_addr: u64,
    /// pool allocation address → pool id.
    owner: BTreeMap<u64, usize>,
    /// array handle → its requirements' size for a deferred-mapping array,
    /// None for a plain one (its handle is its memory's address).
    arrays: BTreeMap<u64, Option<u64>>,
    graphs: Graphs,
    vmm: Vmm,
}

/// VMM handles and their mappings, as the real driver keeps them: a handle
/// released while still mapped keeps its memory until its last mapping is
/// unmapped.
#[derive(Default)]
struct Vmm {
    next_va: u64,
    /// live handle (from `cuMemCreate`) → number of mappings.
    mapped: BTreeMap<u64, u32>,
    /// handles released while mapped: freed at their last unmap.
    released: std::collections::BTreeSet<u64>,
    /// mapped address → (size, handle).
    at: BTreeMap<u64, (u64, u64)>,
}

static EXT: Mutex<Option<Ext>> = Mutex::new(None);

fn ext() -> MutexGuard<'static, Option<Ext>> {
    EXT.lock().unwrap_or_else(|e| e.into_inner())
}

fn with<T>(f: impl FnOnce(&mut Ext) -> T) -> T {
    let mut g = ext();
    f(g.get_or_insert_with(|| Ext {
        next_addr: 0x5f00_0000_0000,
        ..Ext::default()
    }))
}

/// Token handles: never dereferenced by callers.
const POOL_BASE: usize = 0x900_0000;
const GRAPH_BASE: usize = 0xA00_0000;

fn pool_id(h: Handle) -> Option<usize> {
    (h as usize).checked_sub(POOL_BASE).map(|o| o / 16)
}

fn dev_alloc(dev: usize, bytes: u64) -> Result<u64, CUresult> {
    let d = device(dev as CUdevice)?;
    memory::alloc(d.mem_key, d.memory_bytes, bytes).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)
}

fn new_pool(e: &mut Ext, dev: usize) -> usize {
    let id = e.next_pool;
    e.next_pool += 1;
    e.pools.insert(
        id,
        Pool {
            dev,
            ..Pool::default()
        },
    );
    id
}

fn default_pool(e: &mut Ext, dev: usize) -> usize {
    if let Some(&id) = e.default_pool.get(&dev) {
        return id;
    }
    let id = new_pool(e, dev);
    e.default_pool.insert(dev, id);
    id
}

fn pool_alloc(e: &mut Ext, id: usize, size: u64) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = e.pools.get_mut(&id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let slack = p.reserved - p.used;
    if slack < size {
        let step = state().map_or(POOL_STEP, |s| s.pool_step);
        let grow = (size - slack).div_ceil(step) * step;
        let chunk = if p.host {
            HOST_CHUNKS.fetch_add(grow, std::sync::atomic::Ordering::Relaxed)
        } else {
            dev_alloc(p.dev, grow)?
        };
        p.chunks.push((chunk, grow));
        p.reserved += grow;
        p.reserved_high = p.reserved_high.max(p.reserved);
    }
    p.used += size;
    p.used_high = p.used_high.max(p.used);
    let addr = e.next_addr;
    e.next_addr += size.div_ceil(512).max(1) * 512;
    p.live.insert(addr, size);
    e.owner.insert(addr, id);
    Ok(addr)
}

/// Addresses of host pools' memory (no device memory behind them).
static HOST_CHUNKS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0x4f00_0000_0000);

fn release_chunks(p: &mut Pool) {
    for (addr, _) in p.chunks.drain(..) {
        memory::free(addr);
    }
    p.reserved = 0;
}

/// Frees a pool allocation (stream-ordered or not): back to its pool, or,
/// for a destroyed pool's last outstanding one, the pool's memory with it.
/// False when `dptr` is no pool allocation.
pub(super) fn free_pooled(dptr: CUdeviceptr) -> bool {
    with(|e| {
        let Some(id) = e.owner.remove(&dptr) else {
            return false;
        };
        let Some(p) = e.pools.get_mut(&id).or_else(|| e.draining.get_mut(&id)) else {
            return false;
        };
        if let Some(size) = p.live.remove(&dptr) {
            p.used -= size;
        }
        if p.live.is_empty() {
            if let Some(mut p) = e.draining.remove(&id) {
                release_chunks(&mut p);
            }
        }
        true
    })
}

fn trim(p: &mut Pool, keep: u64) {
    let floor = p.used.max(keep);
    while let Some(&(addr, size)) = p.chunks.last() {
        if p.reserved - size < floor {
            break;
        }
        memory::free(addr);
        p.reserved -= size;
        p.chunks.pop();
    }
}

/// An entry point's body that reads one input struct: `f` with it,
/// INVALID_VALUE when the caller passed none.
fn with_input<T>(input: Option<&T>, f: impl FnOnce(&T) -> CUresult) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || match input {
        Some(x) => f(x),
        None => CUDA_ERROR_INVALID_VALUE,
    })
}

// ---------------------------------------------------------------- pitch, managed

/// # Safety
/// Out-pointers null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    outside_capture_on_current(|dev| {
        if width == 0 || height == 0 || !matches!(elem, 4 | 8 | 16) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = (width as u64).div_ceil(512) * 512;
        let ptr = dev_alloc(dev, p * height as u64)?;
        // SAFETY: caller contract.
        unsafe {
            out(pitch, p as usize)?;
            out(dptr, ptr)
        }
    })
}

/// # Safety
/// `dptr` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    // Entry points never call each other through their exported symbols:
    // those may be interposed (by the shim under test).
    outside_capture_on_current(|dev| {
        if size == 0 || dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = dev_alloc(dev, size as u64)?;
        // SAFETY: caller contract.
        unsafe { out(dptr, ptr) }
    })
}

/// # Safety
/// Out-pointers null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(current_device().and_then(|dev| {
            let d = device(dev as CUdevice)?;
            let f = d.memory_bytes.saturating_sub(memory::used(d.mem_key));
            let clamp = |v: u64| v.min(u64::from(c_uint::MAX)) as c_uint;
            // SAFETY: caller contract.
            unsafe {
                out(free, clamp(f))?;
                out(total, clamp(d.memory_bytes))
            }
        }))
    })
}

// ---------------------------------------------------------------- pools

/// # Safety
/// `pool` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut Handle, dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(device(dev).and_then(|_| {
            let id = with(|e| default_pool(e, dev as usize));
            // SAFETY: caller contract.
            unsafe { out(pool, (POOL_BASE + id * 16) as Handle) }
        }))
    })
}

/// # Safety
/// As `cuDeviceGetMemPool`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: CUdevice) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetMemPool(pool, dev) }
}

/// Reads the allocation type and location of the props.
///
/// # Safety
/// `pool` null or valid; `props` null or a `CUmemPoolProps`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut Handle,
    props: *const CUmemPoolProps,
) -> CUresult {
    // SAFETY: null or a CUmemPoolProps (caller contract).
    let props = unsafe { props.as_ref() };
    with_input(props, |p| {
        let (alloc, ty, id) = (p.alloc_type, p.location_type, p.location_id);
        // Pinned on a device (1), or on the host (2..=4: host, host NUMA,
        // current host NUMA); managed (allocType 2) on a device. Host pools
        // hold none of the device's memory; managed ones hold it the way
        // cuMemAllocManaged does here (on their device).
        let host = match (alloc, ty) {
            (1, 1) | (2, 1) => false,
            (1, 2..=4) => true,
            _ => return CUDA_ERROR_INVALID_VALUE,
        };
        let dev = if ty == 1 { id } else { 0 };
        rc(device(dev).and_then(|_| {
            let pid = with(|e| {
                let pid = new_pool(e, dev as usize);
                if let Some(p) = e.pools.get_mut(&pid) {
                    p.host = host;
                }
                pid
            });
            // SAFETY: caller contract.
            unsafe { out(pool, (POOL_BASE + pid * 16) as Handle) }
        }))
    })
}

#[no_mangle]
pub extern "C" fn cuMemPoolDestroy(pool: Handle) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        with(|e| {
            // A device's default pool cannot be destroyed.
            let Some(id) = pool_id(pool).filter(|id| !e.default_pool.values().any(|d| d == id))
            else {
                return CUDA_ERROR_INVALID_VALUE;
            };
            let Some(mut p) = e.pools.remove(&id) else {
                return CUDA_ERROR_INVALID_VALUE;
            };
            if p.live.is_empty() {
                release_chunks(&mut p);
            } else {
                e.draining.insert(id, p);
            }
            CUDA_SUCCESS
        })
    })
}

/// # Safety
/// `value` null or valid for a write of a `cuuint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: Handle,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        if let Err(e) = capture::unsafe_call() {
            return e;
        }
        let v = with(|e| {
            let p = pool_id(pool).and_then(|id| e.pools.get(&id))?;
            match attr {
                4 => Some(0),
                5 => Some(p.reserved),
                6 => Some(p.reserved_high),
                7 => Some(p.used),
                8 => Some(p.used_high),
                _ => None,
            }
        });
        match v {
            // SAFETY: caller contract.
            Some(v) => rc(unsafe { out(value.cast::<u64>(), v) }),
            None => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

#[no_mangle]
pub extern "C" fn cuMemPoolTrimTo(pool: Handle, keep: usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        if let Err(e) = capture::unsafe_call() {
            return e;
        }
        with(
            |e| match pool_id(pool).and_then(|id| e.pools.get_mut(&id)) {
                Some(p) => {
                    trim(p, keep as u64);
                    CUDA_SUCCESS
                }
                None => CUDA_ERROR_INVALID_VALUE,
            },
        )
    })
}

/// # Safety
/// `dptr` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Handle,
    stream: Handle,
) -> CUresult {
    from_pool_async(dptr, size, pool, capture::key(stream, false))
}

fn from_pool_async(dptr: *mut CUdeviceptr, size: usize, pool: Handle, stream: usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(state().and_then(|_| {
            let id = pool_id(pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            from_pool(dptr, size, id, stream)
        }))
    })
}

/// A stream-ordered allocation from pool `id` on stream `stream` (a
/// [`capture::key`]): an allocation node while the stream captures.
fn from_pool(
    dptr: *mut CUdeviceptr,
    size: usize,
    id: usize,
    stream: usize,
) -> Result<(), CUresult> {
    let addr = match capture::captured_alloc(stream, size as u64)? {
        Some(node) => node,
        None => with(|e| pool_alloc(e, id, size as u64))?,
    };
    // SAFETY: callers pass the caller's out-pointer (null or valid).
    unsafe { out(dptr, addr) }
}

/// # Safety
/// As `cuMemAllocFromPoolAsync`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Handle,
    stream: Handle,
) -> CUresult {
    from_pool_async(dptr, size, pool, capture::key(stream, true))
}

/// # Safety
/// `dptr` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: Handle,
) -> CUresult {
    alloc_async(dptr, size, stream, false)
}

/// From the current pool of the stream's device (not the current
/// context's), as the real driver does.
fn alloc_async(dptr: *mut CUdeviceptr, size: usize, stream: Handle, ptsz: bool) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(capture::stream_device(stream).and_then(|dev| {
            let id = with(|e| default_pool(e, dev));
            from_pool(dptr, size, id, capture::key(stream, ptsz))
        }))
    })
}

/// # Safety
/// As `cuMemAllocAsync`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: Handle,
) -> CUresult {
    alloc_async(dptr, size, stream, true)
}

/// Frees pool memory back to its pool (the reserve stays), or any other
/// device allocation.
#[no_mangle]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    free_async(dptr, capture::key(stream, false))
}

/// A free on a capturing stream is a free node of the graph (not modelled
/// further: the memory is not touched now).
fn free_async(dptr: CUdeviceptr, stream: usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        match capture::stream_op(stream) {
            Ok(true) => return CUDA_SUCCESS,
            Ok(false) => {}
            Err(e) => return e,
        }
        if free_pooled(dptr) || memory::free(dptr) || capture::free_node(dptr) {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_INVALID_VALUE
        }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    free_async(dptr, capture::key(stream, true))
}

// ---------------------------------------------------------------- VMM

/// Reads the prop's location (device memory on device `location_id`).
///
/// # Safety
/// `handle` null or valid; `prop` null or a `CUmemAllocationProp`.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const CUmemAllocationProp,
    _flags: u64,
) -> CUresult {
    // SAFETY: null or a CUmemAllocationProp (caller contract).
    let prop = unsafe { prop.as_ref() };
    with_input(prop, |prop| {
        if size == 0 || prop.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let id = prop.location_id;
        rc(state().and_then(|_| {
            let h = dev_alloc(id as usize, size as u64)?;
            with(|e| e.vmm.mapped.insert(h, 0));
            // SAFETY: caller contract.
            unsafe { out(handle, h) }
        }))
    })
}

/// Releases a handle: its memory goes now if it is not mapped, else at its
/// last `cuMemUnmap`. A handle released already is invalid.
#[no_mangle]
pub extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        with(|e| {
            if e.vmm.released.contains(&handle) {
                return CUDA_ERROR_INVALID_VALUE;
            }
            match e.vmm.mapped.get(&handle) {
                Some(&n) if n > 0 => {
                    e.vmm.released.insert(handle);
                    CUDA_SUCCESS
                }
                _ => {
                    e.vmm.mapped.remove(&handle);
                    match memory::free(handle) {
                        true => CUDA_SUCCESS,
                        false => CUDA_ERROR_INVALID_VALUE,
                    }
                }
            }
        })
    })
}

const VA_BASE: u64 = 0x7e00_0000_0000;

/// A range of virtual addresses (no memory behind it).
///
/// # Safety
/// `ptr` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    _align: usize,
    _addr: CUdeviceptr,
    _flags: u64,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        if size == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        rc(state().and_then(|_| {
            let va = with(|e| {
                let va = e.vmm.next_va.max(VA_BASE);
                e.vmm.next_va = va + (size as u64).div_ceil(VA_STEP) * VA_STEP;
                va
            });
            // SAFETY: caller contract.
            unsafe { out(ptr, va) }
        }))
    })
}

#[no_mangle]
pub extern "C" fn cuMemAddressFree(_ptr: CUdeviceptr, _size: usize) -> CUresult {
    CUDA_SUCCESS
}

/// Maps `handle` at `ptr`: the handle's memory lives while it is mapped.
#[no_mangle]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    _offset: usize,
    handle: u64,
    _flags: u64,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        with(|e| {
            let v = &mut e.vmm;
            if size == 0 || v.released.contains(&handle) || v.at.contains_key(&ptr) {
                return CUDA_ERROR_INVALID_VALUE;
            }
            let Some(n) = v.mapped.get_mut(&handle) else {
                return CUDA_ERROR_INVALID_VALUE;
            };
            *n += 1;
            v.at.insert(ptr, (size as u64, handle));
            CUDA_SUCCESS
        })
    })
}

/// Unmaps every mapping in `[ptr, ptr + size)`; a released handle's
/// memory is freed with its last mapping.
#[no_mangle]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        with(|e| {
            let v = &mut e.vmm;
            let end = ptr.saturating_add(size as u64);
            if v.at.range(ptr..end).next().is_none() {
                return CUDA_ERROR_INVALID_VALUE;
            }
            while let Some((&a, &(_, h))) = v.at.range(ptr..end).next() {
                v.at.remove(&a);
                let left = v.mapped.get_mut(&h).map_or(0, |n| {
                    *n = n.saturating_sub(1);
                    *n
                });
                if left == 0 && v.released.remove(&h) {
                    v.mapped.remove(&h);
                    memory::free(h);
                }
            }
            CUDA_SUCCESS
        })
    })
}

// ---------------------------------------------------------------- arrays

fn format_bytes(format: c_int) -> Option<u64> {
    match format {
        0x01 | 0x08 => Some(1),
        0x02 | 0x09 | 0x10 => Some(2),
        0x03 | 0x0a | 0x20 => Some(4),
        _ => None,
    }
}

/// The device memory a plain array holds is its size rounded up to 2 MiB
/// (the H200: a 256 KiB 1D array and an 85.3 MiB mipmapped one took 2 and
/// 86 MiB, bench/results/memphys-20261203T1704Z.json, `arrays`).
const ARRAY_GRANULE: u64 = 2 << 20;

/// An array's size as its memory requirements give it: texels × bytes,
/// aligned to 64 KiB.
fn array_bytes(w: usize, h: usize, d: usize, format: c_int, channels: c_uint) -> Option<u64> {
    if w == 0 || !matches!(channels, 1 | 2 | 4) {
        return None;
    }
    let texels = w as u64 * h.max(1) as u64 * d.max(1) as u64;
    Some((texels * channels as u64 * format_bytes(format)?).div_ceil(ARRAY_ALIGN) * ARRAY_ALIGN)
}

/// Makes an array of `bytes` (its requirements' size). A plain one holds
/// that rounded up to [`ARRAY_GRANULE`] and, as on the real driver, has no
/// memory requirements to report; a deferred-mapping one holds nothing and
/// reports them (the program maps memory into it: `cuMemMapArrayAsync`).
fn make_array(arr: *mut Handle, bytes: Option<u64>, flags: c_uint) -> CUresult {
    rc(current_device().and_then(|dev| {
        let bytes = bytes.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = if flags & CUDA_ARRAY3D_DEFERRED_MAPPING != 0 {
            with(|e| {
                let h = e.next_addr;
                e.next_addr += ARRAY_ALIGN;
                e.arrays.insert(h, Some(bytes));
                h
            })
        } else {
            let h = dev_alloc(dev, bytes.div_ceil(ARRAY_GRANULE) * ARRAY_GRANULE)?;
            with(|e| e.arrays.insert(h, None));
            h
        };
        // SAFETY: callers checked `arr`'s contract.
        unsafe { out(arr, h as Handle) }
    }))
}

/// # Safety
/// `arr` null or valid; `desc` null or a `CUDA_ARRAY_DESCRIPTOR`.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    arr: *mut Handle,
    desc: *const ArrayDescriptor,
) -> CUresult {
    // SAFETY: null or a descriptor (caller contract).
    let desc = unsafe { desc.as_ref() };
    with_input(desc, |d| {
        let bytes = array_bytes(d.width, d.height, 1, d.format, d.num_channels);
        make_array(arr, bytes, 0)
    })
}

/// # Safety
/// `arr` null or valid; `desc` null or a `CUDA_ARRAY3D_DESCRIPTOR`.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    arr: *mut Handle,
    desc: *const Array3DDescriptor,
) -> CUresult {
    // SAFETY: null or a descriptor (caller contract).
    let desc = unsafe { desc.as_ref() };
    with_input(desc, |d| {
        let bytes = array_bytes(d.width, d.height, d.depth, d.format, d.num_channels);
        make_array(arr, bytes, d.flags)
    })
}

/// # Safety
/// `arr` null or valid; `desc` null or a `CUDA_ARRAY3D_DESCRIPTOR`.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    arr: *mut Handle,
    desc: *const Array3DDescriptor,
    levels: c_uint,
) -> CUresult {
    // SAFETY: null or a descriptor (caller contract).
    let desc = unsafe { desc.as_ref() };
    with_input(desc, |desc| {
        if levels == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (w, h, d, f, c) = (
            desc.width,
            desc.height,
            desc.depth,
            desc.format,
            desc.num_channels,
        );
        let shrink = |v: usize, l: u32| if v == 0 { 0 } else { (v >> l).max(1) };
        let bytes = (0..levels.min(32))
            .map(|l| array_bytes(shrink(w, l), shrink(h, l), shrink(d, l), f, c))
            .sum::<Option<u64>>();
        make_array(arr, bytes, desc.flags)
    })
}

fn destroy_array(arr: Handle) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let h = arr as u64;
        match with(|e| e.arrays.remove(&h)) {
            Some(Some(_)) => CUDA_SUCCESS,
            Some(None) if memory::free(h) => CUDA_SUCCESS,
            _ => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

#[no_mangle]
pub extern "C" fn cuArrayDestroy(arr: Handle) -> CUresult {
    destroy_array(arr)
}

#[no_mangle]
pub extern "C" fn cuMipmappedArrayDestroy(arr: Handle) -> CUresult {
    destroy_array(arr)
}

/// Writes the size and alignment (the reserved words are left alone).
///
/// # Safety
/// `req` null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuArrayGetMemoryRequirements(
    req: *mut ArrayMemoryRequirements,
    arr: Handle,
    _dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        // Only deferred-mapping arrays have requirements (the H200: 1,
        // CUDA_ERROR_INVALID_VALUE, for every plain array).
        let Some(Some(bytes)) = with(|e| e.arrays.get(&(arr as u64)).copied()) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        if req.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null, valid for writes (caller contract).
        unsafe {
            (*req).size = bytes as usize;
            (*req).alignment = ARRAY_ALIGN as usize;
        }
        CUDA_SUCCESS
    })
}

/// # Safety
/// As `cuArrayGetMemoryRequirements`.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayGetMemoryRequirements(
    req: *mut ArrayMemoryRequirements,
    arr: Handle,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuArrayGetMemoryRequirements(req, arr, dev) }
}

// ---------------------------------------------------------------- graphs

/// # Safety
/// `graph` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut Handle, _flags: c_uint) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(current_device().and_then(|dev| {
            let id = with(|e| {
                e.graphs.next += 1;
                let id = e.graphs.next;
                e.graphs.graphs.insert(id, (dev, 0));
                id
            });
            // SAFETY: caller contract.
            unsafe { out(graph, (GRAPH_BASE + id * 16) as Handle) }
        }))
    })
}

/// The graph a stream capture ended with: its allocation nodes' bytes on
/// `dev`.
pub(super) fn captured_graph(dev: usize, bytes: u64) -> Handle {
    let id = with(|e| {
        e.graphs.next += 1;
        let id = e.graphs.next;
        e.graphs.graphs.insert(id, (dev, bytes));
        id
    });
    (GRAPH_BASE + id * 16) as Handle
}

fn graph_id(h: Handle) -> Option<usize> {
    (h as usize).checked_sub(GRAPH_BASE).map(|o| o / 16)
}

/// Reads the node's `bytesize`, writes its `dptr`.
///
/// # Safety
/// `node` null or valid; `params` a node-params struct.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut Handle,
    graph: Handle,
    _deps: *const Handle,
    _ndeps: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        if params.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null, a node-params struct (caller contract).
        let bytes = unsafe { (*params).bytesize } as u64;
        let addr = with(|e| {
            let g = e.graphs.graphs.get_mut(&graph_id(graph)?)?;
            g.1 += bytes;
            let a = e.next_addr;
            e.next_addr += bytes.div_ceil(512).max(1) * 512;
            Some(a)
        });
        let Some(addr) = addr else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        // SAFETY: as above.
        unsafe { (*params).dptr = addr };
        // SAFETY: caller contract.
        rc(unsafe { out(node, (addr as usize) as Handle) })
    })
}

/// # Safety
/// `exec` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut Handle,
    graph: Handle,
    _flags: u64,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let id = with(|e| {
            let &(dev, bytes) = e.graphs.graphs.get(&graph_id(graph)?)?;
            e.graphs.next += 1;
            let id = e.graphs.next;
            e.graphs.execs.insert(id, (dev, bytes, false));
            Some(id)
        });
        match id {
            // SAFETY: caller contract.
            Some(id) => rc(unsafe { out(exec, (GRAPH_BASE + id * 16) as Handle) }),
            None => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

/// Reserves graph memory for the exec's allocation nodes on first use.
fn graph_use(exec: Handle) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(with(|e| {
            let id = graph_id(exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let &(dev, bytes, launched) =
                e.graphs.execs.get(&id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if launched || bytes == 0 {
                return Ok(());
            }
            let chunk = dev_alloc(dev, bytes)?;
            e.graphs
                .reserve
                .entry(dev)
                .or_default()
                .push((chunk, bytes));
            e.graphs.execs.insert(id, (dev, bytes, true));
            Ok(())
        }))
    })
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch(exec: Handle, stream: Handle) -> CUresult {
    match graph_use(exec) {
        CUDA_SUCCESS => super::launch::graph(stream, false),
        rc => rc,
    }
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch_ptsz(exec: Handle, stream: Handle) -> CUresult {
    match graph_use(exec) {
        CUDA_SUCCESS => super::launch::graph(stream, true),
        rc => rc,
    }
}

#[no_mangle]
pub extern "C" fn cuGraphUpload(exec: Handle, _stream: Handle) -> CUresult {
    graph_use(exec)
}

#[no_mangle]
pub extern "C" fn cuGraphUpload_ptsz(exec: Handle, _stream: Handle) -> CUresult {
    graph_use(exec)
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(exec: Handle) -> CUresult {
    destroy_graph_object(|g| g.execs.remove(&graph_id(exec)?))
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(graph: Handle) -> CUresult {
    destroy_graph_object(|g| g.graphs.remove(&graph_id(graph)?))
}

/// Destroys a graph or an exec: `remove` takes its entry out of the
/// tables; INVALID_VALUE when the handle named none.
fn destroy_graph_object<V>(remove: impl FnOnce(&mut Graphs) -> Option<V>) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        with(|e| match remove(&mut e.graphs) {
            Some(_) => CUDA_SUCCESS,
            None => CUDA_ERROR_INVALID_VALUE,
        })
    })
}

fn graph_need(e: &Ext, dev: usize) -> u64 {
    e.graphs
        .execs
        .values()
        .filter(|x| x.0 == dev && x.2)
        .map(|x| x.1)
        .sum()
}

/// Releases graph memory no live exec needs.
#[no_mangle]
pub extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(capture::unsafe_call().and_then(|_| device(dev)).map(|_| {
            with(|e| {
                let need = graph_need(e, dev as usize);
                let chunks = e.graphs.reserve.entry(dev as usize).or_default();
                let mut held: u64 = chunks.iter().map(|c| c.1).sum();
                while let Some(&(addr, size)) = chunks.last() {
                    if held - size < need {
                        break;
                    }
                    memory::free(addr);
                    held -= size;
                    chunks.pop();
                }
            })
        }))
    })
}

/// # Safety
/// `value` null or valid for a write of a `cuuint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: CUdevice,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(capture::unsafe_call()
            .and_then(|_| device(dev))
            .and_then(|_| {
                let v = with(|e| {
                    let reserved: u64 = e
                        .graphs
                        .reserve
                        .get(&(dev as usize))
                        .map_or(0, |c| c.iter().map(|c| c.1).sum());
                    match attr {
                        0 | 1 => Some(graph_need(e, dev as usize)),
                        2 | 3 => Some(reserved),
                        _ => None,
                    }
                })
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                // SAFETY: caller contract.
                unsafe { out(value.cast::<u64>(), v) }
            }))
    })
}
