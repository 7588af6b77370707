//! The shared variants of a host's spec: `<gpu>-shared-<n>`, 1/n of the
//! GPU's memory and compute, held by the preloaded shim (the capped
//! slice's edits, [`crate::capped`]). What a variant is given is
//! [`shared_limits`]: a new kind of share changes it alone.

use crate::edits::device;
use crate::generate::Builder;
use container_device_interface::specs::config::Device;
use gpuslice_core::{Gpu, Selection};
use gpuslice_ledger::limits::{ComputeShare, DeviceLimits, MemorySize};

impl Builder<'_> {
    /// The shared variants of `gpu`: none (with a warning) without the
    /// shim or the GPU's memory size.
    pub(crate) fn shared_devices(&mut self, gpu: &Gpu) -> Vec<Device> {
        if self.opts.shared.is_empty() {
            return Vec::new();
        }
        let Some(shim) = self.opts.shim.clone() else {
            let why = "no shared variants: libgpuslice.so not found (put it next to gpuslice or set GPUSLICE_SHIM)";
            // Once, not once per GPU.
            if !self.warnings.iter().any(|w| w == why) {
                self.warnings.push(why.into());
            }
            return Vec::new();
        };
        let Some(memory) = gpu.memory_bytes else {
            self.warnings.push(format!(
                "no shared variants of GPU {}: its memory size is unknown ({})",
                gpu.index,
                self.inv
                    .nvml_error
                    .as_deref()
                    .unwrap_or("NVML reported no memory size")
            ));
            return Vec::new();
        };
        let counts = self.opts.shared.clone();
        counts
            .into_iter()
            .map(|n| {
                let name = format!("{}-shared-{n}", gpu.index);
                let mut e = self.selection_edits(&Selection::gpus([gpu.index]));
                let limits = shared_limits(gpu, memory, n);
                self.write_slice_limits(&mut e, &shim, &name, limits, Some(&gpu.uuid));
                device(&name, e)
            })
            .collect()
    }
}

/// What the variant `<gpu>-shared-<n>` is given: 1/n of the GPU's memory
/// (`memory` bytes) and of its compute.
fn shared_limits(gpu: &Gpu, memory: u64, n: u32) -> DeviceLimits {
    DeviceLimits {
        uuid: gpu.uuid.clone(),
        memory: Some(MemorySize((memory / n as u64).max(1))),
        compute: Some(ComputeShare::fraction(1, n as u64)),
    }
}
