//! The fake's entry points have the prototypes gpuslice-cuda-abi declares,
//! the ones the shim, the probes and the test clients call them through:
//! checked at compile time, so no side can drift from the others. (Entry
//! points nothing in gpuslice calls by pointer have no prototype there.)

use super::capture::*;
use super::launch::*;
use super::memory_ext::*;
use super::resident::*;
use super::*;

macro_rules! prototypes {
    ($($ty:ident: $($f:ident),+;)*) => {
        $($(const _: pfn::$ty = $f;)+)*
    };
}

prototypes! {
    Init: cuInit;
    DeviceGetCount: cuDeviceGetCount;
    DeviceGet: cuDeviceGet;
    DeviceGetName: cuDeviceGetName;
    DeviceGetUuid: cuDeviceGetUuid, cuDeviceGetUuid_v2;
    DeviceTotalMem: cuDeviceTotalMem_v2;
    DeviceTotalMemV1: cuDeviceTotalMem;
    DeviceGetPciBusId: cuDeviceGetPCIBusId;
    DevicePrimaryCtxRetain: cuDevicePrimaryCtxRetain;
    DevicePrimaryCtxRelease: cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2;
    CtxSetCurrent: cuCtxSetCurrent;
    CtxGetCurrent: cuCtxGetCurrent;
    GetErrorName: cuGetErrorName, cuGetErrorString;
    CtxGetDevice: cuCtxGetDevice;
    CtxSynchronize: cuCtxSynchronize;
    CtxCreate: cuCtxCreate_v2;
    CtxDestroy: cuCtxDestroy_v2;
    CtxSetLimit: cuCtxSetLimit;
    CtxGetLimit: cuCtxGetLimit;
    ModuleLoad: cuModuleLoad;
    ModuleLoadData: cuModuleLoadData;
    ModuleLoadDataEx: cuModuleLoadDataEx;
    ModuleUnload: cuModuleUnload;
    LibraryLoadData: cuLibraryLoadData;
    LibraryUnload: cuLibraryUnload;
    GetProcAddressV1: cuGetProcAddress;
    GetProcAddress: cuGetProcAddress_v2;
    MemAlloc: cuMemAlloc_v2;
    MemFree: cuMemFree_v2;
    MemGetInfo: cuMemGetInfo_v2;
    MemGetInfoV1: cuMemGetInfo;
    MemAllocPitch: cuMemAllocPitch_v2;
    MemAllocManaged: cuMemAllocManaged;
    MemAllocAsync: cuMemAllocAsync, cuMemAllocAsync_ptsz;
    MemAllocFromPoolAsync: cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz;
    MemFreeAsync: cuMemFreeAsync, cuMemFreeAsync_ptsz;
    DeviceGetMemPool: cuDeviceGetMemPool, cuDeviceGetDefaultMemPool;
    MemPoolCreate: cuMemPoolCreate;
    MemPoolDestroy: cuMemPoolDestroy;
    MemPoolGetAttribute: cuMemPoolGetAttribute;
    MemPoolTrimTo: cuMemPoolTrimTo;
    MemCreate: cuMemCreate;
    MemRelease: cuMemRelease;
    MemAddressReserve: cuMemAddressReserve;
    MemAddressFree: cuMemAddressFree;
    MemMap: cuMemMap;
    MemUnmap: cuMemUnmap;
    ArrayCreate: cuArrayCreate_v2;
    Array3DCreate: cuArray3DCreate_v2;
    ArrayDestroy: cuArrayDestroy;
    ArrayGetMemoryRequirements: cuArrayGetMemoryRequirements;
    MipmappedArrayCreate: cuMipmappedArrayCreate;
    MipmappedArrayDestroy: cuMipmappedArrayDestroy;
    MipmappedArrayGetMemoryRequirements: cuMipmappedArrayGetMemoryRequirements;
    GraphCreate: cuGraphCreate;
    GraphAddMemAllocNode: cuGraphAddMemAllocNode;
    GraphInstantiateWithFlags: cuGraphInstantiateWithFlags;
    GraphLaunch: cuGraphLaunch, cuGraphLaunch_ptsz;
    GraphUpload: cuGraphUpload, cuGraphUpload_ptsz;
    GraphExecDestroy: cuGraphExecDestroy;
    GraphDestroy: cuGraphDestroy;
    DeviceGraphMemTrim: cuDeviceGraphMemTrim;
    DeviceGetGraphMemAttribute: cuDeviceGetGraphMemAttribute;
    StreamCreate: cuStreamCreate;
    StreamDestroy: cuStreamDestroy_v2;
    StreamGetDevice: cuStreamGetDevice;
    StreamBeginCapture: cuStreamBeginCapture_v2, cuStreamBeginCapture_ptsz;
    StreamEndCapture: cuStreamEndCapture, cuStreamEndCapture_ptsz;
    StreamIsCapturing: cuStreamIsCapturing, cuStreamIsCapturing_ptsz;
    StreamSynchronize: cuStreamSynchronize, cuStreamSynchronize_ptsz;
    ThreadExchangeStreamCaptureMode: cuThreadExchangeStreamCaptureMode;
    LaunchKernel: cuLaunchKernel, cuLaunchKernel_ptsz;
    LaunchCooperativeKernel: cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz;
    LaunchKernelEx: cuLaunchKernelEx, cuLaunchKernelEx_ptsz;
    EventCreate: cuEventCreate;
    EventDestroy: cuEventDestroy_v2;
    EventRecord: cuEventRecord, cuEventRecord_ptsz;
    EventQuery: cuEventQuery;
    EventSynchronize: cuEventSynchronize;
    EventElapsedTime: cuEventElapsedTime, cuEventElapsedTime_v2;
}

const _: gpuslice_cuda_abi::fakegpu::BusyNs = fakegpuBusyNs;
const _: gpuslice_cuda_abi::fakegpu::EventRecords = fakegpuEventRecords;
