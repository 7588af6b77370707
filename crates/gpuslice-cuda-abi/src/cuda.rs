//! `cuda.h`: handle types, `CUresult` codes, enum values and structs, and
//! the prototypes of the entry points gpuslice calls by pointer.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// Name the dynamic loader resolves to the driver library.
pub const LIBCUDA: &str = "libcuda.so.1";

/// `CUresult` (a C enum: `int`).
pub type CUresult = c_int;
/// `CUdevice` (an ordinal).
pub type CUdevice = c_int;
/// `CUdeviceptr` (`unsigned long long` on 64-bit hosts).
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;

// `CUresult` values.
pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: CUresult = 901;
pub const CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: CUresult = 906;
pub const CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: CUresult = 908;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;
/// First and last of the stream-capture errors
/// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` … `_WRONG_THREAD`).
pub const CUDA_ERROR_STREAM_CAPTURE_FIRST: CUresult = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
pub const CUDA_ERROR_STREAM_CAPTURE_LAST: CUresult = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;

// `CUdevice_attribute` values.
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 1;
pub const CU_DEVICE_ATTRIBUTE_WARP_SIZE: c_int = 10;
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
pub const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: c_int = 41;
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub const CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: c_int = 83;

// `CUstreamCaptureMode`.
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: c_int = 0;
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
// `CUstreamCaptureStatus`.
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: c_int = 1;
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: c_int = 2;

/// `CU_STREAM_LEGACY`: the legacy NULL stream, as a handle value.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`: the calling thread's per-thread default stream.
pub const CU_STREAM_PER_THREAD: usize = 0x2;
/// `CUstream_flags`: `CU_STREAM_NON_BLOCKING`.
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;

// `CUdriverProcAddress_flags` (the `flags` of `cuGetProcAddress`).
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1 << 0;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// `CUmemLocationType`: device memory.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
// `CUmemPool_attribute` values (all `cuuint64_t`).
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
/// `CUgraphMem_attribute`: bytes reserved for graph allocations.
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

/// `CUmemAllocationProp` (the leading fields; the rest is never read).
#[repr(C)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
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

/// `CUlaunchConfig`.
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem: c_uint,
    pub stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// Prototypes (`cuda.h`) of the entry points called through a pointer
/// from dlsym or `cuGetProcAddress`. Named after the function, without the
/// `cu` prefix and ABI suffix (`_v2`, `_ptsz`: same prototype).
pub mod pfn {
    use super::*;

    pub type Init = unsafe extern "C" fn(flags: c_uint) -> CUresult;
    pub type DeviceGetCount = unsafe extern "C" fn(count: *mut c_int) -> CUresult;
    pub type DeviceGet = unsafe extern "C" fn(dev: *mut CUdevice, ordinal: c_int) -> CUresult;
    pub type DeviceGetName =
        unsafe extern "C" fn(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult;
    pub type DeviceGetUuid = unsafe extern "C" fn(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult;
    pub type DeviceTotalMem = unsafe extern "C" fn(bytes: *mut usize, dev: CUdevice) -> CUresult;
    pub type DeviceGetPciBusId =
        unsafe extern "C" fn(bus_id: *mut c_char, len: c_int, dev: CUdevice) -> CUresult;
    pub type DevicePrimaryCtxRetain =
        unsafe extern "C" fn(ctx: *mut CUcontext, dev: CUdevice) -> CUresult;
    pub type CtxSetCurrent = unsafe extern "C" fn(ctx: CUcontext) -> CUresult;
    pub type MemAlloc = unsafe extern "C" fn(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult;
    pub type MemFree = unsafe extern "C" fn(dptr: CUdeviceptr) -> CUresult;
    pub type MemGetInfo = unsafe extern "C" fn(free: *mut usize, total: *mut usize) -> CUresult;
    pub type MemAllocAsync =
        unsafe extern "C" fn(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult;
    pub type GetProcAddress = unsafe extern "C" fn(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: u64,
        status: *mut c_int,
    ) -> CUresult;
    pub type StreamCreate = unsafe extern "C" fn(stream: *mut CUstream, flags: c_uint) -> CUresult;
    pub type StreamBeginCapture = unsafe extern "C" fn(stream: CUstream, mode: c_int) -> CUresult;
    pub type StreamEndCapture =
        unsafe extern "C" fn(stream: CUstream, graph: *mut CUgraph) -> CUresult;
    pub type StreamIsCapturing =
        unsafe extern "C" fn(stream: CUstream, status: *mut c_int) -> CUresult;
    pub type LaunchKernel = unsafe extern "C" fn(
        f: CUfunction,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_mem: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult;
    pub type LaunchCooperativeKernel = unsafe extern "C" fn(
        f: CUfunction,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_mem: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
    ) -> CUresult;
    pub type LaunchKernelEx = unsafe extern "C" fn(
        config: *const LaunchConfig,
        f: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult;
    pub type GraphLaunch = unsafe extern "C" fn(exec: CUgraphExec, stream: CUstream) -> CUresult;
    pub type EventCreate = unsafe extern "C" fn(event: *mut CUevent, flags: c_uint) -> CUresult;
    pub type EventRecord = unsafe extern "C" fn(event: CUevent, stream: CUstream) -> CUresult;
    pub type EventQuery = unsafe extern "C" fn(event: CUevent) -> CUresult;
    pub type EventElapsedTime =
        unsafe extern "C" fn(ms: *mut std::ffi::c_float, start: CUevent, end: CUevent) -> CUresult;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn struct_layouts_match_cuda_h() {
        // x86-64 / aarch64 LP64 layouts of the C structs.
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(offset_of!(CUmemAllocationProp, location_id), 12);
        assert_eq!(offset_of!(CUmemAllocationProp, win32_handle_meta_data), 16);
        assert_eq!(size_of::<ArrayDescriptor>(), 24);
        assert_eq!(size_of::<Array3DDescriptor>(), 40);
        assert_eq!(size_of::<ArrayMemoryRequirements>(), 32);
        assert_eq!(offset_of!(LaunchConfig, stream), 32);
        assert_eq!(offset_of!(LaunchConfig, num_attrs), 48);
        assert_eq!(size_of::<LaunchConfig>(), 56);
    }

    #[test]
    fn capture_error_range_is_the_header_range() {
        assert_eq!(CUDA_ERROR_STREAM_CAPTURE_FIRST, 900);
        assert_eq!(CUDA_ERROR_STREAM_CAPTURE_LAST, 908);
        assert_eq!(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, 2);
    }
}
