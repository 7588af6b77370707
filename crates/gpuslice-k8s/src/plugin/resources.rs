//! What the plugin offers: one [`Resource`] per resource name, built from
//! the inventory and the config, and the answer to Allocate for a set of
//! its device IDs. Pure apart from writing a shared slice's records (its
//! limits and usage ledger), so it is unit-tested and benchmarked without
//! gRPC.

use super::config::{Config, MigStrategy};
use super::ledgers;
use super::roles::{self, Role, RoleError};
use super::v1beta1 as api;
use gpuslice_cdi::CONTAINER_SHIM;
use gpuslice_core::model::{NVIDIACTL_MINOR, NVIDIA_MAJOR, NVIDIA_MODESET_MINOR};
use gpuslice_core::{DevicePolicy, HostRoot, Inventory, Selection};
use gpuslice_ledger::board::{self, BOARD_DIR_ENV, DEFAULT_BOARD_DIR};
use gpuslice_ledger::limits::{
    device_env, ComputeShare, DeviceLimits, MemorySize, RecordPaths, SliceLimits, HOSTPID_FILE,
    LIMITS_FILE, MAX_SLICE_ID_LEN, SLICE_DIR, USAGE_FILE,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";
/// The name of the preload file below `stateDir`, mounted at `/etc/ld.so.preload`.
pub const PRELOAD_FILE: &str = "ld.so.preload";
/// Separator of a replica ID: `<uuid>::<r>`.
pub const REPLICA_SEP: &str = "::";
/// Longest device ID the kubelet accepts.
pub const MAX_ID_LEN: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Whole,
    Shared { replicas: u32 },
    Mig { profile: String },
}

/// One device of a resource, as listed to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: String,
    /// Index of the GPU it is (or is on).
    pub gpu: u32,
    /// MIG device index on that GPU.
    pub mig: Option<u32>,
    pub numa: Option<i32>,
}

#[derive(Debug, Clone)]
pub struct Resource {
    /// `nvidia.com/gpu.shared`.
    pub name: String,
    /// `gpu.shared`: the part after the prefix.
    pub short: String,
    pub kind: Kind,
    pub entries: Vec<Entry>,
    by_id: HashMap<String, usize>,
}

impl Resource {
    fn new(prefix: &str, short: String, kind: Kind, entries: Vec<Entry>) -> Self {
        let by_id = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.id.clone(), i))
            .collect();
        Resource {
            name: format!("{prefix}/{short}"),
            short,
            kind,
            entries,
            by_id,
        }
    }

    /// Socket base name, the `endpoint` of the registration.
    pub fn endpoint(&self) -> String {
        format!("gpuslice-{}.sock", self.short)
    }

    pub fn entry(&self, id: &str) -> Option<&Entry> {
        self.by_id.get(id).map(|&i| &self.entries[i])
    }

    /// The device list for ListAndWatch, with `unhealthy` GPU indices marked.
    pub fn devices(&self, unhealthy: &dyn Fn(u32) -> bool) -> Vec<api::Device> {
        self.entries
            .iter()
            .map(|e| api::Device {
                id: e.id.clone(),
                health: if unhealthy(e.gpu) { UNHEALTHY } else { HEALTHY }.into(),
                topology: e.numa.filter(|n| *n >= 0).map(|n| api::TopologyInfo {
                    nodes: vec![api::NumaNode { id: n.into() }],
                }),
            })
            .collect()
    }
}

/// Why an Allocate (or preferred allocation) request is refused: the
/// kubelet gets it as gRPC InvalidArgument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Everything the plugin serves, built once per (re)load.
#[derive(Debug)]
pub struct Plan {
    pub cfg: Config,
    pub root: HostRoot,
    pub inv: Inventory,
    pub resources: Vec<Resource>,
    /// Things not offered, one line each.
    pub warnings: Vec<String>,
    /// Control nodes present on the host, paths relative to /dev.
    control: Vec<&'static str>,
}

impl Plan {
    /// What `cfg` offers on `inv`; an error names the `roles` field that
    /// does not resolve (an unknown GPU, or one GPU in two roles).
    pub fn new(cfg: Config, root: HostRoot, inv: Inventory) -> Result<Self, RoleError> {
        let mut warnings = Vec::new();
        // Resource short name -> (kind, entries), in the order first seen.
        let mut offered: Vec<(String, Kind, Vec<Entry>)> = Vec::new();
        let mut add = |short: String, kind: Kind, e: Entry| match offered
            .iter_mut()
            .find(|(s, _, _)| *s == short)
        {
            Some((_, _, v)) => v.push(e),
            None => offered.push((short, kind, vec![e])),
        };
        for (g, a) in inv.gpus.iter().zip(roles::resolve(&cfg, &inv)?) {
            if let Some(why) = a.unfit {
                warnings.push(why);
                continue;
            }
            let entry = |id: String, mig: Option<u32>| Entry {
                id,
                gpu: g.index,
                mig,
                numa: g.numa_node,
            };
            let short = a.resource.unwrap_or_default();
            match a.role {
                Role::Whole => add(short, Kind::Whole, entry(g.uuid.clone(), None)),
                Role::Shared { replicas } => {
                    if g.memory_bytes.is_none() {
                        warnings.push(format!(
                            "GPU {} not shared: its memory size is unknown ({})",
                            g.index,
                            inv.nvml_error.as_deref().unwrap_or("NVML gave none")
                        ));
                        continue;
                    }
                    for r in 0..replicas {
                        let id = format!("{}{REPLICA_SEP}{r}", g.uuid);
                        add(short.clone(), Kind::Shared { replicas }, entry(id, None));
                    }
                }
                Role::Mig if cfg.strategies.mig == MigStrategy::None => warnings.push(format!(
                    "GPU {} is in MIG mode and the MIG strategy is none: not offered",
                    g.index
                )),
                Role::Mig => {
                    for m in &g.migs {
                        let (Some(uuid), Some(profile)) = (&m.uuid, &m.profile) else {
                            warnings.push(format!(
                                "MIG device {}:{} not offered: its UUID or profile is unknown (NVML)",
                                g.index, m.index
                            ));
                            continue;
                        };
                        let kind = Kind::Mig {
                            profile: profile.clone(),
                        };
                        add(
                            format!("mig-{profile}"),
                            kind,
                            entry(uuid.clone(), Some(m.index)),
                        );
                    }
                }
            }
        }
        // Whole, then shared, then MIG resources; by name within each.
        let rank = |k: &Kind| match k {
            Kind::Whole => 0,
            Kind::Shared { .. } => 1,
            Kind::Mig { .. } => 2,
        };
        offered.sort_by(|a, b| (rank(&a.1), &a.0).cmp(&(rank(&b.1), &b.0)));
        let p = &cfg.prefix;
        let resources: Vec<Resource> = offered
            .into_iter()
            .map(|(short, kind, entries)| Resource::new(p, short, kind, entries))
            .collect();
        for r in &resources {
            for e in &r.entries {
                if e.id.len() > MAX_ID_LEN {
                    warnings.push(format!(
                        "{}: device ID {} is longer than {MAX_ID_LEN} characters",
                        r.name, e.id
                    ));
                }
            }
        }
        let control = [
            "nvidiactl",
            "nvidia-modeset",
            "nvidia-uvm",
            "nvidia-uvm-tools",
        ]
        .into_iter()
        .filter(|n| root.dev().join(n).exists())
        .collect();
        Ok(Plan {
            cfg,
            root,
            inv,
            resources,
            warnings,
            control,
        })
    }

    /// Host path of `seen` (a path as the plugin sees it) as the runtime
    /// should open it.
    pub fn host_path(&self, seen: &Path) -> String {
        if self.cfg.strip_host_root {
            if let Ok(rel) = seen.strip_prefix(self.root.path()) {
                return Path::new("/").join(rel).display().to_string();
            }
        }
        seen.display().to_string()
    }

    fn dev_spec(&self, rel: &str) -> api::DeviceSpec {
        api::DeviceSpec {
            container_path: format!("/dev/{rel}"),
            host_path: self.host_path(&self.root.dev().join(rel)),
            permissions: "rw".into(),
        }
    }

    /// The preload file mounted at `/etc/ld.so.preload` in shared replicas.
    pub fn preload_file(&self) -> PathBuf {
        self.cfg.state_dir.join(PRELOAD_FILE)
    }

    /// The host-pid resolver's socket, mounted into shared replicas.
    pub fn hostpid_socket(&self) -> PathBuf {
        self.cfg.state_dir.join(HOSTPID_FILE)
    }

    /// Whether it offers shared replicas (capped slices).
    pub fn shares(&self) -> bool {
        self.resources
            .iter()
            .any(|r| matches!(r.kind, Kind::Shared { .. }))
    }

    /// Writes the preload file (naming the shim's container path) and
    /// serves the host-pid resolver ([`super::hostpid`]).
    pub fn prepare(&self) -> std::io::Result<()> {
        if self.shares() {
            std::fs::create_dir_all(&self.cfg.state_dir)?;
            std::fs::write(self.preload_file(), format!("{CONTAINER_SHIM}\n"))?;
            super::hostpid::ensure(&self.hostpid_socket())?;
        }
        Ok(())
    }

    /// A shared allocation's limits: per GPU, its replicas' part of the
    /// memory and of the time (one unit each: bytes, basis points).
    fn replica_limits(
        &self,
        slice: &str,
        replicas: u32,
        per_gpu: &BTreeMap<u32, Vec<&Entry>>,
    ) -> SliceLimits {
        let devices = per_gpu
            .iter()
            .filter_map(|(gpu, on)| {
                self.inv
                    .gpus
                    .iter()
                    .find(|g| g.index == *gpu)
                    .map(|g| (g, on))
            })
            .map(|(g, on)| {
                let mem = g.memory_bytes.unwrap_or(0);
                DeviceLimits {
                    uuid: g.uuid.clone(),
                    memory: Some(MemorySize(
                        (mem / u64::from(replicas) * on.len() as u64).max(1),
                    )),
                    compute: Some(ComputeShare::fraction(on.len() as u64, u64::from(replicas))),
                }
            })
            .collect();
        SliceLimits {
            slice_id: slice.to_string(),
            mode: self.cfg.sharing.compute_mode,
            devices,
        }
    }

    /// Writes a replica's records (root's limits, its usage ledger) under
    /// `<ledgerDir>/<slice>/` and returns its mounts: the shim and the
    /// preload list read-only, its own limits read-only and its own usage
    /// ledger read-write at the fixed place, nothing of other slices
    /// writable; and the GPUs' boards ([`Self::board_mounts`]).
    fn slice_mounts(&self, limits: &SliceLimits) -> Result<Vec<api::Mount>, BadRequest> {
        let dir = self.cfg.ledger_dir.join(&limits.slice_id);
        // The kubelet may allocate the same device IDs again to a new
        // container: a leftover nothing uses is removed ([`ledgers`]);
        // one a process of the old pod still uses is kept, records and
        // all (the same IDs have the same limits).
        ledgers::prepare(&dir, &self.cfg.board_dir)
            .map_err(|e| BadRequest(format!("cannot prepare the ledger directory: {e}")))?;
        let existing = RecordPaths::under(&dir);
        let records = if existing.limits.is_file() {
            existing
        } else {
            // Made afresh, root-only (prepare's directory is empty).
            limits.write_records_in(&dir).map_err(|e| {
                BadRequest(format!(
                    "cannot write the slice's records in {}: {e}",
                    dir.display()
                ))
            })?
        };
        let at = |name: &str| format!("{SLICE_DIR}/{name}");
        let mount = |container_path: String, host: &Path, read_only: bool| {
            self.mount(container_path, host, read_only)
        };
        let mut mounts = vec![
            mount(CONTAINER_SHIM.into(), &self.cfg.shim, true),
            mount("/etc/ld.so.preload".into(), &self.preload_file(), true),
            mount(at(LIMITS_FILE), &records.limits, true),
            mount(at(USAGE_FILE), &records.usage, false),
        ];
        let hostpid = self.hostpid_socket();
        if super::hostpid::served(&hostpid) {
            mounts.push(mount(at(HOSTPID_FILE), &hostpid, true));
        }
        mounts.extend(self.board_mounts(limits, &records.usage)?);
        Ok(mounts)
    }

    /// A replica's mounts of the GPUs' boards, in every compute mode (its
    /// slice takes turns on each GPU with the others, and a guaranteed one
    /// borrows there): the directory read-only, each GPU's board (made by
    /// root, replacing one it did not make: a local user's squatted file)
    /// writable over it, so the container adds or removes nothing there,
    /// and root's share records read-only, with this slice's published
    /// (what lets the others count it and pass it the turn; a replica
    /// cannot vouch for a share of its own making). What a liar can do
    /// on a board is bounded: docs/security.md.
    fn board_mounts(
        &self,
        limits: &SliceLimits,
        usage: &Path,
    ) -> Result<Vec<api::Mount>, BadRequest> {
        let boards = &self.cfg.board_dir;
        gpuslice_ledger::ensure_dir(boards)
            .map_err(|e| BadRequest(format!("cannot create the board directory: {e}")))?;
        let inside = Path::new(DEFAULT_BOARD_DIR);
        let mut mounts = vec![self.mount(DEFAULT_BOARD_DIR.into(), boards, true)];
        for d in &limits.devices {
            match board::prepare_board(boards, &d.uuid) {
                Ok(file) => mounts.push(self.mount(
                    board::board_path(inside, &d.uuid).display().to_string(),
                    &file,
                    false,
                )),
                Err(e) => {
                    tracing::warn!(gpu = %d.uuid, error = %e, "the replica will not take turns on this GPU")
                }
            }
        }
        board::publish_shares(boards, usage, limits).map_err(|e| {
            BadRequest(format!(
                "cannot record the share on {}: {e}",
                boards.display()
            ))
        })?;
        mounts.push(self.mount(
            board::shares_dir(inside).display().to_string(),
            &board::shares_dir(boards),
            true,
        ));
        Ok(mounts)
    }

    fn mount(&self, container_path: String, host: &Path, read_only: bool) -> api::Mount {
        api::Mount {
            container_path,
            host_path: self.host_path(host),
            read_only,
        }
    }

    /// The answer for one container asking for `ids` of resource `res`.
    pub fn allocate(
        &self,
        res: &Resource,
        ids: &[String],
    ) -> Result<api::ContainerAllocateResponse, BadRequest> {
        if ids.is_empty() {
            return Err(BadRequest(format!("{}: no device IDs requested", res.name)));
        }
        let mut entries: Vec<&Entry> = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(e) = res.entry(id) else {
                return Err(BadRequest(format!(
                    "{}: unknown device ID {id:?} (not one this plugin lists for {})",
                    res.name, res.name
                )));
            };
            if entries.iter().any(|o| o.id == e.id) {
                return Err(BadRequest(format!(
                    "{}: device ID {id:?} requested twice",
                    res.name
                )));
            }
            entries.push(e);
        }
        // GPU index -> entries on it, in index order.
        let mut per_gpu: BTreeMap<u32, Vec<&Entry>> = BTreeMap::new();
        for e in &entries {
            per_gpu.entry(e.gpu).or_default().push(e);
        }
        let sel = match res.kind {
            Kind::Mig { .. } => Selection {
                gpus: vec![],
                migs: entries
                    .iter()
                    .map(|e| (e.gpu, e.mig.unwrap_or(0)))
                    .collect(),
            },
            _ => Selection::gpus(per_gpu.keys().copied()),
        };
        let mut resp = api::ContainerAllocateResponse::default();
        // Device nodes: exactly what the policy allows on the NVIDIA majors.
        let policy = DevicePolicy::for_selection(&self.inv, &sel);
        for rule in &policy.rules {
            for &minor in &rule.allowed {
                let rel = if rule.major == NVIDIA_MAJOR {
                    if minor == NVIDIACTL_MINOR || minor == NVIDIA_MODESET_MINOR {
                        continue; // control nodes below
                    }
                    format!("nvidia{minor}")
                } else if Some(rule.major) == self.inv.majors.nvidia_caps {
                    format!("nvidia-caps/nvidia-cap{minor}")
                } else {
                    continue;
                };
                resp.devices.push(self.dev_spec(&rel));
            }
        }
        for c in &self.control {
            resp.devices.push(self.dev_spec(c));
        }
        // Visible devices: GPU UUIDs, or MIG UUIDs.
        let visible: Vec<String> = match res.kind {
            Kind::Mig { .. } => entries.iter().map(|e| e.id.clone()).collect(),
            _ => per_gpu
                .keys()
                .filter_map(|i| self.inv.gpus.iter().find(|g| g.index == *i))
                .map(|g| g.uuid.clone())
                .collect(),
        };
        let visible = visible.join(",");
        let slice = slice_id(&entries[0].id);
        let env = &mut resp.envs;
        if let Kind::Shared { replicas } = res.kind {
            let limits = self.replica_limits(&slice, replicas, &per_gpu);
            env.extend(limits.child_env(&visible));
            resp.mounts.extend(self.slice_mounts(&limits)?);
            env.insert(BOARD_DIR_ENV.into(), DEFAULT_BOARD_DIR.into());
        } else {
            env.extend(device_env(&visible, &slice).map(|(k, v)| (k.to_string(), v)));
        }
        if self.cfg.strategies.cdi {
            let kind = &self.cfg.strategies.cdi_kind;
            resp.cdi_devices = visible
                .split(',')
                .map(|u| api::CdiDevice {
                    name: format!("{kind}={u}"),
                })
                .collect();
        }
        let partitions = &self.cfg.driver_partitions;
        if partitions.enabled && matches!(res.kind, Kind::Shared { .. }) {
            resp.cdi_devices.push(api::CdiDevice {
                name: super::partitions::device_name(&partitions.cdi_kind, &slice),
            });
        }
        Ok(resp)
    }
}

/// The slice id of an allocation: from its first device ID, in the
/// ledger's alphabet (`A-Z a-z 0-9 . _ -`), at most 63 characters.
pub fn slice_id(first: &str) -> String {
    let s: String = first
        .replace(REPLICA_SEP, "-r")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let s = format!("k8s-{s}");
    s.chars().take(MAX_SLICE_ID_LEN).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_ledger::limits::valid_slice_id;

    /// Whatever the kubelet's device ID, its slice id is one the slice
    /// contract accepts (the ledger, the records' directory).
    #[test]
    fn slice_ids_of_any_device_id_are_valid() {
        let long = format!("GPU-{}::3", "9".repeat(80));
        for id in ["GPU-a::0", "MIG-1/2 x", "../..", "ünï::1", long.as_str()] {
            let s = slice_id(id);
            assert!(valid_slice_id(&s), "{id:?} -> {s:?}");
        }
        assert_eq!(slice_id("GPU-a::0"), "k8s-GPU-a-r0");
    }
}
