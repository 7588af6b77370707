//! GPU health from NVML XID events.
//!
//! A thread waits on an NVML event set with every whole GPU registered for
//! critical-XID events. An XID that is not an application XID marks the
//! GPU Unhealthy; once no such XID has come for `recoverAfterSeconds` and
//! the GPU answers NVML normally (memory info), it is Healthy again. Every
//! change is published on a watch channel, which ListAndWatch follows.
//! Without NVML (or without event support) every GPU stays Healthy and
//! the reason is logged and kept in [`Snapshot::watching`].
//!
//! A layer of its own under both the device plugin (gpuslice-k8s, which
//! reports it in ListAndWatch) and the DRA driver (gpuslice-dra: device
//! taints and the kubelet's health stream), as NVIDIA keeps its health
//! checks (`internal/rm/health.go`) apart from its plugin. It needs no
//! Kubernetes, but it is a long-running service (a thread, a watch
//! channel, a policy of which XIDs count), not a fact of the host, so it
//! is not a module of gpuslice-core, which the root launcher links.

#![forbid(unsafe_code)]

pub mod worker;

use gpuslice_core::Inventory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// XIDs caused by the application, not the GPU (NVIDIA's device plugin skips the same).
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// The watcher's settings (the device plugin's config file's `health`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    pub enabled: bool,
    /// A GPU is healthy again once it has had no critical XID this long
    /// and answers NVML.
    pub recover_after_seconds: u64,
    /// XIDs that leave the GPU healthy: [`APPLICATION_XIDS`] by default.
    pub ignored_xids: Vec<u64>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            enabled: true,
            recover_after_seconds: 60,
            ignored_xids: APPLICATION_XIDS.to_vec(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// GPU index -> why it is unhealthy.
    pub unhealthy: BTreeMap<u32, String>,
    /// XIDs seen that marked a GPU unhealthy.
    pub critical_events: u64,
    /// Application XIDs seen and ignored.
    pub ignored_events: u64,
    /// "events" when the watcher runs, else why it does not.
    pub watching: String,
}

/// The watcher's thread, stopped when dropped.
pub type Watcher = worker::Worker;

/// Starts the watcher for `inv`'s GPUs; `nvml_lib` is the library to load
/// (None: `libnvidia-ml.so.1`). Publishes on `tx`.
pub fn start(
    inv: &Inventory,
    cfg: &Config,
    nvml_lib: Option<PathBuf>,
    tx: watch::Sender<Snapshot>,
) -> Watcher {
    if !cfg.enabled {
        tx.send_modify(|s| s.watching = "disabled in the config".into());
        return Watcher::none();
    }
    let gpus: Vec<(u32, String)> = inv.gpus.iter().map(|g| (g.index, g.uuid.clone())).collect();
    let cfg = cfg.clone();
    Watcher::spawn("gpuslice-health", move |stop| {
        if let Err(why) = watch_loop(&gpus, &cfg, nvml_lib, &tx, stop) {
            tracing::warn!("health: no XID watching: {why}; every GPU stays Healthy");
            tx.send_modify(|s| s.watching = why);
        }
    })
    .unwrap_or_else(|e| {
        tracing::warn!("health: no XID watching: no thread: {e}; every GPU stays Healthy");
        Watcher::none()
    })
}

fn watch_loop(
    gpus: &[(u32, String)],
    cfg: &Config,
    nvml_lib: Option<PathBuf>,
    tx: &watch::Sender<Snapshot>,
    stop: &AtomicBool,
) -> Result<(), String> {
    let nvml =
        gpuslice_cuda_load::open_nvml(nvml_lib.as_deref()).map_err(|e| format!("NVML: {e}"))?;
    let uuids: Vec<String> = gpus.iter().map(|(_, uuid)| uuid.clone()).collect();
    let set = gpuslice_core::xid::watch_xid_events(&nvml, &uuids)?;
    tx.send_modify(|s| s.watching = "events".into());
    let recover = Duration::from_secs(cfg.recover_after_seconds);
    // GPU index -> time of its last critical XID.
    let mut last_bad: BTreeMap<u32, Instant> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        match set.wait(250) {
            Ok(ev) => {
                let xid = match ev.event_data {
                    Some(XidError::Value(x)) => Some(x),
                    _ => None,
                };
                let uuid = ev.device.uuid().unwrap_or_default();
                let Some((index, _)) = gpus.iter().find(|(_, u)| *u == uuid) else {
                    continue;
                };
                if xid.is_some_and(|x| cfg.ignored_xids.contains(&x)) {
                    tracing::info!("health: GPU {index}: application XID {xid:?} ignored");
                    tx.send_modify(|s| s.ignored_events += 1);
                    continue;
                }
                let why = match xid {
                    Some(x) => format!("XID {x}"),
                    None => "XID (unknown)".into(),
                };
                tracing::warn!("health: GPU {index} ({uuid}) unhealthy: {why}");
                last_bad.insert(*index, Instant::now());
                tx.send_modify(|s| {
                    s.unhealthy.insert(*index, why);
                    s.critical_events += 1;
                });
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::warn!("health: waiting for NVML events: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        // Recovery: quiet long enough and answering now.
        let due: Vec<u32> = last_bad
            .iter()
            .filter(|(_, t)| t.elapsed() >= recover)
            .map(|(i, _)| *i)
            .collect();
        for index in due {
            let uuid = &gpus.iter().find(|(i, _)| *i == index).expect("known").1;
            let answers = nvml
                .device_by_uuid(uuid.as_str())
                .and_then(|d| d.memory_info())
                .is_ok();
            if answers {
                tracing::info!("health: GPU {index} healthy again");
                last_bad.remove(&index);
                tx.send_modify(|s| {
                    s.unhealthy.remove(&index);
                });
            } else {
                last_bad.insert(index, Instant::now());
            }
        }
    }
    Ok(())
}
