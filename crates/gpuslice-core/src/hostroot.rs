//! Where the host's `/dev`, `/proc/driver/nvidia` and `/sys` are read.
//!
//! In production the host root is `/`; inside a container that mounts the
//! host at `/host` it is `/host`; tests point it at a fake host tree.
//!
//! The driver's files that a launch reads as root and shows to the slice
//! (`proc/driver/nvidia/params`, the `gpus/<bus>` dirs it masks, `/dev`)
//! are opened with [`HostRoot::open_beneath`]: no symlink is followed on the
//! way and nothing outside the root is reached, so a host tree whose
//! `params` links to `/etc/shadow` is an error, never a copy of the shadow
//! file in the slice.

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

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

    /// Opens `rel` (taken below the root, as [`HostRoot::join`]) with
    /// `flags`, following no symlink in any component and never leaving
    /// the root (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`;
    /// a component-by-component `O_NOFOLLOW` walk on kernels before 5.6).
    /// A symlink on the way is an error naming the path.
    pub fn open_beneath(&self, rel: impl AsRef<Path>, flags: OFlag) -> io::Result<OwnedFd> {
        let rel = rel.as_ref();
        let rel = rel.strip_prefix("/").unwrap_or(rel);
        let dir = File::open(&self.0)?;
        // Only O_CLOEXEC: openat2 refuses O_PATH with most other flags (EINVAL).
        let flags = flags | OFlag::O_CLOEXEC;
        let how = OpenHow::new()
            .flags(flags)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        let opened = match nix::fcntl::openat2(&dir, rel, how) {
            Err(nix::Error::ENOSYS) => walk_no_symlinks(dir.into(), rel, flags),
            other => other,
        };
        opened.map_err(|e| self.open_error(rel, e))
    }

    /// The text of `rel`, opened as [`HostRoot::open_beneath`].
    pub fn read_beneath(&self, rel: impl AsRef<Path>) -> io::Result<String> {
        let mut text = String::new();
        File::from(self.open_beneath(rel, OFlag::O_RDONLY)?).read_to_string(&mut text)?;
        Ok(text)
    }

    fn open_error(&self, rel: &Path, e: nix::Error) -> io::Error {
        let path = self.join(rel);
        match e {
            // ELOOP: a symlink; EXDEV: `..` or an absolute link out of the root.
            nix::Error::ELOOP | nix::Error::EXDEV => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: a symbolic link or '..' on the way, refused (paths under the host root are never resolved through links)",
                    path.display()
                ),
            ),
            e => {
                let e = io::Error::from(e);
                io::Error::new(e.kind(), format!("{}: {e}", path.display()))
            }
        }
    }
}

/// `open_beneath` without openat2: each component opened with O_NOFOLLOW
/// from the previous one; `..` is refused outright.
fn walk_no_symlinks(mut dir: OwnedFd, rel: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
    let parts: Vec<&std::ffi::OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(Ok(p)),
            Component::CurDir => None,
            _ => Some(Err(nix::Error::EXDEV)),
        })
        .collect::<nix::Result<_>>()?;
    let Some((last, dirs)) = parts.split_last() else {
        return nix::fcntl::openat(&dir, ".", flags, Mode::empty());
    };
    let step = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    for part in dirs {
        // O_DIRECTORY | O_NOFOLLOW on a symlink fails with ENOTDIR: say ELOOP.
        dir = nix::fcntl::openat(&dir, *part, step, Mode::empty()).map_err(|e| match e {
            nix::Error::ENOTDIR => nix::Error::ELOOP,
            e => e,
        })?;
    }
    let fd = nix::fcntl::openat(&dir, *last, flags | OFlag::O_NOFOLLOW, Mode::empty())?;
    // O_PATH | O_NOFOLLOW opens a symlink itself rather than failing.
    if nix::sys::stat::fstat(&fd)?.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return Err(nix::Error::ELOOP);
    }
    Ok(fd)
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

    #[test]
    fn links_under_the_root_are_refused_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, "TOPSECRET").unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("proc/driver/nvidia/gpus")).unwrap();
        std::fs::write(root.join("proc/driver/nvidia/version"), "v").unwrap();
        std::os::unix::fs::symlink(&secret, root.join("proc/driver/nvidia/params")).unwrap();
        std::os::unix::fs::symlink("../../../../secret", root.join("proc/driver/nvidia/rel"))
            .unwrap();
        std::os::unix::fs::symlink(
            tmp.path(),
            root.join("proc/driver/nvidia/gpus/0000:01:00.0"),
        )
        .unwrap();
        std::os::unix::fs::symlink("proc", root.join("p")).unwrap();
        let r = HostRoot::new(&root);
        assert_eq!(r.read_beneath("/proc/driver/nvidia/version").unwrap(), "v");
        for rel in [
            "proc/driver/nvidia/params",
            "proc/driver/nvidia/rel",
            "proc/driver/nvidia/gpus/0000:01:00.0/secret",
            "p/driver/nvidia/version",
            "proc/../../secret",
        ] {
            let e = r.read_beneath(rel).unwrap_err().to_string();
            assert!(e.contains("symbolic link"), "{rel}: {e}");
            assert!(!e.contains("TOPSECRET"));
        }
        // The fallback walk says the same.
        let dir: OwnedFd = File::open(&root).unwrap().into();
        for rel in [
            "proc/driver/nvidia/params",
            "p/driver/nvidia/version",
            "proc/../x",
        ] {
            let e = walk_no_symlinks(dir.try_clone().unwrap(), Path::new(rel), OFlag::O_RDONLY);
            assert!(
                matches!(e, Err(nix::Error::ELOOP | nix::Error::EXDEV)),
                "{rel}: {e:?}"
            );
        }
        assert!(walk_no_symlinks(
            dir,
            Path::new("proc/driver/nvidia/version"),
            OFlag::O_RDONLY
        )
        .is_ok());
    }
}
