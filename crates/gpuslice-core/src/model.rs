//! The GPU model every other crate works with.

use serde::{Deserialize, Serialize};

/// Major number of the NVIDIA frontend (`/dev/nvidiaN`, `nvidiactl`, `nvidia-modeset`).
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// Minor of `/dev/nvidia-modeset`.
pub const NVIDIA_MODESET_MINOR: u32 = 254;
/// Major of DRM nodes (`/dev/dri/cardN`, `renderDN`).
pub const DRM_MAJOR: u32 = 226;

/// Everything discovery found on one host.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Inventory {
    /// GPUs in PCI bus-id order; `gpus[i].index == i` (the order CUDA uses
    /// with `CUDA_DEVICE_ORDER=PCI_BUS_ID` and NVML uses for indices).
    pub gpus: Vec<Gpu>,
    /// Kernel driver version from `/proc/driver/nvidia/version`.
    pub driver_version: Option<String>,
    /// CUDA driver API version reported by NVML, e.g. "13.0".
    pub cuda_version: Option<String>,
    /// Dynamic char majors from `/proc/devices`.
    pub majors: Majors,
    /// `ModifyDeviceFiles` from `/proc/driver/nvidia/params` (true when absent).
    pub modify_device_files: bool,
    /// Which sources were read: "procfs", "sysfs", "nvml".
    pub sources: Vec<String>,
    /// Why NVML was not used, when it was not.
    pub nvml_error: Option<String>,
}

/// Char-device majors the NVIDIA driver registers dynamically.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Majors {
    pub nvidia_uvm: Option<u32>,
    pub nvidia_caps: Option<u32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Gpu {
    pub index: u32,
    /// Minor of `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `GPU-xxxxxxxx-xxxx-…`
    pub uuid: String,
    /// Canonical lower-case `0000:3b:00.0`.
    pub pci_bus_id: String,
    pub model: String,
    pub memory_bytes: Option<u64>,
    pub numa_node: Option<i32>,
    pub pcie: Option<PcieLink>,
    /// CPUs local to the GPU (`/sys/.../local_cpulist`).
    pub local_cpus: Option<String>,
    /// None when unknown (no NVML).
    pub mig_enabled: Option<bool>,
    pub migs: Vec<MigDevice>,
    /// PCI bus ids of GPUs reachable over an active NVLink.
    pub nvlink_peers: Vec<String>,
    /// Minors of `/dev/dri/cardN` and `/dev/dri/renderDN` that belong to this GPU.
    pub dri_minors: Vec<u32>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct PcieLink {
    /// GT/s, e.g. 32.0 for Gen5.
    pub speed_gts: f32,
    pub width: u32,
    pub max_speed_gts: f32,
    pub max_width: u32,
}

impl PcieLink {
    /// PCIe generation of a transfer rate in GT/s.
    pub fn generation(speed_gts: f32) -> u32 {
        match speed_gts {
            s if s >= 60.0 => 6,
            s if s >= 30.0 => 5,
            s if s >= 15.0 => 4,
            s if s >= 7.5 => 3,
            s if s >= 4.5 => 2,
            _ => 1,
        }
    }

    pub fn degraded(&self) -> bool {
        self.speed_gts + 0.01 < self.max_speed_gts || self.width < self.max_width
    }
}

/// A MIG compute instance, the unit CUDA sees as a device.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MigDevice {
    /// Index among the parent GPU's MIG devices (the `<mig>` of `<gpu>:<mig>`).
    pub index: u32,
    /// `MIG-…` when NVML told us; None from procfs alone.
    pub uuid: Option<String>,
    /// e.g. "1g.18gb"; None when unknown.
    pub profile: Option<String>,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    pub memory_bytes: Option<u64>,
    /// `/dev/nvidia-caps/nvidia-cap<N>` minor of the GPU instance's access cap.
    pub gi_access_minor: Option<u32>,
    /// Minor of the compute instance's access cap.
    pub ci_access_minor: Option<u32>,
}

impl Inventory {
    pub fn gpu_by_minor(&self, minor: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.minor == minor)
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Inventory {
    /// A host of `n` whole GPUs for unit tests whose assertions do not
    /// depend on a UUID or bus id of their own (feature `test-util`, for
    /// dev-dependencies only). GPU `i` has index and minor `i`, UUID
    /// `GPU-<i as 8 hex digits>-0000-4000-8000-<i as 12>`, bus id
    /// `0000:<i + 1 as 2 hex digits>:00.0`, 80 GiB, DRM card `i + 1` and
    /// render node `129 + i`; nvidia-uvm has major 238 and nvidia-caps 241.
    pub fn fake(n: u32) -> Inventory {
        Inventory {
            gpus: (0..n)
                .map(|i| Gpu {
                    index: i,
                    minor: i,
                    uuid: format!("GPU-{i:08x}-0000-4000-8000-{i:012x}"),
                    pci_bus_id: format!("0000:{:02x}:00.0", i + 1),
                    model: "NVIDIA H200".into(),
                    memory_bytes: Some(80 << 30),
                    dri_minors: vec![i + 1, 128 + i + 1],
                    ..Gpu::default()
                })
                .collect(),
            majors: Majors {
                nvidia_uvm: Some(238),
                nvidia_caps: Some(241),
            },
            ..Inventory::default()
        }
    }
}
