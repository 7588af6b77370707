//! The "kernel truth" of a fake host (`<root>/.fakegpu/kernel.json`).
//!
//! It stands in for what the real driver learns through its ioctl
//! interface; the fake driver reads it (its own copy of this schema lives in
//! `fakegpu-driver/src/host.rs`, keep them in step).

use serde::{Deserialize, Serialize};

pub const DRIVER_VERSION: &str = "580.159.04";
/// CUDA 13.0 as `cuDriverGetVersion` encodes it.
pub const CUDA_VERSION: i32 = 13000;
pub const GPU_NAME: &str = "NVIDIA H200";
/// 143771 MiB, what an H200 reports.
pub const GPU_MEMORY_BYTES: u64 = 150_754_820_096;
pub const MIG_PROFILE: &str = "1g.18gb";
pub const MIG_MEMORY_BYTES: u64 = 18 << 30;
/// Most MIG instances an H200 holds.
pub const MAX_MIG_INSTANCES: u32 = 7;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    pub driver_version: String,
    pub cuda_version: i32,
    /// In PCI bus-id order; `gpus[i].minor == i`.
    pub gpus: Vec<KernelGpu>,
    /// Simulated `cuInit` cost per reachable GPU.
    pub init_ms_per_gpu: u64,
    /// Simulated cost of the first context of a process.
    pub ctx_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelGpu {
    pub minor: u32,
    pub uuid: String,
    /// `0000:18:00.0`, lower case.
    pub pci_bus_id: String,
    pub name: String,
    pub memory_bytes: u64,
    pub numa_node: i32,
    /// Bus ids of the GPUs this one reaches over NVLink (link i → peer i).
    pub nvlink_peers: Vec<String>,
    pub mig_enabled: bool,
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
}

/// Deterministic UUID of GPU `i`.
pub fn gpu_uuid(i: u32) -> String {
    format!("GPU-fa4e{i:04x}-0000-4000-8000-{i:012x}")
}

/// Deterministic UUID of MIG instance `gi` of GPU `gpu`.
pub fn mig_uuid(gpu: u32, gi: u32) -> String {
    format!("MIG-fa4e{gpu:04x}-{gi:04x}-4000-8000-000000000000")
}

/// PCI bus id of GPU `i`: `0000:18:00.0`, `0000:28:00.0`, …
pub fn gpu_bus_id(i: u32) -> String {
    format!("0000:{:02x}:00.0", 0x18 + 0x10 * i)
}

/// NUMA node of GPU `i` of `n`: the first half on node 0, the rest on 1.
pub fn numa_node(i: u32, n: u32) -> i32 {
    if n < 2 {
        0
    } else {
        (i * 2 / n) as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_deterministic() {
        assert_eq!(gpu_uuid(2), "GPU-fa4e0002-0000-4000-8000-000000000002");
        assert_eq!(mig_uuid(1, 3), "MIG-fa4e0001-0003-4000-8000-000000000000");
        assert_eq!(gpu_bus_id(0), "0000:18:00.0");
        assert_eq!(gpu_bus_id(7), "0000:88:00.0");
        let nodes: Vec<_> = (0..8).map(|i| numa_node(i, 8)).collect();
        assert_eq!(nodes, [0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(numa_node(0, 1), 0);
    }
}
