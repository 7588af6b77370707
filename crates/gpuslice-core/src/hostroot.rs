//! Where the host's `/dev`, `/proc/driver/nvidia` and `/sys` are read.
//!
//! In production the host root is `/`; inside a container that mounts the
//! host at `/host` it is `/host`; tests point it at a fake host tree.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot(PathBuf);

impl HostRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self(root.into())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `rel` taken below the host root; `rel` may be absolute (`/dev`).
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        let rel = rel.as_ref();
        self.0.join(rel.strip_prefix("/").unwrap_or(rel))
    }

    pub fn dev(&self) -> PathBuf {
        self.join("dev")
    }

    pub fn nvidia_proc(&self) -> PathBuf {
        self.join("proc/driver/nvidia")
    }

    pub fn is_system_root(&self) -> bool {
        self.0 == Path::new("/")
    }
}

impl Default for HostRoot {
    fn default() -> Self {
        Self::new("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_strips_leading_slash() {
        let r = HostRoot::new("/host");
        assert_eq!(r.join("/dev/nvidia0"), PathBuf::from("/host/dev/nvidia0"));
        assert_eq!(r.join("sys"), PathBuf::from("/host/sys"));
        assert!(HostRoot::default().is_system_root());
    }
}
