//! The files the fake GPU host and its fake driver exchange, as serde types.
//!
//! - [`Kernel`]: `<root>/.fakegpu/kernel.json`, the "kernel truth" written by
//!   `fakegpu::FakeHost` and read by the fake driver (`fakegpu-driver`) in
//!   place of the real driver's ioctls.
//! - [`TraceRecord`]: one line of `FAKEGPU_TRACE`, written by the driver's
//!   `cuInit` and read by the tests (`fakegpu::read_trace`).
//!
//! Both sides use these types, so the schema cannot drift. This crate holds
//! nothing else: the driver is a cdylib and must not link the test-only host
//! builder, and the host builder must not link the driver's CUDA symbols.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

/// The kernel truth of a fake host.
///
/// The reader is lenient: the fields marked `serde(default)` may be missing
/// from a hand-written `kernel.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    pub driver_version: String,
    pub cuda_version: i32,
    /// In PCI bus-id order; `gpus[i].minor == i`.
    pub gpus: Vec<KernelGpu>,
    /// Simulated `cuInit` cost per reachable GPU.
    #[serde(default)]
    pub init_ms_per_gpu: u64,
    /// Simulated cost of the first context of a process.
    #[serde(default)]
    pub ctx_ms: u64,
    /// Device memory each context holds (the real driver's is ~520 MiB on
    /// an H200), charged on its device while the context lives.
    #[serde(default)]
    pub ctx_bytes: u64,
    /// Device memory a loaded module or library holds (code and globals).
    #[serde(default)]
    pub module_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelGpu {
    pub minor: u32,
    pub uuid: String,
    /// `0000:18:00.0`, lower case.
    pub pci_bus_id: String,
    pub name: String,
    pub memory_bytes: u64,
    #[serde(default)]
    pub numa_node: i32,
    /// Bus ids of the GPUs this one reaches over NVLink (link i → peer i).
    #[serde(default)]
    pub nvlink_peers: Vec<String>,
    #[serde(default)]
    pub mig_enabled: bool,
    #[serde(default)]
    pub migs: Vec<KernelMig>,
    /// Persistence mode, as `nvmlDeviceGetPersistenceMode` reports it
    /// (default on, as on the H200 host).
    #[serde(default = "default_true")]
    pub persistence_mode: bool,
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelMig {
    /// GPU instance id (1-based).
    pub gi: u32,
    /// Compute instance id (always 0 here).
    pub ci: u32,
    pub uuid: String,
    pub profile: String,
    pub memory_bytes: u64,
    /// `nvidia-caps` minor of the GPU instance's access capability.
    pub gi_minor: u32,
    /// `nvidia-caps` minor of the compute instance's access capability.
    pub ci_minor: u32,
}

impl KernelGpu {
    /// Minor of `/dev/dri/card<N>` (card0 is the host's BMC).
    pub fn dri_card_minor(&self) -> u32 {
        self.minor + 1
    }

    /// Minor of `/dev/dri/renderD<N>`.
    pub fn dri_render_minor(&self) -> u32 {
        129 + self.minor
    }

    /// `NVIDIA H200 MIG 1g.18gb`, the name CUDA and NVML give a MIG device.
    pub fn mig_name(&self, mig: &KernelMig) -> String {
        format!("{} MIG {}", self.name, mig.profile)
    }
}

/// What one `cuInit` did: one line of `FAKEGPU_TRACE`, written by the fake
/// driver; tests read it to see what the driver did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecord {
    pub pid: u32,
    /// The `FAKEGPU_ROOT` the driver read.
    pub root: String,
    pub modify_device_files: bool,
    /// Whether `nvidiactl` opened (after re-creation, if any).
    pub ctl: bool,
    pub ctl_recreated: bool,
    /// Minors of the GPUs whose node opened (success or ENXIO).
    pub reachable: Vec<u32>,
    /// Minors of GPU nodes the driver re-created.
    pub recreated: Vec<u32>,
    /// Minors of `nvidia-caps` nodes the driver re-created.
    pub recreated_caps: Vec<u32>,
    /// UUIDs (GPU or MIG) of the devices CUDA exposes, in CUDA order.
    pub visible: Vec<String>,
    /// The simulated init cost slept: reachable GPUs × per-GPU ms.
    pub init_sleep_ms: u64,
    /// `cuInit`'s result (a `CUresult`).
    pub rc: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_defaults_missing_fields() {
        let json = r#"{"driver_version":"580.159.04","cuda_version":13000,"gpus":[
            {"minor":0,"uuid":"GPU-x","pci_bus_id":"0000:18:00.0","name":"NVIDIA H200","memory_bytes":1}]}"#;
        let kernel: Kernel = serde_json::from_str(json).unwrap();
        assert_eq!((kernel.init_ms_per_gpu, kernel.ctx_ms), (0, 0));
        let gpu = &kernel.gpus[0];
        assert_eq!(gpu.numa_node, 0);
        assert!(gpu.nvlink_peers.is_empty() && gpu.migs.is_empty() && !gpu.mig_enabled);
        assert!(gpu.persistence_mode);
        assert_eq!((gpu.dri_card_minor(), gpu.dri_render_minor()), (1, 129));
    }

    #[test]
    fn trace_round_trips() {
        let record = TraceRecord {
            pid: 7,
            reachable: vec![0, 2],
            visible: vec!["GPU-x".into()],
            rc: 100,
            ..TraceRecord::default()
        };
        let line = serde_json::to_string(&record).unwrap();
        assert!(line.starts_with(r#"{"pid":7,"root":"","modify_device_files":false"#));
        assert_eq!(serde_json::from_str::<TraceRecord>(&line).unwrap(), record);
    }
}
