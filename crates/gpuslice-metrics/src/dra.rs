//! DRA claims prepared on this node (`gpuslice dra`): their slices' caps
//! and shares, and which claim each slice is, as labels.
//!
//! What is known here is what was granted, and whether the claim's pods
//! can escape it: read from the DRA plugin's checkpoint by the caller
//! ([`DraClaims`]; the file's format is gpuslice-dra's, whose
//! `checkpoint::prepared_slices` gives its slices as [`ClaimSlice`]s).

use crate::sample::{self as m, Labels, Sample};
use gpuslice_core::Inventory;
use std::sync::Arc;

/// One slice of a prepared claim (one allocation result).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSlice {
    /// The slice's id: its CDI device name, `<claim uid>-<n>`, also the
    /// `slice` of its limits record.
    pub slice: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The device of the ResourceSlice (`gpu-0-shared`, …).
    pub device: String,
    pub gpu: u32,
    /// The consumed capacity (shared devices); None for a whole GPU or MIG.
    pub caps: Option<gpuslice_ledger::limits::DeviceCaps>,
    /// Why its caps do not hold against its pods (empty: nothing seen).
    pub unenforceable: Vec<String>,
    /// Root's limits record of a capped slice (how its processes are
    /// known: `gpuslice_ledger::enforcer::Member`).
    pub record: Option<std::path::PathBuf>,
    /// Root's records of the DRA plugin's enforcer for the slice (its kills).
    pub enforcement: Option<std::path::PathBuf>,
}

/// Why the prepared claims could not be read (the reader is the caller's:
/// any error, its causes kept).
pub type ClaimsError = Box<dyn std::error::Error + Send + Sync>;

/// Reads the prepared claims at each collection.
#[derive(Clone)]
pub struct DraClaims(pub Arc<dyn Fn() -> Result<Vec<ClaimSlice>, ClaimsError> + Send + Sync>);

impl std::fmt::Debug for DraClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DraClaims(..)")
    }
}

/// Adds `gpuslice_dra_claim_info` (the claim's namespace, name and uid as
/// labels of its slice) and the slice's cap and share, labelled as the
/// ledgers' slices are; with `nvml`, what its processes hold by the
/// driver's accounting (known by the slice's limits record, as the DRA
/// plugin's enforcer knows them), whether the shim holds each, and root's
/// enforcer's kills.
pub fn collect(
    claims: &[ClaimSlice],
    inv: Option<&Inventory>,
    nvml: Option<&gpuslice_cuda_load::Nvml>,
    out: &mut Sample,
) {
    for c in claims {
        if let Some(dir) = &c.enforcement {
            crate::slices::push_kills(out, &c.slice, dir);
        }
        if let (Some(nvml), Some(record)) = (nvml, &c.record) {
            driver_series(c, record, nvml, out);
        }
        let gpu = inv.and_then(|inv| inv.gpus.iter().find(|g| g.index == c.gpu));
        let info: Labels = vec![
            ("slice", c.slice.clone()),
            ("claim_namespace", c.namespace.clone()),
            ("claim_name", c.name.clone()),
            ("claim_uid", c.uid.clone()),
            ("device", c.device.clone()),
            ("gpu", c.gpu.to_string()),
        ];
        out.push(m::DRA_CLAIM_INFO, &info, 1.0);
        let l: Labels = vec![
            ("slice", c.slice.clone()),
            ("gpu", c.gpu.to_string()),
            ("uuid", gpu.map_or_else(String::new, |g| g.uuid.clone())),
        ];
        if let Some(caps) = c.caps {
            out.push(m::SLICE_CAP, &l, caps.memory_bytes() as f64);
            out.push(
                m::SLICE_COMPUTE_SHARE,
                &l,
                f64::from(caps.compute_percent()) / 100.0,
            );
        }
        for why in &c.unenforceable {
            let u: Labels = vec![("slice", c.slice.clone()), ("reason", why.clone())];
            out.push(m::SLICE_UNENFORCEABLE, &u, 1.0);
        }
    }
}

/// A claim slice's driver series: its memory by the driver, per GPU, and
/// whether the shim holds each of its processes.
fn driver_series(
    c: &ClaimSlice,
    record: &std::path::Path,
    nvml: &gpuslice_cuda_load::Nvml,
    out: &mut Sample,
) {
    let Ok(limits) = gpuslice_ledger::limits::verify_and_read(record, false) else {
        return;
    };
    let (uuids, caps) = (limits.uuids(), limits.memory_caps());
    let member = gpuslice_ledger::enforcer::Member::new(&c.slice, Some(record));
    let Some(f) = crate::slices::driver_facts(nvml, &member, &uuids, &caps, None) else {
        return;
    };
    for uuid in &uuids {
        let l: Labels = vec![
            ("slice", c.slice.clone()),
            ("gpu", c.gpu.to_string()),
            ("uuid", uuid.clone()),
        ];
        out.push(m::SLICE_DRIVER_USED, &l, f.driver_used(uuid) as f64);
    }
    crate::slices::push_holders(out, &f, &mut Vec::new());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_slice_carries_its_namespace_and_name() {
        let mut s = Sample::default();
        collect(
            &[ClaimSlice {
                slice: "u-1-0".into(),
                namespace: "team-a".into(),
                name: "train".into(),
                uid: "u-1".into(),
                device: "gpu-0-shared".into(),
                gpu: 0,
                caps: Some(gpuslice_ledger::limits::DeviceCaps {
                    memory: gpuslice_ledger::limits::MemorySize(20 << 30),
                    compute: gpuslice_ledger::limits::ComputeShare::from_basis_points(3000),
                }),
                unenforceable: vec!["container a: privileged".into()],
                record: None,
                enforcement: None,
            }],
            None,
            None,
            &mut s,
        );
        let text = s.render();
        assert!(
            text.contains(
                r#"gpuslice_slice_unenforceable{slice="u-1-0",reason="container a: privileged"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"gpuslice_dra_claim_info{slice="u-1-0",claim_namespace="team-a",claim_name="train",claim_uid="u-1",device="gpu-0-shared",gpu="0"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"gpuslice_slice_memory_cap_bytes{slice="u-1-0",gpu="0",uuid=""} 21474836480"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"gpuslice_slice_compute_share_ratio{slice="u-1-0",gpu="0",uuid=""} 0.3"#
            ),
            "{text}"
        );
    }
}
