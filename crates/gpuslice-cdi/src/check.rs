//! `gpuslice cdi check`: whether a written spec is what [`crate::generate`]
//! would write now, with the options recorded in the spec itself.

use crate::generate::generate_for;
use crate::options::{parse_shared, Capability, Options};
use crate::spec::{
    host_paths, names_of, parse, recorded_in, ANN_CAPS, ANN_DRIVER, ANN_SHARED, ANN_STRIP,
};
use crate::{CdiError, Result};
use container_device_interface::specs::config::Spec as CdiSpec;
use gpuslice_core::{HostRoot, Inventory};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

/// Outcome of [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckResult {
    Current,
    /// One line saying why.
    Stale(String),
}

/// Whether the spec at `path` is what [`crate::generate`] would write now, with
/// the options recorded in the spec itself (`opts` gives the rest).
pub fn check(root: &HostRoot, path: &Path, opts: &Options) -> Result<CheckResult> {
    let text = fs::read_to_string(path).map_err(|source| CdiError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let old = parse(&text).map_err(|e| CdiError::input(path.display().to_string(), e))?;
    check_against(root, &opts.discover(root)?, &old, opts)
}

pub(crate) fn check_against(
    root: &HostRoot,
    inv: &Inventory,
    old: &CdiSpec,
    opts: &Options,
) -> Result<CheckResult> {
    let old_v = serde_json::to_value(old).map_err(CdiError::Build)?;
    let ann = |k: &str| recorded_in(&old_v, k);
    let mut opts = opts.clone();
    if let Some((vendor, class)) = old_v["kind"].as_str().and_then(|k| k.split_once('/')) {
        opts.vendor = vendor.into();
        opts.class = class.into();
    }
    if let Some(c) = ann(ANN_CAPS) {
        opts.capabilities = Capability::parse_list(&c)?;
    }
    if let Some(s) = ann(ANN_SHARED) {
        opts.shared = parse_shared(&s)?;
    }
    opts.strip_host_root = ann(ANN_STRIP).as_deref() == Some("true");
    let loaded = inv
        .driver_version
        .clone()
        .unwrap_or_else(|| "unknown".into());
    let recorded = ann(ANN_DRIVER).unwrap_or_else(|| "unknown".into());
    let fix = "run gpuslice cdi generate";
    if recorded != loaded {
        return Ok(CheckResult::Stale(format!(
            "stale: driver {recorded} in spec, {loaded} loaded; {fix}"
        )));
    }
    let new = generate_for(root, inv, &opts)?;
    let new_v = serde_json::to_value(&new.spec).map_err(CdiError::Build)?;
    let (on, nn) = (names_of(&old_v), names_of(&new_v));
    if on != nn {
        let missing: Vec<_> = nn.iter().filter(|n| !on.contains(n)).cloned().collect();
        let extra: Vec<_> = on.iter().filter(|n| !nn.contains(n)).cloned().collect();
        return Ok(CheckResult::Stale(format!(
            "stale: devices differ (missing from spec: [{}], gone from host: [{}]); {fix}",
            missing.join(" "),
            extra.join(" ")
        )));
    }
    if old_v != new_v {
        let what = first_difference(&old_v, &new_v, "");
        return Ok(CheckResult::Stale(format!(
            "stale: spec differs from the host at {what}; {fix}"
        )));
    }
    for (path, content) in &new.side_files {
        let host = root_relative_display(root, path, opts.strip_host_root);
        match fs::read_to_string(path) {
            Ok(c) if &c == content => {}
            Ok(_) => return Ok(CheckResult::Stale(format!("stale: {host} differs; {fix}"))),
            Err(e) => return Ok(CheckResult::Stale(format!("stale: {host}: {e}; {fix}"))),
        }
    }
    for p in host_paths(&new.spec) {
        let seen = if opts.strip_host_root {
            root.join(&p)
        } else {
            PathBuf::from(&p)
        };
        if fs::symlink_metadata(&seen).is_err() && !new.side_files.iter().any(|(f, _)| *f == seen) {
            return Ok(CheckResult::Stale(format!("stale: {p} is missing; {fix}")));
        }
    }
    Ok(CheckResult::Current)
}

fn root_relative_display(root: &HostRoot, p: &Path, strip: bool) -> String {
    if strip {
        if let Ok(rel) = p.strip_prefix(root.path()) {
            return Path::new("/").join(rel).display().to_string();
        }
    }
    p.display().to_string()
}

/// A JSON pointer-ish path to the first place two values differ.
fn first_difference(a: &Value, b: &Value, at: &str) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let (va, vb) = (x.get(k), y.get(k));
                if va != vb {
                    return match (va, vb) {
                        (Some(va), Some(vb)) => first_difference(va, vb, &format!("{at}/{k}")),
                        _ => format!("{at}/{k}"),
                    };
                }
            }
            at.to_string()
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                if va != vb {
                    let label = va["name"].as_str().map_or(i.to_string(), str::to_string);
                    return first_difference(va, vb, &format!("{at}/{label}"));
                }
            }
            at.to_string()
        }
        _ => format!("{at} ({a} vs {b})"),
    }
}
