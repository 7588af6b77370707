//! Root's enforcer in `gpuslice run` (`gpuslice_ledger::enforcer`, issue
//! 25): while a slice with limits runs, the launcher reads every
//! [`TICK`](gpuslice_ledger::enforcer::TICK) what the driver holds for each
//! process on the slice's GPUs (NVML's running compute processes, from the
//! host) and brings the slice back within its cap by killing; kills are
//! logged, recorded beside the slice's limits record (`gpuslice slices`
//! and the exporter show them) and counted.
//!
//! Where the driver has memory partitions (NVIDIA R615+,
//! `gpuslice_cuda_load::partitions`), the hard limit of each capped GPU
//! (not MIG) is set on the slice's cgroup v2 directory before any process
//! of the slice runs, and zeroed and cleared once they are all gone, before
//! the cgroup is removed; a dead launcher's are cleared by the next `run`
//! as it reaps the cgroup ([`RunHooks`]).

use gpuslice_cuda_load::Nvml;
use gpuslice_ledger::enforcer::{NodeWatch, Unshimmed, WatchedSlice};
use gpuslice_ledger::limits::{RecordPaths, SliceLimits};

/// On a simulated host with its driver installed (`gpuslice-fakehost
/// --driver`), the enforcer reads the simulated driver's accounting, as
/// the slice's programs use the simulated driver: its NVML, pointed at the
/// host. None elsewhere (the host's own NVML).
pub fn simulated_nvml(host_root: &std::path::Path) -> Option<std::path::PathBuf> {
    gpuslice_core::simulation::use_driver_nvml(host_root)
}

/// The launcher's side of the enforcer: its one slice, and the NVML it
/// reads the driver's accounting through.
pub struct RunWatch {
    nvml: Nvml,
    watch: NodeWatch,
}

/// The enforcer for a slice `run` made (root only), or None with a
/// warning when the driver's accounting cannot be read (no NVML) or the
/// policy turns it off.
pub fn watch(
    limits: &SliceLimits,
    records: &RecordPaths,
    nvml_lib: Option<std::path::PathBuf>,
) -> Option<RunWatch> {
    let caller = gpuslice_policy::Caller::detect().ok()?;
    let policy = enforcer_policy(&caller)?;
    let nvml = match gpuslice_cuda_load::open_nvml(nvml_lib.as_deref()) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(
                slice = limits.slice_id,
                "root's enforcer is off for this slice: NVML: {e}; only the shim holds its limits"
            );
            return None;
        }
    };
    let mut watch = NodeWatch::new(policy);
    // Known by its cgroup (named after it, which no process of it can
    // leave) and its ledger: no limits record to look for.
    watch.set(vec![WatchedSlice {
        limits: limits.clone(),
        record: None,
        usage: records.usage.clone(),
        records: records.dir.clone(),
        // The launcher confines the slice itself (no CAP_SYS_ADMIN, its
        // own PID namespace) unless asked not to (`--privileged`, which is
        // no boundary: docs/security.md).
        escapes: None,
    }]);
    Some(RunWatch { nvml, watch })
}

/// What the admin's policy file says root's enforcer does for `caller`'s
/// slices (a file that does not load: the defaults, with a warning); None
/// when it turns the enforcer off.
pub fn enforcer_policy(caller: &gpuslice_policy::Caller) -> Option<Unshimmed> {
    let (enforcer, why) = gpuslice_policy::Policy::enforcer_for(caller);
    if let Some(why) = why {
        tracing::warn!("{why}; root's enforcer kills unshimmed GPU processes (the default)");
    }
    if enforcer.is_none() {
        tracing::warn!(
            "root's enforcer is off (policy: root_enforcer = \"off\"): only the shim and the driver's partitions hold the slices' memory"
        );
    }
    enforcer
}

impl RunWatch {
    /// One tick: never blocks on anything but NVML's query.
    pub fn tick(&mut self) {
        let nvml = &self.nvml;
        use gpuslice_k8s::enforcer::{driver_processes, report};
        report(self.watch.tick(|uuids| driver_processes(nvml, uuids)));
    }
}

/// The driver's memory partitions of one slice.
struct DriverLimits {
    partitions: gpuslice_cuda_load::partitions::Partitions,
    /// (uuid, hard limit) of each capped whole GPU.
    caps: Vec<(String, u64)>,
    /// Every GPU of the host (a reaped cgroup's GPUs are not known).
    gpus: Vec<String>,
    set_on: Option<std::path::PathBuf>,
}

/// What `run` (as root) does at the launcher's hooks: the enforcer's ticks
/// and the driver's memory partitions.
pub struct RunHooks {
    watch: Option<RunWatch>,
    limits: Option<DriverLimits>,
}

impl RunHooks {
    pub fn new(
        limits: &SliceLimits,
        records: &RecordPaths,
        gpus: Vec<String>,
        nvml_lib: Option<std::path::PathBuf>,
    ) -> RunHooks {
        let caps = limits.partition_caps();
        let driver = match gpuslice_cuda_load::partitions::Partitions::open() {
            Ok(p) => Some(DriverLimits {
                partitions: p,
                caps,
                gpus,
                set_on: None,
            }),
            Err(e) => {
                tracing::debug!("no driver memory partitions: {e}");
                None
            }
        };
        RunHooks {
            watch: watch(limits, records, nvml_lib),
            limits: driver,
        }
    }
}

impl gpuslice_isolate::launcher::Hooks for RunHooks {
    fn tick_every(&self) -> Option<std::time::Duration> {
        self.watch.as_ref().map(|_| gpuslice_ledger::enforcer::TICK)
    }

    fn tick(&mut self) {
        if let Some(w) = self.watch.as_mut() {
            w.tick();
        }
    }

    fn cgroup_made(&mut self, dir: &std::path::Path) {
        let Some(l) = self.limits.as_mut() else {
            return;
        };
        if l.caps.is_empty() {
            return;
        }
        if !dir.join("cgroup.controllers").exists() {
            tracing::warn!(
                cgroup = %dir.display(),
                "the driver's memory partitions need cgroup v2: only the shim and root's enforcer hold this slice's memory"
            );
            return;
        }
        for (uuid, cap) in &l.caps {
            match l.partitions.set(uuid, dir, 0, *cap) {
                Ok(()) => {
                    tracing::info!(cgroup = %dir.display(), uuid, hard_limit = cap, "driver memory partition set");
                    l.set_on = Some(dir.to_path_buf());
                }
                Err(e) if e.driver_lacks_partitions() => {
                    tracing::debug!("{e}");
                    return;
                }
                Err(e) => tracing::warn!(uuid, "the driver's memory partition: {e}"),
            }
        }
    }

    fn cgroup_ending(&mut self, dir: &std::path::Path) {
        let Some(l) = self.limits.as_mut() else {
            return;
        };
        if l.set_on.as_deref() != Some(dir) {
            return;
        }
        for (uuid, _) in &l.caps {
            if let Err(e) = l.partitions.clear(uuid, dir) {
                tracing::warn!(uuid, "clearing the driver's memory partition: {e}");
            }
        }
    }

    fn reaping(&mut self, dir: &std::path::Path) {
        let Some(l) = self.limits.as_ref() else {
            return;
        };
        for uuid in &l.gpus {
            if let Err(e) = l.partitions.clear(uuid, dir) {
                tracing::debug!(uuid, "clearing a dead launcher's memory partition: {e}");
            }
        }
    }
}
