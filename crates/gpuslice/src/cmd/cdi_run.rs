//! `gpuslice run --cdi-device VENDOR/CLASS=NAME`: a CDI device's edits
//! applied to the slice the way a container runtime applies them to a
//! container, for hosts without one (gpuslice-full only: the CDI stack
//! stays out of the launcher's start-up).
//!
//! The spec is found in the spec directories (`/etc/cdi`, `/var/run/cdi`,
//! or `--cdi-spec-dir`), parsed and validated with the
//! `container-device-interface` crate, and its edits (the spec's common
//! ones, then the device's) become the slice's:
//! - device nodes select the GPUs (or MIG devices): the private /dev and
//!   the device cgroup allow exactly the selection's nodes, and any node
//!   that is not an NVIDIA one is refused;
//! - env is set over the command's environment;
//! - mounts: the slice contract's (the limits record at the fixed place,
//!   the shim, the preload list, the tmpfs for the ledger) are the
//!   slice's own files, built by the launcher from the spec's record and
//!   shim; any other bind is made in the slice's mount namespace exactly
//!   where and with the flags the spec says, when the target exists (the
//!   launcher creates nothing on the host: a missing target, such as the
//!   driver libraries' `/usr/local/nvidia/lib64`, is left out and the file
//!   stays at its host path);
//! - hooks: only gpuslice's own params hook, whose work is the launcher's
//!   own params overlay (laid as for `--gpus`: when the selection hides a
//!   GPU); any other hook is refused.
//!
//! Specs are root's trust: a spec file or directory that is not root's,
//! or that another user could write, is refused (docs/security.md).

use super::run::CdiEdits;
use super::run_args::RunArgs;
use crate::global::Global;
use anyhow::{anyhow, bail, Context, Result};
use gpuslice_cdi::CONTAINER_SHIM;
use gpuslice_isolate::slicefs::Bind;
use gpuslice_ledger::limits::{LIMITS_FILE, SLICE_DIR};
use serde_json::Value;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The directories runtimes read specs from, in their order of priority.
pub const SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

pub fn run(global: &Global, args: &RunArgs) -> Result<i32> {
    // Nothing is created before the edits are resolved: a refused device
    // leaves nothing behind (and `run` exits 125).
    let edits = resolve_all(args)?;
    super::run::run_with(global, args, Some(edits))
}

fn resolve_all(args: &RunArgs) -> Result<CdiEdits> {
    if !nix::unistd::geteuid().is_root() {
        bail!("--cdi-device needs root (it makes the spec's bind mounts); run it with sudo");
    }
    let dirs: Vec<PathBuf> = if args.cdi_spec_dir.is_empty() {
        SPEC_DIRS.iter().map(PathBuf::from).collect()
    } else {
        args.cdi_spec_dir.clone()
    };
    let specs = load_specs(&dirs)?;
    let mut edits = CdiEdits::default();
    for id in &args.cdi_device {
        let (kind, name) = parse_id(id)?;
        let (path, spec) = find(&specs, kind, name, id, &dirs)?;
        edits.devices.push(id.clone());
        let device = spec["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["name"] == name)
            .expect("found above");
        for e in [&spec["containerEdits"], &device["containerEdits"]] {
            apply(&mut edits, e, id, path)?;
        }
    }
    Ok(edits)
}

/// `vendor/class=name`.
fn parse_id(id: &str) -> Result<(&str, &str)> {
    let bad =
        || anyhow!("CDI device {id:?} is not VENDOR/CLASS=NAME (e.g. gpuslice.dev/claim=<uid>-0)");
    let (kind, name) = id.split_once('=').ok_or_else(bad)?;
    let (vendor, class) = kind.split_once('/').ok_or_else(bad)?;
    if vendor.is_empty() || class.is_empty() || name.is_empty() {
        return Err(bad());
    }
    Ok((kind, name))
}

/// Every spec file of `dirs` (`*.json`, `*.yaml`, `*.yml`), checked for
/// ownership, parsed and validated; a directory that does not exist has
/// none.
fn load_specs(dirs: &[PathBuf]) -> Result<Vec<(PathBuf, Value)>> {
    let mut specs = Vec::new();
    for dir in dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => bail!("cannot read the CDI spec directory {}: {e}", dir.display()),
        };
        trusted(dir, "directory")?;
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "json" || e == "yaml" || e == "yml")
            })
            .collect();
        files.sort();
        for path in files {
            trusted(&path, "file")?;
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read the CDI spec {}", path.display()))?;
            let spec = gpuslice_cdi::parse(&text)
                .map_err(anyhow::Error::from)
                .and_then(|s| {
                    container_device_interface::spec::new_spec(&s, &path, 0)
                        .map_err(|e| anyhow!("{e:#}"))?;
                    Ok(serde_json::to_value(&s)?)
                })
                .map_err(|e| {
                    anyhow!(
                        "the CDI spec {} is malformed ({e:#}); fix or remove it",
                        path.display()
                    )
                })?;
            specs.push((path, spec));
        }
    }
    Ok(specs)
}

/// Root's, and writable by no one else: a spec says what the slice may
/// reach and which record caps it.
fn trusted(path: &Path, what: &str) -> Result<()> {
    let md = std::fs::symlink_metadata(path)
        .with_context(|| format!("cannot stat the CDI spec {what} {}", path.display()))?;
    if md.file_type().is_symlink() {
        bail!(
            "the CDI spec {what} {} is a symbolic link; put the spec itself there",
            path.display()
        );
    }
    if md.uid() != 0 {
        bail!(
            "the CDI spec {what} {} is owned by uid {}, not root: only root's specs are applied (chown root it)",
            path.display(),
            md.uid()
        );
    }
    if md.mode() & 0o022 != 0 {
        bail!(
            "the CDI spec {what} {} is writable by others (mode {:o}): only root may be able to write specs (chmod go-w it)",
            path.display(),
            md.mode() & 0o7777
        );
    }
    Ok(())
}

/// The spec defining `kind`'s device `name`: exactly one must.
fn find<'a>(
    specs: &'a [(PathBuf, Value)],
    kind: &str,
    name: &str,
    id: &str,
    dirs: &[PathBuf],
) -> Result<(&'a Path, &'a Value)> {
    let of_kind: Vec<&(PathBuf, Value)> = specs.iter().filter(|(_, s)| s["kind"] == kind).collect();
    let defining: Vec<&(PathBuf, Value)> = of_kind
        .iter()
        .copied()
        .filter(|(_, s)| {
            s["devices"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["name"] == name))
        })
        .collect();
    let dirs = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    match defining.as_slice() {
        [(path, spec)] => Ok((path, spec)),
        [] if of_kind.is_empty() => bail!(
            "CDI device {id}: no spec of kind {kind} in {dirs} (prepare the claim or write the spec first, or point --cdi-spec-dir at its directory)"
        ),
        [] => {
            let mut names: Vec<&str> = of_kind
                .iter()
                .flat_map(|(_, s)| s["devices"].as_array().into_iter().flatten())
                .filter_map(|d| d["name"].as_str())
                .collect();
            names.truncate(8);
            bail!(
                "CDI device {id}: kind {kind} has no device {name:?} in {dirs} (it has: {})",
                names.join(", ")
            )
        }
        more => bail!(
            "CDI device {id} is defined by {} specs ({}); remove all but one",
            more.len(),
            more.iter()
                .map(|(p, _)| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Adds one `containerEdits` to the slice's.
fn apply(out: &mut CdiEdits, e: &Value, id: &str, spec: &Path) -> Result<()> {
    let at = || format!("CDI device {id} ({})", spec.display());
    for key in ["intelRdt", "additionalGids", "netDevices"] {
        if !e[key].is_null() && e[key] != Value::Array(vec![]) {
            bail!("{}: {key} edits are not applied by gpuslice run; use a container runtime for this device", at());
        }
    }
    for kv in e["env"].as_array().into_iter().flatten() {
        let kv = kv.as_str().unwrap_or_default();
        if !kv.contains('=') {
            bail!("{}: env entry {kv:?} is not KEY=VALUE", at());
        }
        out.env.push(kv.to_string());
    }
    for n in e["deviceNodes"].as_array().into_iter().flatten() {
        out.nodes
            .push(node(n).map_err(|why| anyhow!("{}: {why}", at()))?);
    }
    for m in e["mounts"].as_array().into_iter().flatten() {
        mount(out, m).map_err(|why| anyhow!("{}: {why}", at()))?;
    }
    for h in e["hooks"].as_array().into_iter().flatten() {
        hook(h).map_err(|why| anyhow!("{}: {why}", at()))?;
    }
    Ok(())
}

/// A device node: its numbers from the host's node (which the runtime
/// would create), checked against what the spec says of it.
fn node(n: &Value) -> Result<(u32, u32, String)> {
    let path = n["path"].as_str().unwrap_or_default();
    let host = n["hostPath"].as_str().unwrap_or(path);
    if !matches!(n["type"].as_str(), None | Some("c")) {
        bail!(
            "device node {path}: type {}, but GPU nodes are character devices (\"c\")",
            n["type"]
        );
    }
    let md = std::fs::metadata(host).map_err(|e| {
        anyhow!("device node {host}: {e} (is the driver loaded? regenerate the spec)")
    })?;
    if !md.file_type().is_char_device() {
        bail!("device node {host} is not a character device");
    }
    // The slice's /dev shows the host's node under its own name.
    let inside = Path::new(path).strip_prefix("/").unwrap_or(Path::new(path));
    if !path.starts_with("/dev/") || !Path::new(host).ends_with(inside) {
        bail!("device node {path} (host {host}): gpuslice run shows a node only at its host name under /dev; regenerate the spec");
    }
    let (major, minor) = (libc::major(md.rdev()), libc::minor(md.rdev()));
    for (key, want) in [("major", major), ("minor", minor)] {
        if let Some(said) = n[key].as_u64() {
            if said != u64::from(want) {
                bail!("device node {path}: the spec says {key} {said}, {host} is {major}:{minor}; regenerate the spec");
            }
        }
    }
    Ok((major, minor, host.to_string()))
}

/// A mount: the slice contract's become the slice's files; any other is
/// a bind where the spec says.
fn mount(out: &mut CdiEdits, m: &Value) -> Result<()> {
    let target = m["containerPath"].as_str().unwrap_or_default();
    let source = m["hostPath"].as_str().unwrap_or_default();
    let options: Vec<&str> = super::json_strings(&m["options"]).collect();
    let kind = m["type"].as_str().unwrap_or("bind");
    if target == SLICE_DIR {
        // The slice's fixed place, which the launcher makes: a tmpfs of
        // the container's own, or a DRA claim's slice directory on the
        // host (run makes a slice of its own: its ledger is not shared
        // with the claim's containers).
        return Ok(());
    }
    if kind != "bind" && kind != "none" {
        bail!("mount at {target}: type {kind:?}; gpuslice run applies bind mounts only");
    }
    let mut bind = Bind {
        source: source.into(),
        target: target.into(),
        read_only: false,
        nosuid: false,
        nodev: false,
        noexec: false,
    };
    for o in &options {
        match *o {
            "bind" | "rbind" | "rprivate" | "private" | "rslave" | "slave" => {}
            "ro" => bind.read_only = true,
            "rw" => bind.read_only = false,
            "nosuid" => bind.nosuid = true,
            "nodev" => bind.nodev = true,
            "noexec" => bind.noexec = true,
            other => bail!(
                "mount at {target}: option {other:?} is not applied by gpuslice run (ro, rw, nosuid, nodev, noexec, bind, rbind)"
            ),
        }
    }
    if target == format!("{SLICE_DIR}/{LIMITS_FILE}") {
        if !bind.read_only {
            bail!("the limits record's mount at {target} is not read-only; regenerate the spec");
        }
        if out.record.is_some() {
            bail!("a second limits record ({source}): a slice has one; run each capped device as its own slice");
        }
        out.record = Some(source.into());
        return Ok(());
    }
    if target == CONTAINER_SHIM {
        out.shim = Some(source.into());
        return Ok(());
    }
    if target == gpuslice_isolate::slicefs::LD_SO_PRELOAD && out.shim.is_some() {
        // The launcher's own preload list names the shim, as this one does.
        return Ok(());
    }
    if !Path::new(target).is_absolute() || target.split('/').any(|c| c == "..") {
        bail!("mount at {target:?}: the container path must be absolute, without ..");
    }
    std::fs::metadata(source).map_err(|e| anyhow!("mount of {source}: {e}"))?;
    if std::fs::symlink_metadata(target).is_err() {
        tracing::info!(source, target, "CDI mount left out: its target does not exist on this host (the file stays at its host path)");
        return Ok(());
    }
    out.binds.push(bind);
    Ok(())
}

/// gpuslice's own hooks: the params hook (`gpuslice cdi hook params`),
/// whose overlay the launcher lays itself, and the memory-limits hooks
/// (`gpuslice cdi hook memory-limits`), whose partitions the launcher sets
/// on the slice's cgroup itself. Anything else is refused.
fn hook(h: &Value) -> Result<()> {
    let args: Vec<&str> = super::json_strings(&h["args"]).collect();
    let ours = (h["hookName"] == "createContainer"
        && args.get(1..4) == Some(&["cdi", "hook", "params"][..]))
        || (matches!(h["hookName"].as_str(), Some("createRuntime" | "poststop"))
            && args.get(1..4) == Some(&["cdi", "hook", "memory-limits"][..]));
    if ours {
        return Ok(());
    }
    bail!(
        "hook {} {:?}: gpuslice run runs no CDI hooks but gpuslice's own params hook; use a container runtime for this device",
        h["hookName"].as_str().unwrap_or("?"),
        h["path"].as_str().unwrap_or("?")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert_eq!(parse_id("a.b/c=d").unwrap(), ("a.b/c", "d"));
        for bad in ["a.b/c", "a.b=c", "/c=d", "a/=d", "a/c="] {
            let e = parse_id(bad).unwrap_err().to_string();
            assert!(e.contains("VENDOR/CLASS=NAME"), "{e}");
        }
    }

    #[test]
    fn only_our_params_hook() {
        let ours = serde_json::json!({"hookName": "createContainer", "path": "/usr/bin/gpuslice",
            "args": ["gpuslice", "cdi", "hook", "params", "--file", "/etc/cdi/gpuslice-params"]});
        assert!(hook(&ours).is_ok());
        let other = serde_json::json!({"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk",
            "args": ["nvidia-ctk", "hook", "update-ldcache"]});
        let e = hook(&other).unwrap_err().to_string();
        assert!(
            e.contains("nvidia-ctk") && e.contains("container runtime"),
            "{e}"
        );
        let start = serde_json::json!({"hookName": "startContainer", "path": "/usr/bin/gpuslice",
            "args": ["gpuslice", "cdi", "hook", "params"]});
        assert!(hook(&start).is_err());
    }

    #[test]
    fn mount_options_are_taken_as_said() {
        let mut e = CdiEdits::default();
        let m = serde_json::json!({"hostPath": "/etc/hostname", "containerPath": "/etc/hostname",
            "options": ["ro", "nosuid", "nodev", "bind"]});
        mount(&mut e, &m).unwrap();
        assert_eq!(
            e.binds,
            [Bind {
                source: "/etc/hostname".into(),
                target: "/etc/hostname".into(),
                read_only: true,
                nosuid: true,
                nodev: true,
                noexec: false,
            }]
        );
        let odd = serde_json::json!({"hostPath": "/etc/hostname", "containerPath": "/etc/hostname",
            "options": ["ro", "exec-anything"]});
        assert!(mount(&mut e, &odd)
            .unwrap_err()
            .to_string()
            .contains("exec-anything"));
        let rw_record = serde_json::json!({"hostPath": "/etc/hostname",
            "containerPath": format!("{SLICE_DIR}/{LIMITS_FILE}"), "options": ["bind"]});
        assert!(mount(&mut e, &rw_record).is_err());
    }
}
