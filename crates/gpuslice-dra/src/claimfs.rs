//! A claim's slice directory on the host: where every container and pod
//! of the claim finds one usage ledger, so the claim's caps hold in sum
//! (a tmpfs in each container gave each its own ledger, and a claim used by
//! 2 containers of 2 pods held 4 × its cap).
//!
//! Each capped slice `<uid>-<n>` of a claim gets
//! `<host>/run/gpuslice/claims/<uid>-<n>`, a tmpfs of its own of
//! `gpuslice_k8s::slicedir::SIZE_BYTES` (what a pod writes there is bounded and goes with the
//! claim: the host's `/run` is RAM), mode 1777 like the container tmpfs it
//! replaces (the shim creates the ledger as whatever user the container
//! runs), `nosuid,nodev,noexec`. The claim's CDI spec binds it at the
//! slice's fixed directory; Unprepare unmounts and removes it. In a pod
//! the plugin makes the mount in a volume with `Bidirectional` mount
//! propagation, so the host (and so the runtime) sees it.

use anyhow::{anyhow, Context};
use gpuslice_cdi::{capped_slice, SliceDevice};
use gpuslice_ledger::limits::USAGE_FILE;
use std::path::{Path, PathBuf};

/// Below the host root: the directory of the claims' slice directories.
pub const CLAIMS_DIR: &str = "run/gpuslice/claims";

/// The slice directory of `slice` below `claims`.
pub fn slice_dir(claims: &Path, slice: &str) -> PathBuf {
    claims.join(slice)
}

/// Makes `dir` a fresh bounded tmpfs (`gpuslice_k8s::slicedir`), mode
/// 1777 like the container tmpfs it replaces: the shim creates the ledger
/// as whatever user the container runs.
pub fn make(dir: &Path) -> std::io::Result<()> {
    gpuslice_k8s::slicedir::make(dir, 0o1777)
}

pub use gpuslice_k8s::slicedir::{remove, sweep};

/// Makes the usage ledger of each capped slice of `slices` in its
/// directory (`dirs`, in the same order) as root, mode 0666 (the shim
/// joins it as whatever user the container runs; the sticky directory
/// keeps a container user from replacing it), and records the slice's
/// share on its GPU's board in `boards`: the slice's key there is its
/// ledger's, now known to root, and only a slice root vouched for is
/// counted and passed the turn by the GPU's other slices
/// (docs/compute-share.md). Returns the share records, for Unprepare to
/// remove; on an error none is left.
pub fn vouch(
    slices: &[SliceDevice],
    dirs: &[PathBuf],
    inv: &gpuslice_core::Inventory,
    boards: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut records = Vec::new();
    let capped = slices.iter().filter_map(|s| Some((s, s.caps?)));
    for ((s, caps), dir) in capped.zip(dirs) {
        let made = vouch_one(s, caps, dir, inv, boards);
        match made {
            Ok(r) => records.extend(r),
            Err(e) => {
                for r in &records {
                    let _ = std::fs::remove_file(r);
                }
                return Err(e.context(format!("slice {}", s.name)));
            }
        }
    }
    Ok(records)
}

fn vouch_one(
    s: &SliceDevice,
    caps: gpuslice_ledger::limits::DeviceCaps,
    dir: &Path,
    inv: &gpuslice_core::Inventory,
    boards: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    let gpu = inv
        .gpus
        .iter()
        .find(|g| g.index == s.gpu)
        .ok_or_else(|| anyhow!("no GPU {} on this host", s.gpu))?;
    let limits = capped_slice(&s.name, caps.on(&gpu.uuid));
    let usage = dir.join(USAGE_FILE);
    limits
        .create_usage(&usage)
        .with_context(|| format!("the usage ledger {}", usage.display()))?;
    gpuslice_ledger::board::publish_shares(boards, &usage, &limits)
        .with_context(|| format!("recording the share on {}", boards.display()))
}
