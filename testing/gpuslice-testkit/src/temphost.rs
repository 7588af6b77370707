//! A host's files in a temporary directory, for code that reads the host
//! through a [`HostRoot`] (doctor's checks, the DRA driver's hot-plug
//! watch): each test writes only the files its case is about.

use gpuslice_core::HostRoot;
use std::path::{Path, PathBuf};
use tempfile::TempDir;

/// An empty host root, removed when dropped.
pub struct TempHost {
    dir: TempDir,
}

impl TempHost {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    /// The host root's directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn root(&self) -> HostRoot {
        HostRoot::new(self.dir.path())
    }

    /// Makes directory `rel` (relative to the root) and its parents; its path.
    pub fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        p
    }

    /// Writes `text` at `rel` (relative to the root), making its parent
    /// directories; its path.
    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
        }
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        p
    }
}

impl Default for TempHost {
    fn default() -> Self {
        Self::new()
    }
}
