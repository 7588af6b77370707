//! Node labels as a Node Feature Discovery (NFD) local-source feature file.
//!
//! NFD's `local` source reads every file in
//! `/etc/kubernetes/node-feature-discovery/features.d/` on the node; each
//! line is `name=value` (lines starting with `#` are comments) and becomes
//! the node label `name=value`. `gpuslice labels` writes one such file,
//! atomically (a temporary file in the same directory, then `rename`), so
//! NFD never reads half a file.
//!
//! Labels, under a prefix (default `nvidia.com`, the one NVIDIA's GPU
//! Feature Discovery uses, so existing node affinities keep working):
//!
//! | label | value |
//! |---|---|
//! | `gpu.present` | `true` |
//! | `gpu.product` | model name, sanitised (`NVIDIA-H200`) |
//! | `gpu.memory` | memory of one GPU in MiB |
//! | `gpu.count` | GPUs on the node |
//! | `gpu.compute.major`, `gpu.compute.minor` | CUDA compute capability (NVML; left out without NVML) |
//! | `cuda.driver-version.full`, `.major`, `.minor`, `.revision` | kernel driver version |
//! | `cuda.runtime-version.full`, `.major`, `.minor` | CUDA driver API version (NVML) |
//! | `mig.capable` | `true`/`false` (NVML's MIG mode query; left out when unknown) |
//! | `mig.strategy` | `mixed`/`none` (with `--config`) |
//! | `gpu.nvlink` | `true` when a GPU has an active NVLink peer (NVML; left out without it) |
//! | `gpu.form-factor` | `SXM` or `PCIe` (heuristic, below; left out when unknown) |
//! | `gpu.sharing-strategy` | `gpuslice` when the plugin shares a GPU, else `none` (with `--config`) |
//! | `gpu.replicas` | replicas per GPU of the first shared GPU (with `--config`; 1 when none is shared) |
//! | `gpu.<index>.role` | that GPU's role: `whole`, `shared`, `mig`, or `none` when not offered (with `--config`) |
//! | `gpu.<index>.replicas` | replicas of that GPU, when shared (with `--config`) |
//!
//! Product and memory are those of the first GPU (nodes are assumed
//! homogeneous, as GPU Feature Discovery does).
//!
//! Form factor: NVML has no call for it. `SXM` when the model name says
//! `SXM` (e.g. "Tesla V100-SXM2-16GB", "NVIDIA A100-SXM4-80GB") or any GPU
//! has an active NVLink peer (NVLink between GPUs means an SXM/HGX
//! baseboard or an NVLink bridge; bridged PCIe cards are the exception
//! this heuristic gets wrong), `PCIe` when NVML saw no NVLink peer, and
//! left out when NVML was not there to ask.

use crate::plugin::config::{Config, MigStrategy};
use crate::plugin::roles::{self, Role};
use anyhow::{bail, Result};
use gpuslice_core::Inventory;
use std::collections::BTreeMap;
use std::path::Path;

/// Where NFD's local source looks, and the file name we write there.
pub const DEFAULT_FEATURES_FILE: &str =
    "/etc/kubernetes/node-feature-discovery/features.d/gpuslice";
pub const DEFAULT_PREFIX: &str = "nvidia.com";

/// Facts only NVML gives (discovery does not keep them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlFacts {
    pub compute_capability: Option<(i32, i32)>,
    pub mig_capable: Option<bool>,
}

/// Reads [`NvmlFacts`] of the first GPU from NVML (`lib`, or
/// `libnvidia-ml.so.1`); everything unknown when NVML does not load.
pub fn nvml_facts(lib: Option<&Path>) -> NvmlFacts {
    use nvml_wrapper::error::NvmlError;
    let Ok(nvml) = gpuslice_cuda_load::open_nvml(lib) else {
        return NvmlFacts::default();
    };
    let Ok(dev) = nvml.device_by_index(0) else {
        return NvmlFacts::default();
    };
    NvmlFacts {
        compute_capability: dev
            .cuda_compute_capability()
            .ok()
            .map(|c| (c.major, c.minor)),
        mig_capable: match dev.mig_mode() {
            Ok(_) => Some(true),
            Err(NvmlError::NotSupported) => Some(false),
            Err(_) => None,
        },
    }
}

/// A Kubernetes label value: at most 63 characters of `[A-Za-z0-9-_.]`,
/// beginning and ending with an alphanumeric (or empty). Anything else
/// becomes `-` (runs of them one `-`), then the ends are trimmed.
pub fn sanitize_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let ok = c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        let c = if ok { c } else { '-' };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    let trim = |s: &str| {
        s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_string()
    };
    let mut out = trim(&out);
    if out.len() > 63 {
        out.truncate(63);
        out = trim(&out);
    }
    out
}

/// Whether `v` is a valid label value.
pub fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && (v.is_empty()
            || (v.as_bytes()[0].is_ascii_alphanumeric()
                && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric()))
}

/// Whether any GPU has an active NVLink peer; None when unknown (NVLink
/// peers come from NVML, and discovery ran without it).
pub fn nvlink(inv: &Inventory) -> Option<bool> {
    let known = inv.sources.iter().any(|s| s == "nvml");
    let any = inv.gpus.iter().any(|g| !g.nvlink_peers.is_empty());
    (known || any).then_some(any)
}

/// `SXM` or `PCIe`, None when unknown; see the module documentation.
pub fn form_factor(inv: &Inventory) -> Option<&'static str> {
    let sxm_name = inv
        .gpus
        .iter()
        .any(|g| g.model.to_ascii_uppercase().contains("SXM"));
    match (sxm_name, nvlink(inv)) {
        (true, _) | (_, Some(true)) => Some("SXM"),
        (false, Some(false)) => Some("PCIe"),
        (false, None) => None,
    }
}

/// The labels of a node: name (with prefix) to value, every value valid.
/// An error when `cfg`'s roles do not resolve on `inv` (the plugin would
/// refuse the same config).
pub fn labels(
    inv: &Inventory,
    nvml: &NvmlFacts,
    cfg: Option<&Config>,
    prefix: &str,
) -> Result<BTreeMap<String, String>> {
    let mut l = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        let v = sanitize_value(&v);
        if !v.is_empty() {
            l.insert(format!("{prefix}/{k}"), v);
        }
    };
    put("gpu.count", inv.gpus.len().to_string());
    put("gpu.present", (!inv.gpus.is_empty()).to_string());
    if let Some(g) = inv.gpus.first() {
        put("gpu.product", g.model.clone());
        if let Some(m) = g.memory_bytes {
            put("gpu.memory", (m >> 20).to_string());
        }
        if let Some(f) = form_factor(inv) {
            put("gpu.form-factor", f.into());
        }
    }
    if let Some(n) = nvlink(inv) {
        put("gpu.nvlink", n.to_string());
    }
    if let Some((major, minor)) = nvml.compute_capability {
        put("gpu.compute.major", major.to_string());
        put("gpu.compute.minor", minor.to_string());
    }
    if let Some(d) = &inv.driver_version {
        put("cuda.driver-version.full", d.clone());
        let parts: Vec<&str> = d.split('.').collect();
        for (name, p) in ["major", "minor", "revision"].iter().zip(&parts) {
            put(&format!("cuda.driver-version.{name}"), p.to_string());
        }
    }
    if let Some(c) = &inv.cuda_version {
        put("cuda.runtime-version.full", c.clone());
        let parts: Vec<&str> = c.split('.').collect();
        for (name, p) in ["major", "minor"].iter().zip(&parts) {
            put(&format!("cuda.runtime-version.{name}"), p.to_string());
        }
    }
    // MIG mode already on, or MIG devices, prove the GPU capable without NVML.
    let mig_seen = inv
        .gpus
        .iter()
        .any(|g| g.mig_enabled == Some(true) || !g.migs.is_empty());
    let mig = if mig_seen {
        Some(true)
    } else {
        nvml.mig_capable
    };
    if let Some(m) = mig {
        put("mig.capable", m.to_string());
    }
    if let Some(cfg) = cfg {
        let assigned = roles::resolve(cfg, inv)?;
        let mut replicas = None;
        for a in &assigned {
            let role = if a.unfit.is_some() {
                "none"
            } else {
                a.role.name()
            };
            put(&format!("gpu.{}.role", a.gpu), role.into());
            if let (None, Role::Shared { replicas: r }) = (&a.unfit, a.role) {
                put(&format!("gpu.{}.replicas", a.gpu), r.to_string());
                replicas.get_or_insert(r);
            }
        }
        put(
            "gpu.sharing-strategy",
            if replicas.is_some() {
                "gpuslice"
            } else {
                "none"
            }
            .into(),
        );
        put("gpu.replicas", replicas.unwrap_or(1).to_string());
        put(
            "mig.strategy",
            match cfg.strategies.mig {
                MigStrategy::Mixed => "mixed",
                MigStrategy::None => "none",
            }
            .into(),
        );
    }
    Ok(l)
}

/// The feature file's text: a comment line, then `name=value` lines.
pub fn render(labels: &BTreeMap<String, String>) -> String {
    let mut s = String::from("# Written by gpuslice labels (NFD local source); do not edit.\n");
    for (k, v) in labels {
        s.push_str(k);
        s.push('=');
        s.push_str(v);
        s.push('\n');
    }
    s
}

/// Writes the feature file `text` to `path` (0644) atomically
/// ([`gpuslice_core::atomic_file`]: its temporary file is a dot name,
/// which NFD skips), creating the directory when missing.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    gpuslice_core::atomic_file::write_atomic(path, text.as_bytes(), 0o644)?;
    Ok(())
}

/// Checks a label prefix (a DNS subdomain, as the plugin's config does).
pub fn check_prefix(prefix: &str) -> Result<()> {
    let cfg = Config {
        prefix: prefix.to_string(),
        ..Config::default()
    };
    if let Err(e) = cfg.validate() {
        bail!("{e}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_core::Gpu;

    #[test]
    fn sanitizes_values() {
        for (raw, want) in [
            ("NVIDIA H200", "NVIDIA-H200"),
            ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
            ("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB"),
            ("  NVIDIA  A100 (PCIe) ", "NVIDIA-A100-PCIe"),
            ("GeForce RTX™ 4090", "GeForce-RTX-4090"),
            ("_x_", "x"),
            ("580.159.04", "580.159.04"),
            ("---", ""),
            ("", ""),
        ] {
            let got = sanitize_value(raw);
            assert_eq!(got, want, "{raw:?}");
            assert!(valid_value(&got), "{got:?}");
        }
        let long = sanitize_value(&format!("{}-.tail", "a".repeat(62)));
        assert_eq!(long, "a".repeat(62));
        assert!(valid_value(&sanitize_value(&"é.".repeat(80))));
        assert!(!valid_value("-a") && !valid_value("a b") && !valid_value(&"a".repeat(64)));
    }

    fn gpu(model: &str, peers: &[&str]) -> Gpu {
        Gpu {
            model: model.into(),
            nvlink_peers: peers.iter().map(|s| s.to_string()).collect(),
            memory_bytes: Some(80 << 30),
            ..Gpu::default()
        }
    }

    #[test]
    fn form_factor_heuristic() {
        let inv = |g: Vec<Gpu>| Inventory {
            gpus: g,
            sources: vec!["procfs".into(), "nvml".into()],
            ..Default::default()
        };
        let ff = |g| form_factor(&inv(vec![g]));
        assert_eq!(ff(gpu("NVIDIA H100 PCIe", &[])), Some("PCIe"));
        assert_eq!(ff(gpu("Tesla V100-SXM2-16GB", &[])), Some("SXM"));
        assert_eq!(ff(gpu("NVIDIA H200", &["0000:3b:00.0"])), Some("SXM"));
        // Without NVML the peers are unknown: only the name decides.
        let no_nvml = |g| Inventory {
            gpus: vec![g],
            ..Default::default()
        };
        assert_eq!(form_factor(&no_nvml(gpu("NVIDIA H200", &[]))), None);
        assert_eq!(nvlink(&no_nvml(gpu("NVIDIA H200", &[]))), None);
        assert_eq!(
            form_factor(&no_nvml(gpu("Tesla V100-SXM2-16GB", &[]))),
            Some("SXM")
        );
    }

    #[test]
    fn labels_without_nvml_or_config() {
        let inv = Inventory {
            gpus: vec![gpu("NVIDIA A100 80GB PCIe", &[])],
            driver_version: Some("550.54.15".into()),
            ..Default::default()
        };
        let l = labels(&inv, &NvmlFacts::default(), None, "nvidia.com").unwrap();
        assert_eq!(l["nvidia.com/gpu.product"], "NVIDIA-A100-80GB-PCIe");
        assert_eq!(l["nvidia.com/gpu.memory"], "81920");
        assert_eq!(l["nvidia.com/cuda.driver-version.revision"], "15");
        for absent in [
            "gpu.form-factor",
            "gpu.nvlink",
            "gpu.compute.major",
            "mig.capable",
            "gpu.replicas",
            "cuda.runtime-version.full",
        ] {
            assert!(!l.contains_key(&format!("nvidia.com/{absent}")), "{absent}");
        }
        let text = render(&l);
        assert!(text.contains("\nnvidia.com/gpu.count=1\n"), "{text}");
    }

    #[test]
    fn no_gpus() {
        let l = labels(&Inventory::default(), &NvmlFacts::default(), None, "x.io").unwrap();
        assert_eq!(l["x.io/gpu.count"], "0");
        assert_eq!(l["x.io/gpu.present"], "false");
        assert!(!l.contains_key("x.io/gpu.product"));
    }

    #[test]
    fn prefix_checked() {
        assert!(check_prefix("nvidia.com").is_ok());
        assert!(check_prefix("Bad_Prefix").is_err());
    }
}
