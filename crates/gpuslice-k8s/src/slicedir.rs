//! A slice's directory on the host as a tmpfs of its own, of a fixed
//! size: what a pod can write through the files of it that it is given
//! (its usage ledger) is bounded, goes away with the slice, and is never
//! inherited by the next slice made at the same place. The host's `/run`
//! is RAM: an unbounded ledger file once grew to 20 MiB real and 1 TB
//! sparse there.
//!
//! Used for DRA claims' slice directories and the device plugin's
//! replica directories. A plugin in a pod makes these mounts in a volume
//! with `Bidirectional` propagation, so that the host (and so the
//! container runtime, which binds files of them) sees them.

use rustix::mount::{mount, unmount, MountFlags, UnmountFlags};
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A slice directory's size: its usage ledger and root's limits record,
/// with room to spare.
pub const SIZE_BYTES: u64 = 1 << 20;

fn is_mount_point(dir: &Path) -> std::io::Result<bool> {
    let parent = dir.parent().unwrap_or(Path::new("/"));
    Ok(std::fs::metadata(dir)?.dev() != std::fs::metadata(parent)?.dev())
}

/// Makes `dir` a fresh tmpfs of [`SIZE_BYTES`] with permissions `mode`
/// (`nosuid,nodev,noexec`). One there already is replaced: what was left
/// in it is not inherited.
pub fn make(dir: &Path, mode: u32) -> std::io::Result<()> {
    if dir.symlink_metadata().is_ok() {
        remove(dir)?;
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::create_dir(dir)?;
    let data = std::ffi::CString::new(format!("size={SIZE_BYTES},mode={mode:o}"))
        .expect("no NUL in the options");
    let r = mount(
        "gpuslice-slice",
        dir,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        Some(data.as_c_str()),
    );
    if let Err(e) = r {
        let _ = std::fs::remove_dir(dir);
        return Err(e.into());
    }
    Ok(())
}

/// Unmounts and removes `dir` (its tmpfs, or a plain directory left by an
/// older version); gone already is fine. `remove_dir_all` follows no link.
pub fn remove(dir: &Path) -> std::io::Result<()> {
    match is_mount_point(dir) {
        Ok(true) => unmount(dir, UnmountFlags::DETACH)?,
        Ok(false) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Unmounts and removes every directory below `parent` but those of
/// `kept`: slice directories no slice holds any more (a plugin killed
/// between making one and recording it). Each that could not be removed
/// is returned with why.
pub fn sweep(parent: &Path, kept: &HashSet<&Path>) -> Vec<(PathBuf, std::io::Error)> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new(); // none made yet
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|dir| !kept.contains(dir.as_path()))
        .filter_map(|dir| {
            tracing::info!(dir = %dir.display(), "removing an orphaned slice directory");
            remove(&dir).err().map(|e| (dir, e))
        })
        .collect()
}
