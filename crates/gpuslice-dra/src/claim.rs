//! What a claim's allocation asks of this node: its results for this
//! driver, each a device of our pool with, for the shared device, the
//! capacity the scheduler recorded as consumed.
//!
//! Device names in our pool (the node's name), as the ResourceSlices
//! publish them: `gpu-<i>` (a GPU, whole or shared through consumable
//! capacity: `allowMultipleAllocations`, capacities `memory` in bytes and
//! `compute` in percent) and `gpu-<i>-mig-<m>` (a MIG device).
//! `gpu-<i>-shared` is how plugins before one device per GPU named a
//! share; it is still understood, for claims prepared by them.

use crate::quantity::{parse_integer, QuantityError};
use gpuslice_ledger::limits::{ComputeShare, DeviceCaps, MemorySize};
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub const CAPACITY_MEMORY: &str = "memory";
pub const CAPACITY_COMPUTE: &str = "compute";

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ClaimError {
    #[error("claim {0}: the API server has uid {1}, the kubelet asked for {2} (deleted and re-created?)")]
    UidMismatch(String, String, String),
    #[error("claim {0} is not allocated (no status.allocation)")]
    NotAllocated(String),
    #[error("claim {0}: no allocation result is for driver {1}")]
    NoResults(String, String),
    #[error("claim {claim}: device {device:?} of pool {pool:?}")]
    Device {
        claim: String,
        pool: String,
        device: String,
        #[source]
        why: DeviceError,
    },
}

/// Why an allocation result is not a device this node can prepare.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DeviceError {
    #[error("not this node's pool {0:?}")]
    OtherPool(String),
    #[error("not a device of ours (gpu-<i>, gpu-<i>-mig-<m>)")]
    NotOurs,
    #[error(
        "a shared device without consumedCapacity (is the DRAConsumableCapacity feature gate on?)"
    )]
    NoConsumedCapacity,
    #[error("consumedCapacity has no {0:?}")]
    NoCapacity(&'static str),
    #[error("consumedCapacity.{key}")]
    Capacity {
        key: &'static str,
        /// Boxed: a claim's errors stay small however the quantity's grows.
        source: Box<QuantityError>,
    },
    #[error("consumedCapacity.memory is 0")]
    NoMemory,
    #[error("consumedCapacity.compute is {0}, not 1 to 100 (percent)")]
    Compute(u64),
}

/// A device of our pool, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DeviceKind {
    Whole { gpu: u32 },
    Mig { gpu: u32, mig: u32 },
    Shared { gpu: u32 },
}

impl DeviceKind {
    /// `gpu-<i>`, `gpu-<i>-mig-<m>`, `gpu-<i>-shared`.
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("gpu-")?;
        let num = |s: &str| -> Option<u32> {
            (!s.is_empty()
                && s.bytes().all(|b| b.is_ascii_digit())
                && (s == "0" || !s.starts_with('0')))
            .then(|| s.parse().ok())
            .flatten()
        };
        if let Some(g) = rest.strip_suffix("-shared") {
            return Some(DeviceKind::Shared { gpu: num(g)? });
        }
        if let Some((g, m)) = rest.split_once("-mig-") {
            return Some(DeviceKind::Mig {
                gpu: num(g)?,
                mig: num(m)?,
            });
        }
        Some(DeviceKind::Whole { gpu: num(rest)? })
    }

    pub fn gpu(self) -> u32 {
        match self {
            DeviceKind::Whole { gpu }
            | DeviceKind::Mig { gpu, .. }
            | DeviceKind::Shared { gpu } => gpu,
        }
    }
}

/// One allocation result of ours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocated {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub share_id: Option<String>,
    pub kind: DeviceKind,
    /// For a share of a GPU: exactly what was consumed (None: the whole
    /// GPU, or a MIG device).
    #[serde(default, with = "caps_wire")]
    pub caps: Option<DeviceCaps>,
}

/// The results of `claim` for `driver` in `pool`, checked against the uid
/// the kubelet asked for.
pub fn allocated(
    claim: &ResourceClaim,
    uid: &str,
    driver: &str,
    pool: &str,
) -> Result<Vec<Allocated>, ClaimError> {
    let name = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    );
    let have = claim.metadata.uid.as_deref().unwrap_or_default();
    if have != uid {
        return Err(ClaimError::UidMismatch(name, have.into(), uid.into()));
    }
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| ClaimError::NotAllocated(name.clone()))?
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref());
    let ours: Vec<&DeviceRequestAllocationResult> = results
        .into_iter()
        .flatten()
        .filter(|r| r.driver == driver)
        .collect();
    if ours.is_empty() {
        return Err(ClaimError::NoResults(name, driver.into()));
    }
    ours.into_iter()
        .map(|r| one(&name, r, pool, names_compute(claim, &r.request)))
        .collect()
}

/// Whether the claim's request `request` (`<request>/<subrequest>` for
/// one of a `firstAvailable` list) names a compute capacity. One that
/// does not got the policy's default ([`crate::publish::BEST_EFFORT_COMPUTE`],
/// or 100 from a plugin before it), which is no share: the slice is best
/// effort. A request not found in the spec is taken to name it (its
/// consumed compute counts, as before).
fn names_compute(claim: &ResourceClaim, request: &str) -> bool {
    let (name, sub) = match request.split_once('/') {
        Some((n, s)) => (n, Some(s)),
        None => (request, None),
    };
    let Some(req) = claim
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .and_then(|rs| rs.iter().find(|r| r.name == name))
    else {
        return true;
    };
    let capacity = match sub {
        None => req.exactly.as_ref().map(|e| e.capacity.as_ref()),
        Some(sub) => req
            .first_available
            .as_ref()
            .and_then(|subs| subs.iter().find(|s| s.name == sub))
            .map(|s| s.capacity.as_ref()),
    };
    match capacity {
        None => true,
        Some(c) => c
            .and_then(|c| c.requests.as_ref())
            .is_some_and(|r| r.contains_key(CAPACITY_COMPUTE)),
    }
}

fn one(
    claim: &str,
    r: &DeviceRequestAllocationResult,
    pool: &str,
    names_compute: bool,
) -> Result<Allocated, ClaimError> {
    let bad = |why: DeviceError| ClaimError::Device {
        claim: claim.into(),
        pool: r.pool.clone(),
        device: r.device.clone(),
        why,
    };
    if r.pool != pool {
        return Err(bad(DeviceError::OtherPool(pool.into())));
    }
    let kind = DeviceKind::parse(&r.device).ok_or_else(|| bad(DeviceError::NotOurs))?;
    let caps = match kind {
        // A GPU with consumedCapacity is a share of it (all of it is the
        // whole GPU: `driver`); without, consumable capacity is off and the
        // scheduler allocated it whole, to this claim alone.
        DeviceKind::Whole { .. } if r.consumed_capacity.is_some() => {
            Some(consumed(r, names_compute).map_err(bad)?)
        }
        DeviceKind::Shared { .. } => Some(consumed(r, names_compute).map_err(bad)?),
        _ => None,
    };
    Ok(Allocated {
        request: r.request.clone(),
        pool: r.pool.clone(),
        device: r.device.clone(),
        share_id: r.share_id.clone(),
        kind,
        caps,
    })
}

/// The memory and compute the scheduler recorded as consumed; compute 0
/// (no share: best effort) when the request named none.
fn consumed(
    r: &DeviceRequestAllocationResult,
    names_compute: bool,
) -> Result<DeviceCaps, DeviceError> {
    let cc = r
        .consumed_capacity
        .as_ref()
        .ok_or(DeviceError::NoConsumedCapacity)?;
    let get = |key: &'static str| -> Result<u64, DeviceError> {
        let q = cc.get(key).ok_or(DeviceError::NoCapacity(key))?;
        parse_integer(&q.0).map_err(|e| DeviceError::Capacity {
            key,
            source: Box::new(e),
        })
    };
    let memory = MemorySize::from_bytes(get(CAPACITY_MEMORY)?).ok_or(DeviceError::NoMemory)?;
    if !names_compute {
        return Ok(DeviceCaps {
            memory,
            compute: None,
        });
    }
    let compute = get(CAPACITY_COMPUTE)?;
    let share = ComputeShare::from_whole_percent(compute).ok_or(DeviceError::Compute(compute))?;
    Ok(DeviceCaps {
        memory,
        compute: Some(share),
    })
}

/// [`Allocated::caps`] in the checkpoint: memory in bytes, compute in
/// whole percent (0: none), as the published capacities count them. A
/// checkpoint holding caps the contract does not allow is refused.
mod caps_wire {
    use gpuslice_ledger::limits::{ComputeShare, DeviceCaps, MemorySize};
    use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Wire {
        memory_bytes: u64,
        compute_percent: u32,
    }

    pub fn serialize<S: Serializer>(caps: &Option<DeviceCaps>, s: S) -> Result<S::Ok, S::Error> {
        caps.map(|c| Wire {
            memory_bytes: c.memory_bytes(),
            compute_percent: c.compute_percent(),
        })
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DeviceCaps>, D::Error> {
        let Some(w) = Option::<Wire>::deserialize(d)? else {
            return Ok(None);
        };
        let memory = MemorySize::from_bytes(w.memory_bytes)
            .ok_or_else(|| D::Error::custom("caps: a memory cap of 0 bytes"))?;
        let compute = match w.compute_percent {
            0 => None,
            p => Some(ComputeShare::from_whole_percent(p.into()).ok_or_else(|| {
                D::Error::custom(format!("caps: a compute share of {p} %, not 0 to 100"))
            })?),
        };
        Ok(Some(DeviceCaps { memory, compute }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checkpoint keeps the caps' form of before they were the slice
    /// contract's type (a restarted plugin reads an older checkpoint), and
    /// reads back only caps the contract allows.
    #[test]
    fn caps_keep_their_checkpoint_form() {
        let a = Allocated {
            request: "r".into(),
            pool: "p".into(),
            device: "gpu-0".into(),
            share_id: None,
            kind: DeviceKind::Whole { gpu: 0 },
            caps: Some(DeviceCaps {
                memory: MemorySize(20 << 30),
                compute: ComputeShare::from_whole_percent(30),
            }),
        };
        let mut v = serde_json::to_value(&a).unwrap();
        assert_eq!(
            v["caps"],
            serde_json::json!({"memory_bytes": 20u64 << 30, "compute_percent": 30})
        );
        assert_eq!(serde_json::from_value::<Allocated>(v.clone()).unwrap(), a);
        v["caps"]["compute_percent"] = 0.into();
        let best_effort: Allocated = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(best_effort.caps.unwrap().compute, None);
        for (field, bad) in [("memory_bytes", 0), ("compute_percent", 101)] {
            let mut w = v.clone();
            w["caps"][field] = bad.into();
            let e = serde_json::from_value::<Allocated>(w).unwrap_err();
            assert!(e.to_string().starts_with("caps: "), "{field}: {e}");
        }
        v["caps"] = serde_json::Value::Null;
        assert_eq!(
            serde_json::from_value::<Allocated>(v.clone()).unwrap().caps,
            None
        );
        v.as_object_mut().unwrap().remove("caps");
        assert_eq!(serde_json::from_value::<Allocated>(v).unwrap().caps, None);
    }

    #[test]
    fn a_request_names_compute_in_exactly_or_in_its_subrequest() {
        let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [
                {"name": "both", "exactly": {"deviceClassName": "x",
                    "capacity": {"requests": {"memory": "1Gi", "compute": "10"}}}},
                {"name": "mem", "exactly": {"deviceClassName": "x",
                    "capacity": {"requests": {"memory": "1Gi"}}}},
                {"name": "none", "exactly": {"deviceClassName": "x"}},
                {"name": "alt", "firstAvailable": [
                    {"name": "big", "deviceClassName": "x",
                        "capacity": {"requests": {"compute": "50"}}},
                    {"name": "small", "deviceClassName": "x"},
                ]},
            ]}},
        }))
        .unwrap();
        assert!(names_compute(&claim, "both"));
        assert!(!names_compute(&claim, "mem"));
        assert!(!names_compute(&claim, "none"));
        assert!(names_compute(&claim, "alt/big"));
        assert!(!names_compute(&claim, "alt/small"));
        // Not in the spec: counted as named (its consumed compute counts).
        assert!(names_compute(&claim, "gone"));
        assert!(names_compute(&claim, "alt/gone"));
    }

    #[test]
    fn device_names() {
        assert_eq!(
            DeviceKind::parse("gpu-0"),
            Some(DeviceKind::Whole { gpu: 0 })
        );
        assert_eq!(
            DeviceKind::parse("gpu-12-shared"),
            Some(DeviceKind::Shared { gpu: 12 })
        );
        assert_eq!(
            DeviceKind::parse("gpu-1-mig-3"),
            Some(DeviceKind::Mig { gpu: 1, mig: 3 })
        );
        for bad in [
            "gpu-",
            "gpu-01",
            "gpu--1",
            "gpu-a",
            "cpu-0",
            "gpu-1-mig-",
            "gpu-1-shared-2",
        ] {
            assert_eq!(DeviceKind::parse(bad), None, "{bad}");
        }
    }
}
