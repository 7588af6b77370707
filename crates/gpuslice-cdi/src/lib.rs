//! CDI (Container Device Interface) specs for the host's GPUs and for
//! gpuslice's slices, and the CDI hooks they name.
//!
//! [`generate`] builds a spec (kind `<vendor>/<class>`, default
//! `gpuslice.dev/gpu`) with one device per GPU index and UUID, per MIG
//! device (`<gpu>:<mig>` and `MIG-…`), `all`, and shared variants
//! `<gpu>-shared-<n>` (1/n of the GPU's memory and compute, enforced by the
//! preloaded shim); [`generate_slices`] a spec of given slices (a DRA
//! claim's). Specs are built as the `container-device-interface` crate's
//! types and validated by it (JSON schema and its own rules) before they
//! are written. [`write_atomically`] writes one with its side files;
//! [`check`] tells whether a written spec still matches the host.
//!
//! Host paths in the spec are paths as this process sees them (below the
//! host root), unless [`Options::strip_host_root`] is set: then they are
//! relative to the host root, for a pod that mounts the host at `/host` and
//! writes a spec for the host's runtime.
//!
//! One mechanism a file: [`options`], [`spec`] (the document), `edits`
//! (the crate's types), `generate` (the host's spec), `shared` (its shared
//! variants), `capped` (how a capped slice's limits reach the shim),
//! `slices` (a claim's spec), [`memory_hook`] and [`params`] (the hooks,
//! their spec entries and what they do), `check`.

#![forbid(unsafe_code)]

mod capped;
mod check;
mod driver_files;
mod edits;
mod error;
mod generate;
pub mod memory_hook;
pub mod oci_state;
pub mod options;
pub mod params;
pub mod share_hook;
mod shared;
mod slices;
pub mod spec;

pub use capped::{capped_slice, limits_record_path, CONTAINER_SHIM, LIMITS_PREFIX, PRELOAD_FILE};
pub use check::{check, CheckResult};
pub use edits::{device, spec as build_spec, Edits};
pub use error::{CdiError, Result};
pub use generate::{generate, generate_for, CONTAINER_LIB_DIR};
pub use memory_hook::memory_limit_hooks;
pub use options::{
    parse_shared, Capability, Format, Options, DEFAULT_CLASS, DEFAULT_OUTPUT, DEFAULT_VENDOR,
    DYNAMIC_DIR,
};
pub use params::{params_hook, PARAMS_FILE};
pub use share_hook::share_hooks;
pub use slices::{generate_slices, SliceDevice};
pub use spec::{
    device_names, host_paths, kind, parse, recorded, render, validate, versioned_spec, ANN_DRIVER,
    ANN_STRIP,
};

use container_device_interface::specs::config::Spec as CdiSpec;
use std::path::{Path, PathBuf};

/// A generated spec and the side files it refers to.
#[derive(Debug, Clone)]
pub struct Generated {
    pub spec: CdiSpec,
    /// (path, content) of files the spec mounts, to be written with it.
    pub side_files: Vec<(PathBuf, String)>,
    /// Things left out, one line each (no driver library found, …).
    pub warnings: Vec<String>,
}

/// Writes the side files and then the spec (0644 each, atomically:
/// [`gpuslice_core::atomic_file`]), so that a runtime that reads the spec
/// finds every file it names.
pub fn write_atomically(g: &Generated, output: &Path, format: Format) -> Result<()> {
    use gpuslice_core::atomic_file::write_atomic;
    for (path, content) in &g.side_files {
        write_atomic(path, content.as_bytes(), 0o644)?;
    }
    write_atomic(output, render(&g.spec, format)?.as_bytes(), 0o644)?;
    Ok(())
}

#[cfg(test)]
mod tests;
