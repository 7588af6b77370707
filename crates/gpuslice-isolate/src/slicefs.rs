//! The slice's own records, and the shim, at a fixed place in its mount
//! namespace; everything of other slices out of reach.
//!
//! Built in the child's fresh mount namespace (see [`crate::launcher`]):
//!
//! - a tmpfs at `dir` (`/run/gpuslice/slice`), read-only once set up,
//!   holding bind mounts of: the limits record (read-only: not even root
//!   in the slice can write it without CAP_SYS_ADMIN to unmount), the
//!   usage ledger (read-write, nosuid/nodev/noexec), the launcher's
//!   host-pid resolver socket ([`crate::hostpid`]; read-only: connecting
//!   needs no write access to the mount) and the shim (read-only);
//! - `/etc/ld.so.preload` covered, read-only, by a copy naming the shim
//!   first (then the host's own entries): the dynamic loader reads it for
//!   every program, whatever its environment (`env -i`, `env -u
//!   LD_PRELOAD`, `su`, `sudo`) and for setuid programs too;
//! - each of `read_only` (the boards' directory and its root-written share
//!   records) bound read-only over itself, and each of `writable` (the
//!   slice's own boards) read-write over itself in it;
//! - each of `masked` (the directory of every slice's records) covered by
//!   a read-only tmpfs, empty but for the directories of `visible` below it
//!   (the boards, when they are kept there), bound back in.
//!
//! Mount points are made by the caller on the host (as root) beforehand:
//! `dir`, and `/etc/ld.so.preload` (created empty if missing).

use crate::devfs::ctx;
use nix::mount::{mount, MsFlags};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The system's preload list.
pub const LD_SO_PRELOAD: &str = "/etc/ld.so.preload";

/// What the slice gets at its fixed place.
#[derive(Debug, Clone)]
pub struct SliceFiles {
    /// The fixed place (`/run/gpuslice/slice`); must exist on the host.
    pub dir: PathBuf,
    /// Host path of the root-written limits record.
    pub limits: PathBuf,
    /// Host path of the usage ledger.
    pub usage: PathBuf,
    /// Host path of the host-pid resolver's socket, which the launcher
    /// makes before the child starts ([`crate::hostpid::Resolver`]).
    pub hostpid: PathBuf,
    /// Host path of the shim.
    pub shim: PathBuf,
    /// Names of limits, usage, resolver and shim inside `dir`.
    pub names: [&'static str; 4],
    /// Host directories the slice must not see at all.
    pub masked: Vec<PathBuf>,
    /// Host directories the slice may read but not write.
    pub read_only: Vec<PathBuf>,
    /// Host directories that stay as they are even below a masked one.
    pub visible: Vec<PathBuf>,
    /// Host files bound read-write over themselves last (the slice's own
    /// GPU boards, in their read-only directory).
    pub writable: Vec<PathBuf>,
}

/// A bind mount a CDI spec asks for (`gpuslice run --cdi-device`), made
/// in the child's mount namespace exactly where and how the spec says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// Host path.
    pub source: PathBuf,
    /// Where the command sees it; must exist (the launcher creates
    /// nothing on the host for a spec).
    pub target: PathBuf,
    pub read_only: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

impl Bind {
    /// Makes the bind (in the child, inside its mount namespace).
    pub fn mount(&self) -> io::Result<()> {
        let mut flags = MsFlags::empty();
        for (on, f) in [
            (self.read_only, MsFlags::MS_RDONLY),
            (self.nosuid, MsFlags::MS_NOSUID),
            (self.nodev, MsFlags::MS_NODEV),
            (self.noexec, MsFlags::MS_NOEXEC),
        ] {
            if on {
                flags |= f;
            }
        }
        bind(&self.source, &self.target, flags)
    }
}

/// Makes the mount points the child needs, on the host, as root: the fixed
/// place and `/etc/ld.so.preload` (empty: the loader reads an empty list
/// as none).
pub fn prepare_host(files: &SliceFiles) -> io::Result<()> {
    fs::create_dir_all(&files.dir).map_err(|e| ctx(e, "create", &files.dir))?;
    let preload = Path::new(LD_SO_PRELOAD);
    if !preload.exists() {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(preload)
            .map_err(|e| ctx(e, "create", preload))?;
    }
    Ok(())
}

const HIDDEN: MsFlags = MsFlags::MS_NOSUID
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC);

/// Builds the slice's view (in the child, inside its mount namespace).
pub fn mount_slice_files(files: &SliceFiles) -> io::Result<()> {
    // What the host preloads, read before it is covered.
    let host_preload = fs::read_to_string(LD_SO_PRELOAD).unwrap_or_default();
    let dir = &files.dir;
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        HIDDEN,
        Some("mode=0755,size=64k"),
    )
    .map_err(|e| ctx(e.into(), "mount a tmpfs on", dir))?;
    let [limits, usage, hostpid, shim] = files.names.map(|n| dir.join(n));
    for p in [&limits, &usage, &hostpid, &shim] {
        fs::write(p, b"").map_err(|e| ctx(e, "create", p))?;
    }
    bind(&files.limits, &limits, HIDDEN | MsFlags::MS_RDONLY)?;
    bind(&files.usage, &usage, HIDDEN)?;
    bind(&files.hostpid, &hostpid, HIDDEN | MsFlags::MS_RDONLY)?;
    // Mapped executable by the loader: no noexec here.
    let shim_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_RDONLY;
    bind(&files.shim, &shim, shim_flags)?;
    let list = dir.join(".ld.so.preload");
    fs::write(&list, format!("{}\n{host_preload}", shim.display()))
        .map_err(|e| ctx(e, "write", &list))?;
    bind(&list, Path::new(LD_SO_PRELOAD), HIDDEN | MsFlags::MS_RDONLY)?;
    for r in &files.read_only {
        if r.is_dir() {
            bind(r, r, HIDDEN | MsFlags::MS_RDONLY)?;
        }
    }
    for m in &files.masked {
        if !dir.starts_with(m) && m.is_dir() {
            mask(m, &files.visible, dir)?;
        }
    }
    for w in &files.writable {
        if w.is_file() {
            bind(w, w, HIDDEN)?;
        }
    }
    // Nothing in the fixed place can be added, replaced or removed now.
    remount_read_only(dir)
}

fn remount_read_only(dir: &Path) -> io::Result<()> {
    remount(dir, MsFlags::MS_RDONLY | HIDDEN, "remount read-only")
}

/// Sets `flags` on the mount at `target`; `what` names the step in the
/// error.
fn remount(target: &Path, flags: MsFlags, what: &str) -> io::Result<()> {
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT | flags,
        None::<&str>,
    )
    .map_err(|e| ctx(e.into(), what, target))
}

/// Covers `m` with an empty tmpfs, read-only once the directories of
/// `visible` below `m` are bound back in (through a staging mount in
/// `staging`, taken before `m` is covered; recursive, so read-only
/// mounts below them stay read-only).
fn mask(m: &Path, visible: &[PathBuf], staging: &Path) -> io::Result<()> {
    let mut kept = Vec::new();
    for (i, v) in visible.iter().enumerate() {
        let Ok(rel) = v.strip_prefix(m) else { continue };
        if !v.is_dir() || rel.as_os_str().is_empty() {
            continue;
        }
        let stage = staging.join(format!(".keep-{i}"));
        fs::create_dir(&stage).map_err(|e| ctx(e, "create", &stage))?;
        crate::devfs::bind_from(v, &stage)?;
        kept.push((stage, m.join(rel)));
    }
    mount(
        Some("tmpfs"),
        m,
        Some("tmpfs"),
        HIDDEN,
        Some("mode=0755,size=4k"),
    )
    .map_err(|e| ctx(e.into(), "mask", m))?;
    for (stage, at) in &kept {
        fs::create_dir_all(at).map_err(|e| ctx(e, "create", at))?;
        crate::devfs::bind_from(stage, at)?;
    }
    remount_read_only(m)
}

/// Binds `source` on `target`, then sets `flags` on the new mount (a bind
/// takes its flags only from a remount).
fn bind(source: &Path, target: &Path, flags: MsFlags) -> io::Result<()> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| ctx(e.into(), "bind-mount onto", target))?;
    remount(target, MsFlags::MS_BIND | flags, "set the flags of")
}
