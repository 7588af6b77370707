//! Layer 1: a private `/dev` that shows the host's except the NVIDIA
//! nodes the slice's [`DevicePolicy`] denies.
//!
//! Runs in the launcher's child, after it entered its own mount namespace
//! and before exec. Two ways, by what the child may do:
//! - as root ([`NodeMode::Whiteout`]): an overlay whose lower layer is the
//!   host's `/dev` itself and whose upper layer (a private tmpfs) holds a
//!   whiteout for each denied node. Nothing is copied, so a launch costs the
//!   same on a host with 20 or 300 `/dev` entries (copying them cost ~17 µs
//!   an entry on the CI-like machine, ~1 ms on the H200's 152), the view
//!   stays live, and writes land in the slice's own upper layer;
//! - in a user namespace ([`NodeMode::Bind`], where whiteouts and mknod are
//!   not allowed): a fresh tmpfs mirroring the host's directories and
//!   symlinks, with every node bind-mounted from the host.
//!
//! Either way the nested mounts (`/dev/pts`, `/dev/shm`, `/dev/mqueue`…)
//! are bind-mounted from the host, so everything but the hidden GPUs keeps
//! working.

use gpuslice_core::DevicePolicy;
use nix::mount::{mount, MsFlags};
use nix::sys::stat::{mknod, Mode, SFlag};
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// How the private `/dev` hides the denied nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeMode {
    /// Root in the initial user namespace: the host's `/dev` under an
    /// overlay, a whiteout over each denied node.
    Whiteout,
    /// A user namespace: a tmpfs mirror, each allowed node bind-mounted.
    Bind,
}

/// What the mirror makes of a host `/dev` entry.
#[derive(Debug)]
enum Kind {
    Dir,
    Symlink(PathBuf),
    /// A device node, nested mount, socket or other special file:
    /// bind-mounted from the host.
    Bind {
        dir: bool,
    },
}

#[derive(Debug)]
struct Entry {
    rel: PathBuf,
    kind: Kind,
    mode: u32,
}

/// Replace `dev` (the host's `<root>/dev`) with a view that lacks the
/// nodes `policy` denies. Returns how many nodes were hidden. The caller
/// must have set the umask to 0, so entries get the host's exact modes.
///
/// `surveyed`: for [`NodeMode::Whiteout`], what [`Survey::of`] found in the
/// same `/dev`, made by the launcher while this child built its namespaces
/// (walking the H200's `/dev` was most of this step); None surveys here.
pub fn mount_private_dev(
    dev: &Path,
    policy: &DevicePolicy,
    nodes: NodeMode,
    surveyed: Option<Survey>,
) -> io::Result<usize> {
    match nodes {
        NodeMode::Whiteout => overlay(dev, policy, surveyed),
        NodeMode::Bind => mirror(dev, policy),
    }
}

/// [`NodeMode::Whiteout`]: see the module docs.
fn overlay(dev: &Path, policy: &DevicePolicy, surveyed: Option<Survey>) -> io::Result<usize> {
    let dev_meta = fs::metadata(dev).map_err(|e| ctx(e, "stat", dev))?;
    let Survey { hidden, nested } = match surveyed {
        Some(s) => s,
        None => survey(dev, dev_meta.dev(), policy)?,
    };

    let host = File::open(dev).map_err(|e| ctx(e, "open", dev))?;
    let host_path = PathBuf::from(format!("/proc/self/fd/{}", host.as_raw_fd()));
    let (upper, work) = (dev.join("upper"), dev.join("work"));
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        host_path.display(),
        option_path(&upper)?,
        option_path(&work)?
    );
    // The layers live on a scratch tmpfs mounted where the overlay goes:
    // the overlay then covers it, and both go with the mount namespace.
    mount(
        Some("gpuslice-dev"),
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=700"),
    )
    .map_err(|e| ctx(e.into(), "mount tmpfs on", dev))?;
    // The overlay's root takes the upper root's mode and owner.
    make_dir(&upper, dev_meta.mode(), dev_meta.uid(), dev_meta.gid())?;
    make_dir(&work, 0o700, 0, 0)?;
    for rel in &hidden {
        if let Some(parent) = rel.parent() {
            upper_parents(&upper, &host_path, parent)?;
        }
        let path = upper.join(rel);
        // A 0:0 character device is overlayfs's whiteout: the name is gone.
        mknod(&path, SFlag::S_IFCHR, Mode::empty(), 0)
            .map_err(|e| ctx(e.into(), "whiteout", &path))?;
    }
    mount_dev("overlay", dev, &opts)?;
    for rel in &nested {
        bind_from(&host_path.join(rel), &dev.join(rel))?;
    }
    Ok(hidden.len())
}

/// What the overlay must do about the host's `/dev`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Survey {
    /// Denied char nodes (relative paths): whiteouts.
    hidden: Vec<PathBuf>,
    /// Directories that are mount points (`pts`, `shm`, `mqueue`…): an
    /// overlay shows what is under a mount point, so each is bound again.
    nested: Vec<PathBuf>,
}

impl Survey {
    /// The survey [`NodeMode::Whiteout`] needs of `dev` under `policy`.
    pub fn of(dev: &Path, policy: &DevicePolicy) -> io::Result<Survey> {
        let dev_meta = fs::metadata(dev).map_err(|e| ctx(e, "stat", dev))?;
        survey(dev, dev_meta.dev(), policy)
    }

    /// Bytes for a pipe: `h` or `n` and a path, each ended by NUL, then a
    /// final `.` (a message cut short is told from an empty survey).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (tag, paths) in [(b'h', &self.hidden), (b'n', &self.nested)] {
            for p in paths {
                out.push(tag);
                out.extend_from_slice(p.as_os_str().as_encoded_bytes());
                out.push(0);
            }
        }
        out.push(b'.');
        out
    }

    /// [`Survey::encode`]'s bytes back; None unless complete and well formed
    /// (relative paths without `..`: the child joins them under `/dev`).
    pub fn decode(bytes: &[u8]) -> Option<Survey> {
        use std::os::unix::ffi::OsStrExt;
        let body = bytes.strip_suffix(b".")?;
        let mut out = Survey::default();
        if body.is_empty() {
            return Some(out);
        }
        for rec in body.strip_suffix(b"\0")?.split(|b| *b == 0) {
            let (&tag, path) = rec.split_first()?;
            let path = PathBuf::from(std::ffi::OsStr::from_bytes(path));
            let plain = path
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if path.as_os_str().is_empty() || !plain {
                return None;
            }
            match tag {
                b'h' => out.hidden.push(path),
                b'n' => out.nested.push(path),
                _ => return None,
            }
        }
        Some(out)
    }
}

/// One pass over `dev` and the directories below it on the same
/// filesystem. A node is denied by its device number, whatever its name or
/// directory: a copy of `/dev/nvidia0` made as `/dev/gpu-alias0` or
/// `/dev/sub/nvidia0` is hidden like the original (a symlink to a hidden
/// node is left dangling). Only what can matter is stat'ed: character
/// devices (for their number) and directories (for their filesystem, so
/// nested mounts are bound again rather than walked); the entry types come
/// from the directory listing itself. No mount table is read (hundreds of
/// lines on a Kubernetes node). A mount on a single file in `/dev` (a
/// container's `/dev/console`) is not carried over.
fn survey(dev: &Path, dev_id: u64, policy: &DevicePolicy) -> io::Result<Survey> {
    let mut out = Survey::default();
    walk(dev, Path::new(""), dev_id, policy, &mut out)?;
    Ok(out)
}

fn walk(
    dev: &Path,
    rel: &Path,
    dev_id: u64,
    policy: &DevicePolicy,
    out: &mut Survey,
) -> io::Result<()> {
    let dir = dev.join(rel);
    for item in fs::read_dir(&dir).map_err(|e| ctx(e, "read", &dir))? {
        let item = item?;
        let file_type = item.file_type()?;
        let rel = rel.join(item.file_name());
        if file_type.is_dir() {
            let meta = match item.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // vanished meanwhile
                Err(e) => return Err(ctx(e, "stat", &item.path())),
            };
            if meta.dev() != dev_id {
                out.nested.push(rel);
            } else {
                walk(dev, &rel, dev_id, policy, out)?;
            }
        } else if file_type.is_char_device() {
            check_node(&item, rel, policy, &mut out.hidden)?;
        }
    }
    Ok(())
}

/// Adds `rel` to `out` when the char node `item` is one `policy` denies.
fn check_node(
    item: &fs::DirEntry,
    rel: PathBuf,
    policy: &DevicePolicy,
    out: &mut Vec<PathBuf>,
) -> io::Result<()> {
    let rdev = match item.metadata() {
        Ok(m) => m.rdev(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()), // vanished meanwhile
        Err(e) => return Err(ctx(e, "stat", &item.path())),
    };
    if !policy.allows_char(libc::major(rdev), libc::minor(rdev)) {
        out.push(rel);
    }
    Ok(())
}

/// Creates the directories of `rel` in `upper` that do not exist yet, with
/// the host's modes and owners (the overlay shows the upper's).
fn upper_parents(upper: &Path, host: &Path, rel: &Path) -> io::Result<()> {
    let mut at = PathBuf::new();
    for part in rel.components() {
        at.push(part);
        let path = upper.join(&at);
        if path.is_dir() {
            continue;
        }
        let meta = fs::metadata(host.join(&at)).map_err(|e| ctx(e, "stat", &host.join(&at)))?;
        make_dir(&path, meta.mode(), meta.uid(), meta.gid())?;
    }
    Ok(())
}

fn make_dir(path: &Path, mode: u32, uid: u32, gid: u32) -> io::Result<()> {
    nix::unistd::mkdir(path, Mode::from_bits_truncate(mode & 0o7777))
        .map_err(|e| ctx(e.into(), "mkdir", path))?;
    if (uid, gid) != owner() {
        chown(path, uid, gid)?;
    }
    Ok(())
}

/// A path as an overlayfs option value, which has no escape for the
/// separators `,` and `:`.
fn option_path(path: &Path) -> io::Result<&str> {
    path.to_str()
        .filter(|p| !p.contains([',', ':', '\\']))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: a private /dev needs a host root path without ',', ':' or '\\'",
                    path.display()
                ),
            )
        })
}

/// [`NodeMode::Bind`]: see the module docs.
fn mirror(dev: &Path, policy: &DevicePolicy) -> io::Result<usize> {
    let dev_meta = fs::metadata(dev).map_err(|e| ctx(e, "stat", dev))?;
    let mut entries = Vec::new();
    let hidden = scan(dev, Path::new(""), dev_meta.dev(), policy, &mut entries)?;

    // The host /dev stays reachable through this fd after the tmpfs hides it.
    let host = File::open(dev).map_err(|e| ctx(e, "open", dev))?;
    let host_path = PathBuf::from(format!("/proc/self/fd/{}", host.as_raw_fd()));

    let opts = format!("mode={:o}", dev_meta.mode() & 0o7777);
    mount_dev("tmpfs", dev, &opts)?;
    chown(dev, dev_meta.uid(), dev_meta.gid())?;

    for e in &entries {
        create(dev, &host_path, e)?;
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
        } else if ft.is_char_device()
            && !policy.allows_char(libc::major(meta.rdev()), libc::minor(meta.rdev()))
        {
            hidden += 1;
            continue;
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
    }
}

fn create(dev: &Path, host: &Path, e: &Entry) -> io::Result<()> {
    let path = dev.join(&e.rel);
    match &e.kind {
        Kind::Dir => nix::unistd::mkdir(&path, Mode::from_bits_truncate(e.mode))
            .map_err(|err| ctx(err.into(), "mkdir", &path)),
        // Owned by us: a user namespace maps only our own ids.
        Kind::Symlink(target) => {
            std::os::unix::fs::symlink(target, &path).map_err(|err| ctx(err, "symlink", &path))
        }
        Kind::Bind { dir } => {
            if *dir {
                nix::unistd::mkdir(&path, Mode::from_bits_truncate(e.mode))
                    .map_err(|err| ctx(err.into(), "mkdir", &path))?;
            } else {
                File::create(&path).map_err(|err| ctx(err, "create", &path))?;
            }
            bind_from(&host.join(&e.rel), &path)
        }
    }
}

/// Mounts a `fstype` file system named `gpuslice-dev` with `opts` on `dev`
/// (nosuid).
fn mount_dev(fstype: &str, dev: &Path, opts: &str) -> io::Result<()> {
    mount(
        Some("gpuslice-dev"),
        dev,
        Some(fstype),
        MsFlags::MS_NOSUID,
        Some(opts),
    )
    .map_err(|e| ctx(e.into(), &format!("mount {fstype} on"), dev))
}

/// Bind-mounts `source` (with the mounts below it) onto `target`.
pub(crate) fn bind_from(source: &Path, target: &Path) -> io::Result<()> {
    mount(
        Some(source),
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

/// Attach the operation and path to an io error, so the one-line message
/// the user sees says what failed where.
pub(crate) fn ctx(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn survey(hidden: &[&str], nested: &[&str]) -> Survey {
        Survey {
            hidden: hidden.iter().map(PathBuf::from).collect(),
            nested: nested.iter().map(PathBuf::from).collect(),
        }
    }

    #[test]
    fn survey_round_trips_through_its_encoding() {
        for s in [
            survey(&[], &[]),
            survey(&["nvidia0", "sub/gpu alias"], &["pts", "shm"]),
            survey(&["nvidia-caps/nvidia-cap1"], &[]),
        ] {
            assert_eq!(Survey::decode(&s.encode()), Some(s));
        }
    }

    #[test]
    fn a_cut_or_escaping_survey_is_refused() {
        let full = survey(&["nvidia0", "nvidia1"], &["pts"]).encode();
        // Cut anywhere short of the end marker: refused, so the child
        // surveys /dev itself instead of hiding less.
        for cut in 0..full.len() {
            assert_eq!(Survey::decode(&full[..cut]), None, "cut at {cut}");
        }
        for bad in [
            &b"h../etc/shadow\0."[..],
            b"h/dev/nvidia0\0.",
            b"x0\0.",
            b"h\0.",
        ] {
            assert_eq!(Survey::decode(bad), None, "{bad:?}");
        }
    }
}
