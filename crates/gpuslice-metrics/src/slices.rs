//! Per-slice series from the ledgers (`<id>/usage` and `*.ledger` in the
//! ledger directory), read without locks, and per process of a slice
//! whether the shim holds it.

use crate::sample::{self as m, Labels, Sample};
use gpuslice_core::Inventory;
use gpuslice_cuda_load::partitions::Partitions;
use gpuslice_ledger::enforcement::ProcessTable;
use gpuslice_ledger::enforcer::{facts, read_kills, DriverProcess, Member, Reason, SliceFacts};
use gpuslice_ledger::{limits, Ledger, ProcessState, Snapshot};
use std::path::Path;

/// The `gpu` index a device UUID (GPU or MIG) belongs to, if known.
pub fn gpu_of(inv: &Inventory, uuid: &str) -> Option<u32> {
    inv.gpus
        .iter()
        .find(|g| g.uuid == uuid || g.migs.iter().any(|mig| mig.uuid.as_deref() == Some(uuid)))
        .map(|g| g.index)
}

/// Adds the series of every readable ledger in `dir`; returns how many.
/// With `nvml`, each slice's memory by the driver's accounting too
/// (`gpuslice_ledger::enforcer`), and a process holding more than its
/// ledger slot says is exported as not enforced.
pub fn collect(
    dir: &Path,
    inv: Option<&Inventory>,
    nvml: Option<&gpuslice_cuda_load::Nvml>,
    out: &mut Sample,
) -> usize {
    let mut n = 0;
    let mut named = std::collections::HashSet::new();
    let table = ProcessTable::scan();
    let partitions = std::cell::OnceCell::new();
    for path in gpuslice_ledger::list_dir(dir) {
        let mut ledger = match Ledger::open(&path) {
            Ok(l) => l,
            Err(e) => {
                // A corrupt ledger is said, never dropped silently: its
                // slice's use and enforcement are unknown.
                tracing::warn!(
                    "ledger {} does not read: {e}; its slice is not exported",
                    path.display()
                );
                let ledger = path.display().to_string().escape_default().to_string();
                out.push(m::LEDGER_UNREADABLE, &vec![("ledger", ledger)], 1.0);
                continue;
            }
        };
        // Caps and shares from the slice's root-written record, if any.
        let record = path
            .file_name()
            .is_some_and(|f| f == limits::USAGE_FILE)
            .then(|| path.with_file_name(limits::LIMITS_FILE));
        if let Some(Ok(l)) = record.as_deref().map(|r| limits::verify_and_read(r, false)) {
            let _ = ledger.pin(&l);
        }
        let snap = ledger.snapshot();
        // One slice, one set of series: a second ledger under the same
        // name (a local user's ledger file naming another slice, a slice's
        // directory reached twice) would make the scrape fail for all.
        if !named.insert(snap.slice_id.clone()) {
            tracing::warn!(
                "ledger {} names slice {:?} again: not exported",
                path.display(),
                snap.slice_id
            );
            continue;
        }
        let slice: Labels = vec![("slice", snap.slice_id.clone())];
        let member = Member::new(&snap.slice_id, record.as_deref());
        let uuids: Vec<String> = snap.devices.iter().map(|d| d.uuid.clone()).collect();
        let caps: Vec<(String, u64)> = snap
            .devices
            .iter()
            .filter_map(|d| Some((d.uuid.clone(), d.cap?)))
            .collect();
        let facts = nvml.and_then(|n| driver_facts(n, &member, &uuids, &caps, Some(&snap)));
        // Processes of the slice the GPU sees, and whether the shim holds
        // them (and accounts for what the driver says they hold): 0 flags
        // a GPU process that escaped it.
        let mut exported = Vec::new();
        for c in table.check(&snap.slice_id, &snap) {
            if c.gpu || c.attached {
                let accounted = facts.as_ref().is_none_or(|f| {
                    f.holders
                        .iter()
                        .filter(|h| h.pid == c.pid)
                        .all(|h| h.accounted())
                });
                push_process_enforced(
                    out,
                    &snap.slice_id,
                    c.pid,
                    &c.comm,
                    c.enforced() && accounted,
                );
                exported.push(c.pid);
            }
        }
        // Processes the driver lists that the checks above did not see.
        if let Some(f) = &facts {
            push_holders(out, f, &mut exported);
        }
        // The layers holding its memory: the shim (a cap), the driver (a
        // hard limit on the slice's cgroup, R615+).
        if snap.devices.iter().any(|d| d.cap.is_some()) {
            let l: Labels = vec![("slice", snap.slice_id.clone()), ("layer", "shim".into())];
            out.push(m::SLICE_MEMORY_LAYER, &l, 1.0);
        }
        if driver_partitioned(
            partitions.get_or_init(|| Partitions::open().ok()).as_ref(),
            &snap,
        ) {
            let l: Labels = vec![("slice", snap.slice_id.clone()), ("layer", "driver".into())];
            out.push(m::SLICE_MEMORY_LAYER, &l, 1.0);
        }
        // Root's enforcer's kills, recorded beside the slice's limits record.
        if let Some(dir) = record.as_deref().and_then(Path::parent) {
            push_kills(out, &snap.slice_id, dir);
        }
        let procs = snap
            .processes
            .iter()
            .filter(|p| p.state != ProcessState::Transient)
            .count();
        out.push(m::SLICE_PROCS, &slice, procs as f64);
        for d in &snap.devices {
            let gpu = inv
                .and_then(|inv| gpu_of(inv, &d.uuid))
                .map_or_else(String::new, |i| i.to_string());
            let l: Labels = vec![
                ("slice", snap.slice_id.clone()),
                ("gpu", gpu),
                ("uuid", d.uuid.clone()),
            ];
            if let Some(cap) = d.cap {
                out.push(m::SLICE_CAP, &l, cap as f64);
            }
            out.push(m::SLICE_USED, &l, d.used as f64);
            if let Some(f) = &facts {
                out.push(m::SLICE_DRIVER_USED, &l, f.driver_used(&d.uuid) as f64);
            }
            out.push(m::SLICE_PEAK, &l, d.peak as f64);
            out.push(m::SLICE_REFUSED, &l, d.refusals as f64);
            if let Some(c) = snap.compute.get(d.index) {
                if let Some(bp) = c.share_bp {
                    out.push(m::SLICE_COMPUTE_SHARE, &l, bp as f64 / 10_000.0);
                    out.push(m::SLICE_COMPUTE_BUSY, &l, c.busy_ns as f64 / 1e9);
                    out.push(m::SLICE_COMPUTE_THROTTLED, &l, c.throttled_ns as f64 / 1e9);
                }
            }
        }
        n += 1;
    }
    n
}

/// Whether the driver holds a hard limit on the slice's cgroup (`run`'s:
/// `gpuslice/<id>` below the cgroup v2 root).
fn driver_partitioned(p: Option<&Partitions>, snap: &Snapshot) -> bool {
    let Some(p) = p else { return false };
    let Some(dir) = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(|r| Path::new(r).join("gpuslice").join(&snap.slice_id))
        .find(|d| d.is_dir())
    else {
        return false;
    };
    snap.devices.iter().any(|d| {
        p.get(&d.uuid, &dir)
            .ok()
            .flatten()
            .is_some_and(|l| l.hard > 0)
    })
}

/// The processes of `member`'s slice on `uuids` by the driver's
/// accounting (with its `caps` and ledger `snap`); None when NVML does not
/// answer.
pub(crate) fn driver_facts(
    nvml: &gpuslice_cuda_load::Nvml,
    member: &Member,
    uuids: &[String],
    caps: &[(String, u64)],
    snap: Option<&Snapshot>,
) -> Option<SliceFacts> {
    let driver: Vec<DriverProcess> = gpuslice_cuda_load::running_processes(nvml, uuids)
        .map_err(|e| tracing::debug!("slice {}: {e}", member.slice))
        .ok()?
        .into_iter()
        .map(DriverProcess::from)
        .collect();
    Some(facts(member, caps, snap, &driver))
}

/// `gpuslice_slice_process_enforced` of each process the driver lists for
/// the slice that is not in `exported` yet (0: the shim does not account
/// for what it holds).
pub(crate) fn push_holders(out: &mut Sample, f: &SliceFacts, exported: &mut Vec<u32>) {
    for h in &f.holders {
        if exported.contains(&h.pid) {
            continue;
        }
        exported.push(h.pid);
        push_process_enforced(out, &f.slice, h.pid, &h.comm, h.accounted());
    }
}

/// `gpuslice_slice_process_enforced` of process `pid` (`comm`) of `slice`.
fn push_process_enforced(out: &mut Sample, slice: &str, pid: u32, comm: &str, enforced: bool) {
    let l: Labels = vec![
        ("slice", slice.to_string()),
        ("pid", pid.to_string()),
        ("comm", comm.to_string()),
    ];
    out.push(m::SLICE_PROC_ENFORCED, &l, f64::from(u8::from(enforced)));
}

/// `gpuslice_slice_enforcement_kills_total` of `slice`, from the kills
/// recorded in its records directory `dir`.
pub(crate) fn push_kills(out: &mut Sample, slice: &str, dir: &Path) {
    let kills = read_kills(dir);
    for reason in [Reason::OverCap, Reason::Unshimmed, Reason::CanEscape] {
        let l: Labels = vec![
            ("slice", slice.to_string()),
            ("reason", reason.as_str().to_string()),
        ];
        let n = kills.iter().filter(|k| k.reason == reason).count();
        out.push(m::SLICE_ENFORCEMENT_KILLS, &l, n as f64);
    }
    // A plugin's pods' processes that can escape any cap; one series per
    // reason (a restarted plugin records a process again: a duplicate
    // series would fail the whole scrape).
    let reasons: std::collections::BTreeSet<String> = gpuslice_ledger::enforcer::read_escapes(dir)
        .iter()
        .flat_map(|e| {
            e.routes
                .iter()
                .map(move |r| format!("pid {} ({}): {r}", e.pid, e.comm))
        })
        .collect();
    for reason in reasons {
        let l: Labels = vec![("slice", slice.to_string()), ("reason", reason)];
        out.push(m::SLICE_UNENFORCEABLE, &l, 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::Sample;
    use gpuslice_ledger::DeviceSpec;

    /// Anyone may write a ledger file into the ledger directory, naming
    /// any slice: two ledgers of one name give one set of series (a
    /// duplicate series would fail the whole scrape).
    #[test]
    fn a_second_ledger_of_the_same_slice_is_not_exported() {
        let dir = tempfile::tempdir().unwrap();
        let dev = [DeviceSpec {
            uuid: "GPU-1".into(),
            cap: 1 << 30,
        }];
        for file in ["a.ledger", "b.ledger"] {
            Ledger::create(&dir.path().join(file), "victim", &dev).unwrap();
        }
        let mut out = Sample::default();
        assert_eq!(collect(dir.path(), None, None, &mut out), 1);
        let caps = out
            .series
            .iter()
            .filter(|s| s.metric.name == m::SLICE_CAP.name)
            .count();
        assert_eq!(caps, 1);
    }

    /// A ledger of a ledger's size that does not read (a slice filled it
    /// with garbage) is reported, not dropped from the scrape silently.
    #[test]
    fn a_corrupt_ledger_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.ledger");
        Ledger::create(
            &good,
            "good",
            &[DeviceSpec {
                uuid: "GPU-1".into(),
                cap: 1 << 30,
            }],
        )
        .unwrap();
        let size = std::fs::metadata(&good).unwrap().len() as usize;
        std::fs::write(dir.path().join("bad.ledger"), vec![0x5a; size]).unwrap();
        let mut out = Sample::default();
        assert_eq!(collect(dir.path(), None, None, &mut out), 1);
        let text = out.render();
        assert!(
            text.contains(&format!(
                "gpuslice_ledger_unreadable{{ledger=\"{}\"}} 1",
                dir.path().join("bad.ledger").display()
            )),
            "{text}"
        );
    }
}
