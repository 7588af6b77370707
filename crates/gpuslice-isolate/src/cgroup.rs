//! The slice's device cgroup (isolation layer 3), on cgroup v1 or v2.
//!
//! Every slice gets a fresh cgroup `<root>/gpuslice/<slice id>`, where root
//! is the `devices` hierarchy (v1) or the cgroup2 mount (v2). The policy is
//! applied before any process joins: v1 writes `devices.deny` rules, v2
//! attaches the BPF device filter from [`crate::bpf`]. The launcher opens
//! `cgroup.procs` ([`SliceCgroup::open_procs`]) before it forks, the child
//! moves itself in with [`enter_self`] before `exec`, and the launcher
//! removes the cgroup once the child has been reaped.
//!
//! Slice ids are `<launcher pid>-<unique suffix>` ([`new_slice_id`]), so that
//! [`reap_stale`] can remove, at the next start, the cgroups of a launcher
//! that was killed before it could remove its own.
//!
//! # What cgroup v1 cannot express
//!
//! A v1 device cgroup below the (allow-all) root holds a list of denied
//! devices, each one minor or all minors (`*`) of a major; it has no
//! "all minors of this major except these". So for a `deny_unlisted` rule
//! ([`gpuslice_core::MajorRule`]) v1 denies the minors the policy lists as
//! denied, and the whole major (`c MAJOR:* rwm`) only when no minor of it is
//! allowed, which is then exact. When some minors are allowed, the minors
//! the policy does not list (a node that did not exist at discovery) stay
//! reachable under v1; [`v1_inexact_majors`] names those majors. The
//! private `/dev` (layer 1) does not create such nodes and `--strict` drops
//! `CAP_MKNOD`, which covers most of that gap; the v2 filter has none.
//!
//! The v1 cgroup is created below the root of the `devices` hierarchy, not
//! below the launcher's own cgroup, so a child does not keep the device
//! restrictions of the cgroup the launcher runs in (moving a process to the
//! root's subtree takes root anyway). On v2 the filters of every ancestor
//! still apply (`BPF_F_ALLOW_MULTI`).

use crate::bpf;
use gpuslice_core::DevicePolicy;
use gpuslice_ledger::limits::{valid_slice_id, MAX_SLICE_ID_LEN};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Name of the directory below the cgroup root that holds every slice.
pub const SLICES_DIR: &str = "gpuslice";

use crate::mountinfo::MOUNTINFO;

/// Which cgroup version to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    V1,
    V2,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        })
    }
}

impl FromStr for Version {
    type Err = String;

    /// `v1`, `1`, `v2` or `2`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "v1" | "1" => Ok(Version::V1),
            "v2" | "2" => Ok(Version::V2),
            _ => Err(format!("unknown cgroup version {s:?}: expected v1 or v2")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "cannot read {path}: {source}; gpuslice needs /proc mounted to find the cgroup hierarchies"
    )]
    Mountinfo { path: PathBuf, source: io::Error },
    #[error("no {wanted} found in /proc/self/mountinfo ({found}); mount one, or choose the other cgroup version")]
    Unavailable { wanted: String, found: String },
    #[error("invalid slice id {id:?}: use `<launcher pid>-<suffix>`, 1 to {MAX_SLICE_ID_LEN} letters, digits, '-', '_' and '.', not starting with '.'")]
    InvalidSliceId { id: String },
    #[error("cannot create {path}: it already exists; each slice needs a unique slice id")]
    Exists { path: PathBuf },
    #[error("cannot create {path}: {source}; gpuslice run needs a writable cgroup (run as root, or delegate a cgroup)")]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot write `{rule}` to {path}: {source}; the v1 devices controller refused the rule (needs root with CAP_SYS_ADMIN)")]
    DeviceRule {
        path: PathBuf,
        rule: String,
        source: io::Error,
    },
    #[error("cannot load the device filter for {path}: {source}; cgroup v2 device control needs root (CAP_BPF and CAP_SYS_ADMIN) and a kernel with CONFIG_CGROUP_BPF")]
    BpfLoad { path: PathBuf, source: io::Error },
    #[error("cannot attach the device filter to {path}: {source}; needs root, and no ancestor cgroup may hold a device program attached without BPF_F_ALLOW_MULTI")]
    BpfAttach { path: PathBuf, source: io::Error },
    #[error("cannot move pid {pid} into {path}: {source}; needs root (write access to cgroup.procs of the common ancestor too)")]
    AddPid {
        path: PathBuf,
        pid: u32,
        source: io::Error,
    },
    #[error("cannot remove {path}: {source}; processes may still be in it (see its cgroup.procs), or remove it by hand with rmdir")]
    Remove { path: PathBuf, source: io::Error },
}

/// Where slice cgroups are made, and how the device policy is applied there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupDriver {
    /// A cgroup v1 hierarchy with the `devices` controller, mounted at `devices_root`.
    V1 { devices_root: PathBuf },
    /// A cgroup2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid hosts).
    V2 { root: PathBuf },
}

impl CgroupDriver {
    /// Finds the cgroup hierarchies in `/proc/self/mountinfo`. Without a
    /// preference, v2 when a cgroup2 mount exists, else v1; a preference
    /// that is not available is an error.
    pub fn detect(preference: Option<Version>) -> Result<CgroupDriver, CgroupError> {
        // The common case first: a cgroup2 mount at /sys/fs/cgroup (a
        // v2-only host) is what the mountinfo scan picks too. One statfs
        // instead of reading every mount: hundreds on a Kubernetes node, on
        // the start-up path of every `gpuslice run`.
        // Then a hybrid host's cgroup2 at /sys/fs/cgroup/unified, which the
        // scan would pick next (its second usual place).
        if preference != Some(Version::V1) {
            let is_v2 = |p: &Path| {
                nix::sys::statfs::statfs(p)
                    .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
            };
            let unified = Path::new("/sys/fs/cgroup");
            if let Some(root) = [unified, &unified.join("unified")]
                .into_iter()
                .find(|p| is_v2(p))
            {
                return Ok(CgroupDriver::V2 {
                    root: root.to_path_buf(),
                });
            }
        }
        let text = fs::read_to_string(MOUNTINFO).map_err(|source| CgroupError::Mountinfo {
            path: MOUNTINFO.into(),
            source,
        })?;
        Self::from_mountinfo(&text, preference)
    }

    /// [`detect`](Self::detect) from the text of a mountinfo file.
    pub fn from_mountinfo(
        mountinfo: &str,
        preference: Option<Version>,
    ) -> Result<CgroupDriver, CgroupError> {
        let mut v2 = Vec::new();
        let mut v1 = Vec::new();
        for m in crate::mountinfo::mounts(mountinfo) {
            match m.fstype {
                "cgroup2" => v2.push(m.mount_point),
                "cgroup" if m.super_opts.split(',').any(|o| o == "devices") => {
                    v1.push(m.mount_point)
                }
                _ => {}
            }
        }
        let pick = |mut found: Vec<PathBuf>, usual: &[&str]| {
            let at = usual
                .iter()
                .find_map(|u| found.iter().position(|p| p == Path::new(u)))
                .unwrap_or(0);
            (!found.is_empty()).then(|| found.swap_remove(at))
        };
        let v2 = pick(v2, &["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]);
        let v1 = pick(v1, &["/sys/fs/cgroup/devices"]);
        let found = match (&v1, &v2) {
            (None, None) => "no cgroup mounts with device control".to_string(),
            (Some(p), None) => format!("only a v1 devices hierarchy at {}", p.display()),
            (None, Some(p)) => format!("only cgroup2 at {}", p.display()),
            (Some(a), Some(b)) => {
                format!("v1 devices at {}, cgroup2 at {}", a.display(), b.display())
            }
        };
        let v1 = v1.map(|devices_root| CgroupDriver::V1 { devices_root });
        let v2 = v2.map(|root| CgroupDriver::V2 { root });
        let (chosen, wanted) = match preference {
            Some(Version::V1) => (v1, "cgroup v1 hierarchy with the devices controller"),
            Some(Version::V2) => (v2, "cgroup2 mount"),
            None => (v2.or(v1), "cgroup2 mount or cgroup v1 devices hierarchy"),
        };
        chosen.ok_or_else(|| CgroupError::Unavailable {
            wanted: wanted.into(),
            found,
        })
    }

    pub fn version(&self) -> Version {
        match self {
            CgroupDriver::V1 { .. } => Version::V1,
            CgroupDriver::V2 { .. } => Version::V2,
        }
    }

    /// The hierarchy's mount point.
    pub fn root(&self) -> &Path {
        match self {
            CgroupDriver::V1 { devices_root } => devices_root,
            CgroupDriver::V2 { root } => root,
        }
    }

    /// `<root>/gpuslice`, the parent of every slice cgroup.
    pub fn slices_dir(&self) -> PathBuf {
        self.root().join(SLICES_DIR)
    }
}

/// The `devices.deny` lines (`c MAJOR:MINOR rwm`, or `c MAJOR:* rwm`) that
/// apply `policy` on cgroup v1, as far as v1 can (module docs).
pub fn v1_deny_rules(policy: &DevicePolicy) -> Vec<String> {
    let mut lines = Vec::new();
    for rule in &policy.rules {
        let none_allowed = !rule.allowed.iter().any(|m| !rule.denied.contains(m));
        if rule.deny_unlisted && none_allowed {
            lines.push(format!("c {}:* rwm", rule.major));
            continue;
        }
        let mut denied = rule.denied.clone();
        denied.sort_unstable();
        for minor in denied {
            lines.push(format!("c {}:{minor} rwm", rule.major));
        }
    }
    let mut seen = std::collections::HashSet::new();
    lines.retain(|l| seen.insert(l.clone()));
    lines
}

/// Majors whose unlisted minors [`v1_deny_rules`] leaves reachable although
/// the policy denies them (`deny_unlisted` rules with allowed minors).
pub fn v1_inexact_majors(policy: &DevicePolicy) -> Vec<u32> {
    let mut majors: Vec<u32> = policy
        .rules
        .iter()
        .filter(|r| r.deny_unlisted && r.allowed.iter().any(|m| !r.denied.contains(m)))
        .map(|r| r.major)
        .collect();
    majors.sort_unstable();
    majors.dedup();
    majors
}

/// True when the policy can deny some char device.
fn can_deny(policy: &DevicePolicy) -> bool {
    policy
        .rules
        .iter()
        .any(|r| r.deny_unlisted || !r.denied.is_empty())
}

/// A slice id for this process: `<pid>-<suffix>`, unique within the process
/// and very likely across reuses of its pid.
pub fn new_slice_id() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mix = (t.as_secs() << 20) ^ u64::from(t.subsec_micros());
    format!(
        "{}-{:x}{:02x}",
        std::process::id(),
        mix & 0xff_ffff_ffff,
        n & 0xff
    )
}

/// The cgroup of one running slice. Removed by [`remove`](Self::remove), or
/// on drop as a best effort.
#[derive(Debug)]
pub struct SliceCgroup {
    path: PathBuf,
    version: Version,
    removed: bool,
}

impl SliceCgroup {
    /// Makes `<root>/gpuslice/<slice_id>` (and `<root>/gpuslice` when
    /// missing) and applies `policy` to it ([`SliceCgroup::apply`]). On
    /// failure nothing it made is left behind (the shared parent stays).
    pub fn create(
        driver: &CgroupDriver,
        slice_id: &str,
        policy: &DevicePolicy,
    ) -> Result<SliceCgroup, CgroupError> {
        let cg = Self::create_empty(driver, slice_id)?;
        if let Err(e) = cg.apply(policy) {
            if let Err(r) = cg.remove() {
                tracing::warn!("{r}");
            }
            return Err(e);
        }
        Ok(cg)
    }

    /// [`SliceCgroup::create`] without the policy: the launcher creates
    /// the child inside it and applies the policy while the child builds
    /// its mount namespace (the child waits for it before exec).
    pub fn create_empty(driver: &CgroupDriver, slice_id: &str) -> Result<SliceCgroup, CgroupError> {
        if !valid_slice_id(slice_id) {
            return Err(CgroupError::InvalidSliceId {
                id: slice_id.into(),
            });
        }
        let parent = driver.slices_dir();
        match fs::create_dir(&parent) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(CgroupError::Create {
                    path: parent,
                    source,
                })
            }
        }
        let path = parent.join(slice_id);
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(CgroupError::Exists { path })
            }
            Err(source) => return Err(CgroupError::Create { path, source }),
        }
        let cg = SliceCgroup {
            path,
            version: driver.version(),
            removed: false,
        };
        tracing::debug!(path = %cg.path.display(), version = %cg.version, "slice cgroup made");
        Ok(cg)
    }

    /// Applies `policy`: `devices.deny` rules on v1, the BPF device filter
    /// on v2 (skipped when the policy denies nothing).
    pub fn apply(&self, policy: &DevicePolicy) -> Result<(), CgroupError> {
        match self.version {
            Version::V1 => {
                let deny = self.path.join("devices.deny");
                let inexact = v1_inexact_majors(policy);
                if !inexact.is_empty() {
                    tracing::debug!(
                        ?inexact,
                        "cgroup v1 cannot deny the unlisted minors of these majors"
                    );
                }
                let rules = v1_deny_rules(policy);
                if rules.is_empty() {
                    return Ok(());
                }
                let err = |rule: &str, source| CgroupError::DeviceRule {
                    path: deny.clone(),
                    rule: rule.into(),
                    source,
                };
                let mut file = OpenOptions::new()
                    .write(true)
                    .open(&deny)
                    .map_err(|e| err(&rules[0], e))?;
                // One rule per write(2): the kernel parses each write as one rule.
                for rule in &rules {
                    file.write_all(rule.as_bytes()).map_err(|e| err(rule, e))?;
                }
                Ok(())
            }
            Version::V2 => {
                if !can_deny(policy) {
                    return Ok(());
                }
                let prog =
                    bpf::load(&bpf::compile(policy)).map_err(|source| CgroupError::BpfLoad {
                        path: self.path.clone(),
                        source,
                    })?;
                // The attachment holds its own reference; our fd closes here.
                bpf::attach(&self.path, &prog).map_err(|source| CgroupError::BpfAttach {
                    path: self.path.clone(),
                    source,
                })
            }
        }
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// Its `cgroup.procs`.
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// Opens `cgroup.procs` for writing (close-on-exec), for the launcher to
    /// open before it forks and for the child to [`enter_self`] with.
    pub fn open_procs(&self) -> io::Result<File> {
        OpenOptions::new().write(true).open(self.procs_file())
    }

    /// Opens the cgroup's directory (close-on-exec), for
    /// `clone3(CLONE_INTO_CGROUP)`; cgroup v2 only.
    pub fn open_dir(&self) -> io::Result<Option<File>> {
        match self.version {
            Version::V2 => File::open(&self.path).map(Some),
            Version::V1 => Ok(None),
        }
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    pub fn add_pid(&self, pid: u32) -> Result<(), CgroupError> {
        fs::write(self.procs_file(), pid.to_string()).map_err(|source| CgroupError::AddPid {
            path: self.path.clone(),
            pid,
            source,
        })
    }

    /// The processes in the cgroup (pids as the caller's PID namespace
    /// numbers them).
    pub fn pids(&self) -> io::Result<Vec<u32>> {
        Ok(fs::read_to_string(self.procs_file())?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// Kills every process still in the cgroup once its command is gone
    /// (one that went `setsid` and into the background without a PID
    /// namespace to take it down, say), so that nothing outlives the
    /// slice's cleanup; returns how many there were. cgroup v2's
    /// `cgroup.kill` where the kernel has it (5.14), else each pid through
    /// a pidfd, signalled only while that pid is still listed in the
    /// cgroup (a pid reused outside it is never hit).
    pub fn kill_remaining(&self) -> io::Result<usize> {
        let mut seen = std::collections::HashSet::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let pids = self.pids()?;
            if pids.is_empty() {
                return Ok(seen.len());
            }
            if std::time::Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{} processes still in {} after SIGKILL",
                    pids.len(),
                    self.path.display()
                )));
            }
            seen.extend(pids.iter().copied());
            let killed_all = self.version == Version::V2
                && fs::write(self.path.join("cgroup.kill"), "1").is_ok();
            if !killed_all {
                for pid in pids {
                    self.kill_member(pid);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn kill_member(&self, pid: u32) {
        let Ok(pidfd) = crate::pidfd::pidfd_open(nix::unistd::Pid::from_raw(pid as i32)) else {
            return; // gone already
        };
        // The pidfd names one process for good; the pid, if listed now,
        // is that process or a newer one in this cgroup (either is the
        // slice's to kill).
        if !self.pids().is_ok_and(|p| p.contains(&pid)) {
            return;
        }
        // SAFETY: pidfd_send_signal takes a pidfd we own, a signal number,
        // a null siginfo and no flags.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                std::os::fd::AsRawFd::as_raw_fd(&pidfd),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }

    /// Removes the cgroup, retrying for about a second while the kernel
    /// still counts a process that just exited (EBUSY). A cgroup already
    /// gone counts as removed.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.removed = true;
        rmdir_patiently(&self.path)
    }
}

impl Drop for SliceCgroup {
    fn drop(&mut self) {
        if !self.removed {
            self.removed = true;
            if let Err(e) = rmdir_patiently(&self.path) {
                tracing::warn!("{e}");
            }
        }
    }
}

fn rmdir_patiently(path: &Path) -> Result<(), CgroupError> {
    // Usually free within microseconds of the last exit: start short, the
    // launcher's caller is waiting.
    let mut delay = Duration::from_micros(100);
    let mut waited = Duration::ZERO;
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && waited < Duration::from_secs(1) => {
                std::thread::sleep(delay);
                waited += delay;
                delay = (delay * 2).min(Duration::from_millis(100));
            }
            Err(source) => {
                return Err(CgroupError::Remove {
                    path: path.into(),
                    source,
                })
            }
        }
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is
/// `procs`, by writing `0` to it (the kernel reads 0 as "the writer", in
/// v1 and v2 and whatever the pid namespace). One `write(2)` and no
/// allocation, so a forked child may call it before `exec`.
pub fn enter_self(procs: &File) -> io::Result<()> {
    let mut f = procs;
    match f.write(b"0")? {
        1 => Ok(()),
        _ => Err(io::ErrorKind::WriteZero.into()),
    }
}

/// Removes the cgroups below `<root>/gpuslice/` that a dead launcher left:
/// a cgroup is stale when it has no processes and the launcher pid its name
/// starts with no longer runs (no `/proc/<pid>`, a zombie, or a process
/// that started after the cgroup was created, i.e. a reused pid). Returns
/// the directories removed; anything it cannot judge is kept.
///
/// The pid check assumes the launchers share this process's pid namespace,
/// and compares wall-clock times with 2 s of slack (the clock being stepped
/// forward by more than that while a launcher waits can make its still
/// empty cgroup look stale; the kernel never lets a non-empty one go).
pub fn reap_stale(driver: &CgroupDriver) -> Vec<PathBuf> {
    reap_stale_with(driver, &mut |_| {})
}

/// [`reap_stale`], calling `before_remove` with each cgroup it is about
/// to remove (the driver's memory partition on it is cleared there).
pub fn reap_stale_with(
    driver: &CgroupDriver,
    before_remove: &mut dyn FnMut(&Path),
) -> Vec<PathBuf> {
    let mut reaped = Vec::new();
    let Ok(entries) = fs::read_dir(driver.slices_dir()) else {
        return reaped;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_dir() {
            continue;
        }
        match fs::read_to_string(path.join("cgroup.procs")) {
            Ok(procs) if procs.trim().is_empty() => {}
            _ => continue,
        }
        // The directory's times are set when its inode is made, which is
        // never before the cgroup was: the later of the two is the safe bound.
        let (Ok(modified), Some(changed)) = (meta.modified(), ctime(&meta)) else {
            continue;
        };
        let created = modified.max(changed);
        if launcher_alive(pid, created) {
            continue;
        }
        before_remove(&path);
        match fs::remove_dir(&path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed stale slice cgroup");
                reaped.push(path);
            }
            Err(e) => tracing::debug!(path = %path.display(), "kept: {e}"),
        }
    }
    reaped
}

fn ctime(meta: &fs::Metadata) -> Option<SystemTime> {
    use std::os::unix::fs::MetadataExt;
    let secs = u64::try_from(meta.ctime()).ok()?;
    let nanos = u32::try_from(meta.ctime_nsec()).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Whether `pid` may be the launcher that made a cgroup at `created`:
/// it runs (not a zombie) and started no later than that (plus slack).
/// Anything unreadable counts as alive.
/// Whether `pid` is still the process that existed at `created`: it runs,
/// is no zombie, and started no later than `created` (+2 s of slack).
/// Unknown answers count as alive (nothing is removed on a doubt). Also
/// used to reap the ledgers of dead launchers.
pub fn launcher_alive(pid: u32, created: SystemTime) -> bool {
    const SLACK: Duration = Duration::from_secs(2);
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return false,
        Err(_) => return true,
    };
    // Fields after the command name, which may itself hold ')' and spaces.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return true;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); starttime is field 22.
    if matches!(fields.first(), Some(&"Z") | Some(&"X") | Some(&"x")) {
        return false;
    }
    let Some(start_ticks) = fields.get(19).and_then(|s| s.parse::<u64>().ok()) else {
        return true;
    };
    let Some(boot) = boot_time() else { return true };
    let hz = clock_ticks_per_sec();
    let started = boot + Duration::from_millis(start_ticks.saturating_mul(1000) / hz);
    started <= created + SLACK
}

/// Boot time from `btime` in `/proc/stat` (whole seconds, rounded down, so
/// start times computed from it err early, towards "alive").
fn boot_time() -> Option<SystemTime> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let secs = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf only reads a configuration value; no pointers involved.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100)
}

/// Helpers for the tests of this crate that need a real cgroup, device
/// nodes and a forked child.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::sync::atomic::AtomicUsize;

    /// The driver for `version`; when this host cannot give it, what
    /// [`gpuslice_testkit::precondition`] says: a failure (always under CI),
    /// or None with `GPUSLICE_TEST_SKIP=1`.
    pub(crate) fn driver_or_skip(test: &str, version: Version) -> Option<CgroupDriver> {
        if !gpuslice_testkit::precondition(test, gpuslice_testkit::needs_root()) {
            return None;
        }
        match CgroupDriver::detect(Some(version)) {
            Ok(d) => Some(d),
            Err(e) => {
                gpuslice_testkit::precondition(test, Some(e.to_string()));
                None
            }
        }
    }

    /// The cgroup2 root, as [`driver_or_skip`] gives it.
    pub(crate) fn v2_root_or_skip(test: &str) -> Option<PathBuf> {
        driver_or_skip(test, Version::V2).map(|d| d.root().to_owned())
    }

    /// A unique id owned by this test process: `<pid>-<tag>-<n>`.
    pub(crate) fn unique_id(tag: &str) -> String {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        format!("{}-{tag}-{n}", std::process::id())
    }

    /// A bare cgroup `<root>/gpuslice/<pid>-<tag>-<n>`, removed on drop.
    pub(crate) struct TestCgroup(PathBuf);

    impl TestCgroup {
        pub(crate) fn new(root: &Path, tag: &str) -> Self {
            let parent = root.join(SLICES_DIR);
            if let Err(e) = fs::create_dir(&parent) {
                assert_eq!(
                    e.kind(),
                    io::ErrorKind::AlreadyExists,
                    "{}",
                    parent.display()
                );
            }
            let path = parent.join(unique_id(tag));
            fs::create_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Self(path)
        }

        pub(crate) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TestCgroup {
        fn drop(&mut self) {
            if let Err(e) = rmdir_patiently(&self.0) {
                eprintln!("{e}");
            }
        }
    }

    /// A temporary directory on a filesystem that honours device nodes.
    pub(crate) struct NodeDir(tempfile::TempDir);

    impl NodeDir {
        pub(crate) fn new() -> Self {
            let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
            for base in [std::env::temp_dir(), target] {
                let Ok(dir) = tempfile::tempdir_in(&base) else {
                    continue;
                };
                let d = NodeDir(dir);
                // /dev/null's numbers: a nodev mount gives EACCES.
                if open_errno(&d.mknod(1, 3)) == 0 {
                    return d;
                }
            }
            panic!("no filesystem that allows device nodes for the test");
        }

        /// `mknod <dir>/c<major>_<minor> c major minor` (once).
        pub(crate) fn mknod(&self, major: u32, minor: u32) -> PathBuf {
            let path = self.0.path().join(format!("c{major}_{minor}"));
            if path.exists() {
                return path;
            }
            let c = CString::new(path.as_os_str().as_bytes()).unwrap();
            // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
            let rc = unsafe {
                libc::mknod(
                    c.as_ptr(),
                    libc::S_IFCHR | 0o666,
                    libc::makedev(major, minor),
                )
            };
            assert_eq!(
                rc,
                0,
                "mknod {}: {}",
                path.display(),
                io::Error::last_os_error()
            );
            path
        }
    }

    fn raw_open(c: &CString) -> i32 {
        // SAFETY: `c` is a valid NUL-terminated path; the fd, when one is
        // returned, is closed right away.
        unsafe {
            let fd = libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                libc::close(fd);
                0
            } else {
                *libc::__errno_location()
            }
        }
    }

    /// errno of `open(path, O_RDONLY)` here, 0 when it succeeds.
    pub(crate) fn open_errno(path: &Path) -> i32 {
        raw_open(&CString::new(path.as_os_str().as_bytes()).unwrap())
    }

    /// errno of `open(node, O_RDONLY)` in a child forked into the cgroup at
    /// `cgroup_dir` (0 when it succeeds).
    pub(crate) fn open_errno_in(cgroup_dir: &Path, node: &Path) -> i32 {
        let procs = OpenOptions::new()
            .write(true)
            .open(cgroup_dir.join("cgroup.procs"))
            .expect("open cgroup.procs");
        in_child(&procs, node)
    }

    /// Forks a child that enters the cgroup through `procs` (exit 200 if it
    /// cannot) and opens `node`; returns the child's errno (0: opened).
    pub(crate) fn in_child(procs: &File, node: &Path) -> i32 {
        let c = CString::new(node.as_os_str().as_bytes()).unwrap();
        // SAFETY: between fork and _exit the child only calls
        // async-signal-safe functions (write, open, close, _exit) on data
        // prepared before the fork, and never returns into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let code = match enter_self(procs) {
                Ok(()) => raw_open(&c),
                Err(_) => 200,
            };
            // SAFETY: ends the forked child without running any Rust cleanup.
            unsafe { libc::_exit(code) };
        }
        wait_exit_code(pid)
    }

    pub(crate) fn wait_exit_code(pid: libc::pid_t) -> i32 {
        let mut status = 0;
        loop {
            // SAFETY: `status` is a valid out pointer; `pid` is our child.
            let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
            if rc == pid {
                break;
            }
            let e = io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::EINTR), "waitpid: {e}");
        }
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        libc::WEXITSTATUS(status)
    }

    /// The pid of a child that has exited and been reaped.
    pub(crate) fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().unwrap();
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        pid
    }
}

#[cfg(test)]
mod tests {
    use super::test_support as ts;
    use super::*;
    use gpuslice_core::MajorRule;

    const HYBRID: &str = "\
25 1 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:24 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
27 26 0:25 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
28 26 0:26 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
31 26 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu,cpuacct
33 26 0:31 / /sys/fs/cgroup/devices rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,devices
";
    const V2_ONLY: &str = "\
25 1 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
    const V1_ONLY: &str = "\
26 25 0:24 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
33 26 0:31 / /sys/fs/cgroup/my\\040devices rw,nosuid master:3 - cgroup cgroup rw,devices,freezer
34 26 0:32 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
";

    fn v1(p: &str) -> CgroupDriver {
        CgroupDriver::V1 {
            devices_root: p.into(),
        }
    }
    fn v2(p: &str) -> CgroupDriver {
        CgroupDriver::V2 { root: p.into() }
    }

    #[test]
    fn detect_prefers_v2_and_honours_an_explicit_version() {
        let d = |text, pref| CgroupDriver::from_mountinfo(text, pref);
        assert_eq!(d(HYBRID, None).unwrap(), v2("/sys/fs/cgroup/unified"));
        assert_eq!(
            d(HYBRID, Some(Version::V2)).unwrap(),
            v2("/sys/fs/cgroup/unified")
        );
        assert_eq!(
            d(HYBRID, Some(Version::V1)).unwrap(),
            v1("/sys/fs/cgroup/devices")
        );
        assert_eq!(d(V2_ONLY, None).unwrap(), v2("/sys/fs/cgroup"));
        assert_eq!(d(V1_ONLY, None).unwrap(), v1("/sys/fs/cgroup/my devices"));

        let e = d(V2_ONLY, Some(Version::V1)).unwrap_err().to_string();
        assert!(
            e.contains("v1") && e.contains("only cgroup2 at /sys/fs/cgroup"),
            "{e}"
        );
        let e = d(V1_ONLY, Some(Version::V2)).unwrap_err().to_string();
        assert!(
            e.contains("no cgroup2 mount") && e.contains("my devices"),
            "{e}"
        );
        let e = d("", None).unwrap_err().to_string();
        assert!(e.contains("no cgroup mounts"), "{e}");
        // A v1 hierarchy without the devices controller does not count.
        let no_devices = V1_ONLY.replace("rw,devices,freezer", "rw,freezer");
        assert!(d(&no_devices, None).is_err());
    }

    #[test]
    fn detect_reads_this_host() {
        // Whatever this host has, detection must not fail to read it.
        match CgroupDriver::detect(None) {
            Ok(d) => assert!(d.root().is_dir(), "{d:?}"),
            Err(e) => assert!(matches!(e, CgroupError::Unavailable { .. }), "{e}"),
        }
    }

    #[test]
    fn the_statfs_shortcut_agrees_with_the_mountinfo_scan() {
        let text = fs::read_to_string(MOUNTINFO).unwrap();
        for pref in [None, Some(Version::V1), Some(Version::V2)] {
            assert_eq!(
                CgroupDriver::detect(pref).ok(),
                CgroupDriver::from_mountinfo(&text, pref).ok(),
                "{pref:?}"
            );
        }
    }

    #[test]
    fn versions_parse() {
        assert_eq!("v1".parse::<Version>().unwrap(), Version::V1);
        assert_eq!("2".parse::<Version>().unwrap(), Version::V2);
        assert!("v3".parse::<Version>().is_err());
        assert_eq!(Version::V2.to_string(), "v2");
    }

    fn rule(major: u32, allowed: &[u32], denied: &[u32], deny_unlisted: bool) -> MajorRule {
        MajorRule {
            major,
            allowed: allowed.to_vec(),
            denied: denied.to_vec(),
            deny_unlisted,
        }
    }

    #[test]
    fn v1_rules_deny_listed_minors_and_whole_majors_without_allowed_minors() {
        let p = DevicePolicy {
            rules: vec![
                rule(195, &[0, 254, 255], &[3, 1, 2], true),
                rule(241, &[], &[12, 13], true),
                rule(242, &[5], &[5], true),
                rule(226, &[1], &[2, 130], false),
                rule(195, &[], &[1], false),
            ],
        };
        assert_eq!(
            v1_deny_rules(&p),
            [
                "c 195:1 rwm",
                "c 195:2 rwm",
                "c 195:3 rwm",
                "c 241:* rwm",
                "c 242:* rwm",
                "c 226:2 rwm",
                "c 226:130 rwm",
            ]
        );
        assert_eq!(v1_inexact_majors(&p), [195]);
    }

    /// Simulates the v1 list on the policy shapes of the BPF tests: it never
    /// allows what the policy denies, except unlisted minors of the majors
    /// `v1_inexact_majors` names, and never denies what the policy allows.
    #[test]
    fn v1_rules_agree_with_the_policy_except_where_documented() {
        for p in crate::bpf::tests::shapes() {
            let rules = v1_deny_rules(&p);
            let inexact = v1_inexact_majors(&p);
            for major in [1, 195, 226, 238, 241] {
                for minor in 0..=300 {
                    let v1_denies = rules.contains(&format!("c {major}:* rwm"))
                        || rules.contains(&format!("c {major}:{minor} rwm"));
                    let want = p.allows_char(major, minor);
                    if want {
                        assert!(!v1_denies, "{major}:{minor} {p:?}");
                    } else if !v1_denies {
                        let listed = p
                            .rules
                            .iter()
                            .any(|r| r.major == major && r.denied.contains(&minor));
                        assert!(!listed && inexact.contains(&major), "{major}:{minor} {p:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn slice_ids_are_unique_and_valid() {
        let a = new_slice_id();
        let b = new_slice_id();
        assert_ne!(a, b);
        assert!(valid_slice_id(&a), "{a}");
        assert!(a.starts_with(&format!("{}-", std::process::id())));
        for bad in ["", "a/b", "..", ".x", "a b", "x\0"] {
            assert!(!valid_slice_id(bad), "{bad:?}");
        }
        // What the ledger's header could not store makes no cgroup either.
        let long = format!("{a}-{}", "x".repeat(MAX_SLICE_ID_LEN));
        assert!(!valid_slice_id(&long), "{long}");
    }

    fn deny_195_1() -> DevicePolicy {
        DevicePolicy {
            rules: vec![rule(195, &[0, 254, 255], &[1], true)],
        }
    }

    /// A failure while applying the policy removes the directory made: a
    /// plain directory posing as a cgroup root fails the v1 rule write and
    /// the v2 attach (or load, without root).
    #[test]
    fn failed_create_leaves_nothing_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_str().unwrap();
        for driver in [v1(root), v2(root)] {
            let id = ts::unique_id("fail");
            let err = SliceCgroup::create(&driver, &id, &deny_195_1()).unwrap_err();
            assert!(
                matches!(
                    err,
                    CgroupError::DeviceRule { .. }
                        | CgroupError::BpfAttach { .. }
                        | CgroupError::BpfLoad { .. }
                ),
                "{err}"
            );
            assert!(err.to_string().contains(&id), "{err}");
            assert!(!driver.slices_dir().join(&id).exists());
            assert!(driver.slices_dir().is_dir(), "the shared parent stays");
        }
        let err = SliceCgroup::create(&v1(root), "../x", &deny_195_1()).unwrap_err();
        assert!(matches!(err, CgroupError::InvalidSliceId { .. }), "{err}");
    }

    #[test]
    fn unwritable_root_says_what_would_fix_it() {
        let driver = v2("/proc/self");
        let err = SliceCgroup::create(&driver, &ts::unique_id("ro"), &deny_195_1()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("cannot create /proc/self/gpuslice: ")
                && msg.contains("needs a writable cgroup"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }

    /// As root, for each cgroup version this host has: the child in the
    /// slice cgroup gets EPERM on the denied 195:1 and reaches 195:0 as it
    /// does outside (ENXIO without an NVIDIA driver); `remove` leaves no
    /// directory.
    fn enforces(version: Version) {
        let test = format!("slice_cgroup_enforces_{version}");
        let Some(driver) = ts::driver_or_skip(&test, version) else {
            return;
        };
        let nodes = ts::NodeDir::new();
        let denied = nodes.mknod(195, 1);
        let allowed = nodes.mknod(195, 0);
        let baseline = ts::open_errno(&allowed);
        assert_ne!(baseline, libc::EPERM);
        assert_ne!(ts::open_errno(&denied), libc::EPERM);

        let id = ts::unique_id("enforce");
        let cg = SliceCgroup::create(&driver, &id, &deny_195_1()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cg.path(), driver.slices_dir().join(&id));
        assert_eq!(cg.version(), version);
        let procs = cg.open_procs().unwrap();
        assert_eq!(ts::in_child(&procs, &denied), libc::EPERM);
        assert_eq!(ts::in_child(&procs, &allowed), baseline);
        drop(procs);
        cg.remove().unwrap_or_else(|e| panic!("{e}"));

        // Several rules (several v1 lines), a whole denied major, and the
        // documented v1 gap: an unlisted minor of a deny_unlisted major.
        let policy = DevicePolicy {
            rules: vec![
                rule(195, &[0, 254, 255], &[1, 2], true),
                rule(241, &[], &[], true),
                rule(226, &[], &[7], false),
            ],
        };
        let cg = SliceCgroup::create(&driver, &ts::unique_id("enforce"), &policy)
            .unwrap_or_else(|e| panic!("{e}"));
        let procs = cg.open_procs().unwrap();
        let gap = if version == Version::V1 {
            None
        } else {
            Some(libc::EPERM)
        };
        for (major, minor, want) in [
            (195, 1, Some(libc::EPERM)),
            (195, 2, Some(libc::EPERM)),
            (241, 5, Some(libc::EPERM)),
            (226, 7, Some(libc::EPERM)),
            (195, 9, gap),
            (195, 0, None),
            (226, 8, None),
            (1, 3, None),
        ] {
            let node = nodes.mknod(major, minor);
            let outside = ts::open_errno(&node);
            assert_ne!(outside, libc::EPERM, "c {major}:{minor} outside");
            let got = ts::in_child(&procs, &node);
            assert_eq!(
                got,
                want.unwrap_or(outside),
                "c {major}:{minor} in {version}"
            );
        }
        drop(procs);

        // add_pid moves another process in.
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        cg.add_pid(sleeper.id()).unwrap_or_else(|e| panic!("{e}"));
        let listed = fs::read_to_string(cg.procs_file()).unwrap();
        assert!(
            listed.lines().any(|l| l == sleeper.id().to_string()),
            "{listed}"
        );
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();

        let path = cg.path().to_owned();
        cg.remove().unwrap_or_else(|e| panic!("{e}"));
        assert!(!path.exists());

        // Drop removes too.
        let cg = SliceCgroup::create(&driver, &ts::unique_id("drop"), &deny_195_1()).unwrap();
        let path = cg.path().to_owned();
        drop(cg);
        assert!(!path.exists());
    }

    #[test]
    fn slice_cgroup_enforces_v1() {
        enforces(Version::V1);
    }

    #[test]
    fn slice_cgroup_enforces_v2() {
        enforces(Version::V2);
    }

    /// As root, per version: an empty cgroup named after a dead pid goes;
    /// one named after a live pid (ours) stays, and so does a non-empty
    /// one named after a dead pid.
    fn reaps(version: Version) {
        let test = format!("reap_stale_{version}");
        let Some(driver) = ts::driver_or_skip(&test, version) else {
            return;
        };
        let dead = ts::dead_pid();
        let policy = deny_195_1();
        let tag = ts::unique_id("reap").replace('-', "_");

        let stale = SliceCgroup::create(&driver, &format!("{dead}-{tag}"), &policy).unwrap();
        let stale_path = stale.path().to_owned();
        std::mem::forget(stale);
        let busy = SliceCgroup::create(&driver, &format!("{dead}-{tag}_busy"), &policy).unwrap();
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        busy.add_pid(sleeper.id()).unwrap();
        let live = SliceCgroup::create(&driver, &ts::unique_id("reap_live"), &policy).unwrap();

        let reaped = reap_stale(&driver);
        // A concurrent reaper may have taken the stale one first.
        assert!(!stale_path.exists(), "{reaped:?}");
        assert!(!reaped.contains(&busy.path().to_owned()), "{reaped:?}");
        assert!(busy.path().is_dir() && live.path().is_dir());

        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        busy.remove().unwrap();
        live.remove().unwrap();
    }

    #[test]
    fn reap_stale_v1() {
        reaps(Version::V1);
    }

    #[test]
    fn reap_stale_v2() {
        reaps(Version::V2);
    }

    #[test]
    fn launcher_liveness() {
        let me = std::process::id();
        assert!(launcher_alive(me, SystemTime::now()));
        // We started after the epoch: a cgroup that old was not ours.
        assert!(!launcher_alive(me, UNIX_EPOCH));
        assert!(!launcher_alive(ts::dead_pid(), SystemTime::now()));
    }
}
