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
