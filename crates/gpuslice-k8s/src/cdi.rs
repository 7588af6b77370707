//! CDI (Container Device Interface) specs for the host's GPUs.
//!
//! [`generate`] builds a spec (kind `<vendor>/<class>`, default
//! `gpuslice.dev/gpu`) with one device per GPU index and UUID, per MIG
//! device (`<gpu>:<mig>` and `MIG-…`), `all`, and shared variants
//! `<gpu>-shared-<n>` (1/n of the GPU's memory and compute, enforced by the
//! preloaded shim). It is built as the `container-device-interface` crate's
//! spec type and validated by it (JSON schema and its own rules) before it
//! is written. [`write_atomically`] writes it with its side files;
//! [`check`] tells whether a written spec still matches the host.
//!
//! Host paths in the spec are paths as this process sees them (below the
//! host root), unless [`Options::strip_host_root`] is set: then they are
//! relative to the host root, for a pod that mounts the host at `/host` and
//! writes a spec for the host's runtime.

use anyhow::{anyhow, bail, Context, Result};
use container_device_interface::specs::config::Spec as CdiSpec;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::model::{NVIDIACTL_MINOR, NVIDIA_MAJOR, NVIDIA_MODESET_MINOR};
use gpuslice_core::{DevicePolicy, HostRoot, Inventory, Selection};
use gpuslice_ledger::board::{self, Mode, DEFAULT_BOARD_DIR};
use gpuslice_ledger::limits::{
    ComputeShare, DeviceCaps, DeviceLimits, MemorySize, SliceLimits, ENV_CUDA_VISIBLE,
    ENV_DEVICE_ORDER, ENV_NVIDIA_VISIBLE, LIMITS_FILE, PCI_BUS_ID, SLICE_DIR,
};
use serde_json::{json, Value};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub const DEFAULT_VENDOR: &str = "gpuslice.dev";
pub const DEFAULT_CLASS: &str = "gpu";
/// Where `generate` writes when no `--output` is given.
pub const DEFAULT_OUTPUT: &str = "/etc/cdi/gpuslice.yaml";
/// The other directory runtimes read specs from.
pub const DYNAMIC_DIR: &str = "/var/run/cdi";
/// Inside the container: where driver libraries are mounted (and `LD_LIBRARY_PATH` points).
pub const CONTAINER_LIB_DIR: &str = "/usr/local/nvidia/lib64";
/// Inside the container: the shim of the shared variants.
pub const CONTAINER_SHIM: &str = "/usr/local/gpuslice/libgpuslice.so";
/// Side files holding the shared variants' limits records: `<prefix><name>`.
pub const LIMITS_PREFIX: &str = "gpuslice-limits-";
/// Side files written next to the spec.
pub const PARAMS_FILE: &str = "gpuslice-params";
pub const PRELOAD_FILE: &str = "gpuslice-ld.so.preload";

/// Environment variables (common edits) recording what the spec was
/// generated from, for `check` and `gpuslice doctor` ([`recorded`]). Not
/// annotations: those need CDI 0.6, and podman 4.x reads 0.5.
pub const ANN_DRIVER: &str = "GPUSLICE_CDI_DRIVER_VERSION";
const ANN_CAPS: &str = "NVIDIA_DRIVER_CAPABILITIES";
const ANN_SHARED: &str = "GPUSLICE_CDI_SHARED";
pub const ANN_STRIP: &str = "GPUSLICE_CDI_STRIP_HOST_ROOT";

/// Driver capabilities, as in `NVIDIA_DRIVER_CAPABILITIES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Capability {
    Compute,
    Utility,
    Video,
    Graphics,
}

impl Capability {
    pub fn name(self) -> &'static str {
        match self {
            Capability::Compute => "compute",
            Capability::Utility => "utility",
            Capability::Video => "video",
            Capability::Graphics => "graphics",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.trim() {
            "compute" => Capability::Compute,
            "utility" => Capability::Utility,
            "video" => Capability::Video,
            "graphics" => Capability::Graphics,
            other => bail!("unknown capability {other:?} (compute, utility, video, graphics)"),
        })
    }

    /// A comma list; `all` is every capability.
    pub fn parse_list(s: &str) -> Result<Vec<Self>> {
        let mut v: Vec<Self> = if s.trim() == "all" {
            vec![Self::Compute, Self::Utility, Self::Video, Self::Graphics]
        } else {
            s.split(',')
                .filter(|p| !p.trim().is_empty())
                .map(Self::parse)
                .collect::<Result<_>>()?
        };
        v.sort();
        v.dedup();
        Ok(v)
    }
}

fn caps_string(caps: &[Capability]) -> String {
    caps.iter().map(|c| c.name()).collect::<Vec<_>>().join(",")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// From a file name: `.json` is JSON, anything else YAML.
    pub fn for_path(p: &Path) -> Self {
        match p.extension().and_then(|e| e.to_str()) {
            Some("json") => Format::Json,
            _ => Format::Yaml,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub vendor: String,
    pub class: String,
    pub capabilities: Vec<Capability>,
    /// Shared variants to offer per GPU: `n` gives `<gpu>-shared-<n>`.
    pub shared: Vec<u32>,
    /// Host path of `libgpuslice.so`; without it no shared variants are made.
    pub shim: Option<PathBuf>,
    /// Host path of the `gpuslice` binary, run as the createContainer hook
    /// that lays the params overlay; without it the overlay is left out.
    pub hook: Option<PathBuf>,
    /// Directory of the spec: side files (params, ld.so.preload) live there.
    pub spec_dir: PathBuf,
    /// Write host paths relative to the host root (see the module docs).
    pub strip_host_root: bool,
    /// Use NVML (memory sizes for shared variants, MIG UUIDs).
    pub use_nvml: bool,
    /// Host directory of the GPUs' boards (as seen here), made ready with
    /// `board::prepare_dir`: bound into capped slices so that they take
    /// turns on the GPU with the other slices (docs/compute-share.md).
    /// None: not bound.
    pub boards: Option<PathBuf>,
    /// Capped slices' ledger directories: `<dir>/<slice>` on the host,
    /// bound at the slice's directory, one ledger for every container of
    /// the slice (a DRA claim's: gpuslice-dra's `claimfs`). None: a tmpfs
    /// in each container, a ledger of its own.
    pub slice_dirs: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            vendor: DEFAULT_VENDOR.into(),
            class: DEFAULT_CLASS.into(),
            capabilities: vec![Capability::Compute, Capability::Utility],
            shared: vec![2, 4],
            shim: None,
            hook: None,
            spec_dir: PathBuf::from("/etc/cdi"),
            strip_host_root: false,
            use_nvml: true,
            boards: None,
            slice_dirs: None,
        }
    }
}

/// A generated spec and the side files it refers to.
#[derive(Debug, Clone)]
pub struct Generated {
    pub spec: CdiSpec,
    /// (path, content) of files the spec mounts, to be written with it.
    pub side_files: Vec<(PathBuf, String)>,
    /// Things left out, one line each (no driver library found, …).
    pub warnings: Vec<String>,
}

/// Discovers the GPUs below `root` and builds the spec.
pub fn generate(root: &HostRoot, opts: &Options) -> Result<Generated> {
    let inv = discover(
        root,
        &DiscoverOptions {
            use_nvml: opts.use_nvml,
            ..DiscoverOptions::default()
        },
    )?;
    generate_for(root, &inv, opts)
}

/// [`generate`] for an inventory already discovered below `root`.
pub fn generate_for(root: &HostRoot, inv: &Inventory, opts: &Options) -> Result<Generated> {
    let mut g = Builder::new(root, inv, opts);
    let value = g.spec_value()?;
    g.finish(value)
}

/// Where the limits record of the CDI slice `name` is written: beside the
/// spec, root-owned, bound read-only into the slice at the fixed place.
pub fn limits_record_path(spec_dir: &Path, name: &str) -> PathBuf {
    spec_dir.join(format!("{LIMITS_PREFIX}{name}"))
}

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
    let mut g = Builder::new(root, inv, opts);
    let mut values = Vec::new();
    let mut uuids = Vec::new();
    for d in devices {
        let (value, uuid) = g.slice_device(d)?;
        values.push(value);
        uuids.push(uuid);
    }
    let mut common = g.common_edits()?;
    slice_env(&mut common, &uuids.join(","));
    let value = json!({
        "cdiVersion": container_device_interface::specs::config::CURRENT_VERSION,
        "kind": format!("{}/{}", opts.vendor, opts.class),
        "devices": values,
        "containerEdits": common,
    });
    g.finish(value)
}

impl<'a> Builder<'a> {
    fn new(root: &'a HostRoot, inv: &'a Inventory, opts: &'a Options) -> Self {
        Builder {
            root,
            inv,
            opts,
            warnings: Vec::new(),
            side_files: Vec::new(),
        }
    }

    /// Builds the spec from its value: the oldest version that has every
    /// field used, validated.
    fn finish(self, value: Value) -> Result<Generated> {
        Ok(Generated {
            spec: versioned_spec(value)?,
            side_files: self.side_files,
            warnings: self.warnings,
        })
    }

    /// One device of [`generate_slices`], and the UUID it makes visible.
    fn slice_device(&mut self, d: &SliceDevice) -> Result<(Value, String)> {
        let gpu = self
            .inv
            .gpus
            .iter()
            .find(|g| g.index == d.gpu)
            .ok_or_else(|| anyhow!("slice {}: no GPU {} on this host", d.name, d.gpu))?;
        let (sel, uuid) = match d.mig {
            None => (Selection::gpus([gpu.index]), gpu.uuid.clone()),
            Some(m) => {
                let mig = gpu.migs.iter().find(|x| x.index == m).ok_or_else(|| {
                    anyhow!("slice {}: GPU {} has no MIG device {m}", d.name, d.gpu)
                })?;
                let sel = Selection {
                    gpus: vec![],
                    migs: vec![(gpu.index, m)],
                };
                (sel, mig.uuid.clone().unwrap_or_else(|| gpu.uuid.clone()))
            }
        };
        let mut e = self.selection_edits(&sel);
        if let Some(caps) = d.caps {
            let shim = self.opts.shim.clone().ok_or_else(|| {
                anyhow!(
                    "slice {}: capped, but libgpuslice.so was not found (put it next to gpuslice or set GPUSLICE_SHIM)",
                    d.name
                )
            })?;
            self.write_slice_limits(&mut e, &shim, &d.name, caps.on(&uuid));
            // Visibility is the spec's, for all the devices of the claim
            // together ([`slice_env`]): a device's own would hide the others.
            if let Some(env) = e["env"].as_array_mut() {
                env.retain(|v| {
                    !v.as_str()
                        .is_some_and(|s| s.starts_with(&format!("{ENV_NVIDIA_VISIBLE}=")))
                });
            }
        }
        Ok((device(&d.name, e), uuid))
    }
}

/// The limits of the capped CDI slice `name` (a shared variant, a DRA
/// claim's share) on one device: what its record says and its usage
/// ledger must match.
pub fn capped_slice(name: &str, device: DeviceLimits) -> SliceLimits {
    SliceLimits {
        slice_id: name.to_string(),
        mode: Mode::Cap,
        devices: vec![device],
    }
}

/// The environment of a spec of slices (a DRA claim's): what `run` gives
/// its command, `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES` naming
/// every device of the spec (CDI merges one device's `env` over another's,
/// so a per-device value would leave a container of two devices one), and
/// none of the variables that record how a static spec was generated
/// (`cdi check` reads those from `cdi generate`'s specs only).
fn slice_env(common: &mut Value, visible: &str) {
    let internal = [ANN_DRIVER, ANN_SHARED, ANN_STRIP];
    let mut env: Vec<Value> = common["env"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|v| {
            let name = v.as_str().and_then(|s| s.split_once('=')).map(|(k, _)| k);
            !name.is_some_and(|k| internal.contains(&k))
        })
        .collect();
    env.push(json!(format!("{ENV_CUDA_VISIBLE}={visible}")));
    env.push(json!(format!("{ENV_NVIDIA_VISIBLE}={visible}")));
    common["env"] = Value::Array(env);
}

/// A spec from its value: the oldest version that has every field used
/// (podman 4.x, CDI 0.5, reads older versions only), validated.
pub fn versioned_spec(value: Value) -> Result<CdiSpec> {
    let spec: CdiSpec = serde_json::from_value(value).context("building the CDI spec")?;
    let min = container_device_interface::version::minimum_required_version(&spec)?;
    let mut v = serde_json::to_value(&spec)?;
    v["cdiVersion"] = Value::String(min.to_string());
    let spec = serde_json::from_value(v)?;
    validate(&spec)?;
    Ok(spec)
}

/// The hooks that give a capped slice's containers the driver's memory
/// partitions ([`crate::memory_hook`]): set by a `createRuntime` hook
/// from root's limits record `record` (a host path), cleared by a
/// `poststop` hook; `gpuslice` is the host path of the binary the runtime
/// runs, `host_root` a simulated host's root (None: `/`). The ONE place
/// that says how a container's partition is set, for `cdi generate`'s
/// shared variants, DRA claims and the device plugin's shared replicas.
pub fn memory_limit_hooks(gpuslice: &str, record: &str, host_root: Option<&Path>) -> Value {
    let hook = |name: &str, action: &[&str]| {
        let mut args: Vec<String> = ["gpuslice", "cdi", "hook", "memory-limits"]
            .iter()
            .chain(action)
            .map(|a| a.to_string())
            .collect();
        if let Some(root) = host_root {
            args.extend(["--host-root".to_string(), root.display().to_string()]);
        }
        json!({ "hookName": name, "path": gpuslice, "args": args, "timeout": 10 })
    };
    json!([
        hook("createRuntime", &["set", "--limits", record]),
        hook("poststop", &["clear"]),
    ])
}

/// Validates with the CDI crate: the schema, names, edits.
pub fn validate(spec: &CdiSpec) -> Result<()> {
    container_device_interface::spec::new_spec(spec, &PathBuf::from("gpuslice.yaml"), 0)
        .map(|_| ())
        .map_err(|e| anyhow!("generated CDI spec does not validate: {e:#}"))
}

pub fn render(spec: &CdiSpec, format: Format) -> Result<String> {
    Ok(match format {
        Format::Yaml => serde_yaml::to_string(spec)?,
        Format::Json => serde_json::to_string_pretty(spec)? + "\n",
    })
}

/// Parses a spec file (YAML or JSON: JSON is YAML).
pub fn parse(text: &str) -> Result<CdiSpec> {
    serde_yaml::from_str(text).context("not a CDI spec")
}

/// A spec's `kind` (`vendor/class`).
pub fn kind(spec: &CdiSpec) -> String {
    serde_json::to_value(spec).unwrap_or(Value::Null)["kind"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The names of a spec's devices, in its order.
pub fn device_names(spec: &CdiSpec) -> Vec<String> {
    names_of(&serde_json::to_value(spec).unwrap_or(Value::Null))
}

fn names_of(v: &Value) -> Vec<String> {
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

fn recorded_in(v: &Value, key: &str) -> Option<String> {
    v["containerEdits"]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=').map(str::to_string))
}

/// Writes the side files and then the spec, each through a temporary file
/// in the same directory renamed into place.
pub fn write_atomically(g: &Generated, output: &Path, format: Format) -> Result<()> {
    for (path, content) in &g.side_files {
        atomic_write(path, content.as_bytes(), 0o644)?;
    }
    atomic_write(output, render(&g.spec, format)?.as_bytes(), 0o644)
}

pub fn atomic_write(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.as_deref().unwrap_or("spec")))
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    tmp.write_all(data)?;
    tmp.as_file().sync_all()?;
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(mode))?;
    tmp.persist(path)
        .map_err(|e| anyhow!("cannot rename into {}: {}", path.display(), e.error))?;
    Ok(())
}

/// Outcome of [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckResult {
    Current,
    /// One line saying why.
    Stale(String),
}

/// Whether the spec at `path` is what [`generate`] would write now, with
/// the options recorded in the spec itself (`opts` gives the rest).
pub fn check(root: &HostRoot, path: &Path, opts: &Options) -> Result<CheckResult> {
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let old = parse(&text).with_context(|| path.display().to_string())?;
    let inv = discover(
        root,
        &DiscoverOptions {
            use_nvml: opts.use_nvml,
            ..DiscoverOptions::default()
        },
    )?;
    check_against(root, &inv, &old, opts)
}

fn check_against(
    root: &HostRoot,
    inv: &Inventory,
    old: &CdiSpec,
    opts: &Options,
) -> Result<CheckResult> {
    let old_v = serde_json::to_value(old)?;
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
    let new_v = serde_json::to_value(&new.spec)?;
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

pub fn parse_shared(s: &str) -> Result<Vec<u32>> {
    let mut v: Vec<u32> = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (2..=100).contains(n))
                .ok_or_else(|| anyhow!("shared count {p:?}: a number from 2 to 100"))
        })
        .collect::<Result<_>>()?;
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// Every host path a spec refers to (device nodes, mounts, hooks).
pub fn host_paths(spec: &CdiSpec) -> Vec<String> {
    let v = serde_json::to_value(spec).unwrap_or(Value::Null);
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

// ------------------------------------------------------------------ builder

struct Builder<'a> {
    root: &'a HostRoot,
    inv: &'a Inventory,
    opts: &'a Options,
    warnings: Vec<String>,
    side_files: Vec<(PathBuf, String)>,
}

/// Libraries by capability: (file name stem before `.so`, container names
/// besides the versioned file name: the soname and, for the two that
/// programs dlopen unversioned, the `.so` name).
const LIBS: &[(Capability, &str, &[&str])] = &[
    (
        Capability::Compute,
        "libcuda",
        &["libcuda.so.1", "libcuda.so"],
    ),
    (
        Capability::Compute,
        "libcudadebugger",
        &["libcudadebugger.so.1"],
    ),
    (
        Capability::Compute,
        "libnvidia-ptxjitcompiler",
        &["libnvidia-ptxjitcompiler.so.1"],
    ),
    (
        Capability::Compute,
        "libnvidia-nvvm",
        &["libnvidia-nvvm.so.4", "libnvidia-nvvm.so"],
    ),
    (Capability::Compute, "libnvidia-gpucomp", &[]),
    (
        Capability::Compute,
        "libnvidia-opencl",
        &["libnvidia-opencl.so.1"],
    ),
    (
        Capability::Compute,
        "libnvidia-allocator",
        &["libnvidia-allocator.so.1"],
    ),
    (
        Capability::Utility,
        "libnvidia-ml",
        &["libnvidia-ml.so.1", "libnvidia-ml.so"],
    ),
    (
        Capability::Utility,
        "libnvidia-cfg",
        &["libnvidia-cfg.so.1"],
    ),
    (Capability::Video, "libnvcuvid", &["libnvcuvid.so.1"]),
    (
        Capability::Video,
        "libnvidia-encode",
        &["libnvidia-encode.so.1"],
    ),
    (
        Capability::Video,
        "libnvidia-opticalflow",
        &["libnvidia-opticalflow.so.1"],
    ),
    (
        Capability::Graphics,
        "libEGL_nvidia",
        &["libEGL_nvidia.so.0"],
    ),
    (
        Capability::Graphics,
        "libGLX_nvidia",
        &["libGLX_nvidia.so.0"],
    ),
    (
        Capability::Graphics,
        "libGLESv2_nvidia",
        &["libGLESv2_nvidia.so.2"],
    ),
    (
        Capability::Graphics,
        "libGLESv1_CM_nvidia",
        &["libGLESv1_CM_nvidia.so.1"],
    ),
    (Capability::Graphics, "libnvidia-eglcore", &[]),
    (Capability::Graphics, "libnvidia-glcore", &[]),
    (Capability::Graphics, "libnvidia-tls", &[]),
    (Capability::Graphics, "libnvidia-glsi", &[]),
    (Capability::Graphics, "libnvidia-glvkspirv", &[]),
    (Capability::Graphics, "libnvidia-rtcore", &[]),
    (Capability::Graphics, "libnvoptix", &["libnvoptix.so.1"]),
];

const BINS: &[(Capability, &str)] = &[
    (Capability::Utility, "nvidia-smi"),
    (Capability::Utility, "nvidia-debugdump"),
    (Capability::Utility, "nvidia-persistenced"),
    (Capability::Compute, "nvidia-cuda-mps-control"),
    (Capability::Compute, "nvidia-cuda-mps-server"),
];

const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/local/nvidia/lib64",
];
const BIN_DIRS: &[&str] = &["/usr/bin", "/usr/sbin", "/bin", "/usr/local/bin"];

impl Builder<'_> {
    /// A host path as written into the spec.
    fn host(&self, seen: &Path) -> String {
        if self.opts.strip_host_root {
            if let Ok(rel) = seen.strip_prefix(self.root.path()) {
                return Path::new("/").join(rel).display().to_string();
            }
        }
        seen.display().to_string()
    }

    fn spec_value(&mut self) -> Result<Value> {
        let inv = self.inv;
        let mut devices = Vec::new();
        for gpu in &inv.gpus {
            let edits = self.selection_edits(&Selection::gpus([gpu.index]));
            devices.push(device(&gpu.index.to_string(), edits.clone()));
            devices.push(device(&gpu.uuid, edits.clone()));
            for mig in &gpu.migs {
                let sel = Selection {
                    gpus: vec![],
                    migs: vec![(gpu.index, mig.index)],
                };
                let e = self.selection_edits(&sel);
                devices.push(device(&format!("{}:{}", gpu.index, mig.index), e.clone()));
                if let Some(u) = &mig.uuid {
                    devices.push(device(u, e));
                }
            }
        }
        for gpu in &inv.gpus {
            self.shared_devices(gpu, &mut devices);
        }
        if !inv.gpus.is_empty() {
            let all = Selection::gpus(inv.gpus.iter().map(|g| g.index));
            devices.push(device("all", self.selection_edits(&all)));
        }
        if devices.is_empty() {
            bail!(
                "no GPUs below {}: nothing to put in a CDI spec",
                self.root.path().display()
            );
        }
        let common = self.common_edits()?;
        Ok(json!({
            "cdiVersion": container_device_interface::specs::config::CURRENT_VERSION,
            "kind": format!("{}/{}", self.opts.vendor, self.opts.class),
            "devices": devices,
            "containerEdits": common,
        }))
    }

    /// Device nodes of a selection, without the control nodes (common).
    fn selection_edits(&self, sel: &Selection) -> Value {
        let policy = DevicePolicy::for_selection(self.inv, sel);
        let graphics = self.opts.capabilities.contains(&Capability::Graphics);
        let mut nodes = Vec::new();
        for rule in &policy.rules {
            for &minor in &rule.allowed {
                let rel = if rule.major == NVIDIA_MAJOR {
                    if minor == NVIDIACTL_MINOR || minor == NVIDIA_MODESET_MINOR {
                        continue;
                    }
                    format!("nvidia{minor}")
                } else if Some(rule.major) == self.inv.majors.nvidia_caps {
                    format!("nvidia-caps/nvidia-cap{minor}")
                } else if graphics {
                    match self.dri_name(minor) {
                        Some(n) => format!("dri/{n}"),
                        None => continue,
                    }
                } else {
                    continue;
                };
                nodes.push(self.node(&rel, rule.major, minor));
            }
        }
        json!({ "deviceNodes": nodes })
    }

    fn node(&self, rel: &str, major: u32, minor: u32) -> Value {
        let seen = self.root.dev().join(rel);
        json!({
            "path": format!("/dev/{rel}"),
            "hostPath": self.host(&seen),
            "type": "c",
            "major": major,
            "minor": minor,
            "permissions": "rw",
        })
    }

    fn dri_name(&self, minor: u32) -> Option<String> {
        let dir = self.root.dev().join("dri");
        fs::read_dir(dir).ok()?.flatten().find_map(|e| {
            let md = e.metadata().ok()?;
            let ok = md.file_type().is_char_device()
                && libc_major(md.rdev()) == gpuslice_core::model::DRM_MAJOR
                && libc_minor(md.rdev()) == minor;
            ok.then(|| e.file_name().to_string_lossy().into_owned())
        })
    }

    fn shared_devices(&mut self, gpu: &gpuslice_core::Gpu, devices: &mut Vec<Value>) {
        if self.opts.shared.is_empty() {
            return;
        }
        let Some(shim) = self.opts.shim.clone() else {
            self.warnings.push(
                "no shared variants: libgpuslice.so not found (put it next to gpuslice or set GPUSLICE_SHIM)".into(),
            );
            self.opts_shared_done();
            return;
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
            return;
        };
        for &n in &self.opts.shared {
            let name = format!("{}-shared-{n}", gpu.index);
            let limits = DeviceLimits {
                uuid: gpu.uuid.clone(),
                memory: Some(MemorySize((memory / n as u64).max(1))),
                compute: Some(ComputeShare::fraction(1, n as u64)),
            };
            let mut e = self.selection_edits(&Selection::gpus([gpu.index]));
            self.write_slice_limits(&mut e, &shim, &name, limits);
            devices.push(device(&name, e));
        }
    }

    /// Writes a capped slice's limits into its device's edits: root's
    /// limits record of the slice (a side file beside the spec, root-owned
    /// 0644, [`limits_record_path`]) bound read-only at the fixed place,
    /// the shim preloaded through a bound `ld.so.preload`, the variables
    /// of [`SliceLimits::env`], and a tmpfs at [`SLICE_DIR`] where each
    /// container's first process makes its usage ledger. The ONE place
    /// that says how a CDI slice's limits reach the shim, for the shared
    /// variants and for DRA claims alike.
    fn write_slice_limits(
        &mut self,
        edits: &mut Value,
        shim: &Path,
        name: &str,
        device: DeviceLimits,
    ) {
        let preload = self.opts.spec_dir.join(PRELOAD_FILE);
        if !self.side_files.iter().any(|(p, _)| *p == preload) {
            self.side_files
                .push((preload.clone(), format!("{CONTAINER_SHIM}\n")));
        }
        let uuid = device.uuid.clone();
        let limits = capped_slice(name, device);
        let record = limits_record_path(&self.opts.spec_dir, name);
        self.side_files.push((record.clone(), limits.render()));
        let mut env: Vec<String> = limits
            .env()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.push(format!("{ENV_NVIDIA_VISIBLE}={uuid}"));
        edits["env"] = json!(env);
        edits["mounts"] = json!([
            {
                "hostPath": self.host(shim),
                "containerPath": CONTAINER_SHIM,
                "options": ["ro", "nosuid", "nodev", "bind"],
            },
            {
                "hostPath": self.host(&preload),
                "containerPath": "/etc/ld.so.preload",
                "options": ["ro", "nosuid", "nodev", "bind"],
            },
            self.slice_dir_mount(name),
            {
                "hostPath": self.host(&record),
                "containerPath": format!("{SLICE_DIR}/{LIMITS_FILE}"),
                "options": ["ro", "nosuid", "nodev", "noexec", "bind"],
            },
        ]);
        if let Some(hooks) = self.memory_limit_hooks(&record) {
            edits["hooks"] = hooks;
        }
        // The GPU's board, made here as root (replacing one root did not
        // make: a local user's squatted file), bound writable over the
        // boards' directory bound read-only: the container writes its
        // GPU's board (what a liar can do there is bounded:
        // docs/security.md) and can neither add nor remove an entry of the
        // host's directory. Root's share records in it read-only.
        let board = self.opts.boards.as_ref().and_then(|boards| {
            board::prepare_board(boards, &uuid)
                .map_err(|e| {
                    self.warnings.push(format!(
                        "{}: {e}: this slice will not take turns on the GPU",
                        board::board_path(boards, &uuid).display()
                    ))
                })
                .ok()
                .map(|b| (boards.clone(), b))
        });
        if let (Some((boards, file)), Some(mounts)) = (board, edits["mounts"].as_array_mut()) {
            let inside = Path::new(DEFAULT_BOARD_DIR);
            mounts.push(json!({
                "hostPath": self.host(&boards),
                "containerPath": DEFAULT_BOARD_DIR,
                "options": ["ro", "nosuid", "nodev", "noexec", "bind"],
            }));
            mounts.push(json!({
                "hostPath": self.host(&file),
                "containerPath": board::board_path(inside, &uuid).display().to_string(),
                "options": ["rw", "nosuid", "nodev", "noexec", "bind"],
            }));
            mounts.push(json!({
                "hostPath": self.host(&board::shares_dir(&boards)),
                "containerPath": board::shares_dir(inside).display().to_string(),
                "options": ["ro", "nosuid", "nodev", "noexec", "bind"],
            }));
        }
    }

    /// The driver's memory partitions for a capped slice's containers
    /// ([`memory_limit_hooks`]) from root's limits record `record`. None
    /// without the `gpuslice` binary to run. The hooks run on the host: a
    /// host root other than `/` that is not stripped (a simulated host) is
    /// named.
    fn memory_limit_hooks(&self, record: &Path) -> Option<Value> {
        let gpuslice = self.host(self.opts.hook.as_ref()?);
        let root = self.root.path();
        let host_root = (!self.opts.strip_host_root && root != Path::new("/")).then_some(root);
        Some(memory_limit_hooks(&gpuslice, &self.host(record), host_root))
    }

    /// The slice's directory in the container, where its usage ledger is
    /// made: the host's `<slice_dirs>/<name>` (shared by every container
    /// of the slice), else a tmpfs of the container's own.
    fn slice_dir_mount(&self, name: &str) -> Value {
        match &self.opts.slice_dirs {
            Some(dirs) => json!({
                "hostPath": self.host(&dirs.join(name)),
                "containerPath": SLICE_DIR,
                "options": ["rw", "nosuid", "nodev", "noexec", "bind"],
            }),
            None => json!({
                "hostPath": "tmpfs",
                "containerPath": SLICE_DIR,
                "type": "tmpfs",
                "options": ["nosuid", "nodev", "noexec", "mode=1777", "size=16m"],
            }),
        }
    }

    /// Warn once about the shim, not once per GPU.
    fn opts_shared_done(&mut self) {
        self.warnings.dedup();
    }

    fn common_edits(&mut self) -> Result<Value> {
        let mut nodes = Vec::new();
        let dev = self.root.dev();
        for name in [
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-uvm-tools",
            "nvidia-modeset",
        ] {
            let p = dev.join(name);
            match fs::metadata(&p) {
                Ok(md) if md.file_type().is_char_device() => {
                    nodes.push(self.node(name, libc_major(md.rdev()), libc_minor(md.rdev())));
                }
                _ if name == "nvidiactl" => self.warnings.push(format!(
                    "{} is missing: containers cannot use the GPUs",
                    p.display()
                )),
                _ => {}
            }
        }
        let caps = &self.opts.capabilities;
        let mut mounts = Vec::new();
        let ro = json!(["ro", "nosuid", "nodev", "bind"]);
        let version = self.inv.driver_version.clone();
        let lib_dirs = self.lib_dirs();
        for (cap, stem, names) in LIBS {
            if !caps.contains(cap) {
                continue;
            }
            let Some((file, versioned)) = find_lib(self.root, &lib_dirs, stem, version.as_deref())
            else {
                if *stem == "libcuda" || *stem == "libnvidia-ml" {
                    self.warnings.push(format!(
                        "{stem}.so not found below {}: containers get no {} library",
                        self.root.path().display(),
                        cap.name()
                    ));
                }
                continue;
            };
            let mut container_names = vec![versioned];
            container_names.extend(names.iter().map(|s| s.to_string()));
            container_names.dedup();
            for n in container_names {
                mounts.push(json!({
                    "hostPath": self.host(&file),
                    "containerPath": format!("{CONTAINER_LIB_DIR}/{n}"),
                    "options": ro,
                }));
            }
        }
        for (cap, bin) in BINS {
            if !caps.contains(cap) {
                continue;
            }
            if let Some(p) = BIN_DIRS
                .iter()
                .map(|d| self.root.join(d).join(bin))
                .find(|p| p.is_file())
            {
                mounts.push(json!({
                    "hostPath": self.host(&p),
                    "containerPath": format!("/usr/bin/{bin}"),
                    "options": ro,
                }));
            }
        }
        let mut hooks = Vec::new();
        let params_path = self.root.nvidia_proc().join("params");
        match (&self.opts.hook, fs::read_to_string(&params_path)) {
            (Some(hook), Ok(params)) => {
                let file = self.opts.spec_dir.join(PARAMS_FILE);
                self.side_files.push((
                    file.clone(),
                    gpuslice_isolate::driver_proc::params_without_modify(&params),
                ));
                // runc refuses mounts below /proc: a createContainer hook
                // (in the container's mount namespace, before pivot_root)
                // binds the file over the container's params instead.
                hooks.push(json!({
                    "hookName": "createContainer",
                    "path": self.host(hook),
                    "args": ["gpuslice", "cdi", "hook", "params", "--file", self.host(&file)],
                    "timeout": 10,
                }));
            }
            (None, _) => self
                .warnings
                .push("no params overlay: the gpuslice binary for the hook is unknown".into()),
            (_, Err(e)) => self
                .warnings
                .push(format!("no params overlay: {}: {e}", params_path.display())),
        }
        let shared: Vec<String> = self.opts.shared.iter().map(u32::to_string).collect();
        let env = vec![
            format!("{ANN_CAPS}={}", caps_string(caps)),
            format!(
                "{ANN_DRIVER}={}",
                self.inv.driver_version.as_deref().unwrap_or("unknown")
            ),
            format!("{ANN_SHARED}={}", shared.join(",")),
            format!("{ANN_STRIP}={}", self.opts.strip_host_root),
            format!("{ENV_DEVICE_ORDER}={PCI_BUS_ID}"),
            format!("LD_LIBRARY_PATH={CONTAINER_LIB_DIR}"),
        ];
        let mut edits = json!({ "env": env, "deviceNodes": nodes });
        if !mounts.is_empty() {
            edits["mounts"] = Value::Array(mounts);
        }
        if !hooks.is_empty() {
            edits["hooks"] = Value::Array(hooks);
        }
        Ok(edits)
    }

    /// Standard library directories, then those of `etc/ld.so.conf.d`.
    fn lib_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = LIB_DIRS.iter().map(|d| self.root.join(d)).collect();
        let conf = self.root.join("etc/ld.so.conf.d");
        let mut confs: Vec<_> = fs::read_dir(conf)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "conf"))
            .collect();
        confs.sort();
        for c in confs {
            for line in fs::read_to_string(c).unwrap_or_default().lines() {
                let l = line.split('#').next().unwrap_or("").trim();
                if l.starts_with('/') {
                    let d = self.root.join(l);
                    if !dirs.contains(&d) {
                        dirs.push(d);
                    }
                }
            }
        }
        dirs
    }
}

fn device(name: &str, edits: Value) -> Value {
    json!({ "name": name, "containerEdits": edits })
}

/// Finds `<stem>.so.<driver version>` (NVIDIA installs every library so),
/// else the newest `<stem>.so.*` file, in `dirs`. Returns the real file
/// (symlinks resolved inside the root) and the file name to give it.
fn find_lib(
    root: &HostRoot,
    dirs: &[PathBuf],
    stem: &str,
    version: Option<&str>,
) -> Option<(PathBuf, String)> {
    let prefix = format!("{stem}.so.");
    for dir in dirs {
        if let Some(v) = version {
            let p = dir.join(format!("{prefix}{v}"));
            if let Some(real) = resolve_in_root(root, &p) {
                return Some((real, format!("{prefix}{v}")));
            }
        }
        let mut found: Vec<String> = fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        // Longest version string first: `libcuda.so.580.95.05` before `libcuda.so.1`.
        found.sort_by_key(|n| std::cmp::Reverse((n.len(), n.clone())));
        for n in found {
            if let Some(real) = resolve_in_root(root, &dir.join(&n)) {
                let name = real
                    .file_name()
                    .map_or(n.clone(), |f| f.to_string_lossy().into_owned());
                let name = if name.starts_with(&prefix) { name } else { n };
                return Some((real, name));
            }
        }
    }
    None
}

/// Follows symlinks, taking absolute targets below the root; the final
/// regular file, or None.
fn resolve_in_root(root: &HostRoot, p: &Path) -> Option<PathBuf> {
    let mut p = p.to_path_buf();
    for _ in 0..16 {
        let md = fs::symlink_metadata(&p).ok()?;
        if md.file_type().is_symlink() {
            let t = fs::read_link(&p).ok()?;
            p = if t.is_absolute() {
                root.join(&t)
            } else {
                p.parent()?.join(t)
            };
        } else {
            return md.is_file().then_some(p);
        }
    }
    None
}

fn libc_major(rdev: u64) -> u32 {
    libc::major(rdev)
}

fn libc_minor(rdev: u64) -> u32 {
    libc::minor(rdev)
}

/// `gpuslice cdi hook params --file F`: run by the runtime as a
/// createContainer hook (container mount namespace, before pivot_root),
/// with the container state on stdin. Binds `file` read-only over the
/// container's `/proc/driver/nvidia/params` when that exists. Errors are
/// returned for the caller to report; the caller decides whether they fail
/// the container.
pub fn params_hook(state_json: &str, file: &Path) -> Result<Option<PathBuf>> {
    let state: Value = serde_json::from_str(state_json).context("container state on stdin")?;
    let bundle = state["bundle"]
        .as_str()
        .ok_or_else(|| anyhow!("no bundle in the container state"))?;
    let config_path = Path::new(bundle).join("config.json");
    let config: Value = serde_json::from_str(
        &fs::read_to_string(&config_path)
            .with_context(|| format!("cannot read {}", config_path.display()))?,
    )?;
    let rootfs = config["root"]["path"]
        .as_str()
        .ok_or_else(|| anyhow!("no root.path in {}", config_path.display()))?;
    let rootfs = Path::new(bundle).join(rootfs); // join keeps an absolute path
    let target = rootfs.join("proc/driver/nvidia/params");
    if !target.exists() {
        return Ok(None);
    }
    bind_ro(file, &target)?;
    Ok(Some(target))
}

fn bind_ro(src: &Path, dst: &Path) -> Result<()> {
    use rustix::mount::{mount_bind, mount_remount, MountFlags};
    mount_bind(src, dst)
        .with_context(|| format!("bind {} over {}", src.display(), dst.display()))?;
    mount_remount(dst, MountFlags::BIND | MountFlags::RDONLY, "")
        .with_context(|| format!("remount {} read-only", dst.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests;
