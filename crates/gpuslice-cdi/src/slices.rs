//! A spec of slices (a DRA claim's): exactly the devices given, each a
//! whole GPU or a MIG device (isolation only) or a capped share of a GPU,
//! and the environment naming them all.

use crate::edits::{self, device};
use crate::generate::{mig_selection, Builder};
use crate::spec::{ANN_DRIVER, ANN_SHARED, ANN_STRIP};
use crate::{CdiError, Generated, Options, Result};
use container_device_interface::specs::config::Device;
use gpuslice_core::{HostRoot, Inventory, Selection};
use gpuslice_ledger::limits::{visibility_env, DeviceCaps};

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
    let resolved = devices
        .iter()
        .map(|d| b.resolve(d))
        .collect::<Result<Vec<_>>>()?;
    let visible: Vec<&str> = resolved.iter().map(|(_, uuid)| uuid.as_str()).collect();
    let visible = visible.join(",");
    let mut values = Vec::new();
    for (d, (sel, uuid)) in devices.iter().zip(&resolved) {
        values.push(b.slice_device(d, sel, uuid)?);
    }
    let mut common = b.common_edits();
    slice_env(&mut common, &visible);
    let spec = edits::spec(&opts.kind(), values, Some(common))?;
    Ok(b.finish(spec))
}

impl Builder<'_> {
    /// Where one device of [`generate_slices`] is: its selection, and the
    /// UUID it makes visible.
    fn resolve(&self, d: &SliceDevice) -> Result<(Selection, String)> {
        let gpu = self
            .inv
            .gpus
            .iter()
            .find(|g| g.index == d.gpu)
            .ok_or_else(|| CdiError::NoSuchGpu {
                slice: d.name.clone(),
                gpu: d.gpu,
            })?;
        let Some(m) = d.mig else {
            return Ok((Selection::gpus([gpu.index]), gpu.uuid.clone()));
        };
        let mig = gpu
            .migs
            .iter()
            .find(|x| x.index == m)
            .ok_or_else(|| CdiError::NoSuchMig {
                slice: d.name.clone(),
                gpu: d.gpu,
                mig: m,
            })?;
        let uuid = mig.uuid.clone().unwrap_or_else(|| gpu.uuid.clone());
        Ok((mig_selection(gpu.index, m), uuid))
    }

    /// One device of [`generate_slices`] at `sel` (`uuid`). A capped one
    /// carries its limits' variables but not the devices' ([`slice_env`]):
    /// CDI merges one device's `env` over another's, so its own UUID would
    /// hide the others from a container of several.
    fn slice_device(&mut self, d: &SliceDevice, sel: &Selection, uuid: &str) -> Result<Device> {
        let mut e = self.selection_edits(sel);
        if let Some(caps) = d.caps {
            let shim = self.opts.shim.clone().ok_or_else(|| CdiError::NoShim {
                slice: d.name.clone(),
            })?;
            self.write_slice_limits(&mut e, &shim, &d.name, caps.on(uuid), None);
        }
        Ok(device(&d.name, e))
    }
}

/// The environment of a spec of slices (a DRA claim's): what `run` gives
/// its command, [`visibility_env`] naming every device of the spec once
/// (each capped device adds its slice's [`limit_env`](gpuslice_ledger::limits::SliceLimits::limit_env)), and
/// none of the variables that record how a static spec was generated
/// (`cdi check` reads those from `cdi generate`'s specs only).
fn slice_env(common: &mut edits::Edits, visible: &str) {
    let internal = [ANN_DRIVER, ANN_SHARED, ANN_STRIP];
    let visibility = visibility_env(visible);
    let replaced = |k: &str| internal.contains(&k) || visibility.iter().any(|(n, _)| *n == k);
    let mut env: Vec<String> = common
        .env
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|v| !v.split_once('=').is_some_and(|(k, _)| replaced(k)))
        .collect();
    env.extend(visibility.map(|(k, v)| format!("{k}={v}")));
    common.env = Some(env);
}
