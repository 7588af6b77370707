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

/// The driver's opaque handles: each a pointer to a struct cuda.h never
/// defines, so one Rust type serves them all.
macro_rules! opaque_handles {
    ($($name:ident),* $(,)?) => {
        $(pub type $name = *mut c_void;)*
    };
}

opaque_handles!(
    CUcontext,
    CUstream,
    CUevent,
    CUfunction,
    CUarray,
    CUmemoryPool,
    CUgraph,
    CUgraphExec,
    CUmipmappedArray,
    CUmodule,
    CUlibrary,
    CUgreenCtx,
);
/// `CUmemGenericAllocationHandle` (`unsigned long long`).
pub type CUmemGenericAllocationHandle = u64;

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

/// `CUmemAllocationType`: device (or pinned host) memory.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CUmemAllocationType`: managed memory.
pub const CU_MEM_ALLOCATION_TYPE_MANAGED: c_int = 2;
/// `CUmemLocationType`: device memory.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `CUmemLocationType`: host memory.
pub const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
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

/// `CUmemPoolProps` (CUDA 12/13; 88 bytes, as in 11.2 where the tail was
/// all reserved).
#[repr(C)]
pub struct CUmemPoolProps {
    /// `CU_MEM_ALLOCATION_TYPE_PINNED` or `_MANAGED`.
    pub alloc_type: c_int,
    pub handle_types: c_int,
    /// `CUmemLocation`: `CU_MEM_LOCATION_TYPE_DEVICE`, host kinds above it.
    pub location_type: c_int,
    pub location_id: c_int,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (of `cuGraphAddMemAllocNode`).
#[repr(C)]
pub struct MemAllocNodeParams {
    pub pool_props: CUmemPoolProps,
    /// `const CUmemAccessDesc*`.
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    /// Written by the driver: the allocation's address.
    pub dptr: CUdeviceptr,
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_int,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DEFERRED_MAPPING` (a flag of `CUDA_ARRAY3D_DESCRIPTOR`):
/// the array holds no memory of its own; what is mapped into it comes
/// from `cuMemCreate` handles.
pub const CUDA_ARRAY3D_DEFERRED_MAPPING: c_uint = 0x80;

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
    /// `cuLaunchKernel` and `cuLaunchCooperativeKernel` take the same grid
    /// arguments; `rest` is what one takes after them.
    macro_rules! grid_launch {
        ($name:ident $(, $($rest:tt)+)?) => {
            pub type $name = unsafe extern "C" fn(
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
                $($($rest)+)?
            ) -> CUresult;
        };
    }
    grid_launch!(LaunchKernel, extra: *mut *mut c_void);
    grid_launch!(LaunchCooperativeKernel);
    pub type LaunchKernelEx = unsafe extern "C" fn(
        config: *const LaunchConfig,
        f: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult;
    pub type GraphLaunch = unsafe extern "C" fn(exec: CUgraphExec, stream: CUstream) -> CUresult;
    pub type GraphUpload = unsafe extern "C" fn(exec: CUgraphExec, stream: CUstream) -> CUresult;
    pub type EventCreate = unsafe extern "C" fn(event: *mut CUevent, flags: c_uint) -> CUresult;
    pub type EventRecord = unsafe extern "C" fn(event: CUevent, stream: CUstream) -> CUresult;
    pub type EventQuery = unsafe extern "C" fn(event: CUevent) -> CUresult;
    pub type EventSynchronize = unsafe extern "C" fn(event: CUevent) -> CUresult;
    pub type EventDestroy = unsafe extern "C" fn(event: CUevent) -> CUresult;
    pub type EventElapsedTime =
        unsafe extern "C" fn(ms: *mut std::ffi::c_float, start: CUevent, end: CUevent) -> CUresult;

    /// `cuGetProcAddress` before CUDA 12.0 (no symbol status).
    pub type GetProcAddressV1 = unsafe extern "C" fn(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: u64,
    ) -> CUresult;
    pub type CtxGetDevice = unsafe extern "C" fn(dev: *mut CUdevice) -> CUresult;
    pub type CtxGetCurrent = unsafe extern "C" fn(ctx: *mut CUcontext) -> CUresult;
    pub type CtxSynchronize = unsafe extern "C" fn() -> CUresult;
    /// `cuGetErrorName` (also `cuGetErrorString`): a static string.
    pub type GetErrorName =
        unsafe extern "C" fn(error: CUresult, pstr: *mut *const c_char) -> CUresult;
    pub type ThreadExchangeStreamCaptureMode = unsafe extern "C" fn(mode: *mut c_int) -> CUresult;
    pub type StreamGetDevice =
        unsafe extern "C" fn(stream: CUstream, dev: *mut CUdevice) -> CUresult;
    pub type StreamSynchronize = unsafe extern "C" fn(stream: CUstream) -> CUresult;
    pub type StreamDestroy = unsafe extern "C" fn(stream: CUstream) -> CUresult;

    // Allocation.
    pub type MemAllocPitch = unsafe extern "C" fn(
        dptr: *mut CUdeviceptr,
        pitch: *mut usize,
        width: usize,
        height: usize,
        element_size: c_uint,
    ) -> CUresult;
    pub type MemAllocManaged =
        unsafe extern "C" fn(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CUresult;
    pub type MemAllocFromPoolAsync = unsafe extern "C" fn(
        dptr: *mut CUdeviceptr,
        bytes: usize,
        pool: CUmemoryPool,
        stream: CUstream,
    ) -> CUresult;
    pub type MemFreeAsync = unsafe extern "C" fn(dptr: CUdeviceptr, stream: CUstream) -> CUresult;
    /// `cuMemGetInfo`: the pre-3.2, 32-bit ABI.
    pub type MemGetInfoV1 = unsafe extern "C" fn(free: *mut c_uint, total: *mut c_uint) -> CUresult;
    /// `cuDeviceTotalMem`: the pre-3.2, 32-bit ABI.
    pub type DeviceTotalMemV1 = unsafe extern "C" fn(bytes: *mut c_uint, dev: CUdevice) -> CUresult;

    // Memory pools and graph memory.
    pub type MemPoolCreate =
        unsafe extern "C" fn(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult;
    pub type MemPoolDestroy = unsafe extern "C" fn(pool: CUmemoryPool) -> CUresult;
    pub type MemPoolTrimTo = unsafe extern "C" fn(pool: CUmemoryPool, keep: usize) -> CUresult;
    pub type MemPoolGetAttribute =
        unsafe extern "C" fn(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult;
    /// Also `cuDeviceGetDefaultMemPool`.
    pub type DeviceGetMemPool =
        unsafe extern "C" fn(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult;
    pub type DeviceGetGraphMemAttribute =
        unsafe extern "C" fn(dev: CUdevice, attr: c_int, value: *mut c_void) -> CUresult;
    pub type DeviceGraphMemTrim = unsafe extern "C" fn(dev: CUdevice) -> CUresult;

    // Virtual memory management.
    pub type MemCreate = unsafe extern "C" fn(
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        flags: u64,
    ) -> CUresult;
    pub type MemRelease = unsafe extern "C" fn(handle: CUmemGenericAllocationHandle) -> CUresult;
    pub type MemAddressReserve = unsafe extern "C" fn(
        ptr: *mut CUdeviceptr,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: u64,
    ) -> CUresult;
    pub type MemAddressFree = unsafe extern "C" fn(ptr: CUdeviceptr, size: usize) -> CUresult;
    pub type MemMap = unsafe extern "C" fn(
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: u64,
    ) -> CUresult;
    pub type MemUnmap = unsafe extern "C" fn(ptr: CUdeviceptr, size: usize) -> CUresult;

    // Arrays.
    pub type ArrayCreate =
        unsafe extern "C" fn(array: *mut CUarray, desc: *const ArrayDescriptor) -> CUresult;
    pub type Array3DCreate =
        unsafe extern "C" fn(array: *mut CUarray, desc: *const Array3DDescriptor) -> CUresult;
    pub type ArrayDestroy = unsafe extern "C" fn(array: CUarray) -> CUresult;
    pub type ArrayGetMemoryRequirements = unsafe extern "C" fn(
        req: *mut ArrayMemoryRequirements,
        array: CUarray,
        dev: CUdevice,
    ) -> CUresult;
    pub type MipmappedArrayCreate = unsafe extern "C" fn(
        array: *mut CUmipmappedArray,
        desc: *const Array3DDescriptor,
        levels: c_uint,
    ) -> CUresult;
    /// A `CUmipmappedArray` is the same opaque pointer as a `CUarray`.
    pub type MipmappedArrayDestroy = ArrayDestroy;
    /// As `MipmappedArrayDestroy`.
    pub type MipmappedArrayGetMemoryRequirements = ArrayGetMemoryRequirements;

    // Graphs.
    pub type GraphCreate = unsafe extern "C" fn(graph: *mut CUgraph, flags: c_uint) -> CUresult;
    /// `params` is read, and its `dptr` written.
    pub type GraphAddMemAllocNode = unsafe extern "C" fn(
        node: *mut *mut c_void,
        graph: CUgraph,
        deps: *const *mut c_void,
        num_deps: usize,
        params: *mut MemAllocNodeParams,
    ) -> CUresult;
    pub type GraphInstantiateWithFlags =
        unsafe extern "C" fn(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) -> CUresult;
    pub type GraphExecDestroy = unsafe extern "C" fn(exec: CUgraphExec) -> CUresult;
    pub type GraphDestroy = unsafe extern "C" fn(graph: CUgraph) -> CUresult;

    // Contexts, modules and libraries (what the driver holds per process).
    pub type DevicePrimaryCtxRelease = unsafe extern "C" fn(dev: CUdevice) -> CUresult;
    pub type DevicePrimaryCtxReset = unsafe extern "C" fn(dev: CUdevice) -> CUresult;
    pub type CtxCreate =
        unsafe extern "C" fn(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult;
    /// `cuCtxCreate_v3`: `params` are `CUexecAffinityParam`s.
    pub type CtxCreateV3 = unsafe extern "C" fn(
        ctx: *mut CUcontext,
        params: *mut c_void,
        num_params: c_int,
        flags: c_uint,
        dev: CUdevice,
    ) -> CUresult;
    /// `cuCtxCreate_v4`: `params` is a `CUctxCreateParams*`.
    pub type CtxCreateV4 = unsafe extern "C" fn(
        ctx: *mut CUcontext,
        params: *mut c_void,
        flags: c_uint,
        dev: CUdevice,
    ) -> CUresult;
    /// `cuGreenCtxCreate`: `desc` is a `CUdevResourceDesc`.
    pub type GreenCtxCreate = unsafe extern "C" fn(
        ctx: *mut CUgreenCtx,
        desc: *mut c_void,
        dev: CUdevice,
        flags: c_uint,
    ) -> CUresult;
    pub type CtxDestroy = unsafe extern "C" fn(ctx: CUcontext) -> CUresult;
    pub type GreenCtxDestroy = unsafe extern "C" fn(ctx: CUgreenCtx) -> CUresult;
    pub type CtxSetLimit = unsafe extern "C" fn(limit: c_int, value: usize) -> CUresult;
    pub type CtxGetLimit = unsafe extern "C" fn(value: *mut usize, limit: c_int) -> CUresult;
    pub type ModuleLoad =
        unsafe extern "C" fn(module: *mut CUmodule, fname: *const c_char) -> CUresult;
    /// Also `cuModuleLoadFatBinary`.
    pub type ModuleLoadData =
        unsafe extern "C" fn(module: *mut CUmodule, image: *const c_void) -> CUresult;
    pub type ModuleLoadDataEx = unsafe extern "C" fn(
        module: *mut CUmodule,
        image: *const c_void,
        num_options: c_uint,
        options: *mut c_int,
        values: *mut *mut c_void,
    ) -> CUresult;
    /// Also `cuLibraryLoadFromFile` (`code` is then the file name).
    pub type LibraryLoadData = unsafe extern "C" fn(
        library: *mut CUlibrary,
        code: *const c_void,
        jit_options: *mut c_int,
        jit_values: *mut *mut c_void,
        num_jit: c_uint,
        library_options: *mut c_int,
        library_values: *mut *mut c_void,
        num_library: c_uint,
    ) -> CUresult;
    pub type ModuleUnload = unsafe extern "C" fn(module: CUmodule) -> CUresult;
    pub type LibraryUnload = unsafe extern "C" fn(library: CUlibrary) -> CUresult;
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
        assert_eq!(size_of::<CUmemPoolProps>(), 88);
        assert_eq!(offset_of!(CUmemPoolProps, location_id), 12);
        assert_eq!(offset_of!(CUmemPoolProps, max_size), 24);
        assert_eq!(offset_of!(CUmemPoolProps, usage), 32);
        assert_eq!(offset_of!(MemAllocNodeParams, bytesize), 104);
        assert_eq!(offset_of!(MemAllocNodeParams, dptr), 112);
        assert_eq!(size_of::<MemAllocNodeParams>(), 120);
    }

    #[test]
    fn capture_error_range_is_the_header_range() {
        assert_eq!(CUDA_ERROR_STREAM_CAPTURE_FIRST, 900);
        assert_eq!(CUDA_ERROR_STREAM_CAPTURE_LAST, 908);
        assert_eq!(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, 2);
    }
}
