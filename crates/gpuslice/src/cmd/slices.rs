//! `gpuslice slices`: live slices with a memory cap or compute share, read
//! from their records and ledgers; and the reaping of slices whose launcher
//! died without removing them.

use std::path::{Path, PathBuf};

use anyhow::Result;
use gpuslice_cuda_load::partitions::Partitions;
use gpuslice_ledger::enforcement::{ProcessCheck, ProcessTable};
use gpuslice_ledger::enforcer::{facts, read_escapes, read_kills, Member, SliceFacts};
use gpuslice_ledger::limits::{verify_and_read, RecordPaths, LIMITS_FILE, USAGE_FILE};
use gpuslice_ledger::{board, Ledger, ProcessState};
use serde_json::{json, Value};

use crate::global::Global;

/// Removes the slices a dead launcher left behind (a SIGKILLed `run` never
/// removes its own), as its cgroups are reaped: a slice goes when the
/// process that created its ledger is gone (or its pid was reused) *and*,
/// after its dead processes are reclaimed, no live process of any pid
/// namespace holds a slot. A slice's records go with its ledger, and its
/// root-written shares with them (a later ledger on the same inode must not
/// inherit them). The device plugin's slices are left to the plugin.
/// Returns the ledgers removed; anything that cannot be judged is kept.
pub fn reap_stale_ledgers(dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for path in gpuslice_ledger::list_dir(dir) {
        let Ok(ledger) = Ledger::open(&path) else {
            continue;
        };
        let before = ledger.snapshot();
        // The device plugin's replicas (`k8s-…`, see
        // gpuslice_k8s::plugin::resources::slice_id) share the directory;
        // their records outlive a plugin restart and are its sweep's to
        // remove, by the pods the kubelet still holds.
        if before.slice_id.starts_with("k8s-") {
            continue;
        }
        let created =
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(before.created_unix_ms);
        if before.creator_pid == 0
            || gpuslice_isolate::cgroup::launcher_alive(before.creator_pid, created)
        {
            continue;
        }
        if ledger.reap().is_err() || !ledger.snapshot().processes.is_empty() || ledger.lost() {
            continue; // read-only to us, still in use, or truncated as we read
        }
        let key = board::ledger_key(&path).ok();
        let in_records = path.file_name().is_some_and(|n| n == USAGE_FILE);
        let gone = if in_records {
            let records = RecordPaths::under(path.parent().unwrap_or(dir));
            records.remove();
            !path.exists()
        } else {
            std::fs::remove_file(&path).is_ok()
        };
        if !gone {
            tracing::debug!(ledger = %path.display(), "kept: not removable");
            continue;
        }
        if let Some(key) = key {
            for d in &before.devices {
                board::withdraw_share(&board::board_dir(), &d.uuid, key);
            }
        }
        tracing::info!(ledger = %path.display(), "removed the slice of a dead launcher");
        removed.push(path);
    }
    removed
}

/// The driver's accounting of the slice (`gpuslice_ledger::enforcer`):
/// its processes' memory by NVML, from the host, or why there is none.
fn driver_facts(
    nvml: &Result<gpuslice_cuda_load::Nvml, String>,
    s: &gpuslice_ledger::Snapshot,
    member: &Member,
) -> Result<SliceFacts, String> {
    let nvml = nvml.as_ref().map_err(Clone::clone)?;
    let uuids: Vec<String> = s.devices.iter().map(|d| d.uuid.clone()).collect();
    let driver = gpuslice_k8s::enforcer::driver_processes(nvml, &uuids)?;
    let caps: Vec<(String, u64)> = s
        .devices
        .iter()
        .filter_map(|d| Some((d.uuid.clone(), d.cap?)))
        .collect();
    Ok(facts(member, &caps, Some(s), &driver))
}

fn describe(
    path: &Path,
    table: &ProcessTable,
    nvml: &Result<gpuslice_cuda_load::Nvml, String>,
    partitions: Option<&Partitions>,
    cgroups: Option<&Path>,
) -> Value {
    let mut ledger = match Ledger::open(path) {
        Ok(l) => l,
        Err(e) => return json!({ "ledger": path.display().to_string(), "error": e.to_string() }),
    };
    // A slice with a limits record: its caps and shares are the record's
    // (the ledger's copies are the slice's to write).
    let record = path
        .parent()
        .map(|d| d.join(LIMITS_FILE))
        .filter(|_| path.file_name().is_some_and(|n| n == USAGE_FILE));
    let limits = record.as_deref().map(|r| verify_and_read(r, false));
    if let Some(Ok(l)) = &limits {
        if let Err(e) = ledger.pin(l) {
            return json!({ "ledger": path.display().to_string(), "error": e.to_string() });
        }
    }
    // Whoever reads a ledger reclaims its dead processes' bytes.
    let reaped = ledger.reap().ok();
    let s = ledger.snapshot();
    let checks = table.check(&s.slice_id, &s);
    let check_of = |pid: u32| checks.iter().find(|c| c.pid == pid);
    // Its processes: by cgroup, ledger slot, or root's limits record seen
    // in their root (a container's: the device plugin's replicas).
    let member = Member::new(&s.slice_id, record.as_deref());
    let driver = driver_facts(nvml, &s, &member);
    let facts = driver.as_ref().ok();
    // Enforced: the shim holds it and accounts for all the driver says it
    // holds (never a process holding more than its ledger slot says).
    let enforced = |pid: u32| {
        let held = check_of(pid).map(ProcessCheck::enforced)?;
        Some(
            held && facts.is_none_or(|f| {
                f.holders
                    .iter()
                    .filter(|h| h.pid == pid)
                    .all(|h| h.accounted())
            }),
        )
    };
    let records = path
        .parent()
        .filter(|_| path.file_name().is_some_and(|n| n == USAGE_FILE));
    let kills = records.map(read_kills).unwrap_or_default();
    let escapes = records.map(escapes_json).unwrap_or_default();
    // Which layers hold the slice's memory: the shim (a cap in its
    // ledger), root's enforcer (`run`'s slices: an `enforcement` record
    // directory of root's), the driver (a hard limit on its cgroup).
    let driver_limits: Vec<Value> = s
        .devices
        .iter()
        .filter_map(|d| {
            let l = partitions?.get(&d.uuid, &cgroups?.join(&s.slice_id)).ok()??;
            Some(json!({ "uuid": d.uuid, "hard_bytes": l.hard, "soft_bytes": l.soft, "current_used_bytes": l.current_used }))
        })
        .collect();
    let mut layers = Vec::new();
    if s.devices.iter().any(|d| d.cap.is_some()) {
        layers.push("shim");
    }
    if driver_limits
        .iter()
        .any(|l| l["hard_bytes"].as_u64().is_some_and(|h| h > 0))
    {
        layers.push("driver");
    }
    json!({
        "slice": s.slice_id,
        "ledger": path.display().to_string(),
        "created_unix_ms": s.created_unix_ms,
        "devices": s.devices.iter().map(|d| json!({
            "index": d.index,
            "uuid": d.uuid,
            "cap_bytes": d.cap,
            "used_bytes": d.used,
            "driver_used_bytes": facts.map(|f| f.driver_used(&d.uuid)),
            "peak_bytes": d.peak,
            "refusals": d.refusals,
        })).collect::<Vec<_>>(),
        "limits": match &limits {
            None => json!("self-imposed (environment)"),
            Some(Ok(_)) => json!("root's record"),
            Some(Err(e)) => json!(format!("unusable: {e}")),
        },
        "processes": s.processes.iter().map(|p| json!({
            "pid": p.pid,
            "name": p.comm,
            "state": match p.state {
                ProcessState::Live => "live",
                ProcessState::Transient => "transient",
                ProcessState::OtherNamespace => "other-pid-namespace",
            },
            "bytes": p.bytes,
            "driver_bytes": facts.map(|f| s.devices.iter()
                .map(|d| f.driver_bytes(p.pid, &d.uuid).unwrap_or(0))
                .collect::<Vec<_>>()),
            "enforced": enforced(p.pid),
        })).collect::<Vec<_>>(),
        // What the driver says each process of the slice holds (NVML's
        // running processes, from the host), with what its ledger slot says.
        "driver": driver_json(&driver),
        "memory_layers": layers,
        "driver_limits": driver_limits,
        "enforcement_kills": kills_json(&kills),
        // A plugin's pods' processes that can escape any cap.
        "unenforceable_processes": escapes,
        // GPU processes of the slice (its cgroup) the shim does not hold:
        // those that map the driver or hold its nodes, and those the
        // driver lists with memory.
        "unenforced": unenforced(&checks, facts),
        "attach_failures": s.attach_failures,
        "compute": s.compute.iter().map(|c| {
            let age_ns = now_ms().saturating_sub(s.created_unix_ms) as f64 * 1e6;
            json!({
                "index": c.index,
                "share_percent": c.share_bp.map(|b| b as f64 / 100.0),
                "mode": board_mode(path, &ledger.uuid(c.index)),
                "busy_ns": c.busy_ns,
                "use_percent": (age_ns > 0.0).then(|| 100.0 * c.busy_ns as f64 / age_ns),
                "throttled_ns": c.throttled_ns,
                "launches": c.launches,
                "delayed_launches": c.delayed_launches,
            })
        }).collect::<Vec<_>>(),
        "ledger_version": s.version,
        "reclaimed_now": reaped.map(|r| json!({ "processes": r.slots, "bytes": r.bytes })),
        "reclaimed_total": { "processes": s.reclaimed_slots, "bytes": s.reclaimed_bytes },
    })
}

/// The `driver` object: the slice's processes by the driver's accounting.
fn driver_json(driver: &Result<SliceFacts, String>) -> Value {
    match driver {
        Ok(f) => json!({
            "source": "nvml",
            "processes": f.holders.iter().map(|h| json!({
                "pid": h.pid,
                "name": h.comm,
                "uuid": h.uuid,
                "driver_bytes": h.driver_bytes,
                "shim_bytes": h.shim_bytes,
                "accounted": h.accounted(),
            })).collect::<Vec<_>>(),
        }),
        Err(e) => json!({ "error": e }),
    }
}

/// The `unenforceable_processes` list: the processes of a plugin's slice
/// that root's enforcer found able to escape any cap, recorded in the
/// slice's records directory `dir`.
fn escapes_json(dir: &Path) -> Vec<Value> {
    read_escapes(dir)
        .iter()
        .map(|e| json!({"unix_ms": e.unix_ms, "pid": e.pid, "name": e.comm, "routes": e.routes}))
        .collect()
}

/// The `enforcement_kills` list: root's enforcer's recorded kills.
fn kills_json(kills: &[gpuslice_ledger::enforcer::KillRecord]) -> Vec<Value> {
    kills
        .iter()
        .map(|k| {
            json!({
                "unix_ms": k.unix_ms,
                "reason": k.reason.as_str(),
                "pid": k.pid,
                "name": k.comm,
                "uuid": k.uuid,
                "driver_bytes": k.bytes,
            })
        })
        .collect()
}

fn unenforced(checks: &[ProcessCheck], facts: Option<&SliceFacts>) -> Vec<Value> {
    let mut out: Vec<Value> = checks
        .iter()
        .filter(|c| c.flagged())
        .map(|c| {
            json!({
                "pid": c.pid,
                "name": c.comm,
                "shim_loaded": c.shim,
                "attached": c.attached,
            })
        })
        .collect();
    for h in facts.iter().flat_map(|f| &f.holders) {
        if h.shim_bytes.is_some() || out.iter().any(|v| v["pid"] == h.pid) {
            continue;
        }
        let c = checks.iter().find(|c| c.pid == h.pid);
        out.push(json!({
            "pid": h.pid,
            "name": h.comm,
            "shim_loaded": c.is_some_and(|c| c.shim),
            "attached": c.is_some_and(|c| c.attached),
        }));
    }
    out
}

/// `cap` or `guaranteed`, as the slice's processes registered on the GPU's
/// board; None before any did (or where no board is shared).
fn board_mode(ledger: &Path, uuid: &str) -> Option<String> {
    let key = board::ledger_key(ledger).ok()?;
    let slot = board::Board::open_existing(&board::board_dir(), uuid)?.find(key)?;
    Some(slot.mode.to_string())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Where `slices` reads what DRA claims' slices hold: the host root
/// `root` (their usage ledgers), the plugin's state directory `dra_dir`
/// (its enforcer's records) and NVML (the driver's accounting).
struct ClaimSources<'a> {
    root: &'a Path,
    dra_dir: &'a Path,
    nvml: &'a Result<gpuslice_cuda_load::Nvml, String>,
}

impl ClaimSources<'_> {
    /// A claim's slice: what it was granted and what it holds.
    fn json(&self, s: &gpuslice_dra::checkpoint::ClaimSlice) -> Value {
        let mut v = json!({
            "used_bytes": self.used(&s.slice),
            "slice": s.slice,
            "claim_namespace": s.namespace,
            "claim_name": s.name,
            "claim_uid": s.uid,
            "device": s.device,
            "gpu": s.gpu,
            "cap_bytes": s.caps.map(|c| c.memory_bytes()),
            "compute_percent": s.caps.map(|c| c.compute_percent()),
            "unenforceable": s.unenforceable,
        });
        if let (Some(o), Value::Object(d)) = (v.as_object_mut(), self.driver(s)) {
            o.extend(d);
        }
        v
    }

    /// The usage ledger all the containers of a claim's slice share on the
    /// host (`<root>/run/gpuslice/claims/<slice>/usage`).
    fn usage(&self, slice: &str) -> PathBuf {
        self.root
            .join(gpuslice_dra::claimfs::CLAIMS_DIR)
            .join(slice)
            .join(USAGE_FILE)
    }

    /// What a claim's slice holds by its usage ledger; None before any
    /// process of it started (or for an uncapped slice).
    fn used(&self, slice: &str) -> Option<u64> {
        // A reader's open: no link followed, a regular file only, guarded.
        let l = Ledger::open(&self.usage(slice)).ok()?;
        let _ = l.reap();
        Some(l.used(0))
    }

    /// A claim slice's processes by the driver's accounting (known by its
    /// limits record, as root's enforcer in the DRA plugin knows them), and
    /// the kills recorded in the plugin's state directory.
    fn driver(&self, s: &gpuslice_dra::checkpoint::ClaimSlice) -> Value {
        let Some(record) = &s.record else {
            return json!({});
        };
        let driver = (|| {
            let limits = verify_and_read(record, false).map_err(|e| e.to_string())?;
            let nvml = self.nvml.as_ref().map_err(Clone::clone)?;
            let (uuids, caps) = (limits.uuids(), limits.memory_caps());
            let driver = gpuslice_k8s::enforcer::driver_processes(nvml, &uuids)?;
            let pids: Vec<u32> = driver.iter().map(|p| p.pid).collect();
            let snap = Ledger::open(&self.usage(&s.slice))
                .ok()
                .map(|l| l.snapshot_among(&pids));
            let member = Member::new(&s.slice, Some(record));
            Ok(facts(&member, &caps, snap.as_ref(), &driver))
        })();
        let records = gpuslice_dra::checkpoint::enforcement_dir(self.dra_dir, &s.slice);
        let kills = read_kills(&records);
        json!({
            "driver_used_bytes": driver
                .as_ref()
                .ok()
                .map(|f| f.holders.iter().map(|h| h.driver_bytes).sum::<u64>()),
            "driver": driver_json(&driver),
            "enforcement_kills": kills_json(&kills),
            "unenforceable_processes": escapes_json(&records),
        })
    }
}

fn print_dra(s: &Value) {
    // Names and paths can come from what a claim's pods did (a process's
    // name): control characters escaped, as for the ledgers' slices.
    let mut s = s.clone();
    printable_json(&mut s);
    let s = &s;
    let grant = match (s["cap_bytes"].as_u64(), s["compute_percent"].as_u64()) {
        (Some(bytes), Some(pct)) => format!(
            "{}cap {}, compute share {pct}%",
            s["used_bytes"]
                .as_u64()
                .map_or(String::new(), |u| format!("used {} / ", mib(&json!(u)))),
            mib(&json!(bytes))
        ),
        _ => "the whole device".into(),
    };
    let text = |k: &str| printable(s[k].as_str().unwrap_or("?"));
    println!(
        "slice {} (DRA claim {}/{}): gpu {} {}  {grant}",
        text("slice"),
        text("claim_namespace"),
        text("claim_name"),
        s["gpu"],
        text("device")
    );
    let escapes: Vec<String> = super::json_strings(&s["unenforceable"])
        .map(printable)
        .collect();
    if !escapes.is_empty() {
        println!(
            "  NOT ENFORCED: its pods can escape the caps: {}",
            escapes.join("; ")
        );
    }
    if let Some(u) = s["driver_used_bytes"].as_u64() {
        println!("  driver {} held by its processes", mib(&json!(u)));
    }
    for h in s["driver"]["processes"].as_array().into_iter().flatten() {
        if h["accounted"] != true {
            print_unaccounted(h);
        }
    }
    print_kills(s);
}

/// A process holding more than the shim accounted for (an element of the
/// `driver` object's `processes`).
fn print_unaccounted(h: &Value) {
    println!(
        "  pid {:>7} {:<16} NOT ENFORCED: the driver says it holds {} on {}, the shim accounted {}",
        h["pid"],
        h["name"].as_str().unwrap_or(""),
        mib(&h["driver_bytes"]),
        h["uuid"].as_str().unwrap_or(""),
        mib(&h["shim_bytes"]),
    );
}

/// The kills of root's enforcer recorded for slice `s`, one line each,
/// and the processes it found able to escape any cap.
fn print_kills(s: &Value) {
    for e in s["unenforceable_processes"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let routes: Vec<String> = super::json_strings(&e["routes"]).map(printable).collect();
        println!(
            "  pid {:>7} {:<16} NOT ENFORCED: it can escape any cap ({})",
            e["pid"],
            printable(e["name"].as_str().unwrap_or("")),
            routes.join(", "),
        );
    }
    for k in s["enforcement_kills"].as_array().into_iter().flatten() {
        println!(
            "  pid {:>7} {:<16} KILLED by root's enforcer ({}): it held {} on {}",
            k["pid"],
            k["name"].as_str().unwrap_or(""),
            match k["reason"].as_str() {
                Some("over_cap") => "the slice was over its cap",
                Some("can_escape") => "it could escape any cap, and the plugin refuses such pods",
                _ => "a GPU process without the shim",
            },
            mib(&k["driver_bytes"]),
            k["uuid"].as_str().unwrap_or(""),
        );
    }
}

/// `text` with its control characters written as `\u{..}` escapes, for a
/// terminal: a tenant's escape sequences could otherwise move the cursor
/// over, or erase, what the report says about its slice.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// [`printable`] applied to every string in `v`.
fn printable_json(v: &mut Value) {
    match v {
        Value::String(s) => *s = printable(s),
        Value::Array(a) => a.iter_mut().for_each(printable_json),
        Value::Object(o) => o.values_mut().for_each(printable_json),
        _ => {}
    }
}

/// The owners of `junk` and how many entries each has, most first.
fn junk_owners(junk: &[gpuslice_ledger::Junk]) -> Vec<(u32, usize)> {
    let mut counts = std::collections::BTreeMap::<u32, usize>::new();
    for j in junk {
        *counts.entry(j.uid).or_default() += 1;
    }
    let mut v: Vec<(u32, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

fn mib(v: &Value) -> String {
    v.as_u64().map_or_else(
        || "-".to_string(),
        |b| format!("{:.0}MiB", b as f64 / 1048576.0),
    )
}

/// The line `slices` and `top` end with on a fake host
/// (`gpuslice-fakehost`), as `list` does: None on a real one.
pub fn simulation_note(global: &Global) -> Option<String> {
    gpuslice_core::simulation::is_simulated(&global.host_root).then(|| {
        format!(
            "SIMULATION: {} is a fake GPU host (gpuslice-fakehost): simulated GPUs and use",
            global.host_root.display()
        )
    })
}

pub fn run(global: &Global) -> Result<i32> {
    let code = report(global)?;
    if !global.json {
        if let Some(note) = simulation_note(global) {
            println!("{note}");
        }
    }
    Ok(code)
}

/// What `slices --json` prints, and what `gpuslice top` shows each
/// second: every slice of the ledger directory (the stale ones reaped
/// first, as any reader reaps them) with its devices, share, use,
/// processes and their enforcement, and the DRA claims prepared here.
pub fn snapshot(global: &Global) -> Value {
    let dir = gpuslice_ledger::ledger_dir();
    reap_stale_ledgers(&dir);
    let table = ProcessTable::scan();
    let scan = gpuslice_ledger::scan_dir(&dir);
    let listed = &scan.ledgers;
    let dra_dir = super::dra::state_dir(global);
    let dra = gpuslice_dra::checkpoint::prepared_slices(&dra_dir);
    let nvml = if listed.is_empty() && dra.as_ref().map_or(true, |d| d.is_empty()) {
        Err("no slices".to_string())
    } else {
        gpuslice_cuda_load::open_nvml(None).map_err(|e| format!("NVML: {e}"))
    };
    // The driver's memory partitions (R615+), where it has them.
    let partitions = if listed.is_empty() {
        None
    } else {
        Partitions::open().ok()
    };
    let cgroups = gpuslice_isolate::cgroup::CgroupDriver::detect(None)
        .ok()
        .map(|d| d.slices_dir());
    let slices: Vec<Value> = listed
        .iter()
        .map(|p| describe(p, &table, &nvml, partitions.as_ref(), cgroups.as_deref()))
        .collect();
    let owners = junk_owners(&scan.junk);
    let mut out = json!({
        "dir": dir.display().to_string(),
        "simulation": gpuslice_core::simulation::is_simulated(&global.host_root),
        "slices": slices,
    });
    // Apart from the slices: what else any local user put there.
    out["junk"] = json!({
        "count": scan.junk.len(),
        "owners": owners.iter().map(|(uid, n)| json!({ "uid": uid, "entries": n })).collect::<Vec<_>>(),
        "entries": scan.junk.iter().map(|j| json!({
            "path": printable(&j.path.display().to_string()),
            "uid": j.uid,
        })).collect::<Vec<_>>(),
    });
    match dra {
        Ok(d) => {
            let claims = ClaimSources {
                root: &global.host_root,
                dra_dir: &dra_dir,
                nvml: &nvml,
            };
            out["dra_claims"] = d.iter().map(|s| claims.json(s)).collect()
        }
        Err(e) => out["dra_error"] = json!(e.to_string()),
    }
    out
}

fn report(global: &Global) -> Result<i32> {
    let snap = snapshot(global);
    if global.json {
        println!("{}", serde_json::to_string_pretty(&snap)?);
        return Ok(0);
    }
    let dir = snap["dir"].as_str().unwrap_or("?");
    let mut slices: Vec<Value> = snap["slices"].as_array().cloned().unwrap_or_default();
    let dra: Result<Vec<Value>, &str> = match snap.get("dra_error") {
        Some(e) => Err(e.as_str().unwrap_or("?")),
        None => Ok(snap["dra_claims"].as_array().cloned().unwrap_or_default()),
    };
    match &dra {
        Ok(d) => {
            for s in d {
                print_dra(s);
            }
        }
        Err(e) => println!("DRA claims: {e}"),
    }
    let junk = snap["junk"]["count"].as_u64().unwrap_or(0);
    if junk > 0 {
        // One line, however many: 50,000 planted files must not bury the
        // report (`--json` lists them).
        let by: Vec<String> = snap["junk"]["owners"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| format!("uid {}: {}", o["uid"], o["entries"]))
            .collect();
        println!(
            "junk in {}: {junk} entries that are not ledgers (owners {}); see --json, remove as root",
            printable(dir),
            by.join(", ")
        );
    }
    if slices.is_empty() {
        if dra.is_ok_and(|d| !d.is_empty()) {
            return Ok(0);
        }
        println!("no slices with a memory cap or compute share in {dir}");
        return Ok(0);
    }
    for s in slices.iter_mut() {
        // Names, UUIDs, paths and errors can come from what a slice wrote
        // (its ledger, a file it made in the ledger directory).
        printable_json(s);
    }
    for s in &slices {
        if let Some(e) = s.get("error") {
            println!(
                "{}: {}",
                s["ledger"].as_str().unwrap_or("?"),
                e.as_str().unwrap_or("?")
            );
            continue;
        }
        let layers: Vec<&str> = super::json_strings(&s["memory_layers"]).collect();
        println!(
            "slice {}{}",
            s["slice"].as_str().unwrap_or("?"),
            if layers.is_empty() {
                String::new()
            } else {
                format!("  (memory held by: {})", layers.join(", "))
            }
        );
        for d in s["devices"].as_array().into_iter().flatten() {
            let driver = match d["driver_used_bytes"].as_u64() {
                Some(_) => format!("  driver {}", mib(&d["driver_used_bytes"])),
                None => String::new(),
            };
            let over = match (d["driver_used_bytes"].as_u64(), d["cap_bytes"].as_u64()) {
                (Some(u), Some(c)) if u > c => "  OVER THE CAP by the driver's accounting",
                _ => "",
            };
            println!(
                "  gpu {} {}  used {} / cap {}{driver}  (peak {}, refused {}){over}",
                d["index"],
                d["uuid"].as_str().unwrap_or(""),
                mib(&d["used_bytes"]),
                mib(&d["cap_bytes"]),
                mib(&d["peak_bytes"]),
                d["refusals"]
            );
        }
        if let Some(e) = s["driver"]["error"].as_str() {
            println!("  driver's accounting: {e}");
        }
        for c in s["compute"].as_array().into_iter().flatten() {
            let Some(share) = c["share_percent"].as_f64() else {
                continue;
            };
            let mode = match c["mode"].as_str() {
                Some("guaranteed") => " guaranteed (borrows idle time)",
                _ => "",
            };
            println!(
                "  gpu {} compute share {share}%{mode}  used {:.1}% since start  (GPU {:.1}s, throttled {:.1}s, {} of {} launches delayed)",
                c["index"],
                c["use_percent"].as_f64().unwrap_or(0.0),
                c["busy_ns"].as_f64().unwrap_or(0.0) / 1e9,
                c["throttled_ns"].as_f64().unwrap_or(0.0) / 1e9,
                c["delayed_launches"],
                c["launches"],
            );
        }
        for p in s["processes"].as_array().into_iter().flatten() {
            let bytes: Vec<String> = p["bytes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(mib)
                .collect();
            let driver: Vec<String> = p["driver_bytes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(mib)
                .collect();
            let driver = if driver.is_empty() {
                String::new()
            } else {
                format!("  driver {}", driver.join(" "))
            };
            println!(
                "  pid {:>7} {:<16} {:<10} {}{driver}{}",
                p["pid"],
                p["name"].as_str().unwrap_or(""),
                p["state"].as_str().unwrap_or(""),
                bytes.join(" "),
                if p["enforced"] == true {
                    "  enforced"
                } else {
                    ""
                }
            );
        }
        // Processes holding memory the shim does not account for.
        for h in s["driver"]["processes"].as_array().into_iter().flatten() {
            if h["accounted"] == true || h["shim_bytes"].is_null() {
                continue; // accounted, or flagged below as without the shim
            }
            print_unaccounted(h);
        }
        print_kills(s);
        for p in s["unenforced"].as_array().into_iter().flatten() {
            println!(
                "  pid {:>7} {:<16} NOT ENFORCED: a GPU process of the slice {}",
                p["pid"],
                p["name"].as_str().unwrap_or(""),
                if p["shim_loaded"] == true {
                    "that could not join the ledger"
                } else {
                    "without the shim"
                }
            );
        }
        if let Some(n) = s["attach_failures"].as_u64().filter(|&n| n > 0) {
            println!(
                "  {n} process(es) could not join the ledger: their CUDA initialisation failed"
            );
        }
        if let Some(l) = s["limits"].as_str().filter(|l| l.starts_with("unusable")) {
            println!("  limits {l}");
        }
    }
    Ok(0)
}
