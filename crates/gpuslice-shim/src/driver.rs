//! Facts about the driver and the calling thread that every layer above
//! asks: the current device, whether a stream captures, the thread's
//! capture mode relaxed for the shim's own queries, and the clocks. The
//! bottom of the accounting layers (see docs/architecture.md).

use std::ffi::c_int;

use crate::cuda::pfn::ThreadExchangeStreamCaptureMode as ExchangeMode;
use crate::cuda::*;
use crate::real::Real;

static CTX_GET_DEVICE: Real = Real::named(c"cuCtxGetDevice");
static STREAM_IS_CAPTURING: Real = Real::named(c"cuStreamIsCapturing");
static EXCHANGE_CAPTURE_MODE: Real = Real::named(c"cuThreadExchangeStreamCaptureMode");

/// Ordinal of the current context's device.
pub fn current_device() -> Option<CUdevice> {
    // SAFETY: cuCtxGetDevice(CUdevice*).
    let f = unsafe { CTX_GET_DEVICE.func::<pfn::CtxGetDevice>() }?;
    let mut d: CUdevice = -1;
    // SAFETY: valid out-pointer.
    (unsafe { f(&mut d) } == CUDA_SUCCESS).then_some(d)
}

/// Whether a stream-ordered call on `stream` is captured into a graph
/// rather than run (or is refused as part of a capture). The NULL stream is
/// the legacy stream, which never captures, for the default flavour, and
/// the per-thread stream for `_ptsz` callers: the per-thread stream is
/// asked about (when it captures, a legacy-stream call would be refused by
/// the driver anyway). `cuStreamIsCapturing` itself is legal during
/// capture; on the legacy stream while a blocking stream captures it
/// answers a capture error without invalidating anything.
pub fn capturing(stream: CUstream) -> bool {
    // SAFETY: cuStreamIsCapturing(CUstream, CUstreamCaptureStatus*).
    let Some(f) = (unsafe { STREAM_IS_CAPTURING.func::<pfn::StreamIsCapturing>() }) else {
        return false;
    };
    let s = if stream.is_null() {
        CU_STREAM_PER_THREAD as CUstream
    } else {
        stream
    };
    let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: valid out-pointer; the stream is the caller's.
    match unsafe { f(s, &mut status) } {
        CUDA_SUCCESS => status != CU_STREAM_CAPTURE_STATUS_NONE,
        rc => (CUDA_ERROR_STREAM_CAPTURE_FIRST..=CUDA_ERROR_STREAM_CAPTURE_LAST).contains(&rc),
    }
}

/// This thread's stream-capture mode, relaxed for the guard's lifetime.
pub struct Relaxed(Option<c_int>);

impl Relaxed {
    pub fn new() -> Relaxed {
        // SAFETY: cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode*).
        let Some(f) = (unsafe { EXCHANGE_CAPTURE_MODE.func::<ExchangeMode>() }) else {
            return Relaxed(None);
        };
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: valid in/out pointer.
        let ok = unsafe { f(&mut mode) } == CUDA_SUCCESS;
        Relaxed(ok.then_some(mode))
    }
}

impl Drop for Relaxed {
    fn drop(&mut self) {
        let Some(mut mode) = self.0 else { return };
        // SAFETY: as in `new` (the function was found there).
        if let Some(f) = unsafe { EXCHANGE_CAPTURE_MODE.func::<ExchangeMode>() } {
            // SAFETY: valid in/out pointer; restores the caller's mode.
            unsafe { f(&mut mode) };
        }
    }
}

/// Runs the shim's own driver queries (pool and graph-memory attributes)
/// with this thread's capture mode relaxed, so they are never refused and
/// never invalidate a capture, whatever mode the application set.
pub fn relaxed<T>(f: impl FnOnce() -> T) -> T {
    let _mode = Relaxed::new();
    f()
}

/// Sleeps this thread for `ns`.
pub fn nap(ns: u64) {
    std::thread::sleep(std::time::Duration::from_nanos(ns));
}

/// A monotonic clock in ns (the precise one).
#[inline]
pub fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// A monotonic clock in ns (the coarse one: a vDSO read, ~ms resolution).
#[inline]
pub fn coarse_now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// `clock`'s time in ns (one of the monotonic clocks, which always exist).
#[inline]
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; the clock exists (callers' constants).
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}
