//! `gpuslice bench launch`: what full isolation adds to starting a process,
//! side by side with a bare exec and with bubblewrap.
//!
//! The variants run interleaved (A B C A B C …), so drift on the machine
//! hits each alike. Each sample is the wall time from spawn to reaped exit
//! of `/bin/true` (or `--cmd`), as the caller of each launcher sees it.

use crate::stats::Summary;
use crate::{host, Setup};
use anyhow::{bail, Context, Result};
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::HostRoot;
use gpuslice_isolate::launcher::pidfd_open;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::Pid;
use serde_json::json;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// Samples per variant.
    #[arg(long, default_value_t = 200)]
    pub runs: usize,
    /// GPU selector for the isolated variants.
    #[arg(long, default_value = "0")]
    pub gpus: String,
    /// Program to launch.
    #[arg(long, default_value = "/bin/true")]
    pub cmd: PathBuf,
    /// Write the JSON result here too.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

struct Variant {
    name: &'static str,
    argv: Vec<String>,
}

pub fn run(ctx: &Setup, args: &LaunchArgs) -> Result<i32> {
    let (date, _) = crate::utc_now();
    let inv = discover(&HostRoot::new(&ctx.host_root), &DiscoverOptions::default())?;
    let host = host::facts(&ctx.host_root, &inv);
    let variants = variants(ctx, args)?;
    for v in &variants {
        timed_run(v)?;
    }
    let mut samples = vec![Vec::with_capacity(args.runs); variants.len()];
    for _ in 0..args.runs {
        for (v, s) in variants.iter().zip(&mut samples) {
            s.push(timed_run(v)?);
        }
    }
    let summaries: Vec<Summary> = samples
        .iter()
        .map(|s| Summary::of(s).expect("runs > 0"))
        .collect();
    let bare = summaries[0].median;
    let result = json!({
        "benchmark": "launch",
        "date": date,
        "argv": std::env::args().collect::<Vec<_>>(),
        "host_root": ctx.host_root,
        "inventory_cache_dir": std::env::var(gpuslice_core::discover::cache::CACHE_DIR_ENV).ok(),
        "host": host,
        "runs": args.runs,
        "command": args.cmd,
        "gpus": args.gpus,
        "variants": variants.iter().zip(&summaries).map(|(v, s)| json!({
            "name": v.name,
            "argv": v.argv,
            "ms": s,
            "overhead_ms": s.median - bare,
        })).collect::<Vec<_>>(),
    });
    if ctx.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        println!(
            "{:<22} {:>9} {:>9} {:>9} {:>12}",
            "variant", "median", "p10", "p90", "vs bare"
        );
        for (v, s) in variants.iter().zip(&summaries) {
            println!(
                "{:<22} {:>7.2}ms {:>7.2}ms {:>7.2}ms {:>+10.2}ms",
                v.name,
                s.median,
                s.p10,
                s.p90,
                s.median - bare
            );
        }
    }
    if let Some(path) = &args.out {
        std::fs::write(path, serde_json::to_vec_pretty(&result)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(0)
}

fn variants(ctx: &Setup, args: &LaunchArgs) -> Result<Vec<Variant>> {
    let me = ctx.gpuslice.display().to_string();
    let cmd = args.cmd.display().to_string();
    let root = ctx.host_root.display().to_string();
    let isolated = |extra: &[&str]| {
        let mut argv = vec![&me[..], "--host-root", &root, "run", "--gpus", &args.gpus];
        argv.extend_from_slice(extra);
        argv.extend(["--", &cmd]);
        argv.iter().map(|s| s.to_string()).collect()
    };
    let mut v = vec![
        Variant {
            name: "bare",
            argv: vec![cmd.clone()],
        },
        Variant {
            // Every layer: private /dev, params overlay, device cgroup, PID
            // and cgroup namespaces with the slice's /proc, read-only /sys,
            // capabilities, no_new_privs, seccomp, descriptors closed.
            name: "gpuslice default",
            argv: isolated(&[]),
        },
        Variant {
            // The GPU layers only, as full root (no boundary).
            name: "gpuslice privileged",
            argv: isolated(&["--privileged"]),
        },
        Variant {
            name: "gpuslice env",
            argv: isolated(&["--isolation", "env", "--privileged"]),
        },
    ];
    if let Some(bwrap) = which("bwrap") {
        // bubblewrap's nearest equivalent of the default: PID and cgroup
        // namespaces and a fresh /dev (with no GPU node: less than the
        // slice gets), on the host's root.
        v.push(Variant {
            name: "bwrap pid+cgroup+dev",
            argv: [
                &bwrap,
                "--dev-bind",
                "/",
                "/",
                "--unshare-pid",
                "--unshare-cgroup",
                "--dev",
                "/dev",
                &cmd,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        });
    }
    Ok(v)
}

fn which(name: &str) -> Option<String> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}

/// A run that takes this long is hung, not slow.
const HUNG: Duration = Duration::from_secs(20);

/// Milliseconds from spawn to reaped exit of one run of `v`; a failed or
/// hung run fails the benchmark with what went wrong.
fn timed_run(v: &Variant) -> Result<f64> {
    let t = Instant::now();
    let mut child = spawn(&v.argv)?;
    let pidfd = pidfd_open(Pid::from_raw(child.id() as i32))?;
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(HUNG).expect("fits");
    if poll(&mut fds, timeout)? == 0 {
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "variant {} hung for {}s: {}",
            v.name,
            HUNG.as_secs(),
            v.argv.join(" ")
        );
    }
    let status = child.wait()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if !status.success() {
        bail!("variant {} failed ({status}): {}", v.name, v.argv.join(" "));
    }
    Ok(ms)
}

fn spawn(argv: &[String]) -> Result<std::process::Child> {
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", argv[0]))
}
