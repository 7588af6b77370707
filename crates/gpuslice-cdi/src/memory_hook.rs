//! The driver's memory partitions for containers: the CDI
//! hooks of a capped slice's device, both their entries in a spec
//! ([`memory_limit_hooks`], the ONE place that says how a container's
//! partition is set) and what they do when the runtime runs them (`gpuslice cdi generate`'s shared
//! variants, a DRA claim's slices) that set the slice's hard limit on the
//! container's own cgroup v2 directory, for each capped GPU, through
//! [`gpuslice_cuda_load::partitions`] (NVIDIA R615+), and take it off
//! again.
//!
//! - `gpuslice cdi hook memory-limits set --limits RECORD` is a
//!   `createRuntime` hook: the runtime runs it as root in the runtime's
//!   namespaces once the container's cgroup exists and before its process
//!   runs anything of the image, with the container's state (its id and
//!   host pid) on stdin. It reads the caps from root's limits record of the
//!   slice (never from the container), finds the container's cgroup v2
//!   directory from `/proc/<pid>/cgroup`, sets the hard limit (soft 0: a
//!   cgroup removed before the limit comes off leaves no reservation on
//!   its ancestors under the kernel's dmem controller) and records what it
//!   set in root's directory [`STATE_DIR`] (by container id).
//! - `gpuslice cdi hook memory-limits clear` is a `poststop` hook: the
//!   container is gone (its cgroup too, usually); it zeroes the soft limit
//!   and clears the limit of each recorded GPU and forgets the record.
//!   Each run of either hook first clears the records of containers whose
//!   cgroup is gone without a `poststop` (a runtime that died).
//!
//! Where the driver has no partitions (older than R615, no NVML), the
//! container has no cgroup v2 directory of its own (cgroup v1), or the
//! device is a MIG device, the hook sets nothing and succeeds, saying why
//! on stderr (the runtime's log): the shim and root's enforcer hold the
//! slice. A driver that has partitions and refuses the limit fails the
//! container (fail closed).

use crate::edits;
use crate::generate::Builder;
use crate::oci_state::{reap_records, ContainerState};
use crate::{CdiError, Result};
use container_device_interface::specs::config::Hook;
use gpuslice_core::atomic_file::write_atomic;
use gpuslice_cuda_load::partitions::Partitions;
use std::path::{Path, PathBuf};

/// The hooks that give a capped slice's containers the driver's memory
/// partitions: set by a `createRuntime` hook from root's limits record
/// `record` (a host path), cleared by a `poststop` hook; `gpuslice` is the
/// host path of the binary the runtime runs, `host_root` a simulated
/// host's root (None: `/`). For `cdi generate`'s shared variants, DRA
/// claims and the device plugin's shared replicas.
pub fn memory_limit_hooks(gpuslice: &str, record: &str, host_root: Option<&Path>) -> Vec<Hook> {
    let hook = |stage, action: &[&str]| {
        edits::gpuslice_hook(gpuslice, stage, "memory-limits", action, host_root)
    };
    vec![
        hook("createRuntime", &["set", "--limits", record]),
        hook("poststop", &["clear"]),
    ]
}

impl Builder<'_> {
    /// [`memory_limit_hooks`] of a capped slice of the spec, from root's
    /// limits record `record`. None without the `gpuslice` binary to run.
    /// The hooks run on the host: a host root other than `/` that is not
    /// stripped (a simulated host) is named.
    pub(crate) fn memory_limit_hooks(&self, record: &Path) -> Option<Vec<Hook>> {
        let gpuslice = self.host(self.opts.hook.as_ref()?);
        let root = self.root.path();
        let host_root = (!self.opts.strip_host_root && root != Path::new("/")).then_some(root);
        Some(memory_limit_hooks(&gpuslice, &self.host(record), host_root))
    }
}

/// Below the host root: root's records of the limits set, one file per
/// container (its id), `<cgroup dir>` then one `<uuid>` a line.
pub const STATE_DIR: &str = "run/gpuslice/partitions";

/// What a hook did, for its log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// The limits set (or cleared) on the cgroup, by GPU.
    Applied { cgroup: PathBuf, uuids: Vec<String> },
    /// Nothing to do, and why.
    Skipped(String),
}

/// The cgroup v2 directory of process `pid` below the cgroup2 mount
/// `root`; None when it has none of its own (cgroup v1, or the root).
fn cgroup_dir(root: &Path, pid: u32) -> Result<Option<PathBuf>> {
    let file = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let text = std::fs::read_to_string(&file).map_err(|source| CdiError::Read {
        path: file.clone(),
        source,
    })?;
    let Some(path) = text.lines().find_map(|l| l.strip_prefix("0::")) else {
        return Ok(None);
    };
    let rel = path.trim_start_matches('/');
    if rel.is_empty() || rel.split('/').any(|c| c == "..") {
        return Ok(None);
    }
    let dir = root.join(rel);
    Ok(dir.join("cgroup.controllers").is_file().then_some(dir))
}

/// The `createRuntime` hook: the caps of root's limits record `record` as
/// hard limits on the container's cgroup; `host` is the host root
/// ([`STATE_DIR`] below it), `nvml` the NVML to load (None: the system's).
pub fn set(state_json: &str, record: &Path, host: &Path, nvml: Option<&Path>) -> Result<Done> {
    let ContainerState { id, pid, .. } = ContainerState::parse(state_json)?;
    let pid = pid.ok_or_else(|| CdiError::input("the container state", "no pid"))?;
    let state_dir = host.join(STATE_DIR);
    let limits = gpuslice_ledger::limits::verify_and_read(record, false)?;
    let caps = limits.partition_caps();
    if caps.is_empty() {
        return Ok(Done::Skipped(
            "no capped whole GPU (MIG devices have no partitions)".into(),
        ));
    }
    let v2 = match gpuslice_isolate::cgroup::CgroupDriver::detect(Some(
        gpuslice_isolate::cgroup::Version::V2,
    )) {
        Ok(d) => d.root().to_path_buf(),
        Err(e) => return Ok(Done::Skipped(format!("no cgroup v2: {e}"))),
    };
    let Some(dir) = cgroup_dir(&v2, pid)? else {
        return Ok(Done::Skipped(
            "the container has no cgroup v2 directory of its own (cgroup v1)".into(),
        ));
    };
    let partitions = match Partitions::open_lib(nvml) {
        Ok(p) => p,
        Err(e) => return Ok(Done::Skipped(e.to_string())),
    };
    reap(&partitions, &state_dir);
    let mut set: Vec<String> = Vec::new();
    for (uuid, cap) in &caps {
        if let Err(e) = partitions.set(uuid, &dir, 0, *cap) {
            if e.driver_lacks_partitions() {
                return Ok(Done::Skipped(e.to_string()));
            }
            for u in &set {
                let _ = partitions.clear(u, &dir);
            }
            return Err(CdiError::Partitions {
                what: format!("{uuid} on {}", dir.display()),
                source: e,
            });
        }
        set.push(uuid.clone());
    }
    record_set(&state_dir, &id, &dir, &set)?;
    Ok(Done::Applied {
        cgroup: dir,
        uuids: set,
    })
}

/// The `poststop` hook: clears what [`set`] set for this container.
pub fn clear(state_json: &str, host: &Path, nvml: Option<&Path>) -> Result<Done> {
    let id = ContainerState::parse(state_json)?.id;
    let state_dir = host.join(STATE_DIR);
    let file = state_dir.join(&id);
    if !file.exists() {
        return Ok(Done::Skipped("no limit was set for this container".into()));
    }
    let partitions = Partitions::open_lib(nvml).map_err(|source| CdiError::Partitions {
        what: "the driver's memory partitions".into(),
        source,
    })?;
    reap(&partitions, &state_dir);
    let (dir, uuids) = read_record(&file)?;
    clear_all(&partitions, &dir, &uuids)?;
    std::fs::remove_file(&file).map_err(CdiError::io(&file))?;
    Ok(Done::Applied { cgroup: dir, uuids })
}

fn clear_all(p: &Partitions, dir: &Path, uuids: &[String]) -> Result<()> {
    for uuid in uuids {
        p.clear(uuid, dir).map_err(|source| CdiError::Partitions {
            what: format!("{uuid} on {}", dir.display()),
            source,
        })?;
    }
    Ok(())
}

/// Writes root's record of what was set (0600 in a 0700 directory).
fn record_set(state_dir: &Path, id: &str, dir: &Path, uuids: &[String]) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .map_err(CdiError::io(state_dir))?;
    let mut text = format!("{}\n", dir.display());
    for u in uuids {
        text.push_str(u);
        text.push('\n');
    }
    write_atomic(&state_dir.join(id), text.as_bytes(), 0o600)?;
    Ok(())
}

fn read_record(file: &Path) -> Result<(PathBuf, Vec<String>)> {
    let text = std::fs::read_to_string(file).map_err(|source| CdiError::Read {
        path: file.to_path_buf(),
        source,
    })?;
    let mut lines = text.lines();
    let dir = PathBuf::from(
        lines
            .next()
            .ok_or_else(|| CdiError::input(file.display().to_string(), "empty"))?,
    );
    Ok((dir, lines.map(str::to_string).collect()))
}

/// Clears the limits of containers whose cgroup is gone without their
/// `poststop` hook having run, and forgets them.
fn reap(p: &Partitions, state_dir: &Path) {
    reap_records(
        state_dir,
        |file| read_record(file).ok(),
        |(dir, uuids)| !dir.exists() && clear_all(p, &dir, &uuids).is_ok(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_of_its_own_or_none() {
        let root = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let text = std::fs::read_to_string(format!("/proc/{me}/cgroup")).unwrap();
        let path = text.lines().find_map(|l| l.strip_prefix("0::"));
        let got = cgroup_dir(root.path(), me).unwrap();
        match path.map(|p| p.trim_start_matches('/')) {
            Some(rel) if !rel.is_empty() => {
                // Not a cgroup2 directory below this root: none.
                assert_eq!(got, None);
                let dir = root.path().join(rel);
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join("cgroup.controllers"), "").unwrap();
                assert_eq!(cgroup_dir(root.path(), me).unwrap(), Some(dir));
            }
            _ => assert_eq!(got, None, "the root cgroup is never the container's"),
        }
    }
}
