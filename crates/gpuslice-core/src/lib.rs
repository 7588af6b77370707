//! gpuslice-core: what GPUs a host has, how a user names them, and which
//! device nodes a selection of them needs.
//!
//! Nothing here changes the host: discovery reads `/proc`, `/sys`, `/dev`
//! (under a [`HostRoot`]) and NVML when it loads; selection and the node
//! policy are pure functions of the discovered [`Inventory`].

#![forbid(unsafe_code)]

pub mod atomic_file;
pub mod discover;
pub mod hostroot;
pub mod model;
pub mod nodes;
pub mod select;
pub mod simulation;
pub mod xid;

pub use hostroot::HostRoot;
pub use model::{Gpu, Inventory, MigDevice, PcieLink};
pub use nodes::{DeviceNode, DevicePolicy, MajorRule, NodeKind};
pub use select::{Selection, SelectorError};
