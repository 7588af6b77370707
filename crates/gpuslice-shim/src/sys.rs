//! The dynamic linker side: the real `dlsym`, `dlvsym`, `dlopen`, `dlmopen`, lazy
//! resolution of real driver functions, and anonymous memory for the
//! pointer tables. Most of the crate's `unsafe` lives here.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;
pub type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;

/// The C library's `dlsym`, `dlvsym`, `dlopen` and `dlmopen`. The shim
/// exports its own of each (`families`), so its own references to them
/// (and any lookup by name) reach those: the real ones are read from the C
/// library's symbol table ([`crate::dl`]), never looked up through the loader.
pub static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
pub static REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
pub static REAL_DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
pub static REAL_DLMOPEN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The cached real function `name`, else found and cached; `fallback`
/// (a function failing as the real one would) when the C library has none.
fn resolve(slot: &AtomicPtr<c_void>, name: &CStr, fallback: *mut c_void) -> *mut c_void {
    let cached = slot.load(Ordering::Acquire);
    if !cached.is_null() {
        return cached;
    }
    let mut found = crate::dl::libc_function(name);
    if found.is_null() || is_ours(found) {
        found = fallback;
    }
    slot.store(found, Ordering::Release);
    found
}

/// glibc's `dlsym`. Never null: falls back to a function returning null.
pub extern "C" fn resolve_real_dlsym() -> *mut c_void {
    resolve(&REAL_DLSYM, c"dlsym", null_dlsym as *mut c_void)
}

/// glibc's `dlvsym` (never null, as [`resolve_real_dlsym`]).
pub extern "C" fn resolve_real_dlvsym() -> *mut c_void {
    resolve(&REAL_DLVSYM, c"dlvsym", null_dlvsym as *mut c_void)
}

/// glibc's `dlopen` (never null, as [`resolve_real_dlsym`]).
pub extern "C" fn resolve_real_dlopen() -> *mut c_void {
    resolve(&REAL_DLOPEN, c"dlopen", null_dlopen as *mut c_void)
}

/// glibc's `dlmopen` (never null, as [`resolve_real_dlsym`]).
pub extern "C" fn resolve_real_dlmopen() -> *mut c_void {
    resolve(&REAL_DLMOPEN, c"dlmopen", null_dlmopen as *mut c_void)
}

/// Finds all four once (the library constructor), before any program code
/// can call them.
pub fn resolve_real_loader() {
    resolve_real_dlsym();
    resolve_real_dlvsym();
    resolve_real_dlopen();
    resolve_real_dlmopen();
}

extern "C" fn null_dlsym(_h: *mut c_void, _s: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

extern "C" fn null_dlvsym(_h: *mut c_void, _s: *const c_char, _v: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

extern "C" fn null_dlopen(_f: *const c_char, _m: c_int) -> *mut c_void {
    std::ptr::null_mut()
}

extern "C" fn null_dlmopen(_l: libc::Lmid_t, _f: *const c_char, _m: c_int) -> *mut c_void {
    std::ptr::null_mut()
}

/// Calls glibc's `dlvsym` (from this library: RTLD_NEXT means "after us").
pub fn real_dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    let f = resolve_real_dlvsym();
    // SAFETY: `f` is glibc's dlvsym (or `null_dlvsym`), which has this
    // signature; the strings are the caller's (NUL-terminated or null,
    // as glibc's dlvsym takes them).
    unsafe { std::mem::transmute::<*mut c_void, DlvsymFn>(f)(handle, name, version) }
}

/// Calls glibc's `dlopen` (the caller is this library: for `$ORIGIN` and
/// the namespace, that is the base namespace's).
pub fn real_dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    let f = resolve_real_dlopen();
    // SAFETY: `f` is glibc's dlopen (or `null_dlopen`), with this signature.
    unsafe { std::mem::transmute::<*mut c_void, DlopenFn>(f)(file, mode) }
}

/// Calls glibc's `dlsym` (from this library: RTLD_NEXT means "after us").
pub fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    let f = resolve_real_dlsym();
    // SAFETY: `f` is glibc's dlsym (or `null_dlsym`), which has this
    // signature; `name` is NUL-terminated.
    unsafe {
        let f: DlsymFn = std::mem::transmute::<*mut c_void, DlsymFn>(f);
        f(handle, name.as_ptr())
    }
}

/// Calls glibc's `dlsym` with a C string (null or NUL-terminated).
pub fn real_dlsym_raw(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let f = resolve_real_dlsym();
    // SAFETY: `f` is glibc's dlsym (or `null_dlsym`), with this signature.
    unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(f)(handle, name) }
}

/// The driver's own definition of `name`: from the loaded libcuda or
/// libnvidia-ml (by soname), else [`lookup_real`]. Null if none.
pub fn lookup_driver(name: &CStr) -> *mut c_void {
    let lib = if name.to_bytes().starts_with(b"nvml") {
        c"libnvidia-ml.so.1"
    } else {
        c"libcuda.so.1"
    };
    let h = loaded(lib);
    if !h.is_null() {
        let p = real_dlsym(h, name);
        if !p.is_null() && !is_ours(p) {
            return p;
        }
    }
    lookup_real(name)
}

/// Handle of an already loaded library (`RTLD_NOLOAD`), or null.
pub fn loaded(soname: &CStr) -> *mut c_void {
    // RTLD_NOLOAD never loads anything.
    real_dlopen(soname.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY)
}

/// The real definition of a driver or NVML function: the next object after
/// ours in the global scope, else the already loaded libcuda / libnvidia-ml
/// (which a runtime may have dlopen'ed with RTLD_LOCAL). Null if none.
pub fn lookup_real(name: &CStr) -> *mut c_void {
    let p = real_dlsym(libc::RTLD_NEXT, name);
    if !p.is_null() && !is_ours(p) {
        return p;
    }
    let lib = if name.to_bytes().starts_with(b"nvml") {
        c"libnvidia-ml.so.1"
    } else {
        c"libcuda.so.1"
    };
    let h = loaded(lib);
    if h.is_null() {
        return std::ptr::null_mut();
    }
    let p = real_dlsym(h, name);
    if is_ours(p) {
        std::ptr::null_mut()
    } else {
        p
    }
}

/// `name` from the object that defines `sibling` (a real function we
/// already hold), e.g. `nvmlDeviceGetUUID` next to `nvmlDeviceGetMemoryInfo`.
pub fn lookup_beside(sibling: *mut c_void, name: &CStr) -> *mut c_void {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads the address and fills `info`.
    let ok = unsafe { libc::dladdr(sibling, info.as_mut_ptr()) };
    if ok == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: dladdr succeeded, so `info` is initialised.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return std::ptr::null_mut();
    }
    // dli_fname is a NUL-terminated path owned by the loader.
    let h = real_dlopen(info.dli_fname, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
    if h.is_null() {
        return std::ptr::null_mut();
    }
    real_dlsym(h, name)
}

/// Whether `p` points into this library (so it must never be recorded as
/// a "real" function: that would loop).
pub fn is_ours(p: *mut c_void) -> bool {
    if p.is_null() {
        return false;
    }
    static OURS: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let mut ours = OURS.load(Ordering::Relaxed);
    if ours.is_null() {
        ours = object_base(is_ours as *mut c_void);
        OURS.store(ours, Ordering::Relaxed);
    }
    object_base(p) == ours
}

fn object_base(p: *mut c_void) -> *mut c_void {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads the address and fills `info`.
    let ok = unsafe { libc::dladdr(p, info.as_mut_ptr()) };
    if ok == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: initialised by the successful dladdr.
    unsafe { info.assume_init() }.dli_fbase
}

/// Private, lazily backed, zero-filled memory (`MAP_NORESERVE`): pages cost
/// nothing until touched.
pub fn anon(bytes: usize) -> Option<*mut u8> {
    // SAFETY: fresh anonymous mapping; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED && !p.is_null()).then_some(p.cast())
}

/// Reads a C string argument.
///
/// # Safety
/// `p` must be null or NUL-terminated and live for `'a`.
pub unsafe fn cstr<'a>(p: *const c_char) -> Option<&'a CStr> {
    // SAFETY: per the contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) })
}

/// Writes a log line to stderr with one `write` (no locks, no allocation
/// beyond the formatted string; only used off the hot path).
pub fn log_line(line: &str) {
    let text = format!("gpuslice: {line}\n");
    // SAFETY: writes a valid buffer to fd 2.
    unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}
