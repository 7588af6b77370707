//! The slice's device cgroup (isolation layer 3), on cgroup v1 or v2.
//!
//! Every slice gets a fresh cgroup `<root>/gpuslice/<slice id>`, where root
//! is the `devices` hierarchy (v1) or the cgroup2 mount (v2). The policy is
//! applied before any process joins: v1 writes `devices.deny` rules, v2
//! attaches the BPF device filter from [`crate::bpf`]. The launcher opens
//! `cgroup.procs` ([`SliceCgroup::open_procs`]) before it forks, the child
//! moves itself in with [`enter_self`] before `exec`, and the launcher
//! removes the cgroup once the child has been reaped.
//!
//! Slice ids are `<launcher pid>-<unique suffix>` ([`new_slice_id`]), so that
//! [`reap_stale`] can remove, at the next start, the cgroups of a launcher
//! that was killed before it could remove its own.
//!
//! # What cgroup v1 cannot express
//!
//! A v1 device cgroup below the (allow-all) root holds a list of denied
//! devices, each one minor or all minors (`*`) of a major; it has no
//! "all minors of this major except these". So for a `deny_unlisted` rule
//! ([`gpuslice_core::MajorRule`]) v1 denies the minors the policy lists as
//! denied, and the whole major (`c MAJOR:* rwm`) only when no minor of it is
//! allowed, which is then exact. When some minors are allowed, the minors
//! the policy does not list (a node that did not exist at discovery) stay
//! reachable under v1; [`v1_inexact_majors`] names those majors. The
//! private `/dev` (layer 1) does not create such nodes and `--strict` drops
//! `CAP_MKNOD`, which covers most of that gap; the v2 filter has none.
//!
//! The v1 cgroup is created below the root of the `devices` hierarchy, not
//! below the launcher's own cgroup, so a child does not keep the device
//! restrictions of the cgroup the launcher runs in (moving a process to the
//! root's subtree takes root anyway). On v2 the filters of every ancestor
//! still apply (`BPF_F_ALLOW_MULTI`).

mod driver;
mod reap;
mod slice;
#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;
mod v1;
mod v2;

pub use driver::CgroupDriver;
pub use reap::{launcher_alive, reap_stale, reap_stale_with};
pub use slice::{enter_self, SliceCgroup};
pub use v1::{v1_deny_rules, v1_inexact_majors};

use gpuslice_ledger::limits::MAX_SLICE_ID_LEN;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Name of the directory below the cgroup root that holds every slice.
pub const SLICES_DIR: &str = "gpuslice";

/// Which cgroup version to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    V1,
    V2,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        })
    }
}

/// A cgroup version that is neither v1 nor v2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown cgroup version {0:?}: expected v1 or v2")]
pub struct UnknownVersion(pub String);

impl FromStr for Version {
    type Err = UnknownVersion;

    /// `v1`, `1`, `v2` or `2`.
    fn from_str(s: &str) -> Result<Self, UnknownVersion> {
        match s.trim().to_ascii_lowercase().as_str() {
            "v1" | "1" => Ok(Version::V1),
            "v2" | "2" => Ok(Version::V2),
            _ => Err(UnknownVersion(s.to_string())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "cannot read {path}: {source}; gpuslice needs /proc mounted to find the cgroup hierarchies"
    )]
    Mountinfo { path: PathBuf, source: io::Error },
    #[error("no {wanted} found in /proc/self/mountinfo ({found}); mount one, or choose the other cgroup version")]
    Unavailable { wanted: String, found: String },
    #[error("invalid slice id {id:?}: use `<launcher pid>-<suffix>`, 1 to {MAX_SLICE_ID_LEN} letters, digits, '-', '_' and '.', not starting with '.'")]
    InvalidSliceId { id: String },
    #[error("cannot create {path}: it already exists; each slice needs a unique slice id")]
    Exists { path: PathBuf },
    #[error("cannot create {path}: {source}; gpuslice run needs a writable cgroup (run as root, or delegate a cgroup)")]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot write `{rule}` to {path}: {source}; the v1 devices controller refused the rule (needs root with CAP_SYS_ADMIN)")]
    DeviceRule {
        path: PathBuf,
        rule: String,
        source: io::Error,
    },
    #[error("cannot load the device filter for {path}: {source}; cgroup v2 device control needs root (CAP_BPF and CAP_SYS_ADMIN) and a kernel with CONFIG_CGROUP_BPF")]
    BpfLoad { path: PathBuf, source: io::Error },
    #[error("cannot attach the device filter to {path}: {source}; needs root, and no ancestor cgroup may hold a device program attached without BPF_F_ALLOW_MULTI")]
    BpfAttach { path: PathBuf, source: io::Error },
    #[error("cannot move pid {pid} into {path}: {source}; needs root (write access to cgroup.procs of the common ancestor too)")]
    AddPid {
        path: PathBuf,
        pid: u32,
        source: io::Error,
    },
    #[error("cannot remove {path}: {source}; processes may still be in it (see its cgroup.procs), or remove it by hand with rmdir")]
    Remove { path: PathBuf, source: io::Error },
}

/// A slice id for this process: `<pid>-<suffix>` (read back by
/// `gpuslice_ledger::limits::launcher_pid`), unique within the process
/// and very likely across reuses of its pid.
pub fn new_slice_id() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mix = (t.as_secs() << 20) ^ u64::from(t.subsec_micros());
    format!(
        "{}-{:x}{:02x}",
        std::process::id(),
        mix & 0xff_ffff_ffff,
        n & 0xff
    )
}
