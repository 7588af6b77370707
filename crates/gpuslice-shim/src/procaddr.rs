//! `cuGetProcAddress(_v2)` and `dlsym`: hand out our wrappers for the
//! functions we interpose, recording the real function the driver / the
//! loader returned for the caller's CUDA version and flags.

use std::ffi::{c_char, c_int, c_void};

use crate::cuda::*;
use crate::families::{export_family, proc_family, Family};
use crate::real::{guard, intercept, mark_ptsz, Real};
use crate::state::{shim, shim_if_ready};
use crate::sys;

/// Replaces `*pfn` with our wrapper when `symbol` is one we interpose and a
/// cap is configured (else the caller keeps the real pointer: no overhead).
///
/// # Safety
/// `symbol` null or NUL-terminated; `pfn` null or valid.
unsafe fn swap_in(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    if pfn.is_null() || !shim().active() {
        return;
    }
    // SAFETY: per the contract.
    let Some(name) = (unsafe { sys::cstr(symbol) }) else {
        return;
    };
    // SAFETY: pfn valid; written by the driver.
    let p = unsafe { *pfn };
    if let Some(fam) = proc_family(name.to_bytes(), version).filter(|f| f.wanted(shim())) {
        if fam.is_launch() || fam == Family::GraphLaunch {
            let ptsz = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0
                || name.to_bytes().ends_with(b"_ptsz");
            if ptsz {
                mark_ptsz(p);
            }
        }
        // SAFETY: pfn valid.
        unsafe { *pfn = intercept(fam, p) };
    }
}

/// # Safety
/// C contract of `cuGetProcAddress` (pre-12.0 ABI).
pub unsafe fn get_proc_address(
    real: &Real,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    type F = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
    // SAFETY: the family's signature.
    let Some(f) = (unsafe { real.func::<F>() }) else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: caller contract.
    let rc = unsafe { f(symbol, pfn, version, flags) };
    if rc == CUDA_SUCCESS {
        // SAFETY: caller contract.
        unsafe { swap_in(symbol, pfn, version, flags) };
    }
    rc
}

/// # Safety
/// C contract of `cuGetProcAddress_v2`.
pub unsafe fn get_proc_address_v2(
    real: &Real,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    type F =
        unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
    // SAFETY: the family's signature.
    let Some(f) = (unsafe { real.func::<F>() }) else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: caller contract.
    let rc = unsafe { f(symbol, pfn, version, flags, status) };
    if rc == CUDA_SUCCESS {
        // SAFETY: caller contract.
        unsafe { swap_in(symbol, pfn, version, flags) };
    }
    rc
}

/// Body of our `dlsym` for every handle but RTLD_NEXT (see [`sys::dlsym`]).
pub extern "C" fn dlsym_impl(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let f = sys::resolve_real_dlsym();
    // SAFETY: glibc's dlsym, called with the caller's arguments.
    let p = unsafe { std::mem::transmute::<*mut c_void, sys::DlsymFn>(f)(handle, symbol) };
    if p.is_null() || symbol.is_null() {
        return p;
    }
    // Never wait for the configuration here: glibc or std may call dlsym
    // while it is being read.
    let s = match shim_if_ready() {
        Some(s) if s.active() => s,
        _ => return p,
    };
    guard(p, || {
        // SAFETY: non-null, NUL-terminated by dlsym's contract.
        let name = unsafe { std::ffi::CStr::from_ptr(symbol) };
        match export_family(name.to_bytes()).filter(|f| f.wanted(s)) {
            Some(fam) => {
                if name.to_bytes().ends_with(b"_ptsz") {
                    mark_ptsz(p);
                }
                intercept(fam, p)
            }
            None => p,
        }
    })
}
