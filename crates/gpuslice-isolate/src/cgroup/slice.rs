//! One slice's cgroup: made, given its policy, joined, emptied, removed.

use super::{v1, v2, CgroupDriver, CgroupError, Version};
use gpuslice_core::DevicePolicy;
use gpuslice_ledger::limits::valid_slice_id;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
            Version::V1 => v1::apply(&self.path, policy),
            Version::V2 => v2::apply(&self.path, policy),
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

pub(super) fn rmdir_patiently(path: &Path) -> Result<(), CgroupError> {
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
