//! Facts about the machine a benchmark ran on, recorded with its result:
//! kernel, cgroup mode, GPUs, driver and CUDA versions, persistence mode.

use gpuslice_core::Inventory;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Facts about the machine, read before the first run.
pub(crate) fn facts(host_root: &Path, inv: &Inventory) -> Value {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut models: Vec<&str> = inv.gpus.iter().map(|g| g.model.as_str()).collect();
    models.dedup();
    let persistence = persistence_modes(host_root, inv);
    let modes: Vec<Option<bool>> = inv
        .gpus
        .iter()
        .map(|g| {
            persistence
                .as_ref()
                .ok()
                .and_then(|m| m.get(&g.uuid).copied())
        })
        .collect();
    let summary = if modes.iter().all(|m| *m == Some(true)) {
        "on".to_string()
    } else if modes.iter().all(|m| *m == Some(false)) {
        "off".to_string()
    } else if modes.iter().all(Option::is_some) {
        "mixed".to_string()
    } else {
        "unknown".to_string()
    };
    json!({
        "hostname": read("/proc/sys/kernel/hostname"),
        "kernel": read("/proc/sys/kernel/osrelease"),
        "kernel_version": read("/proc/sys/kernel/version"),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "cgroup": cgroup_mode(),
        "gpu_count": inv.gpus.len(),
        "gpu_models": models,
        "gpu_summary": format!("{} × {}", inv.gpus.len(), models.join(" + ")),
        "gpus": inv.gpus.iter().zip(&modes).map(|(g, p)| json!({
            "index": g.index,
            "uuid": g.uuid,
            "pci_bus_id": g.pci_bus_id,
            "model": g.model,
            "memory_bytes": g.memory_bytes,
            "mig_enabled": g.mig_enabled,
            "persistence_mode": p,
        })).collect::<Vec<_>>(),
        "driver_version": inv.driver_version,
        "cuda_version": inv.cuda_version,
        "discovery_sources": inv.sources,
        "nvml_error": inv.nvml_error,
        "persistence_mode": summary,
        "persistence_mode_error": persistence.err(),
    })
}

/// How /sys/fs/cgroup is mounted: "v2", "hybrid" (v1 with a v2 tree) or "v1".
fn cgroup_mode() -> &'static str {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2"
    } else if Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists() {
        "hybrid"
    } else {
        "v1"
    }
}

/// Persistence mode per GPU UUID, read (never set) through NVML. NVML is
/// asked only when discovery trusted it for this host root.
fn persistence_modes(host_root: &Path, inv: &Inventory) -> Result<BTreeMap<String, bool>, String> {
    if !inv.sources.iter().any(|s| s == "nvml") {
        return Err(inv
            .nvml_error
            .clone()
            .unwrap_or_else(|| format!("NVML not used for host root {}", host_root.display())));
    }
    let nvml = gpuslice_cuda_load::open_nvml(None).map_err(|e| format!("NVML: {e}"))?;
    let count = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
    let mut modes = BTreeMap::new();
    for i in 0..count {
        let dev = nvml.device_by_index(i).map_err(|e| format!("NVML: {e}"))?;
        let uuid = dev.uuid().map_err(|e| format!("NVML: {e}"))?;
        let on = dev
            .is_in_persistent_mode()
            .map_err(|e| format!("NVML persistence mode of {uuid}: {e}"))?;
        modes.insert(uuid, on);
    }
    Ok(modes)
}
