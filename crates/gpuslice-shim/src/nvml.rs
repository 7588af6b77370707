//! NVML memory queries report the slice: total = cap, used = the slice's
//! charge, free = what is left (never more than the GPU really has free).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use gpuslice_ledger::{MAX_DEVICES, UNLIMITED};

use crate::config::NvmlMatch;
use crate::cuda::*;
use crate::real::Real;
use crate::state::shim;

static GET_UUID: Real = Real::named(c"nvmlDeviceGetUUID");
static GET_INDEX: Real = Real::named(c"nvmlDeviceGetIndex");

/// handle → ledger device + 1 (0: not yet looked up; NONE: not ours).
const NONE: usize = usize::MAX;
static CACHE: [(AtomicPtr<c_void>, AtomicUsize); 2 * MAX_DEVICES] =
    [const { (AtomicPtr::new(std::ptr::null_mut()), AtomicUsize::new(0)) }; 2 * MAX_DEVICES];

fn uuid_of(dev: NvmlDevice) -> Option<String> {
    // SAFETY: nvmlDeviceGetUUID(device, char*, length).
    let f = unsafe { GET_UUID.func::<nvml_pfn::DeviceGetUuid>() }?;
    let mut buf = [0u8; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    // SAFETY: buffer of the given length.
    let rc = unsafe { f(dev, buf.as_mut_ptr().cast(), buf.len() as c_uint) };
    if rc != NVML_SUCCESS {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

fn index_of(dev: NvmlDevice) -> Option<u32> {
    // SAFETY: nvmlDeviceGetIndex(device, unsigned*).
    let f = unsafe { GET_INDEX.func::<nvml_pfn::DeviceGetIndex>() }?;
    let mut i: c_uint = 0;
    // SAFETY: valid out-pointer.
    (unsafe { f(dev, &mut i) } == NVML_SUCCESS).then_some(i)
}

/// Which ledger device an NVML handle is: by UUID (the ledger's, or
/// CUDA_VISIBLE_DEVICES's), else by NVML index.
fn ledger_device(dev: NvmlDevice) -> Option<usize> {
    for (h, v) in &CACHE {
        let p = h.load(Ordering::Acquire);
        if p == dev {
            return match v.load(Ordering::Acquire) {
                0 => break,
                NONE => None,
                i => Some(i - 1),
            };
        }
        if p.is_null() {
            break;
        }
    }
    let s = shim();
    let ledger = s.ledger.as_ref()?;
    let uuid = uuid_of(dev);
    let index = index_of(dev);
    let found = (0..ledger.device_count().min(MAX_DEVICES)).find(|&i| {
        let want = ledger.uuid(i);
        if !want.is_empty() {
            return uuid.as_deref() == Some(want.as_str());
        }
        match s.nvml.get(i) {
            Some(NvmlMatch::Uuid(u)) => uuid.as_deref() == Some(u.as_str()),
            Some(NvmlMatch::Index(n)) => index == Some(*n),
            None => false,
        }
    });
    for (h, v) in &CACHE {
        if h.compare_exchange(
            std::ptr::null_mut(),
            dev,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
        {
            v.store(found.map_or(NONE, |i| i + 1), Ordering::Release);
            break;
        }
        if h.load(Ordering::Acquire) == dev {
            break;
        }
    }
    found
}

/// (cap, slice use) for a capped NVML device.
fn slice_of(dev: NvmlDevice) -> Option<(u64, u64)> {
    let s = shim();
    let ledger = s.ledger.as_ref()?;
    let i = ledger_device(dev)?;
    let cap = s.caps[i];
    (cap != UNLIMITED).then(|| (cap, ledger.used(i)))
}

/// `nvmlReturn_t` as the shim's exports have always returned it: C's
/// `int` (the same 32 bits as the header's enum).
fn exported(rc: NvmlReturn) -> c_int {
    rc as c_int
}

/// NVML's figures for a capped device as the slice sees them: the total
/// at most the cap, the slice's use as used, free at most what is left.
fn within_slice(total: &mut u64, used: &mut u64, free: &mut u64, cap: u64, slice_used: u64) {
    *total = cap.min(*total);
    *used = slice_used.min(*total);
    *free = (*free).min(*total - *used);
}

/// Calls NVML's `f` (either memory-info version), then, on a capped
/// device, has `clamp(info, cap, slice use)` bring what it wrote within the
/// slice.
///
/// # Safety
/// `f`'s C contract for `dev` and `mem`.
unsafe fn capped_memory_info<M>(
    f: Option<unsafe extern "C" fn(NvmlDevice, *mut M) -> NvmlReturn>,
    dev: NvmlDevice,
    mem: *mut M,
    clamp: fn(&mut M, u64, u64),
) -> c_int {
    let Some(f) = f else {
        return exported(NVML_ERROR_UNKNOWN);
    };
    // SAFETY: caller contract.
    let rc = unsafe { f(dev, mem) };
    if rc != NVML_SUCCESS {
        return exported(rc);
    }
    // SAFETY: written by NVML on success (non-null, else it failed).
    let Some(m) = (unsafe { mem.as_mut() }) else {
        return exported(rc);
    };
    if let Some((cap, used)) = slice_of(dev) {
        clamp(m, cap, used);
    }
    exported(rc)
}

/// # Safety
/// C contract of `nvmlDeviceGetMemoryInfo`.
pub unsafe fn memory_info(real: &Real, dev: NvmlDevice, mem: *mut NvmlMemory) -> c_int {
    // SAFETY: the family's signature.
    let f = unsafe { real.func::<nvml_pfn::DeviceGetMemoryInfo>() };
    // SAFETY: caller contract.
    unsafe {
        capped_memory_info(f, dev, mem, |m, cap, used| {
            within_slice(&mut m.total, &mut m.used, &mut m.free, cap, used);
        })
    }
}

/// # Safety
/// C contract of `nvmlDeviceGetMemoryInfo_v2`.
pub unsafe fn memory_info_v2(real: &Real, dev: NvmlDevice, mem: *mut NvmlMemoryV2) -> c_int {
    // SAFETY: the family's signature.
    let f = unsafe { real.func::<nvml_pfn::DeviceGetMemoryInfoV2>() };
    // SAFETY: caller contract.
    unsafe {
        capped_memory_info(f, dev, mem, |m, cap, used| {
            m.reserved = 0;
            within_slice(&mut m.total, &mut m.used, &mut m.free, cap, used);
        })
    }
}
