//! Helpers for the C boundary: panic containment, out-parameters, strings.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`, returning `on_panic` instead of unwinding into the C caller.
pub fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(on_panic)
}

/// Writes `value` through a caller-provided out-pointer. Returns false when
/// the pointer is null (callers map that to their "invalid value" code).
///
/// # Safety
/// `ptr` must be null or valid for a write of `T` (the C API contract of
/// every function that takes an out-parameter).
pub unsafe fn write_out<T>(ptr: *mut T, value: T) -> bool {
    if ptr.is_null() {
        return false;
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { ptr.write(value) };
    true
}

/// [`write_out`] for an entry point: a null pointer is the API's `null`
/// error code (CUDA's and NVML's differ).
///
/// # Safety
/// As [`write_out`].
pub unsafe fn write_out_or<T, E>(ptr: *mut T, value: T, null: E) -> Result<(), E> {
    // SAFETY: forwarded contract.
    if unsafe { write_out(ptr, value) } {
        Ok(())
    } else {
        Err(null)
    }
}

/// Collapses an entry point's `Result<(), E>` into its C return code,
/// `success` when it is Ok.
pub fn code<E>(result: Result<(), E>, success: E) -> E {
    result.err().unwrap_or(success)
}

/// Reads a NUL-terminated UTF-8 string passed by the caller.
///
/// # Safety
/// `ptr` must be null or point to a NUL-terminated string that outlives the
/// returned reference.
pub unsafe fn read_str<'a>(ptr: *const c_char) -> Option<&'a str> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(ptr) }.to_str().ok()
}

/// Copies `s` plus a NUL into `buf` of `len` bytes; fails when it does not
/// fit (NVML's `NVML_ERROR_INSUFFICIENT_SIZE` semantics).
///
/// # Safety
/// `buf` must be null or valid for writes of `len` bytes.
pub unsafe fn copy_str_exact(buf: *mut c_char, len: usize, s: &str) -> Result<(), CopyError> {
    if buf.is_null() {
        return Err(CopyError::Null);
    }
    if s.len() + 1 > len {
        return Err(CopyError::TooSmall);
    }
    // SAFETY: `buf` holds at least `s.len() + 1` bytes (checked above).
    unsafe { copy_bytes(buf, s.as_bytes()) };
    Ok(())
}

/// Copies as much of `s` as fits plus a NUL (CUDA's truncating semantics).
///
/// # Safety
/// `buf` must be null or valid for writes of `len` bytes.
pub unsafe fn copy_str_truncate(buf: *mut c_char, len: usize, s: &str) -> bool {
    if buf.is_null() || len == 0 {
        return false;
    }
    let n = s.len().min(len - 1);
    // SAFETY: `n + 1 <= len` bytes are written.
    unsafe { copy_bytes(buf, &s.as_bytes()[..n]) };
    true
}

#[derive(Debug, PartialEq, Eq)]
pub enum CopyError {
    Null,
    TooSmall,
}

/// # Safety
/// `buf` must be valid for writes of `bytes.len() + 1` bytes.
unsafe fn copy_bytes(buf: *mut c_char, bytes: &[u8]) {
    // SAFETY: the caller guarantees room for the bytes and the NUL; the
    // source is a Rust slice, so the regions cannot overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_copy_refuses_short_buffers() {
        let mut buf = [1 as c_char; 4];
        // SAFETY: buf is 4 bytes long.
        let r = unsafe { copy_str_exact(buf.as_mut_ptr(), buf.len(), "abcd") };
        assert_eq!(r, Err(CopyError::TooSmall));
        // SAFETY: as above.
        let r = unsafe { copy_str_exact(buf.as_mut_ptr(), buf.len(), "abc") };
        assert_eq!(r, Ok(()));
        // SAFETY: buf now holds a NUL-terminated string.
        assert_eq!(unsafe { read_str(buf.as_ptr()) }, Some("abc"));
    }

    #[test]
    fn truncating_copy_always_terminates() {
        let mut buf = [1 as c_char; 3];
        // SAFETY: buf is 3 bytes long.
        assert!(unsafe { copy_str_truncate(buf.as_mut_ptr(), buf.len(), "abcdef") });
        // SAFETY: terminated by copy_str_truncate.
        assert_eq!(unsafe { read_str(buf.as_ptr()) }, Some("ab"));
    }

    #[test]
    fn guard_turns_panics_into_values() {
        assert_eq!(guard(7, || panic!("boom")), 7);
        assert_eq!(guard(7, || 1), 1);
    }
}
