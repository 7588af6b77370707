//! `gpuslice bench`: the benchmarks that back gpuslice's claims.

use crate::global::Global;
use anyhow::Result;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// CUDA start-up time per isolation method and number of GPUs reachable.
    Init(super::bench_init::InitArgs),
    /// Launch overhead of isolation against a bare exec (and bubblewrap when installed).
    Launch(super::bench_launch::LaunchArgs),
}

pub fn run(global: &Global, cmd: &BenchCommand) -> Result<i32> {
    match cmd {
        BenchCommand::Init(args) => super::bench_init::run(global, args),
        BenchCommand::Launch(args) => super::bench_launch::run(global, args),
    }
}
