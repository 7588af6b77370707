//! Root's enforcer in the plugins: the device plugin
//! and the DRA plugin watch the slices they made with the one enforcer
//! `gpuslice run` uses ([`gpuslice_ledger::enforcer::NodeWatch`]). A
//! thread, every [`TICK`], asks the plugin which capped slices it has
//! made (a replica's ledger directory, a prepared claim's slice), reads
//! NVML's running processes on their GPUs from the host, and brings each
//! slice back within its cap, or kills or flags a GPU process of it that
//! the shim does not hold, per the admin's policy.
//!
//! A pod's processes are known as the slice's by root's limits record of
//! the slice, which the plugin binds read-only at the slice's fixed place
//! in every container of it: seen in the process's root, or in the root
//! of a process of its cgroup (its container). A pod spec that covers the
//! preload file (a `hostPath` of `/dev/null` at `/etc/ld.so.preload`), or
//! a process that unshares a mount namespace and covers it there, runs
//! without the shim but not outside this view.

use gpuslice_ledger::enforcer::{DriverProcess, NodeWatch, Tick, Unshimmed, WatchedSlice, TICK};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// The enforcer's thread; stopped when dropped.
pub type Running = gpuslice_health::worker::Worker;

/// Starts the enforcer over the slices `slices` lists each tick (called on
/// the enforcer's thread), reading the driver through NVML (`nvml_lib`,
/// None: `libnvidia-ml.so.1`). Without NVML it says so once and stops:
/// the shim (and the driver's partitions) alone hold the slices.
pub fn spawn(
    policy: Unshimmed,
    nvml_lib: Option<PathBuf>,
    mut slices: impl FnMut() -> Vec<WatchedSlice> + Send + 'static,
) -> std::io::Result<Running> {
    Running::spawn("gpuslice-enforcer", move |stop| {
        let nvml = match gpuslice_cuda_load::open_nvml(nvml_lib.as_deref()) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(
                    "root's enforcer is off: NVML: {e}; only the shim holds the slices' limits"
                );
                return;
            }
        };
        let mut watch = NodeWatch::new(policy);
        while !stop.load(Ordering::Relaxed) {
            watch.set(slices());
            report(watch.tick(|uuids| driver_processes(&nvml, uuids)));
            std::thread::sleep(TICK);
        }
    })
}

/// Logs what one tick did (`gpuslice run`'s launcher logs its ticks so too).
pub fn report(t: Tick) {
    if let Some(e) = t.error {
        tracing::warn!("root's enforcer: {e}");
    }
    for a in t.actions {
        tracing::warn!(
            slice = a.slice,
            pid = a.pid,
            comm = a.comm,
            uuid = a.uuid,
            "{}",
            a.describe()
        );
    }
}

/// The driver's processes on `uuids`, by NVML (from the host: host pids).
pub fn driver_processes(
    nvml: &gpuslice_cuda_load::Nvml,
    uuids: &[String],
) -> Result<Vec<DriverProcess>, String> {
    Ok(gpuslice_cuda_load::running_processes(nvml, uuids)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(DriverProcess::from)
        .collect())
}
