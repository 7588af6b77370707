//! The interposed entry points: exported symbols and anonymous instances
//! per family (see [`crate::real`]), the name tables, and the lookups that
//! use them: our `dlsym` ([`crate::loader`]) and `cuGetProcAddress(_v2)`, which
//! hand out our wrappers for the functions we interpose. The top layer:
//! the tables name every hook, and the lookup hooks read the tables.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::cuda::*;
use crate::real::{guard, mark_ptsz, Real, N_INST};
use crate::state::shim;
use crate::sys;

macro_rules! call_hook {
    ($hook:path, $real:expr, ($($n:ident),*)) => {
        $hook($real, $($n),*)
    };
}

macro_rules! families {
    ($(
        $fam:ident: $hook:path $(as $pfn:ty)?, $args:tt, $names:tt -> $ret:ty, [$($export:ident),*];
    )*) => {
        /// One ABI of interposed functions.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Family { $($fam),* }

        $(
            pub mod $fam {
                use super::*;

                pub static REAL: [Real; N_INST] = [const { Real::empty() }; N_INST];

                /// # Safety
                /// The C contract of the interposed function.
                pub unsafe extern "C" fn inst<const I: usize> $args -> $ret {
                    crate::stats::count(Family::$fam as usize);
                    // SAFETY: forwarded C contract.
                    guard(999, || unsafe { call_hook!($hook, &REAL[I], $names) })
                }

                // The wrappers (and the exports, made from the same
                // signature) have the ABI's prototype of the function.
                $(const _: $pfn = inst::<0>;)?

                pub fn wrappers() -> [*mut c_void; N_INST] {
                    [
                        inst::<0> as *mut c_void,
                        inst::<1> as *mut c_void,
                        inst::<2> as *mut c_void,
                        inst::<3> as *mut c_void,
                    ]
                }
            }

            $(
                /// Interposed driver/NVML entry point (see the crate docs).
                ///
                /// # Safety
                /// The C contract of the function of this name.
                #[no_mangle]
                pub unsafe extern "C" fn $export $args -> $ret {
                    static R: Real = Real::named(
                        // SAFETY-free: a literal with a trailing NUL.
                        match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($export), "\0").as_bytes()) {
                            Ok(c) => c,
                            Err(_) => c"",
                        },
                    );
                    crate::stats::count(Family::$fam as usize);
                    // SAFETY: forwarded C contract.
                    guard(999, || unsafe { call_hook!($hook, &R, $names) })
                }
            )*
        )*

        impl Family {
            /// Launch functions: interposed only under a compute share.
            pub fn is_launch(self) -> bool {
                matches!(
                    self,
                    Family::LaunchKernel | Family::LaunchCooperative | Family::LaunchKernelEx
                )
            }

            /// Whether this family is handed out under `shim`'s limits:
            /// launches under a compute share, graph launches and the
            /// lookup functions under either limit, the rest under a
            /// memory cap.
            pub fn wanted(self, shim: &crate::state::Shim) -> bool {
                match self {
                    Family::GraphLaunch | Family::GetProcAddress | Family::GetProcAddressV2 => {
                        shim.active()
                    }
                    // Where root's limits apply: the place to fail closed.
                    Family::Init => shim.recorded,
                    f if f.is_launch() => shim.compute_active,
                    _ => shim.memory_active,
                }
            }

            pub fn is_nvml(self) -> bool {
                matches!(self, Family::NvmlMemoryInfo | Family::NvmlMemoryInfoV2)
            }

            pub fn slots(self) -> &'static [Real; N_INST] {
                match self { $(Family::$fam => &$fam::REAL),* }
            }

            pub fn wrappers(self) -> [*mut c_void; N_INST] {
                match self { $(Family::$fam => $fam::wrappers()),* }
            }
        }

        /// Every family, in declaration order (for the call counts).
        pub const ALL: &[Family] = &[$(Family::$fam),*];

        /// The family of an exported name we interpose.
        pub fn export_family(name: &[u8]) -> Option<Family> {
            $($(
                if name == stringify!($export).as_bytes() {
                    return Some(Family::$fam);
                }
            )*)*
            None
        }

        /// Every exported name (for tests and docs).
        #[cfg(test)]
        pub const EXPORTS: &[&str] = &[$($(stringify!($export)),*),*];
    };
}

// Each family names its prototype in gpuslice-cuda-abi (`as pfn::…`):
// the exported signature is checked against it at compile time. The NVML
// exports return `int` as they always have (nvml.h's `nvmlReturn_t` enum
// is an `unsigned`, the same 32 bits), so they are not checked that way;
// their hooks call the real NVML through the ABI's prototypes.
families! {
    MemAlloc: crate::hooks::mem_alloc as pfn::MemAlloc,
        (dptr: *mut CUdeviceptr, size: usize), (dptr, size) -> CUresult,
        [cuMemAlloc_v2];
    MemAllocPitch: crate::hooks::mem_alloc_pitch as pfn::MemAllocPitch,
        (dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint),
        (dptr, pitch, width, height, elem) -> CUresult,
        [cuMemAllocPitch_v2];
    MemAllocManaged: crate::hooks::mem_alloc_managed as pfn::MemAllocManaged,
        (dptr: *mut CUdeviceptr, size: usize, flags: c_uint), (dptr, size, flags) -> CUresult,
        [cuMemAllocManaged];
    MemAllocAsync: crate::hooks::mem_alloc_async as pfn::MemAllocAsync,
        (dptr: *mut CUdeviceptr, size: usize, stream: CUstream), (dptr, size, stream) -> CUresult,
        [cuMemAllocAsync, cuMemAllocAsync_ptsz];
    MemAllocFromPoolAsync: crate::hooks::mem_alloc_from_pool_async as pfn::MemAllocFromPoolAsync,
        (dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, stream: CUstream),
        (dptr, size, pool, stream) -> CUresult,
        [cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz];
    MemFree: crate::hooks::mem_free as pfn::MemFree,
        (dptr: CUdeviceptr), (dptr) -> CUresult,
        [cuMemFree_v2];
    MemFreeAsync: crate::hooks::mem_free_async as pfn::MemFreeAsync,
        (dptr: CUdeviceptr, stream: CUstream), (dptr, stream) -> CUresult,
        [cuMemFreeAsync, cuMemFreeAsync_ptsz];
    MemPoolTrimTo: crate::hooks::mem_pool_trim_to as pfn::MemPoolTrimTo,
        (pool: CUmemoryPool, keep: usize), (pool, keep) -> CUresult,
        [cuMemPoolTrimTo];
    MemPoolCreate: crate::hooks::mem_pool_create as pfn::MemPoolCreate,
        (pool: *mut CUmemoryPool, props: *const CUmemPoolProps), (pool, props) -> CUresult,
        [cuMemPoolCreate];
    MemPoolDestroy: crate::hooks::mem_pool_destroy as pfn::MemPoolDestroy,
        (pool: CUmemoryPool), (pool) -> CUresult,
        [cuMemPoolDestroy];
    MemCreate: crate::hooks::mem_create as pfn::MemCreate,
        (handle: *mut u64, size: usize, prop: *const CUmemAllocationProp, flags: u64),
        (handle, size, prop, flags) -> CUresult,
        [cuMemCreate];
    MemRelease: crate::hooks::mem_release as pfn::MemRelease,
        (handle: u64), (handle) -> CUresult,
        [cuMemRelease];
    MemMap: crate::hooks::mem_map as pfn::MemMap,
        (ptr: CUdeviceptr, size: usize, offset: usize, handle: u64, flags: u64),
        (ptr, size, offset, handle, flags) -> CUresult,
        [cuMemMap];
    MemUnmap: crate::hooks::mem_unmap as pfn::MemUnmap,
        (ptr: CUdeviceptr, size: usize), (ptr, size) -> CUresult,
        [cuMemUnmap];
    ArrayCreate: crate::hooks::array_create as pfn::ArrayCreate,
        (arr: *mut CUarray, desc: *const ArrayDescriptor), (arr, desc) -> CUresult,
        [cuArrayCreate_v2];
    Array3DCreate: crate::hooks::array3d_create as pfn::Array3DCreate,
        (arr: *mut CUarray, desc: *const Array3DDescriptor), (arr, desc) -> CUresult,
        [cuArray3DCreate_v2];
    ArrayDestroy: crate::hooks::array_destroy as pfn::ArrayDestroy,
        (arr: CUarray), (arr) -> CUresult,
        [cuArrayDestroy];
    MipmappedArrayCreate: crate::hooks::mipmapped_create as pfn::MipmappedArrayCreate,
        (arr: *mut CUarray, desc: *const Array3DDescriptor, levels: c_uint),
        (arr, desc, levels) -> CUresult,
        [cuMipmappedArrayCreate];
    MipmappedArrayDestroy: crate::hooks::array_destroy as pfn::MipmappedArrayDestroy,
        (arr: CUarray), (arr) -> CUresult,
        [cuMipmappedArrayDestroy];
    MemGetInfo: crate::hooks::mem_get_info as pfn::MemGetInfo,
        (free: *mut usize, total: *mut usize), (free, total) -> CUresult,
        [cuMemGetInfo_v2];
    MemGetInfoV1: crate::hooks::mem_get_info_v1 as pfn::MemGetInfoV1,
        (free: *mut c_uint, total: *mut c_uint), (free, total) -> CUresult,
        [cuMemGetInfo];
    GraphLaunch: crate::hooks::graph_launch as pfn::GraphLaunch,
        (exec: CUgraphExec, stream: CUstream), (exec, stream) -> CUresult,
        [cuGraphLaunch, cuGraphLaunch_ptsz];
    GraphUpload: crate::hooks::graph_upload as pfn::GraphUpload,
        (exec: CUgraphExec, stream: CUstream), (exec, stream) -> CUresult,
        [cuGraphUpload, cuGraphUpload_ptsz];
    LaunchKernel: crate::hooks::launch_kernel as pfn::LaunchKernel,
        (f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
         shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void),
        (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) -> CUresult,
        [cuLaunchKernel, cuLaunchKernel_ptsz];
    LaunchCooperative: crate::hooks::launch_cooperative as pfn::LaunchCooperativeKernel,
        (f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
         shmem: c_uint, stream: CUstream, params: *mut *mut c_void),
        (f, gx, gy, gz, bx, by, bz, shmem, stream, params) -> CUresult,
        [cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz];
    LaunchKernelEx: crate::hooks::launch_kernel_ex as pfn::LaunchKernelEx,
        (config: *const LaunchConfig, f: CUfunction, params: *mut *mut c_void,
         extra: *mut *mut c_void),
        (config, f, params, extra) -> CUresult,
        [cuLaunchKernelEx, cuLaunchKernelEx_ptsz];
    DeviceGraphMemTrim: crate::hooks::device_graph_mem_trim as pfn::DeviceGraphMemTrim,
        (dev: CUdevice), (dev) -> CUresult,
        [cuDeviceGraphMemTrim];
    DeviceTotalMem: crate::hooks::device_total_mem as pfn::DeviceTotalMem,
        (bytes: *mut usize, dev: CUdevice), (bytes, dev) -> CUresult,
        [cuDeviceTotalMem_v2];
    DeviceTotalMemV1: crate::hooks::device_total_mem_v1 as pfn::DeviceTotalMemV1,
        (bytes: *mut c_uint, dev: CUdevice), (bytes, dev) -> CUresult,
        [cuDeviceTotalMem];
    PrimaryCtxRetain: crate::resident::primary_ctx_retain as pfn::DevicePrimaryCtxRetain,
        (pctx: *mut CUcontext, dev: CUdevice), (pctx, dev) -> CUresult,
        [cuDevicePrimaryCtxRetain];
    PrimaryCtxRelease: crate::resident::primary_ctx_release as pfn::DevicePrimaryCtxRelease,
        (dev: CUdevice), (dev) -> CUresult,
        [cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2];
    PrimaryCtxReset: crate::resident::primary_ctx_reset as pfn::DevicePrimaryCtxReset,
        (dev: CUdevice), (dev) -> CUresult,
        [cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2];
    CtxCreate: crate::resident::ctx_create as pfn::CtxCreate,
        (pctx: *mut CUcontext, flags: c_uint, dev: CUdevice), (pctx, flags, dev) -> CUresult,
        [cuCtxCreate_v2];
    CtxCreateV3: crate::resident::ctx_create_v3 as pfn::CtxCreateV3,
        (pctx: *mut CUcontext, params: *mut c_void, n: c_int, flags: c_uint, dev: CUdevice),
        (pctx, params, n, flags, dev) -> CUresult,
        [cuCtxCreate_v3];
    CtxCreateV4: crate::resident::ctx_create_v4 as pfn::CtxCreateV4,
        (pctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice),
        (pctx, params, flags, dev) -> CUresult,
        [cuCtxCreate_v4];
    GreenCtxCreate: crate::resident::green_ctx_create as pfn::GreenCtxCreate,
        (pctx: *mut CUcontext, desc: *mut c_void, dev: CUdevice, flags: c_uint),
        (pctx, desc, dev, flags) -> CUresult,
        [cuGreenCtxCreate];
    CtxDestroy: crate::resident::ctx_destroy as pfn::CtxDestroy,
        (ctx: CUcontext), (ctx) -> CUresult,
        [cuCtxDestroy_v2, cuGreenCtxDestroy];
    ModuleLoad: crate::resident::module_load as pfn::ModuleLoad,
        (m: *mut CUhandle, fname: *const c_char), (m, fname) -> CUresult,
        [cuModuleLoad];
    ModuleLoadData: crate::resident::module_load_data as pfn::ModuleLoadData,
        (m: *mut CUhandle, image: *const c_void), (m, image) -> CUresult,
        [cuModuleLoadData, cuModuleLoadFatBinary];
    ModuleLoadDataEx: crate::resident::module_load_data_ex as pfn::ModuleLoadDataEx,
        (m: *mut CUhandle, image: *const c_void, n: c_uint, opts: *mut c_int, vals: *mut *mut c_void),
        (m, image, n, opts, vals) -> CUresult,
        [cuModuleLoadDataEx];
    LibraryLoad: crate::resident::library_load as pfn::LibraryLoadData,
        (lib: *mut CUhandle, code: *const c_void, jit_opts: *mut c_int, jit_vals: *mut *mut c_void,
         n_jit: c_uint, lib_opts: *mut c_int, lib_vals: *mut *mut c_void, n_lib: c_uint),
        (lib, code, jit_opts, jit_vals, n_jit, lib_opts, lib_vals, n_lib) -> CUresult,
        [cuLibraryLoadData, cuLibraryLoadFromFile];
    Unload: crate::resident::unload_hook as pfn::ModuleUnload,
        (h: CUhandle), (h) -> CUresult,
        [cuModuleUnload, cuLibraryUnload];
    CtxSetLimit: crate::resident::ctx_set_limit as pfn::CtxSetLimit,
        (limit: c_int, value: usize), (limit, value) -> CUresult,
        [cuCtxSetLimit];
    GetProcAddress: get_proc_address as pfn::GetProcAddressV1,
        (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64),
        (symbol, pfn, version, flags) -> CUresult,
        [cuGetProcAddress];
    GetProcAddressV2: get_proc_address_v2 as pfn::GetProcAddress,
        (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int),
        (symbol, pfn, version, flags, status) -> CUresult,
        [cuGetProcAddress_v2];
    Init: crate::init::cu_init as pfn::Init,
        (flags: c_uint), (flags) -> CUresult,
        [cuInit];
    NvmlMemoryInfo: crate::nvml::memory_info,
        (dev: NvmlDevice, mem: *mut NvmlMemory), (dev, mem) -> c_int,
        [nvmlDeviceGetMemoryInfo];
    NvmlMemoryInfoV2: crate::nvml::memory_info_v2,
        (dev: NvmlDevice, mem: *mut NvmlMemoryV2), (dev, mem) -> c_int,
        [nvmlDeviceGetMemoryInfo_v2];
}

/// The family `cuGetProcAddress(name, cudaVersion)` resolves to, by base
/// name and the version at which its ABI changed (`_v2` since CUDA 3.2 for
/// the classic allocation calls, `cuGetProcAddress_v2` since 12.0). Older
/// ABIs than we implement are left alone. Exact suffixed names are accepted
/// too.
pub fn proc_family(name: &[u8], version: c_int) -> Option<Family> {
    use Family::*;
    let v2_at = |fam: Family, since: c_int| (version >= since).then_some(fam);
    match name {
        b"cuMemAlloc" => v2_at(MemAlloc, 3020),
        b"cuMemAllocPitch" => v2_at(MemAllocPitch, 3020),
        b"cuMemAllocManaged" => Some(MemAllocManaged),
        b"cuMemAllocAsync" => Some(MemAllocAsync),
        b"cuMemAllocFromPoolAsync" => Some(MemAllocFromPoolAsync),
        b"cuMemFree" => v2_at(MemFree, 3020),
        b"cuMemFreeAsync" => Some(MemFreeAsync),
        b"cuMemPoolTrimTo" => Some(MemPoolTrimTo),
        b"cuMemPoolCreate" => Some(MemPoolCreate),
        b"cuMemPoolDestroy" => Some(MemPoolDestroy),
        b"cuMemCreate" => Some(MemCreate),
        b"cuMemRelease" => Some(MemRelease),
        b"cuMemMap" => Some(MemMap),
        b"cuMemUnmap" => Some(MemUnmap),
        b"cuArrayCreate" => v2_at(ArrayCreate, 3020),
        b"cuArray3DCreate" => v2_at(Array3DCreate, 3020),
        b"cuArrayDestroy" => Some(ArrayDestroy),
        b"cuMipmappedArrayCreate" => Some(MipmappedArrayCreate),
        b"cuMipmappedArrayDestroy" => Some(MipmappedArrayDestroy),
        b"cuMemGetInfo" if version >= 3020 => Some(MemGetInfo),
        b"cuMemGetInfo" => Some(MemGetInfoV1),
        b"cuGraphLaunch" => Some(GraphLaunch),
        b"cuGraphUpload" => Some(GraphUpload),
        b"cuLaunchKernel" => Some(LaunchKernel),
        b"cuLaunchCooperativeKernel" => Some(LaunchCooperative),
        b"cuLaunchKernelEx" => Some(LaunchKernelEx),
        b"cuDeviceGraphMemTrim" => Some(DeviceGraphMemTrim),
        b"cuDeviceTotalMem" if version >= 3020 => Some(DeviceTotalMem),
        b"cuDeviceTotalMem" => Some(DeviceTotalMemV1),
        b"cuDevicePrimaryCtxRetain" => Some(PrimaryCtxRetain),
        b"cuDevicePrimaryCtxRelease" => Some(PrimaryCtxRelease),
        b"cuDevicePrimaryCtxReset" => Some(PrimaryCtxReset),
        // cuCtxCreate's base name resolves to _v2, _v3 or _v4 by version
        // (ABIs differ); only the exact names are interposed.
        b"cuCtxDestroy" if version >= 4000 => Some(CtxDestroy),
        b"cuGreenCtxCreate" => Some(GreenCtxCreate),
        b"cuGreenCtxDestroy" => Some(CtxDestroy),
        b"cuModuleLoad" => Some(ModuleLoad),
        b"cuModuleLoadData" | b"cuModuleLoadFatBinary" => Some(ModuleLoadData),
        b"cuModuleLoadDataEx" => Some(ModuleLoadDataEx),
        b"cuLibraryLoadData" | b"cuLibraryLoadFromFile" => Some(LibraryLoad),
        b"cuModuleUnload" | b"cuLibraryUnload" => Some(Unload),
        b"cuCtxSetLimit" => Some(CtxSetLimit),
        b"cuInit" => Some(Init),
        b"cuGetProcAddress" if version >= 12000 => Some(GetProcAddressV2),
        b"cuGetProcAddress" => Some(GetProcAddress),
        other => export_family(other),
    }
}

// ------------------------------------------------- cuGetProcAddress and dlsym

// `cuGetProcAddress(_v2)` and `dlsym`: hand out our wrappers for the
// functions we interpose, recording the real function the driver / the
// loader returned for the caller's CUDA version and flags. They live with
// the name tables because the tables name them as hooks.

/// Replaces `*pfn` with our wrapper when `symbol` is one we interpose and a
/// cap is configured (else the caller keeps the real pointer: no overhead).
///
/// # Safety
/// `symbol` null or NUL-terminated; `pfn` null or valid.
unsafe fn swap_in(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    if pfn.is_null() || !shim().active() {
        return;
    }
    // SAFETY: per the contract.
    let Some(name) = (unsafe { sys::cstr(symbol) }) else {
        return;
    };
    // SAFETY: pfn valid; written by the driver.
    let p = unsafe { *pfn };
    if let Some(fam) = proc_family(name.to_bytes(), version).filter(|f| f.wanted(shim())) {
        if fam.is_launch() || fam == Family::GraphLaunch {
            let ptsz = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0
                || name.to_bytes().ends_with(b"_ptsz");
            if ptsz {
                mark_ptsz(p);
            }
        }
        // SAFETY: pfn valid.
        unsafe { *pfn = intercept(fam, p) };
    }
}

/// # Safety
/// C contract of `cuGetProcAddress` (pre-12.0 ABI).
pub unsafe fn get_proc_address(
    real: &Real,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the family's signature.
    let Some(f) = (unsafe { real.func::<pfn::GetProcAddressV1>() }) else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: caller contract.
    let rc = unsafe { f(symbol, pfn, version, flags) };
    if rc == CUDA_SUCCESS {
        // SAFETY: caller contract.
        unsafe { swap_in(symbol, pfn, version, flags) };
    }
    rc
}

/// # Safety
/// C contract of `cuGetProcAddress_v2`.
pub unsafe fn get_proc_address_v2(
    real: &Real,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    // SAFETY: the family's signature.
    let Some(f) = (unsafe { real.func::<pfn::GetProcAddress>() }) else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: caller contract.
    let rc = unsafe { f(symbol, pfn, version, flags, status) };
    if rc == CUDA_SUCCESS {
        // SAFETY: caller contract.
        unsafe { swap_in(symbol, pfn, version, flags) };
    }
    rc
}

/// Hands out an instance of `fam` that calls `real`: the one already
/// recording `real`, else a free one. Returns `real` itself when `real` is
/// one of ours (never record ourselves: that would loop) or when every
/// instance is taken by other pointers (that caller then goes uncapped,
/// logged).
pub fn intercept(fam: Family, real: *mut c_void) -> *mut c_void {
    if real.is_null() || crate::sys::is_ours(real) {
        return real;
    }
    crate::real::set_hint(fam.is_nvml(), real);
    let slots = fam.slots();
    let wrappers = fam.wrappers();
    if let Some(i) = slots.iter().position(|s| s.peek() == real) {
        return wrappers[i];
    }
    for (i, s) in slots.iter().enumerate() {
        if s.claim(real) {
            return wrappers[i];
        }
    }
    crate::sys::log_line(&format!(
        "more than {N_INST} variants of {fam:?}; one is left uncapped"
    ));
    real
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_families() {
        // (name, the caller's CUDA version, the family it is interposed as)
        let cases: [(&[u8], c_int, Option<Family>); 9] = [
            (b"cuMemAlloc", 13000, Some(Family::MemAlloc)),
            (b"cuMemAlloc", 3000, None), // the 32-bit ABI left alone
            (b"cuMemGetInfo", 2000, Some(Family::MemGetInfoV1)),
            (b"cuGetProcAddress", 11080, Some(Family::GetProcAddress)),
            (b"cuGetProcAddress", 12000, Some(Family::GetProcAddressV2)),
            (b"cuMemAllocAsync_ptsz", 0, Some(Family::MemAllocAsync)),
            (b"cuLaunchKernel", 13000, Some(Family::LaunchKernel)),
            (b"cuLaunchKernelEx_ptsz", 0, Some(Family::LaunchKernelEx)),
            (b"cuLaunchHostFunc", 13000, None),
        ];
        for (name, version, family) in cases {
            let shown = String::from_utf8_lossy(name);
            assert_eq!(proc_family(name, version), family, "{shown} at {version}");
        }
        assert_eq!(
            export_family(b"nvmlDeviceGetMemoryInfo_v2"),
            Some(Family::NvmlMemoryInfoV2)
        );
        assert!(EXPORTS.contains(&"cuGraphUpload_ptsz"));
        assert_eq!(EXPORTS.len(), 62);
        assert!(ALL.len() <= 64, "the call counts hold 64 families");
    }

    #[test]
    fn instances_are_distinct_functions() {
        let w = Family::MemAlloc.wrappers();
        for i in 0..N_INST {
            for j in 0..i {
                assert_ne!(w[i], w[j]);
            }
        }
        assert_ne!(w[0], Family::MemFree.wrappers()[0]);
    }
}
