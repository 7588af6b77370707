//! gpuslice: isolate, share and account NVIDIA GPUs.

mod cli;
mod cmd;
mod plot;
mod stats;

use clap::{CommandFactory, Parser};
use cli::{Cli, Command, LogFormat};
use gpuslice_isolate::launcher::{LaunchError, EXIT_LAUNCH_FAILED};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    init_logging(&cli);
    let result = match &cli.command {
        Command::List => cmd::list::run(&cli),
        Command::Run(args) => cmd::run::run(&cli, args),
        Command::Slices => cmd::slices::run(&cli),
        Command::Cdi(c) => cmd::cdi::run(&cli, c),
        Command::Exporter(args) => cmd::exporter::run(&cli, args),
        Command::Labels(args) => cmd::labels::run(&cli, args),
        Command::DevicePlugin(args) => cmd::device_plugin::run(&cli, args),
        Command::DevicePluginSelftest(args) => cmd::device_plugin::selftest(&cli, args),
        Command::Bench(cli::BenchCommand::Launch(args)) => cmd::bench_launch::run(&cli, args),
        Command::Bench(cli::BenchCommand::Init(args)) => cmd::bench_init::run(&cli, args),
        Command::Doctor(args) => cmd::doctor::run(&cli, args),
        Command::Completions { shell } => {
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "gpuslice",
                &mut std::io::stdout(),
            );
            Ok(0)
        }
        Command::Man => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .map(|_| 0)
            .map_err(Into::into),
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("gpuslice: {}", one_line(&e));
            let code = match (e.downcast_ref::<LaunchError>(), &cli.command) {
                (Some(LaunchError::Child { code, .. }), _) => *code,
                (_, Command::Run(_)) => EXIT_LAUNCH_FAILED,
                _ => 1,
            };
            ExitCode::from(code as u8)
        }
    }
}

/// An error and its causes on one line.
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    parts.dedup();
    parts.join(": ").replace('\n', " ")
}

/// clap's message cut to its first line; `run` exits 125 like `docker run`.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind::*;
    if matches!(e.kind(), DisplayHelp | DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let rendered = e.render().to_string();
    // clap spreads one error over several lines (the error, the missing
    // arguments, a tip); the usage that follows is what --help is for.
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let message = message.join(" ");
    let is_run = std::env::args()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "run");
    let hint = if is_run {
        "gpuslice run --help"
    } else {
        "gpuslice --help"
    };
    eprintln!(
        "gpuslice: {} (see {hint})",
        message.trim_start_matches("error: ")
    );
    ExitCode::from(if is_run { EXIT_LAUNCH_FAILED as u8 } else { 2 })
}

fn init_logging(cli: &Cli) {
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUSLICE_LOG_LEVEL")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.without_time().with_target(false).init(),
    }
}
