//! Per-slice series from the ledgers (`<id>/usage` and `*.ledger` in the
//! ledger directory), read without locks, and per process of a slice
//! whether the shim holds it.

use crate::sample::{self as m, Labels, Sample};
use gpuslice_core::Inventory;
use gpuslice_ledger::enforcement::ProcessTable;
use gpuslice_ledger::{limits, Ledger, ProcessState};
use std::path::Path;

/// The `gpu` index a device UUID (GPU or MIG) belongs to, if known.
pub fn gpu_of(inv: &Inventory, uuid: &str) -> Option<u32> {
    inv.gpus
        .iter()
        .find(|g| g.uuid == uuid || g.migs.iter().any(|mig| mig.uuid.as_deref() == Some(uuid)))
        .map(|g| g.index)
}

/// Adds the series of every readable ledger in `dir`; returns how many.
pub fn collect(dir: &Path, inv: Option<&Inventory>, out: &mut Sample) -> usize {
    let mut n = 0;
    let mut named = std::collections::HashSet::new();
    let table = ProcessTable::scan();
    for path in gpuslice_ledger::list_dir(dir) {
        let mut ledger = match Ledger::open(&path) {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!("skipping ledger {}: {e}", path.display());
                continue;
            }
        };
        // Caps and shares from the slice's root-written record, if any.
        if path.file_name().is_some_and(|f| f == limits::USAGE_FILE) {
            let record = path.with_file_name(limits::LIMITS_FILE);
            if let Ok(l) = limits::verify_and_read(&record, false) {
                let _ = ledger.pin(&l);
            }
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
        // Processes of the slice the GPU sees, and whether the shim holds
        // them: 0 flags a GPU process that escaped it.
        for c in table.check(&snap.slice_id, &snap) {
            if c.gpu || c.attached {
                let l: Labels = vec![
                    ("slice", snap.slice_id.clone()),
                    ("pid", c.pid.to_string()),
                    ("comm", c.comm.clone()),
                ];
                out.push(
                    m::SLICE_PROC_ENFORCED,
                    &l,
                    f64::from(u8::from(c.enforced())),
                );
            }
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
        assert_eq!(collect(dir.path(), None, &mut out), 1);
        let caps = out
            .series
            .iter()
            .filter(|s| s.metric.name == m::SLICE_CAP.name)
            .count();
        assert_eq!(caps, 1);
    }
}
