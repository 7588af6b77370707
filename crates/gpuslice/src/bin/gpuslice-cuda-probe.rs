//! CUDA start-up probe: loads libcuda at run time (no CUDA needed to build)
//! and times, in one process, dlopen, cuInit, cuDeviceGetCount, primary
//! context retain + set current, and a first 1 MiB allocation. Prints one
//! JSON line. Used by `gpuslice bench init` and by the isolation tests.
//!
//! `--ignore-visible-devices` unsets CUDA_VISIBLE_DEVICES first, playing a
//! process that ignores the hint: the isolation tests use it to show what
//! the kernel layers enforce on their own.

use libloading::{Library, Symbol};
use serde_json::{json, Map, Value};
use std::os::raw::{c_char, c_int, c_uint, c_void};
use std::time::Instant;

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type CuCtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> c_int;
type CuMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;
type CuMemFree = unsafe extern "C" fn(u64) -> c_int;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--ignore-visible-devices") {
        std::env::remove_var("CUDA_VISIBLE_DEVICES");
    }
    let lib_name = args
        .iter()
        .position(|a| a == "--lib")
        .and_then(|i| args.get(i + 1))
        .map_or("libcuda.so.1", String::as_str);
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
    let lib = match unsafe { Library::new(lib_name) } {
        Ok(l) => l,
        Err(e) => {
            out.insert(
                "error".into(),
                json!(format!("cannot load {lib_name}: {e}")),
            );
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
fn sym<'l, T>(lib: &'l Library, name: &str) -> Result<Symbol<'l, T>, String> {
    // SAFETY: each type alias above matches the symbol's prototype in cuda.h.
    unsafe { lib.get(name.as_bytes()) }.map_err(|e| format!("{name}: {e}"))
}

fn run_phases(lib: &Library, out: &mut Map<String, Value>) -> Result<(), String> {
    let cu_init: Symbol<CuInit> = sym(lib, "cuInit")?;
    let t = Instant::now();
    // SAFETY: cuInit takes flags by value.
    let rc = unsafe { cu_init(0) };
    out.insert("init_ms".into(), json!(ms(t)));
    out.insert("init_rc".into(), json!(rc));
    if rc != 0 {
        out.insert("count".into(), json!(0));
        return Ok(());
    }

    let get_count: Symbol<CuDeviceGetCount> = sym(lib, "cuDeviceGetCount")?;
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

    let device_get: Symbol<CuDeviceGet> = sym(lib, "cuDeviceGet")?;
    let retain: Symbol<CuCtxRetain> = sym(lib, "cuDevicePrimaryCtxRetain")?;
    let set_current: Symbol<CuCtxSetCurrent> = sym(lib, "cuCtxSetCurrent")?;
    let mut dev: c_int = 0;
    let mut ctx: *mut c_void = std::ptr::null_mut();
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

    let alloc: Symbol<CuMemAlloc> = sym(lib, "cuMemAlloc_v2")?;
    let free: Symbol<CuMemFree> = sym(lib, "cuMemFree_v2")?;
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

fn names(lib: &Library, count: c_int) -> Result<Vec<String>, String> {
    let get_name: Symbol<CuDeviceGetName> = sym(lib, "cuDeviceGetName")?;
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
