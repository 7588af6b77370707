//! The ledger directories of shared replicas: Allocate prepares
//! `<ledgerDir>/<slice>/` ([`prepare`]); a periodic sweep ([`sweep`])
//! removes the directory once the pod that holds the replica is gone.
//!
//! A directory is removed only when all of these hold:
//! - the kubelet's PodResources `List` names no container holding a device
//!   whose slice id is the directory's name (the caller passes that set; no
//!   answer from the kubelet, no sweep);
//! - Allocate did not prepare it within the grace period (the kubelet
//!   records an allocation only after Allocate returns);
//! - no process may still use it ([`in_use`]): every process slot of every
//!   ledger in it belongs to a process that is gone.
//!
//! Processes of a replica live in their container's pid namespace. Their
//! slots are checked against the host's processes (NSpid and start time),
//! which needs the plugin in the host's pid namespace (`hostPID: true`);
//! elsewhere such a slot counts as live, and the directory stays.
//!
//! Allocate and the sweep take one lock, so a directory is never removed
//! between Allocate preparing it and Allocate returning. A directory left
//! from an earlier pod of the same replica (its id is reused) is emptied
//! by [`prepare`] when nothing uses it, so the new pod never inherits the
//! old pod's counters.
//!
//! The tenant writes in its directory: every path in it is opened without
//! following symbolic links, only regular files are read as ledgers (a
//! device node is never opened), a ledger is read from a private copy, and
//! `remove_dir_all` does not follow links. What it can write there is
//! bounded: each directory is a tmpfs of its own (`crate::slicedir`).

use gpuslice_ledger::procfs::{self, Liveness};
use gpuslice_ledger::{Ledger, ProcessState};
use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};
use thiserror::Error;

/// Names of the directories the plugin makes (see `resources::slice_id`).
pub const SLICE_PREFIX: &str = "k8s-";
/// Inode of the host's (initial) pid namespace: PROC_PID_INIT_INO in the kernel.
const INIT_PID_NS: u64 = 0xEFFF_FFFC;
/// A ledger that does not open may be one a process is creating right now
/// for this long (creation takes microseconds).
const CREATING: Duration = Duration::from_secs(10);

/// Allocate and the sweep, one at a time (over every ledger directory).
static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Ledger(gpuslice_ledger::Error),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    pub removed: Vec<String>,
    /// The pod is gone but a process may still use it.
    pub in_use: Vec<String>,
    pub errors: Vec<String>,
}

/// Makes `dir` ready for a new allocation: a leftover that no live
/// process uses is removed first; the directory's time is set to now (the
/// sweep's grace).
///
/// The kubelet allocates a replica only when no running pod holds it, so
/// nothing may be creating a ledger there now: a ledger that does not open
/// (a pod filled it with garbage and exited), or whose slots are all
/// garbage or transient, is the previous pod's and is replaced, however
/// young (it once made the next pod's CUDA fail closed: a denial of
/// service across tenants). Only a live process's slot keeps it.
///
/// A fresh directory is a bounded tmpfs of its own, root's and private
/// (`crate::slicedir`): the pod is given files of it, and its usage ledger
/// cannot grow past the tmpfs.
pub fn prepare(dir: &Path, boards: &Path) -> Result<(), Error> {
    let _held = lock();
    if dir.symlink_metadata().is_ok() && in_use_by_live_process(dir) {
        return fs::File::open(dir)
            .and_then(|f| f.set_modified(SystemTime::now()))
            .map_err(io_err(dir));
    }
    withdraw_shares(dir, boards);
    crate::slicedir::make(dir, 0o700).map_err(io_err(dir))
}

/// The slice directories in `ledger_dir`, listed before the kubelet is
/// asked which pods hold which: a directory made after that answer (an
/// Allocate in between) is not in it, so a sweep cannot take it for one
/// no pod holds.
pub fn listed(ledger_dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(ledger_dir) else {
        return Vec::new(); // nothing allocated yet
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(SLICE_PREFIX))
        .collect()
}

/// The replicas root's enforcer watches ([`crate::enforcer`]): every
/// slice directory in `ledger_dir` with root's limits record (a record
/// that does not verify is left out: the directory is not a replica of
/// this plugin's, or is being made).
/// Their pods' processes that can escape any cap are judged per `escapes`.
pub fn watched(
    ledger_dir: &Path,
    escapes: gpuslice_ledger::enforcer::Escapes,
) -> Vec<gpuslice_ledger::enforcer::WatchedSlice> {
    listed(ledger_dir)
        .into_iter()
        .filter_map(|name| {
            let records = gpuslice_ledger::limits::RecordPaths::under(&ledger_dir.join(name));
            let limits = gpuslice_ledger::limits::verify_and_read(&records.limits, false).ok()?;
            Some(gpuslice_ledger::enforcer::WatchedSlice {
                limits,
                record: Some(records.limits),
                usage: records.usage,
                records: records.dir,
                escapes: Some(escapes),
            })
        })
        .collect()
}

/// Removes the directories of `listed` (see [`listed`]) in `ledger_dir`
/// that no pod holds (`held`: the slice ids of the devices the kubelet
/// lists), older than `grace`, that no process uses.
pub fn sweep(
    ledger_dir: &Path,
    boards: &Path,
    listed: Vec<String>,
    held: &HashSet<String>,
    grace: Duration,
) -> Swept {
    let mut out = Swept::default();
    let mut names: Vec<String> = listed.into_iter().filter(|n| !held.contains(n)).collect();
    names.sort();
    for name in names {
        let dir = ledger_dir.join(&name);
        let _held = lock();
        if younger_than(dir.symlink_metadata(), grace) {
            continue;
        }
        if in_use(&dir) {
            out.in_use.push(name);
            continue;
        }
        withdraw_shares(&dir, boards);
        match crate::slicedir::remove(&dir) {
            Ok(()) => out.removed.push(name),
            Err(e) => out.errors.push(format!("{}: {e}", dir.display())),
        }
    }
    out
}

/// The share records root published on the GPUs' boards (`boards`) for
/// the replica of directory `dir` (keyed by its usage ledger): withdrawn
/// before the directory goes.
fn withdraw_shares(dir: &Path, boards: &Path) {
    gpuslice_ledger::board::withdraw_shares_of(
        boards,
        &dir.join(gpuslice_ledger::limits::USAGE_FILE),
    );
}

/// Whether a process may still use the ledger directory `dir`: a ledger in
/// it has a process slot whose process is alive, or may be (being claimed,
/// or in a pid namespace we cannot see into), or a ledger is being created.
/// Conservative: what cannot be read counts as in use.
pub fn in_use(dir: &Path) -> bool {
    uses(dir, true)
}

/// Whether a live process has a slot in a ledger of `dir` (what Allocate
/// asks: see [`prepare`]).
fn in_use_by_live_process(dir: &Path) -> bool {
    uses(dir, false)
}

/// [`in_use`] when `in_doubt` (a young ledger that does not open, a
/// transient slot, count as used), else only live processes count.
fn uses(dir: &Path, in_doubt: bool) -> bool {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return false,
        Err(_) => return true,
    };
    let mut host = None;
    for e in entries.flatten() {
        let path = e.path();
        // A replica's usage ledger (`usage`, beside root's `limits`), or a
        // ledger an older plugin's shim made (`*.ledger`).
        let usage = path
            .file_name()
            .is_some_and(|n| n == gpuslice_ledger::limits::USAGE_FILE);
        if !usage && path.extension().is_none_or(|x| x != "ledger") {
            continue;
        }
        if !e.file_type().is_ok_and(|t| t.is_file()) {
            continue; // no shim's ledger (a link or node is never opened)
        }
        // Ledger::open: no link followed, nothing but a regular file opened,
        // and a truncation under the mapping reads as zeros (no SIGBUS).
        let ledger = match Ledger::open(&path) {
            Ok(l) => l,
            Err(_) if in_doubt && younger_than(e.metadata(), CREATING) => return true,
            Err(_) => continue,
        };
        for p in ledger.snapshot().processes {
            let live = match p.state {
                ProcessState::Live => procfs::liveness(p.pid, p.start_time) == Liveness::Alive,
                ProcessState::Transient => in_doubt,
                ProcessState::OtherNamespace => host
                    .get_or_insert_with(HostProcesses::scan)
                    .may_be_alive(p.pid, p.start_time),
            };
            if live {
                return true;
            }
        }
    }
    false
}

/// Whether a file was modified less than `age` ago (or its time is unknown).
fn younger_than(meta: io::Result<fs::Metadata>, age: Duration) -> bool {
    meta.and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_none_or(|a| a < age)
}

/// The host's processes as (pid in their innermost namespace, start time).
struct HostProcesses {
    /// None: not in the host's pid namespace, so not every process is seen.
    seen: Option<HashSet<(u32, u64)>>,
}

impl HostProcesses {
    fn scan() -> Self {
        if procfs::own_pid_namespace() != INIT_PID_NS {
            return HostProcesses { seen: None };
        }
        let mut seen = HashSet::new();
        for pid in procfs::pids() {
            let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
                continue;
            };
            let inner = procfs::innermost_pid(&status);
            if let (Some(inner), Some(st)) = (inner, procfs::stat(pid)) {
                if st.state != 'Z' && st.state != 'X' {
                    seen.insert((inner, st.start_time));
                }
            }
        }
        HostProcesses { seen: Some(seen) }
    }

    fn may_be_alive(&self, pid: u32, start_time: u64) -> bool {
        self.seen
            .as_ref()
            .is_none_or(|s| s.contains(&(pid, start_time)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_ledger::DeviceSpec;

    fn ledger_in(dir: &Path) -> Ledger {
        fs::create_dir_all(dir).unwrap();
        Ledger::create(
            &dir.join("k8s-x.ledger"),
            "k8s-x",
            &[DeviceSpec {
                uuid: "GPU-x".into(),
                cap: 1 << 30,
            }],
        )
        .unwrap()
    }

    /// A sweep of `dir` (its own boards' directory) past a minute's grace.
    fn sweep_aged(dir: &Path, held: &HashSet<String>) -> Swept {
        sweep(dir, dir, listed(dir), held, Duration::from_secs(60))
    }

    fn age(dir: &Path, secs: u64) {
        let t = SystemTime::now() - Duration::from_secs(secs);
        fs::File::open(dir).unwrap().set_modified(t).unwrap();
    }

    #[test]
    fn a_live_slot_keeps_the_directory_and_a_detached_one_does_not() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("k8s-x");
        let l = ledger_in(&dir);
        let slot = l.attach().unwrap();
        age(&dir, 120);
        let none = HashSet::new();
        let s = sweep_aged(t.path(), &none);
        assert_eq!(s.in_use, vec!["k8s-x".to_string()]);
        assert!(dir.is_dir());
        l.detach(slot);
        let s = sweep_aged(t.path(), &none);
        assert_eq!(s.removed, vec!["k8s-x".to_string()]);
        assert!(!dir.exists());
    }

    /// A swept replica's share records go with it: they would otherwise
    /// pile up in the boards' directory, one per replica that ever ran.
    #[test]
    fn the_sweep_withdraws_the_replica_s_share_records() {
        let t = tempfile::tempdir().unwrap();
        let boards = t.path().join("boards");
        gpuslice_ledger::board::prepare_dir(&boards).unwrap();
        let dir = t.path().join("k8s-x");
        fs::create_dir_all(&dir).unwrap();
        let usage = dir.join(gpuslice_ledger::limits::USAGE_FILE);
        drop(
            Ledger::create(
                &usage,
                "k8s-x",
                &[DeviceSpec {
                    uuid: "GPU-x".into(),
                    cap: 1 << 30,
                }],
            )
            .unwrap(),
        );
        let key = gpuslice_ledger::board::ledger_key(&usage).unwrap();
        let record = gpuslice_ledger::board::publish_share(&boards, "GPU-x", key, 3000).unwrap();
        let other = gpuslice_ledger::board::publish_share(&boards, "GPU-x", key ^ 1, 7000).unwrap();
        age(&dir, 120);
        let s = sweep(
            t.path(),
            &boards,
            listed(t.path()),
            &HashSet::new(),
            Duration::from_secs(60),
        );
        assert_eq!(s.removed, vec!["k8s-x".to_string()]);
        assert!(!record.exists(), "the swept replica's share record stayed");
        assert!(other.exists(), "another slice's record is not touched");
    }

    #[test]
    fn a_directory_made_after_the_listing_stays_whatever_the_answer() {
        let t = tempfile::tempdir().unwrap();
        let before = listed(t.path());
        // An Allocate between the listing and the kubelet's answer.
        let dir = t.path().join("k8s-new");
        fs::create_dir_all(&dir).unwrap();
        age(&dir, 120);
        let s = sweep(
            t.path(),
            t.path(),
            before,
            &HashSet::new(),
            Duration::from_secs(60),
        );
        assert!(s.removed.is_empty() && dir.is_dir(), "{s:?}");
        let s = sweep_aged(t.path(), &HashSet::new());
        assert_eq!(s.removed, vec!["k8s-new".to_string()]);
    }

    #[test]
    fn held_young_and_foreign_directories_stay() {
        let t = tempfile::tempdir().unwrap();
        for n in ["k8s-held", "k8s-young", "not-ours"] {
            fs::create_dir_all(t.path().join(n)).unwrap();
            age(&t.path().join(n), if n == "k8s-young" { 1 } else { 120 });
        }
        // A link named like ours is not followed nor removed.
        let target = t.path().join("not-ours");
        std::os::unix::fs::symlink(&target, t.path().join("k8s-link")).unwrap();
        let held: HashSet<String> = ["k8s-held".to_string()].into();
        let s = sweep_aged(t.path(), &held);
        assert_eq!(s, Swept::default());
        for n in ["k8s-held", "k8s-young", "not-ours", "k8s-link"] {
            assert!(t.path().join(n).symlink_metadata().is_ok(), "{n}");
        }
    }

    #[test]
    fn links_and_junk_in_a_tenant_directory_are_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("keep"), "x").unwrap();
        let dir = t.path().join("k8s-evil");
        fs::create_dir_all(&dir).unwrap();
        // A ledger name that is a link to a live ledger elsewhere, a FIFO,
        // an old garbage file, and a link to a directory.
        let live = ledger_in(&outside);
        let _slot = live.attach().unwrap();
        std::os::unix::fs::symlink(outside.join("k8s-x.ledger"), dir.join("a.ledger")).unwrap();
        nix_mkfifo(&dir.join("b.ledger"));
        fs::write(dir.join("c.ledger"), "junk").unwrap();
        age_file(&dir.join("c.ledger"), 120);
        std::os::unix::fs::symlink(&outside, dir.join("d")).unwrap();
        assert!(!in_use(&dir));
        age(&dir, 120);
        let s = sweep_aged(t.path(), &HashSet::new());
        assert_eq!(s.removed, vec!["k8s-evil".to_string()]);
        assert!(outside.join("keep").exists() && outside.join("k8s-x.ledger").exists());
        // A garbage ledger written just now may be one being created.
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("c.ledger"), "").unwrap();
        assert!(in_use(&dir));
    }

    fn nix_mkfifo(p: &Path) {
        let st = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap();
        assert!(st.success());
    }

    fn age_file(p: &Path, secs: u64) {
        let t = SystemTime::now() - Duration::from_secs(secs);
        fs::OpenOptions::new()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    /// Unmounts what [`prepare`] mounted, pass or fail.
    struct Unmounting<'a>(&'a Path);

    impl Drop for Unmounting<'_> {
        fn drop(&mut self) {
            let _ = crate::slicedir::remove(self.0);
        }
    }

    /// A pod writes into its replica's usage ledger through a bind mount:
    /// it cannot grow it past the directory's tmpfs (the host's /run is
    /// RAM), and what it wrote is not the next pod's.
    #[test]
    fn a_replica_cannot_grow_its_ledger_past_the_bound() {
        use std::io::Write;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("k8s-x");
        let _u = Unmounting(&dir);
        prepare(&dir, t.path()).unwrap();
        let mut f = fs::File::create(dir.join("usage")).unwrap();
        let chunk = vec![0x5au8; 64 << 10];
        let mut written = 0u64;
        let err = loop {
            match f.write_all(&chunk) {
                Ok(()) => written += chunk.len() as u64,
                Err(e) => break e,
            }
            assert!(written <= 1 << 30, "1 GiB written into a slice directory");
        };
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        assert!(written <= crate::slicedir::SIZE_BYTES, "{written}");
        drop(f);
        // The next Allocate of the replica gets a fresh, empty one.
        prepare(&dir, t.path()).unwrap();
        assert!(!dir.join("usage").exists());
    }

    #[test]
    fn prepare_empties_a_leftover_nothing_uses_and_keeps_one_in_use() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("k8s-x");
        let _u = Unmounting(&dir);
        drop(ledger_in(&dir));
        fs::write(dir.join("old"), "x").unwrap();
        age(&dir, 120);
        prepare(&dir, t.path()).unwrap();
        assert!(dir.is_dir() && !dir.join("old").exists());
        let age_now = dir
            .metadata()
            .unwrap()
            .modified()
            .unwrap()
            .elapsed()
            .unwrap();
        assert!(age_now < Duration::from_secs(5));
        let l = ledger_in(&dir);
        let _slot = l.attach().unwrap();
        prepare(&dir, t.path()).unwrap();
        assert!(dir.join("k8s-x.ledger").exists(), "in use: kept");
    }

    /// A pod that fills its replica's ledger with garbage and exits does
    /// not poison the next pod on that replica: Allocate replaces it,
    /// however young (the sweep still waits for it).
    #[test]
    fn a_poisoned_ledger_is_not_inherited() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("k8s-x");
        let _u = Unmounting(&dir);
        let size = {
            let l = ledger_in(&dir);
            drop(l);
            fs::metadata(dir.join("k8s-x.ledger")).unwrap().len()
        };
        // Garbage of a ledger's size, written just now.
        let garbage: Vec<u8> = (0..size).map(|i| (i * 7919 % 251) as u8 | 1).collect();
        fs::write(dir.join("usage"), &garbage).unwrap();
        fs::write(dir.join("k8s-x.ledger"), &garbage).unwrap();
        assert!(
            in_use(&dir),
            "the sweep gives a young unreadable ledger time"
        );
        prepare(&dir, t.path()).unwrap();
        assert!(
            !dir.join("usage").exists(),
            "the poisoned ledger was inherited"
        );
        assert!(!dir.join("k8s-x.ledger").exists());
    }
}
