//! `gpuslice-fakehost DIR`: a simulated GPU host to try gpuslice on a
//! machine without NVIDIA hardware.
//!
//! It is the tests' fake host (this crate's [`FakeHost`]): real device
//! nodes made with mknod (NVIDIA majors and minors, so the kernel's device
//! cgroup applies to them), `proc/driver/nvidia` and `sys/bus/pci` files
//! in the driver's formats. `gpuslice --host-root DIR …` then discovers,
//! hides and denies those nodes exactly as it does a real host's. A test
//! double, built with the workspace (`cargo build --release`) and never
//! installed: gpuslice links none of it, and only reads the simulated
//! host's layout (`gpuslice_core::simulation`).

use anyhow::{bail, Context, Result};
use clap::Parser;
use fakegpu::FakeHost;
use gpuslice_core::simulation::DRIVER_DIR;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// SIMULATION: build a fake GPU host in DIR to try gpuslice without NVIDIA hardware (then: gpuslice --host-root DIR list).
#[derive(Debug, Parser)]
#[command(name = "gpuslice-fakehost", version)]
struct FakehostArgs {
    /// Directory to build the simulated host in (created; must be empty or absent).
    #[arg(value_name = "DIR")]
    dir: PathBuf,

    /// Number of simulated GPUs (NVIDIA H200, 141 GiB, driver 580).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=fakegpu::MAX_GPUS as i64))]
    gpus: u32,

    /// Also install the fake CUDA driver (a simulated libcuda and NVML, with one shared engine per GPU) so that CUDA programs run in its slices: `gpuslice run --host-root DIR` points them at it. Needs the fake driver built beside this binary (`cargo build --release` builds it).
    #[arg(long)]
    driver: bool,

    /// Print what was built as JSON instead of the walkthrough.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = match FakehostArgs::try_parse() {
        Ok(args) => args,
        Err(e) => return usage_error(e),
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuslice-fakehost: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// clap's message on one line (exit 2); help and version as clap prints them.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
    if matches!(e.kind(), DisplayHelp | DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let rendered = e.render().to_string();
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    eprintln!(
        "gpuslice-fakehost: {} (see gpuslice-fakehost --help)",
        message.join(" ").trim_start_matches("error: ")
    );
    ExitCode::from(2)
}

fn run(args: &FakehostArgs) -> Result<()> {
    let dir = &args.dir;
    let existed = dir.exists();
    if existed && !is_empty_dir(dir)? {
        bail!(
            "{} is not empty: give a new or empty directory for the simulated host",
            dir.display()
        );
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("gpuslice-fakehost needs root: it makes device nodes with mknod (run it in a root shell, or with sudo)");
    }
    // Before anything is made: where the built fake driver is.
    let so = match args.driver {
        true => Some(fakegpu::try_driver_so_path().map_err(anyhow::Error::msg)?),
        false => None,
    };
    let host = FakeHost::builder()
        .gpus(args.gpus)
        .root(dir)
        .build()
        .and_then(|h| {
            if let Some(so) = &so {
                h.install_driver(so)?;
            }
            Ok(h)
        });
    let host = match host {
        Ok(h) => h,
        Err(e) => {
            // Leave nothing behind.
            if existed {
                clear_dir(dir);
            } else {
                let _ = std::fs::remove_dir_all(dir);
            }
            return Err(e)
                .with_context(|| format!("cannot build the simulated host in {}", dir.display()));
        }
    };
    let root = host.keep();
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "simulation": true,
                "host_root": root,
                "gpus": args.gpus,
                "driver": args.driver.then(|| root.join(DRIVER_DIR)),
            })
        );
    } else {
        print!("{}", walkthrough(&root, args.gpus, args.driver));
    }
    Ok(())
}

/// What was built and the commands to try next.
fn walkthrough(root: &Path, gpus: u32, driver: bool) -> String {
    let r = root.display();
    let pick = gpus.min(4) - 1;
    // Another GPU of the host, or (one GPU) a minor no GPU has.
    let other = if pick > 0 { pick - 1 } else { 1 };
    format!(
        "SIMULATION: a fake GPU host with {gpus} simulated NVIDIA H200 GPUs in {r}\n\
         (device nodes made with mknod, /proc/driver/nvidia and /sys files; no real GPU or driver).\n\
         gpuslice reads, hides and denies them as it does a real host's. Try:\n\
         \n  gpuslice --host-root {r} list\n\
         \x20 gpuslice --host-root {r} run --gpus {pick} -- ls {r}/dev\n\
         \x20     # only nvidia{pick} of the GPU nodes is left: a private /dev hides the others\n\
         \x20 gpuslice --host-root {r} run --gpus {pick} -- sh -c 'mknod {r}/dev/nvidia{other} c 195 {other}; cat {r}/dev/nvidia{pick}'\n\
         \x20     # re-creating another GPU's node: Operation not permitted (no CAP_MKNOD in the slice;\n\
         \x20     # with --privileged, which keeps it, the slice's device cgroup still refuses the node);\n\
         \x20     # its own GPU's node opens as far as a fake node can: No such device or address\n\
         {}\nRemove it with: rm -rf {r}\n",
        if driver {
            driver_walkthrough(root, pick)
        } else {
            String::new()
        }
    )
}

/// What the fake driver adds: CUDA programs run in the slices.
fn driver_walkthrough(root: &Path, pick: u32) -> String {
    let r = root.display();
    let lib = root.join(DRIVER_DIR);
    // Built beside this binary (cargo puts every binary of the workspace
    // in one directory); neither is installed by scripts/install.sh.
    let client = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join("gpuslice-demo-client")))
        .filter(|c| c.is_file())
        .map_or_else(
            || "gpuslice-demo-client".to_string(),
            |c| c.display().to_string(),
        );
    format!(
        "\nThe fake CUDA driver is installed in {l} (libcuda.so.1, libnvidia-ml.so.1: SIMULATION,\n\
         one shared engine per GPU). `gpuslice --host-root {r} run` points the slice's programs at it\n\
         (FAKEGPU_ROOT, LD_LIBRARY_PATH, FAKEGPU_ENGINE), so --memory and --compute are enforced on them:\n\
         \n  gpuslice --host-root {r} run --gpus {pick} --memory 2GiB -- {client} memory 3GiB\n\
         \x20 gpuslice --host-root {r} run --gpus 0 --compute 30 -- {client} compute 10\n\
         \x20 gpuslice --host-root {r} top      # meanwhile, in another shell: q quits\n",
        l = lib.display()
    )
}

fn is_empty_dir(dir: &Path) -> Result<bool> {
    let mut entries = std::fs::read_dir(dir)
        .with_context(|| format!("{} is not a readable directory", dir.display()))?;
    Ok(entries.next().is_none())
}

/// Empties a directory that was empty before we wrote into it.
fn clear_dir(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let _ = if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
    }
}
