//! `gpuslice run`'s arguments as parsed, apart from what the launch does
//! with them (`run`), so that the launch's helpers (`slice_setup`,
//! `tenant`, `cdi_run`) read them without importing back from `run`.

use clap::builder::TypedValueParser;
use gpuslice_ledger::limits::Mode;
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CgroupVersion {
    V1,
    V2,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// GPUs to expose: comma list of 3, 0-3, GPU-<uuid>, 0000:3b:00.0, MIG-<uuid>, <gpu>:<mig>, all, none.
    #[arg(long, value_name = "SEL", required_unless_present = "cdi_device")]
    pub gpus: Option<String>,

    /// Apply a CDI device's edits (device nodes, mounts, env) as a container runtime would, on the host (root only; repeatable). Its device nodes select the GPUs, a limits record it mounts sets the caps: not with --gpus, --memory or --compute.
    #[arg(
        long,
        value_name = "VENDOR/CLASS=NAME",
        conflicts_with_all = ["gpus", "memory", "compute"]
    )]
    pub cdi_device: Vec<String>,

    /// Where --cdi-device looks for specs (repeatable) [default: /etc/cdi, /var/run/cdi].
    #[arg(long, value_name = "DIR", requires = "cdi_device")]
    pub cdi_spec_dir: Vec<PathBuf>,

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

    /// Make the host's root filesystem read-only in the slice, but for /tmp, /var/tmp, /dev/shm and the working directory (or what the admin policy's `writable` lists); the admin policy's `read_only_root` sets it for every policy-bound caller.
    #[arg(long, conflicts_with = "privileged")]
    pub read_only_root: bool,

    /// Pass descriptors 3 .. 3+N on to the command (as runc); all others are closed. 3+N must stay within the descriptor limit (RLIMIT_NOFILE).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub preserve_fds: u32,

    /// Run the command as USER[:GROUP] (names or numeric ids; supplementary groups from the group database) [default: the invoking user when run through sudo, else gpuslice's own ids].
    #[arg(long, value_name = "USER[:GROUP]")]
    pub user: Option<String>,

    /// Device cgroup to use [default: v2 when mounted, else v1].
    #[arg(long, value_enum, value_name = "VERSION")]
    pub cgroup: Option<CgroupVersion>,

    /// Cap GPU memory per selected GPU (e.g. 20GiB), applied to every process of the slice by libgpuslice.so (preloaded through the slice's /etc/ld.so.preload; see docs/security.md for what it does not stop).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<gpuslice_ledger::limits::MemorySize>,

    /// Compute share per selected GPU in percent of its time (e.g. 25): a hard cap on the GPU time of the slice's kernel and graph launches, shared by all its processes, applied by libgpuslice.so like --memory.
    #[arg(long, value_name = "PCT")]
    pub compute: Option<gpuslice_ledger::limits::ComputeShare>,

    /// How --compute applies: `cap` never lets the slice exceed its share; `guaranteed` lets it also use GPU time the other slices of its GPUs leave idle (work-conserving), falling back to its share when they are busy.
    #[arg(
        long,
        value_parser = compute_mode_parser(),
        value_name = "MODE",
        default_value = "cap",
        requires = "compute"
    )]
    pub compute_mode: Mode,

    /// Share a CUDA JIT cache between slices (sets CUDA_CACHE_PATH and CUDA_CACHE_MAXSIZE).
    #[arg(long, value_name = "DIR")]
    pub cuda_cache: Option<PathBuf>,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

impl RunArgs {
    /// `--gpus`; empty for a CDI launch (its device nodes select).
    pub fn selector(&self) -> &str {
        self.gpus.as_deref().unwrap_or("")
    }
}

/// `--compute-mode`: the slice contract's [`Mode`], parsed by its own
/// `FromStr`, with its values listed in help and errors.
fn compute_mode_parser() -> impl TypedValueParser<Value = Mode> {
    clap::builder::PossibleValuesParser::new(["cap", "guaranteed"]).try_map(|s| s.parse::<Mode>())
}

/// `run --pid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PidMode {
    Private,
    Host,
}
