//! Per-GPU series from NVML. Every call may fail (unsupported on this GPU,
//! symbol missing from the library, GPU lost): a failed call leaves its
//! series out of the sample and nothing else.

use crate::sample::{self as m, Labels, Sample};
use gpuslice_core::Gpu;
use gpuslice_cuda_load::nvml_raw;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::{Device, Nvml};

/// `gpu`, `uuid`, `pci_bus_id`, `model` of a discovered GPU.
pub fn labels(g: &Gpu) -> Labels {
    vec![
        ("gpu", g.index.to_string()),
        ("uuid", g.uuid.clone()),
        ("pci_bus_id", g.pci_bus_id.clone()),
        ("model", g.model.clone()),
    ]
}

/// A GPU's utilisation (%) and memory (bytes) as NVML reports them: what
/// the exporter's `gpuslice_gpu_utilization_ratio` and
/// `gpuslice_gpu_memory_*_bytes` say, and what `gpuslice top` shows. A
/// field NVML cannot give is None.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Telemetry {
    pub util_percent: Option<u32>,
    pub memory_util_percent: Option<u32>,
    pub memory_used: Option<u64>,
    pub memory_free: Option<u64>,
    pub memory_total: Option<u64>,
}

fn telemetry_of(dev: &Device) -> Telemetry {
    let util = dev.utilization_rates().ok();
    let mem = dev.memory_info().ok();
    Telemetry {
        util_percent: util.as_ref().map(|u| u.gpu),
        memory_util_percent: util.as_ref().map(|u| u.memory),
        memory_used: mem.as_ref().map(|m| m.used),
        memory_free: mem.as_ref().map(|m| m.free),
        memory_total: mem.as_ref().map(|m| m.total),
    }
}

/// [`Telemetry`] of `g`; None when NVML does not know it.
pub fn telemetry(nvml: &Nvml, g: &Gpu) -> Option<Telemetry> {
    let dev = nvml.device_by_uuid(g.uuid.as_str()).ok()?;
    Some(telemetry_of(&dev))
}

/// Adds every NVML series of `g` to `out`; false when NVML does not know it.
pub fn collect(nvml: &Nvml, g: &Gpu, out: &mut Sample) -> bool {
    let Ok(dev) = nvml.device_by_uuid(g.uuid.as_str()) else {
        return false;
    };
    let l = labels(g);
    let t = telemetry_of(&dev);
    if let (Some(gpu), Some(mem)) = (t.util_percent, t.memory_util_percent) {
        out.push(m::GPU_UTIL, &l, f64::from(gpu) / 100.0);
        out.push(m::GPU_MEM_UTIL, &l, f64::from(mem) / 100.0);
    }
    if let (Some(used), Some(free), Some(total)) = (t.memory_used, t.memory_free, t.memory_total) {
        out.push(m::GPU_MEM_USED, &l, used as f64);
        out.push(m::GPU_MEM_FREE, &l, free as f64);
        out.push(m::GPU_MEM_TOTAL, &l, total as f64);
    }
    if let Ok(t) = dev.temperature(TemperatureSensor::Gpu) {
        out.push(m::GPU_TEMP, &l, f64::from(t));
    }
    if let Ok(mw) = dev.power_usage() {
        out.push(m::GPU_POWER, &l, f64::from(mw) / 1e3);
    }
    if let Ok(mj) = dev.total_energy_consumption() {
        out.push(m::GPU_ENERGY, &l, mj as f64 / 1e3);
    }
    if let Ok(mhz) = dev.clock_info(Clock::SM) {
        out.push(m::GPU_SM_CLOCK, &l, f64::from(mhz) * 1e6);
    }
    if let Ok(mhz) = dev.clock_info(Clock::Memory) {
        out.push(m::GPU_MEM_CLOCK, &l, f64::from(mhz) * 1e6);
    }
    // KB/s in NVML's words; 1 KB = 1024 bytes there.
    if let Ok(kb) = dev.pcie_throughput(PcieUtilCounter::Send) {
        out.push(m::GPU_PCIE_TX, &l, f64::from(kb) * 1024.0);
    }
    if let Ok(kb) = dev.pcie_throughput(PcieUtilCounter::Receive) {
        out.push(m::GPU_PCIE_RX, &l, f64::from(kb) * 1024.0);
    }
    if !g.nvlink_peers.is_empty() {
        nvlink(&dev, &l, out);
    }
    if let Ok(n) = dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate) {
        out.push(m::GPU_ECC_CORR, &l, n as f64);
    }
    if let Ok(n) = dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate) {
        out.push(m::GPU_ECC_UNCORR, &l, n as f64);
    }
    for (cause, name) in [
        (
            RetirementCause::MultipleSingleBitEccErrors,
            "single_bit_ecc",
        ),
        (RetirementCause::DoubleBitEccError, "double_bit_ecc"),
    ] {
        if let Ok(pages) = dev.retired_pages(cause) {
            out.push(m::GPU_RETIRED, &with(&l, "cause", name), pages.len() as f64);
        }
    }
    remapped_rows(&dev, &l, out);
    true
}

fn with(l: &Labels, k: &'static str, v: &str) -> Labels {
    let mut l = l.clone();
    l.push((k, v.to_string()));
    l
}

/// `nvmlDeviceGetRemappedRows` (no wrapper in nvml-wrapper 0.13).
fn remapped_rows(dev: &Device, l: &Labels, out: &mut Sample) {
    let Ok(rows) = nvml_raw::remapped_rows(dev) else {
        return;
    };
    out.push(
        m::GPU_REMAPPED,
        &with(l, "cause", "correctable"),
        f64::from(rows.correctable),
    );
    out.push(
        m::GPU_REMAPPED,
        &with(l, "cause", "uncorrectable"),
        f64::from(rows.uncorrectable),
    );
    out.push(m::GPU_REMAP_PENDING, l, f64::from(u8::from(rows.pending)));
    out.push(m::GPU_REMAP_FAILED, l, f64::from(u8::from(rows.failed)));
}

/// NVLink data throughput over all links (bytes, cumulative).
fn nvlink(dev: &Device, l: &Labels, out: &mut Sample) {
    let Ok(kib) = nvml_raw::nvlink_throughput_kib(dev) else {
        return;
    };
    for (kib, metric) in kib.into_iter().zip([m::GPU_NVLINK_TX, m::GPU_NVLINK_RX]) {
        if let Some(kib) = kib {
            out.push(metric, l, kib as f64 * 1024.0);
        }
    }
}
