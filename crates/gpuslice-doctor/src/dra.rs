//! The DRA driver's wiring on this node (docs/dra.md): the gpuslice DRA
//! kubelet plugin registered (its registration socket in the kubelet's
//! plugin registry answering GetInfo as the kubelet calls it, its DRA
//! socket answering), CDI enabled in the
//! container runtime that starts the claims' containers, and the DRA
//! feature gates of the kubelet.
//!
//! What a node's files cannot show is said, not guessed: whether the
//! kubelet accepted the registration (the plugin's log and `kubectl get
//! resourceslices` do), the control plane's feature gates, and the
//! kubelet's version unless a kubeadm control-plane manifest names it.
//! On a host without a kubelet every check here is skipped.

use crate::{list, Check, Context};
use gpuslice_core::{Gpu, HostRoot};
use gpuslice_dra::server::get_info;
use gpuslice_dra::{DRIVER_NAME as DRIVER, PLUGIN_TYPE, SUPPORTED_VERSIONS};
use gpuslice_k8s::grpc_wire::grpc_go_authority;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the driver writes its claims' CDI specs unless told otherwise
/// (`gpuslice dra --cdi-dir`).
pub const CDI_DIR: &str = gpuslice_cdi::DYNAMIC_DIR;
const KUBELET_DIR: &str = "var/lib/kubelet";
/// containerd's and CRI-O's default `cdi_spec_dirs`.
const DEFAULT_CDI_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// The gate that turns DRA on (GA and on by default from 1.34).
pub const GATE_DRA: &str = "DynamicResourceAllocation";
/// KEP-5075 consumable capacity: alpha (off) in 1.34 and 1.35, beta and on
/// by default in 1.36. Shared GPUs need it.
pub const GATE_CAPACITY: &str = "DRAConsumableCapacity";

pub fn checks(ctx: &Context) -> Vec<Check> {
    vec![
        plugin(&ctx.root),
        cdi_runtime(&ctx.root),
        feature_gates(&ctx.root),
        claims(&ctx.dra_state_dir, ctx.gpus()),
    ]
}

/// The claims the DRA plugin prepared on this node (its checkpoint): each
/// on a GPU this host has, and the capped ones within its memory.
fn claims(dir: &Path, gpus: &[Gpu]) -> Check {
    const NAME: &str = "dra.claims";
    let file = dir.join(gpuslice_dra::checkpoint::FILE);
    if file.symlink_metadata().is_err() {
        return Check::skip(
            NAME,
            format!("no DRA claims prepared here (no {})", file.display()),
            "",
        );
    }
    let cp = match gpuslice_dra::checkpoint::Checkpoint::load(dir) {
        Ok(cp) => cp,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("the DRA plugin's checkpoint is unreadable: {e}"),
                "the plugin cannot prepare or unprepare claims with it: see its log \
                 (docs/dra.md, Prepare and unprepare)",
            )
        }
    };
    let slices: Vec<_> = cp
        .claims
        .values()
        .flat_map(gpuslice_dra::checkpoint::PreparedClaim::slices)
        .collect();
    let mut problems = Vec::new();
    let mut capped: BTreeMap<u32, u64> = BTreeMap::new();
    for s in &slices {
        if !gpus.iter().any(|g| g.index == s.gpu) {
            problems.push(format!(
                "{}/{} holds GPU {}, which this host does not have",
                s.namespace, s.name, s.gpu
            ));
        }
        if let Some(c) = s.caps {
            *capped.entry(s.gpu).or_default() += c.memory_bytes();
        }
    }
    let mut over = Vec::new();
    for (gpu, sum) in &capped {
        let total = gpus
            .iter()
            .find(|g| g.index == *gpu)
            .and_then(|g| g.memory_bytes);
        if let Some(total) = total.filter(|t| sum > t) {
            over.push(format!(
                "GPU {gpu}: the claims' caps add up to {} MiB of its {} MiB",
                sum >> 20,
                total >> 20
            ));
        }
    }
    if !over.is_empty() {
        return Check::fail(
            NAME,
            format!("overcommitted: {}", list(&over, 2)),
            "delete the pods of the newest claims on that GPU; the plugin refuses such a \
             Prepare, so report how it came about",
        );
    }
    if !problems.is_empty() {
        return Check::warn(
            NAME,
            list(&problems, 2),
            "delete those claims' pods (the GPU is gone: their containers cannot use it)",
        );
    }
    let shown: Vec<String> = slices
        .iter()
        .map(|s| {
            let caps = s
                .caps
                .map(|c| format!(" {}", c.describe()))
                .unwrap_or_default();
            format!("{}/{} on {}{caps}", s.namespace, s.name, s.device)
        })
        .collect();
    Check::pass(
        NAME,
        format!(
            "{} claim(s) prepared, {} slice(s){}{}",
            cp.claims.len(),
            slices.len(),
            if shown.is_empty() { "" } else { ": " },
            list(&shown, 4)
        ),
    )
}

fn no_kubelet(root: &HostRoot, name: &str) -> Option<Check> {
    let dir = root.join(KUBELET_DIR);
    (!dir.is_dir()).then(|| {
        Check::skip(
            name,
            format!(
                "no kubelet on this host (no {}): DRA does not apply",
                dir.display()
            ),
            "",
        )
    })
}

fn answers(sock: &Path) -> bool {
    UnixStream::connect(sock).is_ok()
}

/// The registration socket (`<registry>/<driver>-reg.sock`) and the DRA
/// socket (`<plugins>/<driver>/dra.sock`) below the kubelet's directory.
pub fn sockets(root: &HostRoot) -> (PathBuf, PathBuf) {
    let kubelet = root.join(KUBELET_DIR);
    (
        kubelet
            .join("plugins_registry")
            .join(format!("{DRIVER}-reg.sock")),
        kubelet.join("plugins").join(DRIVER).join("dra.sock"),
    )
}

/// How long GetInfo may take (the kubelet allows its plugins 1 s to connect).
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(3);

/// Why the plugin behind `reg` cannot be registered by a kubelet, from a
/// GetInfo sent as the kubelet's plugin watcher sends it (grpc-go, the
/// socket path percent-encoded as `:authority`); None when it can.
fn unregistrable(reg: &Path) -> Option<(String, &'static str)> {
    let authority = grpc_go_authority(reg);
    let info = match get_info(reg, &authority, GET_INFO_TIMEOUT) {
        Ok(info) => info,
        Err(e) => {
            return Some((
                format!(
                    "{} accepts connections, but GetInfo sent as the kubelet sends it                      (:authority {authority:?}) failed: {e}; the kubelet logs \"RegisterPlugin                      error -- failed to get plugin info using RPC GetInfo\" and never calls the plugin",
                    reg.display()
                ),
                "run a gpuslice DRA plugin that accepts the kubelet's :authority (this version                  does) and restart its pod; docs/dra.md, Troubleshooting",
            ))
        }
    };
    let mut wrong = Vec::new();
    if info.r#type != PLUGIN_TYPE {
        wrong.push(format!("type {:?}, not {PLUGIN_TYPE}", info.r#type));
    }
    if info.name != DRIVER {
        wrong.push(format!("name {:?}, not {DRIVER}", info.name));
    }
    if !info
        .supported_versions
        .iter()
        .any(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
    {
        wrong.push(format!(
            "versions {:?}, none of {SUPPORTED_VERSIONS:?}",
            info.supported_versions
        ));
    }
    (!wrong.is_empty()).then(|| {
        (
            format!(
                "{} answers GetInfo with what the kubelet refuses: {}",
                reg.display(),
                wrong.join("; ")
            ),
            "another program serves the gpuslice DRA plugin's registration socket: stop it and \
             restart the plugin's pod",
        )
    })
}

fn plugin(root: &HostRoot) -> Check {
    const NAME: &str = "dra.plugin";
    if let Some(c) = no_kubelet(root, NAME) {
        return c;
    }
    let (reg, dra) = sockets(root);
    if reg.symlink_metadata().is_err() {
        return Check::skip(
            NAME,
            format!(
                "the gpuslice DRA plugin is not registered here (no {})",
                reg.display()
            ),
            "to serve GPUs through DRA: helm install … --set dra.enabled=true \
             (or kubectl apply -f deploy/dra/), docs/dra.md",
        );
    }
    if !answers(&reg) {
        return Check::fail(
            NAME,
            format!(
                "{} is there but nothing answers: the kubelet cannot reach the plugin",
                reg.display()
            ),
            "restart the gpuslice DRA plugin (its pod); remove the stale socket if the plugin \
             is gone for good",
        );
    }
    if let Some((why, fix)) = unregistrable(&reg) {
        return Check::fail(NAME, why, fix);
    }
    if !answers(&dra) {
        return Check::fail(
            NAME,
            format!(
                "{} answers but the DRA socket {} does not: the kubelet's \
                 NodePrepareResources calls fail",
                reg.display(),
                dra.display()
            ),
            "the plugin's pod must mount the kubelet's plugins directory at its host path \
             (deploy/dra/daemonset.yaml); restart it",
        );
    }
    // The device plugin on the same GPUs would hand each out twice.
    let device_plugins: Vec<String> = fs::read_dir(root.join(KUBELET_DIR).join("device-plugins"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.contains("gpuslice") && n.ends_with(".sock"))
                .collect()
        })
        .unwrap_or_default();
    if !device_plugins.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "the DRA plugin and the gpuslice device plugin ({}) both serve this node: \
                 each GPU can be handed out twice",
                list(&device_plugins, 3)
            ),
            "run one of them per node: helm --set devicePlugin.enabled=false, or give the DRA \
             driver other nodes with dra.nodeAffinity",
        );
    }
    Check::pass(
        NAME,
        format!(
            "registration socket {} answers GetInfo as the kubelet calls it and DRA socket {} \
             answers (whether the kubelet accepted the registration shows in the plugin's log \
             and in kubectl get resourceslices)",
            reg.display(),
            dra.display()
        ),
    )
}

/// What a runtime's config says about CDI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeCdi {
    pub runtime: &'static str,
    pub file: Option<PathBuf>,
    /// `enable_cdi` as set; None: not set.
    pub enabled: Option<bool>,
    /// Whether CDI is on when `enable_cdi` is not set; None: it depends
    /// on a version the files do not show.
    pub default_on: Option<bool>,
    /// `cdi_spec_dirs` as set; None: the defaults.
    pub spec_dirs: Option<Vec<String>>,
}

/// A runtime's config file that is not TOML.
#[derive(Debug, thiserror::Error)]
#[error("{}: {}", path.display(), crate::one_line(&source.to_string()))]
struct BadConfig {
    path: PathBuf,
    #[source]
    source: toml::de::Error,
}

fn toml_file(path: &Path) -> Result<Option<toml::Table>, BadConfig> {
    match fs::read_to_string(path) {
        Ok(text) => text
            .parse::<toml::Table>()
            .map(Some)
            .map_err(|source| BadConfig {
                path: path.to_path_buf(),
                source,
            }),
        Err(_) => Ok(None),
    }
}

fn dig<'a>(t: &'a toml::Table, path: &[&str]) -> Option<&'a toml::Value> {
    let (last, head) = path.split_last()?;
    let mut cur = t;
    for k in head {
        cur = cur.get(*k)?.as_table()?;
    }
    cur.get(*last)
}

fn strings(v: Option<&toml::Value>) -> Option<Vec<String>> {
    Some(
        v?.as_array()?
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
    )
}

/// containerd's CDI settings from its config's text. Config version 3 is
/// containerd 2.x (CDI on by default); version 2 is read by 1.7 (off by
/// default) and by 2.x (on), so unset there is undecided.
pub fn containerd_cdi(table: &toml::Table, file: PathBuf) -> RuntimeCdi {
    let version = table
        .get("version")
        .and_then(toml::Value::as_integer)
        .unwrap_or(1);
    let section: &[&str] = if version >= 3 {
        &["plugins", "io.containerd.cri.v1.runtime"]
    } else {
        &["plugins", "io.containerd.grpc.v1.cri"]
    };
    let key = |k: &str| dig(table, &[section, &[k]].concat());
    RuntimeCdi {
        runtime: "containerd",
        file: Some(file),
        enabled: key("enable_cdi").and_then(toml::Value::as_bool),
        default_on: (version >= 3).then_some(true),
        spec_dirs: strings(key("cdi_spec_dirs")),
    }
}

/// CRI-O's CDI settings: always on; `[crio.runtime] cdi_spec_dirs`, the
/// drop-ins in crio.conf.d overriding crio.conf.
pub fn crio_cdi(tables: &[(PathBuf, toml::Table)]) -> RuntimeCdi {
    let mut out = RuntimeCdi {
        runtime: "CRI-O",
        file: tables.first().map(|(f, _)| f.clone()),
        enabled: None,
        default_on: Some(true),
        spec_dirs: None,
    };
    for (f, t) in tables {
        if let Some(d) = strings(dig(t, &["crio", "runtime", "cdi_spec_dirs"])) {
            out.spec_dirs = Some(d);
            out.file = Some(f.clone());
        }
    }
    out
}

/// The runtimes found below the root (config files, else binaries), or
/// the config that could not be parsed.
fn runtimes(root: &HostRoot) -> Result<Vec<RuntimeCdi>, BadConfig> {
    let mut out = Vec::new();
    let containerd_conf = root.join("etc/containerd/config.toml");
    match toml_file(&containerd_conf)? {
        Some(t) => out.push(containerd_cdi(&t, containerd_conf)),
        None => {
            if ["usr/bin/containerd", "usr/local/bin/containerd"]
                .iter()
                .any(|b| root.join(b).exists())
            {
                out.push(RuntimeCdi {
                    runtime: "containerd",
                    file: None,
                    enabled: None,
                    default_on: None,
                    spec_dirs: None,
                });
            }
        }
    }
    let mut crio = Vec::new();
    let main = root.join("etc/crio/crio.conf");
    if let Some(t) = toml_file(&main)? {
        crio.push((main, t));
    }
    let mut dropins: Vec<PathBuf> = fs::read_dir(root.join("etc/crio/crio.conf.d"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dropins.sort();
    for f in dropins {
        if let Some(t) = toml_file(&f)? {
            crio.push((f, t));
        }
    }
    if !crio.is_empty() || root.join("usr/bin/crio").exists() {
        out.push(crio_cdi(&crio));
    }
    Ok(out)
}

fn cdi_runtime(root: &HostRoot) -> Check {
    const NAME: &str = "dra.cdi-runtime";
    if let Some(c) = no_kubelet(root, NAME) {
        return c;
    }
    let found = match runtimes(root) {
        Ok(r) => r,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("unreadable runtime config {e}"),
                "fix the file's TOML; the runtime refuses it too",
            )
        }
    };
    if found.is_empty() {
        return Check::skip(
            NAME,
            "no containerd or CRI-O config or binary below the host root",
            "the DRA plugin's claims reach containers through CDI: the node's runtime must \
             have it on (containerd ≥ 1.7 with enable_cdi, CRI-O ≥ 1.23)",
        );
    }
    let mut problems = Vec::new();
    let mut undecided = Vec::new();
    let mut fine = Vec::new();
    for r in &found {
        let at = r
            .file
            .as_ref()
            .map(|f| format!(" ({})", f.display()))
            .unwrap_or_else(|| " (no config file: its defaults)".into());
        match (r.enabled, r.default_on) {
            (Some(false), _) => problems.push(format!("{}{at}: enable_cdi = false", r.runtime)),
            (None, None) => undecided.push(format!(
                "{}{at}: enable_cdi not set, on by default only from containerd 2.0",
                r.runtime
            )),
            _ => {
                let dirs = r
                    .spec_dirs
                    .clone()
                    .unwrap_or_else(|| DEFAULT_CDI_DIRS.map(String::from).to_vec());
                let reads = |d: &str| dirs.iter().any(|x| x.trim_end_matches('/') == d);
                if reads(CDI_DIR) || reads("/run/cdi") {
                    fine.push(format!(
                        "{}{at}: CDI on, reads {}",
                        r.runtime,
                        dirs.join(", ")
                    ));
                } else {
                    problems.push(format!(
                        "{}{at}: cdi_spec_dirs = [{}] leaves out {CDI_DIR}, where the DRA plugin \
                         writes its claims' specs",
                        r.runtime,
                        dirs.join(", ")
                    ));
                }
            }
        }
    }
    if !problems.is_empty() {
        return Check::fail(
            NAME,
            format!("CDI is off for DRA claims: {}", list(&problems, 2)),
            "containerd: enable_cdi = true and cdi_spec_dirs with /var/run/cdi under \
             [plugins.\"io.containerd.grpc.v1.cri\"] (config version 2) or \
             [plugins.'io.containerd.cri.v1.runtime'] (version 3); CRI-O: cdi_spec_dirs under \
             [crio.runtime]; then restart the runtime",
        );
    }
    if !undecided.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "CDI may be off: {} (containerd 1.7 leaves it off)",
                list(&undecided, 2)
            ),
            "set enable_cdi = true under [plugins.\"io.containerd.grpc.v1.cri\"] in \
             /etc/containerd/config.toml and restart containerd",
        );
    }
    Check::pass(NAME, list(&fine, 2))
}

/// The kubelet's feature gates as its config file and flags set them,
/// and where they were read.
pub fn kubelet_gates(root: &HostRoot) -> (BTreeMap<String, bool>, Vec<String>) {
    let mut gates = BTreeMap::new();
    let configs = readable(
        root,
        &[
            "var/lib/kubelet/config.yaml",
            "etc/kubernetes/kubelet-config.yaml",
            "etc/kubernetes/kubelet/config.json",
        ],
    );
    let flags = readable(
        root,
        &[
            "var/lib/kubelet/kubeadm-flags.env",
            "etc/default/kubelet",
            "etc/sysconfig/kubelet",
        ],
    );
    for (_, text) in &configs {
        let v: serde_yaml::Value = serde_yaml::from_str(text).unwrap_or_default();
        if let Some(m) = v.get("featureGates").and_then(|g| g.as_mapping()) {
            for (k, v) in m {
                if let (Some(k), Some(v)) = (k.as_str(), v.as_bool()) {
                    gates.insert(k.to_string(), v);
                }
            }
        }
    }
    // Flags win over the config file.
    for (_, text) in &flags {
        gates.extend(flag_gates(text));
    }
    let read = configs
        .iter()
        .chain(&flags)
        .map(|(rel, _)| format!("/{rel}"))
        .collect();
    (gates, read)
}

/// The files of `rels` below `root` that can be read: each path and text.
fn readable<'a>(root: &HostRoot, rels: &[&'a str]) -> Vec<(&'a str, String)> {
    rels.iter()
        .filter_map(|&rel| Some((rel, fs::read_to_string(root.join(rel)).ok()?)))
        .collect()
}

/// The gates of `--feature-gates=A=true,B=false` (or `--feature-gates A=…`)
/// in an environment file's text.
pub fn flag_gates(text: &str) -> BTreeMap<String, bool> {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == '"' || c == '\'')
        .filter(|w| !w.is_empty())
        .collect();
    let mut out = BTreeMap::new();
    for (i, w) in words.iter().enumerate() {
        let list = match w.split_once('=') {
            Some((k, v)) if k.ends_with("--feature-gates") => Some(v),
            None if w.ends_with("--feature-gates") => words.get(i + 1).copied(),
            _ => None,
        };
        for kv in list.into_iter().flat_map(|l| l.split(',')) {
            if let Some((k, v)) = kv.split_once('=') {
                if let Ok(b) = v.parse::<bool>() {
                    out.insert(k.to_string(), b);
                }
            }
        }
    }
    out
}

/// The Kubernetes minor version a kubeadm control-plane manifest on this
/// node names (`kube-apiserver:v1.36.0`), if any.
pub fn control_plane_minor(root: &HostRoot) -> Option<(u32, String)> {
    let text =
        fs::read_to_string(root.join("etc/kubernetes/manifests/kube-apiserver.yaml")).ok()?;
    let at = text.find("kube-apiserver:v")? + "kube-apiserver:v".len();
    let tag: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-' || *c == '+')
        .collect();
    let mut parts = tag.split('.');
    (parts.next()? == "1").then_some(())?;
    Some((parts.next()?.parse().ok()?, format!("v{tag}")))
}

fn feature_gates(root: &HostRoot) -> Check {
    const NAME: &str = "dra.feature-gates";
    if let Some(c) = no_kubelet(root, NAME) {
        return c;
    }
    let (gates, read) = kubelet_gates(root);
    let version = control_plane_minor(root);
    let from = if read.is_empty() {
        "no kubelet config or flags file found".to_string()
    } else {
        format!("read {}", list(&read, 3))
    };
    let unseen = "the control plane's gates (kube-apiserver, kube-scheduler, \
                  kube-controller-manager) are not visible from a node";
    let ver = match &version {
        Some((_, v)) => format!("control plane {v}"),
        None => "the Kubernetes version is not visible from this node's files".into(),
    };
    if gates.get(GATE_DRA) == Some(&false) {
        return Check::fail(
            NAME,
            format!("{GATE_DRA}=false for the kubelet ({from}): it never calls DRA plugins"),
            format!(
                "drop {GATE_DRA}=false (on by default from 1.34) on the kubelet and the control plane"
            ),
        );
    }
    if let Some((minor, v)) = &version {
        if *minor < 34 {
            return Check::fail(
                NAME,
                format!(
                    "control plane {v}: resource.k8s.io/v1, which the gpuslice DRA driver uses, \
                     is served from 1.34"
                ),
                "upgrade to Kubernetes 1.34 or later (1.36 for shared GPUs), or use the device \
                 plugin",
            );
        }
    }
    let capacity = match (gates.get(GATE_CAPACITY), &version) {
        (Some(false), _) => Some(format!("{GATE_CAPACITY}=false for the kubelet")),
        (None, Some((minor, v))) if *minor < 36 => Some(format!(
            "{GATE_CAPACITY} is alpha and off by default in {v}"
        )),
        _ => None,
    };
    if let Some(why) = capacity {
        return Check::warn(
            NAME,
            format!(
                "{why} ({from}): shared GPUs (gpu-shared.gpuslice.io) cannot be allocated; whole \
                 GPUs and MIG can"
            ),
            format!(
                "set {GATE_CAPACITY}=true on the kubelet, kube-apiserver, kube-scheduler and \
                 kube-controller-manager (beta and on by default from 1.36)"
            ),
        );
    }
    let state = |g: &str, default: &str| match gates.get(g) {
        Some(true) => format!("{g}=true"),
        _ => format!("{g} not turned off ({default})"),
    };
    Check::pass(
        NAME,
        format!(
            "{}, {} for the kubelet ({from}); {ver}; {unseen}",
            state(GATE_DRA, "on by default from 1.34"),
            state(GATE_CAPACITY, "on by default from 1.36")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{expect, Status};
    use gpuslice_dra::checkpoint::{Checkpoint, PreparedClaim, PreparedDevice};
    use gpuslice_dra::claim::{Allocated, DeviceKind};
    use gpuslice_ledger::limits::{ComputeShare, DeviceCaps, MemorySize};
    use gpuslice_testkit::temphost::TempHost;
    use std::os::unix::net::UnixListener;

    #[test]
    fn without_a_kubelet_every_check_says_so() {
        let root = TempHost::new().root();
        for c in [plugin(&root), cdi_runtime(&root), feature_gates(&root)] {
            expect(&c, Status::Skip, "no kubelet on this host");
        }
    }

    #[test]
    fn plugin_registration_and_sockets() {
        let h = TempHost::new();
        let root = h.root();
        h.mkdir("var/lib/kubelet/plugins_registry");
        let c = plugin(&root);
        expect(&c, Status::Skip, "");
        assert!(c.fix.contains("dra.enabled=true"), "{c:?}");

        let (reg, dra) = sockets(&root);
        assert!(reg.ends_with("plugins_registry/gpu.gpuslice.io-reg.sock"));
        assert!(dra.ends_with("plugins/gpu.gpuslice.io/dra.sock"));
        // A socket file nobody listens on: a plugin that died.
        drop(UnixListener::bind(&reg).unwrap());
        expect(&plugin(&root), Status::Fail, "nothing answers");

        // A socket that accepts and never answers GetInfo.
        fs::remove_file(&reg).unwrap();
        let silent = UnixListener::bind(&reg).unwrap();
        expect(&plugin(&root), Status::Fail, "GetInfo sent as the kubelet");
        drop(silent);

        // gpuslice's registration service, but no DRA socket.
        fs::remove_file(&reg).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let _reg = rt.block_on(async {
            gpuslice_dra::server::serve_registration(DRIVER.into(), &dra, &reg).unwrap()
        });
        expect(&plugin(&root), Status::Fail, "DRA socket");

        fs::create_dir_all(dra.parent().unwrap()).unwrap();
        let _dra = UnixListener::bind(&dra).unwrap();
        expect(&plugin(&root), Status::Pass, "");

        // The device plugin beside it on the same node.
        h.write("var/lib/kubelet/device-plugins/gpuslice-gpu.sock", "");
        expect(&plugin(&root), Status::Warn, "handed out twice");
    }

    /// What `check` says of a host with a kubelet and `files` (path
    /// relative to the root, text).
    fn check_on(check: fn(&HostRoot) -> Check, files: &[(&str, &str)]) -> Check {
        let h = TempHost::new();
        h.mkdir(KUBELET_DIR);
        for (rel, text) in files {
            h.write(rel, text);
        }
        check(&h.root())
    }

    fn cdi_on(files: &[(&str, &str)]) -> Check {
        check_on(cdi_runtime, files)
    }

    const CONTAINERD_2: &str =
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  snapshotter = 'overlayfs'\n";
    const CONTAINERD_17_ON: &str = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_cdi = true\n  cdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"]\n";

    #[test]
    fn cdi_in_the_runtime() {
        expect(&cdi_on(&[]), Status::Skip, "");
        // containerd 2.x: on by default.
        expect(
            &cdi_on(&[("etc/containerd/config.toml", CONTAINERD_2)]),
            Status::Pass,
            "/etc/cdi, /var/run/cdi",
        );
        expect(
            &cdi_on(&[("etc/containerd/config.toml", CONTAINERD_17_ON)]),
            Status::Pass,
            "",
        );
        // Version 2 without enable_cdi: off on 1.7, on on 2.x.
        let c = cdi_on(&[(
            "etc/containerd/config.toml",
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:3.10\"\n",
        )]);
        expect(&c, Status::Warn, "");
        assert!(c.fix.contains("enable_cdi = true"), "{c:?}");
        expect(&cdi_on(&[("usr/bin/containerd", "")]), Status::Warn, "");
        // Turned off, or not reading the plugin's directory.
        expect(
            &cdi_on(&[(
                "etc/containerd/config.toml",
                "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_cdi = false\n",
            )]),
            Status::Fail,
            "enable_cdi = false",
        );
        expect(
            &cdi_on(&[(
                "etc/containerd/config.toml",
                &CONTAINERD_17_ON.replace(", \"/var/run/cdi\"", ""),
            )]),
            Status::Fail,
            "leaves out /var/run/cdi",
        );
        expect(
            &cdi_on(&[("etc/containerd/config.toml", "version = [")]),
            Status::Fail,
            "unreadable",
        );
        // CRI-O: always on; a drop-in overrides crio.conf's directories.
        expect(
            &cdi_on(&[(
                "etc/crio/crio.conf",
                "[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\"]\n",
            )]),
            Status::Fail,
            "",
        );
        expect(
            &cdi_on(&[
                (
                    "etc/crio/crio.conf",
                    "[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\"]\n",
                ),
                (
                    "etc/crio/crio.conf.d/10-cdi.conf",
                    "[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"]\n",
                ),
            ]),
            Status::Pass,
            "CRI-O",
        );
    }

    fn gates_on(files: &[(&str, &str)]) -> Check {
        check_on(feature_gates, files)
    }

    const APISERVER: &str = "spec:\n  containers:\n  - name: kube-apiserver\n    image: registry.k8s.io/kube-apiserver:v1.VERSION\n";

    #[test]
    fn feature_gates_for_the_kubelets_version() {
        // Nothing set, version unknown: the defaults, and what is unseen.
        let c = gates_on(&[]);
        expect(&c, Status::Pass, "not visible from this node");
        assert!(c.detail.contains("control plane's gates"), "{c:?}");
        expect(
            &gates_on(&[(
                "etc/kubernetes/manifests/kube-apiserver.yaml",
                &APISERVER.replace("VERSION", "36.0"),
            )]),
            Status::Pass,
            "control plane v1.36.0",
        );
        // 1.35: consumable capacity is alpha, off unless turned on.
        let v135 = APISERVER.replace("VERSION", "35.2");
        expect(
            &gates_on(&[("etc/kubernetes/manifests/kube-apiserver.yaml", &v135)]),
            Status::Warn,
            "alpha and off by default in v1.35.2",
        );
        expect(
            &gates_on(&[
                ("etc/kubernetes/manifests/kube-apiserver.yaml", &v135),
                (
                    "var/lib/kubelet/config.yaml",
                    "kind: KubeletConfiguration\nfeatureGates:\n  DRAConsumableCapacity: true\n",
                ),
            ]),
            Status::Pass,
            "DRAConsumableCapacity=true",
        );
        // Before 1.34 there is no resource.k8s.io/v1.
        expect(
            &gates_on(&[(
                "etc/kubernetes/manifests/kube-apiserver.yaml",
                &APISERVER.replace("VERSION", "33.4"),
            )]),
            Status::Fail,
            "",
        );
        // Turned off in the config file, or by a flag that wins over it.
        expect(
            &gates_on(&[(
                "var/lib/kubelet/config.yaml",
                "featureGates:\n  DynamicResourceAllocation: false\n",
            )]),
            Status::Fail,
            "",
        );
        expect(&gates_on(&[
            (
                "var/lib/kubelet/config.yaml",
                "featureGates:\n  DRAConsumableCapacity: true\n",
            ),
            (
                "var/lib/kubelet/kubeadm-flags.env",
                "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock --feature-gates=DRAConsumableCapacity=false,Foo=true\"\n",
            ),
        ]), Status::Warn, "DRAConsumableCapacity=false");
    }

    fn prepare(dir: &Path, claims: &[(&str, DeviceKind, Option<u64>)]) {
        let mut cp = Checkpoint::load(dir).unwrap();
        for (name, kind, mib) in claims {
            let uid = format!("uid-{name}");
            let device = match kind {
                DeviceKind::Whole { gpu } => format!("gpu-{gpu}"),
                DeviceKind::Shared { gpu } => format!("gpu-{gpu}-shared"),
                DeviceKind::Mig { gpu, mig } => format!("gpu-{gpu}-mig-{mig}"),
            };
            cp.claims.insert(
                uid.clone(),
                PreparedClaim {
                    namespace: "team-a".into(),
                    name: name.to_string(),
                    uid: uid.clone(),
                    resource_version: None,
                    devices: vec![PreparedDevice {
                        allocated: Allocated {
                            request: "gpu".into(),
                            pool: "node-a".into(),
                            device,
                            share_id: None,
                            kind: *kind,
                            caps: mib.map(|m| DeviceCaps {
                                memory: MemorySize(m << 20),
                                compute: ComputeShare::from_whole_percent(30),
                            }),
                        },
                        cdi_device_id: format!("gpuslice.dev/claim={uid}-0"),
                    }],
                    cdi_spec: dir.join(format!("{uid}.json")),
                    records: vec![],
                    slice_dirs: vec![],
                    unenforceable: vec![],
                },
            );
        }
        cp.save().unwrap();
    }

    #[test]
    fn prepared_claims() {
        let tmp = tempfile::tempdir().unwrap();
        let gpus: Vec<Gpu> = (0..2)
            .map(|index| Gpu {
                index,
                memory_bytes: Some(80 << 30),
                ..Default::default()
            })
            .collect();
        expect(&claims(tmp.path(), &gpus), Status::Skip, "");
        prepare(
            tmp.path(),
            &[
                ("train", DeviceKind::Shared { gpu: 0 }, Some(20480)),
                ("eval", DeviceKind::Shared { gpu: 0 }, Some(40960)),
                ("big", DeviceKind::Whole { gpu: 1 }, None),
            ],
        );
        let c = claims(tmp.path(), &gpus);
        expect(&c, Status::Pass, "");
        assert!(
            c.detail.starts_with("3 claim(s) prepared, 3 slice(s)"),
            "{c:?}"
        );
        assert!(
            c.detail
                .contains("team-a/train on gpu-0-shared 20480 MiB, 30 %"),
            "{c:?}"
        );
        assert!(
            c.detail.contains("team-a/big on gpu-1,") || c.detail.ends_with("team-a/big on gpu-1"),
            "{c:?}"
        );
        // GPU 1 gone from the host.
        expect(
            &claims(tmp.path(), &gpus[..1]),
            Status::Warn,
            "team-a/big holds GPU 1",
        );
        // More capped memory than the GPU has.
        prepare(
            tmp.path(),
            &[("more", DeviceKind::Shared { gpu: 0 }, Some(30720))],
        );
        let c = claims(tmp.path(), &gpus);
        expect(&c, Status::Fail, "");
        assert!(
            c.detail
                .contains("GPU 0: the claims' caps add up to 92160 MiB of its 81920 MiB"),
            "{c:?}"
        );
        // A checkpoint the plugin cannot read.
        fs::write(tmp.path().join(gpuslice_dra::checkpoint::FILE), "{not json").unwrap();
        expect(&claims(tmp.path(), &gpus), Status::Fail, "unreadable");
    }

    #[test]
    fn flags() {
        let g = flag_gates("KUBELET_EXTRA_ARGS='--v=2 --feature-gates A=true,B=false'");
        assert_eq!(g, BTreeMap::from([("A".into(), true), ("B".into(), false)]));
        assert!(flag_gates("KUBELET_EXTRA_ARGS=--feature-gates=A=maybe").is_empty());
    }
}
