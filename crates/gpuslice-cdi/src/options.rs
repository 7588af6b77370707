//! What a spec is generated with: the kind, the driver capabilities whose
//! files are mounted, the shared variants, where side files and hooks are.

use crate::{CdiError, Result};
use std::path::{Path, PathBuf};

pub const DEFAULT_VENDOR: &str = "gpuslice.dev";
pub const DEFAULT_CLASS: &str = "gpu";
/// Where `generate` writes when no `--output` is given.
pub const DEFAULT_OUTPUT: &str = "/etc/cdi/gpuslice.yaml";
/// The other directory runtimes read specs from.
pub const DYNAMIC_DIR: &str = "/var/run/cdi";

/// Driver capabilities, as in `NVIDIA_DRIVER_CAPABILITIES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Capability {
    Compute,
    Utility,
    Video,
    Graphics,
}

impl Capability {
    pub fn name(self) -> &'static str {
        match self {
            Capability::Compute => "compute",
            Capability::Utility => "utility",
            Capability::Video => "video",
            Capability::Graphics => "graphics",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.trim() {
            "compute" => Capability::Compute,
            "utility" => Capability::Utility,
            "video" => Capability::Video,
            "graphics" => Capability::Graphics,
            other => {
                return Err(CdiError::UnknownCapability {
                    name: other.to_string(),
                })
            }
        })
    }

    /// A comma list; `all` is every capability.
    pub fn parse_list(s: &str) -> Result<Vec<Self>> {
        let mut v: Vec<Self> = if s.trim() == "all" {
            vec![Self::Compute, Self::Utility, Self::Video, Self::Graphics]
        } else {
            s.split(',')
                .filter(|p| !p.trim().is_empty())
                .map(Self::parse)
                .collect::<Result<_>>()?
        };
        v.sort();
        v.dedup();
        Ok(v)
    }
}

pub(crate) fn caps_string(caps: &[Capability]) -> String {
    caps.iter().map(|c| c.name()).collect::<Vec<_>>().join(",")
}

/// The shared variants' counts (`2,4`): each from 2 to 100, sorted, once.
pub fn parse_shared(s: &str) -> Result<Vec<u32>> {
    let mut v: Vec<u32> = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (2..=100).contains(n))
                .ok_or_else(|| CdiError::SharedCount {
                    given: p.to_string(),
                })
        })
        .collect::<Result<_>>()?;
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// From a file name: `.json` is JSON, anything else YAML.
    pub fn for_path(p: &Path) -> Self {
        match p.extension().and_then(|e| e.to_str()) {
            Some("json") => Format::Json,
            _ => Format::Yaml,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub vendor: String,
    pub class: String,
    pub capabilities: Vec<Capability>,
    /// Shared variants to offer per GPU: `n` gives `<gpu>-shared-<n>`.
    pub shared: Vec<u32>,
    /// Host path of `libgpuslice.so`; without it no shared variants are made.
    pub shim: Option<PathBuf>,
    /// Host path of the `gpuslice` binary, run as the createContainer hook
    /// that lays the params overlay; without it the overlay is left out.
    pub hook: Option<PathBuf>,
    /// Directory of the spec: side files (params, ld.so.preload) live there.
    pub spec_dir: PathBuf,
    /// Write host paths relative to the host root (see the crate docs).
    pub strip_host_root: bool,
    /// Use NVML (memory sizes for shared variants, MIG UUIDs).
    pub use_nvml: bool,
    /// Host directory of the GPUs' boards (as seen here), made ready with
    /// `board::prepare_dir`: bound into capped slices so that they take
    /// turns on the GPU with the other slices (docs/compute-share.md).
    /// None: not bound.
    pub boards: Option<PathBuf>,
    /// Capped slices' ledger directories: `<dir>/<slice>` on the host,
    /// bound at the slice's directory, one ledger for every container of
    /// the slice (a DRA claim's: gpuslice-dra's `claimfs`). None: a tmpfs
    /// in each container, a ledger of its own.
    pub slice_dirs: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            vendor: DEFAULT_VENDOR.into(),
            class: DEFAULT_CLASS.into(),
            capabilities: vec![Capability::Compute, Capability::Utility],
            shared: vec![2, 4],
            shim: None,
            hook: None,
            spec_dir: PathBuf::from("/etc/cdi"),
            strip_host_root: false,
            use_nvml: true,
            boards: None,
            slice_dirs: None,
        }
    }
}

impl Options {
    /// The kind of the spec: `<vendor>/<class>`.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }

    /// Discovers the GPUs below `root` as these options say (NVML or not).
    pub(crate) fn discover(
        &self,
        root: &gpuslice_core::HostRoot,
    ) -> Result<gpuslice_core::Inventory> {
        let opts = gpuslice_core::discover::DiscoverOptions {
            use_nvml: self.use_nvml,
            ..Default::default()
        };
        Ok(gpuslice_core::discover::discover(root, &opts)?)
    }
}
