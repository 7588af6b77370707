//! Layer 1: a private `/dev` that mirrors the host's except the NVIDIA
//! nodes the slice's [`DevicePolicy`] denies.
//!
//! Runs in the launcher's child, after it entered its own mount namespace
//! and before exec. The mirror is a fresh tmpfs on top of `<root>/dev`:
//! directories, symlinks and device nodes are re-created (mknod, as root) or
//! bind-mounted one by one (in a user namespace, where mknod is not
//! allowed); nested mounts (`/dev/pts`, `/dev/shm`, `/dev/mqueue`…), sockets
//! and other special files are bind-mounted from the host, so everything but
//! the hidden GPUs keeps working.

use gpuslice_core::DevicePolicy;
use nix::mount::{mount, MsFlags};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// How device nodes are re-created in the mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeMode {
    /// mknod a copy (root in the initial user namespace): cheapest.
    Mknod,
    /// bind-mount the host node (user namespaces may not mknod).
    Bind,
}

#[derive(Debug)]
enum Kind {
    Dir,
    Symlink(PathBuf),
    Node {
        char: bool,
        rdev: u64,
    },
    /// A nested mount, socket or other special file: bind-mounted from the host.
    Bind {
        dir: bool,
    },
}

#[derive(Debug)]
struct Entry {
    rel: PathBuf,
    kind: Kind,
    mode: u32,
    uid: u32,
    gid: u32,
}

/// Replace `dev` (the host's `<root>/dev`) with a mirror that lacks the
/// nodes `policy` denies. Returns how many nodes were hidden. The caller
/// must have set the umask to 0, so entries get the host's exact modes.
pub fn mount_private_dev(dev: &Path, policy: &DevicePolicy, nodes: NodeMode) -> io::Result<usize> {
    let dev_meta = fs::metadata(dev).map_err(|e| ctx(e, "stat", dev))?;
    let mut entries = Vec::new();
    let hidden = scan(dev, Path::new(""), dev_meta.dev(), policy, &mut entries)?;

    // The host /dev stays reachable through this fd after the tmpfs hides it.
    let host = File::open(dev).map_err(|e| ctx(e, "open", dev))?;
    let host_path = PathBuf::from(format!("/proc/self/fd/{}", host.as_raw_fd()));

    let opts = format!("mode={:o}", dev_meta.mode() & 0o7777);
    mount(
        Some("gpuslice-dev"),
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some(opts.as_str()),
    )
    .map_err(|e| ctx(e.into(), "mount tmpfs on", dev))?;
    chown(dev, dev_meta.uid(), dev_meta.gid())?;

    for e in &entries {
        create(dev, &host_path, e, nodes)?;
    }
    Ok(hidden)
}

/// Collect the entries of `dir` (recursively), skipping denied char nodes.
fn scan(
    root: &Path,
    rel: &Path,
    dev_id: u64,
    policy: &DevicePolicy,
    out: &mut Vec<Entry>,
) -> io::Result<usize> {
    let dir = root.join(rel);
    let mut hidden = 0;
    for item in fs::read_dir(&dir).map_err(|e| ctx(e, "read", &dir))? {
        let item = item?;
        let rel = rel.join(item.file_name());
        let meta = match fs::symlink_metadata(item.path()) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // vanished meanwhile
            Err(e) => return Err(ctx(e, "stat", &item.path())),
        };
        let ft = meta.file_type();
        let kind = if ft.is_symlink() {
            Kind::Symlink(fs::read_link(item.path())?)
        } else if ft.is_dir() && meta.dev() != dev_id {
            Kind::Bind { dir: true }
        } else if ft.is_dir() {
            out.push(entry(rel.clone(), Kind::Dir, &meta));
            hidden += scan(root, &rel, dev_id, policy, out)?;
            continue;
        } else if ft.is_char_device() || ft.is_block_device() {
            let rdev = meta.rdev();
            let (major, minor) = (libc::major(rdev), libc::minor(rdev));
            if ft.is_char_device() && !policy.allows_char(major, minor) {
                hidden += 1;
                continue;
            }
            Kind::Node {
                char: ft.is_char_device(),
                rdev,
            }
        } else {
            Kind::Bind { dir: false }
        };
        out.push(entry(rel, kind, &meta));
    }
    Ok(hidden)
}

fn entry(rel: PathBuf, kind: Kind, meta: &fs::Metadata) -> Entry {
    Entry {
        rel,
        kind,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
    }
}

fn create(dev: &Path, host: &Path, e: &Entry, nodes: NodeMode) -> io::Result<()> {
    let path = dev.join(&e.rel);
    let perm = Mode::from_bits_truncate(e.mode);
    match &e.kind {
        Kind::Dir => {
            nix::unistd::mkdir(&path, perm).map_err(|err| ctx(err.into(), "mkdir", &path))?;
        }
        Kind::Symlink(target) => {
            std::os::unix::fs::symlink(target, &path).map_err(|err| ctx(err, "symlink", &path))?;
            return lchown(&path, e.uid, e.gid, nodes);
        }
        Kind::Node { char, rdev } if nodes == NodeMode::Mknod => {
            let kind = if *char {
                SFlag::S_IFCHR
            } else {
                SFlag::S_IFBLK
            };
            let rdev = makedev(libc::major(*rdev) as u64, libc::minor(*rdev) as u64);
            mknod(&path, kind, perm, rdev).map_err(|err| ctx(err.into(), "mknod", &path))?;
        }
        Kind::Node { .. } => bind(host, e, &path, false)?,
        Kind::Bind { dir } => bind(host, e, &path, *dir)?,
    }
    // The caller cleared the umask, so mknod and mkdir made the host's
    // modes already; only ownership may differ (tty, disk, kvm groups…).
    if nodes == NodeMode::Mknod && (e.uid, e.gid) != owner() {
        chown(&path, e.uid, e.gid)?;
    }
    Ok(())
}

fn bind(host: &Path, e: &Entry, target: &Path, dir: bool) -> io::Result<()> {
    if dir {
        nix::unistd::mkdir(target, Mode::from_bits_truncate(e.mode))
            .map_err(|err| ctx(err.into(), "mkdir", target))?;
    } else {
        File::create(target).map_err(|err| ctx(err, "create", target))?;
    }
    let source = host.join(&e.rel);
    mount(
        Some(&source),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|err| ctx(err.into(), "bind-mount onto", target))
}

/// Who owns what this process creates.
fn owner() -> (u32, u32) {
    (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    )
}

fn chown(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| ctx(e, "chown", path))
}

fn lchown(path: &Path, uid: u32, gid: u32, nodes: NodeMode) -> io::Result<()> {
    if nodes == NodeMode::Bind || (uid, gid) == owner() {
        return Ok(()); // a user namespace maps only our own ids
    }
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(|e| ctx(e, "chown", path))
}

/// Attach the operation and path to an io error, so the one-line message
/// the user sees says what failed where.
pub(crate) fn ctx(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}
