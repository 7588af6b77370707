//! Kernel launches on a simulated GPU timeline, with events and stream
//! synchronisation whose timestamps are that timeline's: enough for the
//! shim's compute-share tests.
//!
//! Each device runs one piece of work at a time: a launch at host time
//! `now` starts at `max(now, device tail)` and runs for its duration. The
//! device tail is the process's own, or, with `$FAKEGPU_ENGINE` naming a
//! file, shared by every process using that file: one engine, as a real
//! GPU without MPS runs one context's work at a time (it time-slices them;
//! here a launch queues behind the others' work, which does to event
//! timing what time-slicing does: an event pair around a launch spans the
//! other processes' work that ran in between). A launch's duration which is the `u64` nanoseconds the launch's first kernel
//! parameter points to (`kernelParams[0]`), else `$FAKEGPU_KERNEL_NS`
//! (default 10 µs). A graph launch runs for `$FAKEGPU_GRAPH_NS` (default
//! 0). A launch on a capturing stream is captured, not run. Events record
//! the tail of their stream; `cuEventQuery` says whether host time has
//! reached it, `cuEventElapsedTime` gives the difference in ms.
//! `fakegpuBusyNs(dev)` (not a CUDA function) returns the GPU time the
//! device has completed so far, `fakegpuEventRecords()` how many events
//! were recorded (what metering costs the GPU).

use std::collections::BTreeMap;
use std::ffi::{c_float, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use super::capture::{key, stream_op};
use super::*;

const EVENT_BASE: usize = 0xE00_0000;

type Handle = *mut c_void;

struct Timeline {
    /// Per device: when its queued work ends (ns since BASE), and the GPU
    /// time scheduled so far.
    dev_tail: BTreeMap<usize, (u64, u64)>,
    /// Per stream key: when its last work ends.
    stream_tail: BTreeMap<usize, u64>,
    next_event: usize,
    /// Events: recorded timestamp (None: never recorded).
    events: BTreeMap<usize, Option<u64>>,
}

static TIMELINE: Mutex<Timeline> = Mutex::new(Timeline {
    dev_tail: BTreeMap::new(),
    stream_tail: BTreeMap::new(),
    next_event: 0,
    events: BTreeMap::new(),
});

fn timeline() -> MutexGuard<'static, Timeline> {
    TIMELINE.lock().unwrap_or_else(|e| e.into_inner())
}

/// CLOCK_MONOTONIC in ns: one clock for every process on the engine.
fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Devices the shared engine file has a word for: one per PCI bus number
/// (a fake host's buses are `0x18 + 0x10·i`, up to 0xf8: modulo 64 GPUs 0
/// and 4 shared a word).
const ENGINE_DEVICES: usize = 256;

/// Words of the shared engine file: per device, the tail, then the GPU
/// time queued so far.
const ENGINE_WORDS: usize = 2 * ENGINE_DEVICES;

/// The shared engine (`$FAKEGPU_ENGINE`): per device, when the work queued
/// by every process ends (CLOCK_MONOTONIC ns; words 0..256), and how much
/// work every process has queued on it (ns; words 256..512, which the fake
/// NVML turns into utilisation). None: each process has its own GPU.
fn engine() -> Option<&'static [AtomicU64; ENGINE_WORDS]> {
    static ENGINE: OnceLock<Option<usize>> = OnceLock::new();
    let addr = (*ENGINE.get_or_init(|| {
        let path = std::env::var_os("FAKEGPU_ENGINE").filter(|p| !p.is_empty())?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .ok()?;
        let len = ENGINE_WORDS * 8;
        file.set_len(len as u64).ok()?;
        // SAFETY: a fresh shared mapping of a file of `len` bytes, chosen
        // by the kernel; checked below and never unmapped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some(p as usize)
    }))?;
    // SAFETY: a live, page-aligned mapping of ENGINE_WORDS words, only
    // ever accessed atomically (by every process that maps it).
    Some(unsafe { &*(addr as *const [AtomicU64; ENGINE_WORDS]) })
}

/// When `ns` of work that could start at `ready` starts on `dev`'s shared
/// engine (queued behind every process's work); `ready` itself without one.
fn engine_start(dev: usize, ready: u64, ns: u64) -> u64 {
    // One word per physical GPU, by its PCI bus (ordinals differ between
    // processes that see different GPUs).
    let word = device(dev as CUdevice).map(|d| d.pci.bus as usize % ENGINE_DEVICES);
    let Some((e, w)) = engine().zip(word.ok()) else {
        return ready;
    };
    e[ENGINE_DEVICES + w].fetch_add(ns, Ordering::AcqRel);
    let tail = &e[w];
    let mut seen = tail.load(Ordering::Acquire);
    loop {
        let start = ready.max(seen);
        match tail.compare_exchange(seen, start + ns, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return start,
            Err(now_seen) => seen = now_seen,
        }
    }
}

/// GPU time the shared engine of the GPU on PCI bus `bus` has completed
/// (every process's work), and the clock it was read at; None without a
/// shared engine.
pub(crate) fn engine_busy(bus: u32) -> Option<(u64, u64)> {
    let e = engine()?;
    let w = bus as usize % ENGINE_DEVICES;
    let t = now();
    let tail = e[w].load(Ordering::Acquire);
    let queued = e[ENGINE_DEVICES + w].load(Ordering::Acquire);
    Some((queued - tail.saturating_sub(t).min(queued), t))
}

fn env_ns(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn kernel_default_ns() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| env_ns("FAKEGPU_KERNEL_NS", 10_000))
}

fn graph_ns() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| env_ns("FAKEGPU_GRAPH_NS", 0))
}

/// An operation on `stream` of the current device: captured (nothing more
/// to do) when the stream captures; else `op` runs with the device, the
/// stream's key, the time now and the timeline.
fn on_stream(
    stream: Handle,
    ptsz: bool,
    op: impl FnOnce(usize, usize, u64, &mut Timeline) -> Result<(), CUresult>,
) -> CUresult {
    rc(current_device().and_then(|dev| {
        let k = key(stream, ptsz);
        if stream_op(k)? {
            return Ok(());
        }
        let t = now();
        op(dev, k, t, &mut timeline())
    }))
}

/// Runs `ns` of work on `stream` of the current device (or captures it).
fn run(stream: Handle, ptsz: bool, ns: u64) -> CUresult {
    on_stream(stream, ptsz, |dev, k, t, tl| {
        let (tail, busy) = tl.dev_tail.get(&dev).copied().unwrap_or((0, 0));
        let end = engine_start(dev, tail.max(t), ns) + ns;
        tl.dev_tail.insert(dev, (end, busy + ns));
        tl.stream_tail.insert(k, end);
        Ok(())
    })
}

/// Work of a graph launch (called by `cuGraphLaunch` once the graph's
/// memory is in place).
pub(super) fn graph(stream: Handle, ptsz: bool) -> CUresult {
    run(stream, ptsz, graph_ns())
}

/// # Safety
/// `params` null or an array whose first entry is null or points to a u64.
unsafe fn duration(params: *mut *mut c_void) -> u64 {
    if params.is_null() {
        return kernel_default_ns();
    }
    // SAFETY: caller contract.
    let first = unsafe { *params };
    if first.is_null() {
        return kernel_default_ns();
    }
    // SAFETY: caller contract (the test client passes a u64).
    unsafe { (first as *const u64).read_unaligned() }
}

// cuLaunchKernel and cuLaunchCooperativeKernel: the same grid arguments,
// the first with a trailing `extra`.
macro_rules! launch_grid {
    ($name:ident, $ptsz:expr $(, $extra:ident)?) => {
        /// # Safety
        /// `params` as [`duration`].
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            f: Handle,
            _gx: c_uint,
            _gy: c_uint,
            _gz: c_uint,
            _bx: c_uint,
            _by: c_uint,
            _bz: c_uint,
            _shmem: c_uint,
            stream: Handle,
            params: *mut *mut c_void,
            $($extra: *mut *mut c_void,)?
        ) -> CUresult {
            guard(CUDA_ERROR_UNKNOWN, || {
                if f.is_null() {
                    return CUDA_ERROR_INVALID_HANDLE;
                }
                // SAFETY: caller contract.
                run(stream, $ptsz, unsafe { duration(params) })
            })
        }
    };
}

macro_rules! launch_ex {
    ($name:ident, $ptsz:expr) => {
        /// # Safety
        /// `config` null or valid; `params` as [`duration`].
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            config: *const LaunchConfig,
            f: Handle,
            params: *mut *mut c_void,
            _extra: *mut *mut c_void,
        ) -> CUresult {
            guard(CUDA_ERROR_UNKNOWN, || {
                // SAFETY: caller contract.
                let Some(c) = (unsafe { config.as_ref() }) else {
                    return CUDA_ERROR_INVALID_VALUE;
                };
                if f.is_null() {
                    return CUDA_ERROR_INVALID_HANDLE;
                }
                // SAFETY: caller contract.
                run(c.stream, $ptsz, unsafe { duration(params) })
            })
        }
    };
}

launch_grid!(cuLaunchKernel, false, _extra);
launch_grid!(cuLaunchKernel_ptsz, true, _extra);
launch_grid!(cuLaunchCooperativeKernel, false);
launch_grid!(cuLaunchCooperativeKernel_ptsz, true);
launch_ex!(cuLaunchKernelEx, false);
launch_ex!(cuLaunchKernelEx_ptsz, true);

// ---------------------------------------------------------------- events

fn event_id(h: Handle) -> usize {
    h as usize
}

/// # Safety
/// `event` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, _flags: c_uint) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc(current_device().and_then(|_| {
            let h = {
                let mut tl = timeline();
                tl.next_event += 1;
                let h = EVENT_BASE + tl.next_event * 16;
                tl.events.insert(h, None);
                h
            };
            // SAFETY: caller contract.
            unsafe { out(event, h as Handle) }
        }))
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: Handle) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        match timeline().events.remove(&event_id(event)) {
            Some(_) => CUDA_SUCCESS,
            None => CUDA_ERROR_INVALID_HANDLE,
        }
    })
}

static EVENT_RECORDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn record(event: Handle, stream: Handle, ptsz: bool) -> CUresult {
    EVENT_RECORDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    guard(CUDA_ERROR_UNKNOWN, || {
        on_stream(stream, ptsz, |_, k, t, tl| {
            let at = tl.stream_tail.get(&k).copied().unwrap_or(0).max(t);
            match tl.events.get_mut(&event_id(event)) {
                Some(e) => {
                    *e = Some(at);
                    Ok(())
                }
                None => Err(CUDA_ERROR_INVALID_HANDLE),
            }
        })
    })
}

legacy_and_ptsz!(cuEventRecord, cuEventRecord_ptsz, record, (event: Handle, stream: Handle));

fn event_time(event: Handle) -> Result<Option<u64>, CUresult> {
    timeline()
        .events
        .get(&event_id(event))
        .copied()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

#[no_mangle]
pub extern "C" fn cuEventQuery(event: Handle) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || match event_time(event) {
        Err(e) => e,
        Ok(Some(at)) if at > now() => CUDA_ERROR_NOT_READY,
        Ok(_) => CUDA_SUCCESS,
    })
}

/// Waits for host time `at`: asleep until shortly before, then spinning,
/// as the real driver's synchronisation spins (a sleep alone oversleeps
/// by the timer slack, ~50 µs, every time).
fn wait_until(at: u64) {
    const SPIN_NS: u64 = 100_000;
    let t = now();
    if at > t + SPIN_NS {
        std::thread::sleep(Duration::from_nanos(at - t - SPIN_NS));
    }
    while now() < at {
        std::thread::yield_now();
    }
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(event: Handle) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || match event_time(event) {
        Err(e) => e,
        Ok(at) => {
            wait_until(at.unwrap_or(0));
            CUDA_SUCCESS
        }
    })
}

/// # Safety
/// `ms` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut c_float,
    start: Handle,
    end: Handle,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        rc((|| {
            let (Some(a), Some(b)) = (event_time(start)?, event_time(end)?) else {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            };
            if a.max(b) > now() {
                return Err(CUDA_ERROR_NOT_READY);
            }
            let v = (b as f64 - a as f64) / 1e6;
            // SAFETY: caller contract.
            unsafe { out(ms, v as c_float) }
        })())
    })
}

/// # Safety
/// As `cuEventElapsedTime`.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut c_float,
    start: Handle,
    end: Handle,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuEventElapsedTime(ms, start, end) }
}

fn stream_sync(stream: Handle, ptsz: bool) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let k = key(stream, ptsz);
        let at = timeline().stream_tail.get(&k).copied().unwrap_or(0);
        wait_until(at);
        CUDA_SUCCESS
    })
}

legacy_and_ptsz!(cuStreamSynchronize, cuStreamSynchronize_ptsz, stream_sync, (stream: Handle));

/// Waits for all work of device `dev` (`cuCtxSynchronize`).
pub(super) fn device_sync(dev: usize) {
    let at = timeline().dev_tail.get(&dev).map_or(0, |v| v.0);
    wait_until(at);
}

/// cuEventRecord calls so far. Test hook, not CUDA.
#[no_mangle]
pub extern "C" fn fakegpuEventRecords() -> u64 {
    EVENT_RECORDS.load(std::sync::atomic::Ordering::Relaxed)
}

/// GPU time device `dev` has completed by now (ns). Test hook, not CUDA.
#[no_mangle]
pub extern "C" fn fakegpuBusyNs(dev: c_int) -> u64 {
    guard(0, || {
        let t = now();
        let (tail, busy) = timeline()
            .dev_tail
            .get(&(dev.max(0) as usize))
            .copied()
            .unwrap_or((0, 0));
        busy - tail.saturating_sub(t).min(busy)
    })
}
