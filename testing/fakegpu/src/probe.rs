//! The `fakegpu-probe` helper: what a CUDA program sees, as JSON.
//!
//! `cuInit` state is per process, so every check of driver behaviour runs
//! the probe as a child with the host's environment.

use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::FakeHost;

/// The probe's stdout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeReport {
    pub pid: u32,
    /// `cuInit(0)`.
    pub init_rc: i32,
    /// Wall time of `cuInit`, informational only (tests assert on the trace).
    pub init_us: u64,
    /// `cuDeviceGetCount` (0 when init failed).
    pub count: i32,
    pub devices: Vec<ProbeDevice>,
    /// Whether `cuGetProcAddress_v2("cuMemAlloc", 13000)` gave `cuMemAlloc_v2`.
    pub proc_address_ok: Option<bool>,
    /// Present with `--alloc BYTES`: one allocation on device 0.
    pub alloc: Option<ProbeAlloc>,
    /// Present with `--nvml`.
    pub nvml: Option<ProbeNvml>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeDevice {
    pub ordinal: i32,
    pub name: String,
    /// `GPU-…`, or `MIG-…` for a MIG device (from `cuDeviceGetUuid`).
    pub uuid: String,
    /// `cuDeviceGetPCIBusId`, e.g. `0000:18:00.0`.
    pub pci_bus_id: String,
    pub total_mem: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeAlloc {
    pub bytes: u64,
    /// `cuMemAlloc_v2`.
    pub rc: i32,
    pub free_before: u64,
    pub free_after: u64,
    pub total: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeNvml {
    /// `nvmlInit_v2`.
    pub init_rc: u32,
    pub count: u32,
    pub uuids: Vec<String>,
}

/// The probe command for `host`: its env, and no inherited
/// `CUDA_VISIBLE_DEVICES` (set it on the command where a test needs it).
pub fn probe_command(host: &FakeHost) -> Command {
    let mut cmd = host.command(crate::probe_bin());
    cmd.env_remove("CUDA_VISIBLE_DEVICES");
    cmd
}

/// Runs a prepared probe command and parses its report; panics with the
/// probe's stderr when it does not produce one.
pub fn run_probe(cmd: &mut Command) -> ProbeReport {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("fakegpu: cannot run {:?}: {e}", cmd.get_program()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "fakegpu: probe gave no report ({e}); status {}, stdout {stdout:?}, stderr {:?}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Formats 16 UUID bytes as `PREFIX-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(prefix: &str, bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Whether `path` looks like a usable executable.
pub(crate) fn is_file(path: &Path) -> bool {
    path.metadata().map(|m| m.is_file()).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_formatting() {
        let b = [0xfa, 0x4e, 0, 2, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 2];
        assert_eq!(format_uuid("GPU", &b), crate::kernel::gpu_uuid(2));
    }
}
