//! Reading the fake driver's `FAKEGPU_TRACE` lines.

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What one `cuInit` did (one line written by the fake driver).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecord {
    pub pid: u32,
    /// The `FAKEGPU_ROOT` the driver read.
    pub root: String,
    pub modify_device_files: bool,
    /// Whether `nvidiactl` opened.
    pub ctl: bool,
    pub ctl_recreated: bool,
    /// Minors of the GPUs whose node opened (success or ENXIO).
    pub reachable: Vec<u32>,
    /// Minors of GPU nodes the driver re-created.
    pub recreated: Vec<u32>,
    /// Minors of `nvidia-caps` nodes the driver re-created.
    pub recreated_caps: Vec<u32>,
    /// UUIDs (GPU or MIG) of the devices CUDA exposes, in CUDA order.
    pub visible: Vec<String>,
    /// The simulated init cost slept: reachable GPUs × per-GPU ms.
    pub init_sleep_ms: u64,
    /// `cuInit`'s result.
    pub rc: i32,
}

/// All records of a trace file; an absent file is an empty trace.
pub fn read_trace(path: &Path) -> io::Result<Vec<TraceRecord>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)))
        .collect()
}
