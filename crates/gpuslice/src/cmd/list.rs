//! `gpuslice list`: what discovery found.

use crate::global::Global;
use anyhow::Result;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::{HostRoot, Inventory};
use std::fmt::Write;

pub fn run(global: &Global) -> Result<i32> {
    let inv = discover(
        &HostRoot::new(&global.host_root),
        &DiscoverOptions::default(),
    )?;
    if global.json {
        println!("{}", serde_json::to_string_pretty(&inv)?);
    } else {
        print!("{}", table(&inv));
        if gpuslice_core::simulation::is_simulated(&global.host_root) {
            println!(
                "SIMULATION: {} is a fake GPU host (gpuslice-fakehost); these GPUs do not exist",
                global.host_root.display()
            );
        }
    }
    Ok(0)
}

fn gib(bytes: Option<u64>) -> String {
    bytes.map_or("-".into(), |b| {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    })
}

/// The human-readable listing.
pub fn table(inv: &Inventory) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<4} {:<40} {:<13} {:<22} {:>10} {:>4} {:<12} MIG",
        "IDX", "UUID", "PCI BUS", "MODEL", "MEMORY", "NUMA", "PCIE"
    );
    for g in &inv.gpus {
        let pcie = g.pcie.map_or("-".into(), |l| {
            let gen = gpuslice_core::PcieLink::generation(l.speed_gts);
            let mark = if l.degraded() { " !" } else { "" };
            format!("Gen{gen} x{}{mark}", l.width)
        });
        let mig = match g.mig_enabled {
            Some(true) => format!("on ({})", g.migs.len()),
            Some(false) if g.migs.is_empty() => "off".into(),
            _ if !g.migs.is_empty() => format!("{} instances", g.migs.len()),
            _ => "-".into(),
        };
        let numa = g.numa_node.map_or("-".into(), |n| n.to_string());
        let _ = writeln!(
            s,
            "{:<4} {:<40} {:<13} {:<22} {:>10} {:>4} {:<12} {}",
            g.index,
            g.uuid,
            g.pci_bus_id,
            g.model,
            gib(g.memory_bytes),
            numa,
            pcie,
            mig
        );
        for m in &g.migs {
            let _ = writeln!(
                s,
                "  {}:{:<2} {:<40} gi {} ci {} {:<10} {:>10}",
                g.index,
                m.index,
                m.uuid.as_deref().unwrap_or("-"),
                m.gpu_instance,
                m.compute_instance,
                m.profile.as_deref().unwrap_or("-"),
                gib(m.memory_bytes)
            );
        }
    }
    let _ = writeln!(
        s,
        "driver {} · CUDA {} · sources: {}{}",
        inv.driver_version.as_deref().unwrap_or("?"),
        inv.cuda_version.as_deref().unwrap_or("?"),
        inv.sources.join("+"),
        inv.nvml_error
            .as_ref()
            // The reason says itself what happened ("NVML not used: …",
            // "NVML unavailable …"): no prefix of ours.
            .map(|e| format!(" ({e})"))
            .unwrap_or_default()
    );
    s
}
