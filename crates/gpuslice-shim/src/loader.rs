//! Our `dlsym`, `dlvsym`, `dlopen` and `dlmopen`: the lookups a program
//! can reach the driver's own functions through.
//!
//! - `dlsym` and `dlvsym`, whatever the handle and version, hand out our
//!   wrapper for a function we interpose (a capped slice), and **our**
//!   `dlsym`, `dlvsym`, `dlopen` and `dlmopen` for those names: glibc's
//!   `dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34")` asks for a versioned
//!   definition, which only the C library has, and its `dlsym` then looks
//!   up the driver's functions in libcuda's own handle unwrapped.
//! - `RTLD_NEXT` depends on the caller (the objects after it), so it is
//!   passed on to glibc with the caller's return address untouched (a tail
//!   jump), except for a name we interpose in a capped slice: then the
//!   driver's own definition comes back wrapped (from a library with
//!   libcuda among its dependencies, the next object after it is libcuda).
//! - `dlmopen` into any namespace but the base one is refused in a capped
//!   slice: the shim is preloaded into the base namespace only, and a
//!   driver library loaded in another (directly, as a dependency, or later
//!   by that namespace's own `dlopen`) would be uncapped. It returns NULL,
//!   `dlerror` says why. `dlopen` is passed on unchanged (tail jump): it
//!   loads into the caller's namespace, which is the base one.
//!
//! Each export is a naked function that keeps the caller's arguments and
//! return address, asks a `pick_*` function (plain Rust, never unwinding)
//! which function serves this call, and tail-jumps to it.

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::families::{export_family, intercept};
use crate::real::{guard, mark_ptsz};
use crate::state::{shim, shim_if_ready};
use crate::sys;

/// The loader functions we hand out for their names.
fn ours(name: &[u8]) -> Option<*mut c_void> {
    Some(match name {
        b"dlsym" => dlsym as *mut c_void,
        b"dlvsym" => dlvsym as *mut c_void,
        b"dlopen" => dlopen as *mut c_void,
        b"dlmopen" => dlmopen as *mut c_void,
        _ => return None,
    })
}

/// Our wrapper for `p`, the real definition of `name`, when `name` is one
/// we interpose and the slice caps it; else `p`. Never waits for the
/// configuration: glibc or std may look symbols up while it is read.
fn wrapped(name: &CStr, p: *mut c_void) -> *mut c_void {
    if p.is_null() {
        return p;
    }
    let s = match shim_if_ready() {
        Some(s) if s.active() => s,
        _ => return p,
    };
    match export_family(name.to_bytes()).filter(|f| f.wanted(s)) {
        Some(fam) => {
            if name.to_bytes().ends_with(b"_ptsz") {
                mark_ptsz(p);
            }
            intercept(fam, p)
        }
        None => p,
    }
}

/// Whether an `RTLD_NEXT` lookup of `symbol` must not go to glibc as is:
/// one of the loader's names, or a name we interpose in a capped slice.
fn next_is_ours(symbol: *const c_char) -> bool {
    // SAFETY: dlsym's contract: null or NUL-terminated.
    let Some(name) = (unsafe { sys::cstr(symbol) }) else {
        return false;
    };
    ours(name.to_bytes()).is_some()
        || (shim_if_ready().is_some_and(|s| s.active()) && export_family(name.to_bytes()).is_some())
}

/// `RTLD_NEXT` for a name [`next_is_ours`]: ours, or the driver's own
/// definition (in the loaded libcuda or libnvidia-ml) wrapped.
extern "C" fn next_ours(_handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        // SAFETY: checked by next_is_ours: non-null, NUL-terminated.
        let name = unsafe { CStr::from_ptr(symbol) };
        if let Some(p) = ours(name.to_bytes()) {
            return p;
        }
        wrapped(name, sys::lookup_driver(name))
    })
}

/// `dlsym` for every handle but RTLD_NEXT.
extern "C" fn dlsym_impl(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let p = sys::real_dlsym_raw(handle, symbol);
    guard(p, || {
        // SAFETY: dlsym's contract: null or NUL-terminated.
        match unsafe { sys::cstr(symbol) } {
            Some(name) if !p.is_null() => ours(name.to_bytes()).unwrap_or_else(|| wrapped(name, p)),
            _ => p,
        }
    })
}

/// `dlvsym` for every handle but RTLD_NEXT, and RTLD_NEXT for a name
/// [`next_is_ours`].
extern "C" fn dlvsym_impl(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    if handle == libc::RTLD_NEXT {
        return next_ours(handle, symbol);
    }
    let p = sys::real_dlvsym(handle, symbol, version);
    guard(p, || {
        // SAFETY: dlvsym's contract: null or NUL-terminated.
        match unsafe { sys::cstr(symbol) } {
            Some(name) if !p.is_null() => ours(name.to_bytes()).unwrap_or_else(|| wrapped(name, p)),
            _ => p,
        }
    })
}

/// Which function serves `dlsym(handle, symbol)`.
extern "C" fn pick_dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    if handle != libc::RTLD_NEXT {
        return dlsym_impl as *mut c_void;
    }
    if guard(false, || next_is_ours(symbol)) {
        next_ours as *mut c_void
    } else {
        sys::resolve_real_dlsym()
    }
}

/// Which function serves `dlvsym(handle, symbol, version)`.
extern "C" fn pick_dlvsym(
    handle: *mut c_void,
    symbol: *const c_char,
    _version: *const c_char,
) -> *mut c_void {
    if handle != libc::RTLD_NEXT || guard(false, || next_is_ours(symbol)) {
        dlvsym_impl as *mut c_void
    } else {
        sys::resolve_real_dlvsym()
    }
}

/// Which function serves `dlmopen(lmid, file, mode)`: glibc's for the
/// base namespace or outside a capped slice, else [`refuse_dlmopen`].
extern "C" fn pick_dlmopen(lmid: libc::Lmid_t, _file: *const c_char, _mode: c_int) -> *mut c_void {
    if lmid != libc::LM_ID_BASE && guard(true, || shim().active()) {
        refuse_dlmopen as *mut c_void
    } else {
        sys::resolve_real_dlmopen()
    }
}

/// `dlmopen` into a new namespace in a capped slice: NULL, with a
/// `dlerror` that says why (a load that fails on a path that cannot exist).
extern "C" fn refuse_dlmopen(
    _lmid: libc::Lmid_t,
    file: *const c_char,
    _mode: c_int,
) -> *mut c_void {
    guard((), || {
        // SAFETY: dlmopen's contract: null or NUL-terminated.
        let what = unsafe { sys::cstr(file) }.map_or("".into(), |f| f.to_string_lossy());
        sys::log_line(&format!(
            "dlmopen of {what:?} into a new link-map namespace refused: the slice's limits \
             apply in the base namespace only"
        ));
    });
    sys::real_dlopen(
        c"/proc/self/gpuslice: dlmopen into a new namespace is refused in a capped slice".as_ptr(),
        libc::RTLD_NOW,
    )
}

/// The body of a naked trampoline: saves the argument registers (two or
/// three; with two, 8 more bytes keep the stack 16-byte aligned at the
/// call), calls `$pick` with the same arguments, restores them and jumps to
/// the function `$pick` returned, so that it sees the caller's arguments and
/// return address.
#[cfg(target_arch = "x86_64")]
macro_rules! trampoline {
    (rdi, rsi; $pick:path) => {
        core::arch::naked_asm!(
            "push rdi",
            "push rsi",
            "sub rsp, 8",
            "call {pick}",
            "add rsp, 8",
            "pop rsi",
            "pop rdi",
            "jmp rax",
            pick = sym $pick,
        )
    };
    (rdi, rsi, rdx; $pick:path) => {
        core::arch::naked_asm!(
            "push rdi",
            "push rsi",
            "push rdx",
            "call {pick}",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "jmp rax",
            pick = sym $pick,
        )
    };
}

/// Our `dlsym` (module docs).
///
/// # Safety
/// The C contract of `dlsym`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    trampoline!(rdi, rsi; pick_dlsym)
}

/// Our `dlvsym` (module docs).
///
/// # Safety
/// The C contract of `dlvsym`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    trampoline!(rdi, rsi, rdx; pick_dlvsym)
}

/// Our `dlopen`: glibc's, reached with the caller's return address (which
/// decides the namespace and `$ORIGIN`).
///
/// # Safety
/// The C contract of `dlopen`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    trampoline!(rdi, rsi; crate::sys::resolve_real_dlopen)
}

/// Our `dlmopen` (module docs).
///
/// # Safety
/// The C contract of `dlmopen`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlmopen(
    lmid: libc::Lmid_t,
    file: *const c_char,
    mode: c_int,
) -> *mut c_void {
    trampoline!(rdi, rsi, rdx; pick_dlmopen)
}
