//! The NVML half (`libnvidia-ml.so.1`).
//!
//! NVML sees the GPUs whose `/dev/nvidia<minor>` opens (success or ENXIO),
//! as the real NVML does inside a container; unlike libcuda it never
//! re-creates nodes and ignores `CUDA_VISIBLE_DEVICES`. MIG devices are
//! listed when their capability nodes open. Struct layouts follow `nvml.h`
//! exactly: nvml-wrapper reads them.
//!
//! Handles are opaque encoded integers: `HANDLE_BASE + (gpu << 8) + slot`,
//! where slot 0 is the whole GPU and slot k the (k-1)-th MIG device.

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::cuda::PciAddress;
use crate::ffi::{self, guard, CopyError};
use crate::host::{self, Host, Kernel, KernelGpu, KernelMig, Node, NVIDIA_MAJOR};
use crate::memory;

mod events;
mod limits;
mod processes;
mod telemetry;

pub use gpuslice_cuda_abi::nvml::*;

/// PCI ids of an H200 SXM.
const PCI_DEVICE_ID: c_uint = 0x2335_10de;
const PCI_SUBSYSTEM_ID: c_uint = 0x18be_10de;
/// Upper bound of MIG devices per H200, what nvmlDeviceGetMaxMigDeviceCount says.
const MAX_MIG_DEVICES: c_uint = 7;

// ---------------------------------------------------------------- state

/// A GPU NVML can see, with the MIG devices it can see on it.
struct Gpu {
    info: KernelGpu,
    migs: Vec<KernelMig>,
}

struct View {
    kernel: Kernel,
    gpus: Vec<Gpu>,
}

struct Slot {
    refs: u32,
    view: Option<Arc<View>>,
}

static SLOT: Mutex<Slot> = Mutex::new(Slot {
    refs: 0,
    view: None,
});

fn slot() -> MutexGuard<'static, Slot> {
    SLOT.lock().unwrap_or_else(|e| e.into_inner())
}

fn view() -> Result<Arc<View>, NvmlReturn> {
    slot().view.clone().ok_or(NVML_ERROR_UNINITIALIZED)
}

/// Reads the host as NVML would at init.
fn load_view(host: &Host) -> Result<View, NvmlReturn> {
    let kernel = host.kernel().ok_or(NVML_ERROR_DRIVER_NOT_LOADED)?;
    let ctl_path = host.path("dev/nvidiactl");
    match host::access(&frontend_node(&ctl_path, host::NVIDIACTL_MINOR)) {
        host::Access::Reachable => {}
        host::Access::Missing => return Err(NVML_ERROR_DRIVER_NOT_LOADED),
        host::Access::Denied => return Err(NVML_ERROR_NO_PERMISSION),
    }
    let caps_major = host.caps_major();
    let gpus = kernel
        .gpus
        .iter()
        .filter(|g| {
            let path = host.path(&format!("dev/nvidia{}", g.minor));
            host::access(&frontend_node(&path, g.minor)) == host::Access::Reachable
        })
        .map(|g| Gpu {
            info: g.clone(),
            migs: g
                .migs
                .iter()
                .filter(|m| g.mig_enabled && mig_visible(host, caps_major, m))
                .cloned()
                .collect(),
        })
        .collect();
    Ok(View { kernel, gpus })
}

fn frontend_node(path: &std::path::Path, minor: u32) -> Node<'_> {
    Node {
        path,
        major: NVIDIA_MAJOR,
        minor,
        mode: 0o666,
        read_only: false,
    }
}

fn mig_visible(host: &Host, caps_major: u32, mig: &KernelMig) -> bool {
    [mig.gi_minor, mig.ci_minor].iter().all(|&minor| {
        let path = host.path(&format!("dev/nvidia-caps/nvidia-cap{minor}"));
        let node = Node {
            path: &path,
            major: caps_major,
            minor,
            mode: 0o444,
            read_only: true,
        };
        host::access(&node) == host::Access::Reachable
    })
}

fn init() -> NvmlReturn {
    let mut slot = slot();
    if slot.refs == 0 {
        match load_view(&Host::from_env()) {
            Ok(view) => slot.view = Some(Arc::new(view)),
            Err(e) => return e,
        }
    }
    slot.refs += 1;
    NVML_SUCCESS
}

// ---------------------------------------------------------------- handles

const HANDLE_BASE: usize = 0x4E56_4D4C_0000;

fn handle(gpu: usize, mig: Option<usize>) -> NvmlDevice {
    // Opaque token, never dereferenced.
    (HANDLE_BASE + (gpu << 8) + mig.map_or(0, |m| m + 1)) as NvmlDevice
}

/// What a handle names, resolved against the current view.
struct Target {
    view: Arc<View>,
    gpu: usize,
    mig: Option<usize>,
}

impl Target {
    fn gpu(&self) -> &Gpu {
        &self.view.gpus[self.gpu]
    }

    fn mig(&self) -> Option<&KernelMig> {
        self.mig.map(|m| &self.gpu().migs[m])
    }

    fn whole_gpu(&self) -> Result<&Gpu, NvmlReturn> {
        match self.mig {
            None => Ok(self.gpu()),
            Some(_) => Err(NVML_ERROR_NOT_SUPPORTED),
        }
    }

    fn mig_only(&self) -> Result<&KernelMig, NvmlReturn> {
        self.mig().ok_or(NVML_ERROR_NOT_SUPPORTED)
    }
}

fn resolve(device: NvmlDevice) -> Result<Target, NvmlReturn> {
    let view = view()?;
    let offset = (device as usize)
        .checked_sub(HANDLE_BASE)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let (gpu, slot) = (offset >> 8, offset & 0xff);
    let g = view.gpus.get(gpu).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let mig = match slot {
        0 => None,
        s if s <= g.migs.len() => Some(s - 1),
        _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
    };
    Ok(Target { view, gpu, mig })
}

// ---------------------------------------------------------------- helpers

fn rc(result: Result<(), NvmlReturn>) -> NvmlReturn {
    ffi::code(result, NVML_SUCCESS)
}

/// Writes an out-parameter, mapping a null pointer to INVALID_ARGUMENT.
///
/// # Safety
/// As [`ffi::write_out`].
unsafe fn out<T>(ptr: *mut T, value: T) -> Result<(), NvmlReturn> {
    // SAFETY: forwarded contract.
    unsafe { ffi::write_out_or(ptr, value, NVML_ERROR_INVALID_ARGUMENT) }
}

/// # Safety
/// `buf` must be null or valid for `len` bytes.
unsafe fn out_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), NvmlReturn> {
    // SAFETY: forwarded contract.
    unsafe { ffi::copy_str_exact(buf, len as usize, s) }.map_err(|e| match e {
        CopyError::Null => NVML_ERROR_INVALID_ARGUMENT,
        CopyError::TooSmall => NVML_ERROR_INSUFFICIENT_SIZE,
    })
}

/// Fills a fixed C char array with `s` (truncated, NUL-terminated).
fn fill(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    if let Some(nul) = dst.get_mut(n) {
        *nul = 0;
    }
}

fn pci_info(bus_id: &str) -> NvmlPciInfo {
    let a = PciAddress::parse(bus_id).unwrap_or_default();
    let mut info = NvmlPciInfo {
        bus_id_legacy: [0; 16],
        domain: a.domain,
        bus: a.bus,
        device: a.device,
        pci_device_id: PCI_DEVICE_ID,
        pci_sub_system_id: PCI_SUBSYSTEM_ID,
        bus_id: [0; 32],
    };
    // NVML's busId has an 8-digit domain; the legacy field a 4-digit one.
    let tail = format!("{:02X}:{:02X}.{:X}", a.bus, a.device, a.function);
    fill(&mut info.bus_id, &format!("{:08X}:{tail}", a.domain));
    fill(&mut info.bus_id_legacy, &format!("{:04X}:{tail}", a.domain));
    info
}

/// (total, used) of what a handle names: every live process's memory on
/// it, as the real NVML reports the device's use.
fn memory_of(t: &Target) -> (u64, u64) {
    let gpu = &t.gpu().info;
    let (total, gi) = match t.mig() {
        Some(m) => (m.memory_bytes, Some(m.gi)),
        None => (gpu.memory_bytes, None),
    };
    (total, memory::processes(gpu.minor, gi).values().sum())
}

/// Runs `f` on the resolved handle inside a panic guard.
fn with_device(
    device: NvmlDevice,
    f: impl FnOnce(&Target) -> Result<(), NvmlReturn>,
) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        rc(resolve(device).and_then(|t| f(&t)))
    })
}

/// A getter's body: the value `value` finds for the device, written to
/// `ptr`.
///
/// # Safety
/// `ptr` null or valid for a write.
unsafe fn write_device_value<T>(
    device: NvmlDevice,
    ptr: *mut T,
    value: impl FnOnce(&Target) -> Result<T, NvmlReturn>,
) -> NvmlReturn {
    with_device(device, |t| {
        let v = value(t)?;
        // SAFETY: caller contract.
        unsafe { out(ptr, v) }
    })
}

/// A lookup by name's body: the handle `find` picks for the string `name`
/// (INVALID_ARGUMENT when it is null or not UTF-8), written to `device`.
///
/// # Safety
/// `name` null or NUL-terminated; `device` null or valid for a write.
unsafe fn handle_by_name(
    name: *const c_char,
    device: *mut NvmlDevice,
    find: impl FnOnce(&View, &str) -> Result<NvmlDevice, NvmlReturn>,
) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        rc(view().and_then(|v| {
            // SAFETY: caller contract.
            let text = unsafe { ffi::read_str(name) }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
            let h = find(&v, text)?;
            // SAFETY: caller contract.
            unsafe { out(device, h) }
        }))
    })
}

// ---------------------------------------------------------------- init

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, init)
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    nvmlInit_v2()
}

/// Flags (`NO_GPUS`, `NO_ATTACH`) change nothing here: init never fails for
/// lack of GPUs and attaching is free.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        let mut slot = slot();
        match slot.refs {
            0 => NVML_ERROR_UNINITIALIZED,
            n => {
                slot.refs = n - 1;
                if slot.refs == 0 {
                    slot.view = None;
                }
                NVML_SUCCESS
            }
        }
    })
}

const ERROR_STRINGS: &[(NvmlReturn, &CStr)] = &[
    (NVML_SUCCESS, c"Success"),
    (NVML_ERROR_UNINITIALIZED, c"Uninitialized"),
    (NVML_ERROR_INVALID_ARGUMENT, c"Invalid Argument"),
    (NVML_ERROR_NOT_SUPPORTED, c"Not Supported"),
    (NVML_ERROR_NO_PERMISSION, c"Insufficient Permissions"),
    (NVML_ERROR_NOT_FOUND, c"Not Found"),
    (NVML_ERROR_INSUFFICIENT_SIZE, c"Insufficient Size"),
    (NVML_ERROR_DRIVER_NOT_LOADED, c"Driver Not Loaded"),
    (
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        c"Argument version mismatch",
    ),
    (NVML_ERROR_UNKNOWN, c"Unknown Error"),
];

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    guard(c"Unknown Error".as_ptr(), || {
        ERROR_STRINGS
            .iter()
            .find(|(code, _)| *code == result)
            .map_or(c"Unknown Error", |(_, s)| s)
            .as_ptr()
    })
}

// ---------------------------------------------------------------- system

/// # Safety
/// `version` must be null or valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        // SAFETY: caller contract.
        rc(view().and_then(|v| unsafe { out_str(version, length, &v.kernel.driver_version) }))
    })
}

/// `<CUDA major>.<driver version>`, e.g. `13.580.159.04`.
///
/// # Safety
/// `version` must be null or valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        rc(view().and_then(|v| {
            let text = format!(
                "{}.{}",
                v.kernel.cuda_version / 1000,
                v.kernel.driver_version
            );
            // SAFETY: caller contract.
            unsafe { out_str(version, length, &text) }
        }))
    })
}

/// # Safety
/// `cuda_driver_version` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(
    cuda_driver_version: *mut c_int,
) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        // SAFETY: caller contract.
        rc(view().and_then(|v| unsafe { out(cuda_driver_version, v.kernel.cuda_version) }))
    })
}

/// # Safety
/// As `nvmlSystemGetCudaDriverVersion_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(
    cuda_driver_version: *mut c_int,
) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { nvmlSystemGetCudaDriverVersion_v2(cuda_driver_version) }
}

// ---------------------------------------------------------------- enumeration

/// # Safety
/// `count` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        // SAFETY: caller contract.
        rc(view().and_then(|v| unsafe { out(count, v.gpus.len() as c_uint) }))
    })
}

/// # Safety
/// `device` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        rc(view().and_then(|v| {
            let i = index as usize;
            if i >= v.gpus.len() {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            // SAFETY: caller contract.
            unsafe { out(device, handle(i, None)) }
        }))
    })
}

/// Accepts `GPU-` and `MIG-` UUIDs (a MIG UUID gives a MIG handle).
///
/// # Safety
/// `uuid` must be null or NUL-terminated; `device` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    let find = |v: &View, wanted: &str| {
        v.gpus
            .iter()
            .enumerate()
            .find_map(|(gi, g)| {
                if g.info.uuid.eq_ignore_ascii_case(wanted) {
                    return Some(handle(gi, None));
                }
                let m = g
                    .migs
                    .iter()
                    .position(|m| m.uuid.eq_ignore_ascii_case(wanted))?;
                Some(handle(gi, Some(m)))
            })
            .ok_or(NVML_ERROR_NOT_FOUND)
    };
    // SAFETY: caller contract.
    unsafe { handle_by_name(uuid, device, find) }
}

/// Accepts `00000000:18:00.0`, `0000:18:00.0` or `18:00.0`, any case.
///
/// # Safety
/// `bus_id` must be null or NUL-terminated; `device` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: caller contract.
    unsafe {
        handle_by_name(bus_id, device, |v, text| {
            let wanted = PciAddress::parse(text).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
            v.gpus
                .iter()
                .position(|g| PciAddress::parse(&g.info.pci_bus_id) == Some(wanted))
                .map(|i| handle(i, None))
                .ok_or(NVML_ERROR_NOT_FOUND)
        })
    }
}

// ---------------------------------------------------------------- identity

/// # Safety
/// `name` must be null or valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: NvmlDevice,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    with_device(device, |t| {
        let gpu = &t.gpu().info;
        let text = t
            .mig()
            .map_or_else(|| gpu.name.clone(), |m| gpu.mig_name(m));
        // SAFETY: caller contract.
        unsafe { out_str(name, length, &text) }
    })
}

/// # Safety
/// `uuid` must be null or valid for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: NvmlDevice,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    with_device(device, |t| {
        let text = t.mig().map_or(&t.gpu().info.uuid, |m| &m.uuid);
        // SAFETY: caller contract.
        unsafe { out_str(uuid, length, text) }
    })
}

/// # Safety
/// `index` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    with_device(device, |t| {
        t.whole_gpu()?;
        // SAFETY: caller contract.
        unsafe { out(index, t.gpu as c_uint) }
    })
}

/// # Safety
/// `minor` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: NvmlDevice,
    minor: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |t| {
        let gpu = t.whole_gpu()?;
        // SAFETY: caller contract.
        unsafe { out(minor, gpu.info.minor) }
    })
}

/// A MIG handle reports its parent's PCI location.
///
/// # Safety
/// `pci` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: NvmlDevice,
    pci: *mut NvmlPciInfo,
) -> NvmlReturn {
    with_device(device, |t| {
        // SAFETY: caller contract.
        unsafe { out(pci, pci_info(&t.gpu().info.pci_bus_id)) }
    })
}

/// # Safety
/// `major`/`minor` must be null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: NvmlDevice,
    major: *mut c_int,
    minor: *mut c_int,
) -> NvmlReturn {
    with_device(device, |_| {
        // SAFETY: caller contract.
        unsafe {
            out(major, 9)?;
            out(minor, 0)
        }
    })
}

/// # Safety
/// `mode` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: NvmlDevice,
    mode: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |t| {
        let state = match t.whole_gpu()?.info.persistence_mode {
            true => NVML_FEATURE_ENABLED,
            false => NVML_FEATURE_DISABLED,
        };
        // SAFETY: caller contract.
        unsafe { out(mode, state) }
    })
}

// ---------------------------------------------------------------- memory

/// # Safety
/// `memory` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    with_device(device, |t| {
        let (total, used) = memory_of(t);
        let value = NvmlMemory {
            total,
            free: total.saturating_sub(used),
            used,
        };
        // SAFETY: caller contract.
        unsafe { out(memory, value) }
    })
}

/// # Safety
/// `memory` must be null or valid for reads and writes of `nvmlMemory_v2_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    with_device(device, |t| {
        if memory.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid for reads by the caller's contract.
        if unsafe { (*memory).version } != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = memory_of(t);
        let value = NvmlMemoryV2 {
            version: NVML_MEMORY_V2,
            total,
            reserved: 0,
            free: total.saturating_sub(used),
            used,
        };
        // SAFETY: caller contract.
        unsafe { out(memory, value) }
    })
}

// ---------------------------------------------------------------- MIG

/// # Safety
/// `current`/`pending` must be null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: NvmlDevice,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |t| {
        let gpu = t.whole_gpu()?;
        let mode = match gpu.info.mig_enabled {
            true => NVML_FEATURE_ENABLED,
            false => NVML_FEATURE_DISABLED,
        };
        // SAFETY: caller contract.
        unsafe {
            out(current, mode)?;
            out(pending, mode)
        }
    })
}

/// # Safety
/// `count` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: NvmlDevice,
    count: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |t| {
        t.whole_gpu()?;
        // SAFETY: caller contract.
        unsafe { out(count, MAX_MIG_DEVICES) }
    })
}

/// Indices beyond the visible MIG devices give NOT_FOUND, as on a GPU whose
/// MIG slots are not all populated.
///
/// # Safety
/// `mig_device` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: NvmlDevice,
    index: c_uint,
    mig_device: *mut NvmlDevice,
) -> NvmlReturn {
    with_device(device, |t| {
        let gpu = t.whole_gpu()?;
        if !gpu.info.mig_enabled {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if index >= MAX_MIG_DEVICES {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let i = index as usize;
        if i >= gpu.migs.len() {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        // SAFETY: caller contract.
        unsafe { out(mig_device, handle(t.gpu, Some(i))) }
    })
}

/// # Safety
/// `device` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: NvmlDevice,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    with_device(mig_device, |t| {
        t.mig_only().map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
        // SAFETY: caller contract.
        unsafe { out(device, handle(t.gpu, None)) }
    })
}

/// # Safety
/// `is_mig` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: NvmlDevice,
    is_mig: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |t| {
        // SAFETY: caller contract.
        unsafe { out(is_mig, c_uint::from(t.mig.is_some())) }
    })
}

/// # Safety
/// `id` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: NvmlDevice,
    id: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: caller contract.
    unsafe { write_device_value(device, id, |t| Ok(t.mig_only()?.gi)) }
}

/// # Safety
/// `id` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: NvmlDevice,
    id: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: caller contract.
    unsafe { write_device_value(device, id, |t| Ok(t.mig_only()?.ci)) }
}

// ---------------------------------------------------------------- NVLink
//
// Link i of a GPU leads to its i-th NVLink peer (kernel.json order).

fn peer_of(t: &Target, link: c_uint) -> Result<Option<&str>, NvmlReturn> {
    let gpu = t.whole_gpu()?;
    Ok(gpu.info.nvlink_peers.get(link as usize).map(String::as_str))
}

/// # Safety
/// `is_active` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: NvmlDevice,
    link: c_uint,
    is_active: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |t| {
        let state = match peer_of(t, link)? {
            Some(_) => NVML_FEATURE_ENABLED,
            None => NVML_FEATURE_DISABLED,
        };
        // SAFETY: caller contract.
        unsafe { out(is_active, state) }
    })
}

/// # Safety
/// `pci` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: NvmlDevice,
    link: c_uint,
    pci: *mut NvmlPciInfo,
) -> NvmlReturn {
    with_device(device, |t| {
        let peer = peer_of(t, link)?.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        // SAFETY: caller contract.
        unsafe { out(pci, pci_info(peer)) }
    })
}

// The prototypes gpuslice calls these through (gpuslice-cuda-abi), checked
// at compile time, as for the CUDA half (`cuda/prototypes.rs`).
const _: pfn::Init = nvmlInit_v2;
const _: pfn::DeviceGetCount = nvmlDeviceGetCount_v2;
const _: pfn::DeviceGetHandleByIndex = nvmlDeviceGetHandleByIndex_v2;
const _: pfn::DeviceGetHandleByUuid = nvmlDeviceGetHandleByUUID;
const _: pfn::DeviceGetUuid = nvmlDeviceGetUUID;
const _: pfn::DeviceGetIndex = nvmlDeviceGetIndex;
const _: pfn::DeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo;
const _: pfn::DeviceGetMemoryInfoV2 = nvmlDeviceGetMemoryInfo_v2;
const _: pfn::DeviceGetComputeRunningProcesses = processes::nvmlDeviceGetComputeRunningProcesses_v3;
const _: pfn::DeviceGetComputeRunningProcesses = processes::nvmlDeviceGetComputeRunningProcesses_v2;
const _: pfn::DeviceGetComputeRunningProcessesV1 = processes::nvmlDeviceGetComputeRunningProcesses;

#[cfg(test)]
mod tests {
    use super::*;

    fn text(buf: &[c_char]) -> String {
        let bytes: Vec<u8> = buf
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(std::mem::size_of::<NvmlPciInfo>(), 16 + 5 * 4 + 32);
        assert_eq!(std::mem::size_of::<NvmlMemory>(), 24);
        assert_eq!(std::mem::size_of::<NvmlMemoryV2>(), 40);
        assert_eq!(NVML_MEMORY_V2, 40 | (2 << 24));
    }

    #[test]
    fn pci_info_formats() {
        let info = pci_info("0000:3b:00.0");
        assert_eq!(text(&info.bus_id), "00000000:3B:00.0");
        assert_eq!(text(&info.bus_id_legacy), "0000:3B:00.0");
        assert_eq!((info.domain, info.bus, info.device), (0, 0x3b, 0));
    }

    #[test]
    fn handles_before_init_are_uninitialized() {
        let mut count = 0;
        // SAFETY: count is a valid out-pointer.
        let r = unsafe { nvmlDeviceGetCount_v2(&mut count) };
        assert_eq!(r, NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    }
}
