//! The device plugin's YAML config file.
//!
//! ```yaml
//! prefix: nvidia.com               # resource names: <prefix>/gpu, <prefix>/gpu.shared, <prefix>/mig-<profile>
//! pluginDir: /var/lib/kubelet/device-plugins
//! shim: /usr/local/lib/gpuslice/libgpuslice.so   # host path of the shim mounted into shared replicas
//! ledgerDir: /run/gpuslice/slices  # host dir; each shared allocation gets <ledgerDir>/<slice>/
//! stateDir: /run/gpuslice/device-plugin  # host dir for the ld.so.preload file mounted into shared replicas
//! boardDir: /run/gpuslice/gpus     # host dir of the GPUs' boards (compute use), mounted into shared replicas
//! stripHostRoot: false             # DeviceSpec/Mount host paths relative to --host-root
//! refuseUnenforceable: false       # kill a replica's GPU process that can escape any cap (privileged,
//!                                  # CAP_SYS_ADMIN, hostPID/IPC/Network); false: flag it
//! roles:                           # each GPU gets exactly one role (see [`super::roles`])
//!   - gpus: [0, 1]                 # indices, ranges (0-1), GPU-<uuid> (unique prefix), PCI bus ids
//!     role: whole                  # whole | shared | mig
//!   - gpus: others                 # every GPU with MIG off that no entry names
//!     role: shared
//!     replicas: 4                  # shared only: 2 to 100
//!     resource: gpu.shared         # optional: the resource's name after the prefix
//! sharing:
//!   spread: false                  # GetPreferredAllocation: spread replicas over GPUs instead of packing
//!   computeMode: cap               # cap: a replica never passes 1/replicas of the GPU's time;
//!                                  # guaranteed: it may also use time the others leave idle
//! strategies:
//!   mig: mixed                     # mixed: <prefix>/mig-<profile>; none
//!   cdi: false                     # answer Allocate with cdi_devices as well
//!   cdiKind: gpuslice.dev/gpu
//! health:
//!   enabled: true
//!   recoverAfterSeconds: 60        # healthy again after answering normally this long
//!   ignoredXids: [13, 31, 43, 45, 68, 109]
//! driverPartitions:                # the driver's memory partitions (R615+) for shared replicas (see [`super::partitions`])
//!   enabled: false                 # answer a shared Allocate with the replica's CDI device as well
//!   hook: /usr/local/lib/gpuslice/gpuslice  # the gpuslice binary the runtime runs as the hooks (host path)
//!   cdiDir: /var/run/cdi           # the runtime's CDI spec directory, where the replicas' spec is written
//!   cdiKind: gpuslice.dev/replica
//! ledgerCleanup:                   # remove a shared replica's ledger dir once its pod is gone
//!   enabled: true
//!   intervalSeconds: 30
//!   graceSeconds: 60               # never a dir Allocate prepared less than this ago
//!   podResourcesSocket: /var/lib/kubelet/pod-resources/kubelet.sock
//! ```
//! Every field is optional. A field that is not one of these is an error
//! naming its path (`strategies.cdii`, `roles[1].replica`).
//!
//! Before per-GPU roles, `sharing.replicas` and `strategies.whole` offered
//! every GPU both whole and shared at once. Without `roles` they are still
//! read when they say one thing ([`Config::roles`]); both together is an
//! error that says how to write it as roles.

use anyhow::{anyhow, bail, Context, Result};
use gpuslice_ledger::limits::Mode;
use serde::Deserialize;
use serde_yaml::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
pub const DEFAULT_SHIM: &str = "/usr/local/lib/gpuslice/libgpuslice.so";
pub const DEFAULT_LEDGER_DIR: &str = "/run/gpuslice/slices";
pub const DEFAULT_STATE_DIR: &str = "/run/gpuslice/device-plugin";
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Where the DaemonSet installs the `gpuslice` binary the runtime runs as
/// the replicas' memory-limit hooks (beside the shim).
pub const DEFAULT_HOOK: &str = "/usr/local/lib/gpuslice/gpuslice";
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
/// The `health` section: the XID watcher's settings (gpuslice-health).
pub use gpuslice_health::{Config as Health, APPLICATION_XIDS};
/// Replicas a shared GPU may be cut into.
pub const REPLICAS: std::ops::RangeInclusive<u32> = 2..=100;
/// Resource names (after the prefix) of the roles, unless a rule names its own.
pub const WHOLE_RESOURCE: &str = "gpu";
pub const SHARED_RESOURCE: &str = "gpu.shared";

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    pub prefix: String,
    pub plugin_dir: PathBuf,
    pub shim: PathBuf,
    pub ledger_dir: PathBuf,
    pub state_dir: PathBuf,
    pub board_dir: PathBuf,
    pub strip_host_root: bool,
    /// Kill a shared replica's GPU process that can escape any cap
    /// (`CAP_SYS_ADMIN`, the host's PID, IPC or network namespace: a
    /// privileged or host-namespace pod); off: flagged only.
    pub refuse_unenforceable: bool,
    /// Per-GPU roles; empty: see [`Config::roles`].
    pub roles: Vec<RoleRule>,
    pub sharing: Sharing,
    pub strategies: Strategies,
    pub health: Health,
    pub ledger_cleanup: LedgerCleanup,
    pub driver_partitions: DriverPartitions,
}

/// One entry of `roles`: these GPUs get this role.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoleRule {
    pub gpus: GpuRefs,
    pub role: RoleName,
    /// Shared only.
    #[serde(default)]
    pub replicas: Option<u32>,
    /// The resource name after the prefix; None: `gpu` or `gpu.shared`.
    #[serde(default)]
    pub resource: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleName {
    Whole,
    Shared,
    Mig,
}

/// `others`, or a list of GPU references (indices, ranges, UUIDs, PCI bus ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuRefs {
    Others,
    List(Vec<String>),
}

impl<'de> Deserialize<'de> for GpuRefs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let scalar = |v: &Value| match v {
            Value::Number(n) => Some(n.to_string()),
            Value::String(s) => Some(s.clone()),
            _ => None,
        };
        let want = "expected `others` or a list of GPU indices, UUIDs or PCI bus ids";
        match Value::deserialize(d)? {
            Value::String(s) if s == "others" => Ok(GpuRefs::Others),
            Value::Sequence(items) if !items.is_empty() => items
                .iter()
                .map(|v| scalar(v).ok_or_else(|| D::Error::custom(want)))
                .collect::<Result<_, _>>()
                .map(GpuRefs::List),
            v => scalar(&v)
                .map(|s| GpuRefs::List(vec![s]))
                .ok_or_else(|| D::Error::custom(want)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Sharing {
    /// Before roles: replicas of every GPU (0: none). Read only without `roles`.
    pub replicas: Option<u32>,
    pub spread: bool,
    /// How a replica's compute share applies (docs/compute-share.md).
    #[serde(deserialize_with = "compute_mode")]
    pub compute_mode: Mode,
}

/// `computeMode`, read by the slice contract's own parser.
fn compute_mode<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Mode, D::Error> {
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    None,
    Mixed,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Strategies {
    /// Before roles: offer every GPU whole. Read only without `roles`.
    pub whole: Option<bool>,
    pub mig: MigStrategy,
    pub cdi: bool,
    pub cdi_kind: String,
}

/// The driver's memory partitions for shared replicas, set by the hooks
/// of a CDI device that Allocate names (see [`super::partitions`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DriverPartitions {
    pub enabled: bool,
    /// The `gpuslice` binary the runtime runs as root as the hooks.
    pub hook: PathBuf,
    /// The runtime's CDI spec directory.
    pub cdi_dir: PathBuf,
    pub cdi_kind: String,
}

/// The sweep that removes the ledger directories of pods that are gone
/// (see [`super::ledgers`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LedgerCleanup {
    pub enabled: bool,
    pub interval_seconds: u64,
    pub grace_seconds: u64,
    pub pod_resources_socket: PathBuf,
}

/// The system directory `p` is or lies in (where gpuslice has no business
/// making, replacing or mounting files), if any.
fn system_dir(p: &std::path::Path) -> Option<String> {
    const SYSTEM: [&str; 16] = [
        "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/boot", "/dev", "/proc",
        "/sys", "/root", "/home", "/opt", "/srv", "/snap",
    ];
    let p: std::path::PathBuf = p
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .collect();
    const BARE: [&str; 5] = ["/", "/run", "/var", "/tmp", "/var/lib"];
    if BARE.iter().any(|b| p == std::path::Path::new(b)) {
        return Some(format!("{} itself", p.display()));
    }
    SYSTEM
        .iter()
        .find(|s| p.starts_with(s))
        .map(|s| format!("in {s}"))
}

impl Default for Config {
    fn default() -> Self {
        Config {
            prefix: "nvidia.com".into(),
            plugin_dir: DEFAULT_PLUGIN_DIR.into(),
            shim: DEFAULT_SHIM.into(),
            ledger_dir: DEFAULT_LEDGER_DIR.into(),
            state_dir: DEFAULT_STATE_DIR.into(),
            board_dir: gpuslice_ledger::board::DEFAULT_BOARD_DIR.into(),
            strip_host_root: false,
            refuse_unenforceable: false,
            roles: Vec::new(),
            sharing: Sharing::default(),
            strategies: Strategies::default(),
            health: Health::default(),
            ledger_cleanup: LedgerCleanup::default(),
            driver_partitions: DriverPartitions::default(),
        }
    }
}

impl Default for Sharing {
    fn default() -> Self {
        Sharing {
            replicas: None,
            spread: false,
            compute_mode: Mode::Cap,
        }
    }
}

impl Default for Strategies {
    fn default() -> Self {
        Strategies {
            whole: None,
            mig: MigStrategy::Mixed,
            cdi: false,
            cdi_kind: format!(
                "{}/{}",
                gpuslice_cdi::DEFAULT_VENDOR,
                gpuslice_cdi::DEFAULT_CLASS
            ),
        }
    }
}

impl Default for DriverPartitions {
    fn default() -> Self {
        DriverPartitions {
            enabled: false,
            hook: DEFAULT_HOOK.into(),
            cdi_dir: DEFAULT_CDI_DIR.into(),
            cdi_kind: format!("{}/replica", gpuslice_cdi::DEFAULT_VENDOR),
        }
    }
}

impl Default for LedgerCleanup {
    fn default() -> Self {
        LedgerCleanup {
            enabled: true,
            interval_seconds: 30,
            grace_seconds: 60,
            pod_resources_socket: DEFAULT_POD_RESOURCES_SOCKET.into(),
        }
    }
}

/// The known keys of each mapping, by path ("" is the top level; `x[]`:
/// each item of the list `x`).
const SCHEMA: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "prefix",
            "pluginDir",
            "shim",
            "ledgerDir",
            "stateDir",
            "boardDir",
            "stripHostRoot",
            "refuseUnenforceable",
            "roles",
            "sharing",
            "strategies",
            "health",
            "ledgerCleanup",
            "driverPartitions",
        ],
    ),
    (
        "driverPartitions",
        &["enabled", "hook", "cdiDir", "cdiKind"],
    ),
    ("roles[]", &["gpus", "role", "replicas", "resource"]),
    ("sharing", &["replicas", "spread", "computeMode"]),
    ("strategies", &["whole", "mig", "cdi", "cdiKind"]),
    ("health", &["enabled", "recoverAfterSeconds", "ignoredXids"]),
    (
        "ledgerCleanup",
        &[
            "enabled",
            "intervalSeconds",
            "graceSeconds",
            "podResourcesSocket",
        ],
    ),
];

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("config {}", path.display()))
    }

    /// Parses and validates YAML text; an empty document is the defaults.
    pub fn parse(text: &str) -> Result<Self> {
        let value: Value = serde_yaml::from_str(text).context("not valid YAML")?;
        let value = match value {
            Value::Null => Value::Mapping(Default::default()),
            v => v,
        };
        check_keys(&value, "")?;
        locate_role_errors(&value)?;
        let cfg: Config = serde_yaml::from_value(value.clone())
            .map_err(|e| anyhow!("{}: {e}", locate(&value, &[]).unwrap_or_else(|| ".".into())))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<()> {
        let label = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
                && !s.starts_with(['-', '.'])
                && !s.ends_with(['-', '.'])
        };
        if !label(&self.prefix) {
            bail!(
                "prefix: {:?} is not a DNS subdomain (lower-case letters, digits, '-', '.')",
                self.prefix
            );
        }
        for (name, kind) in [
            ("strategies.cdiKind", &self.strategies.cdi_kind),
            ("driverPartitions.cdiKind", &self.driver_partitions.cdi_kind),
        ] {
            if !kind.contains('/') {
                bail!("{name}: {kind:?} is not <vendor>/<class>");
            }
        }
        for (name, p) in [
            ("pluginDir", &self.plugin_dir),
            ("shim", &self.shim),
            ("ledgerDir", &self.ledger_dir),
            ("stateDir", &self.state_dir),
            ("boardDir", &self.board_dir),
            (
                "ledgerCleanup.podResourcesSocket",
                &self.ledger_cleanup.pod_resources_socket,
            ),
            ("driverPartitions.hook", &self.driver_partitions.hook),
            ("driverPartitions.cdiDir", &self.driver_partitions.cdi_dir),
        ] {
            if !p.is_absolute() {
                bail!("{name}: {} is not an absolute path", p.display());
            }
        }
        // Directories root makes files in, removes and replaces what it did
        // not make in (boards), and bind-mounts into tenants' containers:
        // never one of the system's own.
        for (name, p) in [
            ("ledgerDir", &self.ledger_dir),
            ("stateDir", &self.state_dir),
            ("boardDir", &self.board_dir),
        ] {
            if let Some(sys) = system_dir(p) {
                bail!(
                    "{name}: {} is {sys}, a directory of the system's; gpuslice's own is required (e.g. /run/gpuslice/...)",
                    p.display()
                );
            }
        }
        if self.ledger_cleanup.interval_seconds == 0 {
            bail!("ledgerCleanup.intervalSeconds: 0 (at least 1; `enabled: false` turns the sweep off)");
        }
        self.check_legacy()?;
        self.check_roles()
    }

    /// The role rules in force: `roles`, or the one the pre-roles fields
    /// say, or (nothing set) every GPU whole.
    pub fn roles(&self) -> Vec<RoleRule> {
        if !self.roles.is_empty() {
            return self.roles.clone();
        }
        let replicas = self.sharing.replicas.unwrap_or(0);
        let rule = if replicas > 0 {
            RoleRule {
                gpus: GpuRefs::Others,
                role: RoleName::Shared,
                replicas: Some(replicas),
                resource: None,
            }
        } else {
            RoleRule {
                gpus: GpuRefs::Others,
                role: RoleName::Whole,
                replicas: None,
                resource: None,
            }
        };
        vec![rule]
    }

    /// `sharing.replicas` and `strategies.whole`, from before roles.
    fn check_legacy(&self) -> Result<()> {
        let (replicas, whole) = (self.sharing.replicas, self.strategies.whole);
        if !self.roles.is_empty() {
            if let Some(r) = replicas {
                bail!("sharing.replicas: {r} is replaced by `roles` (roles[].replicas of a shared role); remove it");
            }
            if let Some(w) = whole {
                bail!("strategies.whole: {w} is replaced by `roles` (role: whole); remove it");
            }
            return Ok(());
        }
        match (replicas, whole.unwrap_or(true)) {
            (Some(r), _) if r == 1 || r > *REPLICAS.end() => bail!(
                "sharing.replicas: {r} (0 for no shared GPUs, or 2 to 100)"
            ),
            (Some(r), true) if r > 0 => bail!(
                "sharing.replicas: {r} with strategies.whole offers every GPU both whole and shared, \
                 so two pods could get one GPU. Give each GPU one role instead, e.g. \
                 `roles: [{{gpus: [0, 1], role: whole}}, {{gpus: others, role: shared, replicas: {r}}}]`, \
                 and remove sharing.replicas and strategies.whole (docs/kubernetes.md, Roles)"
            ),
            (None | Some(0), false) => bail!(
                "strategies.whole: false with no shared replicas offers no GPU; \
                 use `roles` (docs/kubernetes.md, Roles)"
            ),
            _ => Ok(()),
        }
    }

    /// What can be checked without the GPUs: replica counts, one `others`,
    /// a literal reference in one rule only, resource names.
    fn check_roles(&self) -> Result<()> {
        let mut others = None;
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        // resource name -> (role, replicas, the rule that set them)
        let mut resources: BTreeMap<String, (RoleName, Option<u32>, String)> = BTreeMap::new();
        for (i, r) in self.roles.iter().enumerate() {
            let at = format!("roles[{i}]");
            match (r.role, r.replicas) {
                (RoleName::Shared, None) => {
                    bail!("{at}.replicas: missing; a shared role needs 2 to 100 replicas")
                }
                (RoleName::Shared, Some(n)) if !REPLICAS.contains(&n) => {
                    bail!("{at}.replicas: {n} (a shared role needs 2 to 100 replicas)")
                }
                (RoleName::Whole | RoleName::Mig, Some(_)) => {
                    bail!("{at}.replicas: only a shared role has replicas")
                }
                _ => {}
            }
            if r.role == RoleName::Mig {
                if r.resource.is_some() {
                    bail!("{at}.resource: MIG devices are offered as <prefix>/mig-<profile>; remove it");
                }
                if self.strategies.mig == MigStrategy::None {
                    bail!("{at}.role: mig while strategies.mig is none");
                }
            }
            match &r.gpus {
                GpuRefs::Others => {
                    if let Some(o) = others.replace(i) {
                        bail!("{at}.gpus: `others` already in roles[{o}]; only one rule takes the others");
                    }
                }
                GpuRefs::List(items) => {
                    for (j, item) in items.iter().enumerate() {
                        let here = format!("{at}.gpus[{j}]");
                        let key = item.trim().to_ascii_lowercase();
                        if matches!(key.as_str(), "all" | "none" | "") || key.starts_with("mig-") {
                            bail!("{here}: {item:?}; give GPU indices, ranges, GPU-<uuid> or PCI bus ids (`others` for the rest)");
                        }
                        if let Some(first) = seen.insert(key, here.clone()) {
                            bail!("{here}: {item:?} already has a role from {first}; a GPU gets one role");
                        }
                    }
                }
            }
            if r.role == RoleName::Mig {
                continue;
            }
            let name = r.resource.clone().unwrap_or_else(|| {
                match r.role {
                    RoleName::Shared => SHARED_RESOURCE,
                    _ => WHOLE_RESOURCE,
                }
                .to_string()
            });
            if !valid_name_part(&name) || name.starts_with("mig-") {
                bail!("{at}.resource: {name:?} is not a resource name (letters, digits, '-', '_', '.'; not mig-*)");
            }
            if let Some((role, replicas, first)) = resources.get(&name) {
                if *role != r.role || *replicas != r.replicas {
                    bail!(
                        "{at}: {}/{name} is already offered by {first} as {}; one resource holds one role \
                         and one replica count (set `resource:` to name another)",
                        self.prefix,
                        describe(*role, *replicas)
                    );
                }
            } else {
                resources.insert(name, (r.role, r.replicas, at));
            }
        }
        Ok(())
    }
}

/// The name part of a qualified Kubernetes name (a resource's name after
/// the prefix): 1-63 of `A-Z a-z 0-9 - _ .`, alphanumeric at both ends.
pub fn valid_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

fn describe(role: RoleName, replicas: Option<u32>) -> String {
    match (role, replicas) {
        (RoleName::Shared, Some(n)) => format!("shared with {n} replicas"),
        (RoleName::Shared, None) => "shared".into(),
        (RoleName::Whole, _) => "whole".into(),
        (RoleName::Mig, _) => "mig".into(),
    }
}

/// Each `roles` item alone, so that a bad value is named by its path
/// (`roles[1].role`), not only as `roles`.
fn locate_role_errors(v: &Value) -> Result<()> {
    let Some(Value::Sequence(items)) = v.get("roles") else {
        if let Some(other) = v.get("roles") {
            if !other.is_null() {
                bail!("roles: expected a list of {{gpus, role}} entries");
            }
        }
        return Ok(());
    };
    for (i, item) in items.iter().enumerate() {
        if let Err(e) = serde_yaml::from_value::<RoleRule>(item.clone()) {
            let field = item.as_mapping().and_then(|m| {
                m.iter().find_map(|(k, child)| {
                    let mut only = serde_yaml::Mapping::new();
                    only.insert(k.clone(), child.clone());
                    // Complete the required fields with good values, so
                    // only this field can fail.
                    for (rk, rv) in [("gpus", "others"), ("role", "whole")] {
                        let rk = Value::String(rk.into());
                        only.entry(rk).or_insert(Value::String(rv.into()));
                    }
                    serde_yaml::from_value::<RoleRule>(Value::Mapping(only))
                        .is_err()
                        .then(|| k.as_str().unwrap_or("?").to_string())
                })
            });
            match field {
                Some(f) => bail!("roles[{i}].{f}: {e}"),
                None => bail!("roles[{i}]: {e}"),
            }
        }
    }
    Ok(())
}

/// The dotted path of the deepest value that alone fails to deserialize.
fn locate(v: &Value, path: &[String]) -> Option<String> {
    let Value::Mapping(m) = v else { return None };
    for (k, child) in m {
        let Some(k) = k.as_str() else { continue };
        let mut p = path.to_vec();
        p.push(k.to_string());
        // A document with only this key (and the path above it).
        let mut only = child.clone();
        for key in p.iter().rev() {
            let mut m = serde_yaml::Mapping::new();
            m.insert(Value::String(key.clone()), only);
            only = Value::Mapping(m);
        }
        if serde_yaml::from_value::<Config>(only).is_err() {
            return locate(child, &p).or_else(|| Some(p.join(".")));
        }
    }
    None
}

/// Unknown keys, with their dotted path, before serde sees them (serde's
/// own message names the field but not where it is).
fn check_keys(v: &Value, path: &str) -> Result<()> {
    if let Value::Sequence(items) = v {
        let list = format!("{path}[]");
        if SCHEMA.iter().any(|(p, _)| *p == list) {
            for (i, item) in items.iter().enumerate() {
                check_item_keys(item, &list, &format!("{path}[{i}]"))?;
            }
        }
        return Ok(());
    }
    check_item_keys(v, path, path)
}

/// The keys of `v`, a mapping of schema `schema`, shown as `path`.
fn check_item_keys(v: &Value, schema: &str, path: &str) -> Result<()> {
    let Some(known) = SCHEMA.iter().find(|(p, _)| *p == schema).map(|(_, k)| *k) else {
        return Ok(());
    };
    let Value::Mapping(m) = v else {
        let at = if path.is_empty() {
            "the top level"
        } else {
            path
        };
        bail!("{at}: expected a mapping");
    };
    for (k, child) in m {
        let Some(k) = k.as_str() else {
            bail!(
                "{}: a key is not a string",
                if path.is_empty() { "." } else { path }
            );
        };
        let full = if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        };
        if !known.contains(&k) {
            bail!("{full}: unknown field (known here: {})", known.join(", "));
        }
        // Nested schemas are by key path; list items are not nested further.
        if schema == path {
            check_keys(child, &full)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_defaults() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
        assert_eq!(Config::parse("{}").unwrap(), Config::default());
    }

    #[test]
    fn fields_parse() {
        let c = Config::parse(
            "prefix: example.com\nsharing: {spread: true}\n\
             roles: [{gpus: [0, GPU-ab], role: whole}, {gpus: others, role: shared, replicas: 8}]\n\
             strategies: {cdi: true, mig: none}\nhealth: {recoverAfterSeconds: 5}\n",
        )
        .unwrap();
        assert_eq!(c.prefix, "example.com");
        assert_eq!(c.roles.len(), 2);
        assert_eq!(
            c.roles[0].gpus,
            GpuRefs::List(vec!["0".into(), "GPU-ab".into()])
        );
        assert_eq!(c.roles[1].gpus, GpuRefs::Others);
        assert_eq!(c.roles[1].replicas, Some(8));
        assert!(c.sharing.spread && c.strategies.cdi);
        assert_eq!(c.strategies.mig, MigStrategy::None);
        assert_eq!(c.health.recover_after_seconds, 5);
        assert_eq!(c.health.ignored_xids, APPLICATION_XIDS.to_vec());
        assert_eq!(c.roles(), c.roles);
    }

    #[test]
    fn without_roles_every_gpu_is_whole_or_the_legacy_fields_say_one_role() {
        let whole = Config::parse("").unwrap().roles();
        assert_eq!((whole.len(), whole[0].role), (1, RoleName::Whole));
        assert_eq!(whole[0].gpus, GpuRefs::Others);
        let c = Config::parse("sharing: {replicas: 0}").unwrap();
        assert_eq!(c.roles()[0].role, RoleName::Whole);
        let c = Config::parse("sharing: {replicas: 3}\nstrategies: {whole: false}").unwrap();
        let r = c.roles();
        assert_eq!((r[0].role, r[0].replicas), (RoleName::Shared, Some(3)));
    }

    #[test]
    fn a_gpu_in_two_roles_or_a_bad_role_is_refused_with_its_path() {
        for (text, want) in [
            // The old shape that offered every GPU twice: a migration hint.
            ("sharing: {replicas: 4}", "sharing.replicas: 4 with strategies.whole"),
            ("sharing: {replicas: 4}", "roles: [{gpus: [0, 1], role: whole}"),
            ("strategies: {whole: false}", "strategies.whole: false"),
            (
                "roles: [{gpus: others, role: whole}]\nsharing: {replicas: 2}",
                "sharing.replicas: 2 is replaced by `roles`",
            ),
            (
                "roles: [{gpus: [0], role: whole}, {gpus: [1, 0], role: shared, replicas: 2}]",
                "roles[1].gpus[1]: \"0\" already has a role from roles[0].gpus[0]",
            ),
            (
                "roles: [{gpus: others, role: whole}, {gpus: others, role: mig}]",
                "roles[1].gpus: `others` already in roles[0]",
            ),
            (
                "roles: [{gpus: [0], role: shared, replicas: 0}]",
                "roles[0].replicas: 0",
            ),
            ("roles: [{gpus: [0], role: shared}]", "roles[0].replicas: missing"),
            (
                "roles: [{gpus: [0], role: whole, replicas: 2}]",
                "roles[0].replicas: only a shared role",
            ),
            ("roles: [{gpus: [0], role: hole}]", "roles[0].role: unknown variant `hole`"),
            ("roles: [{gpus: [0], role: whole, replica: 2}]", "roles[0].replica: unknown field"),
            ("roles: [{gpus: {a: 1}, role: whole}]", "roles[0].gpus: expected `others`"),
            ("roles: [{gpus: [all], role: whole}]", "roles[0].gpus[0]: \"all\""),
            ("roles: [{role: whole}]", "roles[0]: missing field `gpus`"),
            ("roles: {gpus: [0]}", "roles: expected a list"),
            (
                "roles: [{gpus: [0], role: shared, replicas: 2}, {gpus: [1], role: shared, replicas: 4}]",
                "roles[1]: nvidia.com/gpu.shared is already offered by roles[0] as shared with 2 replicas",
            ),
            (
                "roles: [{gpus: [0], role: whole, resource: gpu.shared}, {gpus: [1], role: shared, replicas: 4}]",
                "roles[1]: nvidia.com/gpu.shared is already offered by roles[0] as whole",
            ),
            ("roles: [{gpus: [0], role: whole, resource: mig-x}]", "roles[0].resource"),
            ("roles: [{gpus: [0], role: whole, resource: a/b}]", "roles[0].resource"),
            (
                "roles: [{gpus: [3], role: mig}]\nstrategies: {mig: none}",
                "roles[0].role: mig while strategies.mig is none",
            ),
        ] {
            let e = format!("{:#}", Config::parse(text).unwrap_err());
            assert!(e.contains(want), "{text}: {e}");
        }
        // Two shared resources of their own replica counts are fine.
        Config::parse(
            "roles: [{gpus: [0], role: shared, replicas: 2}, \
             {gpus: [1], role: shared, replicas: 4, resource: gpu.shared-4}]",
        )
        .unwrap();
    }

    #[test]
    fn unknown_field_names_its_path() {
        let e = Config::parse("strategies:\n  cdii: true\n").unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("strategies.cdii: unknown field"), "{msg}");
        let e = Config::parse("sharin: {}\n").unwrap_err();
        assert!(format!("{e:#}").contains("sharin: unknown field"));
    }

    #[test]
    fn bad_values_are_errors() {
        for (text, want) in [
            ("sharing: {replicas: 1}", "sharing.replicas"),
            (
                "ledgerCleanup: {intervalSeconds: 0}",
                "ledgerCleanup.intervalSeconds",
            ),
            (
                "ledgerCleanup: {podResourcesSocket: k.sock}",
                "podResourcesSocket",
            ),
            ("prefix: Nvidia.COM", "prefix"),
            ("strategies: {mig: single}", "mig"),
            ("sharing: {replicas: -2}", "replicas"),
            ("shim: relative.so", "shim"),
            ("sharing: 3", "sharing: expected a mapping"),
            ("sharing: {computeMode: fair}", "computeMode"),
            ("boardDir: gpus", "boardDir"),
            (
                "boardDir: /etc",
                "boardDir: /etc is in /etc, a directory of the system's",
            ),
            ("ledgerDir: /run", "ledgerDir: /run is /run itself"),
            ("stateDir: /usr/lib/x", "stateDir: /usr/lib/x is in /usr"),
            ("boardDir: /etc/../etc", "boardDir"),
        ] {
            let e = format!("{:#}", Config::parse(text).unwrap_err());
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
