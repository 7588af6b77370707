//! Per-process device memory, as NVML's `nvmlDeviceGetComputeRunningProcesses`
//! reports it: every live process with memory on the device, each with
//! everything the driver holds for it (allocations, contexts, modules,
//! limits — see `cuda/resident.rs`), read from what each process publishes
//! (`memory::processes`). A MIG handle lists what lies in its instance.

use super::*;

fn list(t: &Target) -> Vec<(u32, u64)> {
    let gi = t.mig().map(|m| m.gi);
    memory::processes(t.gpu().info.minor, gi)
        .into_iter()
        .collect()
}

/// The NVML size protocol: with too small a buffer (or none), the count
/// needed is written and INSUFFICIENT_SIZE returned.
///
/// # Safety
/// `count` null or valid; `infos` null or valid for `*count` records.
unsafe fn fill_infos<T>(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(&Target, u32, u64) -> T,
) -> NvmlReturn {
    with_device(device, |t| {
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let procs = list(t);
        // SAFETY: count checked non-null; caller contract.
        let room = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = procs.len() as c_uint };
        if room < procs.len() {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        if infos.is_null() && !procs.is_empty() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        for (i, &(pid, used)) in procs.iter().enumerate() {
            // SAFETY: i < room records, per the caller's contract.
            unsafe { infos.add(i).write(make(t, pid, used)) };
        }
        Ok(())
    })
}

fn info(t: &Target, pid: u32, used: u64) -> NvmlProcessInfo {
    let (gi, ci) = t.mig().map_or((u32::MAX, u32::MAX), |m| (m.gi, m.ci));
    NvmlProcessInfo {
        pid,
        used_gpu_memory: used,
        gpu_instance_id: gi,
        compute_instance_id: ci,
    }
}

/// # Safety
/// See [`fill_infos`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { fill_infos(device, count, infos, info) }
}

/// # Safety
/// See [`fill_infos`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: the same record layout and contract as _v3.
    unsafe { nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos) }
}

/// # Safety
/// See [`fill_infos`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfoV1,
) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe {
        fill_infos(device, count, infos, |_, pid, used| NvmlProcessInfoV1 {
            pid,
            used_gpu_memory: used,
        })
    }
}
