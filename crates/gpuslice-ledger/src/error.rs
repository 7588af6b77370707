//! What can go wrong with a ledger.

use crate::layout::{MAX_DEVICES, MAX_ID_LEN, MAX_SLOTS, VERSION, VERSION_1};
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ledger {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a gpuslice ledger (no GPUSLDGR magic)")]
    Foreign { path: PathBuf },
    #[error(
        "ledger {path} has layout version {found}; this gpuslice reads versions {VERSION_1} \
         and {VERSION} (the slice was set up by a different gpuslice release)"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("ledger {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("a ledger holds at most {MAX_DEVICES} devices, {0} given")]
    TooManyDevices(usize),
    #[error("invalid slice id {0:?} (1-{MAX_ID_LEN} of A-Z a-z 0-9 . _ -, not starting with .)")]
    BadSliceId(String),
    #[error("all {MAX_SLOTS} process slots of the ledger are in use")]
    SlotsExhausted,
    #[error("the ledger is mapped read-only")]
    ReadOnly,
    #[error("ledger layout version 1 has no compute section")]
    NoCompute,
    #[error("cannot read this process's /proc/self/stat")]
    NoProcStat,
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}
