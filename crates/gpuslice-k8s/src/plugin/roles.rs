//! Per-GPU roles: which one resource each GPU is offered in.
//!
//! A GPU has exactly one role, so no GPU is in two resources at once (a
//! `gpu` pod and a `gpu.shared` pod can never land on one GPU):
//! - `whole`: one device `GPU-<uuid>` in `<prefix>/gpu` (or the rule's `resource`);
//! - `shared`: R devices `GPU-<uuid>::<r>` in `<prefix>/gpu.shared` (or the rule's `resource`);
//! - `mig`: its MIG devices in `<prefix>/mig-<profile>`.
//!
//! A rule names GPUs by index, range, UUID (unique prefix) or PCI bus id,
//! or takes `others`: every GPU with MIG off that no rule names. A GPU in
//! MIG mode that no rule names serves its MIG devices. A GPU whose role
//! does not fit its mode (whole or shared while in MIG mode, mig while not)
//! is not offered, with a warning: MIG mode is changed by the admin, not
//! by the plugin.

use super::config::{Config, GpuRefs, RoleName, RoleRule, SHARED_RESOURCE, WHOLE_RESOURCE};
use gpuslice_core::{Gpu, Inventory, Selection};
use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Whole,
    Shared { replicas: u32 },
    Mig,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Whole => "whole",
            Role::Shared { .. } => "shared",
            Role::Mig => "mig",
        }
    }
}

/// The role of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    pub gpu: u32,
    pub role: Role,
    /// The resource name after the prefix (None for mig: one per profile).
    pub resource: Option<String>,
    /// Which rule gave it (`roles[1].gpus[0]`, `roles[2] (others)`, `MIG mode`).
    pub from: String,
    /// Why it is not offered, when its role does not fit its mode.
    pub unfit: Option<String>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RoleError {
    #[error("{at}: {source}")]
    Reference {
        at: String,
        source: gpuslice_core::SelectorError,
    },
    #[error("{at}: {item:?} is a MIG device; give its GPU the role mig")]
    Mig { at: String, item: String },
    #[error("{at}: GPU {gpu} ({uuid}) already has a role from {first}; a GPU gets one role")]
    Twice {
        at: String,
        gpu: u32,
        uuid: String,
        first: String,
    },
}

fn is_mig_mode(g: &Gpu) -> bool {
    g.mig_enabled == Some(true) || !g.migs.is_empty()
}

fn role_of(r: &RoleRule) -> Role {
    match r.role {
        RoleName::Whole => Role::Whole,
        RoleName::Shared => Role::Shared {
            replicas: r.replicas.unwrap_or(0),
        },
        RoleName::Mig => Role::Mig,
    }
}

fn resource_of(r: &RoleRule) -> Option<String> {
    match r.role {
        RoleName::Mig => None,
        RoleName::Whole => Some(r.resource.clone().unwrap_or(WHOLE_RESOURCE.into())),
        RoleName::Shared => Some(r.resource.clone().unwrap_or(SHARED_RESOURCE.into())),
    }
}

/// Why `g` cannot serve `role`, if it cannot.
fn unfit(g: &Gpu, role: Role) -> Option<String> {
    match (role, is_mig_mode(g)) {
        (Role::Mig, false) => Some(format!(
            "GPU {} has the role mig but MIG mode is off: not offered",
            g.index
        )),
        (Role::Whole | Role::Shared { .. }, true) => Some(format!(
            "GPU {} has the role {} but is in MIG mode: not offered (turn MIG off, or give it the role mig)",
            g.index,
            role.name()
        )),
        _ => None,
    }
}

/// Every GPU's role, in index order, from a validated config.
pub fn resolve(cfg: &Config, inv: &Inventory) -> Result<Vec<Assigned>, RoleError> {
    let rules = cfg.roles();
    let mut out: Vec<Option<Assigned>> = vec![None; inv.gpus.len()];
    for (i, rule) in rules.iter().enumerate() {
        let GpuRefs::List(items) = &rule.gpus else {
            continue;
        };
        for (j, item) in items.iter().enumerate() {
            let at = format!("roles[{i}].gpus[{j}]");
            let sel = Selection::parse(item, inv).map_err(|source| RoleError::Reference {
                at: at.clone(),
                source,
            })?;
            if !sel.migs.is_empty() {
                return Err(RoleError::Mig {
                    at,
                    item: item.clone(),
                });
            }
            for gpu in sel.gpus {
                let Some(k) = inv.gpus.iter().position(|g| g.index == gpu) else {
                    continue;
                };
                if let Some(first) = &out[k] {
                    return Err(RoleError::Twice {
                        at,
                        gpu,
                        uuid: inv.gpus[k].uuid.clone(),
                        first: first.from.clone(),
                    });
                }
                out[k] = Some(Assigned {
                    gpu,
                    role: role_of(rule),
                    resource: resource_of(rule),
                    from: at.clone(),
                    unfit: None,
                });
            }
        }
    }
    let others = rules
        .iter()
        .enumerate()
        .find(|(_, r)| r.gpus == GpuRefs::Others);
    let mut assigned = Vec::with_capacity(inv.gpus.len());
    for (g, a) in inv.gpus.iter().zip(out) {
        let mut a = match (a, others) {
            (Some(a), _) => a,
            (None, _) if is_mig_mode(g) => Assigned {
                gpu: g.index,
                role: Role::Mig,
                resource: None,
                from: "MIG mode".into(),
                unfit: None,
            },
            (None, Some((i, rule))) => Assigned {
                gpu: g.index,
                role: role_of(rule),
                resource: resource_of(rule),
                from: format!("roles[{i}] (others)"),
                unfit: None,
            },
            // Named rules only, and this GPU in none: not offered.
            (None, None) => Assigned {
                gpu: g.index,
                role: Role::Whole,
                resource: None,
                from: "no rule".into(),
                unfit: Some(format!(
                    "GPU {} is in no rule of roles and none takes `others`: not offered",
                    g.index
                )),
            },
        };
        if a.unfit.is_none() {
            a.unfit = unfit(g, a.role);
        }
        assigned.push(a);
    }
    Ok(assigned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_core::MigDevice;

    fn inv() -> Inventory {
        let gpu = |i: u32| Gpu {
            index: i,
            minor: i,
            uuid: format!("GPU-{i}{i}{i}{i}-aaaa"),
            pci_bus_id: format!("0000:{:02x}:00.0", 0x10 + i),
            memory_bytes: Some(80 << 30),
            ..Gpu::default()
        };
        let mut gpus: Vec<Gpu> = (0..4).map(gpu).collect();
        gpus[3].mig_enabled = Some(true);
        gpus[3].migs = vec![MigDevice::default()];
        Inventory {
            gpus,
            ..Default::default()
        }
    }

    fn roles(text: &str) -> Result<Vec<Assigned>, RoleError> {
        resolve(&Config::parse(text).unwrap(), &inv())
    }

    #[test]
    fn each_gpu_gets_the_role_of_its_rule_and_others_the_rest() {
        let r = roles(
            "roles: [{gpus: [GPU-1111, '0000:12:00.0'], role: shared, replicas: 4}, \
             {gpus: others, role: whole}]",
        )
        .unwrap();
        let got: Vec<(u32, Role, Option<&str>, bool)> = r
            .iter()
            .map(|a| (a.gpu, a.role, a.resource.as_deref(), a.unfit.is_none()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, Role::Whole, Some("gpu"), true),
                (1, Role::Shared { replicas: 4 }, Some("gpu.shared"), true),
                (2, Role::Shared { replicas: 4 }, Some("gpu.shared"), true),
                // MIG mode and named by no rule: its MIG devices.
                (3, Role::Mig, None, true),
            ]
        );
        assert_eq!(r[1].from, "roles[0].gpus[0]");
        assert_eq!(r[0].from, "roles[1] (others)");
    }

    #[test]
    fn one_gpu_named_twice_or_unknown_is_an_error_naming_the_field() {
        // Index 1 and its UUID are one GPU.
        let e = roles(
            "roles: [{gpus: [1], role: whole}, {gpus: [GPU-1111], role: shared, replicas: 2}]",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "roles[1].gpus[0]: GPU 1 (GPU-1111-aaaa) already has a role from roles[0].gpus[0]"
            ),
            "{e}"
        );
        let e = roles("roles: [{gpus: [0-2], role: whole}, {gpus: ['1'], role: mig}]")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("roles[1].gpus[0]: GPU 1"), "{e}");
        let e = roles("roles: [{gpus: [0, 7], role: whole}]")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("roles[0].gpus[1]: no GPU matches \"7\""),
            "{e}"
        );
        let e = roles("roles: [{gpus: [GPU-], role: whole}]")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("roles[0].gpus[0]:") && e.contains("ambiguous"),
            "{e}"
        );
    }

    #[test]
    fn a_role_that_does_not_fit_the_mig_mode_is_not_offered() {
        let r = roles("roles: [{gpus: [3], role: whole}, {gpus: [0], role: mig}]").unwrap();
        assert!(r[3].unfit.as_ref().unwrap().contains("MIG mode"));
        assert!(r[0].unfit.as_ref().unwrap().contains("MIG mode is off"));
        // Named rules only: the rest are not offered.
        assert!(r[1].unfit.as_ref().unwrap().contains("in no rule"));
    }
}
