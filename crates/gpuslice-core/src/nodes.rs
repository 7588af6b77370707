//! Which device nodes a selection may reach, as one policy that every
//! isolation layer applies: the private `/dev` omits the nodes it denies,
//! the cgroup v1 rules deny them, and the cgroup v2 BPF program is compiled
//! from it.

use crate::model::{Inventory, DRM_MAJOR, NVIDIACTL_MINOR, NVIDIA_MAJOR, NVIDIA_MODESET_MINOR};
use crate::select::Selection;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum NodeKind {
    Gpu,
    Control,
    Caps,
    Dri,
}

/// A character device node below `/dev`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceNode {
    /// Path relative to `/dev`, e.g. `nvidia0` or `nvidia-caps/nvidia-cap12`.
    pub path: String,
    pub major: u32,
    pub minor: u32,
    pub kind: NodeKind,
}

/// The rule for one char major.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MajorRule {
    pub major: u32,
    /// Minors reachable even when `deny_unlisted` is set.
    pub allowed: Vec<u32>,
    /// Minors known to exist and not selected; always denied.
    pub denied: Vec<u32>,
    /// Deny every minor of this major that is not in `allowed` (the NVIDIA
    /// majors are the driver's own, so a node we did not discover is denied
    /// too). Off for shared majors such as DRM, where other vendors' cards live.
    pub deny_unlisted: bool,
}

impl MajorRule {
    pub fn allows(&self, minor: u32) -> bool {
        if self.denied.contains(&minor) {
            return false;
        }
        !self.deny_unlisted || self.allowed.contains(&minor)
    }
}

/// Char-device access policy of a slice. Block devices are never restricted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DevicePolicy {
    pub rules: Vec<MajorRule>,
}

impl DevicePolicy {
    /// The policy for `sel` on the host described by `inv`.
    pub fn for_selection(inv: &Inventory, sel: &Selection) -> Self {
        let mut rules = Vec::new();

        let mut gpu_allowed = vec![NVIDIACTL_MINOR, NVIDIA_MODESET_MINOR];
        let mut gpu_denied = Vec::new();
        let mut dri_allowed = Vec::new();
        let mut dri_denied = Vec::new();
        let mut caps_allowed = Vec::new();
        let mut caps_denied = Vec::new();
        for gpu in &inv.gpus {
            let whole = sel.gpus.contains(&gpu.index);
            let reached = whole || sel.migs.iter().any(|(g, _)| *g == gpu.index);
            if reached {
                gpu_allowed.push(gpu.minor);
            } else {
                gpu_denied.push(gpu.minor);
            }
            if whole {
                dri_allowed.extend(&gpu.dri_minors);
            } else {
                dri_denied.extend(&gpu.dri_minors);
            }
            for mig in &gpu.migs {
                let chosen = whole || sel.migs.contains(&(gpu.index, mig.index));
                let minors = [mig.gi_access_minor, mig.ci_access_minor];
                let target = if chosen {
                    &mut caps_allowed
                } else {
                    &mut caps_denied
                };
                target.extend(minors.into_iter().flatten());
            }
        }
        // A GI access cap is shared by the CIs inside it: allowed wins.
        caps_denied.retain(|m| !caps_allowed.contains(m));

        rules.push(MajorRule {
            major: NVIDIA_MAJOR,
            allowed: sorted(gpu_allowed),
            denied: sorted(gpu_denied),
            deny_unlisted: true,
        });
        if let Some(caps) = inv.majors.nvidia_caps {
            rules.push(MajorRule {
                major: caps,
                allowed: sorted(caps_allowed),
                denied: sorted(caps_denied),
                deny_unlisted: true,
            });
        }
        if !dri_denied.is_empty() {
            rules.push(MajorRule {
                major: DRM_MAJOR,
                allowed: sorted(dri_allowed),
                denied: sorted(dri_denied),
                deny_unlisted: false,
            });
        }
        Self { rules }
    }

    /// Reference semantics of the policy for a char device; the BPF program
    /// and the cgroup v1 rules must agree with it.
    pub fn allows_char(&self, major: u32, minor: u32) -> bool {
        self.rules
            .iter()
            .filter(|r| r.major == major)
            .all(|r| r.allows(minor))
    }

    /// True when the policy denies nothing that exists (`--gpus all` on a host without MIG).
    pub fn denies_nothing_known(&self) -> bool {
        self.rules.iter().all(|r| r.denied.is_empty())
    }
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MigDevice;

    #[test]
    fn selected_gpu_and_control_nodes_allowed_others_denied() {
        let p = DevicePolicy::for_selection(&Inventory::fake(4), &Selection::gpus([1]));
        assert!(p.allows_char(195, 1));
        assert!(p.allows_char(195, 255));
        assert!(p.allows_char(195, 254));
        for m in [0, 2, 3, 7] {
            assert!(!p.allows_char(195, m), "minor {m}");
        }
        assert!(p.allows_char(226, 2) && p.allows_char(226, 130));
        assert!(!p.allows_char(226, 1) && !p.allows_char(226, 129));
        assert!(
            p.allows_char(226, 0),
            "a DRM card we do not own stays reachable"
        );
        assert!(p.allows_char(238, 0) && p.allows_char(1, 3));
        assert!(!p.allows_char(241, 1), "MIG config cap is not granted");
    }

    #[test]
    fn none_denies_every_gpu() {
        let p = DevicePolicy::for_selection(&Inventory::fake(2), &Selection::default());
        assert!(!p.allows_char(195, 0) && !p.allows_char(195, 1));
        assert!(p.allows_char(195, 255));
    }

    #[test]
    fn mig_selection_grants_parent_node_and_its_caps_only() {
        let mut i = Inventory::fake(2);
        i.gpus[0].migs = vec![
            MigDevice {
                index: 0,
                gpu_instance: 1,
                gi_access_minor: Some(12),
                ci_access_minor: Some(13),
                ..Default::default()
            },
            MigDevice {
                index: 1,
                gpu_instance: 2,
                gi_access_minor: Some(21),
                ci_access_minor: Some(22),
                ..Default::default()
            },
        ];
        let sel = Selection {
            gpus: vec![],
            migs: vec![(0, 1)],
        };
        let p = DevicePolicy::for_selection(&i, &sel);
        assert!(p.allows_char(195, 0) && !p.allows_char(195, 1));
        assert!(p.allows_char(241, 21) && p.allows_char(241, 22));
        assert!(!p.allows_char(241, 12) && !p.allows_char(241, 13));
        assert!(!p.allows_char(226, 1), "DRI of a MIG parent stays hidden");
    }
}
