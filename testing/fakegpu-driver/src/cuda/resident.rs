//! Memory the driver itself holds for a process, as the real one does:
//! each context (primary or created) costs `ctx_bytes` on its device while
//! it lives (~520 MiB on an H200), each loaded module or library
//! `module_bytes`, and raising a context limit grows what the context
//! holds (stack: bytes per thread × SMs × 2048 resident threads; printf
//! FIFO and malloc heap: their size) beyond the defaults the context cost
//! already covers. All of it goes through [`memory::alloc`], so NVML's
//! per-process usage and the device totals see it — and the shim must
//! charge it to be a physical cap.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, MutexGuard};

use super::*;

/// `CUlimit` values with memory behind them, and their defaults.
const LIMIT_STACK_SIZE: c_int = 0;
const LIMIT_PRINTF_FIFO_SIZE: c_int = 1;
const LIMIT_MALLOC_HEAP_SIZE: c_int = 2;
const DEFAULT_STACK: u64 = 1024;
const DEFAULT_FIFO: u64 = 1 << 20;
const DEFAULT_HEAP: u64 = 8 << 20;
/// Resident threads per SM on Hopper.
const THREADS_PER_SM: u64 = 2048;

#[derive(Default)]
struct Resident {
    /// Device → allocation backing the primary context (while retained).
    primary: BTreeMap<usize, u64>,
    /// Created context handle → (device, allocation).
    created: BTreeMap<usize, (usize, u64)>,
    /// Module or library token → allocation (0: nothing held).
    modules: BTreeMap<usize, u64>,
    next_token: usize,
    /// (device, limit) → (value, allocation of the part over the default).
    limits: BTreeMap<(usize, c_int), (u64, u64)>,
}

static RESIDENT: Mutex<Option<Resident>> = Mutex::new(None);

fn resident() -> MutexGuard<'static, Option<Resident>> {
    RESIDENT.lock().unwrap_or_else(|e| e.into_inner())
}

fn with<T>(f: impl FnOnce(&mut Resident) -> T) -> T {
    f(resident().get_or_insert_with(Resident::default))
}

/// Allocates `bytes` on device `dev` (0 bytes: nothing, token 0).
fn hold(dev: usize, bytes: u64) -> Result<u64, CUresult> {
    if bytes == 0 {
        return Ok(0);
    }
    let d = device(dev as CUdevice)?;
    memory::alloc(d.mem_key, d.memory_bytes, bytes).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)
}

fn drop_hold(ptr: u64) {
    if ptr != 0 {
        memory::free(ptr);
    }
}

/// The primary context of `dev` went from no reference to one: its memory
/// is allocated (the real driver fails the retain with OUT_OF_MEMORY when
/// it does not fit).
pub fn primary_created(dev: usize) -> Result<(), CUresult> {
    let bytes = state()?.ctx_bytes;
    let ptr = hold(dev, bytes)?;
    with(|r| r.primary.insert(dev, ptr));
    Ok(())
}

/// The last reference to `dev`'s primary context went: its memory, and
/// what its limits held, is freed.
pub fn primary_destroyed(dev: usize) {
    let (ptr, limits) = with(|r| {
        let ptr = r.primary.remove(&dev);
        let keys: Vec<_> = r.limits.keys().filter(|k| k.0 == dev).copied().collect();
        let limits: Vec<u64> = keys
            .iter()
            .filter_map(|k| r.limits.remove(k))
            .map(|v| v.1)
            .collect();
        (ptr, limits)
    });
    ptr.into_iter().chain(limits).for_each(drop_hold);
}

/// # Safety
/// `pctx` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(device(dev).and_then(|_| {
            if pctx.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let index = dev as usize;
            let ptr = hold(index, state()?.ctx_bytes)?;
            let handle = with(|r| {
                let k = (1..CTX_STRIDE / 8)
                    .map(|k| ctx_handle(index) as usize + k * 8)
                    .find(|h| !r.created.contains_key(h));
                if let Some(h) = k {
                    r.created.insert(h, (index, ptr));
                }
                k
            });
            let Some(handle) = handle else {
                drop_hold(ptr);
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            };
            set_current(Some(index));
            // SAFETY: checked non-null; caller contract.
            unsafe { out(pctx, handle as CUcontext) }
        }))
    })
}

#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(state().and_then(|_| {
            let (dev, ptr) =
                with(|r| r.created.remove(&(ctx as usize))).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
            drop_hold(ptr);
            if current_device().ok() == Some(dev) {
                set_current(None);
            }
            Ok(())
        }))
    })
}

/// Loads a module or library on the current device (a library loaded with
/// no current context holds nothing until used: not modelled further).
fn load(out_handle: *mut usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(state().and_then(|s| {
            if out_handle.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let ptr = match current_device() {
                Ok(dev) => hold(dev, s.module_bytes)?,
                Err(_) => 0,
            };
            let token = with(|r| {
                r.next_token += 1;
                let t = 0x3D_0000_0000 + r.next_token * 16;
                r.modules.insert(t, ptr);
                t
            });
            // SAFETY: checked non-null; caller contract.
            unsafe { out(out_handle, token) }
        }))
    })
}

fn unload(token: usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(state().and_then(|_| {
            let ptr = with(|r| r.modules.remove(&token)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            drop_hold(ptr);
            Ok(())
        }))
    })
}

/// # Safety
/// `module` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(module: *mut CUmodule, _fname: *const c_char) -> CUresult {
    load(module.cast())
}

/// # Safety
/// `module` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(
    module: *mut CUmodule,
    _image: *const c_void,
) -> CUresult {
    load(module.cast())
}

/// # Safety
/// `module` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    _image: *const c_void,
    _n: c_uint,
    _opts: *mut c_int,
    _vals: *mut *mut c_void,
) -> CUresult {
    load(module.cast())
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    unload(module as usize)
}

/// # Safety
/// `library` null or valid for a write.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut CUlibrary,
    _code: *const c_void,
    _jit_opts: *mut c_int,
    _jit_vals: *mut *mut c_void,
    _n_jit: c_uint,
    _lib_opts: *mut c_int,
    _lib_vals: *mut *mut c_void,
    _n_lib: c_uint,
) -> CUresult {
    load(library.cast())
}

#[no_mangle]
pub extern "C" fn cuLibraryUnload(library: CUlibrary) -> CUresult {
    unload(library as usize)
}

/// Bytes a limit value holds on device `d` beyond what the context cost
/// covers (its default).
fn limit_bytes(d: &Device, limit: c_int, value: u64) -> Option<u64> {
    let (bytes, default) = match limit {
        LIMIT_STACK_SIZE => {
            let threads = d.multiprocessors.max(1) as u64 * THREADS_PER_SM;
            (value.saturating_mul(threads), DEFAULT_STACK * threads)
        }
        LIMIT_PRINTF_FIFO_SIZE => (value, DEFAULT_FIFO),
        LIMIT_MALLOC_HEAP_SIZE => (value, DEFAULT_HEAP),
        _ => return None,
    };
    Some(bytes.saturating_sub(default))
}

fn default_limit(limit: c_int) -> u64 {
    match limit {
        LIMIT_STACK_SIZE => DEFAULT_STACK,
        LIMIT_PRINTF_FIFO_SIZE => DEFAULT_FIFO,
        LIMIT_MALLOC_HEAP_SIZE => DEFAULT_HEAP,
        _ => 0,
    }
}

/// Sets a limit of the current context; the memory behind it is
/// reallocated now (OUT_OF_MEMORY when it does not fit, the old value kept).
#[no_mangle]
pub extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(current_device().and_then(|dev| {
            let d = device(dev as CUdevice)?;
            let Some(bytes) = limit_bytes(d, limit, value as u64) else {
                // Other limits hold no memory.
                return if (0..=6).contains(&limit) {
                    Ok(())
                } else {
                    Err(CUDA_ERROR_INVALID_VALUE)
                };
            };
            let ptr = hold(dev, bytes)?;
            let old = with(|r| r.limits.insert((dev, limit), (value as u64, ptr)));
            if let Some((_, old_ptr)) = old {
                drop_hold(old_ptr);
            }
            Ok(())
        }))
    })
}

/// # Safety
/// `value` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: c_int) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(current_device().and_then(|dev| {
            let v = with(|r| r.limits.get(&(dev, limit)).map(|v| v.0))
                .unwrap_or_else(|| default_limit(limit));
            // SAFETY: caller contract.
            unsafe { out(value, v as usize) }
        }))
    })
}
