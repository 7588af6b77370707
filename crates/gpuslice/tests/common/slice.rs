//! Helpers of the tests that run `gpuslice` with the shim on the fake GPU
//! host (memory cap, compute share).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use fakegpu::FakeHost;
use serde_json::Value;

use super::GPUSLICE;

/// The shim's test client (gpuslice-testkit), built with the workspace.
pub fn client() -> PathBuf {
    gpuslice_testkit::shim_client()
}

/// The shim as built (its installed name, or the build tree's).
pub fn built_shim() -> PathBuf {
    fakegpu::artifact_dirs()
        .into_iter()
        .flat_map(|d| [d.join("libgpuslice.so"), d.join("libgpuslice_shim.so")])
        .find(|p| p.is_file())
        .expect("the shim built (cargo build -p gpuslice-shim)")
}

/// Spawns `c` (the client's `hold BYTES`) and returns once it holds its
/// allocation (its first line, `held 0`).
pub fn spawn_holding(c: &mut Command) -> Child {
    let mut child = c.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held 0");
    child
}

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
