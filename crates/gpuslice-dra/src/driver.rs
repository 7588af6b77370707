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
use gpuslice_cdi::{self as cdi, Format, SliceDevice};
use gpuslice_core::{HostRoot, Inventory};
use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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
    #[error("claim {0}: its pods can escape its caps ({1}); this node refuses such claims (--refuse-unenforceable): run the pod unprivileged, without host namespaces")]
    Unenforceable(String, String),
    #[error("claim {0}: {1} shares of GPUs ({2}); a container is one slice, so its caps would be one share's (the last mounted): ask for one share, the sum, in one request, or use a claim per share")]
    SharesInOneClaim(String, usize, String),
    #[error("claim {claim}: CDI spec")]
    Cdi {
        claim: String,
        source: anyhow::Error,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// Why a claim's prepared files or its checkpoint entry could not be
/// removed (the claim stays prepared; the kubelet retries).
#[derive(Debug, Error)]
pub enum UnprepareError {
    #[error("removing {path}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
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
    /// The request policy the GPUs are published with: a result that
    /// consumed all of a GPU's capacity is the whole GPU, uncapped.
    pub policy: crate::publish::SharedPolicy,
    /// Refuse claims reserved for pods their caps cannot hold against
    /// (`crate::podcheck`); else they are prepared and marked.
    pub refuse_unenforceable: bool,
    /// Where capped slices' directories are made (`crate::claimfs`);
    /// None: `<host root>/run/gpuslice/claims`, where `gpuslice slices`
    /// looks.
    pub claims_dir: Option<PathBuf>,
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
        let kept: std::collections::HashSet<&Path> = state
            .claims
            .values()
            .flat_map(|p| p.slice_dirs.iter().map(PathBuf::as_path))
            .collect();
        let boards = opts
            .host_root
            .join(gpuslice_ledger::board::DEFAULT_BOARD_DIR);
        let orphans = std::fs::read_dir(claims_dir(&opts))
            .into_iter()
            .flatten()
            .flatten();
        for dir in orphans
            .map(|e| e.path())
            .filter(|d| !kept.contains(d.as_path()))
        {
            // Its share records, keyed by its usage ledger, go first.
            let usage = dir.join(gpuslice_ledger::limits::USAGE_FILE);
            gpuslice_ledger::board::withdraw_shares_of(&boards, &usage);
        }
        for (dir, e) in crate::claimfs::sweep(&claims_dir(&opts), &kept) {
            tracing::warn!(dir = %dir.display(), "an orphaned claim slice directory: {e}");
        }
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

    /// The GPUs as the driver knows them now.
    pub fn inventory(&self) -> Inventory {
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
    ) -> BTreeMap<String, Result<Vec<Granted>, PrepareError>> {
        // One at a time: the over-commit check sees every prepared claim.
        let mut state = self.state.lock().await;
        let mut out = BTreeMap::new();
        for c in claims {
            let fresh = !state.claims.contains_key(&c.uid);
            let r = self.prepare_one(&mut state, c).await.inspect_err(|e| {
                tracing::warn!("prepare: {}", crate::one_line(e));
            });
            if let (true, Ok(_), Some(p)) = (fresh, &r, state.claims.get(&c.uid)) {
                self.report(c, device_status(&self.opts.driver_name, p))
                    .await;
            }
            out.insert(c.uid.clone(), r);
        }
        out
    }

    /// Writes what the node enforces into the claim's `status.devices`
    /// (so `kubectl get resourceclaim -o yaml` shows it). A claim keeps
    /// working without it: a failure is logged, not returned.
    async fn report(&self, c: &ClaimRef, devices: Vec<AllocatedDeviceStatus>) {
        let r = self
            .api
            .set_device_status(&c.namespace, &c.name, &self.opts.driver_name, devices)
            .await;
        match r {
            Ok(()) | Err(crate::apiserver::ApiError::NotFound(..)) => {}
            Err(e) => tracing::warn!(
                "claim {}/{}: status.devices not written: {e}",
                c.namespace,
                c.name
            ),
        }
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
        let mut results = allocated(&obj, &c.uid, &self.opts.driver_name, &self.opts.pool)?;
        self.whole_gpus_uncapped(&mut results);
        let shares: Vec<&str> = results
            .iter()
            .filter(|a| a.caps.is_some())
            .map(|a| a.device.as_str())
            .collect();
        if shares.len() > 1 {
            return Err(PrepareError::SharesInOneClaim(
                label,
                shares.len(),
                shares.join(", "),
            ));
        }
        self.check_capacity(state, &label, &results)?;
        let unenforceable = self.unenforceable(&obj).await;
        if !unenforceable.is_empty() {
            let why = unenforceable.join("; ");
            let refused = self.opts.refuse_unenforceable;
            let (reason, note) = if refused {
                (
                    "UnenforceableRefused",
                    format!("this node refuses claims whose pods can escape their caps: {why}"),
                )
            } else {
                (
                    "Unenforceable",
                    format!(
                        "the claim's memory and compute caps do not hold against its pods: {why}"
                    ),
                )
            };
            self.warn(c, obj.metadata.uid.as_deref(), reason, note)
                .await;
            if refused {
                return Err(PrepareError::Unenforceable(label, why));
            }
            tracing::warn!("claim {label}: its caps do not hold against its pods: {why}");
        }
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
        let (spec, records, slice_dirs) = self.write_spec(&label, &c.uid, &devices)?;
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
                slice_dirs,
                unenforceable,
            },
        );
        if let Err(e) = state.save() {
            // Not remembered: leave nothing behind either.
            if let Some(p) = state.claims.remove(&c.uid) {
                let _ = remove_files(&p, state.dir());
            }
            return Err(e.into());
        }
        Ok(granted(&state.claims[&c.uid]))
    }

    /// A Warning Event about claim `c` (best effort: a failure is logged).
    async fn warn(&self, c: &ClaimRef, uid: Option<&str>, reason: &'static str, note: String) {
        let w = crate::apiserver::ClaimWarning {
            namespace: c.namespace.clone(),
            claim: c.name.clone(),
            uid: uid.unwrap_or(&c.uid).into(),
            reporter: self.opts.driver_name.clone(),
            node: self.opts.pool.clone(),
            action: "PrepareResources",
            reason,
            note,
        };
        if let Err(e) = self.api.warn(&w).await {
            tracing::warn!(
                "claim {}/{}: event {reason} not posted: {e}",
                c.namespace,
                c.name
            );
        }
    }

    /// What the pods the claim is reserved for may do that its caps cannot
    /// hold against (`crate::podcheck`); a pod that cannot be read is
    /// logged and passed over (the claim is still prepared).
    async fn unenforceable(
        &self,
        claim: &k8s_openapi::api::resource::v1::ResourceClaim,
    ) -> Vec<String> {
        let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
        let pods = claim
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty());
        let mut why = Vec::new();
        for r in pods {
            match self.api.get_pod(ns, &r.name).await {
                Ok(pod) => why.extend(crate::podcheck::unenforceable(&pod)),
                Err(e) => tracing::warn!("pod {ns}/{}: not read ({e}); not checked", r.name),
            }
        }
        why
    }

    /// A share of a GPU that consumed all its memory and either all its
    /// compute or none named (the request named no capacity: the class of
    /// whole GPUs) is the whole GPU: no caps, no shim.
    fn whole_gpus_uncapped(&self, results: &mut [Allocated]) {
        let inventory = self.inventory();
        for a in results {
            let (DeviceKind::Whole { gpu }, Some(caps)) = (a.kind, a.caps) else {
                continue;
            };
            let usable = inventory
                .gpus
                .iter()
                .find(|g| g.index == gpu)
                .and_then(|g| g.memory_bytes)
                .map(|m| self.opts.policy.usable_memory(m));
            let all_compute = matches!(caps.compute_percent(), 0 | 100);
            if all_compute && usable.is_some_and(|u| caps.memory_bytes() >= u) {
                a.caps = None;
            }
        }
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
            // A whole GPU (no caps) takes it alone; a MIG device is
            // exclusive with itself and with shares; shares add up.
            let exclusive =
                |x: &Allocated| x.caps.is_none() && !matches!(x.kind, DeviceKind::Mig { .. });
            let conflict = others.iter().find(|o| {
                exclusive(a)
                    || exclusive(o)
                    || match (a.kind, o.kind) {
                        (DeviceKind::Mig { mig, .. }, DeviceKind::Mig { mig: m, .. }) => mig == m,
                        (DeviceKind::Mig { .. }, _) | (_, DeviceKind::Mig { .. }) => true,
                        _ => false,
                    }
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
                    .map(|c| c.memory_bytes())
                    .sum();
                let compute: u32 = others
                    .iter()
                    .filter_map(|o| o.caps)
                    .map(|c| c.compute_percent())
                    .sum();
                let total = info.memory_bytes.ok_or_else(|| {
                    over(
                        "its memory size is unknown (NVML not loaded), so no cap can be checked"
                            .into(),
                    )
                })?;
                if mem.saturating_add(caps.memory_bytes()) > total {
                    return Err(over(format!(
                        "memory {} B requested, {} B of {} B already prepared",
                        caps.memory_bytes(),
                        mem,
                        total
                    )));
                }
                if compute + caps.compute_percent() > 100 {
                    return Err(over(format!(
                        "compute {} % requested, {} % already prepared",
                        caps.compute_percent(),
                        compute
                    )));
                }
            }
        }
        Ok(())
    }

    /// Writes the claim's CDI spec (one device per result), the limits
    /// records of its capped slices and their slice directories (one
    /// ledger each for all the claim's containers, made and vouched for on
    /// the boards by root: `crate::claimfs`); returns the spec's path, the
    /// records' (limits and shares) and the directories' (what Unprepare
    /// removes: the shared `ld.so.preload` stays).
    fn write_spec(
        &self,
        claim: &str,
        uid: &str,
        devices: &[PreparedDevice],
    ) -> Result<(PathBuf, Vec<PathBuf>, Vec<PathBuf>), PrepareError> {
        let cdi_err = |source: anyhow::Error| PrepareError::Cdi {
            claim: claim.into(),
            source,
        };
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
        let claims_dir = claims_dir(&self.opts);
        let mut slice_dirs: Vec<PathBuf> = Vec::new();
        for s in slices.iter().filter(|s| s.caps.is_some()) {
            let dir = crate::claimfs::slice_dir(&claims_dir, &s.name);
            if let Err(e) = crate::claimfs::make(&dir) {
                for d in &slice_dirs {
                    let _ = crate::claimfs::remove(d);
                }
                return Err(cdi_err(anyhow::anyhow!(
                    "the slice directory {}: {e}",
                    dir.display()
                )));
            }
            slice_dirs.push(dir);
        }
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
            slice_dirs: Some(claims_dir),
            ..cdi::Options::default()
        };
        let path = spec_path(&self.opts.cdi_dir, uid);
        let records: Vec<PathBuf> = slices
            .iter()
            .filter(|s| s.caps.is_some())
            .map(|s| cdi::limits_record_path(&self.opts.cdi_dir, &s.name))
            .collect();
        let inventory = self.inventory();
        let written = cdi::generate_slices(&self.opts.host_root, &inventory, &opts, &slices)
            .and_then(|g| cdi::write_atomically(&g, &path, Format::Json))
            .map_err(anyhow::Error::from)
            .and_then(|()| match &opts.boards {
                Some(boards) => crate::claimfs::vouch(&slices, &slice_dirs, &inventory, boards),
                None => Ok(Vec::new()),
            });
        let shares = match written {
            Ok(shares) => shares,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                for r in &records {
                    let _ = std::fs::remove_file(r);
                }
                for d in &slice_dirs {
                    let _ = crate::claimfs::remove(d);
                }
                return Err(cdi_err(e));
            }
        };
        // Root's share records go with the limits records at Unprepare.
        Ok((
            path,
            records.into_iter().chain(shares).collect(),
            slice_dirs,
        ))
    }

    /// The capped slices of the prepared claims, as root's enforcer
    /// watches them (`gpuslice_k8s::enforcer`): root's limits record
    /// beside the claim's spec, the one usage ledger of the slice's
    /// directory, kills recorded in the state directory
    /// ([`crate::checkpoint::enforcement_dir`]). Blocks on the claims'
    /// lock: for the enforcer's thread, never a runtime's.
    pub fn watched_slices(&self) -> Vec<gpuslice_ledger::enforcer::WatchedSlice> {
        let state = self.state.blocking_lock();
        let dir = state.dir().to_path_buf();
        state
            .claims
            .values()
            .flat_map(|p| &p.records)
            .filter_map(|record| {
                let limits = gpuslice_ledger::limits::verify_and_read(record, false).ok()?;
                let records = crate::checkpoint::enforcement_dir(&dir, &limits.slice_id);
                std::fs::create_dir_all(&records).ok()?;
                Some(gpuslice_ledger::enforcer::WatchedSlice {
                    usage: crate::claimfs::slice_dir(&claims_dir(&self.opts), &limits.slice_id)
                        .join(gpuslice_ledger::limits::USAGE_FILE),
                    record: Some(record.clone()),
                    records,
                    limits,
                    // What the pod spec showed at Prepare, checked again
                    // as the kernel shows each GPU process.
                    escapes: Some(if self.opts.refuse_unenforceable {
                        gpuslice_ledger::enforcer::Escapes::Refuse
                    } else {
                        gpuslice_ledger::enforcer::Escapes::Flag
                    }),
                })
            })
            .collect()
    }

    /// Reclaims, in every prepared claim's usage ledger, the slots of its
    /// containers' processes that died: each container is a pid namespace
    /// of its own, and reclaims only its own, so a container that ended
    /// whole would leave its bytes counted against the claim for good. The
    /// plugin runs in the host's pid namespace (`hostPID`), from which
    /// every container's pids resolve. Returns the bytes given back.
    pub async fn reap_ledgers(&self) -> u64 {
        let state = self.state.lock().await;
        let mut bytes = 0;
        for p in state.claims.values() {
            for dir in &p.slice_dirs {
                let usage = dir.join(gpuslice_ledger::limits::USAGE_FILE);
                if !usage.exists() {
                    continue; // no process of the claim has started
                }
                match gpuslice_ledger::Ledger::open(&usage).and_then(|l| l.reap()) {
                    Ok(r) => {
                        if r.slots > 0 {
                            tracing::info!(
                                "claim {}/{}: {} dead processes' {} bytes given back",
                                p.namespace,
                                p.name,
                                r.slots,
                                r.bytes
                            );
                        }
                        bytes += r.bytes;
                    }
                    Err(e) => tracing::warn!(
                        "claim {}/{}: its ledger {}: {e}",
                        p.namespace,
                        p.name,
                        usage.display()
                    ),
                }
            }
        }
        bytes
    }

    /// Unprepares each claim; a result per claim uid.
    pub async fn unprepare(
        &self,
        claims: &[ClaimRef],
    ) -> BTreeMap<String, Result<(), UnprepareError>> {
        let mut state = self.state.lock().await;
        let mut out = BTreeMap::new();
        for c in claims {
            let held = state.claims.contains_key(&c.uid);
            let r = unprepare_one(&mut state, &c.uid).inspect_err(|e| {
                let e = crate::one_line(e);
                tracing::warn!("unprepare {}/{}: {e}", c.namespace, c.name);
            });
            if held && r.is_ok() && !c.name.is_empty() {
                self.report(c, Vec::new()).await;
            }
            out.insert(c.uid.clone(), r);
        }
        out
    }
}

/// The `status.devices` entries of a prepared claim: per device, a Ready
/// condition and, as data, what the node enforces (`kind` whole, share or
/// mig; for a share its `memoryBytes` and `computePercent`, exactly its
/// limits record) and by which layers (`enforcedBy`).
pub fn device_status(driver: &str, p: &PreparedClaim) -> Vec<AllocatedDeviceStatus> {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
        )
        .unwrap_or_default(),
    );
    let enforced = Condition {
        type_: "Enforced".into(),
        status: if p.unenforceable.is_empty() {
            "True"
        } else {
            "False"
        }
        .into(),
        reason: if p.unenforceable.is_empty() {
            "NothingEscapes"
        } else {
            "PodCanEscape"
        }
        .into(),
        message: if p.unenforceable.is_empty() {
            "no pod of the claim is privileged or in a host namespace".into()
        } else {
            format!(
                "the caps do not hold against: {}",
                p.unenforceable.join("; ")
            )
        },
        last_transition_time: now.clone(),
        observed_generation: None,
    };
    p.devices
        .iter()
        .map(|d| {
            let a = &d.allocated;
            let (data, message) = match (a.kind, a.caps) {
                (_, Some(caps)) => (
                    serde_json::json!({
                        "kind": "share",
                        "memoryBytes": caps.memory_bytes(),
                        "computePercent": caps.compute_percent(),
                        "enforcedBy": ["deviceNodes", "shim"],
                        "cdiDevice": d.cdi_device_id,
                    }),
                    format!("capped at {} of GPU {}", caps.describe(), a.kind.gpu()),
                ),
                (DeviceKind::Mig { gpu, mig }, None) => (
                    serde_json::json!({"kind": "mig", "enforcedBy": ["deviceNodes"], "cdiDevice": d.cdi_device_id}),
                    format!("MIG device {mig} of GPU {gpu}, isolated"),
                ),
                (_, None) => (
                    serde_json::json!({"kind": "whole", "enforcedBy": ["deviceNodes"], "cdiDevice": d.cdi_device_id}),
                    format!("GPU {} whole, isolated", a.kind.gpu()),
                ),
            };
            AllocatedDeviceStatus {
                driver: driver.into(),
                pool: a.pool.clone(),
                device: a.device.clone(),
                share_id: a.share_id.clone(),
                conditions: Some(vec![
                    Condition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        reason: "Prepared".into(),
                        message,
                        last_transition_time: now.clone(),
                        observed_generation: None,
                    },
                    enforced.clone(),
                ]),
                data: Some(RawExtension(data)),
                network_data: None,
            }
        })
        .collect()
}

/// Where capped slices' directories are made.
fn claims_dir(opts: &Options) -> PathBuf {
    opts.claims_dir
        .clone()
        .unwrap_or_else(|| opts.host_root.join(crate::claimfs::CLAIMS_DIR))
}

fn unprepare_one(state: &mut Checkpoint, uid: &str) -> Result<(), UnprepareError> {
    let Some(p) = state.claims.remove(uid) else {
        return Ok(()); // never prepared, or already unprepared
    };
    if let Err(e) = remove_files(&p, state.dir()) {
        state.claims.insert(uid.into(), p);
        return Err(e);
    }
    state.save().map_err(|e| {
        state.claims.insert(uid.into(), p);
        e.into()
    })
}

/// Removes a claim's spec first (no new container gets its devices), then
/// its limits records, slice directories and root's enforcement records
/// (in `state_dir`); files already gone are fine.
fn remove_files(p: &PreparedClaim, state_dir: &Path) -> Result<(), UnprepareError> {
    for d in &p.devices {
        let _ = std::fs::remove_dir_all(crate::checkpoint::enforcement_dir(state_dir, d.slice()));
    }
    for f in std::iter::once(&p.cdi_spec).chain(&p.records) {
        match std::fs::remove_file(f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(UnprepareError::Remove {
                    path: f.clone(),
                    source,
                })
            }
        }
    }
    for d in &p.slice_dirs {
        crate::claimfs::remove(d).map_err(|source| UnprepareError::Remove {
            path: d.clone(),
            source,
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::{ClaimError, DeviceError};
    use crate::quantity::parse_integer;
    use std::error::Error as _;

    /// The errors keep their cause as a source (one can tell a bad
    /// quantity from a missing capacity, an I/O error's kind), and the
    /// kubelet gets the whole chain on one line.
    #[test]
    fn causes_stay_sources_and_reach_the_kubelet_on_one_line() {
        let cdi = PrepareError::Cdi {
            claim: "ns/c".into(),
            source: anyhow::anyhow!("no GPU 3 on this host").context("slice uid-0"),
        };
        assert!(cdi.source().is_some());
        assert_eq!(
            crate::one_line(&cdi),
            "claim ns/c: CDI spec: slice uid-0: no GPU 3 on this host"
        );

        let quantity = parse_integer("0.5").unwrap_err();
        let claim = PrepareError::from(ClaimError::Device {
            claim: "ns/c".into(),
            pool: "node-a".into(),
            device: "gpu-0".into(),
            why: DeviceError::Capacity {
                key: "memory",
                source: Box::new(parse_integer("0.5").unwrap_err()),
            },
        });
        let why = claim.source().and_then(|s| s.downcast_ref::<DeviceError>());
        assert!(
            matches!(why, Some(DeviceError::Capacity { source, .. }) if **source == quantity),
            "{claim:?}"
        );
        assert_eq!(
            crate::one_line(&claim),
            format!("claim ns/c: device \"gpu-0\" of pool \"node-a\": consumedCapacity.memory: {quantity}")
        );

        let gone = UnprepareError::Remove {
            path: "/x/spec.json".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        let io = gone
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(|e| e.kind()),
            Some(std::io::ErrorKind::PermissionDenied)
        );
        assert!(
            crate::one_line(&gone).starts_with("removing /x/spec.json: permission denied"),
            "{}",
            crate::one_line(&gone)
        );
    }
}
