//! `gpuslice slices`: live slices with a memory cap, read from their
//! ledgers; and the ledger + shim set-up `run --memory` uses.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use gpuslice_core::{Inventory, Selection};
use gpuslice_ledger::{DeviceSpec, Ledger, ProcessState};
use serde_json::{json, Value};

use crate::cli::Cli;

/// Where the shim is: `$GPUSLICE_SHIM`, else `libgpuslice.so` next to the
/// gpuslice binary.
pub fn shim_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("GPUSLICE_SHIM").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("GPUSLICE_SHIM={} is not a file", p.display());
    }
    let exe = std::env::current_exe().context("cannot find the gpuslice binary")?;
    let p = exe.with_file_name("libgpuslice.so");
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "--memory needs libgpuslice.so next to {} (or GPUSLICE_SHIM=path)",
            exe.display()
        )
    }
}

/// Creates the slice's ledger (one capped device per selected GPU, in
/// CUDA_VISIBLE_DEVICES order) and adds the shim's variables to `env`.
/// Returns the ledger's path, to be removed when the child exits.
pub fn create_ledger(
    inv: &Inventory,
    sel: &Selection,
    slice_id: &str,
    memory: &str,
    env: &mut Vec<CString>,
) -> Result<PathBuf> {
    let cap = gpuslice_ledger::parse_size(memory)
        .filter(|&c| c > 0)
        .ok_or_else(|| anyhow!("--memory {memory:?}: not a size (e.g. 20GiB, 512MiB)"))?;
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
        bail!("--memory needs at least one GPU in --gpus");
    }
    let shim = shim_path()?;
    let dir = gpuslice_ledger::ledger_dir();
    gpuslice_ledger::ensure_dir(&dir)?;
    let path = dir.join(format!("{slice_id}.ledger"));
    Ledger::create(&path, slice_id, &devices)?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", shim.display()),
        _ => shim.display().to_string(),
    };
    let ours = ["LD_PRELOAD=", "GPUSLICE_MEMORY_LIMIT", "GPUSLICE_LEDGER="];
    env.retain(|kv| !ours.iter().any(|p| kv.as_bytes().starts_with(p.as_bytes())));
    for kv in [
        format!("LD_PRELOAD={preload}"),
        format!("GPUSLICE_MEMORY_LIMIT={cap}"),
        format!("GPUSLICE_LEDGER={}", path.display()),
    ] {
        env.push(CString::new(kv).map_err(|_| anyhow!("NUL byte in a path"))?);
    }
    tracing::info!(ledger = %path.display(), shim = %shim.display(), cap, "memory cap");
    Ok(path)
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
        "reclaimed_now": reaped.map(|r| json!({ "processes": r.slots, "bytes": r.bytes })),
        "reclaimed_total": { "processes": s.reclaimed_slots, "bytes": s.reclaimed_bytes },
    })
}

fn mib(v: &Value) -> String {
    v.as_u64().map_or_else(
        || "-".to_string(),
        |b| format!("{:.0}MiB", b as f64 / 1048576.0),
    )
}

pub fn run(cli: &Cli) -> Result<i32> {
    let dir = gpuslice_ledger::ledger_dir();
    let slices: Vec<Value> = gpuslice_ledger::list_dir(&dir)
        .iter()
        .map(|p| describe(p))
        .collect();
    if cli.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "dir": dir.display().to_string(), "slices": slices })
            )?
        );
        return Ok(0);
    }
    if slices.is_empty() {
        println!("no slices with a memory cap in {}", dir.display());
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
