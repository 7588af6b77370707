//! The slice of `cuda.h` (CUDA 12/13) and `nvml.h` the shim needs.

use std::ffi::{c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUstream = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUarray = *mut c_void;
pub type NvmlDevice = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;

/// First and last of the stream-capture errors
/// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` … `_WRONG_THREAD`).
pub const CUDA_ERROR_STREAM_CAPTURE_FIRST: CUresult = 900;
pub const CUDA_ERROR_STREAM_CAPTURE_LAST: CUresult = 908;

/// `CU_STREAM_PER_THREAD`: the calling thread's per-thread default stream.
pub const CU_STREAM_PER_THREAD: usize = 0x2;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;
/// `CUstreamCaptureStatus`: not capturing.
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CUstreamCaptureMode`: this thread may make unsafe calls.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

/// `CUmemLocationType`: device memory.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CUmemPool_attribute` values (all `cuuint64_t`).
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
/// `CUgraphMem_attribute`: bytes reserved for graph allocations.
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

/// `CUmemAllocationProp` (only the leading fields are read).
#[repr(C)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

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

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_int,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct Array3DDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_int,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Default)]
pub struct ArrayMemoryRequirements {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [c_uint; 4],
}

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

pub type CUcontext = *mut c_void;
/// `CUmodule`, `CUlibrary`, `CUgreenCtx`: opaque handles.
pub type CUhandle = *mut c_void;
