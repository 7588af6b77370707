//! `run --memory` / `--compute`: the slice's records, written by root
//! before the child starts, and what the child's mount namespace shows of
//! them (see `gpuslice_ledger::limits` and `gpuslice_isolate::slicefs`).
//!
//! As root: the limits record (root's, read-only in the slice), the usage
//! ledger (the slice's to write), a root-written share record per GPU on
//! the boards, all reached by the slice only at the fixed place
//! `/run/gpuslice/slice`, with the shim preloaded through the slice's own
//! `/etc/ld.so.preload`; the environment plays no part.
//!
//! Not as root (no mount namespace of the slice's own to build): the same
//! records, but the shim is preloaded through `LD_PRELOAD` and told its
//! limits through the environment, so they are self-imposed — the caller
//! owns everything the slice could tamper with anyway.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use gpuslice_core::{Inventory, Selection};
use gpuslice_isolate::slicefs::{self, SliceFiles};
use gpuslice_ledger::board;
use gpuslice_ledger::limits::{
    DeviceLimits, RecordPaths, SliceLimits, ENV_COMPUTE, ENV_LEDGER, ENV_MEMORY, ENV_MODE,
    ENV_SLICE, HOSTPID_FILE, LIMITS_FILE, SHIM_FILE, SLICE_DIR, SLICE_DIR_ENV, USAGE_FILE,
};

use super::run_args::RunArgs;

/// The records of a running slice; removed when dropped.
pub struct SliceSetup {
    records: RecordPaths,
    share_records: Vec<PathBuf>,
}

impl SliceSetup {
    /// Where the slice's records are (on the host).
    pub fn records(&self) -> &RecordPaths {
        &self.records
    }
}

impl Drop for SliceSetup {
    fn drop(&mut self) {
        self.records.remove();
        for r in &self.share_records {
            let _ = std::fs::remove_file(r);
        }
    }
}

/// The limits `run` was asked for, one device per selected GPU in
/// `CUDA_VISIBLE_DEVICES` order.
pub fn limits_of(
    inv: &Inventory,
    sel: &Selection,
    slice_id: &str,
    args: &RunArgs,
) -> Result<SliceLimits> {
    let devices: Vec<DeviceLimits> = sel
        .visible_devices(inv)
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|uuid| DeviceLimits {
            uuid: uuid.to_string(),
            memory: args.memory,
            compute: args.compute,
        })
        .collect();
    if devices.is_empty() {
        bail!("--memory/--compute need at least one GPU in --gpus");
    }
    Ok(SliceLimits {
        slice_id: slice_id.to_string(),
        mode: args.compute_mode,
        devices,
    })
}

/// Writes the slice's records and returns them with the mounts the child
/// needs (None when not root: see the module docs); adds the child's
/// variables to `env`. `shim`: the one a CDI spec mounts, else gpuslice's.
pub fn set_up(
    limits: &SliceLimits,
    rootless: bool,
    env: &mut Vec<CString>,
    shim: Option<&Path>,
) -> Result<(SliceSetup, Option<SliceFiles>)> {
    let shim = match shim {
        Some(s) => s.to_path_buf(),
        None => crate::shim::find().map_err(|e| anyhow!("--memory/--compute: {e}"))?,
    };
    let dir = gpuslice_ledger::ledger_dir();
    gpuslice_ledger::ensure_dir(&dir)?;
    super::slices::reap_stale_ledgers(&dir);
    let mut setup = SliceSetup {
        records: limits.write_records(&dir.join(&limits.slice_id))?,
        share_records: Vec::new(),
    };
    let boards = board::board_dir();
    let mut board_files = Vec::new();
    if limits.devices.iter().any(|d| d.compute.is_some()) {
        setup.share_records = publish_shares(limits, &setup.records.usage, &boards, rootless)?;
        if !rootless {
            // Root makes the slice's boards, replacing any it did not make
            // (a local user's squatted file switched off taking turns).
            for d in limits.devices.iter().filter(|d| d.compute.is_some()) {
                match board::prepare_board(&boards, &d.uuid) {
                    Ok(p) => board_files.push(p),
                    Err(e) => {
                        tracing::warn!(gpu = %d.uuid, "board: {e}; the slice will not take turns on it")
                    }
                }
            }
        }
    }
    let ours = [
        "LD_PRELOAD=".to_string(),
        ENV_MEMORY.to_string(), // and its per-device `_<i>` forms
        format!("{ENV_COMPUTE}="),
        format!("{ENV_MODE}="),
        format!("{ENV_LEDGER}="),
        format!("{SLICE_DIR_ENV}="),
    ];
    env.retain(|kv| !ours.iter().any(|p| kv.as_bytes().starts_with(p.as_bytes())));
    let files = if rootless {
        let preload = match std::env::var("LD_PRELOAD") {
            Ok(old) if !old.is_empty() => format!("{}:{old}", shim.display()),
            _ => shim.display().to_string(),
        };
        let mut vars = vec![
            format!("LD_PRELOAD={preload}"),
            format!("{ENV_LEDGER}={}", setup.records.usage.display()),
        ];
        vars.extend(
            limits
                .limit_env()
                .into_iter()
                .filter(|(k, _)| k != ENV_SLICE)
                .map(|(k, v)| format!("{k}={v}")),
        );
        for kv in vars {
            env.push(CString::new(kv).map_err(|_| anyhow!("NUL byte in a path"))?);
        }
        None
    } else {
        let files = SliceFiles {
            dir: SLICE_DIR.into(),
            limits: setup.records.limits.clone(),
            usage: setup.records.usage.clone(),
            hostpid: setup.records.hostpid.clone(),
            shim: shim.clone(),
            names: [LIMITS_FILE, USAGE_FILE, HOSTPID_FILE, SHIM_FILE],
            masked: vec![dir],
            // The boards' directory read-only (root in the slice could
            // otherwise remove a board and squat it), its shares too, and
            // the slice's own boards writable over it.
            read_only: vec![boards.clone(), board::shares_dir(&boards)],
            visible: vec![boards],
            writable: board_files,
        };
        slicefs::prepare_host(&files)?;
        Some(files)
    };
    tracing::info!(
        records = %setup.records.dir.display(),
        shim = %shim.display(),
        self_imposed = rootless,
        "slice limits"
    );
    Ok((setup, files))
}

/// Root-written shares on the GPUs' boards, which other slices' scaling
/// counts (a non-root caller cannot vouch for its share: it goes without).
fn publish_shares(
    limits: &SliceLimits,
    usage: &Path,
    boards: &Path,
    rootless: bool,
) -> Result<Vec<PathBuf>> {
    // The boards' directory is shared by every tenant, like /tmp.
    if let Err(e) = gpuslice_ledger::ensure_dir(boards) {
        if limits.mode == board::Mode::Guaranteed {
            bail!("--compute-mode guaranteed: {e}");
        }
        return Ok(Vec::new());
    }
    if rootless {
        return Ok(Vec::new());
    }
    board::publish_shares(boards, usage, limits).with_context(|| {
        format!(
            "recording the share of {} on {}",
            usage.display(),
            boards.display()
        )
    })
}
