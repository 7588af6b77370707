//! Per-cgroup GPU memory partitions, as NVIDIA driver R615+ has them
//! (`nvmlDeviceSetMemoryLimits_v1` / `nvmlDeviceGetMemoryLimits_v1`, "MPS v3
//! memory partitioning"), switched on only when the fake host poses as an
//! R615+ driver (`kernel.json`'s `driver_version`; `FakeHost::builder()
//! .driver_version("615…")`). Older drivers have no such calls: the NVML
//! entry points answer `NVML_ERROR_FUNCTION_NOT_FOUND`.
//!
//! What the fake does, after NVIDIA's description:
//! - a limit is kept per GPU and cgroup directory (its full path, the
//!   `nameSpace`): `<root>/.fakegpu/memlimits/<minor>`, one line
//!   `soft hard path`; setting needs root; soft and hard both zero clears it;
//! - a process's allocations are charged to the cgroups it is in (each
//!   process says which in its usage file, `cg PATH` lines beside its
//!   byte counts, see `memory.rs`: the real kernel module knows): past a
//!   hard limit, `CUDA_ERROR_OUT_OF_MEMORY`;
//! - `cuMemGetInfo` inside such a cgroup reports the limit as the total;
//! - they do not apply to MIG instances.
//!
//! A process is in a limited cgroup when that directory's (or one below
//! it) `cgroup.procs` lists it: read through the host's cgroupfs, which a
//! slice sees read-only, with pids in the reader's namespace.

use std::fs;
use std::path::{Path, PathBuf};

use crate::host::Host;

/// One GPU's limit on one cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub soft: u64,
    pub hard: u64,
    pub path: String,
}

/// Whether the fake driver poses as one with memory partitions (R615+).
pub fn supported() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        Host::from_env().kernel().is_some_and(|k| {
            k.driver_version
                .split('.')
                .next()
                .and_then(|m| m.parse::<u32>().ok())
                .is_some_and(|m| m >= 615)
        })
    })
}

fn file(minor: u32) -> PathBuf {
    Host::from_env().path(&format!(".fakegpu/memlimits/{minor}"))
}

/// The limits set on GPU `minor`.
pub fn limits(minor: u32) -> Vec<Limit> {
    let text = fs::read_to_string(file(minor)).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            Some(Limit {
                soft: f.next()?.parse().ok()?,
                hard: f.next()?.parse().ok()?,
                path: f.next()?.to_string(),
            })
        })
        .collect()
}

/// Sets (or, with both zero, clears) the limit of `path` on GPU `minor`.
pub fn set(minor: u32, path: &str, soft: u64, hard: u64) -> std::io::Result<()> {
    let mut all: Vec<Limit> = limits(minor)
        .into_iter()
        .filter(|l| l.path != path)
        .collect();
    if soft != 0 || hard != 0 {
        all.push(Limit {
            soft,
            hard,
            path: path.to_string(),
        });
    }
    let f = file(minor);
    if let Some(dir) = f.parent() {
        fs::create_dir_all(dir)?;
    }
    let text: String = all
        .iter()
        .map(|l| format!("{} {} {}\n", l.soft, l.hard, l.path))
        .collect();
    let tmp = f.with_extension(format!("tmp{}", std::process::id()));
    fs::write(&tmp, text)?;
    fs::rename(tmp, f)
}

/// Whether this process is in the cgroup `path` or one below it.
fn member(path: &Path, depth: u32) -> bool {
    let me = std::process::id().to_string();
    if fs::read_to_string(path.join("cgroup.procs"))
        .is_ok_and(|t| t.lines().any(|l| l.trim() == me))
    {
        return true;
    }
    depth > 0
        && fs::read_dir(path)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && member(&e.path(), depth - 1))
}

/// The limited cgroups (on any GPU) this process is in.
pub fn own_cgroups(minors: impl Iterator<Item = u32>) -> Vec<String> {
    if !supported() {
        return Vec::new();
    }
    let mut out: Vec<String> = Vec::new();
    for minor in minors {
        for l in limits(minor) {
            if !out.contains(&l.path) && member(Path::new(&l.path), 3) {
                out.push(l.path);
            }
        }
    }
    out
}

/// The hard limit on GPU `minor` that binds this process (the smallest of
/// its cgroups'), with its cgroup.
pub fn binding(minor: u32, mine: &[String]) -> Option<Limit> {
    limits(minor)
        .into_iter()
        .filter(|l| l.hard > 0 && mine.contains(&l.path))
        .min_by_key(|l| l.hard)
}
