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
//! sharing:
//!   replicas: 4                    # gpu.shared replicas per GPU (0: no gpu.shared resource)
//!   spread: false                  # GetPreferredAllocation: spread replicas over GPUs instead of packing
//!   computeMode: cap               # cap: a replica never passes 1/replicas of the GPU's time;
//!                                  # guaranteed: it may also use time the others leave idle
//! strategies:
//!   whole: true                    # offer <prefix>/gpu
//!   mig: mixed                     # mixed: <prefix>/mig-<profile>; none
//!   cdi: false                     # answer Allocate with cdi_devices as well
//!   cdiKind: gpuslice.dev/gpu
//! health:
//!   enabled: true
//!   recoverAfterSeconds: 60        # healthy again after answering normally this long
//!   ignoredXids: [13, 31, 43, 45, 68, 109]
//! ```
//! Every field is optional. A field that is not one of these is an error
//! naming its path (`strategies.cdii`).

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use serde_yaml::Value;
use std::path::{Path, PathBuf};

pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
pub const DEFAULT_SHIM: &str = "/usr/local/lib/gpuslice/libgpuslice.so";
pub const DEFAULT_LEDGER_DIR: &str = "/run/gpuslice/slices";
pub const DEFAULT_STATE_DIR: &str = "/run/gpuslice/device-plugin";
/// XIDs caused by the application, not the GPU (NVIDIA's device plugin skips the same).
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

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
    pub sharing: Sharing,
    pub strategies: Strategies,
    pub health: Health,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Sharing {
    pub replicas: u32,
    pub spread: bool,
    pub compute_mode: ComputeMode,
}

/// How a replica's compute share applies (docs/compute-share.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeMode {
    Cap,
    Guaranteed,
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
    pub whole: bool,
    pub mig: MigStrategy,
    pub cdi: bool,
    pub cdi_kind: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Health {
    pub enabled: bool,
    pub recover_after_seconds: u64,
    pub ignored_xids: Vec<u64>,
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
            sharing: Sharing::default(),
            strategies: Strategies::default(),
            health: Health::default(),
        }
    }
}

impl Default for Sharing {
    fn default() -> Self {
        Sharing {
            replicas: 4,
            spread: false,
            compute_mode: ComputeMode::Cap,
        }
    }
}

impl Default for Strategies {
    fn default() -> Self {
        Strategies {
            whole: true,
            mig: MigStrategy::Mixed,
            cdi: false,
            cdi_kind: format!(
                "{}/{}",
                crate::cdi::DEFAULT_VENDOR,
                crate::cdi::DEFAULT_CLASS
            ),
        }
    }
}

impl Default for Health {
    fn default() -> Self {
        Health {
            enabled: true,
            recover_after_seconds: 60,
            ignored_xids: APPLICATION_XIDS.to_vec(),
        }
    }
}

/// The known keys of each mapping, by path ("" is the top level).
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
            "sharing",
            "strategies",
            "health",
        ],
    ),
    ("sharing", &["replicas", "spread", "computeMode"]),
    ("strategies", &["whole", "mig", "cdi", "cdiKind"]),
    ("health", &["enabled", "recoverAfterSeconds", "ignoredXids"]),
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
        if self.sharing.replicas == 1 || self.sharing.replicas > 100 {
            bail!(
                "sharing.replicas: {} (0 for no shared resource, or 2 to 100)",
                self.sharing.replicas
            );
        }
        if !self.strategies.cdi_kind.contains('/') {
            bail!(
                "strategies.cdiKind: {:?} is not <vendor>/<class>",
                self.strategies.cdi_kind
            );
        }
        for (name, p) in [
            ("pluginDir", &self.plugin_dir),
            ("shim", &self.shim),
            ("ledgerDir", &self.ledger_dir),
            ("stateDir", &self.state_dir),
            ("boardDir", &self.board_dir),
        ] {
            if !p.is_absolute() {
                bail!("{name}: {} is not an absolute path", p.display());
            }
        }
        Ok(())
    }
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
    let Some(known) = SCHEMA.iter().find(|(p, _)| *p == path).map(|(_, k)| *k) else {
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
        check_keys(child, &full)?;
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
            "prefix: example.com\nsharing: {replicas: 8, spread: true}\n\
             strategies: {cdi: true, mig: none}\nhealth: {recoverAfterSeconds: 5}\n",
        )
        .unwrap();
        assert_eq!(c.prefix, "example.com");
        assert_eq!(c.sharing.replicas, 8);
        assert!(c.sharing.spread && c.strategies.cdi);
        assert_eq!(c.strategies.mig, MigStrategy::None);
        assert_eq!(c.health.recover_after_seconds, 5);
        assert_eq!(c.health.ignored_xids, APPLICATION_XIDS.to_vec());
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
            ("prefix: Nvidia.COM", "prefix"),
            ("strategies: {mig: single}", "mig"),
            ("sharing: {replicas: -2}", "replicas"),
            ("shim: relative.so", "shim"),
            ("sharing: 3", "sharing: expected a mapping"),
            ("sharing: {computeMode: fair}", "computeMode"),
            ("boardDir: gpus", "boardDir"),
        ] {
            let e = format!("{:#}", Config::parse(text).unwrap_err());
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
