//! Helpers of the tests that run `gpuslice` with the shim on the fake GPU
//! host (memory cap, compute share).

use std::path::Path;
use std::process::Command;

use fakegpu::FakeHost;
use serde_json::Value;

use super::GPUSLICE;

/// `gpuslice --host-root <fake> ARGS` with the fake driver's env, slice
/// ledgers in `ledgers` (the GPUs' boards in `ledgers/boards`), and none
/// of the caller's slice settings.
pub fn gpuslice(h: &FakeHost, ledgers: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(GPUSLICE);
    c.arg("--host-root")
        .arg(h.root())
        .args(args)
        .envs(h.env())
        .env("GPUSLICE_LEDGER_DIR", ledgers)
        .env("GPUSLICE_BOARD_DIR", ledgers.join("boards"))
        .env_remove("GPUSLICE_COMPUTE_MODE")
        .env_remove("GPUSLICE_MEMORY_LIMIT")
        .env_remove("GPUSLICE_COMPUTE_LIMIT")
        .env_remove("GPUSLICE_LEDGER")
        .env_remove("GPUSLICE_DRA_STATE_DIR");
    c
}

/// `gpuslice slices --json`, which must succeed.
pub fn slices_json(h: &FakeHost, ledgers: &Path) -> Value {
    let out = gpuslice(h, ledgers, &["slices", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `gpuslice slices`, as text.
pub fn slices_text(h: &FakeHost, ledgers: &Path) -> String {
    let out = gpuslice(h, ledgers, &["slices"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
