//! `nvmlDeviceSetMemoryLimits_v1` / `nvmlDeviceGetMemoryLimits_v1` (R615+;
//! see `crate::partitions`): `NVML_ERROR_FUNCTION_NOT_FOUND` when the fake
//! host poses as an older driver.

use super::*;
use crate::partitions;

/// # Safety
/// `limits` null or a valid `nvmlSetMemoryLimits_v1_t` whose `nameSpace` is
/// null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLimits_v1(
    device: NvmlDevice,
    limits: *const NvmlSetMemoryLimitsV1,
) -> NvmlReturn {
    if !partitions::supported() {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    with_device(device, |t| {
        if limits.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: caller contract.
        let l = unsafe { &*limits };
        if l.name_space.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if t.mig().is_some() {
            return Err(NVML_ERROR_NOT_SUPPORTED); // not on MIG
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(NVML_ERROR_NO_PERMISSION);
        }
        // SAFETY: NUL-terminated per the contract.
        let path = unsafe { CStr::from_ptr(l.name_space) }.to_string_lossy();
        if !path.starts_with('/') || (l.hard_limit != 0 && l.soft_limit > l.hard_limit) {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        partitions::set(t.gpu().info.minor, &path, l.soft_limit, l.hard_limit)
            .map_err(|_| NVML_ERROR_UNKNOWN)
    })
}

/// # Safety
/// `limits` null or a valid `nvmlGetMemoryLimits_v1_t` whose `nameSpace` is
/// null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryLimits_v1(
    device: NvmlDevice,
    limits: *mut NvmlGetMemoryLimitsV1,
) -> NvmlReturn {
    if !partitions::supported() {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    with_device(device, |t| {
        if limits.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: caller contract.
        let l = unsafe { &mut *limits };
        if l.name_space.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if t.mig().is_some() {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: NUL-terminated per the contract.
        let path = unsafe { CStr::from_ptr(l.name_space) }.to_string_lossy();
        let minor = t.gpu().info.minor;
        let found = partitions::limits(minor)
            .into_iter()
            .find(|x| x.path == path)
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        l.soft_limit = found.soft;
        l.hard_limit = found.hard;
        l.current_used = memory::cgroup_usage(minor, &path);
        Ok(())
    })
}
