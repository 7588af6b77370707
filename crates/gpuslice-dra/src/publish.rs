//! ResourceSlices (`resource.k8s.io/v1`): what this node offers, in one
//! pool named after the node, and their publication with the pool's
//! generation.
//!
//! Devices, named as [`crate::claim::DeviceKind`] parses them:
//! - `gpu-<i>`: a GPU, whole or shared through consumable capacity
//!   (KEP-5075): `allowMultipleAllocations: true`, capacities `memory`
//!   (bytes, in steps of [`SharedPolicy::memory_step`], defaulting to all
//!   of it, so a request naming no capacity takes the whole GPU) and
//!   `compute` (percent of the GPU's time, 1 to 100, defaulting to
//!   [`BEST_EFFORT_COMPUTE`]: a request naming no compute is best-effort
//!   and blocks no share) (`gpu_device`);
//! - `gpu-<i>-mig-<m>`: a pre-created MIG device (the GPU itself, in MIG
//!   mode, is offered as nothing else).
//!
//! An unhealthy GPU (critical XID) stays in the pool with every device of
//! it tainted ([`UNHEALTHY_TAINT`], the XID as value, effect `NoSchedule`:
//! the scheduler allocates it to no new claim, running ones keep it); on
//! recovery the taints go. An API server without the `DRADeviceTaints`
//! feature drops taints silently, which would offer a broken GPU: when a
//! write comes back without the taints it carried, the publisher falls
//! back to leaving such GPUs out of the pool ([`Unhealthy::Remove`]).
//!
//! One device per GPU carries both the whole GPU and its shares, so every
//! allocation the scheduler makes is one the node can prepare: a whole
//! GPU consumes all of its capacity, leaving no room for a share, and a
//! share leaves too little for the whole (docs/dra.md, "One device per
//! GPU"). Prepare still checks (`driver::check_capacity`).

use crate::apiserver::{ApiError, SliceApi, SliceWriteError, WatchEnd, WatchEvent};
use gpuslice_core::{Gpu, Inventory};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use thiserror::Error;

/// The most devices one ResourceSlice may hold (without taints or counters).
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// The most when any of its devices has a taint (the API's validation).
pub const MAX_TAINTED_DEVICES_PER_SLICE: usize = 64;
/// The key of the taint on an unhealthy GPU's devices; its value is the XID.
pub const UNHEALTHY_TAINT: &str = "gpuslice.io/unhealthy";
/// The key of the taint on every device of a node that cannot enforce its
/// slices' caps (`crate::daemon::enforcement_problem`).
pub const UNENFORCED_TAINT: &str = "gpuslice.io/unenforced";
/// How often a write is retried after a conflict (someone else wrote).
const CONFLICT_RETRIES: usize = 5;

pub use crate::policy::{PolicyError, SharedPolicy, BEST_EFFORT_COMPUTE};

fn string(s: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.into()),
        ..DeviceAttribute::default()
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..DeviceAttribute::default()
    }
}

/// A semantic version attribute when `v` is numeric `X.Y.Z` or `X.Y`,
/// with leading zeros dropped (semver forbids them; NVIDIA's `580.65.06`
/// is published as `580.65.6`, which compares the same) and `X.Y` as
/// `X.Y.0`; anything else as a string.
fn version(v: &str) -> DeviceAttribute {
    let parts: Option<Vec<u64>> = v
        .split('.')
        .map(|p| {
            (!p.is_empty() && p.len() <= 18 && p.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse().ok())
                .flatten()
        })
        .collect();
    match parts.as_deref() {
        Some([a, b, c]) => DeviceAttribute {
            version: Some(format!("{a}.{b}.{c}")),
            ..DeviceAttribute::default()
        },
        Some([a, b]) => DeviceAttribute {
            version: Some(format!("{a}.{b}.0")),
            ..DeviceAttribute::default()
        },
        _ => string(v),
    }
}

fn quantity(v: u64) -> Quantity {
    Quantity(v.to_string())
}

/// The NVLink domain of each GPU: GPUs joined by active NVLinks (directly
/// or through others) share one, named by the lowest PCI bus id among
/// them, so a claim can ask for GPUs of one domain with `matchAttribute`.
fn nvlink_domains(gpus: &[Gpu]) -> BTreeMap<String, String> {
    let mut domain: BTreeMap<String, String> = gpus
        .iter()
        .map(|g| (g.pci_bus_id.clone(), g.pci_bus_id.clone()))
        .collect();
    // Propagate the lowest id along links until nothing changes.
    loop {
        let mut changed = false;
        for g in gpus {
            for p in &g.nvlink_peers {
                let (Some(a), Some(b)) = (domain.get(&g.pci_bus_id), domain.get(p)) else {
                    continue;
                };
                let low = a.min(b).clone();
                for id in [&g.pci_bus_id, p] {
                    if domain[id] != low {
                        domain.insert(id.clone(), low.clone());
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            return domain;
        }
    }
}

/// The attributes every device of `gpu` carries.
fn gpu_attributes(inv: &Inventory, gpu: &Gpu, domain: &str) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    a.insert("uuid".into(), string(&gpu.uuid));
    a.insert("index".into(), int(gpu.index.into()));
    a.insert("productName".into(), string(&gpu.model));
    a.insert("pciBusID".into(), string(&gpu.pci_bus_id));
    if let Some(n) = gpu.numa_node {
        a.insert("numaNode".into(), int(n.into()));
    }
    if let Some(v) = &inv.driver_version {
        a.insert("driverVersion".into(), version(v));
    }
    if let Some(v) = &inv.cuda_version {
        a.insert("cudaVersion".into(), version(v));
    }
    a.insert("nvlinkDomain".into(), string(domain));
    a
}

/// A GPU's one device, `gpu-<i>`: the whole GPU and every share of it,
/// so that the scheduler itself never places a whole-GPU claim beside a
/// share (nor a share beside a whole GPU), which the node would refuse and
/// leave the pod stranded. With its memory size known it allows multiple
/// allocations (consumable capacity, KEP-5075) with capacities `memory`
/// (bytes, in steps of [`SharedPolicy::memory_step`], at most the GPU's,
/// defaulting to all of it) and `compute` (percent, 1 to 100, defaulting
/// to [`BEST_EFFORT_COMPUTE`]): a request that names no capacity (the
/// whole-GPU class) consumes all the memory and so the whole GPU, one that
/// names both takes a share, one that names memory only a best-effort
/// share of the time. Without its memory size (no
/// NVML), or one too small to share, it is offered whole only.
fn gpu_device(
    gpu: &Gpu,
    attributes: BTreeMap<String, DeviceAttribute>,
    policy: &SharedPolicy,
) -> Device {
    let whole_only = Device {
        name: format!("gpu-{}", gpu.index),
        attributes: Some(attributes.clone()),
        ..Device::default()
    };
    let Some(mem) = gpu.memory_bytes else {
        return whole_only;
    };
    // Memory in whole steps, at least min + one step.
    let usable = policy.usable_memory(mem);
    if usable < policy.memory_step * 2 {
        return whole_only;
    }
    let capacity = BTreeMap::from([
        (
            crate::claim::CAPACITY_MEMORY.to_string(),
            DeviceCapacity {
                value: quantity(usable),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(quantity(usable)),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: quantity(policy.memory_step),
                        max: Some(quantity(usable)),
                        step: Some(quantity(policy.memory_step)),
                    }),
                    valid_values: None,
                }),
            },
        ),
        (
            crate::claim::CAPACITY_COMPUTE.to_string(),
            DeviceCapacity {
                value: quantity(100),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(quantity(BEST_EFFORT_COMPUTE)),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: quantity(1),
                        max: Some(quantity(100)),
                        step: Some(quantity(1)),
                    }),
                    valid_values: None,
                }),
            },
        ),
    ]);
    Device {
        allow_multiple_allocations: Some(true),
        capacity: Some(capacity),
        ..whole_only
    }
}

/// The devices this node offers.
pub fn devices(inv: &Inventory, policy: &SharedPolicy) -> Vec<Device> {
    let domains = nvlink_domains(&inv.gpus);
    let mut out = Vec::new();
    for gpu in &inv.gpus {
        let domain = domains
            .get(&gpu.pci_bus_id)
            .map_or(gpu.pci_bus_id.as_str(), String::as_str);
        let attrs = gpu_attributes(inv, gpu, domain);
        if gpu.mig_enabled == Some(true) {
            for m in &gpu.migs {
                let mut a = attrs.clone();
                a.insert("type".into(), string("mig"));
                a.insert("parentUUID".into(), string(&gpu.uuid));
                if let Some(u) = &m.uuid {
                    a.insert("uuid".into(), string(u));
                }
                if let Some(p) = &m.profile {
                    a.insert("profile".into(), string(p));
                }
                out.push(Device {
                    name: format!("gpu-{}-mig-{}", gpu.index, m.index),
                    attributes: Some(a),
                    ..Device::default()
                });
            }
            continue;
        }
        let mut a = attrs;
        a.insert("type".into(), string("gpu"));
        out.push(gpu_device(gpu, a, policy));
    }
    out
}

/// The name of the `k`-th slice of `node`'s pool.
pub fn slice_name(node: &str, driver: &str, k: usize) -> String {
    format!("{node}-{driver}-{k}")
}

/// The pool's slices at `generation`, [`MAX_DEVICES_PER_SLICE`] devices
/// each, or [`MAX_TAINTED_DEVICES_PER_SLICE`] when any device of the pool
/// is tainted (one slice, empty, when there are none: the pool still
/// exists).
pub fn slices(driver: &str, node: &str, generation: i64, devices: &[Device]) -> Vec<ResourceSlice> {
    let per_slice = if devices.iter().any(|d| d.taints.is_some()) {
        MAX_TAINTED_DEVICES_PER_SLICE
    } else {
        MAX_DEVICES_PER_SLICE
    };
    let chunks: Vec<&[Device]> = if devices.is_empty() {
        vec![&[]]
    } else {
        devices.chunks(per_slice).collect()
    };
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(k, d)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(node, driver, k)),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.into(),
                node_name: Some(node.into()),
                pool: ResourcePool {
                    name: node.into(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(d.to_vec()),
                ..ResourceSliceSpec::default()
            },
        })
        .collect()
}

#[derive(Debug, Error)]
pub enum PublishError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("publishing ResourceSlices: still conflicting after {CONFLICT_RETRIES} tries: {0}")]
    Conflicts(String),
}

/// What a publication did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The pool's generation now.
    pub generation: i64,
    /// Whether anything was written.
    pub changed: bool,
    /// A write came back with fewer device taints than it carried: the API
    /// server drops them (its `DRADeviceTaints` feature is off).
    pub taints_dropped: bool,
}

/// Makes the node's pool hold exactly `devices`: re-reads what is
/// published, and when it differs (devices, slice count, or slices of
/// different generations) writes every slice at a generation above any
/// seen, each update conditional on the resourceVersion read; deletes
/// slices beyond the count. A conflict (someone wrote in between) starts
/// over from a fresh read.
pub async fn publish(
    api: &dyn SliceApi,
    driver: &str,
    node: &str,
    devices: &[Device],
) -> Result<Published, PublishError> {
    let mut last = String::new();
    for _ in 0..CONFLICT_RETRIES {
        match publish_once(api, driver, node, devices).await {
            Ok(p) => return Ok(p),
            Err(SliceWriteError::Conflict(name, why)) => {
                tracing::info!("resourceslice {name}: conflict, re-reading: {why}");
                last = format!("{name}: {why}");
            }
            Err(SliceWriteError::Api(e)) => return Err(e.into()),
        }
    }
    Err(PublishError::Conflicts(last))
}

async fn publish_once(
    api: &dyn SliceApi,
    driver: &str,
    node: &str,
    devices: &[Device],
) -> Result<Published, SliceWriteError> {
    let existing: BTreeMap<String, ResourceSlice> = api
        .list_slices(node, driver)
        .await?
        .items
        .into_iter()
        .filter(|s| s.spec.driver == driver && s.spec.pool.name == node)
        .filter_map(|s| Some((s.metadata.name.clone()?, s)))
        .collect();
    let top = existing
        .values()
        .map(|s| s.spec.pool.generation)
        .max()
        .unwrap_or(0);
    let owners = api.owner().map(|o| vec![o]);
    let owned = |mut s: ResourceSlice| {
        s.metadata.owner_references = owners.clone();
        s
    };
    let want: Vec<ResourceSlice> = slices(driver, node, top, devices)
        .into_iter()
        .map(owned)
        .collect();
    let current = want.len() == existing.len()
        && want.iter().all(|w| {
            existing
                .get(w.metadata.name.as_deref().unwrap_or_default())
                .is_some_and(|e| {
                    e.spec == w.spec && (owners.is_none() || e.metadata.owner_references == owners)
                })
        });
    if current {
        return Ok(Published {
            generation: top,
            changed: false,
            taints_dropped: false,
        });
    }
    let generation = top + 1;
    let mut taints_dropped = false;
    for mut s in slices(driver, node, generation, devices)
        .into_iter()
        .map(owned)
    {
        let name = s.metadata.name.clone().unwrap_or_default();
        let stored = match existing.get(&name) {
            Some(e) => {
                s.metadata.resource_version = e.metadata.resource_version.clone();
                api.update_slice(&s).await?
            }
            None => api.create_slice(&s).await?,
        };
        taints_dropped |= taint_count(&stored) < taint_count(&s);
    }
    let keep: Vec<String> = slices(driver, node, generation, devices)
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    for name in existing.keys().filter(|n| !keep.contains(n)) {
        api.delete_slice(name).await?;
    }
    Ok(Published {
        generation,
        changed: true,
        taints_dropped,
    })
}

fn taint_count(s: &ResourceSlice) -> usize {
    s.spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.taints.as_ref().map_or(0, Vec::len))
        .sum()
}

/// What becomes of an unhealthy GPU's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unhealthy {
    /// They stay, each with a `NoSchedule` [`UNHEALTHY_TAINT`].
    Taint,
    /// They leave the pool (where the API server drops taints).
    Remove,
}

/// A GPU's health problem: why (the health watcher's words, `XID <n>`)
/// and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sick {
    pub why: String,
    pub since: k8s_openapi::jiff::Timestamp,
}

/// The taint value for `why`: the XID number of `XID <n>`, else
/// `unknown` (a taint value must be a label value).
fn taint_value(why: &str) -> String {
    match why.strip_prefix("XID ") {
        Some(n) if !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()) => {
            n.into()
        }
        _ => "unknown".into(),
    }
}

/// The pool's devices with the unhealthy GPUs (by index) tainted or left
/// out. A taint's `timeAdded` is when the GPU went bad, in whole seconds
/// (what the API server keeps), so re-publishing an unchanged state
/// writes nothing.
///
/// When the node cannot enforce its slices (`unenforced`: since when),
/// every device also carries a `NoSchedule` [`UNENFORCED_TAINT`].
pub fn pool_devices(
    inv: &Inventory,
    policy: &SharedPolicy,
    unhealthy: &BTreeMap<u32, Sick>,
    unenforced: Option<&Sick>,
    mode: Unhealthy,
) -> Vec<Device> {
    let taint = |key: &str, value: String, since: k8s_openapi::jiff::Timestamp| {
        let since = k8s_openapi::jiff::Timestamp::from_second(since.as_second()).unwrap_or(since);
        DeviceTaint {
            key: key.into(),
            value: Some(value),
            effect: "NoSchedule".into(),
            time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(since)),
        }
    };
    let mut out = devices(inv, policy);
    out.retain_mut(|d| {
        let gpu = crate::claim::DeviceKind::parse(&d.name).map(|k| k.gpu());
        let sick = gpu.and_then(|g| unhealthy.get(&g));
        let mut taints = Vec::new();
        if let Some(sick) = sick {
            taints.push(taint(UNHEALTHY_TAINT, taint_value(&sick.why), sick.since));
        }
        if let Some(u) = unenforced {
            taints.push(taint(UNENFORCED_TAINT, "shim".into(), u.since));
        }
        if taints.is_empty() {
            return true;
        }
        if mode == Unhealthy::Remove {
            return false;
        }
        d.taints = Some(taints);
        true
    });
    out
}

/// Keeps the pool published: at once, on every health change (`health`:
/// the device plugin's XID watcher, `gpuslice_health`), on
/// every inventory change (`inventory`: hot-plug, [`crate::hotplug`]), and
/// whenever the pool's slices change on the API server ([`watch_pool`]:
/// someone else edited or deleted them), and every `resync`. Unhealthy
/// GPUs are tainted, or left out once the API server is seen dropping
/// taints. Runs until the health or the inventory sender is dropped;
/// errors are logged and retried at the next turn.
pub async fn follow(
    api: &dyn SliceApi,
    driver: &str,
    feed: crate::feed::NodeFeed,
    resync: std::time::Duration,
) {
    let crate::feed::NodeFeed {
        pool: node,
        policy,
        mut inventory,
        xids: mut health,
        mut enforcement,
    } = feed;
    let (node, policy) = (node.as_str(), &policy);
    let changed_there = tokio::sync::Notify::new();
    let keep = async {
        let mut mode = Unhealthy::Taint;
        let mut sick: BTreeMap<u32, Sick> = BTreeMap::new();
        let mut unenforced: Option<Sick> = None;
        loop {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let now = k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default();
            let snapshot = health.borrow_and_update().unhealthy.clone();
            sick.retain(|g, s| snapshot.get(g) == Some(&s.why));
            for (g, why) in snapshot {
                sick.entry(g).or_insert(Sick { why, since: now });
            }
            match enforcement.borrow_and_update().clone() {
                None => unenforced = None,
                Some(why) if unenforced.as_ref().is_none_or(|u| u.why != why) => {
                    unenforced = Some(Sick { why, since: now })
                }
                Some(_) => {}
            }
            let inv = inventory.borrow_and_update().clone();
            let d = pool_devices(&inv, policy, &sick, unenforced.as_ref(), mode);
            match publish(api, driver, node, &d).await {
                Ok(p) if p.taints_dropped && mode == Unhealthy::Taint => {
                    tracing::warn!(
                        "the API server drops device taints (DRADeviceTaints off?): unhealthy GPUs now leave the pool instead"
                    );
                    mode = Unhealthy::Remove;
                    continue;
                }
                Ok(p) if p.changed => tracing::info!(
                    "published {} devices of {} GPUs in pool {node}, generation {} ({} GPUs unhealthy)",
                    d.len(),
                    inv.gpus.len(),
                    p.generation,
                    sick.len()
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!("publishing ResourceSlices: {e}"),
            }
            tokio::select! {
                changed = health.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                changed = inventory.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                // A closed sender (nothing watches the shim) never wakes this.
                Ok(()) = enforcement.changed() => {}
                _ = changed_there.notified() => {}
                _ = tokio::time::sleep(resync) => {}
            }
        }
    };
    tokio::select! {
        _ = keep => {}
        _ = watch_pool(api, driver, node, &changed_there) => {}
    }
}

/// How long a failed watch waits before it is tried again.
const WATCH_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Follows the pool's slices on the API server, as a reflector does:
/// lists them, then watches from the list's resourceVersion, moving on
/// with every event and bookmark; a watch the server ends is taken up
/// again from there, and one whose resourceVersion is too old (410 Gone,
/// compacted away) starts over from a new list. Every change seen (and
/// every list, which may hide missed ones) wakes `changed`. Never returns.
pub async fn watch_pool(
    api: &dyn SliceApi,
    driver: &str,
    node: &str,
    changed: &tokio::sync::Notify,
) {
    loop {
        let mut rv = match api.list_slices(node, driver).await {
            Ok(l) => l.resource_version,
            Err(e) => {
                tracing::warn!("listing ResourceSlices to watch: {e}");
                tokio::time::sleep(WATCH_RETRY).await;
                continue;
            }
        };
        changed.notify_one();
        loop {
            let from = rv.clone();
            let mut on_event = |ev: WatchEvent| {
                if let Some(v) = ev.resource_version() {
                    rv = v.to_string();
                }
                if let WatchEvent::Changed(s) = ev {
                    if s.spec.pool.name == node {
                        changed.notify_one();
                    }
                }
            };
            let end = api.watch_slices(node, driver, &from, &mut on_event).await;
            match end {
                Ok(WatchEnd::Closed) => {}
                Ok(WatchEnd::Gone) => {
                    tracing::info!(
                        "ResourceSlice watch: resourceVersion {rv} is gone; listing again"
                    );
                    break;
                }
                Err(e) => {
                    tracing::warn!("ResourceSlice watch: {e}");
                    tokio::time::sleep(WATCH_RETRY).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::MIB;

    #[test]
    fn policies_are_checked() {
        assert_eq!(SharedPolicy::default().validate(), Ok(()));
        let p = |memory_step| SharedPolicy { memory_step };
        assert_eq!(p(0).validate(), Err(PolicyError::Step(0)));
        assert_eq!(p(1000).validate(), Err(PolicyError::Step(1000)));
        assert_eq!(p(256 * MIB).usable_memory(1000 * MIB), 768 * MIB);
    }

    #[test]
    fn versions_are_semver_when_they_can_be() {
        assert_eq!(version("570.86.15").version.as_deref(), Some("570.86.15"));
        assert_eq!(version("12.8").version.as_deref(), Some("12.8.0"));
        assert_eq!(version("550.54").version.as_deref(), Some("550.54.0"));
        assert_eq!(version("580.65.06").version.as_deref(), Some("580.65.6"));
        assert_eq!(version("r570").string.as_deref(), Some("r570"));
        assert_eq!(version("1.2.3.4").string.as_deref(), Some("1.2.3.4"));
        assert_eq!(version("1..2").string.as_deref(), Some("1..2"));
    }

    #[test]
    fn many_devices_split_into_slices_of_one_generation() {
        let d: Vec<Device> = (0..300)
            .map(|i| Device {
                name: format!("gpu-{i}"),
                ..Device::default()
            })
            .collect();
        let s = slices("gpu.gpuslice.io", "n", 7, &d);
        assert_eq!(s.len(), 3);
        for x in &s {
            assert_eq!(x.spec.pool.resource_slice_count, 3);
            assert_eq!(x.spec.pool.generation, 7);
        }
        assert_eq!(s[2].spec.devices.as_ref().unwrap().len(), 44);
        assert_eq!(slices("d", "n", 1, &[]).len(), 1);
    }
}
