//! `gpuslice cdi generate|check`: CDI specs for container runtimes (the
//! work is in `gpuslice_cdi`).

use crate::global::Global;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use gpuslice_cdi::{self as cdi, Capability, CheckResult, Format, Options};
use gpuslice_core::HostRoot;
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Debug, Subcommand)]
pub enum CdiCommand {
    /// Write a CDI spec for this host's GPUs (devices by index, UUID, MIG, `all`, `<i>-shared-<n>`).
    Generate(GenerateArgs),
    /// Exit 0 when the spec matches what `generate` would write now, 1 (with the reason) otherwise.
    Check(CheckArgs),
    /// Run by container runtimes as a CDI hook (not by hand).
    #[command(hide = true, subcommand)]
    Hook(HookCommand),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormatArg {
    Yaml,
    Json,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Spec file to write (atomically) [default: /etc/cdi/gpuslice.yaml].
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Output format [default: from the file name: .json is JSON, else YAML].
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// Vendor of the device kind.
    #[arg(long, default_value = cdi::DEFAULT_VENDOR)]
    pub vendor: String,
    /// Class of the device kind.
    #[arg(long, default_value = cdi::DEFAULT_CLASS)]
    pub class: String,
    /// Driver capabilities whose libraries and tools are mounted: compute, utility, video, graphics, all.
    #[arg(long, default_value = "compute,utility", value_name = "LIST")]
    pub capabilities: String,
    /// Shared variants per GPU: `4` offers `<i>-shared-4` (a quarter of memory and compute); empty for none.
    #[arg(long, default_value = "2,4", value_name = "LIST")]
    pub shared: String,
    /// Write host paths relative to --host-root (a pod that mounts the host at /host writing for the host's runtime).
    #[arg(long)]
    pub strip_host_root: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The spec to check [default: /etc/cdi/gpuslice.yaml].
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// Bind FILE over the container's /proc/driver/nvidia/params (createContainer hook).
    Params {
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
    },
    /// The driver's memory partitions (R615+) of a capped slice's container.
    #[command(subcommand)]
    MemoryLimits(MemoryLimitsHook),
    /// Root's record of a shared variant container's compute share, so that it takes turns.
    #[command(subcommand)]
    Share(ShareHook),
}

#[derive(Debug, Subcommand)]
pub enum ShareHook {
    /// Make the container's usage ledger and record the shares of the limits record FILE on the boards in DIR (createRuntime hook).
    Set {
        #[arg(long, value_name = "FILE")]
        limits: PathBuf,
        #[arg(long, value_name = "DIR")]
        boards: PathBuf,
    },
    /// Remove the share records `set` made for the container (poststop hook).
    Clear,
}

#[derive(Debug, Subcommand)]
pub enum MemoryLimitsHook {
    /// Set the caps of the limits record FILE as hard limits on the container's cgroup v2 directory (createRuntime hook).
    Set {
        #[arg(long, value_name = "FILE")]
        limits: PathBuf,
    },
    /// Clear what `set` set for the container (poststop hook).
    Clear,
}

pub fn run(global: &Global, cmd: &CdiCommand) -> Result<i32> {
    let root = HostRoot::new(&global.host_root);
    match cmd {
        CdiCommand::Generate(a) => generate(global, &root, a),
        CdiCommand::Check(a) => check(&root, a),
        CdiCommand::Hook(HookCommand::Params { file }) => {
            let mut state = String::new();
            std::io::stdin().read_to_string(&mut state)?;
            cdi::params_hook(&state, file).context("gpuslice cdi hook params")?;
            Ok(0)
        }
        CdiCommand::Hook(HookCommand::MemoryLimits(h)) => memory_limits(global, h),
        CdiCommand::Hook(HookCommand::Share(h)) => share(global, h),
    }
}

/// `gpuslice cdi hook share`: one line on stderr (the runtime's log) says
/// what was recorded or removed, or why nothing was.
fn share(global: &Global, h: &ShareHook) -> Result<i32> {
    use gpuslice_cdi::share_hook::{self, Done};
    let mut state = String::new();
    std::io::stdin().read_to_string(&mut state)?;
    let host = &global.host_root;
    let (what, done) = match h {
        ShareHook::Set { limits, boards } => {
            ("recorded", share_hook::set(&state, limits, boards, host))
        }
        ShareHook::Clear => ("removed", share_hook::clear(&state, host)),
    };
    match done.with_context(|| format!("gpuslice cdi hook share {what}"))? {
        Done::Applied(records) => eprintln!(
            "gpuslice: {} compute share record(s) {what}: the container takes turns on its GPU",
            records.len()
        ),
        Done::Skipped(why) => eprintln!("gpuslice: no compute share {what}: {why}"),
    }
    Ok(0)
}

/// `gpuslice cdi hook memory-limits`: one line on stderr (the runtime's
/// log) says what was set or cleared, or why nothing was.
fn memory_limits(global: &Global, h: &MemoryLimitsHook) -> Result<i32> {
    use gpuslice_cdi::memory_hook::{self, Done};
    let mut state = String::new();
    std::io::stdin().read_to_string(&mut state)?;
    let nvml = super::enforce::simulated_nvml(&global.host_root);
    let host = &global.host_root;
    let (what, done) = match h {
        MemoryLimitsHook::Set { limits } => (
            "set",
            memory_hook::set(&state, limits, host, nvml.as_deref()),
        ),
        MemoryLimitsHook::Clear => ("cleared", memory_hook::clear(&state, host, nvml.as_deref())),
    };
    match done.with_context(|| format!("gpuslice cdi hook memory-limits {what}"))? {
        Done::Applied { cgroup, uuids } => eprintln!(
            "gpuslice: the driver's memory limit {what} on {} for {}",
            cgroup.display(),
            uuids.join(", ")
        ),
        Done::Skipped(why) => eprintln!(
            "gpuslice: no driver memory limit {what}: {why}; the shim and root's enforcer hold the slice"
        ),
    }
    Ok(0)
}

fn base_options(root: &HostRoot, spec_dir: &Path) -> Options {
    Options {
        shim: crate::shim::find().ok(),
        hook: std::env::current_exe()
            .ok()
            .and_then(|p| p.canonicalize().ok()),
        spec_dir: spec_dir.to_path_buf(),
        boards: Some(root.join(gpuslice_ledger::board::DEFAULT_BOARD_DIR)),
        ..Options::default()
    }
}

fn spec_dir(output: &Path) -> PathBuf {
    let dir = output.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf())
}

fn generate(global: &Global, root: &HostRoot, a: &GenerateArgs) -> Result<i32> {
    let output = a
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(cdi::DEFAULT_OUTPUT));
    if output.is_dir() {
        bail!(
            "--output {} is a directory; name a file such as {}/gpuslice.yaml",
            output.display(),
            output.display()
        );
    }
    if let Some(parent) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let dir = spec_dir(&output);
    let mut opts = Options {
        vendor: a.vendor.clone(),
        class: a.class.clone(),
        capabilities: Capability::parse_list(&a.capabilities)?,
        shared: cdi::parse_shared(&a.shared)?,
        strip_host_root: a.strip_host_root,
        ..base_options(root, &dir)
    };
    // The shared variants bind the GPUs' boards: they must be there.
    if let Some(boards) = opts.boards.take() {
        match gpuslice_ledger::board::prepare_dir(&boards) {
            Ok(()) => opts.boards = Some(boards),
            Err(e) => eprintln!(
                "gpuslice: warning: {}: {e}; shared variants will not take turns on the GPU",
                boards.display()
            ),
        }
    }
    let format = match a.format {
        Some(FormatArg::Json) => Format::Json,
        Some(FormatArg::Yaml) => Format::Yaml,
        None => Format::for_path(&output),
    };
    let g = cdi::generate(root, &opts)?;
    for w in &g.warnings {
        eprintln!("gpuslice: warning: {w}");
    }
    cdi::write_atomically(&g, &output, format)?;
    let devices = serde_json::to_value(&g.spec)?["devices"]
        .as_array()
        .map_or(0, Vec::len);
    if global.json {
        println!(
            "{}",
            serde_json::json!({
                "output": output.display().to_string(),
                "kind": format!("{}/{}", opts.vendor, opts.class),
                "devices": devices,
                "warnings": g.warnings,
            })
        );
    } else {
        println!(
            "wrote {} ({}/{}: {devices} devices)",
            output.display(),
            opts.vendor,
            opts.class
        );
    }
    Ok(0)
}

fn check(root: &HostRoot, a: &CheckArgs) -> Result<i32> {
    let spec = a
        .spec
        .clone()
        .unwrap_or_else(|| PathBuf::from(cdi::DEFAULT_OUTPUT));
    let opts = base_options(root, &spec_dir(&spec));
    match cdi::check(root, &spec, &opts)? {
        CheckResult::Current => {
            println!("current: {}", spec.display());
            Ok(0)
        }
        CheckResult::Stale(why) => {
            println!("{why}");
            Ok(1)
        }
    }
}
