//! XID counters from NVML events, as the device plugin's health watcher
//! (gpuslice-health) reads them: a thread of its own, with its
//! own NVML handle, waits on an event set with every GPU registered for
//! critical-XID events and counts what arrives. The collector only copies
//! the counts (a short lock), so neither collection nor scrapes wait on
//! NVML events. Without event support the XID series are absent and
//! `gpuslice_exporter_xid_events_up` is 0.

use crate::gpu;
use crate::sample::{self as m, Labels, Sample};
use gpuslice_core::Inventory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long one wait on the event set lasts before the stop flag is checked.
const WAIT_MS: u32 = 250;

/// What the watcher has seen since it started.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    /// True while the event set is registered and waited on.
    pub up: bool,
    /// (GPU UUID, XID code or "unknown") -> events.
    pub total: BTreeMap<(String, String), u64>,
    /// GPU UUID -> the last XID code seen on it.
    pub last: BTreeMap<String, u64>,
}

impl Counts {
    /// Records one event on `uuid`.
    pub fn record(&mut self, uuid: &str, xid: Option<u64>) {
        let code = xid.map_or_else(|| "unknown".to_string(), |x| x.to_string());
        *self.total.entry((uuid.to_string(), code)).or_default() += 1;
        if let Some(x) = xid {
            self.last.insert(uuid.to_string(), x);
        }
    }

    /// The XID series of `inv`'s GPUs, and the watcher's up gauge.
    pub fn push(&self, inv: Option<&Inventory>, out: &mut Sample) {
        out.push(m::EXP_XID_UP, &Labels::new(), f64::from(u8::from(self.up)));
        let Some(inv) = inv else {
            return;
        };
        for g in &inv.gpus {
            let l = gpu::labels(g);
            for ((uuid, code), n) in &self.total {
                if *uuid == g.uuid {
                    let mut lx = l.clone();
                    lx.push(("xid", code.clone()));
                    out.push(m::GPU_XID_ERRORS, &lx, *n as f64);
                }
            }
            if let Some(x) = self.last.get(&g.uuid) {
                out.push(m::GPU_LAST_XID, &l, *x as f64);
            }
        }
    }
}

/// The running watcher; dropping it stops the thread (within `WAIT_MS`).
pub struct Watcher {
    counts: Arc<Mutex<Counts>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Watcher {
    /// Starts watching `uuids` through the NVML library at `nvml_lib`.
    pub fn start(nvml_lib: &str, uuids: Vec<String>) -> Watcher {
        let counts = Arc::new(Mutex::new(Counts::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, st, lib) = (counts.clone(), stop.clone(), nvml_lib.to_string());
        let spawned = std::thread::Builder::new()
            .name("xid-events".into())
            .spawn(move || {
                if let Err(why) = watch_loop(&lib, &uuids, &c, &st) {
                    tracing::warn!("no XID counters: {why}");
                }
                lock(&c).up = false;
            });
        if let Err(e) = spawned {
            tracing::warn!("no XID counters: cannot start a thread: {e}");
        }
        Watcher { counts, stop }
    }

    /// A copy of the counts so far.
    pub fn counts(&self) -> Counts {
        lock(&self.counts).clone()
    }
}

fn lock(c: &Mutex<Counts>) -> std::sync::MutexGuard<'_, Counts> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

fn watch_loop(
    lib: &str,
    uuids: &[String],
    counts: &Mutex<Counts>,
    stop: &AtomicBool,
) -> Result<(), String> {
    let nvml = gpuslice_cuda_load::open_nvml(Some(std::path::Path::new(lib)))
        .map_err(|e| format!("NVML: {e}"))?;
    let set = gpuslice_core::xid::watch_xid_events(&nvml, uuids)?;
    lock(counts).up = true;
    while !stop.load(Ordering::Relaxed) {
        match set.wait(WAIT_MS) {
            Ok(ev) => {
                let xid = match ev.event_data {
                    Some(XidError::Value(x)) => Some(x),
                    _ => None,
                };
                let Ok(uuid) = ev.device.uuid() else {
                    continue;
                };
                tracing::warn!("GPU {uuid}: XID {xid:?}");
                lock(counts).record(&uuid, xid);
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::warn!("waiting for NVML events: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_code_and_keeps_the_last() {
        let mut c = Counts {
            up: true,
            ..Default::default()
        };
        c.record("GPU-a", Some(79));
        c.record("GPU-a", Some(79));
        c.record("GPU-a", Some(48));
        c.record("GPU-b", None);
        assert_eq!(c.total[&("GPU-a".into(), "79".into())], 2);
        assert_eq!(c.total[&("GPU-a".into(), "48".into())], 1);
        assert_eq!(c.total[&("GPU-b".into(), "unknown".into())], 1);
        assert_eq!(c.last.get("GPU-a"), Some(&48));
        assert_eq!(c.last.get("GPU-b"), None);
    }

    #[test]
    fn series_per_gpu_and_absent_without_events() {
        let gpu = |i: u32| gpuslice_core::Gpu {
            index: i,
            uuid: format!("GPU-{i}"),
            ..Default::default()
        };
        let inv = Inventory {
            gpus: vec![gpu(0), gpu(1)],
            ..Default::default()
        };
        let mut c = Counts {
            up: true,
            ..Default::default()
        };
        c.record("GPU-1", Some(79));
        let mut s = Sample::default();
        c.push(Some(&inv), &mut s);
        assert_eq!(s.value(m::EXP_XID_UP, &[]), Some(1.0));
        let g1 = [("gpu", "1"), ("xid", "79")];
        assert_eq!(s.value(m::GPU_XID_ERRORS, &g1), Some(1.0));
        assert_eq!(s.value(m::GPU_LAST_XID, &[("gpu", "1")]), Some(79.0));
        assert_eq!(s.value(m::GPU_LAST_XID, &[("gpu", "0")]), None);
        let text = s.render();
        assert!(text.contains("gpuslice_gpu_xid_errors_total{gpu=\"1\",uuid=\"GPU-1\""));

        // Unsupported (or not yet watching): only the up gauge, at 0.
        let mut s = Sample::default();
        Counts::default().push(Some(&inv), &mut s);
        assert_eq!(s.series.len(), 1);
        assert_eq!(s.value(m::EXP_XID_UP, &[]), Some(0.0));
    }
}
