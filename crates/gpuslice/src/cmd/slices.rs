//! `gpuslice slices`: live slices with a memory cap or compute share, read
//! from their records and ledgers.

use std::path::Path;

use anyhow::Result;
use gpuslice_ledger::enforcement::{ProcessCheck, ProcessTable};
use gpuslice_ledger::limits::{verify_and_read, LIMITS_FILE, USAGE_FILE};
use gpuslice_ledger::{board, Ledger, ProcessState};
use serde_json::{json, Value};

use crate::global::Global;

/// `run --compute-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ComputeMode {
    Cap,
    Guaranteed,
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

fn mib(v: &Value) -> String {
    v.as_u64().map_or_else(
        || "-".to_string(),
        |b| format!("{:.0}MiB", b as f64 / 1048576.0),
    )
}

pub fn run(global: &Global) -> Result<i32> {
    let dir = gpuslice_ledger::ledger_dir();
    let table = ProcessTable::scan();
    let slices: Vec<Value> = gpuslice_ledger::list_dir(&dir)
        .iter()
        .map(|p| describe(p, &table))
        .collect();
    if global.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "dir": dir.display().to_string(), "slices": slices })
            )?
        );
        return Ok(0);
    }
    if slices.is_empty() {
        println!(
            "no slices with a memory cap or compute share in {}",
            dir.display()
        );
        return Ok(0);
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
