//! A claim's slice directory on the host: where every container and pod
//! of the claim finds one usage ledger, so the claim's caps hold in sum
//! (a tmpfs in each container gave each its own ledger, and a claim used by
//! 2 containers of 2 pods held 4 × its cap).
//!
//! Each capped slice `<uid>-<n>` of a claim gets
//! `<host>/run/gpuslice/claims/<uid>-<n>`, a tmpfs of its own of
//! [`SIZE_BYTES`] (what a pod writes there is bounded and goes with the
//! claim: the host's `/run` is RAM), mode 1777 like the container tmpfs it
//! replaces (the shim creates the ledger as whatever user the container
//! runs), `nosuid,nodev,noexec`. The claim's CDI spec binds it at the
//! slice's fixed directory; Unprepare unmounts and removes it. In a pod
//! the plugin makes the mount in a volume with `Bidirectional` mount
//! propagation, so the host (and so the runtime) sees it.

use rustix::mount::{mount, unmount, MountFlags, UnmountFlags};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Below the host root: the directory of the claims' slice directories.
pub const CLAIMS_DIR: &str = "run/gpuslice/claims";
/// A slice directory's size: the ledger (332 KiB) and room to spare.
pub const SIZE_BYTES: u64 = 1 << 20;

/// The slice directory of `slice` below `claims`.
pub fn slice_dir(claims: &Path, slice: &str) -> PathBuf {
    claims.join(slice)
}

fn is_mount_point(dir: &Path) -> std::io::Result<bool> {
    let parent = dir.parent().unwrap_or(Path::new("/"));
    Ok(std::fs::metadata(dir)?.dev() != std::fs::metadata(parent)?.dev())
}

/// Makes `dir` a fresh tmpfs of [`SIZE_BYTES`]. One there already (a
/// plugin restarted between Prepare and its checkpoint) is replaced: what a
/// pod left in it is not inherited.
pub fn make(dir: &Path) -> std::io::Result<()> {
    if dir.exists() {
        remove(dir)?;
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::create_dir(dir)?;
    let data = std::ffi::CString::new(format!("size={SIZE_BYTES},mode=1777"))
        .expect("no NUL in the options");
    let r = mount(
        "gpuslice-claim",
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

/// Unmounts and removes `dir`; gone already is fine.
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

/// Unmounts and removes every slice directory below `claims` that no
/// prepared claim holds (`kept`): those of a plugin killed between making
/// one and saving its checkpoint, or of a claim unprepared while the plugin
/// was down. Each is reported with why it could not be removed; the ones
/// removed are not.
pub fn sweep(
    claims: &Path,
    kept: &std::collections::HashSet<&Path>,
) -> Vec<(PathBuf, std::io::Error)> {
    let Ok(entries) = std::fs::read_dir(claims) else {
        return Vec::new(); // none made yet
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|dir| !kept.contains(dir.as_path()))
        .filter_map(|dir| {
            tracing::info!(dir = %dir.display(), "removing an orphaned claim slice directory");
            remove(&dir).err().map(|e| (dir, e))
        })
        .collect()
}
