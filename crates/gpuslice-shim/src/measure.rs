//! What the driver really holds for this process on a device, as NVML's
//! per-process accounting reports it (`nvmlDeviceGetComputeRunningProcesses`,
//! the figure the host's `nvidia-smi` sums): allocations, the context,
//! modules, stack/heap limits and local memory the driver grew.
//!
//! NVML is opened privately (`dlopen` + the real `dlsym`), only when a
//! figure is first needed (a refusal or a memory query, never the first
//! allocation: `nvmlInit` costs milliseconds). The process is found by
//! every pid `/proc/self/status` gives it (`NSpid`: NVML reports host pids;
//! a pid namespace whose `/proc` hides the host pid leaves it unmeasured,
//! and the shim keeps its estimates).

use std::ffi::{c_int, c_uint, c_void, CString};
use std::sync::OnceLock;

use gpuslice_ledger::MAX_DEVICES;

use crate::config::NvmlMatch;
use crate::cuda::NvmlDevice;
use crate::sys;

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_INSUFFICIENT_SIZE: c_int = 7;

/// `nvmlProcessInfo_t` (v2 layout, used by `_v2` and `_v3`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used: u64,
    gpu_instance: c_uint,
    compute_instance: c_uint,
}

type Processes = unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut ProcessInfo) -> c_int;

struct Nvml {
    processes: Processes,
    devices: Vec<Option<NvmlDevice>>,
    pids: Vec<u32>,
}

// SAFETY: NVML handles are process-wide tokens, usable from any thread.
unsafe impl Send for Nvml {}
// SAFETY: as above; NVML is thread-safe.
unsafe impl Sync for Nvml {}

static NVML: OnceLock<Option<Nvml>> = OnceLock::new();

fn sym(lib: *mut c_void, name: &str) -> Option<*mut c_void> {
    let name = CString::new(name).ok()?;
    let p = sys::real_dlsym(lib, &name);
    (!p.is_null() && !sys::is_ours(p)).then_some(p)
}

/// Every pid this process has, outermost namespace first (`NSpid`).
fn own_pids() -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("NSpid:")).map(|v| {
                v.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default();
    pids.push(std::process::id());
    pids
}

fn open(matches: &[NvmlMatch]) -> Option<Nvml> {
    // SAFETY: dlopen of the NVML library by soname; RTLD_LOCAL keeps its
    // symbols out of the global scope.
    let lib = unsafe {
        libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if lib.is_null() {
        return None;
    }
    type Init = unsafe extern "C" fn() -> c_int;
    type ByUuid = unsafe extern "C" fn(*const i8, *mut NvmlDevice) -> c_int;
    type ByIndex = unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> c_int;
    // SAFETY: the NVML signatures of these names (nvml.h).
    let (init, by_uuid, by_index, processes) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Init>(sym(lib, "nvmlInit_v2")?),
            std::mem::transmute::<*mut c_void, ByUuid>(sym(lib, "nvmlDeviceGetHandleByUUID")?),
            std::mem::transmute::<*mut c_void, ByIndex>(sym(lib, "nvmlDeviceGetHandleByIndex_v2")?),
            std::mem::transmute::<*mut c_void, Processes>(
                sym(lib, "nvmlDeviceGetComputeRunningProcesses_v3")
                    .or_else(|| sym(lib, "nvmlDeviceGetComputeRunningProcesses_v2"))?,
            ),
        )
    };
    // SAFETY: plain NVML call.
    if unsafe { init() } != NVML_SUCCESS {
        return None;
    }
    let devices = matches
        .iter()
        .take(MAX_DEVICES)
        .map(|m| {
            let mut h: NvmlDevice = std::ptr::null_mut();
            let rc = match m {
                NvmlMatch::Uuid(u) => {
                    let u = CString::new(u.as_str()).ok()?;
                    // SAFETY: NUL-terminated UUID, valid out-pointer.
                    unsafe { by_uuid(u.as_ptr(), &mut h) }
                }
                // SAFETY: valid out-pointer.
                NvmlMatch::Index(i) => unsafe { by_index(*i, &mut h) },
            };
            (rc == NVML_SUCCESS).then_some(h)
        })
        .collect();
    Some(Nvml {
        processes,
        devices,
        pids: own_pids(),
    })
}

/// Bytes NVML says this process holds on ledger device `dev`; None when
/// NVML, the device or this process cannot be found there.
pub fn process_used(matches: &[NvmlMatch], dev: usize) -> Option<u64> {
    let nvml = NVML.get_or_init(|| open(matches)).as_ref()?;
    let handle = (*nvml.devices.get(dev)?)?;
    let mut buf = vec![ProcessInfo::default(); 64];
    loop {
        let mut count = buf.len() as c_uint;
        // SAFETY: `count` records of room in `buf`.
        let rc = unsafe { (nvml.processes)(handle, &mut count, buf.as_mut_ptr()) };
        match rc {
            NVML_SUCCESS => {
                buf.truncate(count as usize);
                break;
            }
            NVML_ERROR_INSUFFICIENT_SIZE if (count as usize) > buf.len() && count < 65536 => {
                buf.resize(count as usize, ProcessInfo::default());
            }
            _ => return None,
        }
    }
    let mine = buf.iter().filter(|p| nvml.pids.contains(&p.pid));
    // NVML_VALUE_NOT_AVAILABLE (u64::MAX) where the driver hides the figure.
    let figures: Vec<u64> = mine.map(|p| p.used).collect();
    if figures.is_empty() {
        // Not listed: holds nothing there, if the pids listed are ones we
        // can see (same pid namespace); else NVML's pids are not ours to
        // compare and nothing is known.
        let visible = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
        return (buf.is_empty() || buf.iter().any(|p| visible(p.pid))).then_some(0);
    }
    figures
        .iter()
        .all(|&u| u != u64::MAX)
        .then(|| figures.iter().sum())
}
