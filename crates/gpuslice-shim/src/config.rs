//! The shim's configuration, read once from the environment. The
//! environment's caps and shares are self-imposed: in a slice that has a
//! root-written limits record ([`gpuslice_ledger::limits`]) they are
//! ignored, and only `CUDA_VISIBLE_DEVICES`, `GPUSLICE_CONTEXT_BYTES`,
//! `GPUSLICE_BOARD_DIR` and `GPUSLICE_LOG` are read from here.

use gpuslice_ledger::board::Mode;
use gpuslice_ledger::limits::{
    ComputeShare, MemorySize, ENV_COMPUTE, ENV_LEDGER, ENV_MEMORY, ENV_MODE, ENV_SLICE,
};
use gpuslice_ledger::{MAX_DEVICES, UNLIMITED};

#[cfg(test)]
use gpuslice_ledger::parse_size;

/// How a ledger device is recognised among NVML's devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlMatch {
    Uuid(String),
    Index(u32),
}

/// What the environment asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Cap per CUDA device ordinal (index among visible devices).
    pub caps: Vec<u64>,
    pub ledger_path: Option<String>,
    pub slice_id: String,
    /// `GPUSLICE_CONTEXT_BYTES`: overrides the measured context size.
    pub context_bytes: Option<u64>,
    pub log: bool,
    /// Per ordinal, how NVML names it (from CUDA_VISIBLE_DEVICES).
    pub nvml: Vec<NvmlMatch>,
    /// Compute share per device ordinal in basis points (0: none), from
    /// `GPUSLICE_COMPUTE_LIMIT` (percent, applies to every visible device).
    pub compute: Vec<u64>,
    /// `GPUSLICE_COMPUTE_MODE`: `cap` (default) or `guaranteed`.
    pub compute_mode: Mode,
    /// `GPUSLICE_BOARD_DIR`: where the GPUs' boards are.
    pub board_dir: String,
    /// `GPUSLICE_COMPUTE_HANDOVER=off`: slices with a share do not take
    /// turns on the GPU ([`crate::turns`]; for comparison and diagnosis).
    pub handover: bool,
    /// `GPUSLICE_SLICE_DIR`: the slice's records when the fixed place
    /// has none (a slice without a mount namespace of its own).
    pub slice_dir: Option<String>,
    pub errors: Vec<String>,
}

/// Parses a percentage (`25`, `12.5`, `50%`) into basis points, 1..=10000.
#[cfg(test)]
fn parse_percent(text: &str) -> Option<u64> {
    text.parse::<ComputeShare>()
        .ok()
        .map(ComputeShare::basis_points)
}

impl Config {
    /// Reads the configuration through `get` (the environment in the shim,
    /// a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let mut errors = Vec::new();
        let mut size_var = |name: &str| -> Option<u64> {
            let v = get(name).filter(|v| !v.trim().is_empty())?;
            match v.parse::<MemorySize>() {
                Ok(m) => Some(m.0),
                Err(e) => {
                    errors.push(format!("{name}: {e}; ignored"));
                    None
                }
            }
        };
        let global = size_var(ENV_MEMORY);
        let per: Vec<Option<u64>> = (0..MAX_DEVICES)
            .map(|i| size_var(&format!("{ENV_MEMORY}_{i}")))
            .collect();
        let context_bytes = size_var("GPUSLICE_CONTEXT_BYTES");
        let visible: Vec<String> = get("CUDA_VISIBLE_DEVICES")
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_string())
                    .take_while(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let highest = per.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
        let count = if !visible.is_empty() {
            visible.len().max(highest)
        } else if global.is_some() {
            MAX_DEVICES
        } else {
            highest
        }
        .min(MAX_DEVICES);
        let caps = (0..count)
            .map(|i| per[i].or(global).unwrap_or(UNLIMITED))
            .collect();
        let nvml = (0..count)
            .map(|i| match visible.get(i) {
                Some(v) if v.starts_with("GPU-") || v.starts_with("MIG-") => {
                    NvmlMatch::Uuid(v.clone())
                }
                Some(v) => v
                    .parse()
                    .map_or(NvmlMatch::Index(i as u32), NvmlMatch::Index),
                None => NvmlMatch::Index(i as u32),
            })
            .collect();
        let compute_bp = match get(ENV_COMPUTE).filter(|v| !v.trim().is_empty()) {
            None => 0,
            Some(v) => match v.parse::<ComputeShare>() {
                Ok(c) => c.basis_points(),
                Err(e) => {
                    errors.push(format!("{ENV_COMPUTE}: {e}; ignored"));
                    0
                }
            },
        };
        let compute_count = if compute_bp == 0 {
            0
        } else if visible.is_empty() {
            MAX_DEVICES
        } else {
            visible.len().min(MAX_DEVICES)
        };
        let compute = vec![compute_bp; compute_count];
        let compute_mode = match get(ENV_MODE).filter(|v| !v.trim().is_empty()) {
            None => Mode::Cap,
            Some(v) => v.parse().unwrap_or_else(|e| {
                errors.push(format!("{ENV_MODE}: {e}; using cap"));
                Mode::Cap
            }),
        };
        let log = get("GPUSLICE_LOG").is_some_and(|v| !matches!(v.as_str(), "" | "0" | "off"));
        Config {
            caps,
            ledger_path: get(ENV_LEDGER).filter(|p| !p.is_empty()),
            slice_id: get(ENV_SLICE)
                .filter(|s| gpuslice_ledger::valid_slice_id(s))
                .unwrap_or_else(|| "private".into()),
            context_bytes,
            log,
            nvml,
            compute,
            compute_mode,
            board_dir: get(gpuslice_ledger::board::BOARD_DIR_ENV)
                .filter(|d| !d.is_empty())
                .unwrap_or_else(|| gpuslice_ledger::board::DEFAULT_BOARD_DIR.into()),
            slice_dir: get(gpuslice_ledger::limits::SLICE_DIR_ENV).filter(|d| !d.is_empty()),
            handover: !get("GPUSLICE_COMPUTE_HANDOVER")
                .is_some_and(|v| matches!(v.trim(), "0" | "off" | "no")),
            errors,
        }
    }

    pub fn from_env() -> Config {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The UUID of ordinal `i` when CUDA_VISIBLE_DEVICES named one.
    pub fn uuid(&self, i: usize) -> String {
        match self.nvml.get(i) {
            Some(NvmlMatch::Uuid(u)) => u.clone(),
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("20GiB"), Some(20 << 30));
        assert_eq!(parse_size("20g"), Some(20 << 30));
        assert_eq!(parse_size("512 MiB"), Some(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("2GB"), Some(2_000_000_000));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_size("GiB"), None);
        assert_eq!(parse_size("12 parsecs"), None);
        assert_eq!(parse_size("-1"), None);
    }

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn caps_follow_visible_devices_and_overrides() {
        let c = cfg(&[
            ("GPUSLICE_MEMORY_LIMIT", "8GiB"),
            ("GPUSLICE_MEMORY_LIMIT_1", "2GiB"),
            ("CUDA_VISIBLE_DEVICES", "GPU-aaa,GPU-bbb,GPU-ccc"),
        ]);
        assert_eq!(c.caps, [8 << 30, 2 << 30, 8 << 30]);
        assert_eq!(c.nvml[1], NvmlMatch::Uuid("GPU-bbb".into()));
        let c = cfg(&[
            ("GPUSLICE_MEMORY_LIMIT_0", "1GiB"),
            ("CUDA_VISIBLE_DEVICES", "3"),
        ]);
        assert_eq!(c.caps, [1 << 30]);
        assert_eq!(c.nvml, [NvmlMatch::Index(3)]);
        let c = cfg(&[("GPUSLICE_MEMORY_LIMIT_2", "1GiB")]);
        assert_eq!(c.caps, [UNLIMITED, UNLIMITED, 1 << 30]);
        let c = cfg(&[("GPUSLICE_MEMORY_LIMIT", "1GiB")]);
        assert_eq!(c.caps.len(), MAX_DEVICES);
        assert!(cfg(&[]).caps.is_empty());
    }

    #[test]
    fn compute_limits() {
        assert_eq!(parse_percent("25"), Some(2500));
        assert_eq!(parse_percent("12.5%"), Some(1250));
        assert_eq!(parse_percent("100"), Some(10000));
        assert_eq!(parse_percent("0"), None);
        assert_eq!(parse_percent("101"), None);
        let c = cfg(&[
            ("GPUSLICE_COMPUTE_LIMIT", "30"),
            ("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b"),
        ]);
        assert_eq!(c.compute, [3000, 3000]);
        assert!(c.caps.is_empty() || c.caps.iter().all(|&x| x == UNLIMITED));
        let c = cfg(&[("GPUSLICE_COMPUTE_LIMIT", "lots")]);
        assert!(c.compute.is_empty());
        assert_eq!(c.errors.len(), 1);
    }

    #[test]
    fn bad_values_are_reported_not_fatal() {
        let c = cfg(&[("GPUSLICE_MEMORY_LIMIT", "lots"), ("GPUSLICE_LOG", "1")]);
        assert!(c.caps.is_empty());
        assert_eq!(c.errors.len(), 1);
        assert!(c.log);
        assert_eq!(c.slice_id, "private");
    }
}
