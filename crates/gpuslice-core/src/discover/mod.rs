//! Discovery: what NVIDIA GPUs a host has, read below a [`HostRoot`].
//!
//! Three sources, in order of trust for *what exists*:
//! 1. procfs (`/proc/driver/nvidia`, `/proc/devices`, the MIG capability
//!    tree): always read; the driver's own word on GPUs, minors, UUIDs,
//!    MIG instances and their cap minors. Without it there is no driver.
//! 2. NVML, when enabled, loadable and describing this host root (see
//!    below): memory sizes, MIG mode, MIG UUIDs and profiles, NVLink
//!    peers, the CUDA version, the marketing name. Any NVML failure leaves
//!    the procfs picture and sets [`Inventory::nvml_error`].
//! 3. sysfs (`/sys/bus/pci/devices`, `/sys/class/drm`): NUMA node, PCIe
//!    link, local CPUs, DRM nodes; `/dev/dri/by-path` and the `/dev` nodes
//!    stand in where sysfs or `/proc/devices` are missing.
//!
//! # When NVML is used
//! NVML always describes the machine this process runs on, whatever the
//! host root says. So it is used only when one of these holds:
//! - the host root is `/`;
//! - the environment variable `FAKEGPU_ROOT` names the host root (the
//!   test suite's fake `libnvidia-ml.so.1` reads its GPUs from there);
//! - `FAKEGPU_ROOT` is unset and the root's `/proc/driver/nvidia` shows the
//!   same GPUs (same names, same `information` text) as our own `/proc`
//!   does: the root is this machine's host mounted elsewhere, such as
//!   `/host` in a DaemonSet pod, where NVML is right.
//!
//! Otherwise `nvml_error` says why NVML was skipped.

pub mod cache;
mod devices;
mod fsutil;
mod nvml;
mod procfs;
mod sysfs;
#[cfg(test)]
mod testtree;

use crate::hostroot::HostRoot;
use crate::model::{Gpu, Inventory};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Library name NVML is loaded by when [`DiscoverOptions::nvml_lib`] is None.
pub const DEFAULT_NVML_LIB: &str = gpuslice_cuda_abi::nvml::LIBNVIDIA_ML;
/// Environment variable naming the host root a fake NVML describes.
pub const FAKEGPU_ROOT_ENV: &str = "FAKEGPU_ROOT";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverOptions {
    /// Try NVML at all (default true).
    pub use_nvml: bool,
    /// Where to load NVML from; None is [`DEFAULT_NVML_LIB`] through the
    /// dynamic loader's search path.
    pub nvml_lib: Option<PathBuf>,
    /// Read each GPU's NUMA node, local CPUs and PCIe link from sysfs
    /// (default true). `run` turns it off: its device policy needs none of
    /// it, and every launch would pay for the reads.
    pub pci_details: bool,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        Self {
            use_nvml: true,
            nvml_lib: None,
            pci_details: true,
        }
    }
}

#[derive(Debug, Error)]
pub enum DiscoverError {
    #[error(
        "no NVIDIA driver at {}: the nvidia kernel module is not loaded, or the host's /proc \
         is not below this root (point --host-root or GPUSLICE_HOST_ROOT at where the host \
         is mounted, e.g. /host)",
        path.display()
    )]
    NoDriver { path: PathBuf },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unexpected content in {}: {why}", path.display())]
    Malformed { path: PathBuf, why: String },
}

/// Discovers the GPUs below `root`. Fails only when the NVIDIA driver is
/// absent there or one of its procfs files is unreadable or malformed; a
/// driver with no GPUs gives an empty inventory.
pub fn discover(root: &HostRoot, opts: &DiscoverOptions) -> Result<Inventory, DiscoverError> {
    let fake = std::env::var_os(FAKEGPU_ROOT_ENV);
    discover_with(
        root,
        opts,
        fake.as_deref().map(Path::new),
        &HostRoot::default(),
    )
}

/// [`discover`] with the NVML gate's inputs explicit, so tests need not
/// touch the process environment or the real `/proc`.
fn discover_with(
    root: &HostRoot,
    opts: &DiscoverOptions,
    fake_root: Option<&Path>,
    system: &HostRoot,
) -> Result<Inventory, DiscoverError> {
    let scan = procfs::scan(root)?;
    let mut inv = Inventory {
        gpus: scan.gpus,
        driver_version: scan.driver_version,
        majors: scan.majors,
        modify_device_files: scan.modify_device_files,
        ..Default::default()
    };
    let used_nvml = match nvml_gate(root, opts, fake_root, system).and_then(nvml::snapshot) {
        Ok(snap) => {
            nvml::merge(&mut inv, snap, &scan.cap_minors);
            true
        }
        Err(why) => {
            tracing::debug!("discovery without NVML: {why}");
            inv.nvml_error = Some(why.to_string());
            false
        }
    };
    // After NVML, so GPUs only NVML listed get sysfs data too.
    let (used_sysfs, used_dev) = add_sysfs_and_dev(root, &mut inv, opts.pci_details);
    renumber(&mut inv.gpus);
    inv.sources = [
        (true, "procfs"),
        (used_sysfs, "sysfs"),
        (used_nvml, "nvml"),
        (used_dev, "dev"),
    ]
    .iter()
    .filter(|(used, _)| *used)
    .map(|(_, s)| s.to_string())
    .collect();
    Ok(inv)
}

/// PCI attributes and DRM nodes from sysfs, falling back to `/dev` for DRM
/// nodes and majors. Returns (sysfs used, /dev used).
fn add_sysfs_and_dev(root: &HostRoot, inv: &mut Inventory, pci_details: bool) -> (bool, bool) {
    let mut used_sysfs = pci_details && sysfs::fill_pci(root, &mut inv.gpus);
    let mut used_dev = false;
    let drm = match sysfs::drm_nodes(root) {
        Some(nodes) => {
            used_sysfs = true;
            nodes
        }
        None => {
            let nodes = devices::dri_by_path(root);
            used_dev |= !nodes.is_empty();
            nodes
        }
    };
    sysfs::assign_dri(&mut inv.gpus, &drm);
    used_dev |= devices::majors_from_dev(root, &mut inv.majors);
    (used_sysfs, used_dev)
}

/// GPUs in bus-id order with `index` = position, as CUDA with
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID` and NVML number them. (Canonical bus ids
/// are fixed-width lower-case hex, so string order is bus order.)
fn renumber(gpus: &mut [Gpu]) {
    gpus.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    for (i, g) in gpus.iter_mut().enumerate() {
        g.index = i as u32;
    }
}

/// Decides whether NVML may describe `root` (the rule in the module docs)
/// and returns the library to load, or why not.
fn nvml_gate<'a>(
    root: &HostRoot,
    opts: &'a DiscoverOptions,
    fake_root: Option<&Path>,
    system: &HostRoot,
) -> Result<&'a OsStr, nvml::NvmlSkipped> {
    if !opts.use_nvml {
        return Err(nvml::NvmlSkipped::Disabled);
    }
    let lib = opts
        .nvml_lib
        .as_deref()
        .map_or(OsStr::new(DEFAULT_NVML_LIB), Path::as_os_str);
    let allowed = match fake_root {
        _ if root.is_system_root() => true,
        Some(fake) => same_path(fake, root.path()),
        None => same_driver_view(root, system),
    };
    if allowed {
        return Ok(lib);
    }
    Err(nvml::NvmlSkipped::OtherMachine {
        root: root.path().to_path_buf(),
    })
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// True when both roots' `/proc/driver/nvidia/gpus` list the same, non-empty
/// set of GPUs with identical `information` files (UUIDs included), which
/// a fake tree will not match by accident.
fn same_driver_view(a: &HostRoot, b: &HostRoot) -> bool {
    let view = |r: &HostRoot| -> Vec<(String, Option<String>)> {
        let dir = r.nvidia_proc().join("gpus");
        fsutil::dir_names(&dir)
            .into_iter()
            .map(|n| {
                let info = fsutil::read_lenient(&dir.join(&n).join("information"));
                (n, info)
            })
            .collect()
    };
    let va = view(a);
    !va.is_empty() && va == view(b)
}

#[cfg(test)]
mod tests;
