//! `nvmlDeviceSetMemoryLimits_v1` / `nvmlDeviceGetMemoryLimits_v1` (R615+;
//! see `crate::partitions`): `NVML_ERROR_FUNCTION_NOT_FOUND` when the fake
//! host poses as an older driver.

use super::*;
use crate::partitions;

/// What both calls check first, in this order: a driver with partitions,
/// the device, a struct, its `nameSpace`, a GPU not in MIG mode (not on
/// MIG). Then `f` with the target, the struct and the namespace's path.
///
/// # Safety
/// `name_space(l)` null or NUL-terminated.
unsafe fn with_namespace<L>(
    device: NvmlDevice,
    limits: Option<L>,
    name_space: fn(&L) -> *const c_char,
    f: impl FnOnce(&Target, L, &str) -> Result<(), NvmlReturn>,
) -> NvmlReturn {
    if !partitions::supported() {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    with_device(device, |t| {
        let l = limits.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let ns = name_space(&l);
        if ns.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if t.mig().is_some() {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: not null, and NUL-terminated per the contract.
        let path = unsafe { CStr::from_ptr(ns) }.to_string_lossy();
        f(t, l, &path)
    })
}

/// # Safety
/// `limits` null or a valid `nvmlSetMemoryLimits_v1_t` whose `nameSpace` is
/// null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLimits_v1(
    device: NvmlDevice,
    limits: *const NvmlSetMemoryLimitsV1,
) -> NvmlReturn {
    // SAFETY: caller contract (`as_ref` maps null to None).
    let limits = unsafe { limits.as_ref() };
    let set = |t: &Target, l: &NvmlSetMemoryLimitsV1, path: &str| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(NVML_ERROR_NO_PERMISSION);
        }
        if !path.starts_with('/') || (l.hard_limit != 0 && l.soft_limit > l.hard_limit) {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        partitions::set(t.gpu().info.minor, path, l.soft_limit, l.hard_limit)
            .map_err(|_| NVML_ERROR_UNKNOWN)
    };
    // SAFETY: caller contract.
    unsafe { with_namespace(device, limits, |l| l.name_space, set) }
}

/// # Safety
/// `limits` null or a valid `nvmlGetMemoryLimits_v1_t` whose `nameSpace` is
/// null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryLimits_v1(
    device: NvmlDevice,
    limits: *mut NvmlGetMemoryLimitsV1,
) -> NvmlReturn {
    // SAFETY: caller contract (`as_mut` maps null to None).
    let limits = unsafe { limits.as_mut() };
    let get = |t: &Target, l: &mut NvmlGetMemoryLimitsV1, path: &str| {
        let minor = t.gpu().info.minor;
        let found = partitions::limits(minor)
            .into_iter()
            .find(|x| x.path == path)
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        l.soft_limit = found.soft;
        l.hard_limit = found.hard;
        l.current_used = memory::cgroup_usage(minor, path);
        Ok(())
    };
    // SAFETY: caller contract.
    unsafe { with_namespace(device, limits, |l| l.name_space, get) }
}
