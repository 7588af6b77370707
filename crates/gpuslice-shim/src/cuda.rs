//! The slice of `cuda.h` (CUDA 12/13) and `nvml.h` the shim needs, from
//! the one declaration of the ABI (gpuslice-cuda-abi). The list is explicit
//! so that the shim's `use crate::cuda::*` sees only these names.

use std::ffi::c_int;

pub use gpuslice_cuda_abi::cuda::{
    Array3DDescriptor, ArrayDescriptor, ArrayMemoryRequirements, CUarray, CUcontext, CUdevice,
    CUdeviceptr, CUevent, CUfunction, CUgraphExec, CUmemAllocationProp, CUmemoryPool, CUresult,
    CUstream, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_STREAM_CAPTURE_FIRST, CUDA_ERROR_STREAM_CAPTURE_LAST, CUDA_SUCCESS,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
    CU_MEM_LOCATION_TYPE_DEVICE, CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_STATUS_NONE,
    CU_STREAM_PER_THREAD,
};
pub use gpuslice_cuda_abi::nvml::{NvmlDevice, NvmlMemory, NvmlMemoryV2};

/// `CU_MEM_ALLOCATION_TYPE_PINNED`: device (or pinned host) memory.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_ALLOCATION_TYPE_MANAGED`: managed (migratable) memory.
pub const CU_MEM_ALLOCATION_TYPE_MANAGED: c_int = 2;

/// The head of `CUmemPoolProps`: allocation type and location.
#[repr(C)]
pub struct MemPoolPropsHead {
    /// `CU_MEM_ALLOCATION_TYPE_PINNED` (1) or `_MANAGED` (2).
    pub alloc_type: c_int,
    pub handle_types: c_int,
    /// `CU_MEM_LOCATION_TYPE_DEVICE` (1), host kinds above it.
    pub location_type: c_int,
    pub location_id: c_int,
}

/// `CUmodule`, `CUlibrary`, `CUgreenCtx`: opaque handles.
pub type CUhandle = *mut std::ffi::c_void;

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
