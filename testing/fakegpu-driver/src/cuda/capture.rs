//! Stream capture, as much of it as the shim's tests need: streams,
//! `cuStreamBeginCapture_v2` / `cuStreamEndCapture` / `cuStreamIsCapturing`
//! (and `_ptsz`), `cuThreadExchangeStreamCaptureMode`, stream-ordered
//! allocations that become graph allocation nodes while their stream is
//! capturing, and the rule that makes capture fragile for an interposer:
//! a *potentially unsafe* call (a synchronous allocation or free, a
//! synchronisation, a memory-pool or graph-memory query) made by a thread
//! that is prohibited from it fails with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`
//! and invalidates the capture responsible; every later operation on that
//! stream, and its `cuStreamEndCapture`, fail with
//! `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
//!
//! Who is prohibited (the CUDA driver API's rule, `cuThreadExchangeStreamCaptureMode`):
//! a thread whose own capture was not begun in relaxed mode, and a thread in
//! global mode while any other thread captures in global mode; a thread in
//! relaxed mode never is. Which calls count as unsafe is modelled
//! conservatively (pool attribute reads and trims are refused by the real
//! driver under capture; the graph-memory attribute and trim are treated
//! the same way here): code that passes against the fake avoids them, or
//! relaxes its thread first.
//!
//! An operation on the legacy stream while a blocking stream captures is an
//! implicit synchronisation with it: `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`,
//! the capture is invalidated. `cuStreamIsCapturing` on the legacy stream
//! then answers `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` without invalidating.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::*;

/// Token handles: created streams, and each thread's per-thread stream.
const STREAM_BASE: usize = 0xB00_0000;
const PER_THREAD_BASE: usize = 0xB80_0000;
/// Addresses of captured allocation nodes (disjoint from the others).
const NODE_ADDR_BASE: u64 = 0x6f00_0000_0000;

type Handle = *mut c_void;

struct Capture {
    thread: usize,
    mode: c_int,
    dev: usize,
    /// Bytes of the allocation nodes captured so far.
    bytes: u64,
    invalidated: bool,
    /// Synchronises with the legacy stream (not created non-blocking).
    blocking: bool,
}

struct Streams {
    next: usize,
    /// Created streams → flags.
    created: BTreeMap<usize, c_uint>,
    /// Created streams → the device of the context they were made in.
    devices: BTreeMap<usize, usize>,
    /// Capturing streams (by key, see [`key`]).
    captures: BTreeMap<usize, Capture>,
    next_addr: u64,
    /// Addresses of captured allocation nodes not yet freed (a graph's
    /// allocation may be freed outside the graph, after its launch).
    nodes: BTreeSet<u64>,
}

static STREAMS: Mutex<Streams> = Mutex::new(Streams {
    next: 0,
    created: BTreeMap::new(),
    devices: BTreeMap::new(),
    captures: BTreeMap::new(),
    next_addr: NODE_ADDR_BASE,
    nodes: BTreeSet::new(),
});

fn streams() -> MutexGuard<'static, Streams> {
    STREAMS.lock().unwrap_or_else(|e| e.into_inner())
}

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    static MODE: Cell<c_int> = const { Cell::new(CU_STREAM_CAPTURE_MODE_GLOBAL) };
    static THREAD: usize = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

fn thread() -> usize {
    THREAD.with(|t| *t)
}

/// The stream a handle names: `per_thread_default` is the `_ptsz` flavour,
/// in which the NULL stream is the calling thread's per-thread stream.
pub fn key(stream: Handle, per_thread_default: bool) -> usize {
    match stream as usize {
        0 if per_thread_default => PER_THREAD_BASE + thread() * 16,
        0 | CU_STREAM_LEGACY => CU_STREAM_LEGACY,
        CU_STREAM_PER_THREAD => PER_THREAD_BASE + thread() * 16,
        s => s,
    }
}

/// Called first by every potentially unsafe entry point: refuses the call
/// when this thread is prohibited from it, invalidating the capture(s)
/// responsible.
pub fn unsafe_call() -> Result<(), CUresult> {
    let mode = MODE.with(Cell::get);
    if mode == CU_STREAM_CAPTURE_MODE_RELAXED {
        return Ok(());
    }
    let me = thread();
    let mut s = streams();
    let mut refused = false;
    for c in s.captures.values_mut() {
        let own = c.thread == me && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
        let other_global = mode == CU_STREAM_CAPTURE_MODE_GLOBAL
            && c.thread != me
            && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        if own || other_global {
            c.invalidated = true;
            refused = true;
        }
    }
    if refused {
        Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    } else {
        Ok(())
    }
}

/// A stream-ordered operation on `key`: Ok(true) when it is captured,
/// Ok(false) when it runs, or the capture error.
pub fn stream_op(key: usize) -> Result<bool, CUresult> {
    let mut s = streams();
    if key == CU_STREAM_LEGACY {
        let mut implicit = false;
        for c in s.captures.values_mut().filter(|c| c.blocking) {
            c.invalidated = true;
            implicit = true;
        }
        return if implicit {
            Err(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
        } else {
            Ok(false)
        };
    }
    match s.captures.get(&key) {
        None => Ok(false),
        Some(c) if c.invalidated => Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
        Some(_) => Ok(true),
    }
}

/// A stream-ordered allocation on `key`: when the stream captures, an
/// allocation node (no memory now; the graph's memory is reserved when it
/// is launched) and its address; None when it runs normally.
pub fn captured_alloc(key: usize, size: u64) -> Result<Option<u64>, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if !stream_op(key)? {
        return Ok(None);
    }
    let mut s = streams();
    let addr = s.next_addr;
    s.next_addr += size.div_ceil(512).max(1) * 512;
    if let Some(c) = s.captures.get_mut(&key) {
        c.bytes += size;
    }
    s.nodes.insert(addr);
    Ok(Some(addr))
}

/// Frees a graph allocation outside its graph; false when `addr` is none.
pub fn free_node(addr: u64) -> bool {
    streams().nodes.remove(&addr)
}

// ---------------------------------------------------------------- streams

/// # Safety
/// `stream` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, flags: c_uint) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(current_device().and_then(|dev| {
            if flags & !CU_STREAM_NON_BLOCKING != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let h = {
                let mut s = streams();
                s.next += 1;
                let h = STREAM_BASE + s.next * 16;
                s.created.insert(h, flags);
                s.devices.insert(h, dev);
                h
            };
            // SAFETY: caller contract.
            unsafe { out(stream, h as Handle) }
        }))
    })
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: Handle) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let mut s = streams();
        let k = stream as usize;
        s.captures.remove(&k);
        s.devices.remove(&k);
        match s.created.remove(&k) {
            Some(_) => CUDA_SUCCESS,
            None => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

/// The device whose memory work on `stream` uses: a created stream's own
/// (the context it was made in), else the current context's (the default
/// streams).
pub fn stream_device(stream: Handle) -> Result<usize, CUresult> {
    let own = streams().devices.get(&(stream as usize)).copied();
    match own {
        Some(dev) => Ok(dev),
        None => current_device(),
    }
}

/// `cuStreamGetDevice` (CUDA 12.8).
///
/// # Safety
/// `device` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetDevice(stream: Handle, device: *mut c_int) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(stream_device(stream).and_then(|dev| {
            // SAFETY: caller contract.
            unsafe { out(device, dev as c_int) }
        }))
    })
}

fn begin(stream: Handle, mode: c_int, per_thread_default: bool) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(current_device().and_then(|dev| {
            if !(CU_STREAM_CAPTURE_MODE_GLOBAL..=CU_STREAM_CAPTURE_MODE_RELAXED).contains(&mode) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let k = key(stream, per_thread_default);
            if k == CU_STREAM_LEGACY {
                return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            let mut s = streams();
            if s.captures.contains_key(&k) {
                return Err(CUDA_ERROR_ILLEGAL_STATE);
            }
            let blocking = !matches!(s.created.get(&k), Some(f) if f & CU_STREAM_NON_BLOCKING != 0);
            s.captures.insert(
                k,
                Capture {
                    thread: thread(),
                    mode,
                    dev,
                    bytes: 0,
                    invalidated: false,
                    blocking,
                },
            );
            Ok(())
        }))
    })
}

/// The CUDA 10.0 ABI (no mode: global).
#[no_mangle]
pub extern "C" fn cuStreamBeginCapture(stream: Handle) -> CUresult {
    begin(stream, CU_STREAM_CAPTURE_MODE_GLOBAL, false)
}

legacy_and_ptsz!(cuStreamBeginCapture_v2, cuStreamBeginCapture_ptsz, begin, (stream: Handle, mode: c_int));

fn end(stream: Handle, graph: *mut Handle, per_thread_default: bool) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        if graph.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let k = key(stream, per_thread_default);
        let c = {
            let mut s = streams();
            match s.captures.get(&k) {
                None => return CUDA_ERROR_ILLEGAL_STATE,
                Some(c) if c.mode != CU_STREAM_CAPTURE_MODE_RELAXED && c.thread != thread() => {
                    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
                }
                Some(_) => {}
            }
            s.captures.remove(&k)
        };
        let Some(c) = c else {
            return CUDA_ERROR_ILLEGAL_STATE;
        };
        // SAFETY: checked non-null; caller contract.
        unsafe { graph.write(std::ptr::null_mut()) };
        if c.invalidated {
            return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        }
        let g = memory_ext::captured_graph(c.dev, c.bytes);
        // SAFETY: as above.
        unsafe { graph.write(g) };
        CUDA_SUCCESS
    })
}

legacy_and_ptsz!(
    /// # Safety
    /// `graph` null or valid for a write.
    unsafe cuStreamEndCapture, cuStreamEndCapture_ptsz, end, (stream: Handle, graph: *mut Handle)
);

fn is_capturing(stream: Handle, status: *mut c_int, per_thread_default: bool) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(state().and_then(|_| {
            let k = key(stream, per_thread_default);
            let s = streams();
            let v = if k == CU_STREAM_LEGACY {
                if s.captures.values().any(|c| c.blocking && !c.invalidated) {
                    return Err(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
                }
                CU_STREAM_CAPTURE_STATUS_NONE
            } else {
                match s.captures.get(&k) {
                    None => CU_STREAM_CAPTURE_STATUS_NONE,
                    Some(c) if c.invalidated => CU_STREAM_CAPTURE_STATUS_INVALIDATED,
                    Some(_) => CU_STREAM_CAPTURE_STATUS_ACTIVE,
                }
            };
            drop(s);
            // SAFETY: caller contract.
            unsafe { out(status, v) }
        }))
    })
}

legacy_and_ptsz!(
    /// # Safety
    /// `status` null or valid for a write.
    unsafe cuStreamIsCapturing, cuStreamIsCapturing_ptsz, is_capturing, (stream: Handle, status: *mut c_int)
);

/// Swaps the calling thread's capture interaction mode.
///
/// # Safety
/// `mode` null or valid for a read and a write.
#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        if mode.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null; caller contract.
        let new = unsafe { mode.read() };
        if !(CU_STREAM_CAPTURE_MODE_GLOBAL..=CU_STREAM_CAPTURE_MODE_RELAXED).contains(&new) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let old = MODE.with(|m| m.replace(new));
        // SAFETY: as above.
        unsafe { mode.write(old) };
        CUDA_SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // cuInit is per process and no unit test calls it: these drive the
    // capture table directly. Each test uses its own stream keys, and they
    // run one at a time (a global-mode capture prohibits other threads).
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn capture(k: usize, mode: c_int) {
        streams().captures.insert(
            k,
            Capture {
                thread: thread(),
                mode,
                dev: 0,
                bytes: 0,
                invalidated: false,
                blocking: false,
            },
        );
    }

    fn exchange(mode: c_int) -> c_int {
        let mut m = mode;
        // SAFETY: `m` is a live local the call reads and writes.
        let rc = unsafe { cuThreadExchangeStreamCaptureMode(&mut m) };
        assert_eq!(rc, CUDA_SUCCESS);
        m
    }

    #[test]
    fn an_unsafe_call_invalidates_the_own_capture_unless_relaxed() {
        let _serial = serial();
        let k = 0xC00_0000;
        capture(k, CU_STREAM_CAPTURE_MODE_GLOBAL);
        assert_eq!(stream_op(k), Ok(true));
        assert_eq!(captured_alloc(k, 1000).map(|a| a.is_some()), Ok(true));
        let old = exchange(CU_STREAM_CAPTURE_MODE_RELAXED);
        assert_eq!(old, CU_STREAM_CAPTURE_MODE_GLOBAL);
        assert_eq!(unsafe_call(), Ok(()), "relaxed thread");
        exchange(old);
        assert_eq!(stream_op(k), Ok(true), "still valid");
        assert_eq!(unsafe_call(), Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
        assert_eq!(stream_op(k), Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
        assert_eq!(
            captured_alloc(k, 1000),
            Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        );
        streams().captures.remove(&k);
        assert_eq!(unsafe_call(), Ok(()));
    }

    #[test]
    fn a_relaxed_capture_allows_unsafe_calls_and_other_streams_run() {
        let _serial = serial();
        let k = 0xC10_0000;
        capture(k, CU_STREAM_CAPTURE_MODE_RELAXED);
        assert_eq!(unsafe_call(), Ok(()));
        assert_eq!(stream_op(k + 16), Ok(false));
        assert_eq!(captured_alloc(k + 16, 64), Ok(None));
        assert_eq!(stream_op(k), Ok(true));
        streams().captures.remove(&k);
    }

    #[test]
    fn another_thread_s_global_capture_prohibits_threads_in_global_mode() {
        let _serial = serial();
        let k = 0xC20_0000;
        std::thread::spawn(move || capture(k, CU_STREAM_CAPTURE_MODE_GLOBAL))
            .join()
            .unwrap();
        let old = exchange(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        assert_eq!(unsafe_call(), Ok(()), "thread-local mode ignores others");
        exchange(old);
        assert_eq!(stream_op(k), Ok(true));
        assert_eq!(unsafe_call(), Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
        assert_eq!(stream_op(k), Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
        streams().captures.remove(&k);
    }

    #[test]
    fn per_thread_default_stream_keys() {
        let mine = key(std::ptr::null_mut(), true);
        assert_eq!(key(CU_STREAM_PER_THREAD as Handle, false), mine);
        assert_eq!(key(std::ptr::null_mut(), false), CU_STREAM_LEGACY);
        let other = std::thread::spawn(|| key(std::ptr::null_mut(), true))
            .join()
            .unwrap();
        assert_ne!(other, mine);
    }
}
