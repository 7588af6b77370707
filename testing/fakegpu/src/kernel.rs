//! The "kernel truth" of a fake host (`<root>/.fakegpu/kernel.json`).
//!
//! It stands in for what the real driver learns through its ioctl
//! interface; the fake driver reads it. The schema itself lives in crate
//! `fakegpu-schema`, shared with the driver; this module adds the values a
//! fake H200 host fills it with.

pub use fakegpu_schema::{Kernel, KernelGpu, KernelMig};

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
