//! Issue 25: programs that reach the driver around the shim, on the fake
//! GPU host under `run --memory 1GiB`. The client is C
//! (`tests/escapes/driver_client.c`), compiled here with the system's C
//! compiler: an ordinary dynamically linked program, as a tenant would
//! write it.
//!
//! - the lookups the shim closes (`dlvsym` of glibc's `dlsym`, `dlmopen`
//!   of libcuda into a new namespace) are refused at the cap;
//!
//! Needs root (CI runs it as root), gcc and the workspace built.

use std::path::{Path, PathBuf};

use fakegpu::FakeHost;
use serde_json::Value;

mod common;
use common::slice::gpuslice;

const CHUNK: u64 = 256 << 20;
const CAP: u64 = 1 << 30;

/// `tests/escapes/driver_client.c`, compiled into `dir`.
fn driver_client(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/escapes/driver_client.c");
    let out = dir.join("driver_client");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = std::process::Command::new(&cc)
        .args(["-Wall", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e} (these tests need a C compiler)"));
    assert!(status.success(), "compiling {}", src.display());
    out
}

fn host() -> FakeHost {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these tests need root (CI)");
    FakeHost::builder().gpus(1).build().unwrap()
}

/// The client's JSON line, from `run --gpus 0 --memory 1GiB -- client HOW 40`.
fn run_client(
    h: &FakeHost,
    ledgers: &Path,
    client: &Path,
    how: &str,
) -> (Option<i32>, Value, String) {
    let out = gpuslice(
        h,
        ledgers,
        &[
            "run",
            "--gpus",
            "0",
            "--memory",
            "1GiB",
            "--",
            client.to_str().unwrap(),
            how,
            "40",
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = stdout
        .lines()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or_else(|| panic!("no JSON from the client: {stdout}\n{stderr}"));
    (out.status.code(), v, stderr)
}

/// `dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34")` gave glibc's own `dlsym`,
/// and through it libcuda's `cuMemAlloc_v2` unwrapped: 40 × 256 MiB under
/// a 1 GiB cap. The shim's `dlvsym` hands out its own `dlsym`.
#[test]
fn dlvsym_of_dlsym_is_refused_at_the_cap() {
    let h = host();
    let ledgers = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let client = driver_client(bin.path());
    // The same through dlsym(<libc's handle>, "dlsym").
    for how in ["dlvsym", "libc"] {
        let (code, v, stderr) = run_client(&h, ledgers.path(), &client, how);
        assert_eq!(code, Some(0), "{v} {stderr}");
        let allocated = v["allocated"].as_u64().unwrap();
        assert!(allocated * CHUNK <= CAP, "past the cap through {how}: {v}");
        assert_eq!(v["rc"], 2, "refused with CUDA_ERROR_OUT_OF_MEMORY: {v}");
    }
}

/// libcuda `dlmopen`ed into a new namespace (no shim there) allocated
/// 40 × 256 MiB under a 1 GiB cap; the shim's `dlmopen` refuses a new
/// namespace in a capped slice, with a `dlerror` saying so.
#[test]
fn dlmopen_of_libcuda_into_a_new_namespace_is_refused() {
    let h = host();
    let ledgers = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let client = driver_client(bin.path());
    let (code, v, stderr) = run_client(&h, ledgers.path(), &client, "dlmopen");
    assert_eq!(code, Some(3), "the load is refused: {v} {stderr}");
    assert!(
        v["refused"]
            .as_str()
            .unwrap()
            .contains("dlmopen into a new namespace is refused in a capped slice"),
        "{v}"
    );
    assert!(
        stderr.contains("into a new link-map namespace refused"),
        "{stderr}"
    );
}
