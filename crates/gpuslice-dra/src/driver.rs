//! Prepare and unprepare: a claim's allocation becomes slices, each a
//! device of the claim's own CDI spec; the checkpoint remembers them.
//!
//! Prepare of a claim already prepared returns what it returned before
//! (the kubelet retries); Unprepare of one not prepared succeeds. Every
//! claim succeeds or fails on its own: one bad claim does not fail the
//! others of the call.
//!
//! Defence in depth (the scheduler should never allow these): a claim is
//! refused when a GPU it uses would be over-committed with the claims
//! already prepared: memory caps summing past the GPU's memory, compute
//! shares past 100 %, or a whole GPU (or MIG device) taken by another claim.

use crate::apiserver::ClaimSource;
use crate::checkpoint::{Checkpoint, CheckpointError, PreparedClaim, PreparedDevice};
use crate::claim::{allocated, Allocated, DeviceKind};
use gpuslice_core::{HostRoot, Inventory};
use gpuslice_k8s::cdi::{self, Format, SliceDevice};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use thiserror::Error;
use tokio::sync::Mutex;

#[derive(Debug, Error)]
pub enum PrepareError {
    #[error("claim {0}/{1} (uid {2}): namespace, name and uid are required")]
    Incomplete(String, String, String),
    #[error("claim uid {0:?}: letters, digits and '-' only (a Kubernetes UID)")]
    BadUid(String),
    #[error(transparent)]
    Api(#[from] crate::apiserver::ApiError),
    #[error(transparent)]
    Claim(#[from] crate::claim::ClaimError),
    #[error("claim {claim}: GPU {gpu} would be over-committed: {why}")]
    OverCommit {
        claim: String,
        gpu: u32,
        why: String,
    },
    #[error("claim {0}: GPU {1} is not on this node")]
    NoGpu(String, u32),
    #[error("claim {0}: CDI spec: {1}")]
    Cdi(String, String),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A device returned to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub cdi_device_id: String,
}

pub struct Options {
    pub driver_name: String,
    /// This node's pool (the node's name).
    pub pool: String,
    pub host_root: HostRoot,
    pub inventory: Inventory,
    /// Where claim specs are written (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// The checkpoint's directory.
    pub state_dir: PathBuf,
    /// Host path of `libgpuslice.so`; without it shared devices are refused.
    pub shim: Option<PathBuf>,
    /// Host path of the `gpuslice` binary for the params-overlay hook
    /// (as in `gpuslice cdi generate`); None leaves the overlay out.
    pub hook: Option<PathBuf>,
    /// Write host paths relative to the host root (a pod that mounts the
    /// host at `--host-root` writes specs for the host's runtime).
    pub strip_host_root: bool,
}

pub struct Driver {
    opts: Options,
    /// The GPUs now: `opts.inventory` at first, then what hot-plug found.
    inventory: std::sync::RwLock<Inventory>,
    api: Arc<dyn ClaimSource>,
    state: Mutex<Checkpoint>,
}

impl Driver {
    /// Loads the checkpoint (claims prepared before a restart).
    pub fn new(opts: Options, api: Arc<dyn ClaimSource>) -> Result<Self, CheckpointError> {
        std::fs::create_dir_all(&opts.state_dir)
            .map_err(|e| CheckpointError::Io(opts.state_dir.clone(), e))?;
        let state = Checkpoint::load(&opts.state_dir)?;
        Ok(Driver {
            inventory: std::sync::RwLock::new(opts.inventory.clone()),
            opts,
            api,
            state: Mutex::new(state),
        })
    }

    /// The GPUs changed (hot-plug): claims prepared from now on are
    /// checked against and written for `inv`.
    pub fn set_inventory(&self, inv: Inventory) {
        *self.inventory.write().unwrap_or_else(|e| e.into_inner()) = inv;
    }

    fn inventory(&self) -> Inventory {
        self.inventory
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The host's board directory, made ready for a claim's spec to bind
    /// it (capped slices take turns on the GPU through it); None, with a
    /// warning, when it cannot be (the slices are then time-sliced by the
    /// GPU alone: their caps and shares hold all the same).
    fn boards(&self) -> Option<PathBuf> {
        let dir = self
            .opts
            .host_root
            .join(gpuslice_ledger::board::DEFAULT_BOARD_DIR);
        match gpuslice_ledger::board::prepare_dir(&dir) {
            Ok(()) => Some(dir),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "claims will not take turns on the GPU");
                None
            }
        }
    }

    pub fn driver_name(&self) -> &str {
        &self.opts.driver_name
    }

    /// The claims prepared now, by uid.
    pub async fn prepared(&self) -> BTreeMap<String, PreparedClaim> {
        self.state.lock().await.claims.clone()
    }

    /// Prepares each claim; a result per claim uid.
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> BTreeMap<String, Result<Vec<Granted>, String>> {
        // One at a time: the over-commit check sees every prepared claim.
        let mut state = self.state.lock().await;
        let mut out = BTreeMap::new();
        for c in claims {
            let r = self.prepare_one(&mut state, c).await.map_err(|e| {
                tracing::warn!("prepare: {e}");
                e.to_string()
            });
            out.insert(c.uid.clone(), r);
        }
        out
    }

    async fn prepare_one(
        &self,
        state: &mut Checkpoint,
        c: &ClaimRef,
    ) -> Result<Vec<Granted>, PrepareError> {
        if c.namespace.is_empty() || c.name.is_empty() || c.uid.is_empty() {
            return Err(PrepareError::Incomplete(
                c.namespace.clone(),
                c.name.clone(),
                c.uid.clone(),
            ));
        }
        let uid_ok = c
            .uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !uid_ok {
            return Err(PrepareError::BadUid(c.uid.clone()));
        }
        if let Some(p) = state.claims.get(&c.uid) {
            return Ok(granted(p));
        }
        let label = format!("{}/{}", c.namespace, c.name);
        let obj = self.api.get_claim(&c.namespace, &c.name).await?;
        let results = allocated(&obj, &c.uid, &self.opts.driver_name, &self.opts.pool)?;
        self.check_capacity(state, &label, &results)?;
        let devices: Vec<PreparedDevice> = results
            .into_iter()
            .enumerate()
            .map(|(i, a)| PreparedDevice {
                cdi_device_id: format!(
                    "{}/{}={}",
                    crate::CDI_VENDOR,
                    crate::CDI_CLASS,
                    cdi_name(&c.uid, i)
                ),
                allocated: a,
            })
            .collect();
        let (spec, records) = self.write_spec(&label, &c.uid, &devices)?;
        state.claims.insert(
            c.uid.clone(),
            PreparedClaim {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                uid: c.uid.clone(),
                resource_version: obj.metadata.resource_version.clone(),
                devices,
                cdi_spec: spec,
                records,
            },
        );
        if let Err(e) = state.save() {
            // Not remembered: leave nothing behind either.
            if let Some(p) = state.claims.remove(&c.uid) {
                let _ = remove_files(&p);
            }
            return Err(e.into());
        }
        Ok(granted(&state.claims[&c.uid]))
    }

    /// Refuses results that would over-commit a GPU together with the
    /// claims already prepared (and with each other).
    fn check_capacity(
        &self,
        state: &Checkpoint,
        claim: &str,
        new: &[Allocated],
    ) -> Result<(), PrepareError> {
        let inventory = self.inventory();
        let held: Vec<&Allocated> = state
            .claims
            .values()
            .flat_map(|p| p.devices.iter().map(|d| &d.allocated))
            .collect();
        for (i, a) in new.iter().enumerate() {
            let gpu = a.kind.gpu();
            let info = inventory
                .gpus
                .iter()
                .find(|g| g.index == gpu)
                .ok_or_else(|| PrepareError::NoGpu(claim.into(), gpu))?;
            let others: Vec<&Allocated> = held
                .iter()
                .copied()
                .chain(new[..i].iter())
                .filter(|o| o.kind.gpu() == gpu)
                .collect();
            let over = |why: String| PrepareError::OverCommit {
                claim: claim.into(),
                gpu,
                why,
            };
            let conflict = others.iter().find(|o| match (a.kind, o.kind) {
                (DeviceKind::Whole { .. }, _) | (_, DeviceKind::Whole { .. }) => true,
                (DeviceKind::Mig { mig, .. }, DeviceKind::Mig { mig: m, .. }) => mig == m,
                (DeviceKind::Mig { .. }, DeviceKind::Shared { .. })
                | (DeviceKind::Shared { .. }, DeviceKind::Mig { .. }) => true,
                (DeviceKind::Shared { .. }, DeviceKind::Shared { .. }) => false,
            });
            if let Some(o) = conflict {
                return Err(over(format!(
                    "{} is exclusive with {} already prepared",
                    a.device, o.device
                )));
            }
            if let Some(caps) = a.caps {
                let mem: u64 = others
                    .iter()
                    .filter_map(|o| o.caps)
                    .map(|c| c.memory_bytes)
                    .sum();
                let compute: u32 = others
                    .iter()
                    .filter_map(|o| o.caps)
                    .map(|c| c.compute_percent)
                    .sum();
                let total = info.memory_bytes.ok_or_else(|| {
                    over(
                        "its memory size is unknown (NVML not loaded), so no cap can be checked"
                            .into(),
                    )
                })?;
                if mem.saturating_add(caps.memory_bytes) > total {
                    return Err(over(format!(
                        "memory {} B requested, {} B of {} B already prepared",
                        caps.memory_bytes, mem, total
                    )));
                }
                if compute + caps.compute_percent > 100 {
                    return Err(over(format!(
                        "compute {} % requested, {} % already prepared",
                        caps.compute_percent, compute
                    )));
                }
            }
        }
        Ok(())
    }

    /// Writes the claim's CDI spec (one device per result) and the limits
    /// records of its capped slices; returns the spec's path and the
    /// records' (what Unprepare removes: the shared `ld.so.preload` stays).
    fn write_spec(
        &self,
        claim: &str,
        uid: &str,
        devices: &[PreparedDevice],
    ) -> Result<(PathBuf, Vec<PathBuf>), PrepareError> {
        let cdi_err = |e: anyhow::Error| PrepareError::Cdi(claim.into(), format!("{e:#}"));
        let slices: Vec<SliceDevice> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let (gpu, mig) = match d.allocated.kind {
                    DeviceKind::Whole { gpu } | DeviceKind::Shared { gpu } => (gpu, None),
                    DeviceKind::Mig { gpu, mig } => (gpu, Some(mig)),
                };
                SliceDevice {
                    name: cdi_name(uid, i),
                    gpu,
                    mig,
                    caps: d.allocated.caps,
                }
            })
            .collect();
        let opts = cdi::Options {
            vendor: crate::CDI_VENDOR.into(),
            class: crate::CDI_CLASS.into(),
            shared: vec![],
            shim: self.opts.shim.clone(),
            hook: self.opts.hook.clone(),
            strip_host_root: self.opts.strip_host_root,
            spec_dir: self.opts.cdi_dir.clone(),
            use_nvml: false,
            boards: slices
                .iter()
                .any(|s| s.caps.is_some())
                .then(|| self.boards())
                .flatten(),
            ..cdi::Options::default()
        };
        let g = cdi::generate_slices(&self.opts.host_root, &self.inventory(), &opts, &slices)
            .map_err(cdi_err)?;
        let path = spec_path(&self.opts.cdi_dir, uid);
        let records: Vec<PathBuf> = slices
            .iter()
            .filter(|s| s.caps.is_some())
            .map(|s| cdi::limits_record_path(&self.opts.cdi_dir, &s.name))
            .collect();
        if let Err(e) = cdi::write_atomically(&g, &path, Format::Json) {
            for r in &records {
                let _ = std::fs::remove_file(r);
            }
            return Err(cdi_err(e));
        }
        Ok((path, records))
    }

    /// Unprepares each claim; a result per claim uid.
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> BTreeMap<String, Result<(), String>> {
        let mut state = self.state.lock().await;
        let mut out = BTreeMap::new();
        for c in claims {
            let r = unprepare_one(&mut state, &c.uid).map_err(|e| {
                tracing::warn!("unprepare {}/{}: {e}", c.namespace, c.name);
                e
            });
            out.insert(c.uid.clone(), r);
        }
        out
    }
}

fn unprepare_one(state: &mut Checkpoint, uid: &str) -> Result<(), String> {
    let Some(p) = state.claims.remove(uid) else {
        return Ok(()); // never prepared, or already unprepared
    };
    if let Err(e) = remove_files(&p) {
        state.claims.insert(uid.into(), p);
        return Err(e);
    }
    state.save().map_err(|e| {
        state.claims.insert(uid.into(), p);
        e.to_string()
    })
}

/// Removes a claim's spec first (no new container gets its devices), then
/// its limits records; files already gone are fine.
fn remove_files(p: &PreparedClaim) -> Result<(), String> {
    for f in std::iter::once(&p.cdi_spec).chain(&p.records) {
        match std::fs::remove_file(f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("removing {}: {e}", f.display())),
        }
    }
    Ok(())
}

fn granted(p: &PreparedClaim) -> Vec<Granted> {
    p.devices
        .iter()
        .map(|d| Granted {
            request: d.allocated.request.clone(),
            pool: d.allocated.pool.clone(),
            device: d.allocated.device.clone(),
            cdi_device_id: d.cdi_device_id.clone(),
        })
        .collect()
}

/// The CDI device name of a claim's `i`-th result (uids are unique, so
/// names are unique across the kind's spec files).
fn cdi_name(uid: &str, i: usize) -> String {
    format!("{uid}-{i}")
}

/// The claim's spec file (a kind's files must have distinct names).
pub fn spec_path(cdi_dir: &std::path::Path, uid: &str) -> PathBuf {
    cdi_dir.join(format!(
        "{}-{}_{uid}.json",
        crate::CDI_VENDOR,
        crate::CDI_CLASS
    ))
}
