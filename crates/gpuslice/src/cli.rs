//! The command line, assembled from the commands' own arguments (each
//! command owns its arguments in `cmd/<command>.rs`); completions and the
//! man page are generated from it.

use crate::cmd;
use crate::global::Global;
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;

#[derive(Debug, Parser)]
#[command(
    name = "gpuslice",
    version,
    about = "Isolate, share and account NVIDIA GPUs for processes, containers and Kubernetes"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the host's GPUs (and MIG devices) and where the facts came from.
    List,
    /// Run a command that can reach only the selected GPUs.
    Run(cmd::run_args::RunArgs),
    /// Live slices with a memory cap or compute share: their processes, cap, share and use per GPU (from their ledgers).
    Slices,
    /// A live view of the GPUs and their slices (nvtop-style): memory and utilisation per GPU; per slice its cap and use, GPU-time share against its target, throttling, enforcement and processes. Refreshes each second; q quits.
    Top(cmd::top::TopArgs),
    /// The kubelet device plugin: each GPU in one role: nvidia.com/gpu (whole), gpu.shared (replicas capped by the shim) or mig-<profile>.
    DevicePlugin(cmd::device_plugin::DevicePluginArgs),
    /// Drive the device plugin with a test kubelet and report JSON (the GPU machine's check, benchmarks): runs gpuslice-bench.
    #[command(hide = true, disable_help_flag = true)]
    DevicePluginSelftest(ForwardedArgs),
    /// The Kubernetes DRA kubelet plugin: prepares ResourceClaims into slices with exactly the consumed memory and compute (CDI specs).
    Dra(cmd::dra::DraArgs),
    /// Write node labels (product, memory, driver, MIG, NVLink, sharing) as a Node Feature Discovery feature file.
    Labels(cmd::labels::LabelsArgs),
    /// Serve Prometheus metrics for GPUs (NVML) and slices (ledgers) on /metrics.
    Exporter(cmd::exporter::ExporterArgs),
    /// CDI specs for container runtimes (podman, containerd, CRI-O, Docker).
    #[command(subcommand)]
    Cdi(cmd::cdi::CdiCommand),
    /// Benchmarks that back gpuslice's claims (bench/README.md): runs gpuslice-bench, built beside gpuslice (`gpuslice bench --help`).
    #[command(disable_help_flag = true)]
    Bench(ForwardedArgs),
    /// Check the host, its isolation and its Kubernetes wiring; each finding with a one-line fix (exit 0 pass, 1 warn, 2 fail).
    Doctor(cmd::doctor::DoctorArgs),
    /// Print a shell completion script.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
}

/// A command another binary carries (`gpuslice-bench`: the benchmarks and
/// self-tests, which drive gpuslice with the test doubles and so are not
/// linked into it): its arguments, unparsed, for [`crate::exec_bench`],
/// which hands it the whole command line.
#[derive(Debug, Args)]
pub struct ForwardedArgs {
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub args: Vec<OsString>,
}

/// What the `gpuslice` binary parses itself: only the commands it carries,
/// with the same arguments as in [`Cli`]. Building the whole command line
/// (every command's arguments, down to the benchmarks') was a large part of
/// a launch's start-up (bench/README.md); anything else — another command,
/// `--help`, `--version`, a usage error — goes to `gpuslice-full`, which
/// parses the whole line and answers exactly as always.
#[derive(Debug, Parser)]
#[command(
    name = "gpuslice",
    disable_help_flag = true,
    disable_version_flag = true,
    disable_help_subcommand = true
)]
pub struct LeanCli {
    #[command(flatten)]
    pub global: Global,

    #[command(subcommand)]
    pub command: LeanCommand,
}

#[derive(Debug, Subcommand)]
pub enum LeanCommand {
    List,
    Run(cmd::run_args::RunArgs),
    Slices,
    /// Any other command: `gpuslice-full`'s.
    #[command(external_subcommand)]
    Other(Vec<OsString>),
}

impl LeanCli {
    /// The command line as [`Cli`] when it names a command this binary
    /// carries and parses cleanly; None otherwise.
    pub fn parse_carried() -> Option<Cli> {
        Self::parse_carried_from(std::env::args_os())
    }

    /// [`LeanCli::parse_carried`] of the given command line.
    pub fn parse_carried_from<I, T>(args: I) -> Option<Cli>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let lean = Self::try_parse_from(args).ok()?;
        let command = match lean.command {
            LeanCommand::List => Command::List,
            LeanCommand::Run(args) => Command::Run(args),
            LeanCommand::Slices => Command::Slices,
            LeanCommand::Other(_) => return None,
        };
        Some(Cli {
            global: lean.global,
            command,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lean(line: &str) -> Option<String> {
        LeanCli::parse_carried_from(line.split_whitespace()).map(|c| format!("{c:?}"))
    }

    fn full(line: &str) -> Option<String> {
        Cli::try_parse_from(line.split_whitespace())
            .ok()
            .map(|c| format!("{c:?}"))
    }

    #[test]
    fn the_lean_parser_reads_its_commands_exactly_as_the_full_one() {
        for line in [
            "gpuslice run --gpus 3 -- true",
            "gpuslice --host-root /tmp/h -vv run --gpus 0,1 --memory 20GiB --compute 30 --compute-mode guaranteed -- a b",
            "gpuslice run --gpus none --strict --pid host --preserve-fds 2 --user nobody:nogroup --cgroup v1 -- x",
            "gpuslice run --gpus all --privileged --isolation env --cuda-cache /c -- x --flag",
            "gpuslice --json list",
            "gpuslice slices --json",
            "gpuslice run --cdi-spec-dir /d --cdi-device gpuslice.dev/claim=u-0 -- x",
        ] {
            let l = lean(line);
            assert!(l.is_some(), "{line}");
            assert_eq!(l, full(line), "{line}");
        }
    }

    #[test]
    fn everything_else_goes_to_the_full_binary() {
        for line in [
            "gpuslice",
            "gpuslice --help",
            "gpuslice --version",
            "gpuslice help run",
            "gpuslice run --help",
            "gpuslice run --gpus 0 --bogus -- x",
            "gpuslice run --gpus 0 --strict --privileged -- x",
            "gpuslice cdi generate",
            "gpuslice bench launch --runs 3",
            "gpuslice doctor",
            "gpuslice run --cdi-device a.b/c=d --gpus 0 -- x",
            "gpuslice run --cdi-device a.b/c=d --memory 1GiB -- x",
            "gpuslice run -- x",
        ] {
            assert_eq!(lean(line), None, "{line}");
        }
    }
}
