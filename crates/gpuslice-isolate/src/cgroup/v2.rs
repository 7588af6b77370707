//! cgroup v2: the BPF device filter of [`crate::bpf`], attached to the
//! slice's cgroup.

use super::CgroupError;
use crate::bpf;
use gpuslice_core::DevicePolicy;
use std::path::Path;

/// True when the policy can deny some char device.
fn can_deny(policy: &DevicePolicy) -> bool {
    policy
        .rules
        .iter()
        .any(|r| r.deny_unlisted || !r.denied.is_empty())
}

/// Attaches `policy`'s device filter to the cgroup at `path` (nothing when
/// the policy denies nothing).
pub(super) fn apply(path: &Path, policy: &DevicePolicy) -> Result<(), CgroupError> {
    if !can_deny(policy) {
        return Ok(());
    }
    let prog = bpf::load(&bpf::compile(policy)).map_err(|source| CgroupError::BpfLoad {
        path: path.to_path_buf(),
        source,
    })?;
    // The attachment holds its own reference; our fd closes here.
    bpf::attach(path, &prog).map_err(|source| CgroupError::BpfAttach {
        path: path.to_path_buf(),
        source,
    })
}
