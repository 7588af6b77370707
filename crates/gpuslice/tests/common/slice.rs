//! Helpers of the tests that run `gpuslice` with the shim on the fake GPU
//! host (memory cap, compute share).

use std::path::Path;
use std::process::Command;
use std::sync::RwLockReadGuard;

use fakegpu::FakeHost;
use serde_json::Value;

use super::GPUSLICE;

/// A fake host of `gpus` GPUs and an empty directory for its slices'
/// ledgers.
pub fn host_and_ledgers(gpus: u32) -> (FakeHost, tempfile::TempDir) {
    let h = FakeHost::builder().gpus(gpus).build().unwrap();
    (h, tempfile::tempdir().unwrap())
}

/// A test's guard beside the others ([`super::beside_others`]), its fake
/// host and an empty directory for its slices' ledgers (bound in this
/// order, the guard is dropped last).
pub type SliceHost = (RwLockReadGuard<'static, ()>, FakeHost, tempfile::TempDir);

/// The [`SliceHost`] of a fake host of `gpus` GPUs.
pub fn slice_host(gpus: u32) -> SliceHost {
    let (beside, h) = super::host_beside_others(FakeHost::builder().gpus(gpus));
    (beside, h, tempfile::tempdir().unwrap())
}

/// The shim's test client, as a word of a command line.
pub fn client_arg() -> String {
    gpuslice_testkit::shim_client()
        .to_str()
        .expect("a UTF-8 path")
        .to_string()
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

/// [`gpuslice`] `run --gpus 0 --memory 1GiB -- ARGV`.
pub fn run_capped(h: &FakeHost, ledgers: &Path, argv: &[&str]) -> Command {
    let run = ["run", "--gpus", "0", "--memory", "1GiB", "--"];
    gpuslice(h, ledgers, &[&run[..], argv].concat())
}

/// The error of `gpuslice run --gpus 0 FLAGS -- true`, which must be
/// refused (exit 125) before the command starts.
pub fn run_refused(h: &FakeHost, ledgers: &Path, flags: &[&str]) -> String {
    let argv = [&["run", "--gpus", "0"][..], flags, &["--", "true"]].concat();
    let out = gpuslice(h, ledgers, &argv).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `gpuslice slices --json`, which must succeed.
pub fn slices_json(h: &FakeHost, ledgers: &Path) -> Value {
    let out = gpuslice(h, ledgers, &["slices", "--json"])
        .output()
        .unwrap();
    super::assert_success(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `gpuslice slices`, as text.
pub fn slices_text(h: &FakeHost, ledgers: &Path) -> String {
    let out = gpuslice(h, ledgers, &["slices"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
