//! `gpuslice-bench` (`gpuslice bench`): the benchmarks that back
//! gpuslice's claims, with their statistics (`stats.rs`), SVG plots
//! (`plot.rs`) and the facts about the machine each result records
//! (`host.rs`); and the device plugin's self-test against a test kubelet
//! (`plugin.rs`); the DRA driver's benchmark and self-test against its API
//! test double (`dra.rs`). It sits under testing/ with the doubles it
//! drives: no product crate depends on it.
//!
//! Its binary (`src/main.rs`) hands it a [`Setup`]: the benchmarks time
//! the `gpuslice` binary users call, beside it.

#![forbid(unsafe_code)]
// The argument structs' doc comments are clap's help text, written for a
// terminal (`bench-init-<time>.json`), not for rustdoc's HTML.
#![allow(rustdoc::invalid_html_tags)]

mod dra;
mod host;
mod init;
mod launch;
mod plot;
mod plugin;
mod shares;
mod stats;

pub use dra::{DraArgs, DraSelftestArgs};
pub use init::InitArgs;
pub use launch::LaunchArgs;
pub use plugin::{selftest as plugin_selftest, SelftestArgs};
pub use shares::PlotSharesArgs;

use anyhow::Result;
use clap::Subcommand;
use std::path::PathBuf;

/// What a benchmark needs from the command line it runs under.
#[derive(Debug, Clone)]
pub struct Setup {
    /// `--host-root`.
    pub host_root: PathBuf,
    /// `--json`: print the result document instead of the table.
    pub json: bool,
    /// The `gpuslice` binary whose launches are measured.
    pub gpuslice: PathBuf,
    /// The shim (`libgpuslice.so`) the device plugin hands to shared replicas.
    pub shim: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// CUDA start-up time per isolation method and number of GPUs reachable.
    Init(InitArgs),
    /// Launch overhead of isolation against a bare exec (and bubblewrap when installed).
    Launch(LaunchArgs),
    /// The DRA driver against its API test double and the test kubelet: NodePrepareResources latency per claim, ResourceSlice re-publication after a health change.
    Dra(DraArgs),
    /// Drive the DRA driver on this host's GPUs (prepare claims, then unprepare them) and report JSON (the GPU machine's check).
    #[command(hide = true)]
    DraSelftest(DraSelftestArgs),
    /// Plot each slice's compute share against its target from a compute-scale or compute29 JSON (SVG beside it).
    PlotShares(PlotSharesArgs),
}

/// Runs a benchmark; the exit status (1 when runs failed).
pub fn run(ctx: &Setup, cmd: &BenchCommand) -> Result<i32> {
    match cmd {
        BenchCommand::Init(args) => init::run(ctx, args),
        BenchCommand::Launch(args) => launch::run(ctx, args),
        BenchCommand::Dra(args) => dra::run(ctx, args),
        BenchCommand::DraSelftest(args) => dra::selftest(ctx, args),
        BenchCommand::PlotShares(args) => shares::run(args),
    }
}

/// (ISO 8601 UTC date-time, compact stamp for file names) of `t`.
fn utc(t: jiff::Timestamp) -> (String, String) {
    (
        t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        t.strftime("%Y%m%dT%H%M%SZ").to_string(),
    )
}

/// [`utc`] of now.
fn utc_now() -> (String, String) {
    utc(jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        let at = |s: i64| utc(jiff::Timestamp::from_second(s).unwrap());
        assert_eq!(at(0).0, "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400).0, "2000-02-29T00:00:00Z");
        assert_eq!(at(1_796_220_000).1, "20261202T140000Z");
    }
}
