//! `gpuslice labels`: node labels for Node Feature Discovery's local
//! source (gpuslice-k8s::labels).

use anyhow::Result;
use clap::Args;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::HostRoot;
use gpuslice_k8s::labels::{self, DEFAULT_FEATURES_FILE};
use gpuslice_k8s::plugin::config::Config;
use std::path::PathBuf;

use crate::global::Global;

#[derive(Debug, Args)]
pub struct LabelsArgs {
    /// The feature file to write (atomically); `-` prints to stdout.
    #[arg(long, short, value_name = "FILE", default_value = DEFAULT_FEATURES_FILE)]
    pub output: PathBuf,

    /// The device plugin's YAML config: adds each GPU's role, the sharing mode, replicas and MIG strategy, and its prefix is the default.
    #[arg(long, value_name = "FILE", env = "GPUSLICE_DEVICE_PLUGIN_CONFIG")]
    pub config: Option<PathBuf>,

    /// Label prefix [default: the config's prefix, else nvidia.com].
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,
}

pub fn run(global: &Global, args: &LabelsArgs) -> Result<i32> {
    let cfg = args.config.as_deref().map(Config::load).transpose()?;
    let prefix = args
        .prefix
        .clone()
        .or_else(|| cfg.as_ref().map(|c| c.prefix.clone()))
        .unwrap_or_else(|| labels::DEFAULT_PREFIX.to_string());
    labels::check_prefix(&prefix)?;
    let inv = discover(
        &HostRoot::new(&global.host_root),
        &DiscoverOptions::default(),
    )?;
    let facts = labels::nvml_facts(None);
    let l = labels::labels(&inv, &facts, cfg.as_ref(), &prefix)?;
    let text = labels::render(&l);
    if args.output.as_os_str() == "-" {
        print!("{text}");
    } else {
        labels::write_atomic(&args.output, &text)?;
        tracing::info!("wrote {} labels to {}", l.len(), args.output.display());
    }
    Ok(0)
}
