//! The command-line definition; completions and the man page are generated
//! from it.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "gpuslice",
    version,
    about = "Isolate, share and account NVIDIA GPUs for processes, containers and Kubernetes"
)]
pub struct Cli {
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

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the host's GPUs (and MIG devices) and where the facts came from.
    List,
    /// Run a command that can reach only the selected GPUs.
    Run(RunArgs),
    /// Live slices with a memory cap or compute share: their processes, cap, share and use per GPU (from their ledgers).
    Slices,
    /// The kubelet device plugin: nvidia.com/gpu (whole), gpu.shared (replicas capped by the shim), mig-<profile>.
    DevicePlugin(crate::cmd::device_plugin::DevicePluginArgs),
    /// Drive the device plugin with a test kubelet and report JSON (the GPU machine's check, benchmarks).
    #[command(hide = true)]
    DevicePluginSelftest(crate::cmd::device_plugin::SelftestArgs),
    /// Write node labels (product, memory, driver, MIG, NVLink, sharing) as a Node Feature Discovery feature file.
    Labels(crate::cmd::labels::LabelsArgs),
    /// Serve Prometheus metrics for GPUs (NVML) and slices (ledgers) on /metrics.
    Exporter(crate::cmd::exporter::ExporterArgs),
    /// CDI specs for container runtimes (podman, containerd, CRI-O, Docker).
    #[command(subcommand)]
    Cdi(crate::cmd::cdi::CdiCommand),
    /// Benchmarks that back gpuslice's claims.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Check the host, its isolation and its Kubernetes wiring; each finding with a one-line fix (exit 0 pass, 1 warn, 2 fail).
    Doctor(crate::cmd::doctor::DoctorArgs),
    /// Print a shell completion script.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IsolationArg {
    /// All four layers: private /dev, params overlay and /proc masking, device cgroup, env.
    Full,
    /// Device cgroup and env.
    Cgroup,
    /// Private /dev and env (what bubblewrap does).
    Namespace,
    /// CUDA_VISIBLE_DEVICES and friends only.
    Env,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CgroupVersion {
    V1,
    V2,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// GPUs to expose: comma list of 3, 0-3, GPU-<uuid>, 0000:3b:00.0, MIG-<uuid>, <gpu>:<mig>, all, none.
    #[arg(long, value_name = "SEL")]
    pub gpus: String,

    /// Isolation layers [default: full as root, namespace (user namespace) otherwise].
    #[arg(long, value_enum)]
    pub isolation: Option<IsolationArg>,

    /// Keep no capability at all (a root command is uid 0 without any), on top of the default confinement.
    #[arg(long, conflicts_with = "privileged")]
    pub strict: bool,

    /// Run as full root with every capability, no seccomp filter, no PID or cgroup namespace and the caller's descriptors: NOT a security boundary (the command can undo the GPU isolation).
    #[arg(long)]
    pub privileged: bool,

    /// PID namespace: `private` (default) gives the slice its own /proc and an init; `host` shares the host's.
    #[arg(long, value_enum, value_name = "MODE", default_value = "private")]
    pub pid: PidMode,

    /// Pass descriptors 3 .. 3+N on to the command (as runc); all others are closed.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub preserve_fds: u32,

    /// Device cgroup to use [default: v2 when mounted, else v1].
    #[arg(long, value_enum, value_name = "VERSION")]
    pub cgroup: Option<CgroupVersion>,

    /// Cap GPU memory per selected GPU (e.g. 20GiB), enforced for every process of the slice by the preloaded libgpuslice.so.
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,

    /// Compute share per selected GPU in percent of its time (e.g. 25): a hard cap on the GPU time of the slice's kernel and graph launches, shared by all its processes, enforced by the preloaded libgpuslice.so.
    #[arg(long, value_name = "PCT")]
    pub compute: Option<String>,

    /// How --compute applies: `cap` never lets the slice exceed its share; `guaranteed` lets it also use GPU time the other slices of its GPUs leave idle (work-conserving), falling back to its share when they are busy.
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        default_value = "cap",
        requires = "compute"
    )]
    pub compute_mode: ComputeMode,

    /// Share a CUDA JIT cache between slices (sets CUDA_CACHE_PATH and CUDA_CACHE_MAXSIZE).
    #[arg(long, value_name = "DIR")]
    pub cuda_cache: Option<PathBuf>,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `run --pid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PidMode {
    Private,
    Host,
}

/// `run --compute-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ComputeMode {
    Cap,
    Guaranteed,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// CUDA start-up time per isolation method and number of GPUs reachable.
    Init(crate::cmd::bench_init::InitArgs),
    /// Launch overhead of isolation against a bare exec (and bubblewrap when installed).
    Launch(crate::cmd::bench_launch::LaunchArgs),
}
