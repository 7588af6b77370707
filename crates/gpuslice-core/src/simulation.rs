//! A simulated host root: the layout that marks a host root as a fake GPU
//! host (the tests', and `gpuslice-fakehost`'s) and says where its fake
//! CUDA driver is installed.
//!
//! gpuslice never builds such a host: the test doubles (crate `fakegpu`,
//! under `testing/`) write this layout with these constants, and the
//! product only reads it, so that `list`, `slices` and `top` can label
//! what they show a SIMULATION and `run` can point a slice's CUDA programs
//! at the fake driver as it would load the real one.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::discover::FAKEGPU_ROOT_ENV;

/// The fake host's own directory under the root.
pub const STATE_DIR: &str = ".fakegpu";
/// The fake host's "kernel truth" under the root: the file whose presence
/// marks the root as simulated.
pub const MARKER_FILE: &str = ".fakegpu/kernel.json";
/// Where an installed fake driver lives under the root, under the real
/// libraries' names (`libcuda.so.1`, `libnvidia-ml.so.1`).
pub const DRIVER_DIR: &str = ".fakegpu/lib";
/// The shared engine of a host with an installed driver, under the root:
/// one simulated GPU timeline for every process (`FAKEGPU_ENGINE`).
pub const ENGINE_FILE: &str = ".fakegpu/engine";
/// The variable naming a host's engine file to the fake driver.
pub const ENGINE_ENV: &str = "FAKEGPU_ENGINE";

/// The CUDA driver library an installed fake driver answers as.
const LIBCUDA: &str = gpuslice_cuda_abi::cuda::LIBCUDA;
/// The NVML library an installed fake driver answers as.
const LIBNVML: &str = gpuslice_cuda_abi::nvml::LIBNVIDIA_ML;

/// Whether `root` holds a simulated host (so that `gpuslice list` can say
/// it shows a simulation).
pub fn is_simulated(root: &Path) -> bool {
    root.join(MARKER_FILE).is_file()
}

/// The environment that points a CUDA program at the fake driver
/// installed in the simulated host at `root`: `FAKEGPU_ROOT`,
/// `LD_LIBRARY_PATH` (the driver's directory first, before `old_ld_path`)
/// and `FAKEGPU_ENGINE`. None unless `root` is simulated with its driver
/// *and* engine installed: a few `stat`s, so that `gpuslice run` can
/// afford them (a test's fake host has no engine file and passes its own
/// environment).
pub fn driver_env(
    root: &Path,
    old_ld_path: Option<&OsStr>,
) -> Option<Vec<(&'static str, OsString)>> {
    let lib = root.join(DRIVER_DIR);
    let engine = root.join(ENGINE_FILE);
    if !(is_simulated(root) && lib.join(LIBCUDA).exists() && engine.is_file()) {
        return None;
    }
    let mut ld = lib.into_os_string();
    if let Some(old) = old_ld_path.filter(|o| !o.is_empty()) {
        ld.push(":");
        ld.push(old);
    }
    Some(vec![
        (FAKEGPU_ROOT_ENV, root.as_os_str().to_owned()),
        ("LD_LIBRARY_PATH", ld),
        (ENGINE_ENV, engine.into_os_string()),
    ])
}

/// Points this process's NVML at the fake driver installed in the
/// simulated host at `root`, as a real host's NVML describes `/`: sets
/// `FAKEGPU_ROOT` and `FAKEGPU_ENGINE` here, and returns the fake
/// `libnvidia-ml.so.1` to load. None (nothing set) where [`driver_env`]
/// is None. Call it before this process starts any thread.
pub fn use_driver_nvml(root: &Path) -> Option<PathBuf> {
    let env = driver_env(root, None)?;
    for (k, v) in env.into_iter().filter(|(k, _)| *k != "LD_LIBRARY_PATH") {
        std::env::set_var(k, v);
    }
    Some(root.join(DRIVER_DIR).join(LIBNVML))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// The layout by hand, as the fake host writes it (crate fakegpu's
    /// own test checks that it does).
    fn layout(root: &Path, marker: bool, driver: bool, engine: bool) {
        fs::create_dir_all(root.join(STATE_DIR)).unwrap();
        if marker {
            fs::write(root.join(MARKER_FILE), "{}").unwrap();
        }
        if driver {
            fs::create_dir_all(root.join(DRIVER_DIR)).unwrap();
            fs::write(root.join(DRIVER_DIR).join(LIBCUDA), "a driver").unwrap();
        }
        if engine {
            fs::write(root.join(ENGINE_FILE), "").unwrap();
        }
    }

    #[test]
    fn only_the_marker_makes_a_root_simulated() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(!is_simulated(tmp.path()));
        layout(tmp.path(), false, true, true);
        assert!(!is_simulated(tmp.path()));
        assert!(driver_env(tmp.path(), None).is_none());
        layout(tmp.path(), true, false, false);
        assert!(is_simulated(tmp.path()));
        assert!(!is_simulated(&tmp.path().join(STATE_DIR)));
    }

    /// A simulated root without its driver, or without the engine, points
    /// programs nowhere; with both, at the driver first.
    #[test]
    fn the_driver_env_needs_the_driver_and_the_engine() {
        let old = OsStr::new("/opt/lib");
        for (driver, engine) in [(false, false), (true, false), (false, true)] {
            let tmp = tempfile::tempdir().unwrap();
            layout(tmp.path(), true, driver, engine);
            assert!(
                driver_env(tmp.path(), Some(old)).is_none(),
                "{driver} {engine}"
            );
            assert!(use_driver_nvml(tmp.path()).is_none(), "{driver} {engine}");
        }
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        layout(root, true, true, true);
        let env = driver_env(root, Some(old)).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get(FAKEGPU_ROOT_ENV), root.as_os_str());
        let lib = root.join(DRIVER_DIR);
        assert_eq!(
            get("LD_LIBRARY_PATH"),
            OsStr::new(&format!("{}:/opt/lib", lib.display()))
        );
        assert_eq!(get(ENGINE_ENV), root.join(ENGINE_FILE).as_os_str());
        // No old path: the driver's directory alone, no stray colon.
        let env = driver_env(root, Some(OsStr::new(""))).unwrap();
        assert!(env.contains(&("LD_LIBRARY_PATH", lib.into_os_string())));
    }
}
