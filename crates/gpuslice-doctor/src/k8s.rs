//! Container and Kubernetes wiring: the CDI spec (present, and current:
//! naming device nodes and driver files that exist, of the driver that is
//! loaded, and every GPU), the device-plugin socket and its registration
//! with the kubelet, and an NVIDIA container toolkit that would hand out
//! the same GPUs behind gpuslice's back.
//!
//! Specs are read by `gpuslice-k8s`'s CDI parser, the one `gpuslice cdi
//! check` uses: a spec it cannot parse is reported as unreadable.

use crate::{list, looks_like_version, Check, Context};
use gpuslice_cdi as cdi;
use gpuslice_core::HostRoot;
use serde_json::Value;
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

pub const GPUSLICE_CDI_KIND: &str = "gpuslice.dev/gpu";
pub const NVIDIA_CDI_KIND: &str = "nvidia.com/gpu";
const PLUGIN_DIR: &str = "var/lib/kubelet/device-plugins";

pub fn checks(ctx: &Context) -> Vec<Check> {
    let specs = read_specs(&ctx.root);
    vec![
        cdi(ctx, &specs),
        device_plugin(&ctx.root),
        toolkit(&ctx.root, &specs),
    ]
}

/// What a CDI spec file says, as far as these checks need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spec {
    pub file: PathBuf,
    pub kind: Option<String>,
    /// Device names (`0`, `GPU-…`, `all`).
    pub names: Vec<String>,
    /// Host paths it mounts or creates nodes from (`hostPath`, else `path`).
    pub host_paths: Vec<String>,
    /// The driver version `gpuslice cdi generate` recorded
    /// (`GPUSLICE_CDI_DRIVER_VERSION=` in the spec's env).
    pub driver_version: Option<String>,
    /// `GPUSLICE_CDI_STRIP_HOST_ROOT=true`: its paths are the host's, to be
    /// read below the host root.
    pub strip_host_root: bool,
    /// Why the file could not be read, when it could not.
    pub error: Option<String>,
}

impl Spec {
    /// Written by gpuslice: of its kind, or (another `--vendor`/`--class`)
    /// carrying its driver annotation.
    pub fn is_gpuslice(&self) -> bool {
        self.kind.as_deref() == Some(GPUSLICE_CDI_KIND) || self.driver_version.is_some()
    }
}

/// The spec directories CDI consumers read, below the host root.
pub fn cdi_dirs(root: &HostRoot) -> Vec<PathBuf> {
    let mut dirs = vec![root.join("etc/cdi"), root.join("run/cdi")];
    // /var/run is usually a link to /run; an absolute one must stay below
    // the host root.
    match fs::read_link(root.join("var/run")) {
        Ok(t) if t.is_absolute() => dirs.push(root.join(t).join("cdi")),
        _ => dirs.push(root.join("var/run/cdi")),
    }
    let mut seen = BTreeSet::new();
    dirs.retain(|d| seen.insert(fs::canonicalize(d).unwrap_or(d.clone())));
    dirs
}

pub fn read_specs(root: &HostRoot) -> Vec<Spec> {
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in cdi_dirs(root) {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        let mut here: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .and_then(|x| x.to_str())
                    .is_some_and(|x| matches!(x, "yaml" | "yml" | "json"))
            })
            .collect();
        here.sort();
        files.extend(here);
    }
    files
        .into_iter()
        .map(|f| match fs::read_to_string(&f) {
            Ok(text) => Spec {
                file: f,
                ..parse_spec(&text)
            },
            Err(e) => Spec {
                file: f,
                error: Some(e.to_string()),
                ..Default::default()
            },
        })
        .collect()
}

/// The facts of one spec's text (YAML or JSON).
pub fn parse_spec(text: &str) -> Spec {
    match cdi::parse(text) {
        Ok(spec) => Spec {
            kind: Some(cdi::kind(&spec)),
            names: cdi::device_names(&spec),
            host_paths: cdi::host_paths(&spec),
            driver_version: cdi::recorded(&spec, cdi::ANN_DRIVER),
            strip_host_root: cdi::recorded(&spec, cdi::ANN_STRIP).as_deref() == Some("true"),
            ..Default::default()
        },
        Err(e) => Spec {
            error: Some(format!("{e:#}")),
            ..Default::default()
        },
    }
}

/// A driver version in a library file name (`libcuda.so.580.159.04`);
/// three-digit branches only, so `libnvidia-egl-wayland.so.1.1.13` is not one.
pub fn driver_version_in(path: &str) -> Option<&str> {
    let name = path.rsplit('/').next()?;
    let (_, v) = name.split_once(".so.")?;
    let major: u32 = v.split('.').next()?.parse().ok()?;
    (looks_like_version(v) && major >= 100).then_some(v)
}

/// Where a host path of a spec is seen from here, as `gpuslice cdi check`
/// sees it: `gpuslice cdi generate` writes the paths it sees (the host
/// root in front of those it read below it) unless told to strip the host
/// root, which it records; any other spec names the host's own paths.
fn seen_from_here(spec: &Spec, root: &HostRoot, p: &str) -> PathBuf {
    if spec.driver_version.is_some() && !spec.strip_host_root {
        PathBuf::from(p)
    } else {
        root.join(p)
    }
}

/// Why a gpuslice spec is out of date, if it is.
pub fn staleness(
    spec: &Spec,
    root: &HostRoot,
    driver: Option<&str>,
    uuids: &[String],
) -> Vec<String> {
    let mut why = Vec::new();
    if let (Some(recorded), Some(loaded)) = (spec.driver_version.as_deref(), driver) {
        if recorded != loaded {
            why.push(format!("written for driver {recorded}, {loaded} is loaded"));
        }
    }
    for p in spec.host_paths.iter().filter(|p| p.starts_with('/')) {
        if seen_from_here(spec, root, p).symlink_metadata().is_err() {
            why.push(format!("{p} does not exist"));
        } else if let (Some(v), Some(d)) = (driver_version_in(p), driver) {
            if v != d {
                why.push(format!("{p} is of driver {v}, not {d}"));
            }
        }
    }
    let named: BTreeSet<&str> = spec
        .names
        .iter()
        .filter(|n| n.starts_with("GPU-"))
        .map(String::as_str)
        .collect();
    for n in &named {
        if !uuids.iter().any(|u| u == n) {
            why.push(format!("device {n} is not on this host"));
        }
    }
    if !named.is_empty() {
        for u in uuids {
            if !named.contains(u.as_str()) {
                why.push(format!("{u} is missing"));
            }
        }
    }
    why
}

fn cdi(ctx: &Context, specs: &[Spec]) -> Check {
    const NAME: &str = "k8s.cdi";
    let ours: Vec<&Spec> = specs.iter().filter(|s| s.is_gpuslice()).collect();
    let broken: Vec<String> = specs
        .iter()
        .filter_map(|s| Some(format!("{}: {}", s.file.display(), s.error.as_ref()?)))
        .collect();
    let dirs = cdi_dirs(&ctx.root)
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if ours.is_empty() {
        if !broken.is_empty() {
            return Check::warn(
                NAME,
                format!("unreadable CDI spec(s): {}", list(&broken, 3)),
                "fix or remove them, then gpuslice cdi generate --output /etc/cdi/gpuslice.yaml",
            );
        }
        return Check::skip(
            NAME,
            format!("no gpuslice CDI spec (kind {GPUSLICE_CDI_KIND}) in {dirs}"),
            "to hand out slices through CDI (podman, containerd ≥ 1.7, CRI-O, Docker ≥ 25): \
             gpuslice cdi generate --output /etc/cdi/gpuslice.yaml",
        );
    }
    let uuids: Vec<String> = ctx.gpus().iter().map(|g| g.uuid.clone()).collect();
    let mut stale = Vec::new();
    for s in &ours {
        let why = staleness(s, &ctx.root, ctx.driver_version(), &uuids);
        if !why.is_empty() {
            stale.push(format!("{}: {}", s.file.display(), list(&why, 3)));
        }
    }
    if ours.len() > 1 {
        stale.push(format!(
            "{} specs of kind {GPUSLICE_CDI_KIND} ({}) — CDI refuses duplicate device names",
            ours.len(),
            list(
                &ours
                    .iter()
                    .map(|s| s.file.display().to_string())
                    .collect::<Vec<_>>(),
                3
            )
        ));
    }
    if !stale.is_empty() {
        let file = ours[0].file.display();
        return Check::fail(
            NAME,
            format!("stale CDI spec: {}", list(&stale, 2)),
            format!(
                "regenerate it after driver or GPU changes: gpuslice cdi generate --output \
                 {file} (gpuslice cdi check --spec {file} compares it in full; keep one spec \
                 of this kind)"
            ),
        );
    }
    let s = ours[0];
    Check::pass(
        NAME,
        format!(
            "{} is current: {} device(s), {} host path(s) present{}",
            s.file.display(),
            s.names.len(),
            s.host_paths.len(),
            ctx.driver_version()
                .map(|d| format!(", driver {d}"))
                .unwrap_or_default()
        ),
    )
}

/// Whether something listens on the unix socket.
fn answers(sock: &Path) -> bool {
    UnixStream::connect(sock).is_ok()
}

fn device_plugin(root: &HostRoot) -> Check {
    const NAME: &str = "k8s.device-plugin";
    let dir = root.join(PLUGIN_DIR);
    let kubelet = dir.join("kubelet.sock");
    if kubelet.symlink_metadata().is_err() {
        return Check::skip(
            NAME,
            format!("not a Kubernetes node (no {})", kubelet.display()),
            "",
        );
    }
    let mut ours: Vec<PathBuf> = fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.contains("gpuslice"))
                })
                .collect()
        })
        .unwrap_or_default();
    ours.sort();
    let registered = registered_resources(&dir.join("kubelet_internal_checkpoint"));
    let reg_text = match &registered {
        Some(r) if !r.is_empty() => format!("; kubelet has registered {}", list(r, 4)),
        Some(_) => "; kubelet has no registered device resources".into(),
        None => String::new(),
    };
    if ours.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "Kubernetes node (kubelet.sock) without a gpuslice device-plugin socket in {}{reg_text}",
                dir.display()
            ),
            "deploy the gpuslice DaemonSet (deploy/) or run gpuslice device-plugin on this node",
        );
    }
    let dead: Vec<String> = ours
        .iter()
        .filter(|p| !answers(p))
        .map(|p| p.display().to_string())
        .collect();
    if !dead.is_empty() {
        return Check::warn(
            NAME,
            format!("no device plugin answers on {}{reg_text}", list(&dead, 3)),
            "restart the gpuslice device plugin (its pod or gpuslice device-plugin); \
             remove the stale socket if the plugin is gone for good",
        );
    }
    let answering = list(
        &ours
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>(),
        3,
    );
    if registered.as_ref().is_some_and(|r| r.is_empty()) {
        return Check::warn(
            NAME,
            format!("{answering} answers but the kubelet has registered no device resources"),
            "check the plugin's log for its Register call; it re-registers when kubelet.sock \
             is re-created (restart it after a kubelet restart if not)",
        );
    }
    Check::pass(NAME, format!("{answering} answers{reg_text}"))
}

/// `resource (N devices)` for every resource the kubelet's device-manager
/// checkpoint holds; None when there is no readable checkpoint.
pub fn registered_resources(checkpoint: &Path) -> Option<Vec<String>> {
    let v: Value = serde_json::from_str(&fs::read_to_string(checkpoint).ok()?).ok()?;
    let reg = v["Data"]["RegisteredDevices"].as_object()?;
    Some(
        reg.iter()
            .map(|(k, devs)| format!("{k} ({})", devs.as_array().map_or(0, Vec::len)))
            .collect(),
    )
}

fn toolkit(root: &HostRoot, specs: &[Spec]) -> Check {
    const NAME: &str = "k8s.nvidia-toolkit";
    let mut found = Vec::new();
    for rel in [
        "usr/bin/nvidia-container-runtime-hook",
        "usr/local/bin/nvidia-container-runtime-hook",
        "usr/bin/nvidia-container-runtime",
        "usr/local/nvidia/toolkit/nvidia-container-runtime",
        "etc/nvidia-container-runtime/config.toml",
    ] {
        if root.join(rel).symlink_metadata().is_ok() {
            found.push(format!("/{rel}"));
        }
    }
    let docker = fs::read_to_string(root.join("etc/docker/daemon.json")).unwrap_or_default();
    let docker_default = serde_json::from_str::<Value>(&docker)
        .ok()
        .and_then(|v| v["default-runtime"].as_str().map(str::to_string))
        .is_some_and(|r| r.contains("nvidia"));
    let containerd =
        fs::read_to_string(root.join("etc/containerd/config.toml")).unwrap_or_default();
    let containerd_default = containerd.lines().any(|l| {
        let l = l.trim();
        l.starts_with("default_runtime_name") && l.contains("nvidia")
    });
    if docker_default {
        found.push("Docker's default runtime is nvidia".into());
    }
    if containerd_default {
        found.push("containerd's default runtime is nvidia".into());
    }
    // An NVIDIA CDI spec whose device nodes are also in ours.
    let our_nodes: BTreeSet<&str> = specs
        .iter()
        .filter(|s| s.is_gpuslice())
        .flat_map(|s| s.host_paths.iter())
        .filter(|p| p.starts_with("/dev/"))
        .map(String::as_str)
        .collect();
    for s in specs
        .iter()
        .filter(|s| s.kind.as_deref() == Some(NVIDIA_CDI_KIND))
    {
        let shared: Vec<String> = s
            .host_paths
            .iter()
            .filter(|p| our_nodes.contains(p.as_str()))
            .cloned()
            .collect();
        if !shared.is_empty() {
            found.push(format!(
                "NVIDIA CDI spec {} also lists {}",
                s.file.display(),
                list(&shared, 3)
            ));
        }
    }
    let plugins = root.join(PLUGIN_DIR);
    if let Ok(rd) = fs::read_dir(&plugins) {
        let mut socks: Vec<String> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| n.starts_with("nvidia") && n.ends_with(".sock"))
            .collect();
        socks.sort();
        for n in socks {
            found.push(format!("NVIDIA device-plugin socket {n}"));
        }
    }
    if found.is_empty() {
        return Check::pass(
            NAME,
            "no NVIDIA container toolkit hook, runtime, config or overlapping CDI spec",
        );
    }
    let defaults = docker_default || containerd_default;
    Check::warn(
        NAME,
        format!(
            "NVIDIA container toolkit present: {}; {}",
            list(&found, 4),
            if defaults {
                "every container whose image sets NVIDIA_VISIBLE_DEVICES=all (all CUDA images) \
                 gets every GPU, outside gpuslice's slices"
            } else {
                "containers run with its runtime or hook get GPUs outside gpuslice's slices and \
                 accounting"
            }
        ),
        "let one component hand out GPUs: drop nvidia as the default runtime (Docker \
         default-runtime, containerd default_runtime_name) and remove NVIDIA's device plugin \
         and CDI spec where gpuslice serves the GPUs (or the reverse)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;
    use gpuslice_testkit::temphost::TempHost;

    const YAML: &str = r#"---
cdiVersion: "0.6.0"
kind: "gpuslice.dev/gpu"
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: GPU-fa4e0000-0000-4000-8000-000000000000
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      hostPath: /dev/nvidia0
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
    options:
    - ro
    - nosuid
  hooks:
  - hookName: createContainer
    path: /usr/bin/gpuslice
"#;

    #[test]
    fn yaml_and_json_specs() {
        let s = parse_spec(YAML);
        assert_eq!(s.error, None);
        assert_eq!(s.kind.as_deref(), Some(GPUSLICE_CDI_KIND));
        assert_eq!(s.names, ["0", "GPU-fa4e0000-0000-4000-8000-000000000000"]);
        // Every host path once, sorted.
        assert_eq!(
            s.host_paths,
            [
                "/dev/nvidia0",
                "/dev/nvidiactl",
                "/usr/bin/gpuslice",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04",
            ]
        );
        let json = r#"{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[{"name":"all",
            "containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"},{"path":"/dev/x","hostPath":"/dev/nvidia1"}]}}]}"#;
        let j = parse_spec(json);
        assert_eq!(j.kind.as_deref(), Some(NVIDIA_CDI_KIND));
        assert_eq!(j.names, ["all"]);
        assert_eq!(j.host_paths, ["/dev/nvidia0", "/dev/nvidia1"]);
        assert!(parse_spec("{").error.is_some());
        // Not a CDI spec (no cdiVersion, no devices): unreadable, as a
        // runtime would find it.
        assert!(parse_spec("kind: example.com/gpu\n").error.is_some());
        let annotated = "cdiVersion: 0.6.0\nkind: example.com/gpu\ndevices: []\ncontainerEdits:\n  env:\n  - GPUSLICE_CDI_DRIVER_VERSION=580.159.04\n";
        let a = parse_spec(annotated);
        assert_eq!(a.driver_version.as_deref(), Some("580.159.04"));
        assert!(a.is_gpuslice() && !j.is_gpuslice());
    }

    #[test]
    fn driver_versions_in_names() {
        assert_eq!(
            driver_version_in("/usr/lib/libcuda.so.580.159.04"),
            Some("580.159.04")
        );
        assert_eq!(
            driver_version_in("/usr/lib/libnvidia-egl-wayland.so.1.1.13"),
            None
        );
        assert_eq!(driver_version_in("/usr/lib/libcuda.so.1"), None);
        assert_eq!(driver_version_in("/dev/nvidia0"), None);
    }

    #[test]
    fn staleness_reasons() {
        let h = TempHost::new();
        let root = h.root();
        for f in [
            "dev/nvidia0",
            "dev/nvidiactl",
            "usr/bin/gpuslice",
            "usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04",
        ] {
            h.write(f, "");
        }
        let s = parse_spec(YAML);
        let uuid = vec!["GPU-fa4e0000-0000-4000-8000-000000000000".to_string()];
        assert!(staleness(&s, &root, Some("580.159.04"), &uuid).is_empty());
        let mut recorded = s.clone();
        recorded.driver_version = Some("575.57.08".into());
        recorded.strip_host_root = true;
        let why = staleness(&recorded, &root, Some("580.159.04"), &uuid);
        assert_eq!(why, ["written for driver 575.57.08, 580.159.04 is loaded"]);
        // gpuslice's specs name the paths it saw, the host root in front,
        // unless it stripped the host root.
        let mut prefixed = s.clone();
        prefixed.driver_version = Some("580.159.04".into());
        prefixed.host_paths = vec![h.path().join("dev/nvidia0").display().to_string()];
        assert!(staleness(&prefixed, &root, None, &uuid).is_empty());
        prefixed.strip_host_root = true;
        assert_eq!(staleness(&prefixed, &root, None, &uuid).len(), 1);
        let why = staleness(&s, &root, Some("590.10.01"), &uuid);
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(
            why[0].contains("of driver 580.159.04, not 590.10.01"),
            "{why:?}"
        );
        fs::remove_file(h.path().join("dev/nvidia0")).unwrap();
        let two = vec![uuid[0].clone(), "GPU-other".to_string()];
        let why = staleness(&s, &root, Some("580.159.04"), &two);
        assert!(
            why.iter().any(|w| w == "/dev/nvidia0 does not exist"),
            "{why:?}"
        );
        assert!(why.iter().any(|w| w == "GPU-other is missing"), "{why:?}");
    }

    #[test]
    fn device_plugin_and_toolkit_on_a_tree() {
        let h = TempHost::new();
        let root = h.root();
        assert_eq!(device_plugin(&root).status, Status::Skip);
        assert_eq!(toolkit(&root, &[]).status, Status::Pass);

        let dir = h.mkdir(PLUGIN_DIR);
        let _kubelet = std::os::unix::net::UnixListener::bind(dir.join("kubelet.sock")).unwrap();
        assert_eq!(device_plugin(&root).status, Status::Warn);
        let _plugin =
            std::os::unix::net::UnixListener::bind(dir.join("gpuslice-gpu.sock")).unwrap();
        h.write(
            &format!("{PLUGIN_DIR}/kubelet_internal_checkpoint"),
            r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["a","b"]}},"Checksum":1}"#,
        );
        let c = device_plugin(&root);
        assert_eq!(c.status, Status::Pass, "{c:?}");
        assert!(c.detail.contains("nvidia.com/gpu (2)"), "{}", c.detail);
        drop(_plugin);
        assert_eq!(device_plugin(&root).status, Status::Warn);

        h.write(
            "etc/docker/daemon.json",
            r#"{"default-runtime":"nvidia","runtimes":{"nvidia":{"path":"nvidia-container-runtime"}}}"#,
        );
        let c = toolkit(&root, &[]);
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.detail.contains("Docker's default runtime is nvidia"),
            "{}",
            c.detail
        );
    }
}
