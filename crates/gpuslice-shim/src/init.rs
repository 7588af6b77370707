//! `cuInit`: where a slice with root's limits fails closed. A process that
//! cannot be held to its slice's limits (records unusable, usage ledger
//! read-only, corrupt, of another version, or full) gets an error from
//! `cuInit`, so no CUDA call of it reaches the driver, and a line on its
//! stderr saying why. Everywhere else `cuInit` is the driver's.

use std::ffi::c_uint;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::cuda::*;
use crate::real::Real;
use crate::state::refuse_init;
use crate::sys::log_line;

static TOLD: AtomicBool = AtomicBool::new(false);

/// # Safety
/// The C contract of `cuInit`.
pub unsafe fn cu_init(real: &Real, flags: c_uint) -> CUresult {
    if let Some(why) = refuse_init() {
        if !TOLD.swap(true, Ordering::Relaxed) {
            log_line(&format!("cuInit: {why}"));
        }
        // The error CUDA uses for an operation the environment does not
        // permit.
        return CUDA_ERROR_NOT_PERMITTED;
    }
    // SAFETY: the family's signature is cuInit's.
    match unsafe { real.func::<pfn::Init>() } {
        // SAFETY: caller contract.
        Some(f) => unsafe { f(flags) },
        None => CUDA_ERROR_NOT_INITIALIZED,
    }
}
