//! What the NVIDIA kernel module tells through `/proc`: the GPUs, the driver
//! version, `ModifyDeviceFiles`, the dynamic char majors and the MIG
//! capability minors. This needs no library and works in any container
//! that sees the host's `/proc`, so it is always the base of discovery.

use super::fsutil::{dir_names, numbered, read_driver_file, read_lenient, read_optional};
use super::DiscoverError;
use crate::hostroot::HostRoot;
use crate::model::{Gpu, Majors, MigDevice};
use crate::select::canonical_bus_id;
use std::collections::BTreeMap;
use std::path::Path;

/// Everything read from procfs, before sysfs and NVML add to it.
#[derive(Debug, Default)]
pub(crate) struct ProcfsScan {
    pub gpus: Vec<Gpu>,
    pub driver_version: Option<String>,
    pub majors: Majors,
    pub modify_device_files: bool,
    /// Cap minors of MIG instances, for NVML's instances too.
    pub cap_minors: CapMinors,
}

/// (GPU minor, GPU instance, compute instance or None for the GI itself).
pub(crate) type CapKey = (u32, u32, Option<u32>);

/// `/dev/nvidia-caps/nvidia-cap<N>` minors of MIG access capabilities.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct CapMinors(BTreeMap<CapKey, u32>);

impl CapMinors {
    pub fn gi(&self, gpu_minor: u32, gi: u32) -> Option<u32> {
        self.0.get(&(gpu_minor, gi, None)).copied()
    }

    pub fn ci(&self, gpu_minor: u32, gi: u32, ci: u32) -> Option<u32> {
        self.0.get(&(gpu_minor, gi, Some(ci))).copied()
    }

    pub(crate) fn insert(&mut self, key: CapKey, minor: u32) {
        self.0.insert(key, minor);
    }
}

/// Reads procfs below `root`. Fails only when the driver is not there or a
/// file it must have is unreadable or malformed.
pub(crate) fn scan(root: &HostRoot) -> Result<ProcfsScan, DiscoverError> {
    let nv = root.nvidia_proc();
    if !nv.is_dir() {
        return Err(DiscoverError::NoDriver { path: nv });
    }
    let (instances, mut cap_minors) = scan_capabilities(&nv.join("capabilities"));
    // mig-minors is the driver's full table of possible minors; it only
    // fills in what the access files did not say (they are the live value).
    let table = read_lenient(&root.join("proc/driver/nvidia-caps/mig-minors"));
    for (key, minor) in table.as_deref().map(parse_mig_minors).unwrap_or_default() {
        cap_minors.0.entry(key).or_insert(minor);
    }
    let mut gpus = read_gpus(root)?;
    for gpu in &mut gpus {
        gpu.migs = procfs_migs(gpu.minor, &instances, &cap_minors);
    }
    let version = read_driver_file(root, "proc/driver/nvidia/version")?;
    let params = read_driver_file(root, "proc/driver/nvidia/params")?;
    let devices = read_optional(&root.join("proc/devices"))?;
    Ok(ProcfsScan {
        gpus,
        driver_version: version.as_deref().and_then(parse_version),
        majors: devices
            .as_deref()
            .map(parse_char_majors)
            .unwrap_or_default(),
        modify_device_files: params
            .as_deref()
            .map(parse_modify_device_files)
            .unwrap_or(true),
        cap_minors,
    })
}

/// One `Gpu` per `gpus/<bus>/information`, sorted by bus id. A directory
/// without an information file (a GPU going away mid-scan) is skipped.
fn read_gpus(root: &HostRoot) -> Result<Vec<Gpu>, DiscoverError> {
    let mut gpus = Vec::new();
    for name in dir_names(&root.nvidia_proc().join("gpus")) {
        let rel = format!("proc/driver/nvidia/gpus/{name}/information");
        let path = root.join(&rel);
        if let Some(text) = read_driver_file(root, &rel)? {
            gpus.push(parse_information(&text, &name, &path)?);
        }
    }
    gpus.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    for (i, g) in gpus.iter_mut().enumerate() {
        g.index = i as u32;
    }
    Ok(gpus)
}

/// `Key: \t value` lines, split at the first ':' (values such as the bus
/// location contain colons themselves).
fn fields(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim(), v.trim()))
}

/// Parses one information file. `dir_name` (the directory, named after the
/// bus id) stands in when the file has no `Bus Location`.
fn parse_information(text: &str, dir_name: &str, path: &Path) -> Result<Gpu, DiscoverError> {
    let malformed = |why: &str| DiscoverError::Malformed {
        path: path.to_path_buf(),
        why: why.to_string(),
    };
    let mut gpu = Gpu::default();
    let mut minor = None;
    let mut bus = None;
    for (key, value) in fields(text) {
        match key {
            "Model" => gpu.model = value.to_string(),
            // Some drivers print GPU-????… before the GPU is initialised;
            // kept as is (NVML, when used, replaces it).
            "GPU UUID" => gpu.uuid = value.to_string(),
            "Bus Location" => bus = Some(value.to_string()),
            "Device Minor" => {
                minor = Some(value.parse().map_err(|_| malformed("bad Device Minor"))?);
            }
            _ => {}
        }
    }
    gpu.minor = minor.ok_or_else(|| malformed("no Device Minor line"))?;
    gpu.pci_bus_id = bus
        .as_deref()
        .and_then(canonical_bus_id)
        .or_else(|| canonical_bus_id(dir_name))
        .ok_or_else(|| malformed("no usable Bus Location"))?;
    Ok(gpu)
}

/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release …`
/// or `… UNIX Open Kernel Module for x86_64  580.159.04 …`: the first
/// version-looking token after "Kernel Module".
pub(crate) fn parse_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let (_, rest) = line.split_once("Kernel Module")?;
    rest.split_whitespace()
        .find(|t| looks_like_version(t))
        .map(str::to_string)
}

fn looks_like_version(t: &str) -> bool {
    t.contains('.')
        && t.starts_with(|c: char| c.is_ascii_digit())
        && t.chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// `ModifyDeviceFiles: 0` → false. Anything but an explicit 0 counts as on:
/// that is the case in which libcuda re-creates hidden nodes, so assuming it
/// keeps the isolation layers honest.
pub(crate) fn parse_modify_device_files(text: &str) -> bool {
    !fields(text).any(|(k, v)| k == "ModifyDeviceFiles" && v == "0")
}

/// Majors of `nvidia-uvm` and `nvidia-caps` from the "Character devices"
/// section of `/proc/devices` (names compared whole: `nvidia-caps-imex-channels`
/// is a different driver).
pub(crate) fn parse_char_majors(text: &str) -> Majors {
    let mut majors = Majors::default();
    let mut in_char = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with("devices:") {
            in_char = line == "Character devices:";
            continue;
        }
        let Some((major, name)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let major = major.parse().ok();
        match (in_char, name.trim()) {
            (true, "nvidia-uvm") => majors.nvidia_uvm = major,
            (true, "nvidia-caps") => majors.nvidia_caps = major,
            _ => {}
        }
    }
    majors
}

/// `DeviceFileMinor: 12` from a capability `access` file.
fn parse_access_minor(text: &str) -> Option<u32> {
    fields(text)
        .find(|(k, _)| *k == "DeviceFileMinor")
        .and_then(|(_, v)| v.parse().ok())
}

/// Lines `gpu0/gi1/access 12` and `gpu0/gi1/ci0/access 13` of
/// `/proc/driver/nvidia-caps/mig-minors` (other lines, such as `config 1`,
/// are not per-instance and are skipped).
fn parse_mig_minors(text: &str) -> Vec<(CapKey, u32)> {
    text.lines()
        .filter_map(|line| {
            let (path, minor) = line.trim().split_once(char::is_whitespace)?;
            let minor: u32 = minor.trim().parse().ok()?;
            let parts: Vec<&str> = path.split('/').collect();
            let key = match parts.as_slice() {
                [g, gi, "access"] => (numbered(g, "gpu")?, numbered(gi, "gi")?, None),
                [g, gi, ci, "access"] => (
                    numbered(g, "gpu")?,
                    numbered(gi, "gi")?,
                    Some(numbered(ci, "ci")?),
                ),
                _ => return None,
            };
            Some((key, minor))
        })
        .collect()
}

/// Walks `capabilities/gpu<minor>/mig/gi<g>/ci<c>`: these directories exist
/// only for instances that exist (unlike mig-minors, which lists every
/// possible one), so they tell which compute instances there are. Returns
/// the (gpu minor, gi, ci) triples and the minors the access files state.
fn scan_capabilities(dir: &Path) -> (Vec<(u32, u32, u32)>, CapMinors) {
    let mut instances = Vec::new();
    let mut minors = CapMinors::default();
    for gpu_name in dir_names(dir) {
        let Some(gpu) = numbered(&gpu_name, "gpu") else {
            continue;
        };
        let mig = dir.join(&gpu_name).join("mig");
        for gi_name in dir_names(&mig) {
            let Some(gi) = numbered(&gi_name, "gi") else {
                continue;
            };
            let gi_dir = mig.join(&gi_name);
            if let Some(m) = access_minor(&gi_dir) {
                minors.insert((gpu, gi, None), m);
            }
            for ci_name in dir_names(&gi_dir) {
                let Some(ci) = numbered(&ci_name, "ci") else {
                    continue;
                };
                instances.push((gpu, gi, ci));
                if let Some(m) = access_minor(&gi_dir.join(&ci_name)) {
                    minors.insert((gpu, gi, Some(ci)), m);
                }
            }
        }
    }
    (instances, minors)
}

fn access_minor(dir: &Path) -> Option<u32> {
    read_lenient(&dir.join("access")).and_then(|t| parse_access_minor(&t))
}

/// The MIG devices (compute instances) of the GPU with this minor, in
/// (gi, ci) order and indexed in that order. A GPU instance without a
/// compute instance is not a device CUDA can use, so it is not listed.
pub(crate) fn procfs_migs(
    gpu_minor: u32,
    instances: &[(u32, u32, u32)],
    cap_minors: &CapMinors,
) -> Vec<MigDevice> {
    let mut pairs: Vec<(u32, u32)> = instances
        .iter()
        .filter(|(g, _, _)| *g == gpu_minor)
        .map(|(_, gi, ci)| (*gi, *ci))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    pairs
        .into_iter()
        .enumerate()
        .map(|(i, (gi, ci))| MigDevice {
            index: i as u32,
            gpu_instance: gi,
            compute_instance: ci,
            gi_access_minor: cap_minors.gi(gpu_minor, gi),
            ci_access_minor: cap_minors.ci(gpu_minor, gi, ci),
            ..Default::default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn information_file_real_format() {
        let text = "Model: \t\t NVIDIA H200\nIRQ:   \t\t 1234\nGPU UUID: \t GPU-8f6a8b3c-1d2e-4f50-9a61-7b8c9d0e1f23\n\
                    Video BIOS: \t 96.00.a5.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n\
                    Bus Location: \t 0000:18:00.0\nDevice Minor: \t 0\nGPU Excluded:\t No\n";
        let g = parse_information(text, "0000:18:00.0", Path::new("x")).unwrap();
        assert_eq!(g.model, "NVIDIA H200");
        assert_eq!(g.uuid, "GPU-8f6a8b3c-1d2e-4f50-9a61-7b8c9d0e1f23");
        assert_eq!(g.pci_bus_id, "0000:18:00.0");
        assert_eq!(g.minor, 0);
    }

    #[test]
    fn information_bus_falls_back_to_dir_and_minor_is_required() {
        let g = parse_information("Device Minor: 3\n", "0000:3B:00.0", Path::new("x")).unwrap();
        assert_eq!(g.pci_bus_id, "0000:3b:00.0");
        let e = parse_information("Model: X\n", "0000:3b:00.0", Path::new("/p/info"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/p/info") && e.contains("Device Minor"), "{e}");
    }

    #[test]
    fn versions_proprietary_and_open() {
        let prop = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build  (dvs-builder@U16)  Thu Nov 13 2025\nGCC version:  gcc version 13.3.0\n";
        assert_eq!(parse_version(prop).as_deref(), Some("580.159.04"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder@U16)\n";
        assert_eq!(parse_version(open).as_deref(), Some("570.86.15"));
        let arm =
            "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.65.06  Release Build\n";
        assert_eq!(parse_version(arm).as_deref(), Some("580.65.06"));
        assert_eq!(parse_version("garbage"), None);
    }

    #[test]
    fn params_modify_device_files() {
        assert!(!parse_modify_device_files(
            "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\n"
        ));
        assert!(parse_modify_device_files("ModifyDeviceFiles: 1\n"));
        assert!(parse_modify_device_files("EnableMSI: 1\n"));
    }

    #[test]
    fn char_majors_only_from_char_section_and_exact_names() {
        let text =
            "Character devices:\n  1 mem\n195 nvidia-frontend\n237 nvidia-caps-imex-channels\n\
                    238 nvidia-uvm\n241 nvidia-caps\n\nBlock devices:\n  7 loop\n250 nvidia-uvm\n";
        let m = parse_char_majors(text);
        assert_eq!(m.nvidia_uvm, Some(238));
        assert_eq!(m.nvidia_caps, Some(241));
    }

    #[test]
    fn mig_minors_table() {
        let t =
            "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n";
        let rows = parse_mig_minors(t);
        assert!(rows.contains(&((0, 1, None), 12)));
        assert!(rows.contains(&((0, 1, Some(0)), 13)));
        assert_eq!(rows.len(), 3);
    }

    #[test]
    fn access_file_minor() {
        assert_eq!(
            parse_access_minor("DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
            Some(12)
        );
        assert_eq!(parse_access_minor("nothing\n"), None);
    }
}
