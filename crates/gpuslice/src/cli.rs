//! The command line, assembled from the commands' own arguments (each
//! command owns its arguments in `cmd/<command>.rs`); completions and the
//! man page are generated from it.

use crate::cmd;
use crate::global::Global;
use clap::{Parser, Subcommand};

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
    Run(cmd::run::RunArgs),
    /// Live slices with a memory cap or compute share: their processes, cap, share and use per GPU (from their ledgers).
    Slices,
    /// The kubelet device plugin: each GPU in one role: nvidia.com/gpu (whole), gpu.shared (replicas capped by the shim) or mig-<profile>.
    DevicePlugin(cmd::device_plugin::DevicePluginArgs),
    /// Drive the device plugin with a test kubelet and report JSON (the GPU machine's check, benchmarks).
    #[command(hide = true)]
    DevicePluginSelftest(gpuslice_bench::SelftestArgs),
    /// The Kubernetes DRA kubelet plugin: prepares ResourceClaims into slices with exactly the consumed memory and compute (CDI specs).
    Dra(cmd::dra::DraArgs),
    /// Write node labels (product, memory, driver, MIG, NVLink, sharing) as a Node Feature Discovery feature file.
    Labels(cmd::labels::LabelsArgs),
    /// Serve Prometheus metrics for GPUs (NVML) and slices (ledgers) on /metrics.
    Exporter(cmd::exporter::ExporterArgs),
    /// CDI specs for container runtimes (podman, containerd, CRI-O, Docker).
    #[command(subcommand)]
    Cdi(cmd::cdi::CdiCommand),
    /// Benchmarks that back gpuslice's claims.
    #[command(subcommand)]
    Bench(gpuslice_bench::BenchCommand),
    /// Check the host, its isolation and its Kubernetes wiring; each finding with a one-line fix (exit 0 pass, 1 warn, 2 fail).
    Doctor(cmd::doctor::DoctorArgs),
    /// SIMULATION: build a fake GPU host in DIR to try gpuslice without NVIDIA hardware (then: gpuslice --host-root DIR list).
    Fakehost(cmd::fakehost::FakehostArgs),
    /// Print a shell completion script.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
}
