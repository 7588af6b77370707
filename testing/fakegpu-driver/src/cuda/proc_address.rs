//! The table behind `cuGetProcAddress`.
//!
//! Real CUDA keys its table on base names and picks the ABI version from
//! the caller's `cudaVersion`: `cuMemAlloc` asked for by a CUDA ≥ 3.2 caller
//! is `cuMemAlloc_v2`. Exact (suffixed) names are accepted as well, which is
//! more lenient than the real driver but harmless.

use std::ffi::{c_int, c_void};

use super::capture::*;
use super::launch::*;
use super::memory_ext::*;
use super::resident::*;
use super::*;

/// Base names whose `_v2` is what a caller built against at least the given
/// CUDA version gets.
const VERSIONED: &[(&str, c_int)] = &[
    ("cuDeviceTotalMem", 3020),
    ("cuMemAlloc", 3020),
    ("cuMemFree", 3020),
    ("cuMemGetInfo", 3020),
    ("cuCtxCreate", 3020),
    ("cuCtxDestroy", 4000),
    ("cuDevicePrimaryCtxRelease", 11000),
    ("cuDeviceGetUuid", 11040),
    ("cuGetProcAddress", 12000),
    ("cuMemAllocPitch", 3020),
    ("cuArrayCreate", 3020),
    ("cuArray3DCreate", 3020),
    ("cuStreamBeginCapture", 10010),
    ("cuStreamDestroy", 4000),
    ("cuEventDestroy", 4000),
];

/// Maps an exact exported name to its address.
macro_rules! exported {
    ($name:expr; $($f:ident),* $(,)?) => {
        match $name {
            $(stringify!($f) => Some($f as *mut c_void),)*
            _ => None,
        }
    };
}

fn exact(name: &str) -> Option<*mut c_void> {
    exported!(name;
        cuInit,
        cuDriverGetVersion,
        cuDeviceGetCount,
        cuDeviceGet,
        cuDeviceGetName,
        cuDeviceGetUuid,
        cuDeviceGetUuid_v2,
        cuDeviceTotalMem,
        cuDeviceTotalMem_v2,
        cuDeviceGetAttribute,
        cuDeviceGetPCIBusId,
        cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease,
        cuDevicePrimaryCtxRelease_v2,
        cuCtxSetCurrent,
        cuCtxGetCurrent,
        cuCtxGetDevice,
        cuCtxSynchronize,
        // resident
        cuCtxCreate_v2,
        cuCtxDestroy_v2,
        cuCtxSetLimit,
        cuCtxGetLimit,
        cuModuleLoad,
        cuModuleLoadData,
        cuModuleLoadDataEx,
        cuModuleUnload,
        cuLibraryLoadData,
        cuLibraryUnload,
        cuMemAlloc_v2,
        cuMemFree_v2,
        cuMemGetInfo_v2,
        cuGetErrorString,
        cuGetErrorName,
        cuGetProcAddress,
        cuGetProcAddress_v2,
        // memory_ext
        cuMemAllocPitch_v2,
        cuMemAllocManaged,
        cuMemGetInfo,
        cuDeviceGetMemPool,
        cuDeviceGetDefaultMemPool,
        cuMemPoolCreate,
        cuMemPoolDestroy,
        cuMemPoolGetAttribute,
        cuMemPoolTrimTo,
        cuMemAllocFromPoolAsync,
        cuMemAllocFromPoolAsync_ptsz,
        cuMemAllocAsync,
        cuMemAllocAsync_ptsz,
        cuMemFreeAsync,
        cuMemFreeAsync_ptsz,
        cuMemCreate,
        cuMemRelease,
        cuMemAddressReserve,
        cuMemAddressFree,
        cuMemMap,
        cuMemUnmap,
        cuArrayCreate_v2,
        cuArray3DCreate_v2,
        cuMipmappedArrayCreate,
        cuArrayDestroy,
        cuMipmappedArrayDestroy,
        cuArrayGetMemoryRequirements,
        cuMipmappedArrayGetMemoryRequirements,
        cuGraphCreate,
        cuGraphAddMemAllocNode,
        cuGraphInstantiateWithFlags,
        cuGraphLaunch,
        cuGraphLaunch_ptsz,
        cuGraphUpload,
        cuGraphUpload_ptsz,
        cuGraphExecDestroy,
        cuGraphDestroy,
        cuDeviceGraphMemTrim,
        cuDeviceGetGraphMemAttribute,
        // capture
        cuStreamCreate,
        cuStreamGetDevice,
        cuStreamDestroy_v2,
        cuStreamBeginCapture,
        cuStreamBeginCapture_v2,
        cuStreamBeginCapture_ptsz,
        cuStreamEndCapture,
        cuStreamEndCapture_ptsz,
        cuStreamIsCapturing,
        cuStreamIsCapturing_ptsz,
        cuThreadExchangeStreamCaptureMode,
        // launch
        cuLaunchKernel,
        cuLaunchKernel_ptsz,
        cuLaunchKernelEx,
        cuLaunchKernelEx_ptsz,
        cuLaunchCooperativeKernel,
        cuLaunchCooperativeKernel_ptsz,
        cuEventCreate,
        cuEventDestroy_v2,
        cuEventRecord,
        cuEventRecord_ptsz,
        cuEventQuery,
        cuEventSynchronize,
        cuEventElapsedTime,
        cuEventElapsedTime_v2,
        cuStreamSynchronize,
        cuStreamSynchronize_ptsz,
    )
}

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD: u64 = 1 << 1;

/// As [`lookup`], honouring the per-thread default stream flag: a symbol
/// with a `_ptsz` flavour gives that flavour.
pub fn lookup_with_flags(name: &str, cuda_version: c_int, flags: u64) -> Option<*mut c_void> {
    if flags & PER_THREAD != 0 {
        if let Some(p) = exact(&format!("{name}_ptsz")) {
            return Some(p);
        }
    }
    lookup(name, cuda_version)
}

/// The entry point a caller built against `cuda_version` gets for `name`.
pub fn lookup(name: &str, cuda_version: c_int) -> Option<*mut c_void> {
    let versioned = VERSIONED
        .iter()
        .find(|(base, min)| *base == name && cuda_version >= *min)
        .and_then(|(base, _)| exact(&format!("{base}_v2")));
    versioned.or_else(|| exact(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_versions_by_caller() {
        let v2 = exact("cuMemAlloc_v2").unwrap();
        assert_eq!(lookup("cuMemAlloc", 13000), Some(v2));
        assert_eq!(lookup("cuMemAlloc_v2", 13000), Some(v2));
        assert_eq!(lookup("cuGetProcAddress", 11080), exact("cuGetProcAddress"));
        assert_eq!(
            lookup("cuGetProcAddress", 12000),
            exact("cuGetProcAddress_v2")
        );
        assert_eq!(lookup("cuInit", 13000), Some(cuInit as *mut c_void));
        assert_eq!(
            lookup("cuLaunchKernel", 13000),
            exact("cuLaunchKernel"),
            "launches are simulated"
        );
    }
}
