//! `gpuslice slices`: live slices with a memory cap or compute share, read
//! from their ledgers; and the ledger + shim set-up `run --memory` /
//! `--compute` use.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use gpuslice_core::{Inventory, Selection};
use gpuslice_ledger::{board, DeviceSpec, Ledger, ProcessState};
use serde_json::{json, Value};

use crate::global::Global;

/// `run --compute-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ComputeMode {
    Cap,
    Guaranteed,
}

/// Creates the slice's ledger (one device per selected GPU, in
/// CUDA_VISIBLE_DEVICES order, with the memory cap and compute share and
/// mode given)
/// and adds the shim's variables to `env`. Returns the ledger's path, to be
/// removed when the child exits.
pub fn create_ledger(
    inv: &Inventory,
    sel: &Selection,
    slice_id: &str,
    memory: Option<&str>,
    compute: Option<&str>,
    mode: ComputeMode,
    env: &mut Vec<CString>,
) -> Result<PathBuf> {
    let cap = memory
        .map(parse_memory)
        .transpose()?
        .unwrap_or(gpuslice_ledger::UNLIMITED);
    let share = compute.map(parse_compute).transpose()?.unwrap_or(0);
    let visible = sel.visible_devices(inv);
    let devices: Vec<DeviceSpec> = visible
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|uuid| DeviceSpec {
            uuid: uuid.to_string(),
            cap,
        })
        .collect();
    if devices.is_empty() {
        bail!("--memory/--compute need at least one GPU in --gpus");
    }
    let shim = crate::shim::find().map_err(|e| anyhow!("--memory/--compute: {e}"))?;
    let dir = gpuslice_ledger::ledger_dir();
    gpuslice_ledger::ensure_dir(&dir)?;
    reap_stale_ledgers(&dir);
    let path = dir.join(format!("{slice_id}.ledger"));
    let ledger = Ledger::create(&path, slice_id, &devices)?;
    if share > 0 {
        for d in 0..devices.len() {
            ledger.set_compute(d, share, gpuslice_ledger::DEFAULT_BURST_NS)?;
        }
    }
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", shim.display()),
        _ => shim.display().to_string(),
    };
    let ours = [
        "LD_PRELOAD=",
        "GPUSLICE_MEMORY_LIMIT",
        "GPUSLICE_COMPUTE_LIMIT=",
        "GPUSLICE_COMPUTE_MODE=",
        "GPUSLICE_LEDGER=",
    ];
    env.retain(|kv| !ours.iter().any(|p| kv.as_bytes().starts_with(p.as_bytes())));
    let mut vars = vec![
        format!("LD_PRELOAD={preload}"),
        format!("GPUSLICE_LEDGER={}", path.display()),
    ];
    if memory.is_some() {
        vars.push(format!("GPUSLICE_MEMORY_LIMIT={cap}"));
    }
    if share > 0 {
        vars.push(format!("GPUSLICE_COMPUTE_LIMIT={}", share as f64 / 100.0));
        // Every slice with a share publishes its GPU time on the GPUs'
        // boards (so borrowers see it); the directory is shared by all
        // tenants, like /tmp.
        let boards = gpuslice_ledger::board::board_dir();
        if let Err(e) = gpuslice_ledger::ensure_dir(&boards) {
            if mode == ComputeMode::Guaranteed {
                bail!("--compute-mode guaranteed: {e}");
            }
        }
        if mode == ComputeMode::Guaranteed {
            vars.push("GPUSLICE_COMPUTE_MODE=guaranteed".into());
        }
    }
    for kv in vars {
        env.push(CString::new(kv).map_err(|_| anyhow!("NUL byte in a path"))?);
    }
    tracing::info!(ledger = %path.display(), shim = %shim.display(), cap, share_bp = share, "slice limits");
    Ok(path)
}

/// Removes the ledgers a dead launcher left behind (a SIGKILLed `run`
/// never removes its own), as its cgroups are reaped: a ledger goes when
/// the process that created it is gone (or its pid was reused) *and*,
/// after its dead processes are reclaimed, no live process of any pid
/// namespace holds a slot. Returns the files removed; anything that cannot
/// be judged is kept.
pub fn reap_stale_ledgers(dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for path in gpuslice_ledger::list_dir(dir) {
        let Ok(ledger) = Ledger::open(&path) else {
            continue;
        };
        let before = ledger.snapshot();
        let created =
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(before.created_unix_ms);
        if before.creator_pid == 0
            || gpuslice_isolate::cgroup::launcher_alive(before.creator_pid, created)
        {
            continue;
        }
        if ledger.reap().is_err() || !ledger.snapshot().processes.is_empty() {
            continue; // read-only to us, or still in use
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(ledger = %path.display(), "removed the ledger of a dead launcher");
                removed.push(path);
            }
            Err(e) => tracing::debug!(ledger = %path.display(), "kept: {e}"),
        }
    }
    removed
}

/// `run --memory`: bytes.
pub fn parse_memory(m: &str) -> Result<u64> {
    gpuslice_ledger::parse_size(m)
        .filter(|&c| c > 0)
        .ok_or_else(|| anyhow!("--memory {m:?}: not a size (e.g. 20GiB, 512MiB)"))
}

/// `run --compute`: basis points.
pub fn parse_compute(c: &str) -> Result<u64> {
    parse_percent(c)
        .ok_or_else(|| anyhow!("--compute {c:?}: not a percentage in (0, 100] (e.g. 25)"))
}

/// `25`, `12.5`, `50%` → basis points (1..=10000).
fn parse_percent(text: &str) -> Option<u64> {
    let v: f64 = text.trim().trim_end_matches('%').trim().parse().ok()?;
    (v > 0.0 && v <= 100.0).then(|| ((v * 100.0).round() as u64).max(1))
}

fn describe(path: &Path) -> Value {
    let ledger = match Ledger::open(path) {
        Ok(l) => l,
        Err(e) => return json!({ "ledger": path.display().to_string(), "error": e.to_string() }),
    };
    // Whoever reads a ledger reclaims its dead processes' bytes.
    let reaped = ledger.reap().ok();
    let s = ledger.snapshot();
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
        "processes": s.processes.iter().map(|p| json!({
            "pid": p.pid,
            "name": p.comm,
            "state": match p.state {
                ProcessState::Live => "live",
                ProcessState::Transient => "transient",
                ProcessState::OtherNamespace => "other-pid-namespace",
            },
            "bytes": p.bytes,
        })).collect::<Vec<_>>(),
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
    reap_stale_ledgers(&dir);
    let slices: Vec<Value> = gpuslice_ledger::list_dir(&dir)
        .iter()
        .map(|p| describe(p))
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
                "  pid {:>7} {:<16} {:<10} {}",
                p["pid"],
                p["name"].as_str().unwrap_or(""),
                p["state"].as_str().unwrap_or(""),
                bytes.join(" ")
            );
        }
    }
    Ok(0)
}
