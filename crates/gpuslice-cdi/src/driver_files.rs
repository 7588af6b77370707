//! The driver's user-space files a container gets, by capability:
//! libraries (found by the driver's version, symlinks resolved inside the
//! host root) and tools.

use crate::options::Capability;
use gpuslice_core::HostRoot;
use std::fs;
use std::path::{Path, PathBuf};

/// Libraries by capability: (file name stem before `.so`, container names
/// besides the versioned file name: the soname and, for the two that
/// programs dlopen unversioned, the `.so` name).
pub(crate) const LIBS: &[(Capability, &str, &[&str])] = &[
    (
        Capability::Compute,
        "libcuda",
        &["libcuda.so.1", "libcuda.so"],
    ),
    (
        Capability::Compute,
        "libcudadebugger",
        &["libcudadebugger.so.1"],
    ),
    (
        Capability::Compute,
        "libnvidia-ptxjitcompiler",
        &["libnvidia-ptxjitcompiler.so.1"],
    ),
    (
        Capability::Compute,
        "libnvidia-nvvm",
        &["libnvidia-nvvm.so.4", "libnvidia-nvvm.so"],
    ),
    (Capability::Compute, "libnvidia-gpucomp", &[]),
    (
        Capability::Compute,
        "libnvidia-opencl",
        &["libnvidia-opencl.so.1"],
    ),
    (
        Capability::Compute,
        "libnvidia-allocator",
        &["libnvidia-allocator.so.1"],
    ),
    (
        Capability::Utility,
        "libnvidia-ml",
        &["libnvidia-ml.so.1", "libnvidia-ml.so"],
    ),
    (
        Capability::Utility,
        "libnvidia-cfg",
        &["libnvidia-cfg.so.1"],
    ),
    (Capability::Video, "libnvcuvid", &["libnvcuvid.so.1"]),
    (
        Capability::Video,
        "libnvidia-encode",
        &["libnvidia-encode.so.1"],
    ),
    (
        Capability::Video,
        "libnvidia-opticalflow",
        &["libnvidia-opticalflow.so.1"],
    ),
    (
        Capability::Graphics,
        "libEGL_nvidia",
        &["libEGL_nvidia.so.0"],
    ),
    (
        Capability::Graphics,
        "libGLX_nvidia",
        &["libGLX_nvidia.so.0"],
    ),
    (
        Capability::Graphics,
        "libGLESv2_nvidia",
        &["libGLESv2_nvidia.so.2"],
    ),
    (
        Capability::Graphics,
        "libGLESv1_CM_nvidia",
        &["libGLESv1_CM_nvidia.so.1"],
    ),
    (Capability::Graphics, "libnvidia-eglcore", &[]),
    (Capability::Graphics, "libnvidia-glcore", &[]),
    (Capability::Graphics, "libnvidia-tls", &[]),
    (Capability::Graphics, "libnvidia-glsi", &[]),
    (Capability::Graphics, "libnvidia-glvkspirv", &[]),
    (Capability::Graphics, "libnvidia-rtcore", &[]),
    (Capability::Graphics, "libnvoptix", &["libnvoptix.so.1"]),
];

pub(crate) const BINS: &[(Capability, &str)] = &[
    (Capability::Utility, "nvidia-smi"),
    (Capability::Utility, "nvidia-debugdump"),
    (Capability::Utility, "nvidia-persistenced"),
    (Capability::Compute, "nvidia-cuda-mps-control"),
    (Capability::Compute, "nvidia-cuda-mps-server"),
];

const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/local/nvidia/lib64",
];
pub(crate) const BIN_DIRS: &[&str] = &["/usr/bin", "/usr/sbin", "/bin", "/usr/local/bin"];

/// Standard library directories, then those of `etc/ld.so.conf.d`.
pub(crate) fn lib_dirs(root: &HostRoot) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = LIB_DIRS.iter().map(|d| root.join(d)).collect();
    let conf = root.join("etc/ld.so.conf.d");
    let mut confs: Vec<_> = fs::read_dir(conf)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "conf"))
        .collect();
    confs.sort();
    for c in confs {
        for line in fs::read_to_string(c).unwrap_or_default().lines() {
            let l = line.split('#').next().unwrap_or("").trim();
            if l.starts_with('/') {
                let d = root.join(l);
                if !dirs.contains(&d) {
                    dirs.push(d);
                }
            }
        }
    }
    dirs
}

/// Finds `<stem>.so.<driver version>` (NVIDIA installs every library so),
/// else the newest `<stem>.so.*` file, in `dirs`. Returns the real file
/// (symlinks resolved inside the root) and the file name to give it.
pub(crate) fn find_lib(
    root: &HostRoot,
    dirs: &[PathBuf],
    stem: &str,
    version: Option<&str>,
) -> Option<(PathBuf, String)> {
    let prefix = format!("{stem}.so.");
    for dir in dirs {
        if let Some(v) = version {
            let p = dir.join(format!("{prefix}{v}"));
            if let Some(real) = resolve_in_root(root, &p) {
                return Some((real, format!("{prefix}{v}")));
            }
        }
        let mut found: Vec<String> = fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        // Longest version string first: `libcuda.so.580.95.05` before `libcuda.so.1`.
        found.sort_by_key(|n| std::cmp::Reverse((n.len(), n.clone())));
        for n in found {
            if let Some(real) = resolve_in_root(root, &dir.join(&n)) {
                let name = real
                    .file_name()
                    .map_or(n.clone(), |f| f.to_string_lossy().into_owned());
                let name = if name.starts_with(&prefix) { name } else { n };
                return Some((real, name));
            }
        }
    }
    None
}

/// Follows symlinks, taking absolute targets below the root; the final
/// regular file, or None.
fn resolve_in_root(root: &HostRoot, p: &Path) -> Option<PathBuf> {
    let mut p = p.to_path_buf();
    for _ in 0..16 {
        let md = fs::symlink_metadata(&p).ok()?;
        if md.file_type().is_symlink() {
            let t = fs::read_link(&p).ok()?;
            p = if t.is_absolute() {
                root.join(&t)
            } else {
                p.parent()?.join(t)
            };
        } else {
            return md.is_file().then_some(p);
        }
    }
    None
}
