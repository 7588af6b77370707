//! `gpuslice exporter`: the Prometheus exporter (see gpuslice-metrics).

use anyhow::{anyhow, Result};
use clap::Args;
use gpuslice_core::HostRoot;
use gpuslice_metrics::dra::DraClaims;
use gpuslice_metrics::{bench, parse_duration, pods, Config, Exporter, DEFAULT_LISTEN};
use serde_json::json;
use std::path::PathBuf;

use crate::global::Global;

#[derive(Debug, Args)]
pub struct ExporterArgs {
    /// Address to serve /metrics and /healthz on: HOST:PORT, or :PORT for all IPv4 addresses.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    pub listen: String,

    /// How often to sample NVML, the ledgers and the kubelet (e.g. 1s, 500ms); scrapes serve the last sample.
    #[arg(long, value_name = "DUR", default_value = "5s")]
    pub interval: String,

    /// Directory of the slices' ledgers [default: $GPUSLICE_LEDGER_DIR, else /run/gpuslice/slices].
    #[arg(long, value_name = "DIR")]
    pub ledger_dir: Option<PathBuf>,

    /// The kubelet PodResources socket [default: var/lib/kubelet/pod-resources/kubelet.sock below --host-root]; pod labels are left out while it is missing.
    #[arg(long, value_name = "PATH", env = "GPUSLICE_POD_RESOURCES_SOCKET")]
    pub pod_resources_socket: Option<PathBuf>,

    /// The DRA plugin's state directory, whose checkpoint names the claims prepared here [default: $GPUSLICE_DRA_STATE_DIR, else var/lib/gpuslice/dra below --host-root].
    #[arg(long, value_name = "DIR")]
    pub dra_state_dir: Option<PathBuf>,

    /// Benchmark instead of serving: listen on a free loopback port, scrape /metrics N times, print latency percentiles (JSON) and exit.
    #[arg(long, value_name = "N")]
    pub bench_scrapes: Option<usize>,
}

/// The claims prepared in the DRA plugin's checkpoint in `dir`.
fn dra_claims(dir: PathBuf) -> DraClaims {
    DraClaims(std::sync::Arc::new(move || {
        Ok(gpuslice_dra::checkpoint::prepared_slices(&dir).map_err(|e| e.to_string())?)
    }))
}

pub fn run(global: &Global, args: &ExporterArgs) -> Result<i32> {
    let interval = parse_duration(&args.interval)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            anyhow!(
                "--interval {:?}: expected e.g. 1s, 500ms, 2m",
                args.interval
            )
        })?;
    let host_root = HostRoot::new(&global.host_root);
    let socket = args
        .pod_resources_socket
        .clone()
        .unwrap_or_else(|| global.host_root.join(pods::DEFAULT_SOCKET));
    let cfg = Config {
        listen: match args.bench_scrapes {
            Some(_) => "127.0.0.1:0".into(),
            None => args.listen.clone(),
        },
        interval,
        host_root,
        ledger_dir: args
            .ledger_dir
            .clone()
            .unwrap_or_else(gpuslice_ledger::ledger_dir),
        pod_resources_socket: Some(socket),
        dra_claims: Some(dra_claims(
            args.dra_state_dir
                .clone()
                .unwrap_or_else(|| super::dra::state_dir(global)),
        )),
    };
    let exporter = Exporter::start(cfg)?;
    let Some(n) = args.bench_scrapes else {
        exporter.wait()?;
        return Ok(0);
    };
    let l = bench::scrapes(exporter.addr(), n)?;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "scrapes": l.scrapes,
            "body_bytes": l.body_bytes,
            "p50_ms": ms(l.p50),
            "p99_ms": ms(l.p99),
            "max_ms": ms(l.max),
            "mean_ms": ms(l.mean),
        }))?
    );
    Ok(0)
}
