//! `gpuslice-demo-client`: the small CUDA program of README's "Try it
//! without a GPU". It loads `libcuda.so.1` with `dlopen` and takes its
//! entry points with `dlsym`, as the CUDA runtime does, so that what it
//! meets in a slice is what any CUDA program meets: the shim
//! (`--memory`, `--compute`) in front of the driver.
//!
//! - `memory SIZE [SECONDS]` (`3GiB`): asks for SIZE in 256 MiB
//!   `cuMemAlloc`s and says where it was refused, with the CUDA error;
//!   holds what it got for SECONDS (default 0: `gpuslice top` shows it
//!   meanwhile), then frees all.
//! - `compute SECONDS`: launches 200 µs kernels back to back for 0.5 s +
//!   SECONDS and says which share of the GPU's time it got over the last
//!   SECONDS. The GPU time is the fake driver's (`fakegpuBusyNs`): this
//!   command runs on the simulated driver only (`gpuslice-fakehost
//!   --driver`), where a kernel is a duration, not code.
//!
//! Every line is marked SIMULATION when the driver is the fake one (it
//! exports `fakegpuBusyNs`, which no NVIDIA driver does). Exit: 0 when it
//! ran (an allocation refused included), 1 when the driver failed, 2 on a
//! usage error.

use gpuslice_cuda_abi::cuda::{pfn, CUcontext, CUdevice, CUdeviceptr, CUresult, LIBCUDA};
use gpuslice_cuda_abi::fakegpu::BusyNs;
use gpuslice_cuda_load::{Lib, Symbol};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: gpuslice-demo-client memory SIZE [SECONDS] | compute SECONDS";
const GIB: f64 = (1u64 << 30) as f64;
/// The block `memory` allocates at a time.
const BLOCK: u64 = 256 << 20;
/// What the shim charges a context before it has measured it (docs/shim.md).
const CONTEXT_ESTIMATE: u64 = 1 << 30;
/// The simulated kernel `compute` launches (200 µs).
const KERNEL_NS: u64 = 200_000;
const WARMUP: Duration = Duration::from_millis(500);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match (args.first().map(String::as_str), args.get(1)) {
        (Some("memory"), Some(size)) => {
            let hold = args.get(2).map_or(Some(0.0), |s| s.parse::<f64>().ok());
            match (gpuslice_ledger::parse_size(size), hold) {
                (Some(bytes), Some(h)) if h >= 0.0 && h.is_finite() => {
                    report(memory(bytes, Duration::from_secs_f64(h)))
                }
                (None, _) => usage(&format!("not a size: {size}")),
                _ => usage("not a number of seconds to hold"),
            }
        }
        (Some("compute"), Some(secs)) => match secs.parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => report(compute(Duration::from_secs_f64(s))),
            _ => usage(&format!("not a number of seconds: {secs}")),
        },
        _ => usage("a command is missing"),
    };
    std::process::exit(code);
}

fn usage(why: &str) -> i32 {
    eprintln!("gpuslice-demo-client: {why}\n{USAGE}");
    2
}

fn report(r: Result<(), String>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("gpuslice-demo-client: {e}");
            1
        }
    }
}

/// The driver, its context on device 0, and whether it is the fake one.
struct Cuda {
    lib: Lib,
    simulated: bool,
    /// `SIMULATION: ` or nothing.
    mark: &'static str,
}

impl Cuda {
    fn open() -> Result<Cuda, String> {
        // SAFETY: the CUDA driver library, found by the dynamic loader as
        // for any CUDA program.
        let lib = unsafe { Lib::open(LIBCUDA) }?;
        // SAFETY: only probed for presence here; called with its prototype.
        let simulated = unsafe { lib.sym::<BusyNs>("fakegpuBusyNs") }.is_ok();
        let cuda = Cuda {
            lib,
            simulated,
            mark: if simulated { "SIMULATION: " } else { "" },
        };
        let init: Symbol<pfn::Init> = cuda.sym("cuInit")?;
        let get: Symbol<pfn::DeviceGet> = cuda.sym("cuDeviceGet")?;
        let retain: Symbol<pfn::DevicePrimaryCtxRetain> = cuda.sym("cuDevicePrimaryCtxRetain")?;
        let set: Symbol<pfn::CtxSetCurrent> = cuda.sym("cuCtxSetCurrent")?;
        let mut dev: CUdevice = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: plain driver calls with valid out-pointers.
        unsafe {
            cuda.check("cuInit", init(0))?;
            cuda.check("cuDeviceGet", get(&mut dev, 0))?;
            cuda.check("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev))?;
            cuda.check("cuCtxSetCurrent", set(ctx))?;
        }
        Ok(cuda)
    }

    /// The entry point `name`, typed `T`: every caller names its `pfn`.
    fn sym<T>(&self, name: &str) -> Result<Symbol<'_, T>, String> {
        // SAFETY: each caller's T is the prototype of `name` (cuda.h).
        Ok(unsafe { self.lib.sym(name) }?)
    }

    /// `CUDA_ERROR_OUT_OF_MEMORY (2)`, from the driver's own names.
    fn error_name(&self, rc: CUresult) -> String {
        let mut p: *const c_char = std::ptr::null();
        let named = self
            .sym::<pfn::GetErrorName>("cuGetErrorName")
            // SAFETY: valid out-pointer; the driver returns a static string.
            .map(|f| unsafe { f(rc, &mut p) } == 0 && !p.is_null())
            .unwrap_or(false);
        if named {
            // SAFETY: a NUL-terminated static string of the driver.
            let name = unsafe { CStr::from_ptr(p) }.to_string_lossy();
            format!("{name} ({rc})")
        } else {
            format!("CUresult {rc}")
        }
    }

    fn check(&self, call: &str, rc: CUresult) -> Result<(), String> {
        match rc {
            0 => Ok(()),
            rc => Err(format!("{call} failed: {}", self.error_name(rc))),
        }
    }

    fn device_name(&self) -> String {
        let mut buf = [0 as c_char; 128];
        let ok = self
            .sym::<pfn::DeviceGetName>("cuDeviceGetName")
            // SAFETY: buf holds 128 bytes; the driver NUL-terminates.
            .map(|f| unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, 0) } == 0)
            .unwrap_or(false);
        if !ok {
            return "?".into();
        }
        // SAFETY: NUL-terminated by the driver, within buf.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / GIB)
}

fn slice_name() -> String {
    std::env::var(gpuslice_ledger::limits::ENV_SLICE)
        .unwrap_or_else(|_| "(none: not in a gpuslice slice)".into())
}

fn memory(want: u64, hold: Duration) -> Result<(), String> {
    let cu = Cuda::open()?;
    let mark = cu.mark;
    let info: Symbol<pfn::MemGetInfo> = cu.sym("cuMemGetInfo_v2")?;
    let alloc: Symbol<pfn::MemAlloc> = cu.sym("cuMemAlloc_v2")?;
    let free: Symbol<pfn::MemFree> = cu.sym("cuMemFree_v2")?;
    let get_info = || -> Result<(u64, u64), String> {
        let (mut f, mut t) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        cu.check("cuMemGetInfo", unsafe { info(&mut f, &mut t) })?;
        Ok((f as u64, t as u64))
    };
    // In a capped slice the shim charges a new context its estimate until
    // it has measured it: wait (at most 5 s) for the measurement, so the
    // allocations below meet the cap, not the estimate.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut free_b, mut total) = get_info()?;
    while total - free_b >= CONTEXT_ESTIMATE && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        (free_b, total) = get_info()?;
    }
    let count: Symbol<pfn::DeviceGetCount> = cu.sym("cuDeviceGetCount")?;
    let mut n: c_int = 0;
    // SAFETY: a valid out-pointer.
    cu.check("cuDeviceGetCount", unsafe { count(&mut n) })?;
    println!(
        "{mark}slice {}: CUDA sees {n} GPU(s), the first an {}; cuMemGetInfo: {} total, {} free",
        slice_name(),
        cu.device_name(),
        gib(total),
        gib(free_b)
    );
    println!(
        "{mark}asking for {} in {} MiB cuMemAlloc calls",
        gib(want),
        BLOCK >> 20
    );
    let mut held: Vec<CUdeviceptr> = Vec::new();
    let mut bytes = 0u64;
    let mut refused = None;
    while bytes < want {
        let size = BLOCK.min(want - bytes);
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { alloc(&mut p, size as usize) };
        if rc != 0 {
            refused = Some((rc, size));
            break;
        }
        held.push(p);
        bytes += size;
    }
    match refused {
        None => println!(
            "{mark}got all {} ({} allocations): no cap refused them",
            gib(bytes),
            held.len()
        ),
        Some((rc, size)) => println!(
            "{mark}REFUSED at {} held: cuMemAlloc({} MiB) returned {}",
            gib(bytes),
            size >> 20,
            cu.error_name(rc)
        ),
    }
    std::thread::sleep(hold);
    for p in held {
        // SAFETY: each pointer came from cuMemAlloc above, freed once.
        unsafe { free(p) };
    }
    Ok(())
}

/// The slice's compute share on its first GPU, as the shim reads it: the
/// slice's root-written limits record, else `GPUSLICE_COMPUTE_LIMIT` (a
/// slice run without root).
fn share_percent() -> Option<f64> {
    use gpuslice_ledger::limits::{locate, Located};
    let dir = std::env::var("GPUSLICE_SLICE_DIR").ok();
    match locate(dir.as_deref()) {
        Located::Slice { limits, .. } => limits
            .devices
            .first()
            .and_then(|d| d.compute)
            .map(|c| c.percent()),
        _ => std::env::var(gpuslice_ledger::limits::ENV_COMPUTE)
            .ok()
            .and_then(|p| p.trim_end_matches('%').parse().ok()),
    }
}

fn compute(seconds: Duration) -> Result<(), String> {
    let cu = Cuda::open()?;
    if !cu.simulated {
        return Err(
            "`compute` measures GPU time with the fake driver's clock: run it on a simulated \
             host (gpuslice-fakehost DIR --driver)"
                .into(),
        );
    }
    let busy: Symbol<BusyNs> = cu.sym("fakegpuBusyNs")?;
    let launch: Symbol<pfn::LaunchKernel> = cu.sym("cuLaunchKernel")?;
    let sync: Symbol<pfn::CtxSynchronize> = cu.sym("cuCtxSynchronize")?;
    // The fake driver runs a kernel for the nanoseconds its first
    // parameter points to; the function handle is never dereferenced.
    let mut ns = KERNEL_NS;
    let mut params = [(&mut ns as *mut u64).cast::<c_void>()];
    let func = 0x1000 as *mut c_void;
    let t0 = Instant::now();
    let mut mark: Option<(Instant, u64)> = None;
    let mut launches = 0u64;
    loop {
        let el = t0.elapsed();
        if mark.is_none() && el >= WARMUP {
            // SAFETY: the fake driver's hook, called with its prototype.
            mark = Some((Instant::now(), unsafe { busy(0) }));
        }
        if el >= WARMUP + seconds {
            break;
        }
        // SAFETY: the launch's arguments are valid for the fake driver:
        // params[0] points to a live u64, the stream is the NULL stream.
        let rc = unsafe {
            launch(
                func,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        cu.check("cuLaunchKernel", rc)?;
        launches += 1;
        if launches.is_multiple_of(8) {
            // SAFETY: a plain driver call.
            cu.check("cuCtxSynchronize", unsafe { sync() })?;
        }
    }
    // SAFETY: as above.
    cu.check("cuCtxSynchronize", unsafe { sync() })?;
    let (m, b0) = mark.ok_or("no time measured")?;
    // SAFETY: as above.
    let gpu_ns = unsafe { busy(0) }.saturating_sub(b0);
    let wall = m.elapsed().as_secs_f64();
    let got = 100.0 * gpu_ns as f64 / 1e9 / wall;
    let target = match share_percent() {
        Some(p) => format!("compute share {p}%"),
        None => "no compute share".into(),
    };
    println!(
        "{}slice {} ({target}): got {got:.1}% of the GPU's time over {wall:.1} s ({:.2} s of kernels)",
        cu.mark,
        slice_name(),
        gpu_ns as f64 / 1e9
    );
    Ok(())
}
