//! A hand-made host tree for the discovery tests, in the real formats.

use crate::hostroot::HostRoot;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use tempfile::TempDir;

pub(crate) struct Tree {
    dir: TempDir,
}

impl Tree {
    /// A host with the NVIDIA driver loaded and no GPUs yet.
    pub fn new() -> Self {
        let t = Self::bare();
        t.mkdir("proc/driver/nvidia/gpus");
        t
    }

    /// A host without the NVIDIA driver.
    pub fn bare() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn root(&self) -> HostRoot {
        HostRoot::new(self.dir.path())
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn at(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn mkdir(&self, rel: &str) {
        std::fs::create_dir_all(self.at(rel)).unwrap();
    }

    pub fn write(&self, rel: &str, text: &str) {
        let p = self.at(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// `rel` becomes a symlink whose text is `target` (relative or absolute,
    /// as the host would have it).
    pub fn link(&self, rel: &str, target: &str) {
        let p = self.at(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        symlink(target, p).unwrap();
    }

    /// A GPU's `/proc/driver/nvidia/gpus/<bus>/information`, as the driver
    /// writes it (tabs and all).
    pub fn gpu(&self, bus: &str, minor: u32, uuid: &str) {
        self.write(
            &format!("proc/driver/nvidia/gpus/{bus}/information"),
            &format!(
                "Model: \t\t NVIDIA H200\nIRQ:   \t\t 145\nGPU UUID: \t {uuid}\n\
                 Video BIOS: \t 96.00.af.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n\
                 DMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n\
                 GPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n"
            ),
        );
    }

    /// [`Tree::gpu`] with a UUID made from the bus number:
    /// `GPU-<bus>000000-0000-4000-8000-000000000000` (`GPU-18000000-…` for
    /// `0000:18:00.0`).
    pub fn gpu_on_bus(&self, bus: &str, minor: u32) {
        let uuid = format!("GPU-{}000000-0000-4000-8000-000000000000", &bus[5..7]);
        self.gpu(bus, minor, &uuid);
    }

    /// A PCI device under `/sys/devices/pci0000:00/<bus>` with its
    /// attributes, reached through the relative link sysfs has at
    /// `/sys/bus/pci/devices/<bus>`.
    pub fn pci(&self, bus: &str, numa: &str, link: [&str; 4], cpus: &str) {
        let dev = format!("sys/devices/pci0000:00/{bus}");
        let [speed, width, max_speed, max_width] = link;
        for (name, value) in [
            ("numa_node", numa),
            ("current_link_speed", speed),
            ("current_link_width", width),
            ("max_link_speed", max_speed),
            ("max_link_width", max_width),
            ("local_cpulist", cpus),
        ] {
            self.write(&format!("{dev}/{name}"), &format!("{value}\n"));
        }
        self.link(
            &format!("sys/bus/pci/devices/{bus}"),
            &format!("../../../devices/pci0000:00/{bus}"),
        );
    }
}
