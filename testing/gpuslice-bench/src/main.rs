//! `gpuslice-bench`: the benchmarks behind gpuslice's claims and the GPU
//! machine's self-tests of the device plugin and the DRA driver, which
//! drive gpuslice with its test doubles (test kubelets, the fake API
//! server, the fake host). A binary of its own so that the product links
//! none of them: `gpuslice bench …` and `gpuslice device-plugin-selftest
//! …` exec it beside them with the same command line, which it reads as
//! written (`gpuslice-bench bench init` is `gpuslice-bench init`).

use clap::{Parser, Subcommand};
use gpuslice::global::Global;
use gpuslice_bench::{BenchCommand, SelftestArgs, Setup};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "gpuslice-bench",
    version,
    about = "Benchmarks that back gpuslice's claims, and the GPU machine's self-tests (bench/README.md)"
)]
struct Cli {
    #[command(flatten)]
    global: Global,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Bench(BenchCommand),
    /// Drive the device plugin with a test kubelet and report JSON (the GPU machine's check, benchmarks).
    DevicePluginSelftest(SelftestArgs),
    /// Benchmarks that back gpuslice's claims (bench/README.md), as `gpuslice bench …` names them.
    #[command(name = "bench", subcommand, hide = true)]
    AsGpuslice(BenchCommand),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let message = gpuslice::usage_message(&e);
            eprintln!("gpuslice-bench: {message} (see gpuslice-bench --help)");
            return ExitCode::from(2);
        }
    };
    gpuslice::init_logging(&cli.global);
    let result = setup(&cli.global).and_then(|ctx| match &cli.command {
        Command::Bench(c) | Command::AsGpuslice(c) => gpuslice_bench::run(&ctx, c),
        Command::DevicePluginSelftest(args) => gpuslice_bench::plugin_selftest(&ctx, args),
    });
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("gpuslice-bench: {}", gpuslice::one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// What the benchmarks and self-tests run against: the `gpuslice` binary
/// and the shim beside this one.
fn setup(g: &Global) -> anyhow::Result<Setup> {
    let gpuslice = gpuslice::gpuslice_exe()?;
    let shim =
        gpuslice::shim::find().unwrap_or_else(|_| gpuslice.with_file_name(gpuslice::shim::FILE));
    Ok(Setup {
        host_root: g.host_root.clone(),
        json: g.json,
        gpuslice,
        shim,
    })
}
