//! Files every slice loads, which no slice may change: gpuslice's own
//! binaries and shim, the NVIDIA user-space driver libraries, and the
//! dynamic loader's configuration and cache. The host's root filesystem is
//! the slice's (docs/security.md, "Root on the host's filesystem"), so
//! root in a slice, even without a capability, owns those files; without
//! this a tenant could rewrite the shim or `libcuda.so.1` that every later
//! tenant loads.
//!
//! Each is bound read-only over itself in the slice's mount namespace
//! ([`crate::readonly::read_only_bind`]): a file cannot be written, and
//! being a mount point there, cannot be unlinked or renamed over
//! (EBUSY). A library is found by a name the loader looks up (a symlink
//! such as `libcuda.so.1` in a directory of its cache), and a symlink
//! cannot be a mount point, so the *directory* holding each NVIDIA library
//! name is bound read-only (`/usr/lib/x86_64-linux-gnu` on Debian: the
//! rest of the system's libraries in it with it), and the file it resolves
//! to as well when that lies elsewhere. The rest of the host's root stays
//! writable (checkpoints, caches, `/tmp`), unless `--read-only-root`.

use std::fs;
use std::path::{Path, PathBuf};

/// The loader's configuration and cache (ld.so(8), ldconfig(8)).
pub const LOADER_FILES: [&str; 4] = [
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ld.so.preload",
];

/// Directories below a host root other than `/` where its driver
/// libraries may be (a simulated host keeps its fake ones in
/// [`DRIVER_DIR`](gpuslice_core::simulation::DRIVER_DIR)); the host's own
/// are found through its loader cache.
const ROOT_LIB_DIRS: [&str; 6] = [
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "usr/local/nvidia/lib64",
    gpuslice_core::simulation::DRIVER_DIR,
];

/// Whether `name` is a library of the NVIDIA user-space driver
/// (`libcuda.so.1`, `libnvidia-ml.so.1`, `libnvcuvid.so.1`,
/// `libEGL_nvidia.so.0`, `libnvoptix.so.1`…).
pub fn is_driver_library(name: &str) -> bool {
    name.contains(".so")
        && (name.starts_with("libcuda")
            || name.starts_with("libnvidia-")
            || name.starts_with("libnvcuvid")
            || name.starts_with("libnvoptix")
            || name.contains("_nvidia"))
}

/// What to bind read-only: the loader's files, `own` (gpuslice's
/// binaries and shim), and the NVIDIA libraries the host's loader cache
/// names and those below `root` when it is not `/`. Canonical paths, each
/// existing, none below a directory already listed.
pub fn protected_paths(root: &Path, own: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut add = |p: &Path| {
        if let Ok(c) = fs::canonicalize(p) {
            out.push(c);
        }
    };
    LOADER_FILES.iter().map(Path::new).for_each(&mut add);
    own.iter().for_each(|p| add(p));
    let driver = |p: &str| is_driver_library(p.rsplit('/').next().unwrap_or(p));
    let mut libs: Vec<PathBuf> = fs::read("/etc/ld.so.cache")
        .map(|c| cache_paths(&c, driver))
        .unwrap_or_default();
    if root != Path::new("/") {
        for d in ROOT_LIB_DIRS.map(|d| root.join(d)) {
            for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.file_name().to_str().is_some_and(is_driver_library) {
                    libs.push(e.path());
                }
            }
        }
    }
    for lib in &libs {
        // The name's directory (the name cannot be swapped), and the file.
        if let Some(dir) = lib.parent() {
            add(dir);
        }
        add(lib);
    }
    out.sort();
    out.dedup();
    // A path below a listed directory is covered by it: one mount fewer.
    let dirs: Vec<PathBuf> = out.iter().filter(|p| p.is_dir()).cloned().collect();
    out.retain(|p| !dirs.iter().any(|d| p != d && p.starts_with(d)));
    out
}

/// The library paths of a loader cache (`/etc/ld.so.cache`, glibc's
/// format `glibc-ld.so.cache1.1`, alone or after the old `ld.so-1.7.0`
/// part) that `keep` takes: each entry's value, a path such as
/// `/lib/x86_64-linux-gnu/libcuda.so.1`. Malformed input gives what could
/// be read.
pub fn cache_paths(cache: &[u8], keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    const HEADER: usize = 48; // magic, nlibs, len_strings, flags, pad, extension, 3 unused
    const ENTRY: usize = 24; // flags, key, value, osversion, hwcap (u64)
    const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
    // The new part first, or after the old one: its 16-byte header and
    // 12-byte entries, aligned to 8.
    let start = if cache.starts_with(MAGIC) {
        0
    } else if cache.starts_with(OLD_MAGIC) {
        let Some(n) = cache.get(12..16) else {
            return vec![];
        };
        let nlibs = u32::from_le_bytes([n[0], n[1], n[2], n[3]]) as usize;
        (16 + nlibs * 12).next_multiple_of(8)
    } else {
        return vec![];
    };
    if !cache.get(start..).is_some_and(|c| c.starts_with(MAGIC)) {
        return vec![];
    }
    let new = &cache[start..];
    let u32_at = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(new.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let Some(nlibs) = u32_at(20) else {
        return vec![];
    };
    let mut out = Vec::new();
    for i in 0..nlibs {
        let Some(value) = u32_at(HEADER + i * ENTRY + 8) else {
            break;
        };
        // String offsets are from the start of this (new) header.
        let Some(s) = new.get(value..) else { continue };
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        if let Ok(p) = std::str::from_utf8(&s[..end]) {
            if p.starts_with('/') && keep(p) {
                out.push(PathBuf::from(p));
            }
        }
    }
    out
}

/// Makes `/etc/ld.so.preload` exist on the host (empty: the loader reads
/// an empty list as none), so that it is a mount point to bind read-only:
/// a slice could otherwise create it, preloading its code into every
/// program of the host and of every later slice. As root, before the
/// launch.
pub fn prepare_host() -> std::io::Result<()> {
    let preload = Path::new(crate::slicefs::LD_SO_PRELOAD);
    if !preload.exists() {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(preload)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_libraries_are_told_from_others() {
        for n in [
            "libcuda.so.1",
            "libcuda.so.580.95.05",
            "libnvidia-ml.so.1",
            "libnvcuvid.so.1",
            "libEGL_nvidia.so.0",
            "libGLX_nvidia.so.0",
            "libnvoptix.so.1",
        ] {
            assert!(is_driver_library(n), "{n}");
        }
        for n in ["libc.so.6", "libcudart.txt", "libEGL.so.1", "nvidia-smi"] {
            assert!(!is_driver_library(n), "{n}");
        }
    }

    #[test]
    fn the_loader_cache_is_read() {
        // A cache of two entries, as ldconfig writes the new format.
        let strings =
            b"libc.so.6\0/lib/x86_64-linux-gnu/libc.so.6\0libcuda.so.1\0/usr/lib/libcuda.so.1\0";
        let table = 48 + 2 * 24;
        let mut c = b"glibc-ld.so.cache1.1".to_vec();
        c.extend(2u32.to_le_bytes());
        c.extend((strings.len() as u32).to_le_bytes());
        c.resize(48, 0);
        for (key, value) in [(0usize, 10usize), (42, 55)] {
            c.extend(0x303i32.to_le_bytes());
            c.extend(((table + key) as u32).to_le_bytes());
            c.extend(((table + value) as u32).to_le_bytes());
            c.extend([0u8; 12]);
        }
        c.extend(strings);
        assert_eq!(
            cache_paths(&c, |_| true),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/usr/lib/libcuda.so.1")
            ]
        );
        // Truncated anywhere: no panic.
        for n in 0..c.len() {
            let _ = cache_paths(&c[..n], |_| true);
        }
        // This host's own cache, when it has one, names its libc.
        if let Ok(real) = fs::read("/etc/ld.so.cache") {
            let paths = cache_paths(&real, |_| true);
            assert!(paths.iter().any(|p| p.ends_with("libc.so.6")), "{paths:?}");
        }
    }
}
