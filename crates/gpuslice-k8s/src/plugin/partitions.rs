//! The driver's memory partitions for shared replicas (NVIDIA
//! R615+ per-cgroup limits): with `driverPartitions.enabled`, Allocate
//! names, beside the replica's mounts, a CDI device of the replica
//! (`cdi_devices` of the v1beta1 ContainerAllocateResponse, which the
//! kubelet hands the runtime: KEP-4009, `DevicePluginCDIDevices`, on by
//! default since Kubernetes 1.29). The device holds nothing but the
//! memory-limit hooks `cdi generate`'s shared variants and DRA claims
//! carry ([`gpuslice_cdi::memory_hook`]): the
//! runtime runs them as root, `createRuntime` once the container's cgroup
//! exists and before anything of the image runs, `poststop` when it ends.
//! The set hook reads the caps from root's limits record of the replica
//! (`<ledgerDir>/<slice>/limits`, written by Allocate), so one spec,
//! written when the plugin loads its config, serves every allocation.
//!
//! Why hooks rather than root's enforcer setting the limit once it finds
//! the container (docs/kubernetes.md): the limit is in place before the
//! container's first allocation, and is taken off by the runtime when the
//! container ends, as for every other CDI path. A runtime without CDI
//! ignores the device: the replica still gets its mounts (the shim) and
//! root's enforcer, and no partition.

use super::resources::{slice_id, Kind, Plan};
use anyhow::{Context, Result};
use gpuslice_cdi::{build_spec, device, memory_limit_hooks, Format};
use gpuslice_ledger::limits::RecordPaths;
use std::path::{Path, PathBuf};

/// The CDI device of the replica slice `slice`: `<cdiKind>=<slice>`.
pub fn device_name(kind: &str, slice: &str) -> String {
    format!("{kind}={slice}")
}

/// Where the replicas' spec is written: `<cdiDir>/gpuslice-device-plugin-
/// <vendor>_<class>.json` (one file per kind, so a second plugin's kind
/// is a file of its own).
pub fn spec_path(plan: &Plan) -> PathBuf {
    let p = &plan.cfg.driver_partitions;
    p.cdi_dir.join(format!(
        "gpuslice-device-plugin-{}.json",
        p.cdi_kind.replace('/', "_")
    ))
}

/// Writes the replicas' spec (root-owned 0644), or removes it when the
/// plugin offers no shared replica; does nothing unless enabled. The hook
/// binary must be there: without it every replica's container would fail
/// to start.
pub fn write_spec(plan: &Plan) -> Result<()> {
    let p = &plan.cfg.driver_partitions;
    if !p.enabled {
        return Ok(());
    }
    let path = spec_path(plan);
    let slices: Vec<String> = plan
        .resources
        .iter()
        .filter(|r| matches!(r.kind, Kind::Shared { .. }))
        .flat_map(|r| r.entries.iter().map(|e| slice_id(&e.id)))
        .collect();
    if slices.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", path.display()))
            }
            _ => Ok(()),
        };
    }
    if !p.hook.is_file() {
        anyhow::bail!(
            "driverPartitions.hook: {} is not a file (the gpuslice binary the runtime runs as the replicas' memory-limit hooks; install it there or set enabled: false)",
            p.hook.display()
        );
    }
    let root = plan.root.path();
    let host_root = (!plan.cfg.strip_host_root && root != Path::new("/")).then_some(root);
    let gpuslice = plan.host_path(&p.hook);
    let devices: Vec<_> = slices
        .iter()
        .map(|slice| {
            let record = RecordPaths::under(&plan.cfg.ledger_dir.join(slice)).limits;
            let mut edits = gpuslice_cdi::Edits::default();
            edits.hooks = Some(memory_limit_hooks(
                &gpuslice,
                &plan.host_path(&record),
                host_root,
            ));
            device(slice, edits)
        })
        .collect();
    let spec = build_spec(&p.cdi_kind, devices, None)?;
    let text = gpuslice_cdi::render(&spec, Format::Json)?;
    gpuslice_core::atomic_file::write_atomic(&path, text.as_bytes(), 0o644)?;
    Ok(())
}
