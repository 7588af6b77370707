//! The CUDA driver API half (`libcuda.so.1`).
//!
//! Signatures follow `cuda.h` (CUDA 13): `CUdevice` is `int`, `CUcontext`
//! an opaque pointer, `CUdeviceptr` an `unsigned long long`.

// A stream function's two exports: `$legacy` on the legacy default stream
// and `$ptsz` on the per-thread default stream, both calling `$f` with
// their arguments and whether the default stream is the per-thread one.
// The `unsafe` form, for functions that write through pointers, carries
// their `# Safety` doc.
macro_rules! legacy_and_ptsz {
    ($legacy:ident, $ptsz:ident, $f:path, ($($a:ident: $t:ty),*)) => {
        #[no_mangle]
        pub extern "C" fn $legacy($($a: $t),*) -> CUresult {
            $f($($a,)* false)
        }

        #[no_mangle]
        pub extern "C" fn $ptsz($($a: $t),*) -> CUresult {
            $f($($a,)* true)
        }
    };
    ($(#[$doc:meta])* unsafe $legacy:ident, $ptsz:ident, $f:path, ($($a:ident: $t:ty),*)) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $legacy($($a: $t),*) -> CUresult {
            $f($($a,)* false)
        }

        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $ptsz($($a: $t),*) -> CUresult {
            $f($($a,)* true)
        }
    };
}

mod capture;
mod init;
mod launch;
mod memory_ext;
mod proc_address;
mod prototypes;
mod resident;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::{Mutex, Once, OnceLock};
use std::time::Duration;

use crate::ffi::{self, guard, write_out};
use crate::host::Host;
use crate::memory;

pub use init::PciAddress;
use init::{Device, InitOutcome};
pub(crate) use launch::engine_busy;

pub use gpuslice_cuda_abi::cuda::*;

/// What the first `cuInit` decided; later calls return the same.
struct State {
    rc: CUresult,
    devices: Vec<Device>,
    driver_version: c_int,
    ctx_ms: u64,
    /// Device memory a context holds (see [`resident`]).
    ctx_bytes: u64,
    /// Device memory a loaded module or library holds.
    module_bytes: u64,
    /// The step a stream-ordered pool's reserve grows by
    /// (`FAKEGPU_POOL_STEP`, for a driver other than the H200's 32 MiB).
    pool_step: u64,
}

static STATE: OnceLock<State> = OnceLock::new();

/// The initialised state, or the error every call returns before (or after
/// a failed) `cuInit`.
fn state() -> Result<&'static State, CUresult> {
    match STATE.get() {
        None => Err(CUDA_ERROR_NOT_INITIALIZED),
        Some(s) if s.rc != CUDA_SUCCESS => Err(s.rc),
        Some(s) => Ok(s),
    }
}

fn device(dev: CUdevice) -> Result<&'static Device, CUresult> {
    let s = state()?;
    usize::try_from(dev)
        .ok()
        .and_then(|i| s.devices.get(i))
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

fn env_bytes(name: &str) -> Option<u64> {
    env_ms(name)
}

fn env_ms(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

fn initialize() -> State {
    let host = Host::from_env();
    let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let InitOutcome { rc, devices, trace } =
        init::discover(&host, cvd.as_deref(), env_ms("FAKEGPU_INIT_MS_PER_GPU"));
    init::write_trace(&trace);
    let kernel = host.kernel();
    State {
        rc,
        devices,
        driver_version: kernel.as_ref().map_or(13000, |k| k.cuda_version),
        ctx_ms: env_ms("FAKEGPU_CTX_MS")
            .or(kernel.as_ref().map(|k| k.ctx_ms))
            .unwrap_or(0),
        ctx_bytes: env_bytes("FAKEGPU_CTX_BYTES")
            .or(kernel.as_ref().map(|k| k.ctx_bytes))
            .unwrap_or(0),
        module_bytes: env_bytes("FAKEGPU_MODULE_BYTES")
            .or(kernel.as_ref().map(|k| k.module_bytes))
            .unwrap_or(0),
        pool_step: env_bytes("FAKEGPU_POOL_STEP")
            .filter(|&b| b > 0)
            .unwrap_or(memory_ext::POOL_STEP),
    }
}

/// The body of an entry point that is not allowed during a stream capture
/// (it invalidates the capture, as the real driver's do) and works on the
/// current context's device: `f` with that device, its error as the C
/// return code.
fn outside_capture_on_current(f: impl FnOnce(usize) -> Result<(), CUresult>) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(capture::unsafe_call()
            .and_then(|_| current_device())
            .and_then(f))
    })
}

/// Collapses `Result<(), CUresult>` into the C return code.
fn rc(result: Result<(), CUresult>) -> CUresult {
    ffi::code(result, CUDA_SUCCESS)
}

/// Writes an out-parameter, mapping a null pointer to INVALID_VALUE.
///
/// # Safety
/// As [`write_out`].
unsafe fn out<T>(ptr: *mut T, value: T) -> Result<(), CUresult> {
    // SAFETY: forwarded contract.
    unsafe { ffi::write_out_or(ptr, value, CUDA_ERROR_INVALID_VALUE) }
}

// ---------------------------------------------------------------- init

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        if flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        STATE.get_or_init(initialize).rc
    })
}

/// # Safety
/// `version` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        // Works before cuInit, as in the real driver.
        let v = STATE.get().map_or_else(
            || Host::from_env().kernel().map_or(13000, |k| k.cuda_version),
            |s| s.driver_version,
        );
        // SAFETY: caller contract.
        rc(unsafe { out(version, v) })
    })
}

// ---------------------------------------------------------------- devices

/// # Safety
/// `count` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let n = state().map(|s| s.devices.len() as c_int);
        // SAFETY: caller contract.
        rc(n.and_then(|n| unsafe { out(count, n) }))
    })
}

/// # Safety
/// `device` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device_out: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        // SAFETY: caller contract.
        rc(device(ordinal).and_then(|_| unsafe { out(device_out, ordinal) }))
    })
}

/// # Safety
/// `name` must be null or valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(device(dev).and_then(|d| {
            let len = usize::try_from(len).unwrap_or(0);
            // SAFETY: caller contract.
            match unsafe { ffi::copy_str_truncate(name, len, &d.name) } {
                true => Ok(()),
                false => Err(CUDA_ERROR_INVALID_VALUE),
            }
        }))
    })
}

/// # Safety
/// `uuid` must be null or valid for a write of 16 bytes (`CUuuid`).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        // SAFETY: caller contract.
        rc(device(dev).and_then(|d| unsafe { out(uuid, d.uuid_bytes) }))
    })
}

/// Same as `cuDeviceGetUuid`; v2 differs only for MIG on old drivers.
///
/// # Safety
/// As `cuDeviceGetUuid`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

/// The pre-3.2 ABI (32-bit size; saturates, as the real one reports at
/// most 4 GiB − 1 there).
///
/// # Safety
/// `bytes` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let v = |d: &Device| d.memory_bytes.min(u64::from(c_uint::MAX)) as c_uint;
        // SAFETY: caller contract.
        rc(device(dev).and_then(|d| unsafe { out(bytes, v(d)) }))
    })
}

/// # Safety
/// `bytes` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        // SAFETY: caller contract.
        rc(device(dev).and_then(|d| unsafe { out(bytes, d.memory_bytes as usize) }))
    })
}

/// One past the last attribute CUDA 13 defines (roughly); beyond is invalid.
const ATTR_MAX: c_int = 160;

fn attribute(d: &Device, attrib: c_int) -> Option<c_int> {
    let v = match attrib {
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => d.multiprocessors,
        CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => d.pci.bus as c_int,
        CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID => d.pci.device as c_int,
        CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => d.pci.domain as c_int,
        CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING | CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY => 1,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => 9,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => 0,
        _ if (1..ATTR_MAX).contains(&attrib) => 0,
        _ => return None,
    };
    Some(v)
}

/// # Safety
/// `pi` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(device(dev).and_then(|d| {
            let v = attribute(d, attrib).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            // SAFETY: caller contract.
            unsafe { out(pi, v) }
        }))
    })
}

/// # Safety
/// `bus_id` must be null or valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(device(dev).and_then(|d| {
            let len = usize::try_from(len).unwrap_or(0);
            // SAFETY: caller contract.
            match unsafe { ffi::copy_str_truncate(bus_id, len, &d.pci.cuda_string()) } {
                true => Ok(()),
                false => Err(CUDA_ERROR_INVALID_VALUE),
            }
        }))
    })
}

// ---------------------------------------------------------------- contexts
//
// Each device has one primary context; its handle encodes the device index
// (created contexts are handles inside the device's stride, see
// [`resident`]). The current context is per thread, as in CUDA.

const CTX_BASE: usize = 0xC0_4E00_0000;
const CTX_STRIDE: usize = 0x100;

fn ctx_handle(dev: usize) -> CUcontext {
    // Opaque token, never dereferenced.
    (CTX_BASE + dev * CTX_STRIDE) as CUcontext
}

fn ctx_device(ctx: CUcontext) -> Result<usize, CUresult> {
    let s = state()?;
    let offset = (ctx as usize)
        .checked_sub(CTX_BASE)
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    let dev = offset / CTX_STRIDE;
    if dev < s.devices.len() {
        Ok(dev)
    } else {
        Err(CUDA_ERROR_INVALID_CONTEXT)
    }
}

thread_local! {
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

fn set_current(dev: Option<usize>) {
    CURRENT.with(|c| c.set(dev));
}

fn current_device() -> Result<usize, CUresult> {
    state()?;
    CURRENT.with(Cell::get).ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

static PRIMARY_REFS: Mutex<BTreeMap<usize, u32>> = Mutex::new(BTreeMap::new());
static CTX_COST: Once = Once::new();

/// # Safety
/// `pctx` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(device(dev).and_then(|_| {
            let s = state()?;
            // The first context in a process pays the creation cost.
            CTX_COST.call_once(|| std::thread::sleep(Duration::from_millis(s.ctx_ms)));
            let index = dev as usize;
            let mut refs = PRIMARY_REFS.lock().unwrap_or_else(|e| e.into_inner());
            let n = refs.entry(index).or_insert(0);
            if *n == 0 {
                resident::primary_created(index)?;
            }
            *n += 1;
            // SAFETY: caller contract.
            unsafe { out(pctx, ctx_handle(index)) }
        }))
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(device(dev).and_then(|_| {
            let mut refs = PRIMARY_REFS.lock().unwrap_or_else(|e| e.into_inner());
            match refs.get_mut(&(dev as usize)) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    if *n == 0 {
                        resident::primary_destroyed(dev as usize);
                    }
                    Ok(())
                }
                _ => Err(CUDA_ERROR_INVALID_CONTEXT),
            }
        }))
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxRelease_v2(dev)
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let dev = if ctx.is_null() {
            state().map(|_| None)
        } else {
            ctx_device(ctx).map(Some)
        };
        rc(dev.map(|dev| CURRENT.with(|c| c.set(dev))))
    })
}

/// # Safety
/// `pctx` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(state().and_then(|_| {
            let ctx = CURRENT
                .with(Cell::get)
                .map_or(std::ptr::null_mut(), ctx_handle);
            // SAFETY: caller contract.
            unsafe { out(pctx, ctx) }
        }))
    })
}

/// # Safety
/// `device` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device_out: *mut CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        // SAFETY: caller contract.
        rc(current_device().and_then(|d| unsafe { out(device_out, d as CUdevice) }))
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(current_device().and_then(|dev| {
            capture::unsafe_call()?;
            launch::device_sync(dev);
            Ok(())
        }))
    })
}

// ---------------------------------------------------------------- memory

/// # Safety
/// `dptr` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    outside_capture_on_current(|dev| {
        if bytesize == 0 || dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let d = device(dev as CUdevice)?;
        let ptr = memory::alloc(d.mem_key, d.memory_bytes, bytesize as u64)
            .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        // SAFETY: caller contract.
        unsafe { out(dptr, ptr) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    outside_capture_on_current(
        |_| match memory_ext::free_pooled(dptr) || memory::free(dptr) {
            true => Ok(()),
            false => Err(CUDA_ERROR_INVALID_VALUE),
        },
    )
}

/// # Safety
/// `free` and `total` must be null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(current_device().and_then(|dev| {
            let d = device(dev as CUdevice)?;
            let used = memory::used(d.mem_key);
            // Inside a cgroup with a memory partition (R615+): its limit.
            let (t, f) = memory::limited_info(d.mem_key)
                .map(|(t, f)| (t.min(d.memory_bytes), f))
                .unwrap_or((d.memory_bytes, d.memory_bytes.saturating_sub(used)));
            // SAFETY: caller contract.
            unsafe {
                out(free, f as usize)?;
                out(total, t as usize)
            }
        }))
    })
}

// ---------------------------------------------------------------- errors

/// (code, name, description) of every code this driver returns.
const ERRORS: &[(CUresult, &CStr, &CStr)] = &[
    (CUDA_SUCCESS, c"CUDA_SUCCESS", c"no error"),
    (
        CUDA_ERROR_INVALID_VALUE,
        c"CUDA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (
        CUDA_ERROR_OUT_OF_MEMORY,
        c"CUDA_ERROR_OUT_OF_MEMORY",
        c"out of memory",
    ),
    (
        CUDA_ERROR_NOT_INITIALIZED,
        c"CUDA_ERROR_NOT_INITIALIZED",
        c"initialization error",
    ),
    (
        CUDA_ERROR_NO_DEVICE,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (
        CUDA_ERROR_INVALID_DEVICE,
        c"CUDA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        CUDA_ERROR_INVALID_CONTEXT,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        CUDA_ERROR_NOT_FOUND,
        c"CUDA_ERROR_NOT_FOUND",
        c"named symbol not found",
    ),
    (
        CUDA_ERROR_ILLEGAL_STATE,
        c"CUDA_ERROR_ILLEGAL_STATE",
        c"the operation cannot be performed in the present state",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        c"operation not permitted when stream is capturing",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        c"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        c"operation failed due to a previous error during capture",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
        c"CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
        c"operation would make the legacy stream depend on a capturing blocking stream",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        c"CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        c"attempt to terminate a thread-local capture sequence from another thread",
    ),
    (CUDA_ERROR_UNKNOWN, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

fn error_entry(error: CUresult) -> Option<&'static (CUresult, &'static CStr, &'static CStr)> {
    ERRORS.iter().find(|(code, _, _)| *code == error)
}

/// Stores a static string (NULL for an unknown code, which is
/// INVALID_VALUE, as in CUDA).
///
/// # Safety
/// `pstr` must be null or valid for a write.
unsafe fn out_text(pstr: *mut *const c_char, text: Option<&'static CStr>) -> CUresult {
    let ptr = text.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: forwarded contract.
    match (unsafe { out(pstr, ptr) }, text) {
        (Ok(()), Some(_)) => CUDA_SUCCESS,
        _ => CUDA_ERROR_INVALID_VALUE,
    }
}

/// # Safety
/// `pstr` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        // SAFETY: caller contract.
        unsafe { out_text(pstr, error_entry(error).map(|e| e.2)) }
    })
}

/// # Safety
/// `pstr` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        // SAFETY: caller contract.
        unsafe { out_text(pstr, error_entry(error).map(|e| e.1)) }
    })
}

// ---------------------------------------------------------------- entry points

/// `CUdriverProcAddressQueryResult`.
const PROC_SUCCESS: c_int = 0;
const PROC_SYMBOL_NOT_FOUND: c_int = 1;

/// The pre-12.0 ABI (`cuGetProcAddress` without the status out-parameter).
///
/// # Safety
/// `symbol` must be null or NUL-terminated; `pfn` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: forwarded contract; a null status is allowed.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}

/// Looks a driver entry point up by its base name (`cuMemAlloc` gives
/// `cuMemAlloc_v2` for a caller built against a recent enough CUDA).
///
/// # Safety
/// `symbol` must be null or NUL-terminated; `pfn` null or valid for a
/// write; `status` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        // SAFETY: caller contract.
        let Some(name) = (unsafe { ffi::read_str(symbol) }) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        if pfn.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let found = proc_address::lookup_with_flags(name, cuda_version, flags);
        let (ptr, query, code) = match found {
            Some(p) => (p, PROC_SUCCESS, CUDA_SUCCESS),
            None => (
                std::ptr::null_mut(),
                PROC_SYMBOL_NOT_FOUND,
                CUDA_ERROR_NOT_FOUND,
            ),
        };
        // SAFETY: pfn checked non-null above; status may be null (handled).
        unsafe {
            pfn.write(ptr);
            write_out(status, query);
        }
        code
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // No test here calls cuInit: its outcome is per process.

    #[test]
    fn calls_before_init_are_not_initialized() {
        let mut n = -1;
        // SAFETY: n is a live local.
        let rc = unsafe { cuDeviceGetCount(&mut n) };
        assert_eq!(rc, CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    }

    #[test]
    fn error_names_and_strings() {
        let mut p = std::ptr::null();
        // SAFETY: p is a live local; the result is a static C string.
        unsafe {
            assert_eq!(cuGetErrorName(CUDA_ERROR_NO_DEVICE, &mut p), CUDA_SUCCESS);
            assert_eq!(CStr::from_ptr(p), c"CUDA_ERROR_NO_DEVICE");
            assert_eq!(
                cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &mut p),
                CUDA_SUCCESS
            );
            assert_eq!(CStr::from_ptr(p), c"out of memory");
            assert_eq!(cuGetErrorName(12345, &mut p), CUDA_ERROR_INVALID_VALUE);
            assert!(p.is_null());
        }
    }
}
