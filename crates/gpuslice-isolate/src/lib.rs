//! gpuslice-isolate: the sandbox a slice's processes run in.
//!
//! Four layers, each known to be insufficient alone (see docs/architecture.md):
//! 1. [`devfs`]: a private `/dev` without the unselected NVIDIA nodes;
//! 2. [`driver_proc`]: `ModifyDeviceFiles: 0` and masked GPU dirs in procfs;
//! 3. [`cgroup`]/[`bpf`]: a device cgroup that denies the unselected nodes;
//! 4. the environment (`CUDA_VISIBLE_DEVICES`…), set by the caller.
//!
//! [`launcher`] puts a command inside them, and by default confines it so
//! that it cannot undo them or reach another slice: [`pidns`] (its own PID
//! namespace and `/proc`), a cgroup namespace and [`readonly`] `/sys`,
//! [`privileges`] (capabilities, no_new_privs), [`seccomp`], [`fds`]; and
//! no slice can change what the others load ([`loaded`]).

pub mod bpf;
pub mod cgroup;
pub mod devfs;
pub mod driver_proc;
pub mod exit;
pub mod fds;
pub mod hostpid;
pub mod identity;
pub mod launcher;
pub mod loaded;
pub mod marks;
mod mountinfo;
pub mod pidfd;
pub mod pidns;
pub mod privileges;
pub mod readonly;
mod relay;
pub mod seccomp;
pub mod seccomp_policy;
pub mod slicefs;
pub mod spawn;
pub mod userns;

use serde::Serialize;

/// Which layers `run --isolation` applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Isolation {
    /// All four layers.
    Full,
    /// Layers 3 + 4.
    Cgroup,
    /// Layers 1 + 4 (what bubblewrap does).
    Namespace,
    /// Layer 4 only.
    Env,
}

impl Isolation {
    pub fn private_dev(self) -> bool {
        matches!(self, Self::Full | Self::Namespace)
    }
    pub fn driver_proc(self) -> bool {
        self == Self::Full
    }
    pub fn cgroup(self) -> bool {
        matches!(self, Self::Full | Self::Cgroup)
    }
    /// These layers less the mount namespace's (private `/dev`, driver
    /// procfs): for a selection that leaves no node to hide.
    pub fn without_namespace(self) -> Self {
        match self {
            Self::Full | Self::Cgroup => Self::Cgroup,
            Self::Namespace | Self::Env => Self::Env,
        }
    }
}
