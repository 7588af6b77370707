//! The GPUs themselves: persistence mode, MIG, PCIe links, NUMA placement,
//! NVLink, XID errors in the kernel log, ECC and remapped rows, and memory
//! held by processes that run outside every slice.
//!
//! The inventory (procfs, sysfs, NVML through discovery) answers what it
//! can; NVML is asked the rest, read only, and only when discovery could
//! use it. A check NVML cannot answer is skipped with the reason.

use crate::{isolation, list, Check, Context};
use gpuslice_core::select::canonical_bus_id;
use gpuslice_core::{Gpu, HostRoot, PcieLink};
use gpuslice_cuda_load::nvml_raw::{remapped_rows, RemappedRows};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

pub fn checks(ctx: &Context) -> Vec<Check> {
    vec![
        persistence(ctx),
        mig(ctx),
        pcie(ctx),
        numa(ctx),
        nvlink(ctx),
        xid(ctx),
        ecc(ctx),
        foreign_processes(ctx),
    ]
}

const NVLINK_MAX: u32 = 18;
const GIB: f64 = (1u64 << 30) as f64;

fn no_nvml(ctx: &Context, name: &str) -> Check {
    Check::skip(
        name,
        format!("needs NVML: {}", ctx.nvml_why),
        "run on the GPU host itself (host root /) with the driver's libnvidia-ml.so.1",
    )
}

/// NVML's GPUs with a label each (`GPU<index> (<bus id>)`).
fn devices(ctx: &Context) -> Option<Vec<(String, Device<'_>)>> {
    let nvml = ctx.nvml.as_ref()?;
    let n = nvml.device_count().ok()?;
    Some(
        (0..n)
            .filter_map(|i| nvml.device_by_index(i).ok())
            .map(|d| {
                let bus = d
                    .pci_info()
                    .ok()
                    .and_then(|p| canonical_bus_id(&p.bus_id))
                    .unwrap_or_else(|| "?".into());
                (ctx.label(&bus), d)
            })
            .collect(),
    )
}

/// The function or the query is not there on this GPU/driver.
fn unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound
    )
}

fn persistence(ctx: &Context) -> Check {
    const NAME: &str = "gpu.persistence";
    let Some(devs) = devices(ctx) else {
        return no_nvml(ctx, NAME);
    };
    let (mut on, mut off, mut errors) = (0, Vec::new(), Vec::new());
    for (label, d) in &devs {
        match d.is_in_persistent_mode() {
            Ok(true) => on += 1,
            Ok(false) => off.push(label.clone()),
            Err(e) if unsupported(&e) => {}
            Err(e) => errors.push(format!("{label}: {e}")),
        }
    }
    if !off.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "persistence mode off on {}: the driver tears the GPU down when its last \
                 client exits, so each CUDA start pays seconds of re-initialisation",
                list(&off, 4)
            ),
            "systemctl enable --now nvidia-persistenced (or nvidia-smi -pm 1)",
        );
    }
    if on == 0 {
        return Check::skip(
            NAME,
            format!(
                "persistence mode not reported{}",
                if errors.is_empty() {
                    String::new()
                } else {
                    format!(": {}", list(&errors, 2))
                }
            ),
            "",
        );
    }
    Check::pass(NAME, format!("persistence mode on for {on} GPU(s)"))
}

fn mig(ctx: &Context) -> Check {
    const NAME: &str = "gpu.mig";
    let gpus = ctx.gpus();
    if gpus.is_empty() {
        return Check::skip(NAME, "no GPUs", "");
    }
    let mut bad = Vec::new();
    let mut on = Vec::new();
    let mut off = 0;
    for g in gpus {
        let label = format!("GPU{}", g.index);
        match (g.mig_enabled, g.migs.len()) {
            (Some(true), 0) => bad.push(format!(
                "{label}: MIG on with no instances (CUDA sees no device there)"
            )),
            (Some(false), _) => off += 1,
            (_, 0) => {}
            (_, n) => {
                let mut profiles: BTreeMap<String, usize> = BTreeMap::new();
                for m in &g.migs {
                    *profiles
                        .entry(m.profile.clone().unwrap_or_else(|| "?".into()))
                        .or_default() += 1;
                }
                let p: Vec<String> = profiles.iter().map(|(p, k)| format!("{k}×{p}")).collect();
                on.push(format!("{label}: MIG on, {n} instance(s) {}", p.join(" ")));
            }
        }
    }
    for (label, d) in devices(ctx).unwrap_or_default() {
        if let Ok(m) = d.mig_mode() {
            if m.current != m.pending {
                bad.push(format!(
                    "{label}: MIG mode change pending ({} → {}) until the GPU is reset",
                    m.current, m.pending
                ));
            }
        }
    }
    if !bad.is_empty() {
        return Check::warn(
            NAME,
            list(&bad, 4),
            "create instances (nvidia-smi mig -cgi <profiles> -C) or turn MIG off \
             (nvidia-smi -mig 0); a pending mode change takes a GPU reset (nvidia-smi -r) \
             or a reboot",
        );
    }
    if on.is_empty() && off == 0 {
        return Check::skip(
            NAME,
            format!("MIG mode unknown without NVML ({})", ctx.nvml_why),
            "",
        );
    }
    let mut detail = on;
    if off > 0 {
        detail.push(format!("MIG off on {off} GPU(s)"));
    }
    Check::pass(NAME, detail.join("; "))
}

fn link_text(l: &PcieLink) -> String {
    format!(
        "Gen{} x{} of Gen{} x{}",
        PcieLink::generation(l.speed_gts),
        l.width,
        PcieLink::generation(l.max_speed_gts),
        l.max_width
    )
}

/// A narrower link than the slot and card allow is a fault (a bad seat,
/// riser or cable); a slower one alone is what GPUs do when idle (they
/// drop to Gen1 to save power), so it is noted, not flagged.
pub fn pcie_verdict(gpus: &[Gpu]) -> Check {
    const NAME: &str = "gpu.pcie";
    if gpus.is_empty() {
        return Check::skip(NAME, "no GPUs", "");
    }
    let mut narrow = Vec::new();
    let mut slow = Vec::new();
    let mut full = 0;
    for g in gpus {
        let Some(l) = &g.pcie else { continue };
        let label = format!("GPU{} ({})", g.index, g.pci_bus_id);
        if l.width < l.max_width {
            narrow.push(format!("{label} {}", link_text(l)));
        } else if l.degraded() {
            slow.push(format!("{label} {}", link_text(l)));
        } else {
            full += 1;
        }
    }
    if !narrow.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "degraded PCIe link: {} (host-device copies run at a fraction of the bandwidth)",
                list(&narrow, 4)
            ),
            "reseat the GPU or its riser/cable and check the slot's BIOS link settings; \
             confirm with lspci -vv (LnkSta vs LnkCap) or nvidia-smi -q -d PCIE",
        );
    }
    if full == 0 && slow.is_empty() {
        return Check::skip(NAME, "no PCIe link data in sysfs", "");
    }
    let mut detail = format!("{full} GPU(s) at full link width and speed");
    if !slow.is_empty() {
        detail.push_str(&format!(
            "; full width, lower speed (normal while idle, re-check under load): {}",
            list(&slow, 4)
        ));
    }
    Check::pass(NAME, detail)
}

fn pcie(ctx: &Context) -> Check {
    pcie_verdict(ctx.gpus())
}

fn numa_nodes(root: &HostRoot) -> usize {
    fs::read_dir(root.join("sys/devices/system/node"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_prefix("node"))
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                })
                .count()
        })
        .unwrap_or(0)
}

fn numa(ctx: &Context) -> Check {
    const NAME: &str = "gpu.numa";
    let gpus = ctx.gpus();
    if gpus.is_empty() {
        return Check::skip(NAME, "no GPUs", "");
    }
    if gpus
        .iter()
        .all(|g| g.numa_node.is_none() && g.local_cpus.is_none())
    {
        return Check::skip(NAME, "no NUMA data in sysfs", "");
    }
    let nodes = numa_nodes(&ctx.root);
    let mut unknown = Vec::new();
    let mut each = Vec::new();
    for g in gpus {
        let node = g.numa_node.filter(|n| *n >= 0);
        if node.is_none() && nodes > 1 {
            unknown.push(format!("GPU{}", g.index));
        }
        each.push(format!(
            "GPU{} node {} cpus {}",
            g.index,
            node.map_or("-".into(), |n| n.to_string()),
            g.local_cpus.as_deref().unwrap_or("-")
        ));
    }
    if !unknown.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "{nodes} NUMA nodes but no affinity for {}: jobs cannot be placed next to \
                 their GPU",
                list(&unknown, 4)
            ),
            "enable the ACPI SRAT/NUMA options in the BIOS; meanwhile pin jobs by hand \
             (numactl --cpunodebind)",
        );
    }
    Check::pass(
        NAME,
        format!("{} NUMA node(s); {}", nodes.max(1), list(&each, 4)),
    )
}

fn nvlink(ctx: &Context) -> Check {
    const NAME: &str = "gpu.nvlink";
    let Some(devs) = devices(ctx) else {
        return no_nvml(ctx, NAME);
    };
    // (label, active, supported but down)
    let mut per: Vec<(String, u32, u32)> = Vec::new();
    for (label, d) in &devs {
        let (mut up, mut down) = (0, 0);
        for link in 0..NVLINK_MAX {
            match d.link_wrapper_for(link).is_active() {
                Ok(true) => up += 1,
                Ok(false) => down += 1,
                Err(_) => {}
            }
        }
        per.push((label.clone(), up, down));
    }
    let with_links: Vec<&(String, u32, u32)> =
        per.iter().filter(|(_, up, down)| up + down > 0).collect();
    if with_links.is_empty() {
        return Check::pass(NAME, "no NVLink on these GPUs");
    }
    let max_up = per.iter().map(|p| p.1).max().unwrap_or(0);
    let summary: Vec<String> = per
        .iter()
        .map(|(l, up, _)| format!("{l} {up} active"))
        .collect();
    if per.len() > 1 && max_up == 0 {
        return Check::warn(
            NAME,
            format!(
                "{} GPUs have NVLinks but none is active: peer traffic goes over PCIe",
                per.len()
            ),
            "on NVSwitch systems (HGX) start nvidia-fabricmanager; else check \
             nvidia-smi nvlink -s and the bridges",
        );
    }
    let short: Vec<String> = per
        .iter()
        .filter(|(_, up, _)| *up < max_up)
        .map(|(l, up, _)| format!("{l} {up} of {max_up}"))
        .collect();
    if per.len() > 1 && !short.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "fewer active NVLinks than the other GPUs: {}",
                list(&short, 4)
            ),
            "nvidia-smi nvlink -s -i <gpu> shows the down links; reset the GPU, check the \
             bridge/baseboard, or call support",
        );
    }
    if per.len() == 1 && max_up == 0 {
        return Check::pass(
            NAME,
            "NVLinks present, none active (one GPU: nothing to link to)",
        );
    }
    Check::pass(NAME, list(&summary, 4))
}

/// One `NVRM: Xid` line of the kernel log.
#[derive(Debug, Clone, PartialEq)]
pub struct Xid {
    /// `0000:18:00` as the driver prints it (no function).
    pub pci: String,
    pub code: u32,
    /// Seconds since boot, from `/dev/kmsg` records.
    pub at_s: Option<f64>,
    pub message: String,
}

/// XIDs raised by applications (bad programs, not bad GPUs); the device
/// plugin ignores the same set (docs/architecture.md).
pub const APPLICATION_XIDS: [u32; 6] = [13, 31, 43, 45, 68, 109];
/// XIDs after which the GPU needs a reset or the node draining.
pub const CRITICAL_XIDS: [u32; 9] = [48, 61, 62, 64, 74, 79, 95, 119, 154];

/// XID lines of a kernel log, as `/dev/kmsg` records
/// (`pri,seq,usec,flags;message`) or plain `dmesg` lines.
pub fn parse_xids(log: &str) -> Vec<Xid> {
    log.lines()
        .filter(|l| !l.starts_with(' '))
        .filter_map(|line| {
            let (at_s, msg) = match line.split_once(';') {
                Some((head, msg)) if head.split(',').count() >= 3 => {
                    let usec = head.split(',').nth(2).and_then(|u| u.parse::<f64>().ok());
                    (usec.map(|u| u / 1e6), msg)
                }
                _ => (None, line),
            };
            let rest = &msg[msg.find("NVRM: Xid")? + "NVRM: Xid".len()..];
            let rest = rest.trim_start();
            let (pci, after) = match rest.strip_prefix("(PCI:") {
                Some(r) => {
                    let (pci, after) = r.split_once(')')?;
                    (pci.to_ascii_lowercase(), after)
                }
                None => (String::new(), rest),
            };
            let after = after.trim_start_matches([':', ' ']);
            let code: u32 = after
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()?;
            Some(Xid {
                pci,
                code,
                at_s,
                message: msg.trim().to_string(),
            })
        })
        .collect()
}

/// The kernel log from `path`: a `/dev/kmsg` char device read record by
/// record without blocking, or a plain file (tests).
pub fn read_kmsg(path: &Path) -> io::Result<String> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    // The ring holds a few MiB at most; the bound is against surprises.
    while out.len() < 64 << 20 {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if !out.ends_with(b"\n") {
                    out.push(b'\n');
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            // A record was overwritten while we read: go on with the next.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if out.is_empty() => return Err(e),
            Err(_) => break,
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

pub fn xid_verdict(xids: &[Xid], label: impl Fn(&str) -> String) -> Check {
    const NAME: &str = "gpu.xid";
    if xids.is_empty() {
        return Check::pass(NAME, "no NVRM Xid errors in the kernel log");
    }
    let mut by_code: BTreeMap<u32, (usize, BTreeSet<String>)> = BTreeMap::new();
    for x in xids {
        let e = by_code.entry(x.code).or_default();
        e.0 += 1;
        e.1.insert(label(&x.pci));
    }
    let codes: Vec<String> = by_code
        .iter()
        .map(|(c, (n, gpus))| {
            format!(
                "Xid {c} ×{n} on {}",
                gpus.iter().cloned().collect::<Vec<_>>().join("/")
            )
        })
        .collect();
    let last = xids.last().expect("not empty");
    let when = last
        .at_s
        .map(|s| format!(" at {s:.0} s after boot"))
        .unwrap_or_default();
    let detail = format!(
        "{}; last{when}: {}",
        list(&codes, 5),
        last.message.chars().take(160).collect::<String>()
    );
    let critical = xids.iter().any(|x| CRITICAL_XIDS.contains(&x.code));
    let hardware = xids.iter().any(|x| !APPLICATION_XIDS.contains(&x.code));
    if critical {
        Check::fail(
            NAME,
            detail,
            "drain the node and reset the GPU (nvidia-smi -r -i <gpu>) or reboot; \
             repeated Xid 48/79/95/119 mean a hardware or firmware fault: call support \
             (see NVIDIA's Xid catalogue)",
        )
    } else if hardware {
        Check::warn(
            NAME,
            detail,
            "look the codes up in NVIDIA's Xid catalogue; watch whether they recur",
        )
    } else {
        Check::pass(
            NAME,
            format!("only application Xids (bad programs, not bad GPUs): {detail}"),
        )
    }
}

fn xid(ctx: &Context) -> Check {
    const NAME: &str = "gpu.xid";
    let path = ctx.root.join("dev/kmsg");
    match read_kmsg(&path) {
        Ok(log) => {
            let xids = parse_xids(&log);
            xid_verdict(&xids, |pci| {
                ctx.gpus()
                    .iter()
                    .find(|g| !pci.is_empty() && g.pci_bus_id.starts_with(pci))
                    .map_or_else(|| pci.to_string(), |g| format!("GPU{}", g.index))
            })
        }
        Err(e) => Check::skip(
            NAME,
            format!("cannot read the kernel log {}: {e}", path.display()),
            if e.kind() == io::ErrorKind::NotFound {
                "mount the host's /dev below the host root to see Xid errors"
            } else {
                "run as root (or sysctl kernel.dmesg_restrict=0) to see Xid errors"
            },
        ),
    }
}

fn ecc(ctx: &Context) -> Check {
    const NAME: &str = "gpu.ecc";
    let Some(devs) = devices(ctx) else {
        return no_nvml(ctx, NAME);
    };
    let (mut fails, mut warns, mut info) = (Vec::new(), Vec::new(), Vec::new());
    let (mut answered, mut mode_known) = (0, 0);
    for (label, d) in &devs {
        match d.is_ecc_enabled() {
            Ok(m) => {
                answered += 1;
                mode_known += 1;
                if !m.currently_enabled {
                    warns.push(format!("{label}: ECC off"));
                } else if !m.pending_enabled {
                    warns.push(format!("{label}: ECC turns off at the next reset"));
                }
            }
            Err(e) if unsupported(&e) => {}
            Err(e) => warns.push(format!("{label}: ECC mode: {e}")),
        }
        if let Ok(n) = d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
            answered += 1;
            if n > 0 {
                warns.push(format!(
                    "{label}: {n} uncorrectable ECC error(s) since the driver loaded"
                ));
            }
        }
        match remapped_rows(d) {
            Ok(RemappedRows {
                correctable: corr,
                uncorrectable: unc,
                pending,
                failed,
            }) => {
                answered += 1;
                if failed {
                    fails.push(format!("{label}: row remapping failed"));
                } else if pending {
                    warns.push(format!("{label}: row remapping pending a GPU reset"));
                }
                if corr + unc > 0 {
                    info.push(format!("{label}: rows remapped {corr} corr / {unc} unc"));
                }
            }
            Err(e) if unsupported(&e) => {}
            Err(e) => warns.push(format!("{label}: remapped rows: {e}")),
        }
        match d.are_pages_pending_retired() {
            Ok(true) => {
                answered += 1;
                warns.push(format!("{label}: retired pages pending a GPU reset"));
            }
            Ok(false) => answered += 1,
            Err(_) => {}
        }
    }
    if !fails.is_empty() {
        return Check::fail(
            NAME,
            list(&[fails, warns].concat(), 4),
            "drain the node: a failed row remap means the GPU needs replacing (field \
             diagnostics: dcgmi diag -r 3; then RMA)",
        );
    }
    if !warns.is_empty() {
        return Check::warn(
            NAME,
            list(&[warns, info].concat(), 4),
            "when idle, reset the GPU (nvidia-smi -r -i <gpu>) or reboot to apply pending \
             remaps; turn ECC on with nvidia-smi -e 1 and a reset; recurring errors: call \
             support",
        );
    }
    if answered == 0 {
        return Check::skip(
            NAME,
            "ECC and remapping not reported by NVML on these GPUs",
            "",
        );
    }
    let mut detail = format!(
        "{}no uncorrectable errors, no pending remaps or retirements",
        if mode_known == devs.len() {
            "ECC on, "
        } else {
            "ECC mode not reported; "
        }
    );
    if !info.is_empty() {
        detail.push_str(&format!("; {}", list(&info, 4)));
    }
    Check::pass(NAME, detail)
}

/// Pids of every process in a slice cgroup (`<root>/gpuslice/**/cgroup.procs`).
pub fn slice_pids(slices_dir: &Path) -> BTreeSet<u32> {
    let mut pids = BTreeSet::new();
    let mut stack = vec![slices_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if dir != slices_dir || e.file_name() != "cgroup.procs" {
                    stack.push(e.path());
                }
            } else if dir != slices_dir && e.file_name() == "cgroup.procs" {
                let text = fs::read_to_string(e.path()).unwrap_or_default();
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        }
    }
    pids
}

fn foreign_processes(ctx: &Context) -> Check {
    const NAME: &str = "gpu.foreign-processes";
    let Some(devs) = devices(ctx) else {
        return no_nvml(ctx, NAME);
    };
    let mut procs: Vec<(String, u32, Option<u64>)> = Vec::new();
    let mut answered = false;
    for (label, d) in &devs {
        match d.running_compute_processes() {
            Ok(ps) => {
                answered = true;
                for p in ps {
                    let used = match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    };
                    procs.push((label.clone(), p.pid, used));
                }
            }
            Err(e) => tracing::debug!("{label}: running compute processes: {e}"),
        }
    }
    if !answered {
        return Check::skip(NAME, "NVML does not list compute processes here", "");
    }
    let slices = isolation::cgroup_driver(ctx.cgroup_root.as_deref())
        .map(|d| slice_pids(&d.slices_dir()))
        .unwrap_or_default();
    let outside: Vec<&(String, u32, Option<u64>)> = procs
        .iter()
        .filter(|(_, pid, _)| !slices.contains(pid))
        .collect();
    if outside.is_empty() {
        return Check::pass(
            NAME,
            match procs.len() {
                0 => "no compute processes on the GPUs".to_string(),
                n => format!("{n} compute process(es), all inside slices"),
            },
        );
    }
    let total: u64 = outside.iter().filter_map(|p| p.2).sum();
    let items: Vec<String> = outside
        .iter()
        .map(|(label, pid, used)| {
            let comm = fs::read_to_string(ctx.root.join(format!("proc/{pid}/comm")))
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "?".into());
            let used = used.map_or("?".into(), |b| format!("{:.1} GiB", b as f64 / GIB));
            format!("pid {pid} ({comm}) {used} on {label}")
        })
        .collect();
    Check::warn(
        NAME,
        format!(
            "{} process(es) outside any slice hold {:.1} GiB that slices' caps do not \
             account for: {}",
            outside.len(),
            total as f64 / GIB,
            list(&items, 4)
        ),
        "start GPU jobs with gpuslice run (or through the device plugin), or stop these \
         (nvidia-smi --query-compute-apps=pid,used_memory --format=csv)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    #[test]
    fn xid_lines_from_kmsg_and_dmesg() {
        let log = "\
6,1200,5000000,-;nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver\n\
4,1201,12345678,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n\
 SUBSYSTEM=pci\n\
[  99.1] NVRM: Xid (PCI:0000:28:00): 13, pid=4242, name=python3, Graphics SM Warp Exception\n\
4,1203,13000000,-;NVRM: Xid (PCI:0000:18:00): 94, pid=1, Contained: SM (0x1). RST: No, D-RST: No\n";
        let x = parse_xids(log);
        assert_eq!(x.len(), 3, "{x:?}");
        assert_eq!((x[0].pci.as_str(), x[0].code), ("0000:18:00", 79));
        assert_eq!(x[0].at_s, Some(12.345678));
        assert_eq!((x[1].code, x[1].at_s), (13, None));
        assert_eq!(x[2].code, 94);

        let label = |p: &str| format!("[{p}]");
        let c = xid_verdict(&x, label);
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.detail.contains("Xid 79 ×1 on [0000:18:00]"),
            "{}",
            c.detail
        );
        assert_eq!(xid_verdict(&x[1..], label).status, Status::Warn);
        assert_eq!(xid_verdict(&x[1..2], label).status, Status::Pass);
        assert_eq!(xid_verdict(&[], label).status, Status::Pass);
    }

    #[test]
    fn kmsg_from_a_plain_file_and_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("kmsg");
        fs::write(&p, "6,1,2,-;hello\n").unwrap();
        assert_eq!(read_kmsg(&p).unwrap(), "6,1,2,-;hello\n");
        assert!(read_kmsg(&tmp.path().join("none")).is_err());
    }

    fn gpu(i: u32, speed: f32, width: u32) -> Gpu {
        Gpu {
            index: i,
            pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + 16 * i),
            pcie: Some(PcieLink {
                speed_gts: speed,
                width,
                max_speed_gts: 32.0,
                max_width: 16,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pcie_width_is_a_fault_speed_alone_is_not() {
        assert_eq!(pcie_verdict(&[gpu(0, 32.0, 16)]).status, Status::Pass);
        let idle = pcie_verdict(&[gpu(0, 32.0, 16), gpu(1, 2.5, 16)]);
        assert_eq!(idle.status, Status::Pass);
        assert!(
            idle.detail
                .contains("GPU1 (0000:28:00.0) Gen1 x16 of Gen5 x16"),
            "{}",
            idle.detail
        );
        let bad = pcie_verdict(&[gpu(0, 32.0, 16), gpu(1, 16.0, 8)]);
        assert_eq!(bad.status, Status::Warn);
        assert!(bad.detail.contains("Gen4 x8 of Gen5 x16"), "{}", bad.detail);
        assert_eq!(pcie_verdict(&[Gpu::default()]).status, Status::Skip);
    }

    #[test]
    fn slice_pids_walks_the_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        fs::create_dir_all(d.join("1-a/sub")).unwrap();
        fs::create_dir_all(d.join("2-b")).unwrap();
        fs::write(d.join("cgroup.procs"), "1\n").unwrap();
        fs::write(d.join("1-a/cgroup.procs"), "10\n11\n").unwrap();
        fs::write(d.join("1-a/sub/cgroup.procs"), "12\n").unwrap();
        fs::write(d.join("2-b/cgroup.procs"), "").unwrap();
        assert_eq!(slice_pids(d).into_iter().collect::<Vec<_>>(), [10, 11, 12]);
    }
}
