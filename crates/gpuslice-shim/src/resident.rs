//! Memory the driver holds for the process rather than for an allocation:
//! contexts (primary, created, green), loaded modules and libraries, and
//! context limits (stack × resident threads, printf FIFO, malloc heap).
//! Charging it is what makes the cap physical: the slice's processes
//! together never hold more device memory than the cap, as the host's
//! NVML per-process accounting counts it.
//!
//! - A context is reserved *before* it is created, at the estimate
//!   (`GPUSLICE_CONTEXT_BYTES`, else [`DEFAULT_CONTEXT_BYTES`]); over the
//!   cap its creation fails with `CUDA_ERROR_OUT_OF_MEMORY`, as the real
//!   driver's does when the GPU is full.
//! - Modules, libraries and limits are charged by the drop in the device's
//!   free memory (the real `cuMemGetInfo`) across the call; when that does
//!   not fit, the module is unloaded (the limit restored) and the call
//!   fails with `CUDA_ERROR_OUT_OF_MEMORY`.
//! - [`settle`] replaces these estimates with the measurement: what NVML
//!   says this process holds ([`crate::measure`]) minus what its
//!   allocations are charged. It runs before any refusal and, in the
//!   background, after memory queries (at most every [`SETTLE_EVERY_NS`]),
//!   never on the allocation path nor on a query's. `GPUSLICE_CONTEXT_BYTES`, when set, overrides the measurement.
//!
//! Per device, [`OVERHEAD`] is what this process's slot holds for all of
//! it; it is released when the device's last context goes.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use gpuslice_ledger::MAX_DEVICES;

use crate::cuda::*;
use crate::driver::coarse_now_ns;
use crate::real::Real;
use crate::state::{self, shim, target_no_context, Target};
use crate::table::{pack, unpack, Handles};

/// The context estimate before it is measured. It must not be below what a
/// context really holds: allocations made before the measurement lands
/// are checked against it, and an under-estimate lets them pass the cap
/// physically (bench/README.md). An over-estimate costs nothing
/// lasting: a refusal measures first and retries, and the measurement
/// gives the difference back.
pub const DEFAULT_CONTEXT_BYTES: u64 = 1 << 30;
/// Least time between two measurements made for a memory query.
pub const SETTLE_EVERY_NS: u64 = 100_000_000;

/// Bytes the slot holds per device for driver-held memory.
pub static OVERHEAD: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Primary-context retains per device (ours, not the driver's count).
static PRIMARY_REFS: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];
/// Whether a context of the device was charged (by a hook, or at first use).
pub static CONTEXT_CHARGED: [AtomicBool; MAX_DEVICES] =
    [const { AtomicBool::new(false) }; MAX_DEVICES];
static LAST_SETTLE: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// Created and green contexts, modules and libraries → (device, bytes).
static OBJECTS: Handles = Handles::new(10, 16);

static MEM_GET_INFO: Real = Real::named(c"cuMemGetInfo_v2");
static CTX_GET_LIMIT: Real = Real::named(c"cuCtxGetLimit");
static MODULE_UNLOAD: Real = Real::named(c"cuModuleUnload");
static LIBRARY_UNLOAD: Real = Real::named(c"cuLibraryUnload");

/// The context estimate in force.
pub fn context_estimate() -> u64 {
    shim().context_bytes.unwrap_or(DEFAULT_CONTEXT_BYTES)
}

/// Makes every forked child forget this process's charges (the
/// constructor; the slot itself is forgotten by `crate::state`).
pub fn forget_charges_in_forked_children() {
    // SAFETY: registers a plain extern "C" handler; no other effect.
    unsafe { libc::pthread_atfork(None, None, Some(reset_after_fork)) };
}

/// Forgets every charge (a forked child starts with none).
extern "C" fn reset_after_fork() {
    for d in 0..MAX_DEVICES {
        OVERHEAD[d].store(0, Ordering::Relaxed);
        PRIMARY_REFS[d].store(0, Ordering::Relaxed);
        CONTEXT_CHARGED[d].store(false, Ordering::Relaxed);
        LAST_SETTLE[d].store(0, Ordering::Relaxed);
        LAST_LOWERED[d].store(0, Ordering::Relaxed);
        QUEUED[d].store(false, Ordering::Relaxed);
    }
}

fn add_overhead(t: Target, bytes: u64) {
    OVERHEAD[t.dev].fetch_add(bytes, Ordering::AcqRel);
}

fn sub_overhead(dev: usize, bytes: u64) -> u64 {
    let mut cur = OVERHEAD[dev].load(Ordering::Acquire);
    loop {
        let take = cur.min(bytes);
        match OVERHEAD[dev].compare_exchange(cur, cur - take, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return take,
            Err(now) => cur = now,
        }
    }
}

/// Releases driver-held bytes of `dev` (never more than the slot holds
/// for them).
fn release_overhead(dev: usize, bytes: u64) {
    let taken = sub_overhead(dev, bytes);
    state::release(dev, taken);
}

/// Charges a context that exists already (created where no hook saw it):
/// recorded even past the cap.
#[cold]
pub fn charge_existing_context(t: Target) {
    if !CONTEXT_CHARGED[t.dev].swap(true, Ordering::AcqRel) {
        let e = context_estimate();
        t.ledger.charge_unchecked(t.slot, t.dev, e);
        add_overhead(t, e);
    }
}

/// Creates a context with its charge: the estimate is reserved first;
/// when it does not fit, the context is created and measured instead
/// ([`settle`]), and undone with `CUDA_ERROR_OUT_OF_MEMORY` when the
/// measurement does not fit either (or cannot be made). `record` runs on
/// success with the bytes charged for this context.
fn create_context(
    t: Target,
    call: impl FnOnce() -> CUresult,
    undo: impl FnOnce(),
    record: impl FnOnce(u64),
) -> CUresult {
    let e = context_estimate();
    if t.reserve(e) {
        let rc = call();
        if rc != CUDA_SUCCESS {
            t.release(e);
            return rc;
        }
        add_overhead(t, e);
        CONTEXT_CHARGED[t.dev].store(true, Ordering::Release);
        record(e);
        settle_soon(t);
        return rc;
    }
    let rc = call();
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let before = OVERHEAD[t.dev].load(Ordering::Acquire);
    let measured = settle(t, Why::Context);
    let charged = OVERHEAD[t.dev]
        .load(Ordering::Acquire)
        .saturating_sub(before);
    if !measured || t.ledger.used(t.dev) > t.ledger.cap(t.dev) {
        undo();
        release_overhead(t.dev, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CONTEXT_CHARGED[t.dev].store(true, Ordering::Release);
    record(charged);
    rc
}

static PRIMARY_RELEASE: Real = Real::named(c"cuDevicePrimaryCtxRelease_v2");
static CTX_DESTROY: Real = Real::named(c"cuCtxDestroy_v2");
static GREEN_DESTROY: Real = Real::named(c"cuGreenCtxDestroy");

fn release_primary(dev: CUdevice) {
    // SAFETY: cuDevicePrimaryCtxRelease_v2(CUdevice).
    if let Some(f) = unsafe { PRIMARY_RELEASE.func::<pfn::DevicePrimaryCtxRelease>() } {
        // SAFETY: drops the reference just taken.
        unsafe { f(dev) };
    }
}

use crate::real::real_fn;

// ------------------------------------------------------------ contexts

/// # Safety
/// C contract of `cuDevicePrimaryCtxRetain`.
pub unsafe fn primary_ctx_retain(real: &Real, pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let f = real_fn!(real, pfn::DevicePrimaryCtxRetain);
    let t = target_no_context(dev).filter(|_| !pctx.is_null());
    let first = t.is_some_and(|t| PRIMARY_REFS[t.dev].load(Ordering::Acquire) == 0);
    match t {
        // The first retain creates the primary context.
        Some(t) if first && !CONTEXT_CHARGED[t.dev].load(Ordering::Acquire) => {
            // SAFETY: caller contract.
            create_context(
                t,
                || unsafe { f(pctx, dev) },
                || release_primary(dev),
                |_| {
                    PRIMARY_REFS[t.dev].fetch_add(1, Ordering::AcqRel);
                },
            )
        }
        Some(t) => {
            // SAFETY: caller contract.
            let rc = unsafe { f(pctx, dev) };
            if rc == CUDA_SUCCESS {
                PRIMARY_REFS[t.dev].fetch_add(1, Ordering::AcqRel);
            }
            rc
        }
        // SAFETY: caller contract.
        None => unsafe { f(pctx, dev) },
    }
}

/// The device's last context went: the driver freed what it held for it.
fn context_gone(dev: usize) {
    let all = OVERHEAD[dev].load(Ordering::Acquire);
    release_overhead(dev, all);
    CONTEXT_CHARGED[dev].store(false, Ordering::Release);
}

/// # Safety
/// C contract of `cuDevicePrimaryCtxRelease(_v2)`.
pub unsafe fn primary_ctx_release(real: &Real, dev: CUdevice) -> CUresult {
    let f = real_fn!(real, pfn::DevicePrimaryCtxRelease);
    // SAFETY: caller contract.
    let rc = unsafe { f(dev) };
    if rc == CUDA_SUCCESS {
        if let Some(d) = usize::try_from(dev).ok().filter(|&d| d < MAX_DEVICES) {
            let prev = PRIMARY_REFS[d]
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .unwrap_or(0);
            if prev == 1 && !has_created_context(d) {
                context_gone(d);
            }
        }
    }
    rc
}

/// # Safety
/// C contract of `cuDevicePrimaryCtxReset(_v2)`.
pub unsafe fn primary_ctx_reset(real: &Real, dev: CUdevice) -> CUresult {
    let f = real_fn!(real, pfn::DevicePrimaryCtxReset);
    // SAFETY: caller contract.
    let rc = unsafe { f(dev) };
    if rc == CUDA_SUCCESS {
        if let Some(d) = usize::try_from(dev).ok().filter(|&d| d < MAX_DEVICES) {
            PRIMARY_REFS[d].store(0, Ordering::Release);
            if !has_created_context(d) {
                context_gone(d);
            }
        }
    }
    rc
}

static CREATED: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];

fn has_created_context(dev: usize) -> bool {
    CREATED[dev].load(Ordering::Acquire) > 0
}

/// A context created (or a green one) on `dev` by `call`, which writes it
/// at `pctx`: on a capped device its own charge, recorded by handle.
fn created(
    dev: CUdevice,
    pctx: *mut CUcontext,
    destroy: &'static Real,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(t) = target_no_context(dev).filter(|_| !pctx.is_null()) else {
        return call();
    };
    // SAFETY: cuCtxDestroy_v2 / cuGreenCtxDestroy(handle); pctx non-null,
    // written on success (the undo runs only then).
    let undo = || unsafe { destroy.undo(*pctx) };
    create_context(t, call, undo, |e| {
        CREATED[t.dev].fetch_add(1, Ordering::AcqRel);
        // SAFETY: non-null (checked by callers); written on success.
        let h = unsafe { *pctx } as u64;
        OBJECTS.insert(h, pack(t.dev, e));
    })
}

/// # Safety
/// C contract of `cuCtxCreate_v2`.
pub unsafe fn ctx_create(
    real: &Real,
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let f = real_fn!(real, pfn::CtxCreate);
    // SAFETY: caller contract.
    created(dev, pctx, &CTX_DESTROY, || unsafe { f(pctx, flags, dev) })
}

/// # Safety
/// C contract of `cuCtxCreate_v3`.
pub unsafe fn ctx_create_v3(
    real: &Real,
    pctx: *mut CUcontext,
    params: *mut c_void,
    n: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let f = real_fn!(real, pfn::CtxCreateV3);
    // SAFETY: caller contract.
    created(dev, pctx, &CTX_DESTROY, || unsafe {
        f(pctx, params, n, flags, dev)
    })
}

/// # Safety
/// C contract of `cuCtxCreate_v4`.
pub unsafe fn ctx_create_v4(
    real: &Real,
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let f = real_fn!(real, pfn::CtxCreateV4);
    // SAFETY: caller contract.
    created(dev, pctx, &CTX_DESTROY, || unsafe {
        f(pctx, params, flags, dev)
    })
}

/// # Safety
/// C contract of `cuGreenCtxCreate`.
pub unsafe fn green_ctx_create(
    real: &Real,
    pctx: *mut CUcontext,
    desc: *mut c_void,
    dev: CUdevice,
    flags: c_uint,
) -> CUresult {
    let f = real_fn!(real, pfn::GreenCtxCreate);
    // SAFETY: caller contract.
    created(dev, pctx, &GREEN_DESTROY, || unsafe {
        f(pctx, desc, dev, flags)
    })
}

/// # Safety
/// C contract of `cuCtxDestroy_v2` and `cuGreenCtxDestroy`.
pub unsafe fn ctx_destroy(real: &Real, ctx: CUcontext) -> CUresult {
    let f = real_fn!(real, pfn::CtxDestroy);
    let Some(v) = OBJECTS.remove(ctx as u64) else {
        // SAFETY: caller contract.
        return unsafe { f(ctx) };
    };
    // SAFETY: caller contract.
    let rc = unsafe { f(ctx) };
    if rc != CUDA_SUCCESS {
        OBJECTS.insert(ctx as u64, v);
        return rc;
    }
    let (dev, bytes) = unpack(v);
    let left = CREATED[dev].fetch_sub(1, Ordering::AcqRel) - 1;
    if left == 0 && PRIMARY_REFS[dev].load(Ordering::Acquire) == 0 {
        context_gone(dev);
    } else {
        release_overhead(dev, bytes);
    }
    rc
}

// ------------------------------------------------------------ modules, limits

/// Free memory of the current device now (the real driver's figure).
fn device_free() -> Option<u64> {
    // SAFETY: cuMemGetInfo_v2(size_t*, size_t*).
    let f = unsafe { MEM_GET_INFO.func::<pfn::MemGetInfo>() }?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    (unsafe { f(&mut free, &mut total) } == CUDA_SUCCESS).then_some(free as u64)
}

/// Runs a call that makes the driver hold memory, measured by the drop in
/// free memory across it. Returns the call's code and the bytes charged
/// (0 with no capped current device, or when free memory did not drop),
/// or None when the growth did not fit: the charge was not made and the
/// caller undoes the call.
fn measured(call: impl FnOnce() -> CUresult) -> (CUresult, Option<(Target, u64)>, bool) {
    let Some(t) = target_current() else {
        return (call(), None, true);
    };
    let before = device_free();
    let rc = call();
    if rc != CUDA_SUCCESS {
        return (rc, None, true);
    }
    let grew = match (before, device_free()) {
        (Some(b), Some(a)) => b.saturating_sub(a),
        _ => 0,
    };
    if grew == 0 {
        return (rc, Some((t, 0)), true);
    }
    if !t.reserve(grew) {
        return (rc, None, false);
    }
    add_overhead(t, grew);
    (rc, Some((t, grew)), true)
}

#[derive(Clone, Copy)]
enum Loaded {
    Module,
    Library,
}

fn unload(kind: Loaded, h: CUhandle) {
    let real = match kind {
        Loaded::Module => &MODULE_UNLOAD,
        Loaded::Library => &LIBRARY_UNLOAD,
    };
    // SAFETY: cuModuleUnload / cuLibraryUnload(handle), on what the driver
    // just loaded.
    unsafe { real.undo(h) };
}

/// Loads a module or library, charging what it made the driver hold.
fn load(kind: Loaded, out: *mut CUhandle, call: impl FnOnce() -> CUresult) -> CUresult {
    if out.is_null() {
        return call();
    }
    let (rc, charged, fits) = measured(call);
    if !fits {
        // SAFETY: written by the driver on success.
        unload(kind, unsafe { *out });
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if let Some((t, bytes)) = charged.filter(|c| c.1 > 0) {
        // SAFETY: as above.
        OBJECTS.insert(unsafe { *out } as u64, pack(t.dev, bytes));
    }
    rc
}

/// # Safety
/// C contract of `cuModuleLoad`.
pub unsafe fn module_load(real: &Real, m: *mut CUhandle, fname: *const c_char) -> CUresult {
    let f = real_fn!(real, pfn::ModuleLoad);
    // SAFETY: caller contract.
    load(Loaded::Module, m, || unsafe { f(m, fname) })
}

/// # Safety
/// C contract of `cuModuleLoadData` and `cuModuleLoadFatBinary`.
pub unsafe fn module_load_data(real: &Real, m: *mut CUhandle, image: *const c_void) -> CUresult {
    let f = real_fn!(real, pfn::ModuleLoadData);
    // SAFETY: caller contract.
    load(Loaded::Module, m, || unsafe { f(m, image) })
}

/// # Safety
/// C contract of `cuModuleLoadDataEx`.
pub unsafe fn module_load_data_ex(
    real: &Real,
    m: *mut CUhandle,
    image: *const c_void,
    n: c_uint,
    opts: *mut c_int,
    vals: *mut *mut c_void,
) -> CUresult {
    let f = real_fn!(real, pfn::ModuleLoadDataEx);
    // SAFETY: caller contract.
    load(Loaded::Module, m, || unsafe { f(m, image, n, opts, vals) })
}

/// # Safety
/// C contract of `cuLibraryLoadData` and `cuLibraryLoadFromFile` (the
/// code argument is a pointer either way).
#[allow(clippy::too_many_arguments)]
pub unsafe fn library_load(
    real: &Real,
    lib: *mut CUhandle,
    code: *const c_void,
    jit_opts: *mut c_int,
    jit_vals: *mut *mut c_void,
    n_jit: c_uint,
    lib_opts: *mut c_int,
    lib_vals: *mut *mut c_void,
    n_lib: c_uint,
) -> CUresult {
    let f = real_fn!(real, pfn::LibraryLoadData);
    // SAFETY: caller contract.
    load(Loaded::Library, lib, || unsafe {
        f(
            lib, code, jit_opts, jit_vals, n_jit, lib_opts, lib_vals, n_lib,
        )
    })
}

/// # Safety
/// C contract of `cuModuleUnload` and `cuLibraryUnload`.
pub unsafe fn unload_hook(real: &Real, h: CUhandle) -> CUresult {
    let f = real_fn!(real, pfn::ModuleUnload);
    let Some(v) = OBJECTS.remove(h as u64) else {
        // SAFETY: caller contract.
        return unsafe { f(h) };
    };
    // SAFETY: caller contract.
    let rc = unsafe { f(h) };
    if rc == CUDA_SUCCESS {
        let (dev, bytes) = unpack(v);
        release_overhead(dev, bytes);
    } else {
        OBJECTS.insert(h as u64, v);
    }
    rc
}

/// Bytes charged per device for each memory-holding limit (stack, printf
/// FIFO, malloc heap).
static LIMITS: [[AtomicU64; 3]; MAX_DEVICES] =
    [const { [const { AtomicU64::new(0) }; 3] }; MAX_DEVICES];

/// # Safety
/// C contract of `cuCtxSetLimit`.
pub unsafe fn ctx_set_limit(real: &Real, limit: c_int, value: usize) -> CUresult {
    let f = real_fn!(real, pfn::CtxSetLimit);
    let slot = usize::try_from(limit).ok().filter(|&l| l < 3);
    let Some((slot, t)) = slot.zip(target_current()) else {
        // SAFETY: caller contract.
        return unsafe { f(limit, value) };
    };
    let mut old = 0usize;
    // SAFETY: cuCtxGetLimit(size_t*, CUlimit).
    let had_old = unsafe { CTX_GET_LIMIT.func::<pfn::CtxGetLimit>() }
        // SAFETY: valid out-pointer.
        .is_some_and(|g| unsafe { g(&mut old, limit) } == CUDA_SUCCESS);
    let before = device_free();
    // SAFETY: caller contract.
    let rc = unsafe { f(limit, value) };
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let after = device_free();
    let (Some(b), Some(a)) = (before, after) else {
        return rc;
    };
    let cell = &LIMITS[t.dev][slot];
    if a > b {
        // Shrunk: give back what it freed, up to what it was charged.
        let back = cell.load(Ordering::Acquire).min(a - b);
        cell.fetch_sub(back, Ordering::AcqRel);
        release_overhead(t.dev, back);
    } else if b > a {
        let grew = b - a;
        if !t.reserve(grew) {
            if had_old {
                // SAFETY: restores the caller's previous value.
                unsafe { f(limit, old) };
            }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        cell.fetch_add(grew, Ordering::AcqRel);
        add_overhead(t, grew);
    }
    rc
}

// ------------------------------------------------------------ measurement

/// Measures the new context off the caller's path: `nvmlInit` costs ~10 ms
/// on a real GPU, more than a first CUDA call may pay, and until then the
/// estimate (usually above the real figure) holds its place.
fn settle_soon(t: Target) {
    if shim().context_bytes.is_some() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("gpuslice-measure".into())
        .spawn(move || {
            crate::real::guard((), || {
                let _ = settle(t, Why::Context);
            })
        });
    if spawned.is_err() {
        // No thread: the next memory query or refusal measures instead.
        LAST_SETTLE[t.dev].store(0, Ordering::Release);
    }
}

/// A memory query's measurement, made off the caller's thread: NVML's
/// per-process query is a driver round trip of a millisecond or more, and
/// a reading with an allocation in flight is retried every 2 ms, which a
/// program that asks for free memory inside its loop (allocators sizing
/// themselves, cuBLAS/cuDNN heuristics) would pay every
/// [`SETTLE_EVERY_NS`]. The query answers with the charge as it stands; the
/// measurement raises it at most a few ms later (a refusal measures
/// inline). One measurement per device is in flight at a time.
pub fn settle_later(t: Target) {
    if shim().context_bytes.is_some() {
        return;
    }
    let last = LAST_SETTLE[t.dev].load(Ordering::Acquire);
    if last != 0 && coarse_now_ns().saturating_sub(last) < SETTLE_EVERY_NS {
        return;
    }
    let queued = &QUEUED[t.dev];
    if queued
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("gpuslice-measure".into())
        .spawn(move || {
            crate::real::guard((), || {
                let _ = settle(t, Why::Query);
            });
            QUEUED[t.dev].store(false, Ordering::Release);
        });
    if spawned.is_err() {
        queued.store(false, Ordering::Release);
    }
}

/// Whether a memory query's measurement is in flight, per device.
static QUEUED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];

/// One reading of what the driver holds beyond this process's allocations:
/// NVML's figure minus the allocations' charges, taken with the slot
/// unchanged across the NVML query. A reading where NVML shows less than
/// the allocations are charged has an allocation in flight (reserved, not
/// yet made by the driver): it is taken again, 2 ms later, up to 25 times;
/// failing that, None (nothing is lowered on a doubt).
fn reading(t: Target) -> Option<u64> {
    let s = shim();
    for _ in 0..25 {
        let before = t.ledger.slot_bytes(t.slot, t.dev);
        let overhead = OVERHEAD[t.dev].load(Ordering::Acquire);
        let used = crate::measure::process_used(&s.nvml, t.dev)?;
        let allocations = before.saturating_sub(overhead);
        let stable = t.ledger.slot_bytes(t.slot, t.dev) == before
            && OVERHEAD[t.dev].load(Ordering::Acquire) == overhead;
        if stable && used >= allocations {
            return Some(used - allocations);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    None
}

/// The driver-held bytes: the larger of two readings 2 ms apart (an
/// allocation made by the driver between them shows in the second).
fn driver_held(t: Target) -> Option<u64> {
    let first = reading(t)?;
    std::thread::sleep(std::time::Duration::from_millis(2));
    Some(first.max(reading(t)?))
}

/// Why a measurement is asked for, which says how often it may run and
/// whether it may lower the charge.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A context was just created: always measured, may lower.
    Context,
    /// Before a refusal: may lower; waits for a measurement in flight, and
    /// is skipped when one that may lower finished less than
    /// [`REFUSAL_SETTLE_EVERY_NS`] ago (a caller retrying in a loop does
    /// not pay it each time).
    Refusal,
    /// After a memory query, in the background ([`settle_later`]): at most
    /// every [`SETTLE_EVERY_NS`], one reading, only raises.
    Query,
}

/// Least time between two measurements made before refusals.
pub const REFUSAL_SETTLE_EVERY_NS: u64 = 10_000_000;

/// Brings this process's driver-held charge on `t`'s device to what NVML
/// measures (its usage minus its allocations' charges). Returns whether a
/// measurement was made.
pub fn settle(t: Target, why: Why) -> bool {
    let s = shim();
    if s.context_bytes.is_some() {
        return false; // the operator's figure overrides the measurement
    }
    let recent = |last: &AtomicU64, every: u64| {
        let last = last.load(Ordering::Acquire);
        last != 0 && coarse_now_ns().saturating_sub(last) < every
    };
    if why == Why::Query && recent(&LAST_SETTLE[t.dev], SETTLE_EVERY_NS) {
        return false;
    }
    let force = why != Why::Query;
    // One measurement at a time per device (two applying the same reading
    // would lower the charge twice); a memory query does not wait.
    let busy = &SETTLING[t.dev];
    while busy
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        if !force {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // A refusal right after a measurement that may lower (a context's, or
    // another refusal's) finished uses its result; one in flight was
    // waited for above. A memory query's reading only raises: it does not
    // count.
    if why == Why::Refusal && recent(&LAST_LOWERED[t.dev], REFUSAL_SETTLE_EVERY_NS) {
        busy.store(false, Ordering::Release);
        return false;
    }
    let done = measure_and_apply(t, force);
    if force {
        LAST_LOWERED[t.dev].store(coarse_now_ns().max(1), Ordering::Release);
    }
    busy.store(false, Ordering::Release);
    done
}

/// When a measurement that may lower the charge last finished, per device.
static LAST_LOWERED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

static SETTLING: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];

fn measure_and_apply(t: Target, force: bool) -> bool {
    let s = shim();
    LAST_SETTLE[t.dev].store(coarse_now_ns().max(1), Ordering::Release);
    // A memory query takes one reading and only raises the charge; the
    // careful pair (2 ms) is for the background and refusal paths.
    let measured = if force { driver_held(t) } else { reading(t) };
    let Some(want) = measured else {
        if s.log {
            crate::sys::log_line(&format!(
                "device {}: NVML cannot measure this process",
                t.dev
            ));
        }
        return false;
    };
    let overhead = OVERHEAD[t.dev].load(Ordering::Acquire);
    if s.log {
        crate::sys::log_line(&format!(
            "device {}: the driver holds {} MiB for this process beyond its allocations (charged {} MiB)",
            t.dev,
            want >> 20,
            overhead >> 20
        ));
    }
    if want > overhead {
        add_overhead(t, want - overhead);
        t.adjust((want - overhead) as i128);
    } else if want < overhead && force {
        release_overhead(t.dev, overhead - want);
    }
    true
}

// ------------------------------------------------------------- charging

// The charging entry points that may settle: a target charges a context no
// hook saw being created, and a refused reservation settles stale charges
// (pools, graph pool, driver-held memory) and tries again. They live here,
// above the pools and the measurement they call; [`Target`] itself and
// its plain ledger operations are in [`crate::state`].

/// The target for device ordinal `dev`, or None to pass through. A
/// context no hook saw being created is charged here, at first use.
#[inline]
pub fn target(dev: i32) -> Option<Target> {
    let t = target_no_context(dev)?;
    if !CONTEXT_CHARGED[t.dev].load(Ordering::Relaxed) {
        charge_existing_context(t);
    }
    Some(t)
}

/// The target for the current context's device.
#[inline]
pub fn target_current() -> Option<Target> {
    if !shim().active() {
        return None;
    }
    target(crate::driver::current_device()?)
}

impl Target {
    /// Reserves `bytes` before the driver call. On refusal, first reclaims
    /// dead processes' bytes, settles stale pool/graph charges (they may
    /// have shrunk) and this process's driver-held memory to what NVML
    /// measures, and tries again.
    #[inline]
    pub fn reserve(self, bytes: u64) -> bool {
        if self.ledger.reserve(self.slot, self.dev, bytes).is_ok() {
            return true;
        }
        self.reserve_slow(bytes)
    }

    #[cold]
    fn reserve_slow(self, bytes: u64) -> bool {
        let _ = self.ledger.reap();
        crate::pools::settle_device(self);
        let _ = settle(self, Why::Refusal);
        match self.ledger.reserve(self.slot, self.dev, bytes) {
            Ok(()) => true,
            Err(over) => {
                state::refused(self.dev, bytes, over.used, over.cap);
                false
            }
        }
    }
}
