//! A spec as a document: versioned and validated, rendered, parsed, and
//! read (its kind, device names, host paths, what `generate` recorded).

use crate::options::Format;
use crate::{CdiError, Result};
use container_device_interface::specs::config::Spec as CdiSpec;
use serde_json::Value;
use std::path::PathBuf;

/// Environment variables (common edits) recording what the spec was
/// generated from, for `check` and `gpuslice doctor` ([`recorded`]). Not
/// annotations: those need CDI 0.6, and podman 4.x reads 0.5.
pub const ANN_DRIVER: &str = "GPUSLICE_CDI_DRIVER_VERSION";
pub(crate) const ANN_CAPS: &str = "NVIDIA_DRIVER_CAPABILITIES";
pub(crate) const ANN_SHARED: &str = "GPUSLICE_CDI_SHARED";
pub const ANN_STRIP: &str = "GPUSLICE_CDI_STRIP_HOST_ROOT";

/// A spec from its value: the oldest version that has every field used
/// (podman 4.x, CDI 0.5, reads older versions only), validated.
pub fn versioned_spec(value: Value) -> Result<CdiSpec> {
    let spec: CdiSpec = serde_json::from_value(value).map_err(CdiError::Build)?;
    let min = container_device_interface::version::minimum_required_version(&spec)
        .map_err(|e| CdiError::Invalid(e.into()))?;
    let mut v = serde_json::to_value(&spec).map_err(CdiError::Build)?;
    v["cdiVersion"] = Value::String(min.to_string());
    let spec = serde_json::from_value(v).map_err(CdiError::Build)?;
    validate(&spec)?;
    Ok(spec)
}

/// Validates with the CDI crate: the schema, names, edits.
pub fn validate(spec: &CdiSpec) -> Result<()> {
    container_device_interface::spec::new_spec(spec, &PathBuf::from("gpuslice.yaml"), 0)
        .map(|_| ())
        .map_err(|e| CdiError::Invalid(format!("{e:#}").into()))
}

pub fn render(spec: &CdiSpec, format: Format) -> Result<String> {
    Ok(match format {
        Format::Yaml => serde_yaml::to_string(spec).map_err(|e| CdiError::Render(e.into()))?,
        Format::Json => {
            serde_json::to_string_pretty(spec).map_err(|e| CdiError::Render(e.into()))? + "\n"
        }
    })
}

/// Parses a spec file (YAML or JSON: JSON is YAML).
pub fn parse(text: &str) -> Result<CdiSpec> {
    serde_yaml::from_str(text).map_err(CdiError::Parse)
}

fn value(spec: &CdiSpec) -> Value {
    serde_json::to_value(spec).unwrap_or(Value::Null)
}

/// A spec's `kind` (`vendor/class`).
pub fn kind(spec: &CdiSpec) -> String {
    value(spec)["kind"].as_str().unwrap_or_default().to_string()
}

/// The names of a spec's devices, in its order.
pub fn device_names(spec: &CdiSpec) -> Vec<String> {
    names_of(&value(spec))
}

pub(crate) fn names_of(v: &Value) -> Vec<String> {
    v["devices"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| d["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// What `generate` recorded under `key` ([`ANN_DRIVER`], [`ANN_STRIP`], …)
/// in the spec's common environment.
pub fn recorded(spec: &CdiSpec, key: &str) -> Option<String> {
    recorded_in(&serde_json::to_value(spec).ok()?, key)
}

pub(crate) fn recorded_in(v: &Value, key: &str) -> Option<String> {
    v["containerEdits"]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=').map(str::to_string))
}

/// Every host path a spec refers to (device nodes, mounts, hooks).
pub fn host_paths(spec: &CdiSpec) -> Vec<String> {
    let v = value(spec);
    let mut out = Vec::new();
    let mut edits: Vec<&Value> = vec![&v["containerEdits"]];
    if let Some(devs) = v["devices"].as_array() {
        edits.extend(devs.iter().map(|d| &d["containerEdits"]));
    }
    for e in edits {
        for n in e["deviceNodes"].as_array().into_iter().flatten() {
            if let Some(p) = n["hostPath"].as_str().or(n["path"].as_str()) {
                out.push(p.to_string());
            }
        }
        for m in e["mounts"].as_array().into_iter().flatten() {
            if m["type"].as_str() == Some("tmpfs") {
                continue;
            }
            if let Some(p) = m["hostPath"].as_str() {
                out.push(p.to_string());
            }
        }
        for h in e["hooks"].as_array().into_iter().flatten() {
            if let Some(p) = h["path"].as_str() {
                out.push(p.to_string());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}
