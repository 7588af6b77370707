//! Where the real functions are kept, and the wrapper families.
//!
//! Every interposed entry point belongs to a *family* (one ABI: same
//! signature, same hook). A family has:
//! - its exported symbols (`cuMemAllocAsync`, `cuMemAllocAsync_ptsz`), for
//!   programs whose symbol lookups bind to us (linked against libcuda, or
//!   `dlsym(RTLD_DEFAULT)`), each resolving its own real function lazily by
//!   name;
//! - [`N_INST`] anonymous instances, handed out by our `dlsym` and
//!   `cuGetProcAddress`: instance *i* calls the real pointer recorded in its
//!   slot *i*. The real pointer itself tells variants apart (the legacy and
//!   per-thread-stream versions, or whatever the driver returned for the
//!   caller's CUDA version and flags), so no variant table can go stale.

use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, Ordering};

/// Instances per family.
pub const N_INST: usize = 4;

/// A real function pointer, resolved lazily by name (exports) or recorded
/// when we hand out an instance.
pub struct Real {
    ptr: AtomicPtr<c_void>,
    name: &'static CStr,
}

impl Real {
    pub const fn named(name: &'static CStr) -> Real {
        Real {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            name,
        }
    }

    pub const fn empty() -> Real {
        Self::named(c"")
    }

    /// The real function, resolving it on first use. Null if none exists.
    #[inline]
    pub fn get(&self) -> *mut c_void {
        let p = self.ptr.load(Ordering::Acquire);
        if p.is_null() {
            self.resolve()
        } else {
            p
        }
    }

    #[cold]
    fn resolve(&self) -> *mut c_void {
        if self.name.is_empty() {
            return std::ptr::null_mut();
        }
        let nvml = self.name.to_bytes().starts_with(b"nvml");
        let mut p = crate::sys::lookup_real(self.name);
        if p.is_null() {
            // Not in the global scope nor under its usual soname: look in
            // the object a real function we already hold came from.
            let hint = if nvml { &HINT_NVML } else { &HINT_CUDA }.load(Ordering::Acquire);
            if !hint.is_null() {
                p = crate::sys::lookup_beside(hint, self.name);
                if crate::sys::is_ours(p) {
                    p = std::ptr::null_mut();
                }
            }
        }
        if !p.is_null() {
            set_hint(nvml, p);
            self.ptr.store(p, Ordering::Release);
        }
        p
    }

    /// Whether this is the per-thread-default-stream flavour of its
    /// function (its NULL stream is the caller's per-thread stream): by
    /// the exported name, or as recorded by [`mark_ptsz`].
    pub fn ptsz(&self) -> bool {
        self.name.to_bytes().ends_with(b"_ptsz") || is_ptsz(self.peek())
    }

    /// The recorded pointer, without resolving.
    pub fn peek(&self) -> *mut c_void {
        self.ptr.load(Ordering::Acquire)
    }

    /// Records `p` in an empty slot; true when the slot now holds `p`.
    pub fn claim(&self, p: *mut c_void) -> bool {
        match self.ptr.compare_exchange(
            std::ptr::null_mut(),
            p,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(cur) => cur == p,
        }
    }

    /// The real function as type `F` (an `unsafe extern "C" fn`).
    ///
    /// # Safety
    /// `F` must be the C signature of the function this slot holds.
    #[inline]
    pub unsafe fn func<F: Copy>(&self) -> Option<F> {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
        let p = self.get();
        // SAFETY: non-null function pointer of type F by the caller's
        // contract; sizes checked at compile time.
        (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }

    /// Undoes what the driver just made, by calling this function (a
    /// destroy, unload or release of one handle) on it, if the driver has
    /// it. Its result is not looked at: the call that made the handle is
    /// refused anyway.
    ///
    /// # Safety
    /// This slot holds a function of one pointer-sized handle returning a
    /// `CUresult`, and `handle` is one the driver just made.
    pub unsafe fn undo(&self, handle: *mut c_void) {
        type OfHandle = unsafe extern "C" fn(*mut c_void) -> crate::cuda::CUresult;
        // SAFETY: the signature, by the caller's contract.
        if let Some(f) = unsafe { self.func::<OfHandle>() } {
            // SAFETY: a handle the driver just made (caller's contract).
            unsafe { f(handle) };
        }
    }
}

/// A real libcuda / libnvidia-ml function we hold: helpers not found by
/// name are looked up in the same object.
static HINT_CUDA: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static HINT_NVML: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

pub fn set_hint(nvml: bool, p: *mut c_void) {
    let h = if nvml { &HINT_NVML } else { &HINT_CUDA };
    let _ = h.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire);
}

/// Runs `f`, returning `on_panic` instead of unwinding into C.
#[inline]
pub fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(on_panic)
}

/// Real launch functions known to be `_ptsz` flavours (looked up by that
/// name, or through `cuGetProcAddress` with the per-thread-stream flag).
static PTSZ: [AtomicPtr<c_void>; 16] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 16];

/// Records that the real function `p` is a `_ptsz` flavour.
pub fn mark_ptsz(p: *mut c_void) {
    if p.is_null() || is_ptsz(p) {
        return;
    }
    for s in &PTSZ {
        if s.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
    }
}

fn is_ptsz(p: *mut c_void) -> bool {
    !p.is_null() && PTSZ.iter().any(|s| s.load(Ordering::Acquire) == p)
}

/// The real function of a hook's family as `$ty`, or the hook returns
/// `CUDA_ERROR_NOT_INITIALIZED`.
macro_rules! real_fn {
    ($real:expr, $ty:ty) => {
        // SAFETY: the family's signature is `$ty`.
        match unsafe { $real.func::<$ty>() } {
            Some(f) => f,
            None => return CUDA_ERROR_NOT_INITIALIZED,
        }
    };
}
pub(crate) use real_fn;
