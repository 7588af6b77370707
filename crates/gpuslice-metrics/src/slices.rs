//! Per-slice series from the ledgers (`*.ledger` in the ledger directory),
//! read without locks.

use crate::sample::{self as m, Labels, Sample};
use gpuslice_core::Inventory;
use gpuslice_ledger::{Ledger, ProcessState};
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
    for path in gpuslice_ledger::list_dir(dir) {
        let ledger = match Ledger::open(&path) {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!("skipping ledger {}: {e}", path.display());
                continue;
            }
        };
        let snap = ledger.snapshot();
        let slice: Labels = vec![("slice", snap.slice_id.clone())];
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
