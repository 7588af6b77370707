//! Reaping: the cgroups (and, through [`launcher_alive`], the ledgers) that
//! a dead launcher left.

use super::CgroupDriver;
use gpuslice_ledger::procfs;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
            .and_then(gpuslice_ledger::limits::launcher_pid)
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

/// Whether `pid` is still the process that existed at `created`: it runs,
/// is no zombie, and started no later than `created` (+2 s of slack).
/// Unknown answers count as alive (nothing is removed on a doubt). Also
/// used to reap the ledgers of dead launchers.
pub fn launcher_alive(pid: u32, created: SystemTime) -> bool {
    const SLACK: Duration = Duration::from_secs(2);
    let stat = match procfs::read_stat(pid) {
        Ok(text) => procfs::parse_stat(&text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return false,
        Err(_) => return true,
    };
    let Some(stat) = stat else { return true };
    if matches!(stat.state, 'Z' | 'X' | 'x') {
        return false;
    }
    let start_ticks = stat.start_time;
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
