//! What can go wrong making, reading or writing a spec, or in a hook.

use std::path::PathBuf;

/// An error of this crate: one line saying what was wrong, the cause kept
/// as its source.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error(transparent)]
    Discover(#[from] gpuslice_core::discover::DiscoverError),
    #[error("no GPUs below {}: nothing to put in a CDI spec", root.display())]
    NoGpus { root: PathBuf },
    #[error("slice {slice}: no GPU {gpu} on this host")]
    NoSuchGpu { slice: String, gpu: u32 },
    #[error("slice {slice}: GPU {gpu} has no MIG device {mig}")]
    NoSuchMig { slice: String, gpu: u32, mig: u32 },
    #[error(
        "slice {slice}: capped, but libgpuslice.so was not found (put it next to gpuslice or set GPUSLICE_SHIM)"
    )]
    NoShim { slice: String },
    #[error("unknown capability {name:?} (compute, utility, video, graphics)")]
    UnknownCapability { name: String },
    #[error("shared count {given:?}: a number from 2 to 100")]
    SharedCount { given: String },
    #[error("building the CDI spec: {0}")]
    Build(#[source] serde_json::Error),
    #[error("generated CDI spec does not validate: {0}")]
    Invalid(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("not a CDI spec: {0}")]
    Parse(#[source] serde_yaml::Error),
    #[error("rendering the CDI spec: {0}")]
    Render(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] gpuslice_core::atomic_file::AtomicWriteError),
    /// A hook's input (the container state, the bundle's config) is not
    /// what the OCI runtime spec says it is.
    #[error("{what}: {why}")]
    HookInput { what: String, why: String },
    #[error("{what}: {source}")]
    Mount {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Limits(#[from] gpuslice_ledger::limits::LimitsError),
    #[error("the usage ledger {}: {source}", path.display())]
    Ledger {
        path: PathBuf,
        #[source]
        source: gpuslice_ledger::Error,
    },
    /// The share hook's slice directory is not the container's own tmpfs.
    #[error("{}: not the container's slice tmpfs ({why})", path.display())]
    NotSliceDir { path: PathBuf, why: String },
    /// The driver's memory partitions could not be opened, set or cleared.
    #[error("{what}: {source}")]
    Partitions {
        what: String,
        #[source]
        source: gpuslice_cuda_load::partitions::PartitionError,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = CdiError> = std::result::Result<T, E>;

impl CdiError {
    /// A hook's input error: `what` was being read, `why` it is wrong.
    pub(crate) fn input(what: impl Into<String>, why: impl std::fmt::Display) -> CdiError {
        CdiError::HookInput {
            what: what.into(),
            why: why.to_string(),
        }
    }

    /// An I/O error on `path`, for `map_err`.
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CdiError {
        let path = path.to_path_buf();
        move |source| CdiError::Io { path, source }
    }
}
