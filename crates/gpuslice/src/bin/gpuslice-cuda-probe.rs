//! CUDA start-up probe: loads libcuda at run time (no CUDA needed to build)
//! and times, in one process, dlopen, cuInit, cuDeviceGetCount, primary
//! context retain + set current, and a first 1 MiB allocation. Prints one
//! JSON line. Used by `gpuslice bench init` and by the isolation tests.
//!
//! `--ignore-visible-devices` unsets CUDA_VISIBLE_DEVICES first, playing a
//! process that ignores the hint: the isolation tests use it to show what
//! the kernel layers enforce on their own.

use gpuslice_cuda_abi::cuda::{pfn, CUcontext, CUdevice, LIBCUDA};
use gpuslice_cuda_load::{Lib, Symbol};
use serde_json::{json, Map, Value};
use std::os::raw::{c_char, c_int};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--ignore-visible-devices") {
        std::env::remove_var(gpuslice_ledger::limits::ENV_CUDA_VISIBLE);
    }
    let lib_name = args
        .iter()
        .position(|a| a == "--lib")
        .and_then(|i| args.get(i + 1))
        .map_or(LIBCUDA, String::as_str);
    let out = probe(lib_name);
    println!("{}", Value::Object(out));
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn probe(lib_name: &str) -> Map<String, Value> {
    let mut out = Map::new();
    let start = Instant::now();
    let t = Instant::now();
    // SAFETY: loading the CUDA driver runs its initialisers, which is what
    // we are here to measure; it is the system's own driver library.
    let lib = match unsafe { Lib::open(lib_name) } {
        Ok(l) => l,
        Err(e) => {
            out.insert("error".into(), json!(e.to_string()));
            return out;
        }
    };
    out.insert("dlopen_ms".into(), json!(ms(t)));
    if let Err(e) = run_phases(&lib, &mut out) {
        out.insert("error".into(), json!(e));
    }
    out.insert("total_ms".into(), json!(ms(start)));
    out
}

/// Look up `name` in the driver.
fn sym<'l, T>(lib: &'l Lib, name: &str) -> Result<Symbol<'l, T>, String> {
    // SAFETY: every caller names the `pfn` prototype of `name` (cuda.h).
    Ok(unsafe { lib.sym(name) }?)
}

fn run_phases(lib: &Lib, out: &mut Map<String, Value>) -> Result<(), String> {
    let cu_init: Symbol<pfn::Init> = sym(lib, "cuInit")?;
    let t = Instant::now();
    // SAFETY: cuInit takes flags by value.
    let rc = unsafe { cu_init(0) };
    out.insert("init_ms".into(), json!(ms(t)));
    out.insert("init_rc".into(), json!(rc));
    if rc != 0 {
        out.insert("count".into(), json!(0));
        return Ok(());
    }

    let get_count: Symbol<pfn::DeviceGetCount> = sym(lib, "cuDeviceGetCount")?;
    let mut count: c_int = 0;
    let t = Instant::now();
    // SAFETY: count is a valid out pointer.
    let rc = unsafe { get_count(&mut count) };
    out.insert("count_ms".into(), json!(ms(t)));
    out.insert("count_rc".into(), json!(rc));
    out.insert("count".into(), json!(count));
    if rc != 0 || count == 0 {
        return Ok(());
    }
    out.insert("names".into(), json!(names(lib, count)?));

    let device_get: Symbol<pfn::DeviceGet> = sym(lib, "cuDeviceGet")?;
    let retain: Symbol<pfn::DevicePrimaryCtxRetain> = sym(lib, "cuDevicePrimaryCtxRetain")?;
    let set_current: Symbol<pfn::CtxSetCurrent> = sym(lib, "cuCtxSetCurrent")?;
    let mut dev: CUdevice = 0;
    let mut ctx: CUcontext = std::ptr::null_mut();
    let t = Instant::now();
    // SAFETY: valid out pointers; the context handle comes from the driver.
    let rc = unsafe {
        let mut rc = device_get(&mut dev, 0);
        if rc == 0 {
            rc = retain(&mut ctx, dev);
        }
        if rc == 0 {
            rc = set_current(ctx);
        }
        rc
    };
    out.insert("ctx_ms".into(), json!(ms(t)));
    out.insert("ctx_rc".into(), json!(rc));
    if rc != 0 {
        return Ok(());
    }

    let alloc: Symbol<pfn::MemAlloc> = sym(lib, "cuMemAlloc_v2")?;
    let free: Symbol<pfn::MemFree> = sym(lib, "cuMemFree_v2")?;
    let mut ptr: u64 = 0;
    let t = Instant::now();
    // SAFETY: valid out pointer; the pointer is freed right after.
    let rc = unsafe { alloc(&mut ptr, 1 << 20) };
    out.insert("alloc_ms".into(), json!(ms(t)));
    out.insert("alloc_rc".into(), json!(rc));
    if rc == 0 {
        // SAFETY: ptr came from cuMemAlloc_v2 above.
        unsafe { free(ptr) };
    }
    Ok(())
}

fn names(lib: &Lib, count: c_int) -> Result<Vec<String>, String> {
    let get_name: Symbol<pfn::DeviceGetName> = sym(lib, "cuDeviceGetName")?;
    let mut names = Vec::new();
    for i in 0..count {
        let mut buf = [0 as c_char; 128];
        // SAFETY: buf holds 128 bytes and the driver NUL-terminates.
        let rc = unsafe { get_name(buf.as_mut_ptr(), buf.len() as c_int, i) };
        if rc == 0 {
            // SAFETY: NUL-terminated by the driver, within buf.
            let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
            names.push(s.to_string_lossy().into_owned());
        }
    }
    Ok(names)
}
