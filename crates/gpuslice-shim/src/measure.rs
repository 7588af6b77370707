//! What the driver really holds for this process on a device, as NVML's
//! per-process accounting reports it (`nvmlDeviceGetComputeRunningProcesses`,
//! the figure the host's `nvidia-smi` sums): allocations, the context,
//! modules, stack/heap limits and local memory the driver grew.
//!
//! NVML is opened privately (`dlopen` + the real `dlsym`), only when a
//! figure is first needed (a refusal or a memory query, never the first
//! allocation: `nvmlInit` costs milliseconds). The process is found by
//! [`our_pid`]: its own pid where the driver reports pids in the caller's
//! PID namespace (driver 580), else its host pid: the slice's host-pid
//! resolver's answer, else the outermost `NSpid`, else `getpid()`
//! ([`gpuslice_ledger::hostpid`]). When the resolver does not answer,
//! nothing is measured and the shim keeps its estimates.

use std::ffi::{c_uint, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use gpuslice_ledger::hostpid::{self, HostPid};
use gpuslice_ledger::MAX_DEVICES;

use crate::config::NvmlMatch;
use crate::cuda::{
    nvml_pfn, NvmlDevice, NvmlProcessInfo, NVML_ERROR_INSUFFICIENT_SIZE, NVML_SUCCESS,
};
use crate::sys;

struct Nvml {
    /// `_v3`, else `_v2`: the same `nvmlProcessInfo_t` records.
    processes: nvml_pfn::DeviceGetComputeRunningProcesses,
    devices: Vec<Option<NvmlDevice>>,
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

/// This process's host pid (resolved once per process, again in a forked
/// child); None when the slice's resolver fails (said once on stderr with
/// `GPUSLICE_LOG`).
fn host_pid() -> Option<HostPid> {
    static SAID: AtomicBool = AtomicBool::new(false);
    match hostpid::host_pid() {
        Ok(h) => Some(h),
        Err(e) => {
            if crate::state::shim().log && !SAID.swap(true, Ordering::Relaxed) {
                crate::sys::log_line(&format!("{e}; memory stays estimated, not measured"));
            }
            None
        }
    }
}

fn open(matches: &[NvmlMatch]) -> Option<Nvml> {
    // The NVML library by soname; RTLD_LOCAL keeps its symbols out of the
    // global scope.
    let lib = sys::real_dlopen(
        c"libnvidia-ml.so.1".as_ptr(),
        libc::RTLD_NOW | libc::RTLD_LOCAL,
    );
    if lib.is_null() {
        return None;
    }
    use nvml_pfn::{
        DeviceGetComputeRunningProcesses as Processes, DeviceGetHandleByIndex as ByIndex,
        DeviceGetHandleByUuid as ByUuid, Init,
    };
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
    Some(Nvml { processes, devices })
}

/// Bytes NVML says this process holds on ledger device `dev`; None when
/// NVML, the device or this process cannot be found there.
pub fn process_used(matches: &[NvmlMatch], dev: usize) -> Option<u64> {
    let me = host_pid()?;
    let nvml = NVML.get_or_init(|| open(matches)).as_ref()?;
    let handle = (*nvml.devices.get(dev)?)?;
    let mut buf = vec![NvmlProcessInfo::default(); 64];
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
                buf.resize(count as usize, NvmlProcessInfo::default());
            }
            _ => return None,
        }
    }
    let visible = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    let listed: Vec<u32> = buf.iter().map(|p| p.pid).collect();
    let ours = our_pid(&listed, me, std::process::id(), visible)?;
    // NVML_VALUE_NOT_AVAILABLE (u64::MAX) where the driver hides the figure.
    let figures: Vec<u64> = buf
        .iter()
        .filter(|p| p.pid == ours)
        .map(|p| p.used_gpu_memory)
        .collect();
    if figures.is_empty() {
        return Some(0); // not listed: holds nothing there
    }
    figures
        .iter()
        .all(|&u| u != u64::MAX)
        .then(|| figures.iter().sum())
}

/// Which of NVML's pids is this process, or None when that cannot be told.
///
/// Drivers differ: some report host pids whatever the caller's PID
/// namespace; driver 580 reports them in the caller's namespace (on the
/// H200 a slice's process saw itself as pid 2:
/// bench/results/nvml-pidns-*.json). A driver that translates lists only
/// pids our `/proc` shows, so then ours is `getpid()`; otherwise it is the
/// host pid. An inexact host pid (`getpid()` in a namespace of unknown
/// depth: a container without a resolver) is trusted only when the list
/// shows it speaks our namespace, else a host process with our inner number
/// would be taken for us.
fn our_pid(listed: &[u32], me: HostPid, getpid: u32, visible: impl Fn(u32) -> bool) -> Option<u32> {
    let in_our_namespace = !listed.is_empty() && listed.iter().all(|&p| p == getpid || visible(p));
    if in_our_namespace && listed.contains(&getpid) {
        return Some(getpid);
    }
    if me.exact || listed.is_empty() || listed.iter().any(|&p| p != me.pid && visible(p)) {
        return Some(me.pid);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: HostPid = HostPid {
        pid: 4939,
        exact: true,
    };

    #[test]
    fn a_driver_that_translates_pids_is_matched_by_our_own_pid() {
        // Driver 580 in a PID namespace: ourselves as pid 2, visible.
        assert_eq!(our_pid(&[2], HOST, 2, |p| p == 2 || p == 1), Some(2));
        assert_eq!(our_pid(&[7, 2], HOST, 2, |p| p < 10), Some(2));
    }

    #[test]
    fn a_driver_that_reports_host_pids_is_matched_by_the_host_pid() {
        // Host pids our /proc cannot show: never our inner number.
        assert_eq!(
            our_pid(&[4939, 2], HOST, 2, |p| p < 10 && p != 2),
            Some(4939)
        );
        assert_eq!(our_pid(&[4939], HOST, 2, |p| p < 10), Some(4939));
        // In the host's namespace both are one.
        assert_eq!(our_pid(&[4939, 100], HOST, 4939, |_| true), Some(4939));
    }

    #[test]
    fn an_inexact_pid_is_trusted_only_when_the_list_speaks_our_namespace() {
        let guess = HostPid {
            pid: 2,
            exact: false,
        };
        // Host pids we cannot see: a host process numbered 2 is not us.
        assert_eq!(our_pid(&[2, 4939], guess, 2, |p| p < 10 && p != 2), None);
        // Pids we can see: ours is ours.
        assert_eq!(our_pid(&[2, 5], guess, 2, |p| p < 10), Some(2));
        assert_eq!(our_pid(&[], guess, 2, |_| false), Some(2));
    }
}
