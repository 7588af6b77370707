//! Root's enforcer: a slice's GPU memory as the **driver**
//! accounts it, and the slice brought back within its cap by killing.
//!
//! The shim caps a slice from inside its processes, so a program that
//! reaches the driver some way the shim does not see (its own ELF lookup,
//! raw ioctls, a static binary: docs/security.md, "What escapes the shim")
//! is not capped by it. The enforcer does not trust the slice: it takes
//! each process's memory from the driver's own per-process accounting
//! (NVML's running compute processes, read on the host by the caller and
//! handed in as [`DriverProcess`]es: contexts included, as the cap counts
//! them), maps processes to slices ([`Member`]: a cgroup path component
//! named like the slice, as `run` names it; a live slot in the slice's
//! ledger; the slice's limits record, root's file, seen at the slice's
//! fixed place in the process's root or in the root of a process of the
//! same cgroup: a container's), and per capped device of a slice:
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
//! One implementation for every root component that watches slices
//! ([`NodeWatch`]): the `run` launcher ticks it every [`TICK`] while a
//! capped slice runs, the device plugin and the DRA plugin for the slices
//! they made; `gpuslice slices` and the exporter report the driver's
//! figures ([`SliceFacts`]) and the kills recorded in the slice's
//! `enforcement` file ([`record_kill`], [`read_kills`]). The facts cost,
//! once per process's life, a read of its `cgroup`, `maps` and its root's
//! limits record; a walk of `/proc` only for a GPU process whose root
//! shows no limits record (one that hid it: then the processes of its
//! cgroup say which slice it is of), at most once a tick.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use crate::procfs::FileId;
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
pub use crate::limits::ENFORCEMENT_FILE;

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

/// What a plugin does with a GPU process of a pod's slice that can escape
/// any cap (`crate::procfs::escape_routes`: `CAP_SYS_ADMIN`, the host's
/// PID, IPC or network namespace). Kubernetes allows such pods; the caps
/// cannot hold against them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escapes {
    /// Recorded beside the slice's records (`unenforceable`), logged, and
    /// shown by `gpuslice slices` and the exporter
    /// (`gpuslice_slice_unenforceable`).
    Flag,
    /// Killed too: the admin's "refuse" (a device plugin cannot refuse at
    /// Allocate, which does not name the pod).
    Refuse,
}

/// Where escapes are recorded in a slice's records directory (root's):
/// one line per process, `unix_ms pid routes comm` (routes joined by `,`).
pub const UNENFORCEABLE_FILE: &str = "unenforceable";

/// One process with memory on a device, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverProcess {
    /// The device's UUID (`GPU-…`, `MIG-…`).
    pub uuid: String,
    /// In the host's PID namespace (the reader's).
    pub pid: u32,
    pub bytes: u64,
}

impl From<(String, u32, u64)> for DriverProcess {
    /// From (uuid, pid, bytes), as `gpuslice_cuda_load::running_processes`
    /// lists them.
    fn from((uuid, pid, bytes): (String, u32, u64)) -> DriverProcess {
        DriverProcess { uuid, pid, bytes }
    }
}

/// Why the enforcer killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    OverCap,
    Unshimmed,
    /// It can escape any cap (a plugin's [`Escapes::Refuse`]).
    CanEscape,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::OverCap => "over_cap",
            Reason::Unshimmed => "unshimmed",
            Reason::CanEscape => "can_escape",
        }
    }

    fn parse(s: &str) -> Option<Reason> {
        match s {
            "over_cap" => Some(Reason::OverCap),
            "unshimmed" => Some(Reason::Unshimmed),
            "can_escape" => Some(Reason::CanEscape),
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
    /// How it can escape any cap (`crate::procfs::escape_routes`); read
    /// only for slices whose watcher checks it (a plugin's).
    pub escapes: Vec<&'static str>,
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

/// Where a slice's processes find root's limits record of their slice
/// (`gpuslice_ledger::limits::SLICE_DIR`/`LIMITS_FILE`), relative to
/// their root.
const LIMITS_IN_ROOT: &str = "run/gpuslice/slice/limits";

/// How root knows a process is of a slice: its name (a cgroup path
/// component named so: `run`'s slices) and the identity of its limits
/// record on the host, which `run`, the device plugin and the CDI specs
/// bind read-only at the slice's fixed place in every container of it. A
/// tenant can hide that file from its own root (cover it in a mount
/// namespace of its own), never show another slice's in its place; a
/// process that hid it is still of the slice when a process of its
/// cgroup (its container) shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Member {
    pub slice: String,
    pub limits: Option<FileId>,
}

impl Member {
    /// Slice `slice`, whose limits record on the host is `record` (None,
    /// or one that does not stat: known by its name and ledger alone).
    pub fn new(slice: &str, record: Option<&Path>) -> Member {
        Member {
            slice: slice.to_string(),
            limits: record.and_then(crate::procfs::file_id),
        }
    }
}

/// The facts of `member`'s slice (caps from root's record), from the
/// driver's processes and the slice's ledger `snap` (the caller reads both).
pub fn facts(
    member: &Member,
    caps: &[(String, u64)],
    snap: Option<&Snapshot>,
    driver: &[DriverProcess],
) -> SliceFacts {
    facts_cached(member, caps, snap, driver, &mut Known::default())
}

/// What does not change over a process's life (whether it maps the shim,
/// its name, its cgroup, the limits record its root shows), by pid and
/// start time: a watcher reads them once, not every tick. And which limits
/// record the processes of each cgroup show, from one walk of `/proc`
/// made when first needed and at most once every [`CGROUPS_EVERY`].
#[derive(Debug, Default)]
pub struct Known {
    procs: BTreeMap<u32, ProcFacts>,
    /// cgroup (the text of `/proc/<pid>/cgroup`) → the limits record a
    /// process of it shows, and when that was read.
    cgroups: Option<(std::time::Instant, BTreeMap<String, FileId>)>,
}

/// How long a walk of `/proc` for the cgroups' limits records stands: a
/// process that hid its slice's record (or one of no slice) costs one
/// walk in that time, not one a tick.
pub const CGROUPS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
struct ProcFacts {
    start: u64,
    shim: bool,
    comm: String,
    cgroup: String,
    shows: Option<FileId>,
    escapes: Vec<&'static str>,
}

impl Known {
    fn get(&mut self, pid: u32) -> Option<ProcFacts> {
        let start = crate::procfs::stat(pid).map_or(0, |s| s.start_time);
        if let Some(f) = self.procs.get(&pid) {
            if f.start == start && start != 0 {
                return Some(f.clone());
            }
        }
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let f = ProcFacts {
            start,
            shim: crate::enforcement::maps_library(&maps, "libgpuslice"),
            comm: comm.trim().to_string(),
            cgroup,
            shows: crate::procfs::file_in_root(pid, LIMITS_IN_ROOT),
            escapes: crate::procfs::escape_routes(pid),
        };
        self.procs.insert(pid, f.clone());
        Some(f)
    }

    /// Forgets the processes not in `pids` (gone, or no longer on a GPU).
    pub fn new_tick(&mut self, pids: &[u32]) {
        self.procs.retain(|p, _| pids.contains(p));
    }

    /// The limits record some process of `cgroup` shows in its root.
    fn shown_in_cgroup(&mut self, cgroup: &str) -> Option<FileId> {
        if self
            .cgroups
            .as_ref()
            .is_some_and(|(t, _)| t.elapsed() >= CGROUPS_EVERY)
        {
            self.cgroups = None;
        }
        let (_, table) = self.cgroups.get_or_insert_with(|| {
            let mut t = BTreeMap::new();
            for (pid, cg) in crate::procfs::cgroups() {
                if t.contains_key(&cg) {
                    continue;
                }
                if let Some(id) = crate::procfs::file_in_root(pid, LIMITS_IN_ROOT) {
                    t.insert(cg, id);
                }
            }
            (std::time::Instant::now(), t)
        });
        table.get(cgroup).copied()
    }

    /// Whether `pid` is of `member`'s slice (`slot`: it holds a live slot
    /// in the slice's ledger); its facts when it is.
    fn member(&mut self, m: &Member, pid: u32, slot: bool) -> Option<ProcFacts> {
        let f = self.get(pid)?;
        let of = slot
            || crate::enforcement::in_cgroup_named(&f.cgroup, &m.slice)
            || m.limits.is_some_and(|id| {
                f.shows == Some(id)
                    || (f.shows.is_none() && self.shown_in_cgroup(&f.cgroup) == Some(id))
            });
        of.then_some(f)
    }
}

/// [`facts`], with what is known of the processes kept in `known`.
pub fn facts_cached(
    member: &Member,
    caps: &[(String, u64)],
    snap: Option<&Snapshot>,
    driver: &[DriverProcess],
    known: &mut Known,
) -> SliceFacts {
    let mut holders = Vec::new();
    let mut seen: BTreeMap<u32, Option<ProcFacts>> = BTreeMap::new();
    for p in driver.iter().filter(|p| p.bytes > 0) {
        let slot = snap.and_then(|s| live_slot(s, p.pid));
        let facts = seen
            .entry(p.pid)
            .or_insert_with(|| known.member(member, p.pid, slot.is_some()));
        let Some(f) = facts.clone() else {
            continue;
        };
        let shim_bytes = match (f.shim, slot, snap) {
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
            comm: f.comm,
            uuid: p.uuid.clone(),
            driver_bytes: p.bytes,
            shim_bytes,
            escapes: f.escapes,
        });
    }
    SliceFacts {
        slice: member.slice.clone(),
        caps: caps.to_vec(),
        holders,
    }
}

fn live_slot(s: &Snapshot, pid: u32) -> Option<&crate::ProcessUsage> {
    s.processes
        .iter()
        .find(|q| q.pid == pid && q.state == ProcessState::Live)
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
    /// None: escapes are not judged (`run`'s slices: its own launcher
    /// confines them).
    pub escapes: Option<Escapes>,
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
        // Processes that can escape any cap (a plugin's slices): flagged
        // besides whatever else is judged of them, or refused (killed).
        if let Some(e) = self.escapes {
            for h in f.holders.iter().filter(|h| !h.escapes.is_empty()) {
                if out.iter().any(|a| a.pid == h.pid && a.kill) {
                    continue;
                }
                let refuse = e == Escapes::Refuse;
                if refuse {
                    out.retain(|a| a.pid != h.pid);
                }
                out.push(action(h, Reason::CanEscape, refuse));
            }
        }
        out
    }

    /// [`Enforcer::judge`], then the kills: each process is killed only if
    /// it is still of the slice ([`Member`], checked through a pidfd, so a
    /// reused pid is never killed). Returns what was done.
    pub fn enforce(
        &mut self,
        f: &SliceFacts,
        member: &Member,
        snap: Option<&Snapshot>,
    ) -> Vec<Action> {
        let mut actions = self.judge(f);
        for a in actions.iter_mut().filter(|a| a.kill) {
            let in_slice = |pid: u32| {
                let slot = snap.is_some_and(|s| live_slot(s, pid).is_some());
                Known::default().member(member, pid, slot).is_some()
            };
            a.kill = crate::procfs::kill_if(a.pid, in_slice);
            if a.kill {
                self.unshimmed.remove(&(f.slice.clone(), a.pid));
            }
        }
        actions
    }
}

impl Action {
    /// The line a watcher logs for it (the slice is a field of the log
    /// record beside it).
    pub fn describe(&self) -> String {
        let mib = self.driver_bytes >> 20;
        let (pid, comm, uuid) = (self.pid, &self.comm, &self.uuid);
        match (self.kill, self.reason) {
            (true, Reason::OverCap) => format!(
                "root's enforcer killed pid {pid} ({comm}): the slice held more than its cap on {uuid} by the driver's accounting; it held {mib} MiB"
            ),
            (true, Reason::Unshimmed) => format!(
                "root's enforcer killed pid {pid} ({comm}): a GPU process of the slice the shim does not hold ({mib} MiB on {uuid})"
            ),
            (true, Reason::CanEscape) => format!(
                "root's enforcer killed pid {pid} ({comm}): it can escape any cap of its slice ({mib} MiB on {uuid}), and this plugin refuses such pods"
            ),
            (false, Reason::CanEscape) => format!(
                "pid {pid} ({comm}) can escape any cap of its slice ({mib} MiB on {uuid}): flagged, its slice is not enforced"
            ),
            (false, _) => format!(
                "pid {pid} ({comm}) uses the GPU without the shim ({mib} MiB on {uuid}): flagged (policy: unshimmed_gpu_process = \"flag\")"
            ),
        }
    }
}

/// A slice a root component made and watches: root's limits (its caps),
/// root's limits record on the host (how its processes are known:
/// [`Member`]), its usage ledger and its records directory (root's own,
/// where kills are recorded).
#[derive(Debug, Clone)]
pub struct WatchedSlice {
    pub limits: crate::limits::SliceLimits,
    pub record: Option<std::path::PathBuf>,
    pub usage: std::path::PathBuf,
    pub records: std::path::PathBuf,
    /// Whether and how processes that can escape any cap are judged
    /// (a plugin's pods; None for `run`'s slices).
    pub escapes: Option<Escapes>,
}

/// One slice under watch: the enforcer's state, its ledger once there.
struct SliceWatch {
    spec: WatchedSlice,
    member: Member,
    caps: Vec<(String, u64)>,
    ledger: Option<crate::Ledger>,
    enforcer: Enforcer,
    flagged: Vec<u32>,
    /// Processes recorded as able to escape any cap (once each).
    escaped: Vec<u32>,
}

impl SliceWatch {
    fn new(spec: WatchedSlice, policy: Unshimmed) -> SliceWatch {
        let slice = &spec.limits.slice_id;
        let member = Member::new(slice, spec.record.as_deref());
        let caps = spec.limits.memory_caps();
        SliceWatch {
            member,
            caps,
            ledger: None,
            enforcer: Enforcer {
                escapes: spec.escapes,
                ..Enforcer::new(policy)
            },
            flagged: Vec::new(),
            escaped: Vec::new(),
            spec,
        }
    }

    /// The slice's ledger, opened (and pinned to root's limits) once its
    /// first process made it; a reader's open (no link followed, a
    /// regular file only, guarded against truncation).
    fn ledger(&mut self) -> Option<&crate::Ledger> {
        if self.ledger.is_none() {
            let mut l = crate::Ledger::open(&self.spec.usage).ok()?;
            let _ = l.pin(&self.spec.limits);
            self.ledger = Some(l);
        }
        self.ledger.as_ref()
    }

    /// One tick: facts from `driver`, kills done and recorded. Returns the
    /// kills and, under [`Unshimmed::Flag`], the processes flagged for the
    /// first time (to log).
    fn tick(&mut self, driver: &[DriverProcess], known: &mut Known) -> Vec<Action> {
        let pids: Vec<u32> = driver.iter().map(|p| p.pid).collect();
        let snap = self.ledger().map(|l| l.snapshot_among(&pids));
        let f = facts_cached(&self.member, &self.caps, snap.as_ref(), driver, known);
        let mut out = Vec::new();
        for a in self.enforcer.enforce(&f, &self.member, snap.as_ref()) {
            if a.reason == Reason::CanEscape && !self.escaped.contains(&a.pid) {
                self.escaped.push(a.pid);
                let routes = f
                    .holders
                    .iter()
                    .find(|h| h.pid == a.pid)
                    .map(|h| h.escapes.clone());
                let _ = record_escape(&self.spec.records, &a, &routes.unwrap_or_default());
                if !a.kill {
                    out.push(a);
                    continue;
                }
            }
            if a.kill {
                let _ = record_kill(&self.spec.records, &a);
                out.push(a);
            } else if a.reason != Reason::CanEscape
                && self.enforcer.policy == Unshimmed::Flag
                && !self.flagged.contains(&a.pid)
            {
                self.flagged.push(a.pid);
                out.push(a);
            }
        }
        out
    }
}

/// The slices one root component watches (a `run` launcher its one, a
/// plugin those it made), ticked together: one read of the driver a tick
/// for all of them, what is known of the processes shared.
pub struct NodeWatch {
    policy: Unshimmed,
    slices: BTreeMap<String, SliceWatch>,
    known: Known,
    failing: bool,
}

/// What one tick of a [`NodeWatch`] did.
#[derive(Debug, Default)]
pub struct Tick {
    /// Kills, and processes flagged for the first time.
    pub actions: Vec<Action>,
    /// Why the driver's accounting could not be read, the first tick it
    /// could not (None after, until it could again).
    pub error: Option<String>,
}

impl NodeWatch {
    pub fn new(policy: Unshimmed) -> NodeWatch {
        NodeWatch {
            policy,
            slices: BTreeMap::new(),
            known: Known::default(),
            failing: false,
        }
    }

    /// Watches exactly `slices`: new ones start, gone ones are dropped,
    /// the others keep their state (a slice whose limits changed starts
    /// again).
    pub fn set(&mut self, slices: Vec<WatchedSlice>) {
        let mut keep = BTreeMap::new();
        for s in slices {
            let id = s.limits.slice_id.clone();
            let w = match self.slices.remove(&id) {
                Some(w) if w.spec.limits == s.limits && w.spec.record == s.record => w,
                _ => SliceWatch::new(s, self.policy),
            };
            keep.insert(id, w);
        }
        self.slices = keep;
    }

    /// The slices watched.
    pub fn slices(&self) -> Vec<String> {
        self.slices.keys().cloned().collect()
    }

    /// The UUIDs whose processes the driver must be asked for.
    pub fn uuids(&self) -> Vec<String> {
        let mut u: Vec<String> = self
            .slices
            .values()
            .flat_map(|w| w.spec.limits.uuids())
            .collect();
        u.sort();
        u.dedup();
        u
    }

    /// One tick: `read` gives the driver's processes on [`Self::uuids`];
    /// every slice is judged and its kills done.
    pub fn tick<E: std::fmt::Display>(
        &mut self,
        read: impl FnOnce(&[String]) -> Result<Vec<DriverProcess>, E>,
    ) -> Tick {
        let mut out = Tick::default();
        if self.slices.is_empty() {
            return out;
        }
        let driver = match read(&self.uuids()) {
            Ok(d) => {
                self.failing = false;
                d
            }
            Err(e) => {
                if !self.failing {
                    out.error = Some(e.to_string());
                }
                self.failing = true;
                return out;
            }
        };
        let pids: Vec<u32> = driver.iter().map(|p| p.pid).collect();
        self.known.new_tick(&pids);
        for w in self.slices.values_mut() {
            out.actions.extend(w.tick(&driver, &mut self.known));
        }
        out
    }
}

/// Appends a kill to the slice's `enforcement` file in its records
/// directory `dir` (root's, 0700): `unix_ms reason pid uuid bytes comm`.
pub fn record_kill(dir: &Path, a: &Action) -> std::io::Result<()> {
    append_record(
        &dir.join(ENFORCEMENT_FILE),
        format_args!(
            "{} {} {} {} {}",
            a.reason.as_str(),
            a.pid,
            a.uuid,
            a.driver_bytes,
            one_word(&a.comm)
        ),
    )
}

/// Records that process `a.pid` of the slice can escape any cap (`routes`),
/// in its records directory `dir` ([`UNENFORCEABLE_FILE`]).
pub fn record_escape(dir: &Path, a: &Action, routes: &[&str]) -> std::io::Result<()> {
    append_record(
        &dir.join(UNENFORCEABLE_FILE),
        format_args!("{} {} {}", a.pid, routes.join(","), one_word(&a.comm)),
    )
}

/// Appends `unix_ms fields` as a line to the records file `path`.
fn append_record(path: &Path, fields: std::fmt::Arguments) -> std::io::Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)?;
    writeln!(f, "{now} {fields}")
}

/// A process that can escape its slice's caps, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EscapeRecord {
    pub unix_ms: u64,
    pub pid: u32,
    pub routes: Vec<String>,
    pub comm: String,
}

/// The escapes recorded in the records directory `dir` (none if no file).
pub fn read_escapes(dir: &Path) -> Vec<EscapeRecord> {
    read_records(&dir.join(UNENFORCEABLE_FILE), 4, |f| {
        Some(EscapeRecord {
            unix_ms: f.next()?.parse().ok()?,
            pid: f.next()?.parse().ok()?,
            routes: f.next()?.split(',').map(str::to_string).collect(),
            comm: f.next().unwrap_or("").to_string(),
        })
    })
}

/// The records of a file of one-line records of `fields` space-separated
/// fields (the last, a process name, may be empty); `parse` takes a line's
/// fields and gives None for a line it cannot read, which is skipped.
fn read_records<T>(
    file: &Path,
    fields: usize,
    parse: impl Fn(&mut std::str::SplitN<'_, char>) -> Option<T>,
) -> Vec<T> {
    let text = fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|l| parse(&mut l.splitn(fields, ' ')))
        .collect()
}

/// A process name as one word of a record line.
fn one_word(comm: &str) -> String {
    comm.chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
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
    read_records(&dir.join(ENFORCEMENT_FILE), 6, |f| {
        Some(KillRecord {
            unix_ms: f.next()?.parse().ok()?,
            reason: Reason::parse(f.next()?)?,
            pid: f.next()?.parse().ok()?,
            uuid: f.next()?.to_string(),
            bytes: f.next()?.parse().ok()?,
            comm: f.next().unwrap_or("").to_string(),
        })
    })
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
            escapes: Vec::new(),
        }
    }

    /// A holder all of whose use the shim accounted.
    fn accounted(pid: u32, bytes: u64) -> Holder {
        holder(pid, bytes, Some(bytes))
    }

    /// A pod's process that can escape any cap is flagged by a plugin that
    /// flags, killed by one that refuses, and never judged for `run`'s
    /// slices (escapes None); an unshimmed or over-cap judgement of it is
    /// not made twice.
    #[test]
    fn processes_that_can_escape_are_flagged_or_refused() {
        let mut privileged = accounted(7, 1 << 20);
        privileged.escapes = vec!["CAP_SYS_ADMIN", "hostPID"];
        let f = slice(vec![privileged, accounted(8, 1 << 20)]);
        let judged = |escapes| {
            Enforcer {
                escapes,
                ..Enforcer::new(Unshimmed::Kill)
            }
            .judge(&f)
        };
        let flagged = judged(Some(Escapes::Flag));
        assert_eq!(flagged.len(), 1, "{flagged:?}");
        assert_eq!(
            (flagged[0].pid, flagged[0].reason, flagged[0].kill),
            (7, Reason::CanEscape, false)
        );
        let refused = judged(Some(Escapes::Refuse));
        assert_eq!(
            (refused[0].pid, refused[0].reason, refused[0].kill),
            (7, Reason::CanEscape, true)
        );
        assert!(
            judged(None).is_empty(),
            "run's slices are not judged for escapes"
        );
        // Flagging does not spare it another judgement: unshimmed, it is
        // still killed after the grace ticks.
        let mut unshimmed = holder(9, 1 << 20, None);
        unshimmed.escapes = vec!["hostPID"];
        let f = slice(vec![unshimmed]);
        let mut e = Enforcer {
            escapes: Some(Escapes::Flag),
            ..Enforcer::new(Unshimmed::Kill)
        };
        let last = (0..GRACE_TICKS).map(|_| e.judge(&f)).last().unwrap();
        assert!(
            last.iter().any(|a| a.reason == Reason::Unshimmed && a.kill),
            "{last:?}"
        );
    }

    /// The escape routes are what the kernel shows: this test process (root
    /// on the host) has CAP_SYS_ADMIN and, seen from the host's PID
    /// namespace, the host's namespaces; a child in namespaces of its own
    /// without CAP_SYS_ADMIN has none.
    #[test]
    fn escape_routes_are_read_from_the_kernel() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("needs root (CI runs as root)");
        }
        let mine = crate::procfs::escape_routes(std::process::id());
        assert!(mine.contains(&"CAP_SYS_ADMIN"), "{mine:?}");
        let host = crate::procfs::own_pid_namespace() == crate::procfs::INITIAL_PID_NAMESPACE;
        if host {
            assert!(
                mine.contains(&"hostPID") && mine.contains(&"hostNetwork"),
                "{mine:?}"
            );
        }
        let mut child = std::process::Command::new("unshare")
            .args(["--pid", "--ipc", "--net", "--fork", "--kill-child"])
            .args([
                "setpriv",
                "--inh-caps=-sys_admin",
                "--bounding-set=-sys_admin",
            ])
            .args(["sh", "-c", "echo ready; exec sleep 30"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        // unshare --fork: the sleeper is unshare's child.
        let kids =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id())).unwrap();
        let sleeper: u32 = kids.split_whitespace().next().unwrap().parse().unwrap();
        let theirs = crate::procfs::escape_routes(sleeper);
        let _ = child.kill();
        let _ = child.wait();
        assert!(theirs.is_empty(), "{theirs:?}");
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
            accounted(10, 300 * MIB),
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
        let f = slice(vec![accounted(10, 300 * MIB)]);
        assert!(e.judge(&f).is_empty());
    }

    #[test]
    fn all_accounted_the_largest_goes_until_the_rest_fits() {
        let mut e = Enforcer::new(Unshimmed::Kill);
        let f = slice(vec![
            accounted(1, 600 * MIB),
            accounted(2, 500 * MIB),
            accounted(3, 100 * MIB),
        ]);
        e.judge(&f);
        let a = e.judge(&f);
        assert_eq!(a.iter().map(|a| a.pid).collect::<Vec<_>>(), [1], "{a:?}");
        // Within the cap: nothing, however long.
        let f = slice(vec![accounted(2, 1024 * MIB)]);
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
