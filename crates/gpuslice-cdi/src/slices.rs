//! A spec of slices (a DRA claim's): exactly the devices given, each a
//! whole GPU or a MIG device (isolation only) or a capped share of a GPU,
//! and the environment naming them all.

use crate::edits::{self, device};
use crate::generate::{mig_selection, Builder};
use crate::spec::{ANN_DRIVER, ANN_SHARED, ANN_STRIP};
use crate::{CdiError, Generated, Options, Result};
use container_device_interface::specs::config::Device;
use gpuslice_core::{HostRoot, Inventory, Selection};
use gpuslice_ledger::limits::{DeviceCaps, ENV_CUDA_VISIBLE, ENV_NVIDIA_VISIBLE};

/// One device of a per-slice spec (a DRA claim's): a whole GPU or a MIG
/// device (`caps: None`: isolation only), or a capped share of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceDevice {
    /// The CDI device name (unique across the kind's spec files).
    pub name: String,
    /// The GPU's index in the inventory.
    pub gpu: u32,
    /// A MIG device of that GPU, by its index.
    pub mig: Option<u32>,
    pub caps: Option<DeviceCaps>,
}

/// A spec holding exactly `devices` (and the common edits: control
/// nodes, driver libraries): the device nodes of each one's GPU or MIG
/// device only, and for a capped one the shim with its limits.
pub fn generate_slices(
    root: &HostRoot,
    inv: &Inventory,
    opts: &Options,
    devices: &[SliceDevice],
) -> Result<Generated> {
    let mut b = Builder::new(root, inv, opts);
    let mut values = Vec::new();
    let mut uuids = Vec::new();
    for d in devices {
        let (value, uuid) = b.slice_device(d)?;
        values.push(value);
        uuids.push(uuid);
    }
    let mut common = b.common_edits();
    slice_env(&mut common, &uuids.join(","));
    let spec = edits::spec(&opts.kind(), values, Some(common))?;
    Ok(b.finish(spec))
}

impl Builder<'_> {
    /// One device of [`generate_slices`], and the UUID it makes visible.
    fn slice_device(&mut self, d: &SliceDevice) -> Result<(Device, String)> {
        let gpu = self
            .inv
            .gpus
            .iter()
            .find(|g| g.index == d.gpu)
            .ok_or_else(|| CdiError::NoSuchGpu {
                slice: d.name.clone(),
                gpu: d.gpu,
            })?;
        let (sel, uuid) =
            match d.mig {
                None => (Selection::gpus([gpu.index]), gpu.uuid.clone()),
                Some(m) => {
                    let mig = gpu.migs.iter().find(|x| x.index == m).ok_or_else(|| {
                        CdiError::NoSuchMig {
                            slice: d.name.clone(),
                            gpu: d.gpu,
                            mig: m,
                        }
                    })?;
                    let uuid = mig.uuid.clone().unwrap_or_else(|| gpu.uuid.clone());
                    (mig_selection(gpu.index, m), uuid)
                }
            };
        let mut e = self.selection_edits(&sel);
        if let Some(caps) = d.caps {
            let shim = self.opts.shim.clone().ok_or_else(|| CdiError::NoShim {
                slice: d.name.clone(),
            })?;
            self.write_slice_limits(&mut e, &shim, &d.name, caps.on(&uuid));
            // Visibility is the spec's, for all the devices of the claim
            // together ([`slice_env`]): a device's own would hide the others.
            let own = format!("{ENV_NVIDIA_VISIBLE}=");
            if let Some(env) = e.env.as_mut() {
                env.retain(|v| !v.starts_with(&own));
            }
        }
        Ok((device(&d.name, e), uuid))
    }
}

/// The environment of a spec of slices (a DRA claim's): what `run` gives
/// its command, `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES` naming
/// every device of the spec (CDI merges one device's `env` over another's,
/// so a per-device value would leave a container of two devices one), and
/// none of the variables that record how a static spec was generated
/// (`cdi check` reads those from `cdi generate`'s specs only).
fn slice_env(common: &mut edits::Edits, visible: &str) {
    let internal = [ANN_DRIVER, ANN_SHARED, ANN_STRIP];
    let mut env: Vec<String> = common
        .env
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|v| {
            !v.split_once('=')
                .is_some_and(|(k, _)| internal.contains(&k))
        })
        .collect();
    env.push(format!("{ENV_CUDA_VISIBLE}={visible}"));
    env.push(format!("{ENV_NVIDIA_VISIBLE}={visible}"));
    common.env = Some(env);
}
