//! The fake GPU host used by the tests (CI has no GPU) and by
//! `gpuslice-fakehost` (this crate's binary), the simulation a newcomer
//! tries first; `gpuslice-demo-client` is the CUDA program that tries it.
//!
//! [`FakeHost`] builds, under a root directory, what gpuslice reads and
//! masks on a real host: device nodes made with mknod (NVIDIA majors and
//! minors, so the real kernel's device cgroup applies to them),
//! `proc/driver/nvidia/*`, `proc/devices`, `sys/bus/pci/devices/*`,
//! `sys/class/drm/*`, and `.fakegpu/kernel.json`, the "kernel truth" the fake
//! driver (crate `fakegpu-driver`, built as `libfakegpu_driver.so`) reads in
//! place of the real driver's ioctls. See docs/architecture.md, "The fake GPU host".
//!
//! ```no_run
//! let host = fakegpu::FakeHost::builder().gpus(4).build().unwrap();
//! host.remove_node(2).unwrap();
//! let report = fakegpu::run_probe(&mut fakegpu::probe_command(&host));
//! assert_eq!(report.count, 4); // root + ModifyDeviceFiles: 1 re-creates it
//! ```
//!
//! The driver and the `fakegpu-probe` helper are found next to the running
//! executable (`target/<profile>/` or its `deps/`); build them first with
//! `cargo build -p fakegpu-driver -p fakegpu`.

mod host;
pub mod kernel;
mod probe;
mod trace;
pub mod tree;

use std::path::PathBuf;

pub use host::{inject_xid_below, FakeHost, FakeHostBuilder, MAX_GPUS};
pub use kernel::{Kernel, KernelGpu, KernelMig};
pub use probe::{
    format_uuid, probe_command, run_probe, ProbeAlloc, ProbeDevice, ProbeNvml, ProbeReport,
};
pub use trace::{read_trace, TraceRecord};

/// File name of the built fake driver.
pub const DRIVER_SO: &str = "libfakegpu_driver.so";
/// File name of the probe helper binary.
pub const PROBE_BIN: &str = "fakegpu-probe";
/// File name of the binary that builds a simulated host for a person.
pub const FAKEHOST_BIN: &str = "gpuslice-fakehost";

/// The built fake driver: `$FAKEGPU_DRIVER_LIB` if set, else
/// `libfakegpu_driver.so` in the target directory of the running executable.
/// Panics with how to build it when it is missing.
pub fn driver_so_path() -> PathBuf {
    find_artifact(
        "FAKEGPU_DRIVER_LIB",
        DRIVER_SO,
        "cargo build -p fakegpu-driver",
    )
}

/// The `fakegpu-probe` binary: `$FAKEGPU_PROBE_BIN` if set, else next to the
/// running executable. Panics with how to build it when it is missing.
pub fn probe_bin() -> PathBuf {
    find_artifact("FAKEGPU_PROBE_BIN", PROBE_BIN, "cargo build -p fakegpu")
}

/// The `gpuslice-fakehost` binary, next to the running executable.
/// Panics with how to build it when it is missing.
pub fn fakehost_bin() -> PathBuf {
    find_artifact(
        "FAKEGPU_FAKEHOST_BIN",
        FAKEHOST_BIN,
        "cargo build -p fakegpu",
    )
}

/// Directories where cargo puts artifacts of the running executable's
/// profile: the executable's own directory, and its parent when that is
/// `deps/` (test binaries run from `target/<profile>/deps/`).
pub fn artifact_dirs() -> Vec<PathBuf> {
    let Ok(exe) = std::env::current_exe() else {
        return Vec::new();
    };
    let Some(dir) = exe.parent() else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dirs.extend(dir.parent().map(PathBuf::from));
    }
    dirs.push(dir.to_path_buf());
    dirs
}

/// [`driver_so_path`], or why it is missing (with how to build it).
pub fn try_driver_so_path() -> Result<PathBuf, String> {
    try_find_artifact(
        "FAKEGPU_DRIVER_LIB",
        DRIVER_SO,
        "cargo build -p fakegpu-driver",
    )
}

fn find_artifact(env: &str, file: &str, build: &str) -> PathBuf {
    try_find_artifact(env, file, build).unwrap_or_else(|why| panic!("{why}"))
}

fn try_find_artifact(env: &str, file: &str, build: &str) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if probe::is_file(&path) {
            return Ok(path);
        }
        return Err(format!(
            "fakegpu: ${env}={} does not exist; build it with `{build}`",
            path.display()
        ));
    }
    let dirs = artifact_dirs();
    if let Some(found) = dirs
        .iter()
        .map(|d| d.join(file))
        .find(|p| probe::is_file(p))
    {
        return Ok(found);
    }
    Err(format!(
        "fakegpu: {file} not found in {dirs:?}: build it with `{build}` \
         (same profile as the tests), or set ${env}"
    ))
}
