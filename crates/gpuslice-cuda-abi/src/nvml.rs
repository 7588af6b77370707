//! `nvml.h`: return codes, enum values, structs, and the prototypes
//! gpuslice calls by pointer.

use std::ffi::{c_char, c_uint, c_ulonglong, c_void};

/// Name the dynamic loader resolves to NVML.
pub const LIBNVIDIA_ML: &str = "libnvidia-ml.so.1";

/// `nvmlReturn_t` (a C enum).
pub type NvmlReturn = c_uint;
/// `nvmlDevice_t`.
pub type NvmlDevice = *mut c_void;
/// `nvmlEventSet_t`.
pub type NvmlEventSet = *mut c_void;

// `nvmlReturn_t` values.
pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub const NVML_ERROR_TIMEOUT: NvmlReturn = 10;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

// `nvmlEnableState_t`.
pub const NVML_FEATURE_DISABLED: c_uint = 0;
pub const NVML_FEATURE_ENABLED: c_uint = 1;
/// `nvmlTemperatureSensors_t`: the GPU die.
pub const NVML_TEMPERATURE_GPU: c_uint = 0;
// `nvmlClockType_t`.
pub const NVML_CLOCK_GRAPHICS: c_uint = 0;
pub const NVML_CLOCK_SM: c_uint = 1;
pub const NVML_CLOCK_MEM: c_uint = 2;
pub const NVML_CLOCK_VIDEO: c_uint = 3;
// `nvmlPcieUtilCounter_t`.
pub const NVML_PCIE_UTIL_TX_BYTES: c_uint = 0;
pub const NVML_PCIE_UTIL_RX_BYTES: c_uint = 1;
// `nvmlMemoryErrorType_t`.
pub const NVML_MEMORY_ERROR_TYPE_CORRECTED: c_uint = 0;
pub const NVML_MEMORY_ERROR_TYPE_UNCORRECTED: c_uint = 1;
/// `nvmlEventTypeXidCriticalError`.
pub const NVML_EVENT_TYPE_XID_CRITICAL_ERROR: c_ulonglong = 0x8;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`: room for any UUID string.
pub const NVML_DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;

/// `nvmlPciInfo_t` (the v3 layout, current since NVML 9).
#[repr(C)]
pub struct NvmlPciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; 32],
}

/// `nvmlSetMemoryLimits_v1_t` (R615+, "MPS v3 memory partitioning"): the
/// limits of the cgroup whose directory is `name_space` (its full path),
/// in bytes. Setting needs root.
#[repr(C)]
pub struct NvmlSetMemoryLimitsV1 {
    pub name_space: *const c_char,
    pub soft_limit: u64,
    pub hard_limit: u64,
}

/// `nvmlGetMemoryLimits_v1_t`: `name_space` in, the rest out
/// (`current_used`: what the cgroup's processes hold on the device).
#[repr(C)]
pub struct NvmlGetMemoryLimitsV1 {
    pub name_space: *const c_char,
    pub soft_limit: u64,
    pub hard_limit: u64,
    pub current_used: u64,
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2`: `NVML_STRUCT_VERSION(Memory, 2)`.
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<NvmlMemoryV2>() as c_uint) | (2 << 24);

/// `nvmlProcessInfo_v1_t` (of `nvmlDeviceGetComputeRunningProcesses`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` (= `nvmlProcessInfo_v2_t`, of the `_v2` and `_v3`
/// `nvmlDeviceGetComputeRunningProcesses`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct NvmlUtilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlEventData_t`.
#[repr(C)]
pub struct NvmlEventData {
    pub device: NvmlDevice,
    pub event_type: c_ulonglong,
    pub event_data: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// Prototypes (`nvml.h`) of the entry points called through a pointer.
pub mod pfn {
    use super::*;

    pub type Init = unsafe extern "C" fn() -> NvmlReturn;
    pub type DeviceGetCount = unsafe extern "C" fn(count: *mut c_uint) -> NvmlReturn;
    pub type DeviceGetHandleByIndex =
        unsafe extern "C" fn(index: c_uint, device: *mut NvmlDevice) -> NvmlReturn;
    pub type DeviceGetUuid =
        unsafe extern "C" fn(device: NvmlDevice, uuid: *mut c_char, len: c_uint) -> NvmlReturn;
    pub type DeviceGetMemoryInfo =
        unsafe extern "C" fn(device: NvmlDevice, memory: *mut NvmlMemory) -> NvmlReturn;
    pub type DeviceGetMemoryInfoV2 =
        unsafe extern "C" fn(device: NvmlDevice, memory: *mut NvmlMemoryV2) -> NvmlReturn;
    pub type DeviceGetHandleByUuid =
        unsafe extern "C" fn(uuid: *const c_char, device: *mut NvmlDevice) -> NvmlReturn;
    pub type DeviceGetIndex =
        unsafe extern "C" fn(device: NvmlDevice, index: *mut c_uint) -> NvmlReturn;
    /// `nvmlDeviceGetComputeRunningProcesses*`: one prototype, the records
    /// `R` of its ABI version.
    pub type DeviceGetComputeRunningProcessesOf<R> =
        unsafe extern "C" fn(device: NvmlDevice, count: *mut c_uint, infos: *mut R) -> NvmlReturn;
    /// `_v2` and `_v3` (the `nvmlProcessInfo_t` records).
    pub type DeviceGetComputeRunningProcesses = DeviceGetComputeRunningProcessesOf<NvmlProcessInfo>;
    /// `nvmlDeviceSetMemoryLimits_v1` (R615+).
    pub type DeviceSetMemoryLimitsV1 = unsafe extern "C" fn(
        device: NvmlDevice,
        limits: *const NvmlSetMemoryLimitsV1,
    ) -> NvmlReturn;
    /// `nvmlDeviceGetMemoryLimits_v1` (R615+).
    pub type DeviceGetMemoryLimitsV1 =
        unsafe extern "C" fn(device: NvmlDevice, limits: *mut NvmlGetMemoryLimitsV1) -> NvmlReturn;
    /// The unsuffixed, first ABI (`nvmlProcessInfo_v1_t` records).
    pub type DeviceGetComputeRunningProcessesV1 =
        DeviceGetComputeRunningProcessesOf<NvmlProcessInfoV1>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn struct_layouts_match_nvml_h() {
        assert_eq!(size_of::<NvmlPciInfo>(), 68);
        assert_eq!(offset_of!(NvmlPciInfo, bus_id), 36);
        assert_eq!(size_of::<NvmlMemory>(), 24);
        assert_eq!(size_of::<NvmlSetMemoryLimitsV1>(), 24);
        assert_eq!(size_of::<NvmlGetMemoryLimitsV1>(), 32);
        assert_eq!(offset_of!(NvmlGetMemoryLimitsV1, current_used), 24);
        assert_eq!(size_of::<NvmlMemoryV2>(), 40);
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);
        assert_eq!(size_of::<NvmlEventData>(), 32);
        assert_eq!(size_of::<NvmlProcessInfoV1>(), 16);
        assert_eq!(size_of::<NvmlProcessInfo>(), 24);
        assert_eq!(offset_of!(NvmlProcessInfo, gpu_instance_id), 16);
    }
}
