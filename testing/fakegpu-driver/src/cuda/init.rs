//! `cuInit`: which devices this process gets, decided like the real driver.
//!
//! 1. The kernel truth must exist (the module is "loaded").
//! 2. `dev/nvidiactl` must open; when missing it is re-created if the module
//!    allows modifying device files and we are root.
//! 3. Each GPU node `dev/nvidia<minor>` is opened in PCI order, with the same
//!    re-creation rule. Success or ENXIO means reachable (no kernel module
//!    backs the fake node); EPERM (device cgroup) or ENOENT means skipped.
//! 4. Each reachable GPU costs `init_ms_per_gpu`.
//! 5. A MIG-enabled GPU offers its MIG instances whose capability nodes open
//!    (re-created per their access file's `DeviceFileModify`), a plain GPU
//!    offers itself.
//! 6. `CUDA_VISIBLE_DEVICES` picks from those offers.

use std::io::Write;
use std::time::Duration;

use fakegpu_schema::TraceRecord;

use super::{CUresult, CUDA_ERROR_NO_DEVICE, CUDA_SUCCESS};
use crate::host::{self, Host, KernelGpu, KernelMig, Node, NVIDIACTL_MINOR, NVIDIA_MAJOR};
use crate::memory::MemKey;

/// Mode of `/dev/nvidia*` as created by the driver (`DeviceFileMode: 438`).
const NODE_MODE: u32 = 0o666;
/// Mode of MIG capability nodes (`DeviceFileMode: 292` in their access files).
const CAP_MODE: u32 = 0o444;
/// H200 SM count, and the SMs of its smallest MIG slice.
const GPU_SMS: i32 = 132;
const MIG_SMS: i32 = 16;

/// A device as CUDA enumerates it.
#[derive(Debug, Clone)]
pub struct Device {
    pub name: String,
    pub uuid: String,
    pub uuid_bytes: [u8; 16],
    pub pci: PciAddress,
    pub memory_bytes: u64,
    pub mem_key: MemKey,
    pub multiprocessors: i32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

impl PciAddress {
    /// Parses `0000:18:00.0` (any domain width, any case).
    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.trim().rsplitn(3, ':');
        let dev_fn = parts.next()?;
        let bus = parts.next()?;
        let domain = parts.next().unwrap_or("0");
        let (device, function) = dev_fn.split_once('.')?;
        Some(PciAddress {
            domain: u32::from_str_radix(domain, 16).ok()?,
            bus: u32::from_str_radix(bus, 16).ok()?,
            device: u32::from_str_radix(device, 16).ok()?,
            function: u32::from_str_radix(function, 16).ok()?,
        })
    }

    /// The form `cuDeviceGetPCIBusId` returns: `0000:18:00.0`, upper case.
    pub fn cuda_string(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// What `cuInit` decided, plus the record written to `FAKEGPU_TRACE`
/// (tests read it to see what the driver did).
pub struct InitOutcome {
    pub rc: CUresult,
    pub devices: Vec<Device>,
    pub trace: TraceRecord,
}

/// Runs the whole decision and sleeps the init cost.
pub fn discover(host: &Host, cvd: Option<&str>, init_ms_override: Option<u64>) -> InitOutcome {
    let mut trace = TraceRecord {
        pid: std::process::id(),
        root: host.root().display().to_string(),
        ..TraceRecord::default()
    };
    let rc_devices = discover_into(host, cvd, init_ms_override, &mut trace);
    let (rc, devices) = match rc_devices {
        Ok(devices) if !devices.is_empty() => (CUDA_SUCCESS, devices),
        Ok(_) => (CUDA_ERROR_NO_DEVICE, Vec::new()),
        Err(rc) => (rc, Vec::new()),
    };
    trace.visible = devices.iter().map(|d| d.uuid.clone()).collect();
    trace.rc = rc;
    InitOutcome { rc, devices, trace }
}

fn discover_into(
    host: &Host,
    cvd: Option<&str>,
    init_ms_override: Option<u64>,
    trace: &mut TraceRecord,
) -> Result<Vec<Device>, CUresult> {
    let kernel = host.kernel().ok_or(CUDA_ERROR_NO_DEVICE)?;
    trace.modify_device_files = host.modify_device_files();
    let root = host::is_root();
    let may_create = trace.modify_device_files && root;

    let ctl_path = host.path("dev/nvidiactl");
    let ctl = host::open_or_recreate(&frontend_node(&ctl_path, NVIDIACTL_MINOR), may_create);
    trace.ctl = ctl.reachable;
    trace.ctl_recreated = ctl.recreated;
    if !ctl.reachable {
        return Err(CUDA_ERROR_NO_DEVICE);
    }

    let reachable: Vec<&KernelGpu> = kernel
        .gpus
        .iter()
        .filter(|gpu| {
            let path = host.path(&format!("dev/nvidia{}", gpu.minor));
            let opened = host::open_or_recreate(&frontend_node(&path, gpu.minor), may_create);
            if opened.recreated {
                trace.recreated.push(gpu.minor);
            }
            if opened.reachable {
                trace.reachable.push(gpu.minor);
            }
            opened.reachable
        })
        .collect();

    let per_gpu = init_ms_override.unwrap_or(kernel.init_ms_per_gpu);
    trace.init_sleep_ms = per_gpu.saturating_mul(reachable.len() as u64);
    std::thread::sleep(Duration::from_millis(trace.init_sleep_ms));

    let offers = offers(host, &reachable, root, trace);
    Ok(select_visible(&offers, cvd)
        .into_iter()
        .map(|i| offers[i].device())
        .collect())
}

fn frontend_node(path: &std::path::Path, minor: u32) -> Node<'_> {
    Node {
        path,
        major: NVIDIA_MAJOR,
        minor,
        mode: NODE_MODE,
        read_only: false,
    }
}

/// A device CUDA could expose: a whole GPU or one MIG instance.
#[derive(Debug, Clone, Copy)]
pub struct Offer<'k> {
    pub gpu: &'k KernelGpu,
    pub mig: Option<&'k KernelMig>,
}

impl Offer<'_> {
    fn uuid(&self) -> &str {
        self.mig.map_or(&self.gpu.uuid, |m| &m.uuid)
    }

    fn device(&self) -> Device {
        let gpu = self.gpu;
        let (name, memory_bytes, gi, sms) = match self.mig {
            Some(m) => (gpu.mig_name(m), m.memory_bytes, Some(m.gi), MIG_SMS),
            None => (gpu.name.clone(), gpu.memory_bytes, None, GPU_SMS),
        };
        Device {
            name,
            uuid: self.uuid().to_string(),
            uuid_bytes: uuid_bytes(self.uuid()),
            pci: PciAddress::parse(&gpu.pci_bus_id).unwrap_or_default(),
            memory_bytes,
            mem_key: MemKey {
                gpu_minor: gpu.minor,
                gi,
            },
            multiprocessors: sms,
        }
    }
}

/// What each reachable GPU offers. A MIG instance needs both its GPU- and
/// compute-instance capability nodes; nvidia-modprobe re-creates those from
/// the access files when they say `DeviceFileModify: 1` and we are root.
fn offers<'k>(
    host: &Host,
    reachable: &[&'k KernelGpu],
    root: bool,
    trace: &mut TraceRecord,
) -> Vec<Offer<'k>> {
    let caps_major = host.caps_major();
    let mut out = Vec::new();
    for &gpu in reachable {
        if !gpu.mig_enabled {
            out.push(Offer { gpu, mig: None });
            continue;
        }
        for mig in &gpu.migs {
            let caps = [(mig.gi_minor, None), (mig.ci_minor, Some(mig.ci))];
            let all_open = caps.iter().all(|&(minor, ci)| {
                let path = host.path(&format!("dev/nvidia-caps/nvidia-cap{minor}"));
                let node = Node {
                    path: &path,
                    major: caps_major,
                    minor,
                    mode: CAP_MODE,
                    read_only: true,
                };
                let may_create = root && host.cap_modify(gpu.minor, mig.gi, ci);
                let opened = host::open_or_recreate(&node, may_create);
                if opened.recreated {
                    trace.recreated_caps.push(minor);
                }
                opened.reachable
            });
            if all_open {
                out.push(Offer {
                    gpu,
                    mig: Some(mig),
                });
            }
        }
    }
    out
}

/// Applies `CUDA_VISIBLE_DEVICES` to the offers, returning their indices in
/// the order listed. Unset: all. Items are indices into the offers, or a
/// unique (prefix of a) `GPU-`/`MIG-` UUID; like CUDA, the list ends at the
/// first item that is invalid, ambiguous or repeated.
pub fn select_visible(offers: &[Offer], cvd: Option<&str>) -> Vec<usize> {
    let Some(cvd) = cvd else {
        return (0..offers.len()).collect();
    };
    let mut picked = Vec::new();
    for item in cvd.split(',').map(str::trim) {
        match match_item(offers, item) {
            Some(i) if !picked.contains(&i) => picked.push(i),
            _ => break,
        }
    }
    picked
}

fn match_item(offers: &[Offer], item: &str) -> Option<usize> {
    if !item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()) {
        let index: usize = item.parse().ok()?;
        return (index < offers.len()).then_some(index);
    }
    let lower = item.to_ascii_lowercase();
    let is_uuid = (lower.starts_with("gpu-") || lower.starts_with("mig-")) && lower.len() > 4;
    if !is_uuid {
        return None;
    }
    let mut hits = offers
        .iter()
        .enumerate()
        .filter(|(_, o)| o.uuid().to_ascii_lowercase().starts_with(&lower));
    match (hits.next(), hits.next()) {
        (Some((i, _)), None) => Some(i),
        _ => None,
    }
}

/// The 16 bytes of a `GPU-`/`MIG-` UUID (what `CUuuid` holds); zeros when
/// the text is not a UUID.
pub fn uuid_bytes(uuid: &str) -> [u8; 16] {
    let hex: String = uuid
        .get(4..)
        .unwrap_or("")
        .chars()
        .filter(|c| *c != '-')
        .collect();
    let mut out = [0u8; 16];
    if hex.len() != 32 {
        return out;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        match hex
            .get(2 * i..2 * i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            Some(b) => *byte = b,
            None => return [0u8; 16],
        }
    }
    out
}

/// Appends the trace line to `FAKEGPU_TRACE` when set. Errors are ignored:
/// tracing must never change what the driver answers.
pub fn write_trace(trace: &TraceRecord) {
    let Some(path) = std::env::var_os("FAKEGPU_TRACE").filter(|p| !p.is_empty()) else {
        return;
    };
    let Ok(mut line) = serde_json::to_string(trace) else {
        return;
    };
    line.push('\n');
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        // One write of the whole line keeps lines from concurrent processes whole.
        let _ = file.write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(minor: u32, mig_enabled: bool) -> KernelGpu {
        KernelGpu {
            minor,
            uuid: format!("GPU-fa4e{minor:04x}-0000-4000-8000-{minor:012x}"),
            pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + 0x10 * minor),
            name: "NVIDIA H200".into(),
            memory_bytes: 100,
            numa_node: 0,
            nvlink_peers: vec![],
            mig_enabled,
            migs: vec![],
            persistence_mode: true,
        }
    }

    fn offers_of(gpus: &[KernelGpu]) -> Vec<Offer<'_>> {
        gpus.iter().map(|gpu| Offer { gpu, mig: None }).collect()
    }

    #[test]
    fn cvd_unset_empty_indices_and_uuids() {
        let gpus: Vec<_> = (0..4).map(|m| gpu(m, false)).collect();
        let offers = offers_of(&gpus);
        assert_eq!(select_visible(&offers, None), vec![0, 1, 2, 3]);
        assert!(select_visible(&offers, Some("")).is_empty());
        assert_eq!(select_visible(&offers, Some("2,0")), vec![2, 0]);
        assert_eq!(select_visible(&offers, Some(&gpus[3].uuid)), vec![3]);
        assert_eq!(select_visible(&offers, Some("GPU-fa4e0001")), vec![1]);
        assert_eq!(select_visible(&offers, Some("gpu-FA4E0001")), vec![1]);
    }

    #[test]
    fn cvd_stops_at_first_bad_item() {
        let gpus: Vec<_> = (0..4).map(|m| gpu(m, false)).collect();
        let offers = offers_of(&gpus);
        assert_eq!(select_visible(&offers, Some("1,7,2")), vec![1]);
        assert_eq!(select_visible(&offers, Some("1,-1,2")), vec![1]);
        assert_eq!(select_visible(&offers, Some("1,1,2")), vec![1]);
        // "GPU-fa4e" is a prefix of every UUID: ambiguous.
        assert!(select_visible(&offers, Some("GPU-fa4e,0")).is_empty());
        assert!(select_visible(&offers, Some("GPU-,0")).is_empty());
    }

    #[test]
    fn uuid_bytes_parse() {
        let b = uuid_bytes("GPU-fa4e0002-0000-4000-8000-000000000002");
        assert_eq!(&b[..4], &[0xfa, 0x4e, 0x00, 0x02]);
        assert_eq!(b[15], 2);
        assert_eq!(uuid_bytes("nonsense"), [0; 16]);
    }

    #[test]
    fn pci_address_forms() {
        let a = PciAddress::parse("0000:3b:00.0").unwrap();
        assert_eq!((a.domain, a.bus, a.device, a.function), (0, 0x3b, 0, 0));
        assert_eq!(PciAddress::parse("00000000:3B:00.0"), Some(a));
        assert_eq!(PciAddress::parse("3b:00.0"), Some(a));
        assert_eq!(a.cuda_string(), "0000:3B:00.0");
        assert_eq!(PciAddress::parse("zz"), None);
    }
}
