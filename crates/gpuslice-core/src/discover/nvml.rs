//! NVML: what procfs cannot tell (memory sizes, MIG mode and MIG UUIDs,
//! NVLink topology, the CUDA driver version, the marketing name).
//!
//! Split in two so the merge can be tested without a GPU: [`snapshot`]
//! copies what NVML says into plain data, [`merge`] folds that into the
//! procfs/sysfs inventory.

use super::procfs::CapMinors;
use crate::model::{Gpu, Inventory, MigDevice};
use crate::select::canonical_bus_id;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;
use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// Why discovery went without NVML (one line: [`Inventory::nvml_error`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum NvmlSkipped {
    #[error("NVML not used: disabled by the caller")]
    Disabled,
    #[error(
        "NVML not used: it describes the machine it runs on, and host root {} is not that \
         machine's / (set {}={} when a fake NVML serves this tree)",
        root.display(),
        super::FAKEGPU_ROOT_ENV,
        root.display()
    )]
    OtherMachine { root: PathBuf },
    #[error("{}", one_line(&format!("NVML unavailable ({}): {source}", lib.to_string_lossy())))]
    Unavailable {
        lib: OsString,
        #[source]
        source: NvmlError,
    },
    #[error("{}", one_line(&format!("NVML device count failed: {source}")))]
    DeviceCount {
        #[source]
        source: NvmlError,
    },
}

/// Why NVML could not describe one GPU (it is then skipped).
#[derive(Debug, thiserror::Error)]
enum GpuError {
    #[error("PCI info: {0}")]
    PciInfo(#[source] NvmlError),
    #[error("bad bus id {0:?}")]
    BusId(String),
    #[error(transparent)]
    Nvml(#[from] NvmlError),
}

/// NVLink links NVML may report per GPU (`NVML_NVLINK_MAX_LINKS`).
pub(crate) const NVLINK_MAX: u32 = 18;
/// `NVML_DEVICE_MIG_ENABLE` for the current mode.
const MIG_ENABLED: u32 = 1;

/// What NVML said about the host.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct NvmlSnapshot {
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub gpus: Vec<NvmlGpu>,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct NvmlGpu {
    /// Canonical bus id (NVML's 8-digit domain shortened).
    pub bus_id: String,
    pub minor: Option<u32>,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub memory_bytes: Option<u64>,
    pub mig_enabled: Option<bool>,
    /// None when the MIG devices could not be listed.
    pub migs: Option<Vec<NvmlMig>>,
    /// Remote end of each active NVLink; None when NVML could not say.
    pub nvlinks: Vec<Option<String>>,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct NvmlMig {
    pub uuid: Option<String>,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    pub memory_bytes: Option<u64>,
    pub profile: Option<String>,
}

/// Loads NVML from `lib` and reads every GPU. Err is a one-line reason.
/// A GPU NVML cannot describe is skipped with a warning rather than
/// losing what the others say.
pub(crate) fn snapshot(lib: &OsStr) -> Result<NvmlSnapshot, NvmlSkipped> {
    let nvml =
        gpuslice_cuda_load::open_nvml(Some(std::path::Path::new(lib))).map_err(|source| {
            NvmlSkipped::Unavailable {
                lib: lib.to_os_string(),
                source,
            }
        })?;
    let count = nvml
        .device_count()
        .map_err(|source| NvmlSkipped::DeviceCount { source })?;
    let mut gpus = Vec::new();
    for i in 0..count {
        match nvml
            .device_by_index(i)
            .map_err(GpuError::from)
            .and_then(|d| read_gpu(&d))
        {
            Ok(g) => gpus.push(g),
            Err(e) => tracing::warn!(index = i, "NVML device skipped: {e}"),
        }
    }
    Ok(NvmlSnapshot {
        driver_version: nvml.sys_driver_version().ok(),
        cuda_version: nvml.sys_cuda_driver_version().ok().map(cuda_version),
        gpus,
    })
}

/// One physical GPU. Only its bus id is required: without it the GPU
/// cannot be matched to procfs.
fn read_gpu(dev: &Device) -> Result<NvmlGpu, GpuError> {
    let pci = dev.pci_info().map_err(GpuError::PciInfo)?;
    let bus_id =
        canonical_bus_id(&pci.bus_id).ok_or_else(|| GpuError::BusId(pci.bus_id.clone()))?;
    let memory_bytes = dev.memory_info().ok().map(|m| m.total);
    let mig_enabled = dev.mig_mode().ok().map(|m| m.current == MIG_ENABLED);
    let migs = match mig_enabled {
        Some(true) => read_migs(dev, memory_bytes)
            .map_err(|e| tracing::warn!(bus = %bus_id, "NVML MIG listing failed: {e}"))
            .ok(),
        _ => Some(Vec::new()),
    };
    Ok(NvmlGpu {
        bus_id,
        minor: dev.minor_number().ok(),
        uuid: dev.uuid().ok(),
        name: dev.name().ok(),
        memory_bytes,
        mig_enabled,
        migs,
        nvlinks: read_nvlinks(dev),
    })
}

/// The MIG devices of a GPU in MIG mode. NVML's handle indices may have
/// holes (NotFound), which are skipped.
fn read_migs(dev: &Device, parent_total: Option<u64>) -> Result<Vec<NvmlMig>, GpuError> {
    let max = dev.mig_device_count()?;
    let mut out = Vec::new();
    for i in 0..max {
        let mig = match dev.mig_device_by_index(i) {
            Ok(m) => m,
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(e.into()),
        };
        let (gpu_instance, compute_instance) = gpuslice_cuda_load::nvml_raw::instance_ids(&mig)?;
        // NVML names a MIG device "<GPU name> MIG <profile>"; failing that,
        // the profile is derived from the instance's slices and memory.
        let profile = mig
            .name()
            .ok()
            .and_then(|n| profile_from_name(&n))
            .or_else(|| {
                let a = mig.attributes().ok()?;
                profile_name(
                    a.gpu_instance_slice_count,
                    a.compute_instance_slice_count,
                    a.memory_size_mb,
                    parent_total?,
                )
            });
        out.push(NvmlMig {
            uuid: mig.uuid().ok(),
            gpu_instance,
            compute_instance,
            memory_bytes: mig.memory_info().ok().map(|m| m.total),
            profile,
        });
    }
    Ok(out)
}

/// Remote PCI bus id of each active NVLink. A link that is not there or
/// not supported is simply skipped.
fn read_nvlinks(dev: &Device) -> Vec<Option<String>> {
    (0..NVLINK_MAX)
        .filter_map(|link| {
            let l = dev.link_wrapper_for(link);
            match l.is_active() {
                Ok(true) => Some(
                    l.remote_pci_info()
                        .ok()
                        .and_then(|p| canonical_bus_id(&p.bus_id)),
                ),
                _ => None,
            }
        })
        .collect()
}

/// `NVIDIA H200 MIG 1g.18gb` → `1g.18gb` (also `1c.2g.35gb`, `1g.18gb+me`).
pub(crate) fn profile_from_name(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    let looks_right = profile.starts_with(|c: char| c.is_ascii_digit())
        && profile.contains("g.")
        && !profile.contains(char::is_whitespace);
    looks_right.then(|| profile.to_string())
}

/// NVIDIA's profile name of a MIG device: `<g>g.<gb>gb`, or
/// `<c>c.<g>g.<gb>gb` when the compute instance uses fewer slices than its
/// GPU instance. The GB figure is the instance's memory snapped up to an
/// eighth of the board, times the board's size in whole GiB, rounded: how
/// NVIDIA arrives at the round numbers of its names (1g.18gb on an H200).
/// Attribute suffixes (`+me`) cannot be told from these inputs and are
/// left out.
pub(crate) fn profile_name(
    gi_slices: u32,
    ci_slices: u32,
    mem_mib: u64,
    parent_total_bytes: u64,
) -> Option<String> {
    const GIB: u64 = 1 << 30;
    if gi_slices == 0 || parent_total_bytes == 0 {
        return None;
    }
    let fraction = (mem_mib as f64 * (1u64 << 20) as f64) / parent_total_bytes as f64;
    let eighths = (fraction * 8.0).ceil() / 8.0;
    let board_gib = parent_total_bytes.div_ceil(GIB) as f64;
    let gb = (eighths * board_gib).round() as u64;
    Some(if ci_slices == gi_slices || ci_slices == 0 {
        format!("{gi_slices}g.{gb}gb")
    } else {
        format!("{ci_slices}c.{gi_slices}g.{gb}gb")
    })
}

/// `nvmlSystemGetCudaDriverVersion` gives 1000*major + 10*minor: 13000 → "13.0".
pub(crate) fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Folds an NVML snapshot into the inventory: NVML's values win where both
/// know something (name, UUID), procfs keeps what NVML lacks, GPUs only
/// NVML lists are added. Indices are not renumbered here.
pub(crate) fn merge(inv: &mut Inventory, snap: NvmlSnapshot, caps: &CapMinors) {
    if inv.driver_version.is_none() {
        inv.driver_version = snap.driver_version;
    }
    if snap.cuda_version.is_some() {
        inv.cuda_version = snap.cuda_version;
    }
    let mut links = Vec::new();
    for n in snap.gpus {
        let Some(gpu) = find_or_add(&mut inv.gpus, &n) else {
            continue;
        };
        links.push((gpu.pci_bus_id.clone(), n.nvlinks.clone()));
        apply(gpu, n, caps);
    }
    nvlink_peers(&mut inv.gpus, &links);
}

/// The procfs GPU with NVML's bus id, or a new one when procfs lacks it
/// (its minor must come from NVML then; without one it cannot be isolated
/// and is skipped).
fn find_or_add<'a>(gpus: &'a mut Vec<Gpu>, n: &NvmlGpu) -> Option<&'a mut Gpu> {
    if let Some(i) = gpus.iter().position(|g| g.pci_bus_id == n.bus_id) {
        return Some(&mut gpus[i]);
    }
    let Some(minor) = n.minor else {
        tracing::warn!(bus = %n.bus_id, "GPU known only to NVML and without a minor: skipped");
        return None;
    };
    gpus.push(Gpu {
        minor,
        pci_bus_id: n.bus_id.clone(),
        ..Default::default()
    });
    gpus.last_mut()
}

fn apply(gpu: &mut Gpu, n: NvmlGpu, caps: &CapMinors) {
    if let Some(name) = n.name.filter(|s| !s.is_empty()) {
        gpu.model = name;
    }
    if let Some(uuid) = n.uuid.filter(|s| !s.is_empty()) {
        gpu.uuid = uuid;
    }
    gpu.memory_bytes = n.memory_bytes.or(gpu.memory_bytes);
    gpu.mig_enabled = n.mig_enabled.or(gpu.mig_enabled);
    match (n.mig_enabled, n.migs) {
        // MIG off: any procfs instances are stale.
        (Some(false), _) => gpu.migs.clear(),
        (_, Some(migs)) => {
            let procfs = std::mem::take(&mut gpu.migs);
            gpu.migs = mig_devices(gpu.minor, migs, procfs, caps);
        }
        // NVML could not list them: keep what procfs found.
        (_, None) => {}
    }
}

/// NVML's MIG devices with their cap minors from procfs, plus the procfs
/// instances NVML did not list (NVML hides MIG devices whose
/// `/dev/nvidia-caps` nodes the caller cannot open, as in a container, yet
/// the capability tree proves they exist and isolation must know their
/// minors). In (gi, ci) order, indexed in that order.
fn mig_devices(
    gpu_minor: u32,
    nvml: Vec<NvmlMig>,
    procfs: Vec<MigDevice>,
    caps: &CapMinors,
) -> Vec<MigDevice> {
    let mut out: Vec<MigDevice> = nvml
        .into_iter()
        .map(|m| MigDevice {
            index: 0,
            uuid: m.uuid,
            profile: m.profile,
            gpu_instance: m.gpu_instance,
            compute_instance: m.compute_instance,
            memory_bytes: m.memory_bytes,
            gi_access_minor: caps.gi(gpu_minor, m.gpu_instance),
            ci_access_minor: caps.ci(gpu_minor, m.gpu_instance, m.compute_instance),
        })
        .collect();
    let key = |m: &MigDevice| (m.gpu_instance, m.compute_instance);
    for p in procfs {
        if !out.iter().any(|m| key(m) == key(&p)) {
            out.push(p);
        }
    }
    out.sort_by_key(key);
    for (i, m) in out.iter_mut().enumerate() {
        m.index = i as u32;
    }
    out
}

/// NVLink peers of every GPU. A link to another GPU makes the two peers
/// (both ways, in case one side's query failed). A link to anything else
/// (an NVSwitch on HGX boards) or to an end NVML could not name joins the
/// switch fabric, and all GPUs on the fabric are peers of one another.
fn nvlink_peers(gpus: &mut [Gpu], links: &[(String, Vec<Option<String>>)]) {
    let known: BTreeSet<String> = gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
    let mut pairs: BTreeSet<(String, String)> = BTreeSet::new();
    let mut fabric: BTreeSet<String> = BTreeSet::new();
    for (bus, remotes) in links {
        for remote in remotes {
            match remote {
                Some(r) if r == bus => {}
                Some(r) if known.contains(r) => {
                    pairs.insert((bus.clone(), r.clone()));
                    pairs.insert((r.clone(), bus.clone()));
                }
                _ => {
                    fabric.insert(bus.clone());
                }
            }
        }
    }
    for a in &fabric {
        for b in fabric.iter().filter(|b| *b != a) {
            pairs.insert((a.clone(), b.clone()));
        }
    }
    for gpu in gpus {
        // BTreeSet order makes the list sorted and free of duplicates.
        gpu.nvlink_peers = pairs
            .iter()
            .filter(|(a, _)| *a == gpu.pci_bus_id)
            .map(|(_, b)| b.clone())
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(bus: &str, minor: u32) -> Gpu {
        Gpu {
            minor,
            pci_bus_id: bus.into(),
            uuid: "GPU-????????".into(),
            model: "NVIDIA H200".into(),
            ..Default::default()
        }
    }

    fn ngpu(bus: &str) -> NvmlGpu {
        NvmlGpu {
            bus_id: canonical_bus_id(bus).unwrap(),
            mig_enabled: Some(false),
            migs: Some(vec![]),
            ..Default::default()
        }
    }

    #[test]
    fn profile_names_match_nvidia() {
        // H100 80GB: 1g.10gb holds 9856 MiB of 81559 MiB.
        let h100 = 81559u64 << 20;
        assert_eq!(profile_name(1, 1, 9856, h100).as_deref(), Some("1g.10gb"));
        assert_eq!(profile_name(3, 3, 40192, h100).as_deref(), Some("3g.40gb"));
        assert_eq!(profile_name(7, 7, 80896, h100).as_deref(), Some("7g.80gb"));
        assert_eq!(
            profile_name(4, 1, 40192, h100).as_deref(),
            Some("1c.4g.40gb")
        );
        // A100 40GB: 4864 MiB of 40536 MiB is "1g.5gb".
        assert_eq!(
            profile_name(1, 1, 4864, 40536 << 20).as_deref(),
            Some("1g.5gb")
        );
        // H200 141GB: a seventh-ish slice is named 18gb.
        assert_eq!(
            profile_name(1, 1, 16384, 143771 << 20).as_deref(),
            Some("1g.18gb")
        );
        assert_eq!(profile_name(0, 0, 1, 1), None);
    }

    #[test]
    fn profile_from_mig_device_names() {
        let p = |n| profile_from_name(n);
        assert_eq!(p("NVIDIA H200 MIG 1g.18gb").as_deref(), Some("1g.18gb"));
        assert_eq!(
            p("NVIDIA A100-SXM4-40GB MIG 1c.2g.10gb").as_deref(),
            Some("1c.2g.10gb")
        );
        assert_eq!(
            p("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me").as_deref(),
            Some("1g.10gb+me")
        );
        assert_eq!(p("NVIDIA H200"), None);
        assert_eq!(p("NVIDIA H200 MIG Device"), None);
    }

    #[test]
    fn cuda_versions() {
        assert_eq!(cuda_version(13000), "13.0");
        assert_eq!(cuda_version(12040), "12.4");
    }

    #[test]
    fn one_line_reasons() {
        assert_eq!(one_line("a\n  b\tc"), "a b c");
    }

    #[test]
    fn merge_matches_by_bus_prefers_nvml_and_adds_unknown_gpus() {
        let mut inv = Inventory {
            gpus: vec![gpu("0000:18:00.0", 0)],
            driver_version: Some("580.159.04".into()),
            ..Default::default()
        };
        let mut a = ngpu("00000000:18:00.0");
        a.name = Some("NVIDIA H200 NVL".into());
        a.uuid = Some("GPU-aaaa".into());
        a.memory_bytes = Some(150 << 30);
        let mut b = ngpu("00000000:2A:00.0");
        b.minor = Some(1);
        b.uuid = Some("GPU-bbbb".into());
        let no_minor = ngpu("00000000:3a:00.0");
        let snap = NvmlSnapshot {
            driver_version: Some("999".into()),
            cuda_version: Some("13.0".into()),
            gpus: vec![a, b, no_minor],
        };
        merge(&mut inv, snap, &CapMinors::default());
        assert_eq!(inv.driver_version.as_deref(), Some("580.159.04"));
        assert_eq!(inv.cuda_version.as_deref(), Some("13.0"));
        assert_eq!(inv.gpus.len(), 2, "a GPU without a minor cannot be added");
        let g0 = &inv.gpus[0];
        assert_eq!(
            (g0.model.as_str(), g0.uuid.as_str()),
            ("NVIDIA H200 NVL", "GPU-aaaa")
        );
        assert_eq!(g0.memory_bytes, Some(150 << 30));
        assert_eq!(g0.mig_enabled, Some(false));
        let g1 = &inv.gpus[1];
        assert_eq!(
            (g1.pci_bus_id.as_str(), g1.minor, g1.uuid.as_str()),
            ("0000:2a:00.0", 1, "GPU-bbbb")
        );
    }

    #[test]
    fn merge_mig_devices_sorted_with_cap_minors() {
        let mut inv = Inventory {
            gpus: vec![gpu("0000:18:00.0", 0)],
            ..Default::default()
        };
        let mut caps = CapMinors::default();
        for (k, m) in [
            ((0, 1, None), 12),
            ((0, 1, Some(0)), 13),
            ((0, 2, None), 21),
            ((0, 2, Some(0)), 22),
        ] {
            caps.insert(k, m);
        }
        let mig = |gi, uuid: &str| NvmlMig {
            uuid: Some(uuid.into()),
            gpu_instance: gi,
            compute_instance: 0,
            memory_bytes: Some(18 << 30),
            profile: Some("1g.18gb".into()),
        };
        // procfs saw gi1, gi2 and gi3; NVML lists gi2 and gi1 only.
        inv.gpus[0].migs = (1..=3)
            .map(|gi| MigDevice {
                gpu_instance: gi,
                gi_access_minor: Some(30 + gi),
                ..Default::default()
            })
            .collect();
        let mut n = ngpu("0000:18:00.0");
        n.mig_enabled = Some(true);
        n.migs = Some(vec![mig(2, "MIG-b"), mig(1, "MIG-a")]);
        merge(
            &mut inv,
            NvmlSnapshot {
                gpus: vec![n],
                ..Default::default()
            },
            &caps,
        );
        let migs = &inv.gpus[0].migs;
        assert_eq!(migs.len(), 3);
        assert_eq!(
            (migs[2].index, migs[2].gpu_instance, migs[2].uuid.as_deref()),
            (2, 3, None),
            "an instance only procfs saw is kept"
        );
        assert_eq!(migs[2].gi_access_minor, Some(33));
        assert_eq!(
            (migs[0].index, migs[0].uuid.as_deref(), migs[0].gpu_instance),
            (0, Some("MIG-a"), 1)
        );
        assert_eq!(
            (migs[0].gi_access_minor, migs[0].ci_access_minor),
            (Some(12), Some(13))
        );
        assert_eq!(
            (
                migs[1].index,
                migs[1].gi_access_minor,
                migs[1].ci_access_minor
            ),
            (1, Some(21), Some(22))
        );
        assert_eq!(inv.gpus[0].mig_enabled, Some(true));
    }

    #[test]
    fn merge_keeps_procfs_migs_when_nvml_cannot_list_and_clears_when_off() {
        let procfs_mig = MigDevice {
            gpu_instance: 1,
            gi_access_minor: Some(12),
            ..Default::default()
        };
        let mut inv = Inventory {
            gpus: vec![gpu("0000:18:00.0", 0), gpu("0000:2a:00.0", 1)],
            ..Default::default()
        };
        inv.gpus[0].migs = vec![procfs_mig.clone()];
        inv.gpus[1].migs = vec![procfs_mig.clone()];
        let mut unlisted = ngpu("0000:18:00.0");
        unlisted.mig_enabled = Some(true);
        unlisted.migs = None;
        let off = ngpu("0000:2a:00.0");
        merge(
            &mut inv,
            NvmlSnapshot {
                gpus: vec![unlisted, off],
                ..Default::default()
            },
            &CapMinors::default(),
        );
        assert_eq!(inv.gpus[0].migs, vec![procfs_mig]);
        assert!(inv.gpus[1].migs.is_empty());
    }

    #[test]
    fn nvlink_direct_peers_and_switch_fabric() {
        let buses = [
            "0000:18:00.0",
            "0000:2a:00.0",
            "0000:3a:00.0",
            "0000:5d:00.0",
        ];
        let mut gpus: Vec<Gpu> = buses
            .iter()
            .enumerate()
            .map(|(i, b)| gpu(b, i as u32))
            .collect();
        let s = |b: &str| Some(b.to_string());
        let links = vec![
            // 0 and 1 bridged directly (link listed twice: two lanes).
            (buses[0].to_string(), vec![s(buses[1]), s(buses[1])]),
            // 1's query of its side failed; symmetry still makes them peers.
            (buses[1].to_string(), vec![]),
            // 2 and 3 hang off NVSwitches (not GPUs) or unknown ends.
            (buses[2].to_string(), vec![s("0000:05:00.0"), None]),
            (buses[3].to_string(), vec![s("0000:06:00.0")]),
        ];
        nvlink_peers(&mut gpus, &links);
        assert_eq!(gpus[0].nvlink_peers, vec![buses[1].to_string()]);
        assert_eq!(gpus[1].nvlink_peers, vec![buses[0].to_string()]);
        assert_eq!(gpus[2].nvlink_peers, vec![buses[3].to_string()]);
        assert_eq!(gpus[3].nvlink_peers, vec![buses[2].to_string()]);
    }
}
