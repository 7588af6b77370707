//! `gpuslice doctor`: runs the checks of `gpuslice-doctor` and prints them.

use crate::global::Global;
use anyhow::Result;
use clap::Args;
use gpuslice_core::HostRoot;
use gpuslice_doctor::{render_table, Options};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Check this cgroup mount (cgroup2, or a v1 devices hierarchy) instead of the one in /proc/self/mountinfo.
    #[arg(long, value_name = "DIR")]
    pub cgroup_root: Option<PathBuf>,
}

/// Exit code 0 when every check passed or was skipped, 1 with warnings, 2 with failures.
pub fn run(global: &Global, args: &DoctorArgs) -> Result<i32> {
    let opts = Options {
        host_root: HostRoot::new(&global.host_root),
        cgroup_root: args.cgroup_root.clone(),
        dra_state_dir: Some(super::dra::state_dir(global)),
        ..Default::default()
    };
    let report = gpuslice_doctor::run(&opts);
    if global.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        print!("{}", render_table(&report, color));
    }
    Ok(report.exit_code())
}
