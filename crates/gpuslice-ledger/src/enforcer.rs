//! Root's enforcer (issue 25): a slice's GPU memory as the **driver**
//! accounts it, and the slice brought back within its cap by killing.
//!
//! The shim caps a slice from inside its processes, so a program that
//! reaches the driver some way the shim does not see (its own ELF lookup,
//! raw ioctls, a static binary: docs/security.md, "What escapes the shim")
//! is not capped by it. The enforcer does not trust the slice: it takes
//! each process's memory from the driver's own per-process accounting
//! (NVML's running compute processes, read on the host by the caller and
//! handed in as [`DriverProcess`]es: contexts included, as the cap counts
//! them), maps processes to slices by their cgroup (a path component named
//! like the slice, as `run` and [`crate::enforcement`] name it) or a live
//! slot in the slice's ledger, and per capped device of a slice:
//!
//! - when what the slice's processes hold exceeds the cap on
//!   [`GRACE_TICKS`] ticks in a row, it kills (SIGKILL) the largest holder
//!   the shim does not account for (not held by the shim, or holding more
//!   than its ledger slot says), else the largest holder, until the rest
//!   fits ([`Reason::OverCap`]);
//! - a GPU process of a capped slice that the shim does not hold at all
//!   (which is how a compute share is escaped too) gets the policy's
//!   [`Unshimmed`]: flagged, or killed ([`Reason::Unshimmed`]) — default
//!   kill (docs/security.md says why).
//!
//! One implementation for every root component that watches slices: the
//! `run` launcher ticks it every [`TICK`] while a capped slice runs; the
//! exporter reports the driver's figures ([`SliceFacts`]) and the kills
//! recorded in the slice's `enforcement` file ([`record_kill`],
//! [`read_kills`]). The facts cost one read of `/proc/<pid>/cgroup` per
//! GPU process the driver lists (and `maps` for those in the slice): no
//! walk of `/proc`.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use crate::{ProcessState, Snapshot};

/// How often the launcher ticks the enforcer.
pub const TICK: Duration = Duration::from_millis(250);
/// Ticks in a row a slice must be over its cap before a kill: the shim
/// reserves a context at an estimate before the driver makes it, and a
/// reading taken between the two sides of an allocation can be stale.
pub const GRACE_TICKS: u32 = 2;
/// Bytes a process may hold beyond its ledger slot and still count as
/// accounted by the shim: the ledger and NVML are read at different
/// times, and what the driver holds for a process beyond its allocations
/// (context, modules, local memory) is charged from the shim's own
/// measurements, taken now and then.
pub const SLACK: u64 = 16 << 20;
/// The kills of a slice, one line each, in its root-only records
/// directory (beside the limits record).
pub const ENFORCEMENT_FILE: &str = "enforcement";

/// What the policy does with a GPU process of a capped slice that the
/// shim does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unshimmed {
    /// Shown by `gpuslice slices` and the exporter; killed only when its
    /// slice goes over its cap.
    Flag,
    /// Killed.
    #[default]
    Kill,
}

/// One process with memory on a device, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverProcess {
    /// The device's UUID (`GPU-…`, `MIG-…`).
    pub uuid: String,
    /// In the host's PID namespace (the reader's).
    pub pid: u32,
    pub bytes: u64,
}

/// Why the enforcer killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    OverCap,
    Unshimmed,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::OverCap => "over_cap",
            Reason::Unshimmed => "unshimmed",
        }
    }

    fn parse(s: &str) -> Option<Reason> {
        match s {
            "over_cap" => Some(Reason::OverCap),
            "unshimmed" => Some(Reason::Unshimmed),
            _ => None,
        }
    }
}

/// A process of the slice holding memory on one of its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
    pub uuid: String,
    /// What the driver says it holds.
    pub driver_bytes: u64,
    /// What its ledger slot says, when the shim holds it (loaded and
    /// joined); None when not.
    pub shim_bytes: Option<u64>,
}

impl Holder {
    /// The shim holds it and accounts for what the driver says it holds.
    pub fn accounted(&self) -> bool {
        self.shim_bytes
            .is_some_and(|s| self.driver_bytes <= s.saturating_add(SLACK))
    }
}

/// A slice as the driver sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SliceFacts {
    pub slice: String,
    /// (uuid, cap bytes) of each capped device.
    pub caps: Vec<(String, u64)>,
    pub holders: Vec<Holder>,
}

impl SliceFacts {
    /// What the slice's processes hold on `uuid`, by the driver.
    pub fn driver_used(&self, uuid: &str) -> u64 {
        self.holders
            .iter()
            .filter(|h| h.uuid == uuid)
            .map(|h| h.driver_bytes)
            .sum()
    }

    /// What `pid` holds on `uuid` by the driver (None: not listed).
    pub fn driver_bytes(&self, pid: u32, uuid: &str) -> Option<u64> {
        self.holders
            .iter()
            .find(|h| h.pid == pid && h.uuid == uuid)
            .map(|h| h.driver_bytes)
    }
}

/// The facts of slice `slice_id` (caps from root's record), from the
/// driver's processes and the slice's ledger `snap` (the caller reads both).
pub fn facts(
    slice_id: &str,
    caps: &[(String, u64)],
    snap: Option<&Snapshot>,
    driver: &[DriverProcess],
) -> SliceFacts {
    facts_cached(slice_id, caps, snap, driver, &mut Known::default())
}

/// What does not change over a process's life (whether it maps the shim,
/// its name), by pid and start time: a watcher reads a process's `maps`
/// once, not every tick.
#[derive(Debug, Default)]
pub struct Known(BTreeMap<u32, (u64, bool, String)>);

impl Known {
    fn get(&mut self, pid: u32) -> (bool, String) {
        let start = crate::procfs::stat(pid).map_or(0, |s| s.start_time);
        if let Some((t, shim, comm)) = self.0.get(&pid) {
            if *t == start && start != 0 {
                return (*shim, comm.clone());
            }
        }
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let v = (
            crate::enforcement::maps_library(&maps, "libgpuslice"),
            comm.trim().to_string(),
        );
        self.0.insert(pid, (start, v.0, v.1.clone()));
        v
    }

    /// Forgets the processes not in `pids` (gone, or no longer on a GPU).
    fn keep(&mut self, pids: &[u32]) {
        self.0.retain(|p, _| pids.contains(p));
    }
}

/// [`facts`], with what is known of the processes kept in `known`.
pub fn facts_cached(
    slice_id: &str,
    caps: &[(String, u64)],
    snap: Option<&Snapshot>,
    driver: &[DriverProcess],
    known: &mut Known,
) -> SliceFacts {
    let mut holders = Vec::new();
    let mut seen: BTreeMap<u32, Option<(bool, String)>> = BTreeMap::new();
    let pids: Vec<u32> = driver.iter().map(|p| p.pid).collect();
    known.keep(&pids);
    for p in driver.iter().filter(|p| p.bytes > 0) {
        let slot = snap.and_then(|s| {
            s.processes
                .iter()
                .find(|q| q.pid == p.pid && q.state == ProcessState::Live)
        });
        let member = seen.entry(p.pid).or_insert_with(|| {
            let cgroup = fs::read_to_string(format!("/proc/{}/cgroup", p.pid)).ok()?;
            if !crate::enforcement::in_cgroup_named(&cgroup, slice_id) && slot.is_none() {
                return None;
            }
            Some(known.get(p.pid))
        });
        let Some((shim, comm)) = member.clone() else {
            continue;
        };
        let shim_bytes = match (shim, slot, snap) {
            (true, Some(slot), Some(s)) => Some(
                s.devices
                    .iter()
                    .position(|d| d.uuid == p.uuid)
                    .and_then(|i| slot.bytes.get(i).copied())
                    .unwrap_or(0),
            ),
            _ => None,
        };
        holders.push(Holder {
            pid: p.pid,
            comm,
            uuid: p.uuid.clone(),
            driver_bytes: p.bytes,
            shim_bytes,
        });
    }
    SliceFacts {
        slice: slice_id.to_string(),
        caps: caps.to_vec(),
        holders,
    }
}

/// What the enforcer decided about one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    pub slice: String,
    pub pid: u32,
    pub comm: String,
    pub uuid: String,
    pub driver_bytes: u64,
    pub reason: Reason,
    /// Killed (false: flagged only).
    pub kill: bool,
}

/// The enforcer's state across ticks: how long each device of a slice has
/// been over its cap, and each unshimmed process seen.
#[derive(Debug, Default)]
pub struct Enforcer {
    pub policy: Unshimmed,
    strikes: BTreeMap<(String, String), u32>,
    unshimmed: BTreeMap<(String, u32), u32>,
}

impl Enforcer {
    pub fn new(policy: Unshimmed) -> Enforcer {
        Enforcer {
            policy,
            ..Enforcer::default()
        }
    }

    /// Decides, from one tick's facts, whom to kill or flag (no side
    /// effects but the enforcer's own counts).
    pub fn judge(&mut self, f: &SliceFacts) -> Vec<Action> {
        let mut out: Vec<Action> = Vec::new();
        let action = |h: &Holder, reason, kill| Action {
            slice: f.slice.clone(),
            pid: h.pid,
            comm: h.comm.clone(),
            uuid: h.uuid.clone(),
            driver_bytes: h.driver_bytes,
            reason,
            kill,
        };
        // Unshimmed processes of a capped slice.
        let mut now_unshimmed = BTreeMap::new();
        for h in f.holders.iter().filter(|h| h.shim_bytes.is_none()) {
            if out.iter().any(|a| a.pid == h.pid) {
                continue;
            }
            let key = (f.slice.clone(), h.pid);
            let n = self.unshimmed.get(&key).copied().unwrap_or(0) + 1;
            now_unshimmed.insert(key, n);
            let kill = self.policy == Unshimmed::Kill && n >= GRACE_TICKS;
            out.push(action(h, Reason::Unshimmed, kill));
        }
        self.unshimmed.retain(|k, _| k.0 != f.slice);
        self.unshimmed.extend(now_unshimmed);
        // Over the cap, device by device.
        for (uuid, cap) in &f.caps {
            let key = (f.slice.clone(), uuid.clone());
            let mut used = f.driver_used(uuid);
            // What this tick's kills already give back.
            for a in out.iter().filter(|a| a.kill && &a.uuid == uuid) {
                used = used.saturating_sub(a.driver_bytes);
            }
            if used <= *cap {
                self.strikes.remove(&key);
                continue;
            }
            let n = self.strikes.get(&key).copied().unwrap_or(0) + 1;
            self.strikes.insert(key, n);
            if n < GRACE_TICKS {
                continue;
            }
            let mut left: Vec<&Holder> = f
                .holders
                .iter()
                .filter(|h| &h.uuid == uuid)
                .filter(|h| !out.iter().any(|a| a.kill && a.pid == h.pid))
                .collect();
            // Victims first: not accounted by the shim, then the largest.
            left.sort_by_key(|h| (h.accounted(), std::cmp::Reverse(h.driver_bytes)));
            for h in left {
                if used <= *cap {
                    break;
                }
                used = used.saturating_sub(h.driver_bytes);
                out.retain(|a| a.pid != h.pid);
                out.push(action(h, Reason::OverCap, true));
            }
        }
        out
    }

    /// [`Enforcer::judge`], then the kills: each process is killed only if
    /// it is still in the slice (its cgroup or ledger, checked through a
    /// pidfd, so a reused pid is never killed). Returns what was done.
    pub fn enforce(&mut self, f: &SliceFacts, snap: Option<&Snapshot>) -> Vec<Action> {
        let mut actions = self.judge(f);
        for a in actions.iter_mut().filter(|a| a.kill) {
            let in_slice = |pid: u32| {
                let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
                crate::enforcement::in_cgroup_named(&cgroup, &f.slice)
                    || snap.is_some_and(|s| {
                        s.processes
                            .iter()
                            .any(|p| p.pid == pid && p.state == ProcessState::Live)
                    })
            };
            a.kill = crate::procfs::kill_if(a.pid, in_slice);
            if a.kill {
                self.unshimmed.remove(&(f.slice.clone(), a.pid));
            }
        }
        actions
    }
}

/// One slice watched by a root component (the `run` launcher): its caps
/// from root's record, its ledger, its records directory (where kills are
/// recorded) and the enforcer's state. The caller reads the driver.
pub struct SliceWatch {
    pub slice: String,
    pub caps: Vec<(String, u64)>,
    pub ledger: Option<crate::Ledger>,
    pub records: std::path::PathBuf,
    pub enforcer: Enforcer,
    flagged: Vec<u32>,
    known: Known,
}

impl SliceWatch {
    pub fn new(
        slice: &str,
        caps: Vec<(String, u64)>,
        ledger: Option<crate::Ledger>,
        records: &Path,
        policy: Unshimmed,
    ) -> SliceWatch {
        SliceWatch {
            slice: slice.to_string(),
            caps,
            ledger,
            records: records.to_path_buf(),
            enforcer: Enforcer::new(policy),
            flagged: Vec::new(),
            known: Known::default(),
        }
    }

    /// The UUIDs whose processes the caller must read from the driver.
    pub fn uuids(&self) -> Vec<String> {
        match &self.ledger {
            Some(l) => l
                .snapshot()
                .devices
                .iter()
                .map(|d| d.uuid.clone())
                .collect(),
            None => self.caps.iter().map(|(u, _)| u.clone()).collect(),
        }
    }

    /// One tick: facts from `driver`, kills done and recorded. Returns the
    /// kills and, under [`Unshimmed::Flag`], the processes flagged for the
    /// first time (to log).
    pub fn tick(&mut self, driver: &[DriverProcess]) -> Vec<Action> {
        let pids: Vec<u32> = driver.iter().map(|p| p.pid).collect();
        let snap = self.ledger.as_ref().map(|l| l.snapshot_among(&pids));
        let f = facts_cached(
            &self.slice,
            &self.caps,
            snap.as_ref(),
            driver,
            &mut self.known,
        );
        let mut out = Vec::new();
        for a in self.enforcer.enforce(&f, snap.as_ref()) {
            if a.kill {
                let _ = record_kill(&self.records, &a);
                out.push(a);
            } else if self.enforcer.policy == Unshimmed::Flag && !self.flagged.contains(&a.pid) {
                self.flagged.push(a.pid);
                out.push(a);
            }
        }
        out
    }
}

/// Appends a kill to the slice's `enforcement` file in its records
/// directory `dir` (root's, 0700): `unix_ms reason pid uuid bytes comm`.
pub fn record_kill(dir: &Path, a: &Action) -> std::io::Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let comm: String = a
        .comm
        .chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    let mut f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join(ENFORCEMENT_FILE))?;
    writeln!(
        f,
        "{now} {} {} {} {} {comm}",
        a.reason.as_str(),
        a.pid,
        a.uuid,
        a.driver_bytes
    )
}

/// One recorded kill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillRecord {
    pub unix_ms: u64,
    pub reason: Reason,
    pub pid: u32,
    pub uuid: String,
    pub bytes: u64,
    pub comm: String,
}

/// The kills recorded in the records directory `dir` (none if no file).
pub fn read_kills(dir: &Path) -> Vec<KillRecord> {
    let text = fs::read_to_string(dir.join(ENFORCEMENT_FILE)).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(6, ' ');
            Some(KillRecord {
                unix_ms: f.next()?.parse().ok()?,
                reason: Reason::parse(f.next()?)?,
                pid: f.next()?.parse().ok()?,
                uuid: f.next()?.to_string(),
                bytes: f.next()?.parse().ok()?,
                comm: f.next().unwrap_or("").to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: u32, bytes: u64, shim: Option<u64>) -> Holder {
        Holder {
            pid,
            comm: format!("p{pid}"),
            uuid: "GPU-0".into(),
            driver_bytes: bytes,
            shim_bytes: shim,
        }
    }

    fn slice(holders: Vec<Holder>) -> SliceFacts {
        SliceFacts {
            slice: "s".into(),
            caps: vec![("GPU-0".into(), 1 << 30)],
            holders,
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn over_the_cap_the_unaccounted_holder_goes_first_after_the_grace() {
        let mut e = Enforcer::new(Unshimmed::Flag);
        // Joined through the shim, then allocated behind it: 10 GiB by the
        // driver, 600 MiB by its slot; a well-behaved neighbour of 300 MiB.
        let f = slice(vec![
            holder(10, 300 * MIB, Some(300 * MIB)),
            holder(11, 10240 * MIB, Some(600 * MIB)),
        ]);
        assert!(e.judge(&f).iter().all(|a| !a.kill), "first tick: grace");
        let a = e.judge(&f);
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(
            (a[0].pid, a[0].reason, a[0].kill),
            (11, Reason::OverCap, true)
        );
        // Back under the cap: the strikes start again.
        let f = slice(vec![holder(10, 300 * MIB, Some(300 * MIB))]);
        assert!(e.judge(&f).is_empty());
    }

    #[test]
    fn all_accounted_the_largest_goes_until_the_rest_fits() {
        let mut e = Enforcer::new(Unshimmed::Kill);
        let f = slice(vec![
            holder(1, 600 * MIB, Some(600 * MIB)),
            holder(2, 500 * MIB, Some(500 * MIB)),
            holder(3, 100 * MIB, Some(100 * MIB)),
        ]);
        e.judge(&f);
        let a = e.judge(&f);
        assert_eq!(a.iter().map(|a| a.pid).collect::<Vec<_>>(), [1], "{a:?}");
        // Within the cap: nothing, however long.
        let f = slice(vec![holder(2, 1024 * MIB, Some(1024 * MIB))]);
        for _ in 0..5 {
            assert!(e.judge(&f).is_empty());
        }
    }

    #[test]
    fn an_unshimmed_process_is_flagged_or_killed_by_the_policy() {
        let f = slice(vec![holder(7, 10 * MIB, None)]);
        let mut flag = Enforcer::new(Unshimmed::Flag);
        for _ in 0..3 {
            let a = flag.judge(&f);
            assert_eq!(a.len(), 1);
            assert_eq!((a[0].reason, a[0].kill), (Reason::Unshimmed, false));
        }
        let mut kill = Enforcer::default();
        assert!(!kill.judge(&f)[0].kill, "grace");
        let a = kill.judge(&f);
        assert_eq!(
            (a[0].pid, a[0].reason, a[0].kill),
            (7, Reason::Unshimmed, true)
        );
    }

    #[test]
    fn kills_are_recorded_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_kills(dir.path()).is_empty());
        let a = Action {
            slice: "s".into(),
            pid: 42,
            comm: "evil client".into(),
            uuid: "GPU-0".into(),
            driver_bytes: 5 << 30,
            reason: Reason::OverCap,
            kill: true,
        };
        record_kill(dir.path(), &a).unwrap();
        let k = read_kills(dir.path());
        assert_eq!(k.len(), 1);
        assert_eq!(
            (k[0].pid, k[0].reason, k[0].bytes, k[0].comm.as_str()),
            (42, Reason::OverCap, 5 << 30, "evil_client")
        );
    }
}
