//! `fakegpu-probe [--alloc BYTES] [--nvml] [--lib PATH] [--nvml-lib PATH]`
//!
//! Loads `libcuda.so.1` (through the dynamic loader, so `LD_LIBRARY_PATH`
//! picks the fake or real driver), calls `cuInit` and enumerates devices,
//! and prints a `fakegpu::ProbeReport` as JSON. Works against a real driver
//! too. Exit status 0 whenever a report was printed, 2 when the library
//! could not be loaded.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::time::Instant;

use fakegpu::{format_uuid, ProbeAlloc, ProbeDevice, ProbeNvml, ProbeReport};
use libloading::{Library, Symbol};

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;
type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
type CuDeviceGetPciBusId = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuPrimaryCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type CuCtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> c_int;
type CuMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;
type CuMemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
type CuGetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;
type NvmlInit = unsafe extern "C" fn() -> c_uint;
type NvmlGetCount = unsafe extern "C" fn(*mut c_uint) -> c_uint;
type NvmlGetHandle = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_uint;
type NvmlGetUuid = unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_uint;

struct Args {
    alloc: Option<u64>,
    nvml: bool,
    lib: String,
    nvml_lib: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        alloc: None,
        nvml: false,
        lib: "libcuda.so.1".into(),
        nvml_lib: "libnvidia-ml.so.1".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--alloc" => args.alloc = Some(value()?.parse().map_err(|e| format!("--alloc: {e}"))?),
            "--nvml" => args.nvml = true,
            "--lib" => args.lib = value()?,
            "--nvml-lib" => args.nvml_lib = value()?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// Looks a symbol up, or fails with its name.
///
/// # Safety
/// `T` must be the symbol's real type.
unsafe fn sym<'l, T>(lib: &'l Library, name: &str) -> Result<Symbol<'l, T>, String> {
    // SAFETY: forwarded contract on T.
    unsafe { lib.get(name.as_bytes()) }.map_err(|e| format!("{name}: {e}"))
}

fn c_text(buf: &[c_char]) -> String {
    // SAFETY: every buffer passed here is zero-initialised and the driver
    // writes a NUL-terminated string into it, so a NUL is always present.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn device(lib: &Library, ordinal: c_int) -> Result<ProbeDevice, String> {
    // SAFETY: the types are those of cuda.h; every out-pointer is a live
    // local of the right size, and buffer lengths are the buffers' own.
    unsafe {
        let mut dev = 0;
        sym::<CuDeviceGet>(lib, "cuDeviceGet")?(&mut dev, ordinal);
        let mut name = [0 as c_char; 256];
        sym::<CuDeviceGetName>(lib, "cuDeviceGetName")?(name.as_mut_ptr(), 256, dev);
        let mut uuid = [0u8; 16];
        sym::<CuDeviceGetUuid>(lib, "cuDeviceGetUuid_v2")?(&mut uuid, dev);
        let mut bus = [0 as c_char; 32];
        sym::<CuDeviceGetPciBusId>(lib, "cuDeviceGetPCIBusId")?(bus.as_mut_ptr(), 32, dev);
        let mut total = 0usize;
        sym::<CuDeviceTotalMem>(lib, "cuDeviceTotalMem_v2")?(&mut total, dev);
        let name = c_text(&name);
        let prefix = if name.contains(" MIG ") { "MIG" } else { "GPU" };
        Ok(ProbeDevice {
            ordinal,
            uuid: format_uuid(prefix, &uuid),
            name,
            pci_bus_id: c_text(&bus),
            total_mem: total as u64,
        })
    }
}

fn proc_address_ok(lib: &Library) -> Result<bool, String> {
    // SAFETY: cuda.h types; out-pointers are live locals.
    unsafe {
        let get = sym::<CuGetProcAddress>(lib, "cuGetProcAddress_v2")?;
        let mut pfn = std::ptr::null_mut();
        let mut status = -1;
        let rc = get(c"cuMemAlloc".as_ptr(), &mut pfn, 13000, 0, &mut status);
        let direct = sym::<CuMemAlloc>(lib, "cuMemAlloc_v2")?;
        Ok(rc == 0 && status == 0 && pfn == *direct as *mut c_void)
    }
}

fn alloc(lib: &Library, bytes: u64) -> Result<ProbeAlloc, String> {
    // SAFETY: cuda.h types; out-pointers are live locals.
    unsafe {
        let mut ctx = std::ptr::null_mut();
        sym::<CuPrimaryCtxRetain>(lib, "cuDevicePrimaryCtxRetain")?(&mut ctx, 0);
        sym::<CuCtxSetCurrent>(lib, "cuCtxSetCurrent")?(ctx);
        let info = sym::<CuMemGetInfo>(lib, "cuMemGetInfo_v2")?;
        let (mut free_before, mut total) = (0usize, 0usize);
        info(&mut free_before, &mut total);
        let mut ptr = 0u64;
        let rc = sym::<CuMemAlloc>(lib, "cuMemAlloc_v2")?(&mut ptr, bytes as usize);
        let mut free_after = 0usize;
        info(&mut free_after, &mut total);
        Ok(ProbeAlloc {
            bytes,
            rc,
            free_before: free_before as u64,
            free_after: free_after as u64,
            total: total as u64,
        })
    }
}

fn nvml(path: &str) -> Result<ProbeNvml, String> {
    // SAFETY: loading a library runs its initialisers; the fake and the real
    // NVML have none that matter here.
    let lib = unsafe { Library::new(path) }.map_err(|e| format!("{path}: {e}"))?;
    // SAFETY: nvml.h types; out-pointers are live locals, buffer lengths
    // are the buffers' own.
    unsafe {
        let init_rc = sym::<NvmlInit>(&lib, "nvmlInit_v2")?();
        let mut report = ProbeNvml {
            init_rc,
            count: 0,
            uuids: Vec::new(),
        };
        if init_rc != 0 {
            return Ok(report);
        }
        sym::<NvmlGetCount>(&lib, "nvmlDeviceGetCount_v2")?(&mut report.count);
        let by_index = sym::<NvmlGetHandle>(&lib, "nvmlDeviceGetHandleByIndex_v2")?;
        let get_uuid = sym::<NvmlGetUuid>(&lib, "nvmlDeviceGetUUID")?;
        for i in 0..report.count {
            let mut handle = std::ptr::null_mut();
            by_index(i, &mut handle);
            let mut buf = [0 as c_char; 96];
            get_uuid(handle, buf.as_mut_ptr(), 96);
            report.uuids.push(c_text(&buf));
        }
        Ok(report)
    }
}

fn probe(args: &Args) -> Result<ProbeReport, String> {
    // SAFETY: as in `nvml`.
    let lib = unsafe { Library::new(&args.lib) }.map_err(|e| format!("{}: {e}", args.lib))?;
    let started = Instant::now();
    // SAFETY: cuda.h type.
    let init_rc = unsafe { sym::<CuInit>(&lib, "cuInit")?(0) };
    let init_us = started.elapsed().as_micros() as u64;
    let mut count = 0;
    if init_rc == 0 {
        // SAFETY: cuda.h type; out-pointer is a live local.
        unsafe { sym::<CuDeviceGetCount>(&lib, "cuDeviceGetCount")?(&mut count) };
    }
    let devices = (0..count)
        .map(|i| device(&lib, i))
        .collect::<Result<_, _>>()?;
    let alloc = match args.alloc {
        Some(bytes) if count > 0 => Some(alloc(&lib, bytes)?),
        _ => None,
    };
    Ok(ProbeReport {
        pid: std::process::id(),
        init_rc,
        init_us,
        count,
        devices,
        proc_address_ok: proc_address_ok(&lib).ok(),
        alloc,
        nvml: if args.nvml {
            Some(nvml(&args.nvml_lib)?)
        } else {
            None
        },
    })
}

fn main() {
    let report = parse_args().and_then(|args| probe(&args));
    match report {
        Ok(report) => match serde_json::to_string(&report) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("fakegpu-probe: {e}");
                std::process::exit(2);
            }
        },
        Err(e) => {
            eprintln!("fakegpu-probe: {e}");
            std::process::exit(2);
        }
    }
}
