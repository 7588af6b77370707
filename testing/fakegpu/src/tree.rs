//! Writing the host tree: `dev/`, `proc/`, `sys/` and `.fakegpu/`.
//!
//! Formats copy the real driver's (580 series) so discovery code parses the
//! fake exactly as it parses a real host.

use std::fs;
use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use crate::kernel::{Kernel, KernelGpu};

pub const NVIDIA_MAJOR: u32 = 195;
pub const NVIDIACTL_MINOR: u32 = 255;
pub const NVIDIA_MODESET_MINOR: u32 = 254;
pub const DRM_MAJOR: u32 = 226;
pub const NVIDIA_UVM_MAJOR: u32 = 238;
pub const NVIDIA_CAPS_MAJOR: u32 = 241;
/// `nvidia-caps` minors of the MIG `config` and `monitor` capabilities.
pub const CAP_CONFIG_MINOR: u32 = 1;
pub const CAP_MONITOR_MINOR: u32 = 2;
/// PCI address of the host's non-NVIDIA BMC display (`dri/card0`).
pub const BMC_BUS_ID: &str = "0000:03:00.0";

/// Per-GPU sysfs facts that are not part of the kernel truth.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    pub speed: &'static str,
    pub width: u32,
}

pub const FULL_LINK: Link = Link {
    speed: "32.0 GT/s PCIe",
    width: 16,
};
pub const DEGRADED_LINK: Link = Link {
    speed: "16.0 GT/s PCIe",
    width: 8,
};

/// Writes a file, creating its parent directories.
pub fn write(path: &Path, contents: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, contents)
}

/// Creates (or replaces) a character device node with an exact mode.
pub fn mknod_char(path: &Path, major: u32, minor: u32, mode: u32) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let dev = makedev(u64::from(major), u64::from(minor));
    mknod(path, SFlag::S_IFCHR, Mode::from_bits_truncate(mode), dev).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "mknod {} ({major}:{minor}): {e} (fakegpu needs root)",
                path.display()
            ),
        )
    })?;
    // mknod applies the umask.
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Points `link` at `target`. Atomic (a symlink beside it, renamed over
/// it), so a process loading through the link never finds it missing, and
/// a no-op when it already points there.
pub fn relink(target: &Path, link: &Path) -> io::Result<()> {
    if fs::read_link(link).is_ok_and(|t| t == target) {
        return Ok(());
    }
    let dir = link.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = link.file_name().and_then(|n| n.to_str()).unwrap_or("link");
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{seq}.tmp", std::process::id()));
    let _ = fs::remove_file(&tmp);
    symlink(target, &tmp)?;
    fs::rename(&tmp, link)
}

// ---------------------------------------------------------------- libraries

/// `usr/lib/<arch>-linux-gnu`, where Debian and Ubuntu install the driver's
/// user-space libraries.
pub fn driver_lib_rel() -> String {
    format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH)
}

/// Placeholder `libcuda.so.<version>` and `libnvidia-ml.so.<version>` with
/// their `.so.1` links, as the driver package installs them.
pub fn write_driver_libs(root: &Path, version: &str) -> io::Result<()> {
    let dir = root.join(driver_lib_rel());
    for lib in ["libcuda.so", "libnvidia-ml.so"] {
        let file = format!("{lib}.{version}");
        write(&dir.join(&file), &format!("fakegpu placeholder {file}\n"))?;
        relink(Path::new(&file), &dir.join(format!("{lib}.1")))?;
    }
    Ok(())
}

// ---------------------------------------------------------------- dev

pub fn gpu_node_rel(minor: u32) -> String {
    format!("dev/nvidia{minor}")
}

pub fn cap_node_rel(minor: u32) -> String {
    format!("dev/nvidia-caps/nvidia-cap{minor}")
}

pub fn write_dev(root: &Path, kernel: &Kernel) -> io::Result<()> {
    let node = |rel: &str, major, minor, mode| mknod_char(&root.join(rel), major, minor, mode);
    node("dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR, 0o666)?;
    node(
        "dev/nvidia-modeset",
        NVIDIA_MAJOR,
        NVIDIA_MODESET_MINOR,
        0o666,
    )?;
    node("dev/nvidia-uvm", NVIDIA_UVM_MAJOR, 0, 0o666)?;
    node("dev/nvidia-uvm-tools", NVIDIA_UVM_MAJOR, 1, 0o666)?;
    node(
        &cap_node_rel(CAP_CONFIG_MINOR),
        NVIDIA_CAPS_MAJOR,
        CAP_CONFIG_MINOR,
        0o400,
    )?;
    node(
        &cap_node_rel(CAP_MONITOR_MINOR),
        NVIDIA_CAPS_MAJOR,
        CAP_MONITOR_MINOR,
        0o444,
    )?;
    // The BMC's display, which belongs to no GPU.
    node("dev/dri/card0", DRM_MAJOR, 0, 0o660)?;
    for gpu in &kernel.gpus {
        node(&gpu_node_rel(gpu.minor), NVIDIA_MAJOR, gpu.minor, 0o666)?;
        let card = gpu.dri_card_minor();
        let render = gpu.dri_render_minor();
        node(&format!("dev/dri/card{card}"), DRM_MAJOR, card, 0o660)?;
        node(
            &format!("dev/dri/renderD{render}"),
            DRM_MAJOR,
            render,
            0o660,
        )?;
        for mig in &gpu.migs {
            for minor in [mig.gi_minor, mig.ci_minor] {
                node(&cap_node_rel(minor), NVIDIA_CAPS_MAJOR, minor, 0o444)?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- proc

pub fn write_proc(root: &Path, kernel: &Kernel, modify_device_files: bool) -> io::Result<()> {
    let proc = root.join("proc");
    write(&proc.join("devices"), PROC_DEVICES)?;
    write(
        &proc.join("driver/nvidia/version"),
        &version_text(&kernel.driver_version),
    )?;
    write(
        &proc.join("driver/nvidia/params"),
        &params_text(modify_device_files),
    )?;
    for gpu in &kernel.gpus {
        write_gpu_proc(root, gpu)?;
    }
    write_caps(root, kernel)
}

/// `proc/driver/nvidia/gpus/<bus>/`, the directory the driver makes for a
/// GPU it binds.
pub fn gpu_proc_rel(gpu: &KernelGpu) -> String {
    format!("proc/driver/nvidia/gpus/{}", gpu.pci_bus_id)
}

/// A GPU's `proc/driver/nvidia/gpus/<bus>/information`.
pub fn write_gpu_proc(root: &Path, gpu: &KernelGpu) -> io::Result<()> {
    write(
        &root.join(gpu_proc_rel(gpu)).join("information"),
        &information_text(gpu),
    )
}

/// MIG capabilities: the access files under `capabilities/` and the
/// `nvidia-caps/mig-minors` index, consistent with the nodes in `dev/`.
fn write_caps(root: &Path, kernel: &Kernel) -> io::Result<()> {
    let caps = root.join("proc/driver/nvidia/capabilities");
    write(
        &caps.join("mig/config"),
        &access_text(CAP_CONFIG_MINOR, 0o400),
    )?;
    write(
        &caps.join("mig/monitor"),
        &access_text(CAP_MONITOR_MINOR, 0o444),
    )?;
    let mut minors = format!("config {CAP_CONFIG_MINOR}\nmonitor {CAP_MONITOR_MINOR}\n");
    for gpu in &kernel.gpus {
        for mig in &gpu.migs {
            let gi = format!("gpu{}/mig/gi{}", gpu.minor, mig.gi);
            let ci = format!("{gi}/ci{}", mig.ci);
            write(
                &caps.join(&gi).join("access"),
                &access_text(mig.gi_minor, 0o444),
            )?;
            write(
                &caps.join(&ci).join("access"),
                &access_text(mig.ci_minor, 0o444),
            )?;
            // mig-minors names the same capabilities without the `mig/`.
            let (gi_name, ci_name) = (gi.replace("/mig/", "/"), ci.replace("/mig/", "/"));
            minors.push_str(&format!("{gi_name}/access {}\n", mig.gi_minor));
            minors.push_str(&format!("{ci_name}/access {}\n", mig.ci_minor));
        }
    }
    write(&root.join("proc/driver/nvidia-caps/mig-minors"), &minors)
}

fn access_text(minor: u32, mode: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
}

fn version_text(driver_version: &str) -> String {
    format!(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version}  Release Build  \
         (dvs-builder@U22)  Mon Jan  1 00:00:00 UTC 2026\nGCC version:  gcc version 12.2.0\n"
    )
}

fn information_text(gpu: &KernelGpu) -> String {
    format!(
        "Model: \t\t {}\nIRQ:   \t\t 0\nGPU UUID: \t {}\nVideo BIOS: \t 96.00.00.00.01\n\
         Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n\
         Bus Location: \t {}\nDevice Minor: \t {}\nGPU Excluded:\t No\n",
        gpu.name, gpu.uuid, gpu.pci_bus_id, gpu.minor
    )
}

/// `/proc/driver/nvidia/params` as the 580 driver prints it.
pub fn params_text(modify_device_files: bool) -> String {
    let mut text = String::new();
    for line in PARAMS {
        let line = match *line {
            "ModifyDeviceFiles" => format!("ModifyDeviceFiles: {}", u8::from(modify_device_files)),
            other => other.to_string(),
        };
        text.push_str(&line);
        text.push('\n');
    }
    text
}

/// Lines of `params`; the `ModifyDeviceFiles` placeholder is filled in.
const PARAMS: &[&str] = &[
    "ResmanDebugLevel: 4294967295",
    "RmLogonRC: 1",
    "ModifyDeviceFiles",
    "DeviceFileUID: 0",
    "DeviceFileGID: 0",
    "DeviceFileMode: 438",
    "InitializeSystemMemoryAllocations: 1",
    "UsePageAttributeTable: 4294967295",
    "EnableMSI: 1",
    "EnablePCIeGen3: 0",
    "MemoryPoolSize: 0",
    "KMallocHeapMaxSize: 0",
    "VMallocHeapMaxSize: 0",
    "IgnoreMMIOCheck: 0",
    "EnableStreamMemOPs: 0",
    "EnableUserNUMAManagement: 1",
    "NvLinkDisable: 0",
    "RmProfilingAdminOnly: 1",
    "PreserveVideoMemoryAllocations: 0",
    "EnableS0ixPowerManagement: 0",
    "S0ixPowerManagementVideoMemoryThreshold: 256",
    "DynamicPowerManagement: 3",
    "DynamicPowerManagementVideoMemoryThreshold: 200",
    "RegisterPCIDriver: 1",
    "EnablePCIERelaxedOrderingMode: 0",
    "EnableResizableBar: 0",
    "EnableGpuFirmware: 18",
    "EnableGpuFirmwareLogs: 2",
    "RmNvlinkBandwidthLinkCount: 0",
    "EnableDbgBreakpoint: 0",
    "OpenRmEnableUnsupportedGpus: 1",
    "DmaRemapPeerMmio: 1",
    "ImexChannelCount: 2048",
    "CreateImexChannel0: 0",
    "GrdmaPciTopoCheckOverride: 0",
    "CoherentGPUMemoryMode: \"\"",
    "RegistryDwords: \"\"",
    "RegistryDwordsPerDevice: \"\"",
    "RmMsg: \"\"",
    "GpuBlacklist: \"\"",
    "TemporaryFilePath: \"\"",
    "ExcludedGpus: \"\"",
];

const PROC_DEVICES: &str = "Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
  4 ttyS
  5 /dev/tty
  5 /dev/console
  5 /dev/ptmx
  7 vcs
 10 misc
 13 input
 21 sg
 29 fb
128 ptm
136 pts
180 usb
189 usb_device
195 nvidia-frontend
226 drm
231 infiniband_verbs
238 nvidia-uvm
241 nvidia-caps
246 hidraw
254 gpiochip

Block devices:
  7 loop
  8 sd
  9 md
253 device-mapper
259 blkext
";

// ---------------------------------------------------------------- sys

/// CPUs of a NUMA node: 16 per node.
pub fn node_cpulist(node: i32) -> String {
    let first = node.max(0) * 16;
    format!("{first}-{}", first + 15)
}

pub fn write_sys(root: &Path, kernel: &Kernel, link_of: impl Fn(u32) -> Link) -> io::Result<()> {
    let sys = root.join("sys");
    let devices = sys.join("bus/pci/devices");
    fs::create_dir_all(sys.join("bus/pci/drivers/nvidia"))?;
    write(
        &sys.join("module/nvidia/version"),
        &format!("{}\n", kernel.driver_version),
    )?;
    let mut nodes: Vec<i32> = kernel.gpus.iter().map(|g| g.numa_node).collect();
    nodes.push(0);
    nodes.sort_unstable();
    nodes.dedup();
    for node in nodes {
        let dir = sys.join(format!("devices/system/node/node{node}"));
        write(&dir.join("cpulist"), &format!("{}\n", node_cpulist(node)))?;
    }

    write_bmc(&sys)?;
    for gpu in &kernel.gpus {
        let dir = devices.join(&gpu.pci_bus_id);
        let link = link_of(gpu.minor);
        let files = [
            ("vendor", "0x10de".to_string()),
            ("device", "0x2335".to_string()),
            ("subsystem_vendor", "0x10de".to_string()),
            ("subsystem_device", "0x18be".to_string()),
            ("class", "0x030200".to_string()),
            ("numa_node", gpu.numa_node.to_string()),
            ("local_cpulist", node_cpulist(gpu.numa_node)),
            ("current_link_speed", link.speed.to_string()),
            ("current_link_width", link.width.to_string()),
            ("max_link_speed", FULL_LINK.speed.to_string()),
            ("max_link_width", FULL_LINK.width.to_string()),
        ];
        for (name, value) in files {
            write(&dir.join(name), &format!("{value}\n"))?;
        }
        relink(Path::new("../../drivers/nvidia"), &dir.join("driver"))?;
        for (kind, minor) in [
            ("card", gpu.dri_card_minor()),
            ("renderD", gpu.dri_render_minor()),
        ] {
            drm_entry(&sys, &gpu.pci_bus_id, &format!("{kind}{minor}"), minor)?;
        }
    }
    Ok(())
}

/// The BMC's VGA function and its `card0`.
fn write_bmc(sys: &Path) -> io::Result<()> {
    let dir = sys.join("bus/pci/devices").join(BMC_BUS_ID);
    for (name, value) in [
        ("vendor", "0x1a03"),
        ("device", "0x2000"),
        ("class", "0x030000"),
        ("numa_node", "0"),
        ("local_cpulist", "0-15"),
    ] {
        write(&dir.join(name), &format!("{value}\n"))?;
    }
    drm_entry(sys, BMC_BUS_ID, "card0", 0)
}

/// `sys/class/drm/<name>/{dev,device}` and `<pci dev>/drm/<name>/dev`.
fn drm_entry(sys: &Path, bus_id: &str, name: &str, minor: u32) -> io::Result<()> {
    let dev = format!("{DRM_MAJOR}:{minor}\n");
    write(
        &sys.join("bus/pci/devices")
            .join(bus_id)
            .join("drm")
            .join(name)
            .join("dev"),
        &dev,
    )?;
    let class_dir = sys.join("class/drm").join(name);
    write(&class_dir.join("dev"), &dev)?;
    // Relative, so it resolves inside the host root.
    let target = Path::new("../../../bus/pci/devices").join(bus_id);
    relink(&target, &class_dir.join("device"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_carry_modify_device_files() {
        assert!(params_text(true).contains("\nModifyDeviceFiles: 1\n"));
        assert!(params_text(false).contains("\nModifyDeviceFiles: 0\n"));
        assert!(params_text(false).contains("\nDeviceFileMode: 438\n"));
    }

    #[test]
    fn cpulists_per_node() {
        assert_eq!(node_cpulist(0), "0-15");
        assert_eq!(node_cpulist(1), "16-31");
    }
}
