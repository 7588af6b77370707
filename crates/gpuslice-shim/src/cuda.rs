//! The slice of `cuda.h` (CUDA 12/13) and `nvml.h` the shim needs, from
//! the one declaration of the ABI (gpuslice-cuda-abi). The list is explicit
//! so that the shim's `use crate::cuda::*` sees only these names.

use std::ffi::c_int;

/// `CUmodule`, `CUlibrary`, `CUgreenCtx`: one opaque handle type to the
/// shim, which keeps them in one table (the ABI declares them alike).
pub use gpuslice_cuda_abi::cuda::CUmodule as CUhandle;
pub use gpuslice_cuda_abi::cuda::{
    pfn, Array3DDescriptor, ArrayDescriptor, ArrayMemoryRequirements, CUarray, CUcontext, CUdevice,
    CUdeviceptr, CUevent, CUfunction, CUgraphExec, CUmemAllocationProp, CUmemPoolProps,
    CUmemoryPool, CUresult, CUstream, LaunchConfig, CUDA_ARRAY3D_DEFERRED_MAPPING,
    CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_READY,
    CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_STREAM_CAPTURE_FIRST, CUDA_ERROR_STREAM_CAPTURE_LAST,
    CUDA_SUCCESS, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT, CU_MEM_ALLOCATION_TYPE_MANAGED,
    CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE, CU_STREAM_CAPTURE_MODE_RELAXED,
    CU_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_PER_THREAD,
};
pub use gpuslice_cuda_abi::nvml::{
    pfn as nvml_pfn, NvmlDevice, NvmlMemory, NvmlMemoryV2, NvmlProcessInfo, NvmlReturn,
    NVML_DEVICE_UUID_V2_BUFFER_SIZE, NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_UNKNOWN,
    NVML_SUCCESS,
};

/// Bytes of one channel of a `CUarray_format`; 4 for formats we do not
/// know (block-compressed and packed formats are then over-estimated until
/// the driver's requirements correct it).
pub fn format_bytes(format: c_int) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => 4,
    }
}
