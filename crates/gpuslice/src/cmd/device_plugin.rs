//! `gpuslice device-plugin`: the kubelet device plugin (gpuslice-k8s::plugin).
//! Its self-test against a test kubelet, `device-plugin-selftest`, is in
//! crate gpuslice-bench.

use anyhow::Result;
use clap::Args;
use gpuslice_core::HostRoot;
use gpuslice_k8s::plugin::config::Config;
use gpuslice_k8s::plugin::{self, Options};
use std::path::PathBuf;

use crate::global::Global;

#[derive(Debug, Args)]
pub struct DevicePluginArgs {
    /// YAML config (prefix, replicas, strategies, shim, health; see docs/kubernetes.md); re-read on SIGHUP.
    #[arg(long, value_name = "FILE", env = "GPUSLICE_DEVICE_PLUGIN_CONFIG")]
    pub config: Option<PathBuf>,

    /// The kubelet's device-plugin directory (overrides the config's pluginDir).
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
}

fn base_config(path: Option<&PathBuf>) -> Result<Config> {
    match path {
        Some(p) => Config::load(p),
        None => Ok(Config::default()),
    }
}

pub fn run(global: &Global, args: &DevicePluginArgs) -> Result<i32> {
    let mut cfg = base_config(args.config.as_ref())?;
    if let Some(d) = &args.plugin_dir {
        cfg.plugin_dir = d.clone();
    }
    let mut opts = Options::new(cfg, HostRoot::new(&global.host_root));
    opts.enforcer = super::enforce::enforcer_policy(&gpuslice_policy::Caller::detect()?);
    // A --plugin-dir override must survive reloads: reload from the file
    // only when nothing overrides it.
    if args.plugin_dir.is_none() {
        opts.config_path = args.config.clone();
    }
    plugin::run(opts)?;
    Ok(0)
}
