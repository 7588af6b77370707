//! The interposed entry points: exported symbols and anonymous instances
//! per family (see [`crate::real`]), and the name tables our `dlsym` and
//! `cuGetProcAddress` use.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::cuda::*;
use crate::real::{guard, Real, N_INST};

macro_rules! call_hook {
    ($hook:path, $real:expr, ($($n:ident),*)) => {
        $hook($real, $($n),*)
    };
}

macro_rules! families {
    ($(
        $fam:ident: $hook:path, $args:tt, $names:tt -> $ret:ty, [$($export:ident),*];
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
                    // SAFETY: forwarded C contract.
                    guard(999, || unsafe { call_hook!($hook, &REAL[I], $names) })
                }

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

families! {
    MemAlloc: crate::hooks::mem_alloc,
        (dptr: *mut CUdeviceptr, size: usize), (dptr, size) -> CUresult,
        [cuMemAlloc_v2];
    MemAllocPitch: crate::hooks::mem_alloc_pitch,
        (dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint),
        (dptr, pitch, width, height, elem) -> CUresult,
        [cuMemAllocPitch_v2];
    MemAllocManaged: crate::hooks::mem_alloc_managed,
        (dptr: *mut CUdeviceptr, size: usize, flags: c_uint), (dptr, size, flags) -> CUresult,
        [cuMemAllocManaged];
    MemAllocAsync: crate::hooks::mem_alloc_async,
        (dptr: *mut CUdeviceptr, size: usize, stream: CUstream), (dptr, size, stream) -> CUresult,
        [cuMemAllocAsync, cuMemAllocAsync_ptsz];
    MemAllocFromPoolAsync: crate::hooks::mem_alloc_from_pool_async,
        (dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, stream: CUstream),
        (dptr, size, pool, stream) -> CUresult,
        [cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz];
    MemFree: crate::hooks::mem_free,
        (dptr: CUdeviceptr), (dptr) -> CUresult,
        [cuMemFree_v2];
    MemFreeAsync: crate::hooks::mem_free_async,
        (dptr: CUdeviceptr, stream: CUstream), (dptr, stream) -> CUresult,
        [cuMemFreeAsync, cuMemFreeAsync_ptsz];
    MemPoolTrimTo: crate::hooks::mem_pool_trim_to,
        (pool: CUmemoryPool, keep: usize), (pool, keep) -> CUresult,
        [cuMemPoolTrimTo];
    MemPoolDestroy: crate::hooks::mem_pool_destroy,
        (pool: CUmemoryPool), (pool) -> CUresult,
        [cuMemPoolDestroy];
    MemCreate: crate::hooks::mem_create,
        (handle: *mut u64, size: usize, prop: *const CUmemAllocationProp, flags: u64),
        (handle, size, prop, flags) -> CUresult,
        [cuMemCreate];
    MemRelease: crate::hooks::mem_release,
        (handle: u64), (handle) -> CUresult,
        [cuMemRelease];
    ArrayCreate: crate::hooks::array_create,
        (arr: *mut CUarray, desc: *const ArrayDescriptor), (arr, desc) -> CUresult,
        [cuArrayCreate_v2];
    Array3DCreate: crate::hooks::array3d_create,
        (arr: *mut CUarray, desc: *const Array3DDescriptor), (arr, desc) -> CUresult,
        [cuArray3DCreate_v2];
    ArrayDestroy: crate::hooks::array_destroy,
        (arr: CUarray), (arr) -> CUresult,
        [cuArrayDestroy];
    MipmappedArrayCreate: crate::hooks::mipmapped_create,
        (arr: *mut CUarray, desc: *const Array3DDescriptor, levels: c_uint),
        (arr, desc, levels) -> CUresult,
        [cuMipmappedArrayCreate];
    MipmappedArrayDestroy: crate::hooks::mipmapped_destroy,
        (arr: CUarray), (arr) -> CUresult,
        [cuMipmappedArrayDestroy];
    MemGetInfo: crate::hooks::mem_get_info,
        (free: *mut usize, total: *mut usize), (free, total) -> CUresult,
        [cuMemGetInfo_v2];
    MemGetInfoV1: crate::hooks::mem_get_info_v1,
        (free: *mut c_uint, total: *mut c_uint), (free, total) -> CUresult,
        [cuMemGetInfo];
    GraphLaunch: crate::hooks::graph_launch,
        (exec: CUgraphExec, stream: CUstream), (exec, stream) -> CUresult,
        [cuGraphLaunch, cuGraphLaunch_ptsz];
    GraphUpload: crate::hooks::graph_upload,
        (exec: CUgraphExec, stream: CUstream), (exec, stream) -> CUresult,
        [cuGraphUpload, cuGraphUpload_ptsz];
    LaunchKernel: crate::hooks::launch_kernel,
        (f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
         shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void),
        (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) -> CUresult,
        [cuLaunchKernel, cuLaunchKernel_ptsz];
    LaunchCooperative: crate::hooks::launch_cooperative,
        (f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
         shmem: c_uint, stream: CUstream, params: *mut *mut c_void),
        (f, gx, gy, gz, bx, by, bz, shmem, stream, params) -> CUresult,
        [cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz];
    LaunchKernelEx: crate::hooks::launch_kernel_ex,
        (config: *const crate::compute::LaunchConfig, f: CUfunction, params: *mut *mut c_void,
         extra: *mut *mut c_void),
        (config, f, params, extra) -> CUresult,
        [cuLaunchKernelEx, cuLaunchKernelEx_ptsz];
    DeviceGraphMemTrim: crate::hooks::device_graph_mem_trim,
        (dev: CUdevice), (dev) -> CUresult,
        [cuDeviceGraphMemTrim];
    GetProcAddress: crate::procaddr::get_proc_address,
        (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64),
        (symbol, pfn, version, flags) -> CUresult,
        [cuGetProcAddress];
    GetProcAddressV2: crate::procaddr::get_proc_address_v2,
        (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int),
        (symbol, pfn, version, flags, status) -> CUresult,
        [cuGetProcAddress_v2];
    Init: crate::init::cu_init,
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
        b"cuMemPoolDestroy" => Some(MemPoolDestroy),
        b"cuMemCreate" => Some(MemCreate),
        b"cuMemRelease" => Some(MemRelease),
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
        b"cuInit" => Some(Init),
        b"cuGetProcAddress" if version >= 12000 => Some(GetProcAddressV2),
        b"cuGetProcAddress" => Some(GetProcAddress),
        other => export_family(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_families() {
        assert_eq!(proc_family(b"cuMemAlloc", 13000), Some(Family::MemAlloc));
        assert_eq!(
            proc_family(b"cuMemAlloc", 3000),
            None,
            "32-bit ABI left alone"
        );
        assert_eq!(
            proc_family(b"cuMemGetInfo", 2000),
            Some(Family::MemGetInfoV1)
        );
        assert_eq!(
            proc_family(b"cuGetProcAddress", 11080),
            Some(Family::GetProcAddress)
        );
        assert_eq!(
            proc_family(b"cuGetProcAddress", 12000),
            Some(Family::GetProcAddressV2)
        );
        assert_eq!(
            proc_family(b"cuMemAllocAsync_ptsz", 0),
            Some(Family::MemAllocAsync)
        );
        assert_eq!(
            proc_family(b"cuLaunchKernel", 13000),
            Some(Family::LaunchKernel)
        );
        assert_eq!(
            proc_family(b"cuLaunchKernelEx_ptsz", 0),
            Some(Family::LaunchKernelEx)
        );
        assert_eq!(proc_family(b"cuLaunchHostFunc", 13000), None);
        assert_eq!(
            export_family(b"nvmlDeviceGetMemoryInfo_v2"),
            Some(Family::NvmlMemoryInfoV2)
        );
        assert!(EXPORTS.contains(&"cuGraphUpload_ptsz"));
        assert_eq!(EXPORTS.len(), 37);
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
