//! Root's word for the compute share of a `cdi generate` shared variant's
//! container, so that it takes turns on its GPU with every other slice
//! (docs/compute-share.md, "Where").
//!
//! A slice with root's limits counts, and passes the turn to, only slices
//! root vouched for: root made the slice's usage ledger, whose file is the
//! slice's key on the GPU's board, and recorded its share under
//! `<boards>/shares/<uuid>/<key>`. `run`, the device plugin and the DRA
//! driver make their slices' ledgers; a shared variant's container makes
//! its own, in a tmpfs of its own that does not exist when root writes
//! the spec. So its spec carries two more hooks:
//!
//! - `gpuslice cdi hook share set --limits RECORD --boards DIR`, a
//!   `createRuntime` hook: the runtime runs it as root once the
//!   container's mounts exist and before its process runs anything of the
//!   image. It makes the usage ledger in the container's slice tmpfs
//!   (reached through `/proc/<pid>/root`: before `pivot_root`, runc's
//!   moment, below the root file system the bundle names; after it, at
//!   the slice directory itself), from root's limits record, and records
//!   the share of every GPU the record gives one. What it recorded is kept
//!   in root's [`STATE_DIR`] by container id, with the container process's
//!   start time.
//! - `gpuslice cdi hook share clear`, a `poststop` hook, removes the share
//!   records. Each run of either first removes those of containers whose
//!   process is gone (a runtime that died before `poststop`).
//!
//! The tenant cannot vouch for itself: the records are root's, in a
//! directory the container sees read-only. Deleting the ledger root made
//! only leaves its own processes with a key nobody counts.

use crate::edits;
use crate::generate::Builder;
use crate::oci_state::{reap_records, ContainerState};
use crate::{CdiError, Result};
use container_device_interface::specs::config::Hook;
use gpuslice_core::atomic_file::write_atomic;
use gpuslice_ledger::limits::{self, SliceLimits, SLICE_DIR, USAGE_FILE};
use gpuslice_ledger::{board, procfs};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Below the host root: root's records of the shares vouched for, one
/// file per container (its id): `<pid> <start time>`, then one share
/// record's path a line.
pub const STATE_DIR: &str = "run/gpuslice/vouched";

/// tmpfs's `f_type` (`linux/magic.h`).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The hooks that vouch for the compute share of a container that makes
/// its own ledger: a `createRuntime` hook makes the ledger and records the
/// share on the boards in `boards` from root's limits record `record`
/// (host paths), a `poststop` hook removes the records. `gpuslice` and
/// `host_root` as for [`crate::memory_limit_hooks`].
pub fn share_hooks(
    gpuslice: &str,
    record: &str,
    boards: &str,
    host_root: Option<&Path>,
) -> Vec<Hook> {
    let hook =
        |stage, action: &[&str]| edits::gpuslice_hook(gpuslice, stage, "share", action, host_root);
    vec![
        hook(
            "createRuntime",
            &["set", "--limits", record, "--boards", boards],
        ),
        hook("poststop", &["clear"]),
    ]
}

impl Builder<'_> {
    /// [`share_hooks`] of a capped slice whose containers make their own
    /// ledger (a slice directory of their own: not a DRA claim's, which
    /// Prepare vouches for). None without the `gpuslice` binary to run or
    /// without boards.
    pub(crate) fn share_hooks(&self, record: &Path) -> Option<Vec<Hook>> {
        if self.opts.slice_dirs.is_some() {
            return None;
        }
        let gpuslice = self.host(self.opts.hook.as_ref()?);
        let boards = self.host(self.opts.boards.as_ref()?);
        let root = self.root.path();
        let host_root = (!self.opts.strip_host_root && root != Path::new("/")).then_some(root);
        Some(share_hooks(
            &gpuslice,
            &self.host(record),
            &boards,
            host_root,
        ))
    }
}

fn not_slice_dir(path: PathBuf) -> impl FnOnce(String) -> CdiError {
    move |why| CdiError::NotSliceDir { path, why }
}

/// What a hook did, for its log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// The share records made (or removed).
    Applied(Vec<PathBuf>),
    /// Nothing to do, and why.
    Skipped(String),
}

/// The `createRuntime` hook: vouches for the container's slice, whose
/// limits are root's record `record`, on the boards in `boards`; `host`
/// is the host root ([`STATE_DIR`] below it).
pub fn set(state_json: &str, record: &Path, boards: &Path, host: &Path) -> Result<Done> {
    let state = ContainerState::parse(state_json)?;
    let pid = state.pid.ok_or_else(|| {
        CdiError::input(
            "the container state",
            "no pid (a createRuntime hook has one)",
        )
    })?;
    let limits = limits::verify_and_read(record, false)?;
    if limits.devices.iter().all(|d| d.compute.is_none()) {
        return Ok(Done::Skipped("the slice has no compute share".into()));
    }
    let state_dir = host.join(STATE_DIR);
    reap(&state_dir);
    let start = procfs::stat(pid)
        .ok_or_else(|| CdiError::input(format!("the container's process {pid}"), "gone"))?
        .start_time;
    let dir = open_slice_dir(pid, state.bundle.as_deref())?;
    let records = vouch(&in_dir(&dir, USAGE_FILE), &limits, boards)?;
    if let Err(e) = write_state(&state_dir, &state.id, pid, start, &records) {
        remove_records(&records);
        return Err(e);
    }
    Ok(Done::Applied(records))
}

/// The `poststop` hook: removes the share records [`set`] made for this
/// container.
pub fn clear(state_json: &str, host: &Path) -> Result<Done> {
    let id = ContainerState::parse(state_json)?.id;
    let state_dir = host.join(STATE_DIR);
    reap(&state_dir);
    let file = state_dir.join(&id);
    let Some((_, records)) = read_state(&file) else {
        return Ok(Done::Skipped(
            "no share was recorded for this container".into(),
        ));
    };
    remove_records(&records);
    std::fs::remove_file(&file).map_err(CdiError::io(&file))?;
    Ok(Done::Applied(records))
}

/// The container's slice directory as the host reaches it, opened. Before
/// `pivot_root` (runc runs `createRuntime` hooks then) the process's root
/// is the runtime's own, and the container's mounts are below the root
/// file system its bundle names; after it, the process's root is the
/// container's. The slice directory is then resolved inside that root
/// (`RESOLVE_IN_ROOT`), as the runtime resolved it to mount the tmpfs: a
/// link the image holds there (`run -> /run/gpuslice/slices/<another>`)
/// resolves in the container's root, never in the host's, where it would
/// name a host directory root then wrote a ledger in. The directory must
/// be a tmpfs: the container's own, not a directory of the image.
fn open_slice_dir(pid: u32, bundle: Option<&Path>) -> Result<OwnedFd> {
    let proc_root = PathBuf::from(format!("/proc/{pid}/root"));
    let root = if same_file(&proc_root, Path::new("/proc/self/root"))? {
        let bundle = bundle.ok_or_else(|| {
            CdiError::input(
                proc_root.display().to_string(),
                "the container has not pivoted and its state names no bundle",
            )
        })?;
        let rootfs = bundle_rootfs(bundle)?;
        proc_root.join(rootfs.strip_prefix("/").unwrap_or(&rootfs))
    } else {
        proc_root
    };
    open_tmpfs_in_root(&root, SLICE_DIR.trim_start_matches('/'))
}

/// Opens `rel` resolved inside `root` (no magic link), and checks it is
/// a tmpfs.
fn open_tmpfs_in_root(root: &Path, rel: &str) -> Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let not = |why: String| not_slice_dir(root.join(rel))(why);
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let root_fd =
        rustix::fs::open(root, dir_flags, Mode::empty()).map_err(|e| not(e.to_string()))?;
    let fd = rustix::fs::openat2(
        &root_fd,
        rel,
        dir_flags,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| not(e.to_string()))?;
    let fs = rustix::fs::fstatfs(&fd).map_err(|e| not(e.to_string()))?;
    if fs.f_type as i64 != TMPFS_MAGIC {
        return Err(not(format!("file system type {:#x}, not tmpfs", fs.f_type)));
    }
    Ok(fd)
}

/// A path naming the file `name` in the directory `dir` is open on.
fn in_dir(dir: &OwnedFd, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
}

fn same_file(a: &Path, b: &Path) -> Result<bool> {
    let (ma, mb) = (
        std::fs::metadata(a).map_err(CdiError::io(a))?,
        std::fs::metadata(b).map_err(CdiError::io(b))?,
    );
    Ok((ma.dev(), ma.ino()) == (mb.dev(), mb.ino()))
}

/// The root file system of an OCI bundle: `root.path` of its
/// `config.json`, relative to the bundle unless absolute.
fn bundle_rootfs(bundle: &Path) -> Result<PathBuf> {
    let config = bundle.join("config.json");
    let bad = |why: String| CdiError::input(config.display().to_string(), why);
    let text = std::fs::read_to_string(&config).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let root = v["root"]["path"]
        .as_str()
        .ok_or_else(|| bad("no root.path".into()))?;
    Ok(bundle.join(root))
}

/// Makes the slice's usage ledger at `usage` and records its shares; on
/// an error nothing is left recorded.
fn vouch(usage: &Path, limits: &SliceLimits, boards: &Path) -> Result<Vec<PathBuf>> {
    limits
        .create_usage(usage)
        .map_err(|source| CdiError::Ledger {
            path: usage.to_path_buf(),
            source,
        })?;
    board::publish_shares(boards, usage, limits).map_err(CdiError::io(boards))
}

fn write_state(dir: &Path, id: &str, pid: u32, start: u64, records: &[PathBuf]) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(CdiError::io(dir))?;
    let mut text = format!("{pid} {start}\n");
    for r in records {
        text.push_str(&format!("{}\n", r.display()));
    }
    Ok(write_atomic(&dir.join(id), text.as_bytes(), 0o600)?)
}

/// The container process (pid, start time) and the records of a state
/// file.
fn read_state(file: &Path) -> Option<((u32, u64), Vec<PathBuf>)> {
    let text = std::fs::read_to_string(file).ok()?;
    let mut lines = text.lines();
    let (pid, start) = lines.next()?.split_once(' ')?;
    let who = (pid.parse().ok()?, start.parse().ok()?);
    Some((who, lines.map(PathBuf::from).collect()))
}

fn remove_records(records: &[PathBuf]) {
    for r in records {
        let _ = std::fs::remove_file(r);
    }
}

/// Removes the share records of containers whose process is gone (or is
/// another process now) without their `poststop` hook having run.
fn reap(state_dir: &Path) {
    reap_records(state_dir, read_state, |((pid, start), records)| {
        if procfs::stat(pid).is_some_and(|s| s.start_time == start) {
            return false;
        }
        remove_records(&records);
        true
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_s_root_is_relative_to_it_unless_absolute() {
        let b = tempfile::tempdir().unwrap();
        let config = b.path().join("config.json");
        std::fs::write(&config, r#"{"root":{"path":"rootfs"}}"#).unwrap();
        assert_eq!(bundle_rootfs(b.path()).unwrap(), b.path().join("rootfs"));
        std::fs::write(&config, r#"{"root":{"path":"/var/x/merged"}}"#).unwrap();
        assert_eq!(bundle_rootfs(b.path()).unwrap(), Path::new("/var/x/merged"));
        std::fs::write(&config, r#"{"root":{}}"#).unwrap();
        assert!(bundle_rootfs(b.path()).is_err());
    }

    /// An image's link at the slice directory resolves inside the
    /// container's root: never to the host directory it names.
    #[test]
    fn a_link_in_the_image_never_reaches_a_host_directory() {
        let host_dir = tempfile::tempdir_in("/dev/shm").unwrap();
        // Not a tmpfs, as an image's layers are not (/tmp may be one).
        let rootfs =
            tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
                .unwrap();
        let run = rootfs.path().join("run/gpuslice");
        std::fs::create_dir_all(&run).unwrap();
        std::os::unix::fs::symlink(host_dir.path(), run.join("slice")).unwrap();
        let rel = SLICE_DIR.trim_start_matches('/');
        // Inside the root the link names nothing: refused.
        assert!(open_tmpfs_in_root(rootfs.path(), rel).is_err());
        // Made inside the root too (as a runtime would, to mount there): a
        // directory of the image, not a tmpfs, still refused.
        let inside = rootfs
            .path()
            .join(host_dir.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside).unwrap();
        let e = open_tmpfs_in_root(rootfs.path(), rel).unwrap_err();
        assert!(e.to_string().contains("not tmpfs"), "{e}");
        // The host's own tmpfs, reached directly, is one (the check above
        // is what refused the image's directory).
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let fd = open_tmpfs_in_root(
            Path::new("/"),
            shm.path().to_str().unwrap().trim_start_matches('/'),
        );
        assert!(fd.is_ok(), "{fd:?}");
    }

    #[test]
    fn records_of_a_container_whose_process_is_gone_are_reaped() {
        let d = tempfile::tempdir().unwrap();
        let state = d.path().join("state");
        let record = |n: &str| {
            let r = d.path().join(n);
            std::fs::write(&r, "2500\n").unwrap();
            r
        };
        let (live, dead) = (record("live"), record("dead"));
        let me = std::process::id();
        let start = procfs::stat(me).unwrap().start_time;
        write_state(&state, "running", me, start, std::slice::from_ref(&live)).unwrap();
        // The same pid with another start time: a process that came after.
        write_state(&state, "ended", me, start + 1, std::slice::from_ref(&dead)).unwrap();
        reap(&state);
        assert!(live.exists() && state.join("running").exists());
        assert!(!dead.exists() && !state.join("ended").exists());
    }
}
