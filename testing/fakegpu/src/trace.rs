//! Reading the fake driver's `FAKEGPU_TRACE` lines.

use std::io;
use std::path::Path;

pub use fakegpu_schema::TraceRecord;

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
