//! gpuslice: isolate, share and account NVIDIA GPUs.
//!
//! Two binaries share this library and the one command line ([`cli::Cli`]):
//! - `gpuslice` carries the commands on a job's start-up path (`run`, and
//!   `list` and `slices`, which share its discovery and ledger code) and
//!   hands every other command to `gpuslice-full` beside it, by exec with
//!   the same arguments;
//! - `gpuslice-full` carries them all (the daemons with their tokio, gRPC,
//!   HTTP and CDI stacks) but the benchmarks and self-tests, which drive
//!   gpuslice with its test doubles: `bench` and `device-plugin-selftest`
//!   exec `gpuslice-bench` beside it (package gpuslice-bench, under
//!   testing/; nothing of it or of the doubles is linked here).
//!
//! Why: `gpuslice run` is paid at the start of every job, and much of a
//! small process's start-up is the loader mapping and relocating its
//! binary: `gpuslice-full --version` (16 MB) takes 1.52 ms, the 2.9 MB
//! `gpuslice --version` 1.17 ms, `/bin/true` 0.98 ms (bench/README.md).

// The doc comments of the argument structs are clap's help text, written
// for a terminal (`GPU-<uuid>`), not for rustdoc's HTML.
#![allow(rustdoc::invalid_html_tags)]

mod binaries;
pub mod cli;
mod cmd;
pub mod global;
pub mod shim;

pub use binaries::{exec_bench, exec_full, gpuslice_exe, BENCH_BINARY, FULL_BINARY};
use clap::{CommandFactory, Parser};
use cli::{Cli, Command};
use global::{Global, LogFormat};
use gpuslice_isolate::launcher::{LaunchError, EXIT_LAUNCH_FAILED};

/// Parses the command line; on a usage error, the exit status.
pub fn parse() -> Result<Cli, u8> {
    Cli::try_parse().map_err(usage_error)
}

/// The `gpuslice` binary's parse: the command line when it names a command
/// this binary carries (see [`cli::LeanCli`]); None for `gpuslice-full`.
pub fn parse_lean() -> Option<Cli> {
    cli::LeanCli::parse_carried()
}

/// The `gpuslice` binary says it is linked statically (its `main` is
/// compiled with the build's `crt-static`, this library is not).
pub fn set_linked_statically() {
    cmd::run::set_linked_statically();
}

/// In a setuid-root install, every command but `run` (which the admin
/// policy decides) gives root up for good before doing anything: `list`,
/// `doctor`, `cdi generate --output` … run as the real user, so they
/// cannot read or write what that user could not. `cli` is None for a
/// command line the `gpuslice` binary leaves to `gpuslice-full` unparsed.
pub fn shed_setuid(cli: Option<&Cli>) -> anyhow::Result<()> {
    use gpuslice_policy::{Caller, Via};
    let setuid = matches!(
        Caller::detect()?,
        Caller::User {
            via: Via::Setuid,
            ..
        }
    );
    let run = cli.is_some_and(|c| matches!(c.command, Command::Run(_)));
    if setuid && !run {
        // The supplementary groups are already the user's: setuid exec
        // changes only the effective (and saved) uid.
        let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
        nix::unistd::setresgid(gid, gid, gid)?;
        nix::unistd::setresuid(uid, uid, uid)?;
    }
    Ok(())
}

/// Runs a command `gpuslice` itself carries; None for the others, and
/// for what a statically linked launcher leaves to `gpuslice-full`
/// (`cmd::run::linked_statically`).
pub fn run_lean(cli: &Cli) -> Option<anyhow::Result<i32>> {
    let g = &cli.global;
    let result = match &cli.command {
        // A CDI launch parses specs with the CDI stack: gpuslice-full's.
        Command::Run(args) if !args.cdi_device.is_empty() => return None,
        Command::Run(args) if cmd::run::carried_here(args) => cmd::run::run(g, args),
        _ if cmd::run::linked_statically() => return None,
        Command::List => cmd::list::run(g),
        Command::Run(args) => cmd::run::run(g, args),
        Command::Slices => cmd::slices::run(g),
        _ => return None,
    };
    // Discovery found MIG devices, whose UUIDs only NVML knows.
    if result
        .as_ref()
        .is_err_and(|e| e.is::<cmd::run::NeedsFullBinary>())
    {
        return None;
    }
    Some(result)
}

/// Every command.
pub fn run_full(cli: &Cli) -> anyhow::Result<i32> {
    let g = &cli.global;
    match &cli.command {
        Command::List => cmd::list::run(g),
        Command::Run(args) if !args.cdi_device.is_empty() => cmd::cdi_run::run(g, args),
        Command::Run(args) => cmd::run::run(g, args),
        Command::Slices => cmd::slices::run(g),
        Command::Cdi(c) => cmd::cdi::run(g, c),
        Command::Exporter(args) => cmd::exporter::run(g, args),
        Command::Labels(args) => cmd::labels::run(g, args),
        Command::DevicePlugin(args) => cmd::device_plugin::run(g, args),
        Command::Bench(_) | Command::DevicePluginSelftest(_) => Err(exec_bench()),
        Command::Dra(args) => cmd::dra::run(g, args),
        Command::Doctor(args) => cmd::doctor::run(g, args),
        Command::Top(args) => cmd::top::run(g, args),
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
    }
}

/// Reports `result` the way every command does and gives the exit status.
pub fn finish(cli: &Cli, result: anyhow::Result<i32>) -> u8 {
    match result {
        Ok(code) => code.clamp(0, 255) as u8,
        Err(e) => {
            eprintln!("gpuslice: {}", one_line(&e));
            let code = match (e.downcast_ref::<LaunchError>(), &cli.command) {
                (Some(LaunchError::Child { code, .. }), _) => *code,
                (_, Command::Run(_)) => EXIT_LAUNCH_FAILED,
                _ => 1,
            };
            code as u8
        }
    }
}

/// An error and its causes on one line.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    parts.dedup();
    parts.join(": ").replace('\n', " ")
}

/// clap's usage error on one line, without its `error: `.
pub fn usage_message(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    // clap spreads one error over several lines (the error, the missing
    // arguments, a tip); the usage that follows is what --help is for.
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    message.join(" ").trim_start_matches("error: ").to_string()
}

/// clap's message cut to its first line; `run` exits 125 like `docker run`.
fn usage_error(e: clap::Error) -> u8 {
    use clap::error::ErrorKind::*;
    if matches!(e.kind(), DisplayHelp | DisplayVersion) {
        let _ = e.print();
        return 0;
    }
    let is_run = std::env::args()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "run");
    let hint = if is_run {
        "gpuslice run --help"
    } else {
        "gpuslice --help"
    };
    eprintln!("gpuslice: {} (see {hint})", usage_message(&e));
    if is_run {
        EXIT_LAUNCH_FAILED as u8
    } else {
        2
    }
}

/// Logging to stderr as `-v`, `--log-format` and `GPUSLICE_LOG_LEVEL` say.
pub fn init_logging(global: &Global) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let level = match global.verbose {
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        _ => LevelFilter::DEBUG,
    };
    // `GPUSLICE_LOG_LEVEL`: `debug`, or per target (`gpuslice_isolate=debug,warn`).
    // Targets, not EnvFilter: no regex engine in the launcher's start-up.
    let filter = std::env::var("GPUSLICE_LOG_LEVEL")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(level));
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let registry = tracing_subscriber::registry();
    match global.log_format {
        LogFormat::Json => registry.with(layer.json().with_filter(filter)).init(),
        LogFormat::Text => registry
            .with(layer.without_time().with_target(false).with_filter(filter))
            .init(),
    }
}
