//! `gpuslice doctor`: the checks people otherwise work through by hand when
//! a GPU host, a slice or its Kubernetes wiring misbehaves. Each check says
//! pass, warn, fail or skip, in one line, with a one-line fix.
//!
//! One module per family:
//! - [`driver`]: the kernel driver and the user-space libraries matching it;
//! - [`devices`]: `/dev/nvidia*` nodes, their modes, `ModifyDeviceFiles`;
//! - [`isolation`]: the cgroup hierarchy, whether a device filter can be
//!   enforced there (tried on a throwaway cgroup), user namespaces, the
//!   directory of the GPUs' compute boards;
//! - [`gpu`]: persistence, MIG, PCIe links, NUMA, NVLink, XID errors, ECC
//!   and remapped rows, memory held by processes outside any slice;
//! - [`k8s`]: the CDI spec, the device-plugin socket, a conflicting NVIDIA
//!   container toolkit;
//! - [`dra`]: the DRA kubelet plugin's registration and sockets, CDI in
//!   the container runtime, the kubelet's DRA feature gates, the claims
//!   prepared on the node;
//! - [`policy`]: the admin policy file for non-root callers and a sudo rule
//!   for gpuslice.
//!
//! Files are read below the [`HostRoot`]. The inventory comes from
//! [`gpuslice_core::discover`], and NVML is used only when discovery used
//! it (the host root is `/`, or a fake NVML serves it; see the discovery
//! docs). Two things are this kernel's whatever the host root says: the
//! cgroup hierarchy (from `/proc/self/mountinfo`, as `gpuslice run` finds
//! it, or [`Options::cgroup_root`]) and the processes NVML lists.
//!
//! Nothing here changes the host except the isolation probe, which makes a
//! cgroup below `<cgroup root>/gpuslice/` with a device filter and removes
//! it again (the parent `gpuslice/` directory is left, as `run` leaves it).

#![forbid(unsafe_code)]

pub mod devices;
pub mod dra;
pub mod driver;
pub mod gpu;
pub mod isolation;
pub mod k8s;
pub mod policy;
mod report;

pub use report::{render_table, Summary};

use gpuslice_core::discover::{discover, DiscoverError, DiscoverOptions};
use gpuslice_core::{HostRoot, Inventory};
use nvml_wrapper::Nvml;
use serde::Serialize;
use std::path::PathBuf;

/// Outcome of one check. Skips count as passes for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Skip,
    Warn,
    Fail,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Skip => "skip",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's verdict: what was found and what would fix it (empty when
/// there is nothing to do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    pub fix: String,
}

impl Check {
    pub fn new(
        name: &str,
        status: Status,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Check {
            name: name.to_string(),
            status,
            detail: one_line(&detail.into()),
            fix: one_line(&fix.into()),
        }
    }
    pub fn pass(name: &str, detail: impl Into<String>) -> Self {
        Self::new(name, Status::Pass, detail, "")
    }
    pub fn skip(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(name, Status::Skip, detail, fix)
    }
    pub fn warn(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(name, Status::Warn, detail, fix)
    }
    pub fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(name, Status::Fail, detail, fix)
    }
}

/// Asserts that `c` has `status` and that its detail says `says` (tests).
#[cfg(test)]
pub(crate) fn expect(c: &Check, status: Status, says: &str) {
    assert_eq!(c.status, status, "{c:?}");
    assert!(c.detail.contains(says), "{c:?}");
}

/// What to check and where.
#[derive(Debug, Clone)]
pub struct Options {
    pub host_root: HostRoot,
    /// Check this cgroup mount instead of the one `/proc/self/mountinfo`
    /// names (a cgroup2 mount or a v1 `devices` hierarchy).
    pub cgroup_root: Option<PathBuf>,
    /// Try NVML at all (default true; it is still used only where
    /// discovery may use it).
    pub use_nvml: bool,
    /// Where NVML is loaded from; None is `libnvidia-ml.so.1` through the
    /// loader's search path.
    pub nvml_lib: Option<PathBuf>,
    /// The DRA plugin's state directory (its checkpoint of prepared
    /// claims); None: the default below the host root.
    pub dra_state_dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            host_root: HostRoot::default(),
            cgroup_root: None,
            use_nvml: true,
            nvml_lib: None,
            dra_state_dir: None,
        }
    }
}

/// Everything the checks share: the inventory and, when usable, NVML.
pub struct Context {
    pub root: HostRoot,
    /// The discovered inventory, or why discovery failed.
    pub inv: Result<Inventory, DiscoverError>,
    pub nvml: Option<Nvml>,
    /// Why `nvml` is None.
    pub nvml_why: String,
    pub cgroup_root: Option<PathBuf>,
    pub dra_state_dir: PathBuf,
}

impl Context {
    /// Discovers the host and opens NVML when discovery used it.
    pub fn new(opts: &Options) -> Context {
        let disc = DiscoverOptions {
            use_nvml: opts.use_nvml,
            nvml_lib: opts.nvml_lib.clone(),
            pci_details: true,
        };
        let inv = discover(&opts.host_root, &disc);
        let (nvml, nvml_why) = match &inv {
            Err(_) => (None, "no NVIDIA driver (see driver.loaded)".into()),
            Ok(inv) if inv.sources.iter().any(|s| s == "nvml") => {
                match gpuslice_cuda_load::open_nvml(opts.nvml_lib.as_deref()) {
                    Ok(n) => (Some(n), String::new()),
                    Err(e) => (None, format!("NVML unavailable: {e}")),
                }
            }
            Ok(inv) => (
                None,
                inv.nvml_error
                    .clone()
                    .unwrap_or_else(|| "NVML not used".into()),
            ),
        };
        Context {
            root: opts.host_root.clone(),
            inv,
            nvml,
            nvml_why,
            cgroup_root: opts.cgroup_root.clone(),
            dra_state_dir: opts
                .dra_state_dir
                .clone()
                .unwrap_or_else(|| opts.host_root.join(gpuslice_dra::checkpoint::DEFAULT_DIR)),
        }
    }

    /// The discovered GPUs (none when discovery failed).
    pub fn gpus(&self) -> &[gpuslice_core::Gpu] {
        self.inv.as_ref().map(|i| i.gpus.as_slice()).unwrap_or(&[])
    }

    pub fn driver_version(&self) -> Option<&str> {
        self.inv.as_ref().ok()?.driver_version.as_deref()
    }

    /// `GPU<index> (<bus id>)` for the GPU with this bus id.
    pub fn label(&self, bus_id: &str) -> String {
        match self.gpus().iter().find(|g| g.pci_bus_id == bus_id) {
            Some(g) => format!("GPU{} ({})", g.index, g.pci_bus_id),
            None => bus_id.to_string(),
        }
    }
}

/// All checks and their summary.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub host_root: String,
    pub checks: Vec<Check>,
    pub summary: Summary,
}

impl Report {
    pub fn new(host_root: &HostRoot, checks: Vec<Check>) -> Report {
        let summary = Summary::of(&checks);
        Report {
            host_root: host_root.path().display().to_string(),
            checks,
            summary,
        }
    }

    /// 0 when everything passed (or was skipped), 1 with warnings, 2 with failures.
    pub fn exit_code(&self) -> i32 {
        self.summary.exit_code
    }
}

/// The checks of one module.
type Family = fn(&Context) -> Vec<Check>;

/// Runs every check.
pub fn run(opts: &Options) -> Report {
    let ctx = Context::new(opts);
    let families: [(&str, Family); 7] = [
        ("driver", driver::checks),
        ("devices", devices::checks),
        ("isolation", isolation::checks),
        ("gpu", gpu::checks),
        ("k8s", k8s::checks),
        ("dra", dra::checks),
        ("policy", policy::checks),
    ];
    let mut checks = Vec::new();
    for (family, f) in families {
        // A check that trips over something unexpected on a strange host
        // must not take the others with it.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&ctx))) {
            Ok(c) => checks.extend(c),
            Err(p) => {
                let why = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                checks.push(Check::fail(
                    family,
                    format!("the {family} checks crashed: {why}"),
                    "report this as a gpuslice bug, with `gpuslice doctor --json -vv` output",
                ));
            }
        }
    }
    Report::new(&opts.host_root, checks)
}

/// Newlines and runs of whitespace collapsed: every detail is one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `a, b, c` of at most `max` items, then `… (+N more)`.
pub(crate) fn list(items: &[String], max: usize) -> String {
    let mut s = items
        .iter()
        .take(max)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > max {
        s.push_str(&format!(" … (+{} more)", items.len() - max));
    }
    s
}

/// A dotted version such as `580.159.04` (digits and dots, at least one dot).
pub(crate) fn looks_like_version(t: &str) -> bool {
    t.contains('.')
        && t.starts_with(|c: char| c.is_ascii_digit())
        && t.ends_with(|c: char| c.is_ascii_digit())
        && t.chars().all(|c| c.is_ascii_digit() || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_one_line_and_lists_are_capped() {
        let c = Check::warn("x", "a\n  b\tc", "fix\nit");
        assert_eq!((c.detail.as_str(), c.fix.as_str()), ("a b c", "fix it"));
        let items: Vec<String> = (0..5).map(|i| i.to_string()).collect();
        assert_eq!(list(&items, 3), "0, 1, 2 … (+2 more)");
        assert_eq!(list(&items[..2], 3), "0, 1");
    }

    #[test]
    fn versions() {
        assert!(looks_like_version("580.159.04"));
        assert!(looks_like_version("575.57"));
        assert!(!looks_like_version("1"));
        assert!(!looks_like_version("580."));
        assert!(!looks_like_version("580.x"));
    }
}
