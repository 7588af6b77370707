//! Where `libgpuslice.so` (the shim, package `gpuslice-shim`) is found.
//!
//! Installed, it is `libgpuslice.so` next to the `gpuslice` binary: that
//! file name is a contract (the DaemonSet, the CDI specs and
//! `/etc/ld.so.preload` name it). Cargo names a cdylib after its library,
//! `gpuslice_shim`, so in a build tree (`target/debug/`) it is
//! `libgpuslice_shim.so`; the install steps (scripts/install.sh,
//! deploy/Containerfile, scripts/device-build.sh) give it its name.

use std::path::PathBuf;

/// The shim's installed file name.
pub const FILE: &str = "libgpuslice.so";
/// The same library as cargo writes it into `target/<profile>/`.
pub const BUILD_FILE: &str = "libgpuslice_shim.so";

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("GPUSLICE_SHIM={0} is not a file")]
    NotAFile(String),
    #[error("cannot find the gpuslice binary: {0}")]
    NoExe(std::io::Error),
    #[error("no {FILE} next to {0} (install it there, or set GPUSLICE_SHIM=path)")]
    Missing(String),
}

/// `$GPUSLICE_SHIM`, else `libgpuslice.so` (or, in a cargo build tree,
/// `libgpuslice_shim.so`) next to the running binary.
pub fn find() -> Result<PathBuf, ShimError> {
    if let Some(p) = std::env::var_os("GPUSLICE_SHIM").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(ShimError::NotAFile(p.display().to_string()))
        };
    }
    let exe = std::env::current_exe().map_err(ShimError::NoExe)?;
    [FILE, BUILD_FILE]
        .iter()
        .map(|f| exe.with_file_name(f))
        .find(|p| p.is_file())
        .ok_or_else(|| ShimError::Missing(exe.display().to_string()))
}
