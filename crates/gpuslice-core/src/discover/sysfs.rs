//! sysfs: NUMA node, PCIe link and local CPUs of each GPU, and which DRM
//! nodes (`/dev/dri/cardN`, `renderDN`) belong to which GPU.
//!
//! Every path goes through [`resolve`] because sysfs is made of symlinks
//! and the host root may not be `/`.

use super::fsutil::{dir_names, numbered, read_lenient, resolve};
use crate::hostroot::HostRoot;
use crate::model::{Gpu, PcieLink};
use crate::select::canonical_bus_id;
use std::path::{Path, PathBuf};

/// Fills NUMA node, PCIe link and local CPUs of each GPU that has a PCI
/// device directory. Returns whether any GPU had one.
pub(crate) fn fill_pci(root: &HostRoot, gpus: &mut [Gpu]) -> bool {
    let mut used = false;
    for gpu in gpus {
        let host = resolve(
            root,
            &Path::new("/sys/bus/pci/devices").join(&gpu.pci_bus_id),
        );
        let dir = root.join(&host);
        if dir.is_dir() {
            used = true;
            fill_one(&dir, gpu);
        }
    }
    used
}

fn fill_one(dir: &Path, gpu: &mut Gpu) {
    let attr = |name: &str| read_lenient(&dir.join(name)).map(|s| s.trim().to_string());
    gpu.numa_node = attr("numa_node").as_deref().and_then(parse_numa);
    gpu.local_cpus = attr("local_cpulist").filter(|s| !s.is_empty());
    gpu.pcie = parse_link(
        attr("current_link_speed").as_deref(),
        attr("current_link_width").as_deref(),
        attr("max_link_speed").as_deref(),
        attr("max_link_width").as_deref(),
    );
}

/// `numa_node` is -1 on machines (or VMs) without NUMA information.
fn parse_numa(s: &str) -> Option<i32> {
    s.parse().ok().filter(|n: &i32| *n >= 0)
}

/// `32.0 GT/s PCIe` (newer kernels), `8 GT/s` (older) → GT/s.
/// `Unknown speed` (link down) → None.
fn parse_speed(s: &str) -> Option<f32> {
    s.split_whitespace().next()?.parse().ok()
}

/// The link from its four sysfs attributes. The current speed and width
/// are required; a missing maximum is taken as the current value so that
/// the link does not read as degraded for want of data.
fn parse_link(
    speed: Option<&str>,
    width: Option<&str>,
    max_speed: Option<&str>,
    max_width: Option<&str>,
) -> Option<PcieLink> {
    let speed_gts = parse_speed(speed?)?;
    let width: u32 = width?.parse().ok()?;
    Some(PcieLink {
        speed_gts,
        width,
        max_speed_gts: max_speed.and_then(parse_speed).unwrap_or(speed_gts),
        max_width: max_width.and_then(|w| w.parse().ok()).unwrap_or(width),
    })
}

/// DRM minors and the PCI bus id of the device each belongs to, from
/// `/sys/class/drm/{cardN,renderDN}/device`. None when `/sys/class/drm` is
/// missing (then the caller falls back to `/dev/dri`).
pub(crate) fn drm_nodes(root: &HostRoot) -> Option<Vec<(String, u32)>> {
    let class = root.join("sys/class/drm");
    if !class.is_dir() {
        return None;
    }
    let nodes = dir_names(&class)
        .into_iter()
        .filter_map(|name| {
            // card1 → 1, renderD128 → 128 (the render node's name is its minor).
            let minor = numbered(&name, "card").or_else(|| numbered(&name, "renderD"))?;
            let bus = drm_device_bus(root, &name)?;
            Some((bus, minor))
        })
        .collect();
    Some(nodes)
}

/// Bus id of the device behind `/sys/class/drm/<name>/device`: the last
/// component of the link, resolved inside the host root. The raw link text
/// is tried too, so a link whose target is missing from the tree still
/// names its device.
fn drm_device_bus(root: &HostRoot, name: &str) -> Option<String> {
    let link = PathBuf::from("/sys/class/drm").join(name).join("device");
    let resolved = resolve(root, &link);
    let raw = std::fs::read_link(root.join(resolve(root, link.parent()?)).join("device")).ok();
    [Some(resolved), raw]
        .into_iter()
        .flatten()
        .find_map(|p| canonical_bus_id(p.file_name()?.to_str()?))
}

/// Gives each GPU the DRM minors whose device is that GPU.
pub(crate) fn assign_dri(gpus: &mut [Gpu], nodes: &[(String, u32)]) {
    for gpu in gpus {
        let mut minors: Vec<u32> = nodes
            .iter()
            .filter(|(bus, _)| *bus == gpu.pci_bus_id)
            .map(|(_, m)| *m)
            .collect();
        minors.sort_unstable();
        minors.dedup();
        gpu.dri_minors = minors;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_widths_and_degraded_links() {
        let l = parse_link(
            Some("32.0 GT/s PCIe"),
            Some("16"),
            Some("32.0 GT/s PCIe"),
            Some("16"),
        )
        .unwrap();
        assert_eq!((l.speed_gts, l.width), (32.0, 16));
        assert!(!l.degraded());
        assert_eq!(PcieLink::generation(l.speed_gts), 5);

        // A Gen5 x16 card trained at Gen4 x8.
        let d = parse_link(
            Some("16.0 GT/s PCIe"),
            Some("8"),
            Some("32.0 GT/s PCIe"),
            Some("16"),
        )
        .unwrap();
        assert!(d.degraded());
        assert_eq!((d.max_speed_gts, d.max_width), (32.0, 16));

        // Older kernels print no decimals and no "PCIe".
        assert_eq!(parse_speed("8 GT/s"), Some(8.0));
        assert_eq!(parse_speed("2.5 GT/s PCIe"), Some(2.5));
        assert_eq!(parse_speed("Unknown speed"), None);
        assert_eq!(
            parse_link(Some("Unknown speed"), Some("16"), None, None),
            None
        );
        // Missing maxima do not make a link look degraded.
        let m = parse_link(Some("16.0 GT/s PCIe"), Some("16"), None, None).unwrap();
        assert!(!m.degraded());
    }

    #[test]
    fn numa() {
        assert_eq!(parse_numa("-1"), None);
        assert_eq!(parse_numa("1"), Some(1));
        assert_eq!(parse_numa("x"), None);
    }
}
