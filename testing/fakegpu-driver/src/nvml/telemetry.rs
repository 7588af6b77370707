//! Telemetry the exporter reads: utilization, temperature, power, energy,
//! clocks, PCIe throughput, ECC and row remapping. Values are plausible
//! constants derived from the GPU's minor `m`, so tests can predict them:
//!
//! | call | value |
//! |---|---|
//! | utilization | gpu `(10·m) % 100` %, memory `(5·m) % 100` %; with a shared engine (`$FAKEGPU_ENGINE`) gpu is measured: the share of time the engine ran anyone's work since this process's previous call (0 at the first) |
//! | temperature (GPU sensor) | `30 + m` °C |
//! | power | `100 000 + 1 000·m` mW |
//! | total energy | `1 000 000·(m+1)` mJ at init, growing at the power above |
//! | clocks | SM 1 980 MHz, memory 3 201 MHz, graphics 1 980 MHz, video 1 545 MHz |
//! | PCIe throughput | TX `1 000·(m+1)` KB/s, RX `2 000·(m+1)` KB/s |
//! | ECC total errors | corrected `m`, uncorrected 0 |
//! | remapped rows | 0 corrected, 0 uncorrected, none pending, no failure |
//!
//! Whole GPUs only (MIG handles get NOT_SUPPORTED, as on real hardware for
//! most of these). Field values (NVLink throughput) and retired pages are
//! left unimplemented: callers must cope with a missing symbol.

use super::*;
use std::sync::OnceLock;
use std::time::Instant;

fn minor(t: &Target) -> Result<u64, NvmlReturn> {
    Ok(u64::from(t.whole_gpu()?.info.minor))
}

fn power_mw(m: u64) -> u64 {
    100_000 + 1_000 * m
}

/// First telemetry call of the process: where energy starts counting.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The engine's busy share since this process last asked about the GPU,
/// as NVML averages utilisation over its last sample period; None without
/// a shared engine.
fn measured_util(t: &Target) -> Result<Option<c_uint>, NvmlReturn> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static LAST: Mutex<Option<HashMap<u32, (u64, u64)>>> = Mutex::new(None);
    let gpu = t.whole_gpu()?;
    let bus = crate::cuda::PciAddress::parse(&gpu.info.pci_bus_id)
        .unwrap_or_default()
        .bus;
    let Some((busy, at)) = crate::cuda::engine_busy(bus) else {
        return Ok(None);
    };
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    let prev = last
        .get_or_insert_with(HashMap::new)
        .insert(bus, (busy, at));
    Ok(Some(match prev {
        Some((b0, t0)) if at > t0 => (100 * busy.saturating_sub(b0) / (at - t0)).min(100) as c_uint,
        _ => 0,
    }))
}

/// A getter's body: `value` of the whole GPU (its target and its minor, the
/// figures' seed), written to `ptr`; NOT_SUPPORTED for a MIG device.
///
/// # Safety
/// `ptr` null or valid for a write.
unsafe fn write_gpu_value<T>(
    device: NvmlDevice,
    ptr: *mut T,
    value: impl FnOnce(&Target, u64) -> Result<T, NvmlReturn>,
) -> NvmlReturn {
    // SAFETY: caller contract.
    unsafe { write_device_value(device, ptr, |t| value(t, minor(t)?)) }
}

/// # Safety
/// `util` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: NvmlDevice,
    util: *mut NvmlUtilization,
) -> NvmlReturn {
    let value = |t: &Target, m: u64| {
        let gpu = match measured_util(t)? {
            Some(pct) => pct,
            None => ((10 * m) % 100) as c_uint,
        };
        Ok(NvmlUtilization {
            gpu,
            memory: ((5 * m) % 100) as c_uint,
        })
    };
    // SAFETY: caller contract.
    unsafe { write_gpu_value(device, util, value) }
}

/// # Safety
/// `temp` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: NvmlDevice,
    sensor: c_uint,
    temp: *mut c_uint,
) -> NvmlReturn {
    let value = |_: &Target, m: u64| match sensor {
        NVML_TEMPERATURE_GPU => Ok((30 + m) as c_uint),
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    };
    // SAFETY: caller contract.
    unsafe { write_gpu_value(device, temp, value) }
}

/// # Safety
/// `power` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: NvmlDevice,
    power: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: caller contract.
    unsafe { write_gpu_value(device, power, |_, m| Ok(power_mw(m) as c_uint)) }
}

/// # Safety
/// `energy` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: NvmlDevice,
    energy: *mut u64,
) -> NvmlReturn {
    let value = |_: &Target, m: u64| {
        let ms = epoch().elapsed().as_millis() as u64;
        Ok(1_000_000 * (m + 1) + power_mw(m) * ms / 1_000)
    };
    // SAFETY: caller contract.
    unsafe { write_gpu_value(device, energy, value) }
}

/// # Safety
/// `clock` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: NvmlDevice,
    kind: c_uint,
    clock: *mut c_uint,
) -> NvmlReturn {
    let value = |_: &Target, _| match kind {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => Ok(1_980),
        NVML_CLOCK_MEM => Ok(3_201),
        NVML_CLOCK_VIDEO => Ok(1_545),
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    };
    // SAFETY: caller contract.
    unsafe { write_gpu_value(device, clock, value) }
}

/// # Safety
/// `value` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: NvmlDevice,
    counter: c_uint,
    value: *mut c_uint,
) -> NvmlReturn {
    let kbps = |_: &Target, m: u64| match counter {
        NVML_PCIE_UTIL_TX_BYTES => Ok((1_000 * (m + 1)) as c_uint),
        NVML_PCIE_UTIL_RX_BYTES => Ok((2_000 * (m + 1)) as c_uint),
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    };
    // SAFETY: caller contract.
    unsafe { write_gpu_value(device, value, kbps) }
}

/// # Safety
/// `count` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: NvmlDevice,
    error_type: c_uint,
    _counter_type: c_uint,
    count: *mut u64,
) -> NvmlReturn {
    let errors = |_: &Target, m: u64| match error_type {
        NVML_MEMORY_ERROR_TYPE_CORRECTED => Ok(m),
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED => Ok(0),
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    };
    // SAFETY: caller contract.
    unsafe { write_gpu_value(device, count, errors) }
}

/// # Safety
/// Each pointer must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: NvmlDevice,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> NvmlReturn {
    with_device(device, |t| {
        minor(t)?;
        // SAFETY: caller contract.
        unsafe {
            out(corr_rows, 0)?;
            out(unc_rows, 0)?;
            out(is_pending, 0)?;
            out(failure_occurred, 0)
        }
    })
}
