//! The options every command takes (`gpuslice --host-root DIR list`).
//!
//! The commands depend on this, not on the whole command line: the command
//! line ([`crate::cli`]) is assembled from the commands' own arguments.

use clap::{Args, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Clone, Args)]
pub struct Global {
    /// Where the host's /dev, /proc/driver/nvidia and /sys are read and masked.
    #[arg(
        long,
        global = true,
        env = "GPUSLICE_HOST_ROOT",
        default_value = "/",
        value_name = "DIR"
    )]
    pub host_root: PathBuf,

    /// Print data as JSON.
    #[arg(long, global = true)]
    pub json: bool,

    /// More logging (-v: info, -vv: debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Log line format (for daemons).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
