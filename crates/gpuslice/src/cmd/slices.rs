//! `gpuslice slices`: live slices with a memory cap or compute share, read
//! from their records and ledgers; and the reaping of slices whose launcher
//! died without removing them.

use std::path::{Path, PathBuf};

use anyhow::Result;
use gpuslice_ledger::enforcement::{ProcessCheck, ProcessTable};
use gpuslice_ledger::limits::{verify_and_read, RecordPaths, LIMITS_FILE, USAGE_FILE};
use gpuslice_ledger::{board, Ledger, ProcessState};
use serde_json::{json, Value};

use crate::global::Global;

/// `run --compute-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ComputeMode {
    Cap,
    Guaranteed,
}

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

fn describe(path: &Path, table: &ProcessTable) -> Value {
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
    json!({
        "slice": s.slice_id,
        "ledger": path.display().to_string(),
        "created_unix_ms": s.created_unix_ms,
        "devices": s.devices.iter().map(|d| json!({
            "index": d.index,
            "uuid": d.uuid,
            "cap_bytes": d.cap,
            "used_bytes": d.used,
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
            "enforced": check_of(p.pid).map(ProcessCheck::enforced),
        })).collect::<Vec<_>>(),
        // GPU processes of the slice (its cgroup) the shim does not hold.
        "unenforced": checks.iter().filter(|c| c.flagged()).map(|c| json!({
            "pid": c.pid,
            "name": c.comm,
            "shim_loaded": c.shim,
            "attached": c.attached,
        })).collect::<Vec<_>>(),
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

/// `cap` or `guaranteed`, as the slice's processes registered on the GPU's
/// board; None before any did (or where no board is shared).
fn board_mode(ledger: &Path, uuid: &str) -> Option<&'static str> {
    let key = board::ledger_key(ledger).ok()?;
    let slot = board::Board::open_existing(&board::board_dir(), uuid)?.find(key)?;
    Some(match slot.mode {
        board::Mode::Cap => "cap",
        board::Mode::Guaranteed => "guaranteed",
    })
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A DRA claim's slice: what it was granted (its usage ledger is in its
/// container's own tmpfs, not visible here).
fn dra_json(s: &gpuslice_dra::checkpoint::PreparedSlice) -> Value {
    json!({
        "slice": s.slice,
        "claim_namespace": s.namespace,
        "claim_name": s.name,
        "claim_uid": s.uid,
        "device": s.device,
        "gpu": s.gpu,
        "cap_bytes": s.caps.map(|c| c.memory_bytes),
        "compute_percent": s.caps.map(|c| c.compute_percent),
    })
}

fn print_dra(s: &Value) {
    let grant = match (s["cap_bytes"].as_u64(), s["compute_percent"].as_u64()) {
        (Some(bytes), Some(pct)) => format!("cap {}, compute share {pct}%", mib(&json!(bytes))),
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

fn mib(v: &Value) -> String {
    v.as_u64().map_or_else(
        || "-".to_string(),
        |b| format!("{:.0}MiB", b as f64 / 1048576.0),
    )
}

/// The line `slices` and `top` end with on a fake host (`gpuslice
/// fakehost`), as `list` does: None on a real one.
pub fn simulation_note(global: &Global) -> Option<String> {
    fakegpu::is_fake_host(&global.host_root).then(|| {
        format!(
            "SIMULATION: {} is a fake GPU host (gpuslice fakehost): simulated GPUs and use",
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
    let slices: Vec<Value> = gpuslice_ledger::list_dir(&dir)
        .iter()
        .map(|p| describe(p, &table))
        .collect();
    let dra_dir = super::dra::state_dir(global);
    let mut out = json!({
        "dir": dir.display().to_string(),
        "simulation": fakegpu::is_fake_host(&global.host_root),
        "slices": slices,
    });
    match gpuslice_dra::checkpoint::prepared_slices(&dra_dir) {
        Ok(d) => out["dra_claims"] = d.iter().map(dra_json).collect(),
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
        println!("slice {}", s["slice"].as_str().unwrap_or("?"));
        for d in s["devices"].as_array().into_iter().flatten() {
            println!(
                "  gpu {} {}  used {} / cap {}  (peak {}, refused {})",
                d["index"],
                d["uuid"].as_str().unwrap_or(""),
                mib(&d["used_bytes"]),
                mib(&d["cap_bytes"]),
                mib(&d["peak_bytes"]),
                d["refusals"]
            );
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
            println!(
                "  pid {:>7} {:<16} {:<10} {}{}",
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
