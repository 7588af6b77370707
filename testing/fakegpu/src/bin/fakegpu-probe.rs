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
use gpuslice_cuda_abi::cuda::{self, pfn, CU_GET_PROC_ADDRESS_DEFAULT};
use gpuslice_cuda_abi::nvml::{self, pfn as nvml_pfn, NVML_DEVICE_UUID_V2_BUFFER_SIZE};
use gpuslice_cuda_load::Lib;

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
        lib: cuda::LIBCUDA.into(),
        nvml_lib: nvml::LIBNVIDIA_ML.into(),
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

fn c_text(buf: &[c_char]) -> String {
    // SAFETY: every buffer passed here is zero-initialised and the driver
    // writes a NUL-terminated string into it, so a NUL is always present.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn device(lib: &Lib, ordinal: c_int) -> Result<ProbeDevice, String> {
    // SAFETY: the types are those of cuda.h; every out-pointer is a live
    // local of the right size, and buffer lengths are the buffers' own.
    unsafe {
        let mut dev = 0;
        lib.sym::<pfn::DeviceGet>("cuDeviceGet")?(&mut dev, ordinal);
        let mut name = [0 as c_char; 256];
        lib.sym::<pfn::DeviceGetName>("cuDeviceGetName")?(name.as_mut_ptr(), 256, dev);
        let mut uuid = [0u8; 16];
        lib.sym::<pfn::DeviceGetUuid>("cuDeviceGetUuid_v2")?(&mut uuid, dev);
        let mut bus = [0 as c_char; 32];
        lib.sym::<pfn::DeviceGetPciBusId>("cuDeviceGetPCIBusId")?(bus.as_mut_ptr(), 32, dev);
        let mut total = 0usize;
        lib.sym::<pfn::DeviceTotalMem>("cuDeviceTotalMem_v2")?(&mut total, dev);
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

fn proc_address_ok(lib: &Lib) -> Result<bool, String> {
    // SAFETY: cuda.h types; out-pointers are live locals.
    unsafe {
        let get = lib.sym::<pfn::GetProcAddress>("cuGetProcAddress_v2")?;
        let mut found = std::ptr::null_mut();
        let mut status = -1;
        let rc = get(
            c"cuMemAlloc".as_ptr(),
            &mut found,
            13000,
            CU_GET_PROC_ADDRESS_DEFAULT,
            &mut status,
        );
        let direct = lib.sym::<pfn::MemAlloc>("cuMemAlloc_v2")?;
        Ok(rc == 0 && status == 0 && found == *direct as *mut c_void)
    }
}

fn alloc(lib: &Lib, bytes: u64) -> Result<ProbeAlloc, String> {
    // SAFETY: cuda.h types; out-pointers are live locals.
    unsafe {
        let mut ctx = std::ptr::null_mut();
        lib.sym::<pfn::DevicePrimaryCtxRetain>("cuDevicePrimaryCtxRetain")?(&mut ctx, 0);
        lib.sym::<pfn::CtxSetCurrent>("cuCtxSetCurrent")?(ctx);
        let info = lib.sym::<pfn::MemGetInfo>("cuMemGetInfo_v2")?;
        let (mut free_before, mut total) = (0usize, 0usize);
        info(&mut free_before, &mut total);
        let mut ptr = 0u64;
        let rc = lib.sym::<pfn::MemAlloc>("cuMemAlloc_v2")?(&mut ptr, bytes as usize);
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
    let lib = unsafe { Lib::open(path) }?;
    // SAFETY: nvml.h types; out-pointers are live locals, buffer lengths
    // are the buffers' own.
    unsafe {
        let init_rc = lib.sym::<nvml_pfn::Init>("nvmlInit_v2")?();
        let mut report = ProbeNvml {
            init_rc,
            count: 0,
            uuids: Vec::new(),
        };
        if init_rc != 0 {
            return Ok(report);
        }
        lib.sym::<nvml_pfn::DeviceGetCount>("nvmlDeviceGetCount_v2")?(&mut report.count);
        let by_index =
            lib.sym::<nvml_pfn::DeviceGetHandleByIndex>("nvmlDeviceGetHandleByIndex_v2")?;
        let get_uuid = lib.sym::<nvml_pfn::DeviceGetUuid>("nvmlDeviceGetUUID")?;
        for i in 0..report.count {
            let mut handle = std::ptr::null_mut();
            by_index(i, &mut handle);
            let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
            get_uuid(handle, buf.as_mut_ptr(), buf.len() as c_uint);
            report.uuids.push(c_text(&buf));
        }
        Ok(report)
    }
}

fn probe(args: &Args) -> Result<ProbeReport, String> {
    // SAFETY: as in `nvml`.
    let lib = unsafe { Lib::open(&args.lib) }?;
    let started = Instant::now();
    // SAFETY: cuda.h type.
    let init_rc = unsafe { lib.sym::<pfn::Init>("cuInit")?(0) };
    let init_us = started.elapsed().as_micros() as u64;
    let mut count = 0;
    if init_rc == 0 {
        // SAFETY: cuda.h type; out-pointer is a live local.
        unsafe { lib.sym::<pfn::DeviceGetCount>("cuDeviceGetCount")?(&mut count) };
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
