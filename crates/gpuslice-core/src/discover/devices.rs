//! Fallbacks that read device nodes under `<root>/dev` when procfs or sysfs
//! did not say enough: DRM nodes per GPU from `/dev/dri/by-path` when
//! `/sys/class/drm` is missing, and NVIDIA majors from the nodes themselves
//! when `/proc/devices` lacks them.

use super::fsutil::{dir_names, resolve};
use crate::hostroot::HostRoot;
use crate::model::{Majors, DRM_MAJOR};
use crate::select::canonical_bus_id;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// glibc's `major()`/`minor()` of a `dev_t` (core does not link libc).
pub(crate) fn split_dev(rdev: u64) -> (u32, u32) {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// (major, minor) of the char device at host path `host`, following links
/// inside the root; None when it is not a char device.
pub(crate) fn char_dev(root: &HostRoot, host: &Path) -> Option<(u32, u32)> {
    let meta = std::fs::symlink_metadata(root.join(resolve(root, host))).ok()?;
    meta.file_type()
        .is_char_device()
        .then(|| split_dev(meta.rdev()))
}

/// DRM minors per bus id from udev's `/dev/dri/by-path/pci-<bus>-{card,render}`
/// links, keeping only targets that are DRM char devices (major 226).
pub(crate) fn dri_by_path(root: &HostRoot) -> Vec<(String, u32)> {
    let dir = PathBuf::from("/dev/dri/by-path");
    dir_names(&root.join(&dir))
        .into_iter()
        .filter_map(|name| {
            let bus = by_path_bus(&name)?;
            match char_dev(root, &dir.join(&name))? {
                (DRM_MAJOR, minor) => Some((bus, minor)),
                _ => None,
            }
        })
        .collect()
}

/// `pci-0000:18:00.0-card` → `0000:18:00.0`.
fn by_path_bus(name: &str) -> Option<String> {
    let rest = name.strip_prefix("pci-")?;
    let bus = rest
        .strip_suffix("-card")
        .or_else(|| rest.strip_suffix("-render"))?;
    canonical_bus_id(bus)
}

/// Fills majors `/proc/devices` did not give from `/dev/nvidia-uvm` and
/// the first node in `/dev/nvidia-caps`. Returns whether it found any.
pub(crate) fn majors_from_dev(root: &HostRoot, majors: &mut Majors) -> bool {
    let mut found = false;
    if majors.nvidia_uvm.is_none() {
        majors.nvidia_uvm = char_dev(root, Path::new("/dev/nvidia-uvm")).map(|(ma, _)| ma);
        found |= majors.nvidia_uvm.is_some();
    }
    if majors.nvidia_caps.is_none() {
        let caps = PathBuf::from("/dev/nvidia-caps");
        majors.nvidia_caps = dir_names(&root.join(&caps))
            .iter()
            .find_map(|n| char_dev(root, &caps.join(n)))
            .map(|(ma, _)| ma);
        found |= majors.nvidia_caps.is_some();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_t_split_matches_glibc() {
        // makedev(195, 255) and makedev(226, 128), and a large minor.
        assert_eq!(split_dev((195 << 8) | 255), (195, 255));
        assert_eq!(split_dev((226 << 8) | 128), (226, 128));
        let big: u64 = (241 << 8) | (0x1234 & 0xff) | ((0x1234u64 & !0xff) << 12);
        assert_eq!(split_dev(big), (241, 0x1234));
    }

    #[test]
    fn by_path_names() {
        assert_eq!(
            by_path_bus("pci-0000:18:00.0-card").as_deref(),
            Some("0000:18:00.0")
        );
        assert_eq!(
            by_path_bus("pci-0000:3B:00.0-render").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(by_path_bus("platform-simple-framebuffer.0-card"), None);
    }
}
