//! One collection's worth of series and its Prometheus text rendering
//! (OpenMetrics, through prometheus-client).

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Name prefix of every series.
pub const PREFIX: &str = "gpuslice";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    /// Rendered with the `_total` suffix (not part of [`Metric::name`]).
    Counter,
}

/// A metric family: name without the `gpuslice_` prefix (and, for counters,
/// without `_total`), help text, kind.
#[derive(Debug, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
}

macro_rules! metrics {
    ($($id:ident: $kind:ident $name:literal $help:literal;)*) => {
        $(pub const $id: &Metric = &Metric { name: $name, help: $help, kind: Kind::$kind };)*
        /// Every family, in output order.
        pub const ALL: &[&Metric] = &[$($id),*];
    };
}

metrics! {
    GPU_INFO: Gauge "gpu_info" "A GPU gpuslice found (value 1), with its driver version";
    GPU_UTIL: Gauge "gpu_utilization_ratio" "Fraction of the last sample period a kernel ran on the GPU (NVML utilization.gpu)";
    GPU_MEM_UTIL: Gauge "gpu_memory_utilization_ratio" "Fraction of the last sample period device memory was read or written (NVML utilization.memory)";
    GPU_MEM_USED: Gauge "gpu_memory_used_bytes" "Device memory in use";
    GPU_MEM_FREE: Gauge "gpu_memory_free_bytes" "Device memory free";
    GPU_MEM_TOTAL: Gauge "gpu_memory_total_bytes" "Device memory installed";
    GPU_TEMP: Gauge "gpu_temperature_celsius" "GPU core temperature";
    GPU_POWER: Gauge "gpu_power_watts" "Power draw of the board";
    GPU_ENERGY: Counter "gpu_energy_joules" "Energy used since the driver was loaded";
    GPU_SM_CLOCK: Gauge "gpu_sm_clock_hertz" "Current SM clock";
    GPU_MEM_CLOCK: Gauge "gpu_memory_clock_hertz" "Current memory clock";
    GPU_PCIE_TX: Gauge "gpu_pcie_transmit_bytes_per_second" "PCIe bytes sent by the GPU per second (NVML's 20 ms sample)";
    GPU_PCIE_RX: Gauge "gpu_pcie_receive_bytes_per_second" "PCIe bytes received by the GPU per second (NVML's 20 ms sample)";
    GPU_NVLINK_TX: Counter "gpu_nvlink_transmit_bytes" "NVLink data bytes sent, all links (where supported)";
    GPU_NVLINK_RX: Counter "gpu_nvlink_receive_bytes" "NVLink data bytes received, all links (where supported)";
    GPU_ECC_CORR: Counter "gpu_ecc_corrected_errors" "Corrected ECC errors over the GPU's life (NVML aggregate counter)";
    GPU_ECC_UNCORR: Counter "gpu_ecc_uncorrected_errors" "Uncorrected ECC errors over the GPU's life (NVML aggregate counter)";
    GPU_RETIRED: Gauge "gpu_retired_pages" "Memory pages retired, by cause (GPUs before Ampere)";
    GPU_REMAPPED: Gauge "gpu_remapped_rows" "Memory rows remapped, by cause (Ampere and later)";
    GPU_REMAP_PENDING: Gauge "gpu_row_remap_pending" "1 when a row remap waits for a GPU reset";
    GPU_REMAP_FAILED: Gauge "gpu_row_remap_failed" "1 when a row remap has failed";
    GPU_XID_ERRORS: Counter "gpu_xid_errors" "Critical XID events on the GPU since the exporter started, by XID code (NVML events)";
    GPU_LAST_XID: Gauge "gpu_last_xid" "The last XID code seen on the GPU since the exporter started (absent when none)";
    DRA_CLAIM_INFO: Gauge "dra_claim_info" "A DRA claim's slice prepared on this node (value 1), with the claim's namespace, name and uid";
    LEDGER_UNREADABLE: Gauge "ledger_unreadable" "A ledger in the ledger directory that does not read as one (value 1; the reason is logged): its slice goes unreported, not silently";
    SLICE_UNENFORCEABLE: Gauge "slice_unenforceable" "A slice whose caps do not hold against its pods (value 1): privileged, CAP_SYS_ADMIN, hostPID, hostIPC or hostNetwork, as the reason says (from the pod spec at Prepare, or a process as the kernel shows it)";
    GPU_POD_INFO: Gauge "gpu_pod_info" "A container the kubelet assigned this GPU (or one of its replicas) to (value 1)";
    SLICE_CAP: Gauge "slice_memory_cap_bytes" "A slice's GPU memory cap on a device (absent when unlimited)";
    SLICE_USED: Gauge "slice_memory_used_bytes" "GPU memory a slice's processes hold on a device (from its ledger)";
    SLICE_PEAK: Gauge "slice_memory_peak_bytes" "Highest memory use of a slice on a device";
    SLICE_REFUSED: Counter "slice_memory_refusals" "Allocations refused because they would pass the cap";
    SLICE_DRIVER_USED: Gauge "slice_memory_driver_used_bytes" "GPU memory a slice's processes hold on a device by the driver's own per-process accounting (NVML's running processes, read on the host; contexts included)";
    SLICE_ENFORCEMENT_KILLS: Counter "slice_enforcement_kills" "Processes of a slice root's enforcer killed, by reason: over_cap (the slice held more than its cap by the driver's accounting) or unshimmed (a GPU process the shim does not hold)";
    SLICE_MEMORY_LAYER: Gauge "slice_memory_layer" "1 for each layer holding a slice's GPU memory: shim (libgpuslice in its processes), driver (the driver's per-cgroup memory partition, R615+)";
    SLICE_PROCS: Gauge "slice_processes" "Processes attached to a slice's ledger";
    SLICE_PROC_ENFORCED: Gauge "slice_process_enforced" "Per process of a slice that uses the GPU or joined its ledger: 1 when the shim is loaded and holds it to the slice's limits, 0 when not (flagged)";
    SLICE_COMPUTE_SHARE: Gauge "slice_compute_share_ratio" "A slice's compute share of a device (0-1; absent when unlimited)";
    SLICE_COMPUTE_BUSY: Counter "slice_compute_gpu_seconds" "GPU time a slice's metered launches took on a device (measured with events)";
    SLICE_COMPUTE_THROTTLED: Counter "slice_compute_throttled_seconds" "Wall time a slice's launches were held back by its compute share (summed over threads)";
    EXP_NVML_UP: Gauge "exporter_nvml_up" "1 when the last collection read NVML";
    EXP_XID_UP: Gauge "exporter_xid_events_up" "1 while NVML XID events are watched (0: unsupported, so the XID series are absent)";
    EXP_PODRES_UP: Gauge "exporter_pod_resources_up" "1 when the last collection listed pods from the kubelet PodResources API (absent when its socket is missing)";
    EXP_COLLECT: Gauge "exporter_collect_duration_seconds" "How long the last collection took";
    EXP_COLLECTIONS: Counter "exporter_collections" "Collections since start";
    EXP_AGE: Gauge "exporter_sample_age_seconds" "Age of the sample this scrape serves";
}

pub type Labels = Vec<(&'static str, String)>;

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub metric: &'static Metric,
    pub labels: Labels,
    pub value: f64,
}

/// Everything one collection found.
#[derive(Debug, Default, Clone)]
pub struct Sample {
    pub series: Vec<Series>,
}

impl Sample {
    pub fn push(&mut self, metric: &'static Metric, labels: &Labels, value: f64) {
        self.series.push(Series {
            metric,
            labels: labels.clone(),
            value,
        });
    }

    /// The value of `metric` for the series whose labels include all of
    /// `want` (tests and the bench).
    pub fn value(&self, metric: &Metric, want: &[(&str, &str)]) -> Option<f64> {
        self.series
            .iter()
            .find(|s| {
                s.metric == metric
                    && want
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|s| s.value)
    }

    /// Text format without the closing `# EOF` (so the age can follow).
    pub fn render(&self) -> String {
        let mut reg = Registry::with_prefix(PREFIX);
        for m in ALL {
            let series: Vec<&Series> = self.series.iter().filter(|s| s.metric == *m).collect();
            if series.is_empty() {
                continue;
            }
            // A single label-less series: no `{}` after the name.
            if let [one] = series.as_slice() {
                if one.labels.is_empty() {
                    match m.kind {
                        Kind::Gauge => {
                            let g = Gauge::<f64, AtomicU64>::default();
                            g.set(one.value);
                            reg.register(m.name, m.help, g);
                        }
                        Kind::Counter => {
                            let c = Counter::<f64, AtomicU64>::default();
                            c.inc_by(one.value);
                            reg.register(m.name, m.help, c);
                        }
                    }
                    continue;
                }
            }
            match m.kind {
                Kind::Gauge => {
                    let fam = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
                    for s in series {
                        fam.get_or_create(&owned(&s.labels)).set(s.value);
                    }
                    reg.register(m.name, m.help, fam);
                }
                Kind::Counter => {
                    let fam = Family::<Vec<(String, String)>, Counter<f64, AtomicU64>>::default();
                    for s in series {
                        fam.get_or_create(&owned(&s.labels)).inc_by(s.value);
                    }
                    reg.register(m.name, m.help, fam);
                }
            }
        }
        let mut out = String::with_capacity(16 * 1024);
        encode_registry(&mut out, &reg).expect("writing to a String");
        out
    }
}

/// OpenMetrics text (as [`Sample::render`] and [`render_age`] write it)
/// in the classic Prometheus text format 0.0.4, for clients that do not ask
/// for OpenMetrics (promtool, curl, older scrapers): counter families are
/// named with their `_total` suffix there, and there is no `# EOF`.
pub fn to_classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len() + 256);
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            let family = name.strip_prefix(PREFIX)?.strip_prefix('_')?;
            ALL.iter()
                .any(|m| m.kind == Kind::Counter && m.name == family)
                .then(|| format!("{tag}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

fn owned(labels: &Labels) -> Vec<(String, String)> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

/// The sample-age gauge and the closing `# EOF`, appended per scrape.
pub fn render_age(age_seconds: f64) -> String {
    let mut reg = Registry::with_prefix(PREFIX);
    let g = Gauge::<f64, AtomicU64>::default();
    g.set(age_seconds);
    reg.register(EXP_AGE.name, EXP_AGE.help, g);
    let mut out = String::with_capacity(256);
    encode_registry(&mut out, &reg).expect("writing to a String");
    encode_eof(&mut out).expect("writing to a String");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_names_units_and_totals() {
        let mut s = Sample::default();
        let l: Labels = vec![("gpu", "0".into()), ("uuid", "GPU-x".into())];
        s.push(GPU_MEM_USED, &l, 1024.0);
        s.push(GPU_ENERGY, &l, 5.5);
        let text = s.render() + &render_age(0.25);
        assert!(text.contains("# TYPE gpuslice_gpu_memory_used_bytes gauge"));
        assert!(text.contains("gpuslice_gpu_memory_used_bytes{gpu=\"0\",uuid=\"GPU-x\"} 1024"));
        assert!(text.contains("# TYPE gpuslice_gpu_energy_joules counter"));
        assert!(text.contains("gpuslice_gpu_energy_joules_total{gpu=\"0\",uuid=\"GPU-x\"} 5.5"));
        assert!(text.contains("gpuslice_exporter_sample_age_seconds 0.25"));
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(text.matches("# EOF").count(), 1);
        // Families without series are left out entirely.
        assert!(!text.contains("gpu_temperature_celsius"));
    }

    #[test]
    fn classic_format_names_counters_with_total() {
        let mut s = Sample::default();
        s.push(GPU_ENERGY, &vec![("gpu", "0".into())], 2.0);
        s.push(EXP_NVML_UP, &Labels::new(), 1.0);
        let text = to_classic(&(s.render() + &render_age(0.5)));
        assert!(text.contains("# TYPE gpuslice_gpu_energy_joules_total counter\n"));
        assert!(text.contains("# HELP gpuslice_gpu_energy_joules_total Energy"));
        assert!(text.contains("\ngpuslice_exporter_nvml_up 1.0\n"));
        assert!(!text.contains("# EOF"));
    }

    #[test]
    fn names_follow_conventions() {
        for m in ALL {
            assert!(!m.name.ends_with("_total"), "{}", m.name);
            assert!(m.name.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        }
    }
}
