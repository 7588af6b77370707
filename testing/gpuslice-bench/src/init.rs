//! `gpuslice bench init`: CUDA start-up time per isolation method and per
//! number of GPUs a process can reach.
//!
//! For each GPU count k (GPUs 0..k-1) and each method, N fresh processes
//! run the workload (the CUDA start-up probe, or PyTorch's first CUDA
//! tensor). Every round runs each (k, method) cell once, in an order
//! shuffled per round, so drift on the machine hits every cell alike.
//!
//! Two kinds of figure are kept apart:
//! - *in process*: the phases the workload times with its own clock
//!   (`init_ms` is cuInit for the probe, `torch.cuda.init()` for torch);
//! - *bench*: what this command measures around the process: `ready_ms`
//!   (spawn → result line read) and `wall_ms` (spawn → exit reaped), which
//!   include gpuslice's own launch for the isolated methods.
//!
//! A failed run (cannot start, non-zero exit, timeout, no result line, a
//! CUDA error, or a device count other than the method should give) is
//! kept with its reason, left out of the statistics, reported in the table
//! and the JSON, and makes the command exit 1.

use crate::stats::Summary;
use crate::{host, plot, Setup};
use anyhow::{bail, Context, Result};
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::HostRoot;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// No gpuslice: the workload runs directly and reaches every GPU.
    None,
    /// `gpuslice run --isolation env` (CUDA_VISIBLE_DEVICES only).
    Env,
    /// `gpuslice run --isolation namespace` (private /dev + env).
    Namespace,
    /// `gpuslice run --isolation cgroup` (device cgroup + env).
    Cgroup,
    /// `gpuslice run --isolation full` (all four layers).
    Full,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::None => "none",
            Method::Env => "env",
            Method::Namespace => "namespace",
            Method::Cgroup => "cgroup",
            Method::Full => "full",
        }
    }

    /// A fixed colour per method, so plots of different runs compare.
    fn color(self) -> (u8, u8, u8) {
        match self {
            Method::None => (80, 80, 80),
            Method::Env => (230, 159, 0),
            Method::Namespace => (86, 180, 233),
            Method::Cgroup => (0, 158, 115),
            Method::Full => (204, 51, 102),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// gpuslice-cuda-probe: dlopen, cuInit, device count, context, 1 MiB alloc.
    Probe,
    /// python3 -c 'import torch; torch.zeros(1).cuda()': what a service owner feels.
    Torch,
}

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// GPU counts k to measure, each with GPUs 0..k-1 [default: 1, 2, 4, … up to the host's
    /// GPU count, and that count].
    #[arg(long, value_delimiter = ',', value_name = "K,…")]
    pub counts: Vec<u32>,
    /// Methods to compare: none (no gpuslice, every GPU reachable), env, namespace, cgroup, full.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "METHOD,…",
          default_values_t = [Method::None, Method::Env, Method::Namespace, Method::Cgroup, Method::Full])]
    pub methods: Vec<Method>,
    /// Fresh processes per (count, method) [default: 20; 10 with --workload torch].
    #[arg(long, value_name = "N")]
    pub runs: Option<usize>,
    /// Rounds run first and left out of the statistics (they warm the page cache).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub warmup: usize,
    /// What each process does.
    #[arg(long, value_enum, default_value_t = Workload::Probe)]
    pub workload: Workload,
    /// Write bench-init-<time>.json (every sample) and .svg (the plot) here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The probe [default: gpuslice-cuda-probe beside this gpuslice].
    #[arg(long, value_name = "PATH")]
    pub probe: Option<PathBuf>,
    /// Python interpreter for --workload torch.
    #[arg(long, default_value = "python3", value_name = "PATH")]
    pub python: String,
    /// Seconds after which a run is killed and recorded as failed.
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    pub timeout: u64,
    /// Seed of the per-round order [default: from the clock; recorded in the JSON].
    #[arg(long)]
    pub seed: Option<u64>,
}

/// What the torch workload runs: one JSON line, like the probe.
const TORCH_SCRIPT: &str = r#"import json, sys, time
t0 = time.perf_counter()
r = {}
try:
    import torch
    t1 = time.perf_counter(); r["import_ms"] = (t1 - t0) * 1e3
    torch.cuda.init(); r["count"] = torch.cuda.device_count()
    t2 = time.perf_counter(); r["init_ms"] = (t2 - t1) * 1e3
    x = torch.zeros(1).cuda(); torch.cuda.synchronize()
    t3 = time.perf_counter(); r["tensor_ms"] = (t3 - t2) * 1e3; r["total_ms"] = (t3 - t0) * 1e3
    r["torch"] = torch.__version__; r["torch_cuda"] = torch.version.cuda
    r["name"] = torch.cuda.get_device_name(0)
except Exception as e:
    r["error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(r), flush=True)
sys.exit(1 if "error" in r else 0)
"#;

/// Bench-side figures, the same for every workload.
const MEASURED: &[(&str, &str)] = &[
    (
        "ready_ms",
        "bench: spawn → the workload's result line read (gpuslice's launch included for isolated methods)",
    ),
    (
        "wall_ms",
        "bench: spawn → exit reaped, the whole process (gpuslice's launch included for isolated methods)",
    ),
];

struct Spec {
    name: &'static str,
    argv: Vec<OsString>,
    /// In-process phases, as the workload prints them.
    phases: &'static [(&'static str, &'static str)],
    /// Columns of the table; the starred ones show p10–p90 and ratios.
    columns: &'static [&'static str],
    /// (in-process, bench) headline figures: plotted, and ratios in the table.
    headline: [&'static str; 2],
    /// The plot's panel titles for the headline figures.
    plot_titles: [&'static str; 2],
}

impl Spec {
    fn new(args: &InitArgs) -> Result<Self> {
        Ok(match args.workload {
            Workload::Probe => {
                let probe = match &args.probe {
                    Some(p) => p.clone(),
                    None => std::env::current_exe()?.with_file_name("gpuslice-cuda-probe"),
                };
                if !probe.is_file() {
                    bail!(
                        "no probe at {} (build gpuslice-cuda-probe or pass --probe)",
                        probe.display()
                    );
                }
                Spec {
                    name: "probe",
                    argv: vec![probe.into()],
                    phases: &[
                        ("dlopen_ms", "in process: dlopen(libcuda.so.1)"),
                        ("init_ms", "in process: cuInit(0)"),
                        ("count_ms", "in process: cuDeviceGetCount"),
                        (
                            "ctx_ms",
                            "in process: cuDevicePrimaryCtxRetain + cuCtxSetCurrent on device 0",
                        ),
                        ("alloc_ms", "in process: first cuMemAlloc (1 MiB)"),
                        ("total_ms", "in process: dlopen through the first allocation"),
                    ],
                    columns: &["init_ms*", "ctx_ms", "alloc_ms", "total_ms", "wall_ms*"],
                    headline: ["init_ms", "wall_ms"],
                    plot_titles: [
                        "cuInit, timed in the process (init_ms)",
                        "spawn → exit, timed by the bench, gpuslice's launch included (wall_ms)",
                    ],
                }
            }
            Workload::Torch => Spec {
                name: "torch",
                argv: vec![
                    args.python.clone().into(),
                    "-c".into(),
                    TORCH_SCRIPT.into(),
                ],
                phases: &[
                    ("import_ms", "in process: import torch"),
                    (
                        "init_ms",
                        "in process: torch.cuda.init() + device_count() (cuInit, through the CUDA runtime)",
                    ),
                    (
                        "tensor_ms",
                        "in process: torch.zeros(1).cuda() + synchronize (context, allocation, copy)",
                    ),
                    ("total_ms", "in process: import through the first CUDA tensor"),
                ],
                columns: &[
                    "import_ms",
                    "init_ms*",
                    "tensor_ms",
                    "total_ms",
                    "ready_ms*",
                    "wall_ms",
                ],
                headline: ["init_ms", "ready_ms"],
                plot_titles: [
                    "torch.cuda.init(), timed in the process (init_ms)",
                    "spawn → first CUDA tensor printed, timed by the bench (ready_ms)",
                ],
            },
        })
    }

    fn metrics(&self) -> impl Iterator<Item = &(&'static str, &'static str)> {
        self.phases.iter().chain(MEASURED)
    }
}

/// One (k, method) combination.
struct Cell {
    k: u32,
    method: Method,
    /// `--gpus` for the isolated methods.
    selector: String,
    argv: Vec<OsString>,
    /// The device count the workload must report.
    expect_count: u32,
    samples: Vec<Sample>,
    warmup: Vec<Sample>,
}

#[derive(Debug, Clone, Serialize)]
struct Sample {
    round: usize,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    signal: Option<i32>,
    wall_ms: f64,
    ready_ms: Option<f64>,
    /// The workload's JSON line, as printed.
    output: Option<Value>,
    /// The end of its stderr, kept for failed runs only.
    #[serde(skip_serializing_if = "Option::is_none")]
    stderr: Option<String>,
}

impl Sample {
    fn metric(&self, name: &str) -> Option<f64> {
        match name {
            "wall_ms" => Some(self.wall_ms),
            "ready_ms" => self.ready_ms,
            _ => self.output.as_ref()?.get(name)?.as_f64(),
        }
    }
}

pub fn run(ctx: &Setup, args: &InitArgs) -> Result<i32> {
    let spec = Spec::new(args)?;
    let runs = args.runs.unwrap_or(match args.workload {
        Workload::Probe => 20,
        Workload::Torch => 10,
    });
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    if args.methods.is_empty() {
        bail!("--methods is empty");
    }
    let (date, stamp) = crate::utc_now();
    let inv = discover(&HostRoot::new(&ctx.host_root), &DiscoverOptions::default())?;
    let n = inv.gpus.len() as u32;
    if n == 0 {
        bail!("no GPU found below {}", ctx.host_root.display());
    }
    let counts = counts(&args.counts, n)?;
    let mut methods: Vec<Method> = Vec::new();
    for &m in &args.methods {
        if !methods.contains(&m) {
            methods.push(m);
        }
    }
    // NVML is shut down again before the first run: a client holding the
    // driver open would change what start-up costs.
    let host = host::facts(&ctx.host_root, &inv);
    let mut cells = cells(ctx, &spec, &counts, &methods, n)?;

    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut rng = fastrand::Rng::with_seed(seed);
    let timeout = Duration::from_secs(args.timeout.max(1));
    let rounds = args.warmup + runs;
    let bar = progress((rounds * cells.len()) as u64);
    let mut order: Vec<usize> = (0..cells.len()).collect();
    for round in 0..rounds {
        rng.shuffle(&mut order);
        let warm = round < args.warmup;
        for &i in &order {
            let cell = &mut cells[i];
            bar.set_message(format!(
                "{}round {}/{} · k={} {}",
                if warm { "warm-up " } else { "" },
                round + 1,
                rounds,
                cell.k,
                cell.method.name()
            ));
            let mut sample = execute(&cell.argv, cell.method, timeout);
            sample.round = round;
            validate(&mut sample, args.workload, cell.expect_count);
            if warm {
                cell.warmup.push(sample);
            } else {
                cell.samples.push(sample);
            }
            bar.inc(1);
        }
        if warm && round + 1 == args.warmup {
            nothing_works(&cells)?;
        }
    }
    bar.finish_and_clear();

    let doc = document(ctx, args, &spec, &cells, runs, seed, &date, host);
    if ctx.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", table(&spec, &cells, &doc));
    }
    if let Some(dir) = &args.out {
        write_outputs(dir, &spec, &cells, &doc, &stamp)?;
    }
    let failed: usize = cells
        .iter()
        .map(|c| c.samples.iter().filter(|s| !s.ok).count())
        .sum();
    if failed > 0 {
        eprintln!(
            "gpuslice: bench init: {failed} of {} runs failed (kept in the results with their reasons)",
            runs * cells.len()
        );
        return Ok(1);
    }
    Ok(0)
}

/// The counts asked for, or 1, 2, 4, … ≤ n and n itself.
fn counts(asked: &[u32], n: u32) -> Result<Vec<u32>> {
    let mut counts: Vec<u32> = if asked.is_empty() {
        let mut c: Vec<u32> = std::iter::successors(Some(1u32), |k| k.checked_mul(2))
            .take_while(|&k| k <= n)
            .collect();
        c.push(n);
        c
    } else {
        asked.to_vec()
    };
    counts.sort_unstable();
    counts.dedup();
    if let Some(bad) = counts.iter().find(|&&k| k == 0 || k > n) {
        bail!("--counts: {bad} is not between 1 and the host's {n} GPUs");
    }
    Ok(counts)
}

fn cells(
    ctx: &Setup,
    spec: &Spec,
    counts: &[u32],
    methods: &[Method],
    n: u32,
) -> Result<Vec<Cell>> {
    let me: OsString = ctx.gpuslice.clone().into();
    let mut cells = Vec::new();
    for &k in counts {
        let selector = if k == 1 {
            "0".to_string()
        } else {
            format!("0-{}", k - 1)
        };
        for &method in methods {
            let argv = match method {
                Method::None => spec.argv.clone(),
                _ => {
                    let mut a: Vec<OsString> = vec![
                        me.clone(),
                        "--host-root".into(),
                        ctx.host_root.clone().into(),
                        "run".into(),
                        "--gpus".into(),
                        selector.clone().into(),
                        "--isolation".into(),
                        method.name().into(),
                        "--".into(),
                    ];
                    a.extend(spec.argv.iter().cloned());
                    a
                }
            };
            cells.push(Cell {
                k,
                method,
                selector: selector.clone(),
                argv,
                expect_count: if method == Method::None { n } else { k },
                samples: Vec::new(),
                warmup: Vec::new(),
            });
        }
    }
    Ok(cells)
}

fn progress(len: u64) -> ProgressBar {
    // Hidden by indicatif itself when stderr is not a terminal.
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ({elapsed} elapsed, ~{eta} left)")
    {
        bar.set_style(style);
    }
    bar
}

/// Runs `argv` once: spawn → result line → exit, with a kill at `timeout`.
fn execute(argv: &[OsString], method: Method, timeout: Duration) -> Sample {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout kills gpuslice and the workload.
        .process_group(0);
    if method == Method::None {
        // Every GPU reachable, whatever the caller's environment says.
        cmd.env_remove(gpuslice_ledger::limits::ENV_CUDA_VISIBLE);
    }
    let mut sample = Sample {
        round: 0,
        ok: false,
        failure: None,
        exit_code: None,
        signal: None,
        wall_ms: 0.0,
        ready_ms: None,
        output: None,
        stderr: None,
    };
    let start = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            sample.wall_ms = ms(start);
            sample.failure = Some(format!("cannot start {}: {e}", argv[0].to_string_lossy()));
            return sample;
        }
    };
    let pid = child.id() as i32;
    let (cancel, cancelled) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let fired = matches!(
            cancelled.recv_timeout(timeout),
            Err(mpsc::RecvTimeoutError::Timeout)
        );
        if fired {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        fired
    });
    let mut err_pipe = child.stderr.take().expect("piped stderr");
    let stderr = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err_pipe.read_to_end(&mut buf);
        buf
    });
    let mut other_stdout = String::new();
    let out = BufReader::new(child.stdout.take().expect("piped stdout"));
    for line in out.lines() {
        let Ok(line) = line else { break };
        if sample.output.is_none() && line.trim_start().starts_with('{') {
            sample.ready_ms = Some(ms(start));
            match serde_json::from_str::<Value>(&line) {
                Ok(v) => sample.output = Some(v),
                Err(e) => other_stdout.push_str(&format!("unparsable result line ({e}): {line}\n")),
            }
        } else if other_stdout.len() < 4000 {
            other_stdout.push_str(&line);
            other_stdout.push('\n');
        }
    }
    let status = child.wait();
    sample.wall_ms = ms(start);
    drop(cancel);
    let timed_out = watchdog.join().unwrap_or(false);
    let err_text = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
    match status {
        Ok(st) => {
            sample.exit_code = st.code();
            sample.signal = st.signal();
            if timed_out {
                sample.failure = Some(format!("killed after {} s", timeout.as_secs()));
            } else if !st.success() {
                sample.failure = Some(format!("exited with {st}"));
            }
        }
        Err(e) => sample.failure = Some(format!("wait failed: {e}")),
    }
    if sample.failure.is_none() && sample.output.is_none() {
        sample.failure = Some("no JSON result line on stdout".into());
    }
    if sample.failure.is_some() || !other_stdout.is_empty() {
        let text = format!("{other_stdout}{err_text}");
        sample.stderr = Some(tail(&text, 2000));
    }
    sample
}

/// Marks a run that exited 0 but did not do its job as failed.
fn validate(s: &mut Sample, workload: Workload, expect_count: u32) {
    if s.failure.is_none() {
        s.failure = output_problem(s.output.as_ref(), workload, expect_count);
    }
    s.ok = s.failure.is_none();
    if s.ok {
        s.stderr = None;
    }
}

fn output_problem(out: Option<&Value>, workload: Workload, expect: u32) -> Option<String> {
    let out = out?;
    if let Some(e) = out.get("error") {
        return Some(format!(
            "workload error: {}",
            e.as_str().unwrap_or(&e.to_string())
        ));
    }
    if workload == Workload::Probe {
        for (key, what) in [
            ("init_rc", "cuInit"),
            ("count_rc", "cuDeviceGetCount"),
            ("ctx_rc", "primary context"),
            ("alloc_rc", "cuMemAlloc"),
        ] {
            match out.get(key).and_then(Value::as_i64) {
                Some(0) => {}
                Some(rc) => return Some(format!("{what} returned {rc}")),
                None => return Some(format!("{what} not reached ({key} missing)")),
            }
        }
    }
    match out.get("count").and_then(Value::as_i64) {
        Some(c) if c == expect as i64 => None,
        Some(c) => Some(format!("saw {c} GPUs, expected {expect}")),
        None => Some("no device count in the result".into()),
    }
}

/// After the warm-up: stop when not a single run worked.
fn nothing_works(cells: &[Cell]) -> Result<()> {
    let warm: Vec<(&Cell, &Sample)> = cells
        .iter()
        .flat_map(|c| c.warmup.iter().map(move |s| (c, s)))
        .collect();
    if warm.is_empty() || warm.iter().any(|(_, s)| s.ok) {
        return Ok(());
    }
    let mut why = String::new();
    for (c, s) in warm.iter().take(3) {
        let _ = write!(
            why,
            "\n  k={} {}: {}{}",
            c.k,
            c.method.name(),
            s.failure.as_deref().unwrap_or("?"),
            s.stderr
                .as_deref()
                .map(|e| format!(" — {}", one_line(e)))
                .unwrap_or_default()
        );
    }
    bail!("every warm-up run failed, not measuring:{why}")
}

fn one_line(s: &str) -> String {
    tail(s.trim(), 300).replace('\n', " | ")
}

fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut at = s.len() - max;
    while !s.is_char_boundary(at) {
        at += 1;
    }
    format!("…{}", &s[at..])
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Summaries of the successful runs, per metric that has samples.
fn summaries(spec: &Spec, cell: &Cell) -> BTreeMap<&'static str, Summary> {
    spec.metrics()
        .filter_map(|(name, _)| {
            let v: Vec<f64> = cell
                .samples
                .iter()
                .filter(|s| s.ok)
                .filter_map(|s| s.metric(name))
                .collect();
            Summary::of(&v).map(|s| (*name, s))
        })
        .collect()
}

/// The document written to --out and printed with --json.
#[allow(clippy::too_many_arguments)]
fn document(
    ctx: &Setup,
    args: &InitArgs,
    spec: &Spec,
    cells: &[Cell],
    runs: usize,
    seed: u64,
    date: &str,
    host: Value,
) -> Value {
    let sums: Vec<_> = cells.iter().map(|c| summaries(spec, c)).collect();
    let median = |k: u32, m: Method, metric: &str| {
        cells
            .iter()
            .zip(&sums)
            .find(|(c, _)| c.k == k && c.method == m)
            .and_then(|(_, s)| s.get(metric))
            .map(|s| s.median)
    };
    // Median over the median of the `(k, method)` cell named, per metric
    // both have.
    let ratios = |s: &BTreeMap<&str, Summary>, (k, m): (u32, Method)| {
        let mut r = Map::new();
        for (metric, sum) in s {
            if let Some(b) = median(k, m, metric).filter(|b| *b > 0.0) {
                r.insert(metric.to_string(), json!(sum.median / b));
            }
        }
        Value::Object(r)
    };
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let metrics: Map<String, Value> = spec
        .metrics()
        .map(|(name, what)| {
            let by = if MEASURED.iter().any(|(m, _)| m == name) {
                "bench"
            } else {
                "process"
            };
            (name.to_string(), json!({"measured_by": by, "what": what}))
        })
        .collect();
    let cells_json: Vec<Value> = cells
        .iter()
        .zip(&sums)
        .map(|(c, s)| {
            let failures = failure_counts(c);
            json!({
                "k": c.k,
                "method": c.method,
                "gpus": if c.method == Method::None { "all (no gpuslice)".to_string() } else { c.selector.clone() },
                "argv": c.argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
                "expected_device_count": c.expect_count,
                "runs": c.samples.len(),
                "ok": c.samples.iter().filter(|s| s.ok).count(),
                "failed": c.samples.iter().filter(|s| !s.ok).count(),
                "failures": failures,
                "summary_ms": s,
                "ratio_to_none": ratios(s, (c.k, Method::None)),
                "ratio_to_k1": ratios(s, (1, c.method)),
                "samples": c.samples,
                "warmup_samples": c.warmup,
            })
        })
        .collect();
    json!({
        "benchmark": "init",
        "workload": spec.name,
        "date": date,
        "command": argv,
        "command_line": shell_line(&std::env::args_os().collect::<Vec<_>>()),
        "gpuslice_version": env!("CARGO_PKG_VERSION"),
        "host_root": ctx.host_root,
        "host": host,
        "config": {
            "counts": cells.iter().map(|c| c.k).collect::<std::collections::BTreeSet<_>>(),
            "methods": cells.iter().filter(|c| c.k == cells[0].k).map(|c| c.method).collect::<Vec<_>>(),
            "runs": runs,
            "warmup_rounds": args.warmup,
            "timeout_s": args.timeout,
            "order": "every round runs each (k, method) cell once, in an order shuffled per round",
            "seed": seed,
            "workload_argv": spec.argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
        },
        "metrics": metrics,
        "headline": {"in_process": spec.headline[0], "bench": spec.headline[1]},
        "notes": [
            "summary_ms covers successful runs only; failed runs are in samples with their reason",
            "ratio_to_none: median / median of method none at the same k; ratio_to_k1: median / median of the same method at k=1",
            "method none runs the workload directly with CUDA_VISIBLE_DEVICES removed, every GPU reachable",
        ],
        "cells": cells_json,
    })
}

fn failure_counts(c: &Cell) -> BTreeMap<String, usize> {
    let mut f = BTreeMap::new();
    for s in c.samples.iter().filter(|s| !s.ok) {
        *f.entry(s.failure.clone().unwrap_or_default()).or_insert(0) += 1;
    }
    f
}

/// argv as one shell line (single-quoted where needed).
fn shell_line(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| {
            let a = a.to_string_lossy();
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+".contains(c))
            {
                a.into_owned()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn table(spec: &Spec, cells: &[Cell], doc: &Value) -> String {
    let mut s = String::new();
    let host = &doc["host"];
    let runs = doc["config"]["runs"].as_u64().unwrap_or(0);
    let _ = writeln!(
        s,
        "gpuslice bench init · {} · {runs} runs per cell (+{} warm-up) · {} · driver {} · CUDA {} · persistence {}",
        spec.name,
        doc["config"]["warmup_rounds"],
        host["gpu_summary"].as_str().unwrap_or("?"),
        host["driver_version"].as_str().unwrap_or("?"),
        host["cuda_version"].as_str().unwrap_or("?"),
        host["persistence_mode"].as_str().unwrap_or("?"),
    );
    for (name, what) in spec.metrics() {
        if spec
            .columns
            .iter()
            .any(|c| c.trim_end_matches('*') == *name)
        {
            let _ = writeln!(s, "  {:<6} {what}", short(name));
        }
    }
    let _ = writeln!(
        s,
        "  medians in ms; [p10–p90] on the starred columns; ×none = median / none's at the same k; ×k1 = median / this method's at k=1"
    );
    let mut header = format!("{:>3}  {:<10} {:>7}", "k", "method", "ok");
    for col in spec.columns {
        let name = col.trim_end_matches('*');
        if col.ends_with('*') {
            let _ = write!(header, "  {:>24}", format!("{}*", short(name)));
        } else {
            let _ = write!(header, "  {:>8}", short(name));
        }
    }
    for h in spec.headline {
        let _ = write!(
            header,
            "  {:>9} {:>9}",
            format!("{}×none", short(h)),
            format!("{}×k1", short(h))
        );
    }
    let _ = writeln!(s, "{header}");
    let by_cell = doc["cells"].as_array().cloned().unwrap_or_default();
    for (c, j) in cells.iter().zip(&by_cell) {
        let sum = &j["summary_ms"];
        let mut line = format!(
            "{:>3}  {:<10} {:>7}",
            c.k,
            c.method.name(),
            format!("{}/{}", j["ok"], j["runs"])
        );
        for col in spec.columns {
            let name = col.trim_end_matches('*');
            let m = &sum[name];
            if col.ends_with('*') {
                let cell = match (m["median"].as_f64(), m["p10"].as_f64(), m["p90"].as_f64()) {
                    (Some(med), Some(lo), Some(hi)) => {
                        format!("{} [{}–{}]", fmt_ms(med), fmt_ms(lo), fmt_ms(hi))
                    }
                    _ => "-".into(),
                };
                let _ = write!(line, "  {cell:>24}");
            } else {
                let cell = m["median"].as_f64().map_or("-".into(), fmt_ms);
                let _ = write!(line, "  {cell:>8}");
            }
        }
        for h in spec.headline {
            let r = |key: &str| j[key][h].as_f64().map_or("-".into(), |x| format!("{x:.2}"));
            let _ = write!(line, "  {:>9} {:>9}", r("ratio_to_none"), r("ratio_to_k1"));
        }
        let _ = writeln!(s, "{line}");
    }
    let failed: Vec<_> = cells
        .iter()
        .filter(|c| c.samples.iter().any(|s| !s.ok))
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(s, "failed runs:");
        for c in failed {
            for (why, n) in failure_counts(c) {
                let example = c
                    .samples
                    .iter()
                    .find(|s| s.failure.as_deref() == Some(why.as_str()))
                    .and_then(|s| s.stderr.as_deref())
                    .map(|e| format!(" — {}", one_line(e)))
                    .unwrap_or_default();
                let _ = writeln!(s, "  k={} {}: {n}× {why}{example}", c.k, c.method.name());
            }
        }
    }
    s
}

fn short(metric: &str) -> &str {
    metric.trim_end_matches("_ms")
}

fn fmt_ms(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn write_outputs(dir: &Path, spec: &Spec, cells: &[Cell], doc: &Value, stamp: &str) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let stem = match spec.name {
        "probe" => format!("bench-init-{stamp}"),
        other => format!("bench-init-{other}-{stamp}"),
    };
    let json_path = dir.join(format!("{stem}.json"));
    std::fs::write(&json_path, serde_json::to_vec_pretty(doc)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    let svg_path = dir.join(format!("{stem}.svg"));
    std::fs::write(&svg_path, svg(spec, cells, doc)?)
        .with_context(|| format!("writing {}", svg_path.display()))?;
    eprintln!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}

fn svg(spec: &Spec, cells: &[Cell], doc: &Value) -> Result<String> {
    let mut counts: Vec<u32> = cells.iter().map(|c| c.k).collect();
    counts.sort_unstable();
    counts.dedup();
    let mut methods: Vec<Method> = Vec::new();
    for c in cells {
        if !methods.contains(&c.method) {
            methods.push(c.method);
        }
    }
    let by_cell = doc["cells"].as_array().cloned().unwrap_or_default();
    let panels: Vec<plot::Panel> = spec
        .headline
        .iter()
        .zip(spec.plot_titles)
        .map(|(metric, title)| plot::Panel {
            title: title.to_string(),
            y_label: "ms (median, whiskers p10–p90)".into(),
            series: methods
                .iter()
                .map(|&m| plot::Series {
                    name: m.name().into(),
                    color: m.color(),
                    points: cells
                        .iter()
                        .zip(&by_cell)
                        .filter(|(c, _)| c.method == m)
                        .filter_map(|(c, j)| {
                            let s = &j["summary_ms"][*metric];
                            Some(plot::Point {
                                category: counts.iter().position(|&k| k == c.k)?,
                                median: s["median"].as_f64()?,
                                p10: s["p10"].as_f64()?,
                                p90: s["p90"].as_f64()?,
                            })
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect();
    let host = &doc["host"];
    let title = format!(
        "CUDA start-up ({}) against GPUs reachable · {} · driver {} · {} runs/cell · {}",
        spec.name,
        host["gpu_summary"].as_str().unwrap_or("?"),
        host["driver_version"].as_str().unwrap_or("?"),
        doc["config"]["runs"],
        doc["date"].as_str().unwrap_or("?"),
    );
    let categories: Vec<String> = counts.iter().map(u32::to_string).collect();
    plot::line_chart_svg(
        &title,
        "k = GPUs selected (GPUs 0..k-1; none reaches all)",
        &categories,
        &panels,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_counts_are_powers_of_two_and_the_total() {
        assert_eq!(counts(&[], 1).unwrap(), vec![1]);
        assert_eq!(counts(&[], 8).unwrap(), vec![1, 2, 4, 8]);
        assert_eq!(counts(&[], 6).unwrap(), vec![1, 2, 4, 6]);
        assert_eq!(counts(&[8, 1, 1], 8).unwrap(), vec![1, 8]);
        assert!(counts(&[0], 8).is_err());
        assert!(counts(&[9], 8).is_err());
    }

    #[test]
    fn shuffle_is_a_permutation_and_varies() {
        // The seed is recorded with the results: it must give the same orders.
        let orders = |seed| {
            let mut rng = fastrand::Rng::with_seed(seed);
            (0..20)
                .map(|_| {
                    let mut v: Vec<usize> = (0..6).collect();
                    rng.shuffle(&mut v);
                    v
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(orders(7), orders(7));
        assert_ne!(orders(7), orders(8));
        let mut seen = std::collections::BTreeSet::new();
        for v in orders(7) {
            let mut sorted = v.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..6).collect::<Vec<_>>());
            seen.insert(v);
        }
        assert!(seen.len() > 10);
    }

    #[test]
    fn probe_results_are_checked() {
        let ok = json!({"init_rc": 0, "count_rc": 0, "ctx_rc": 0, "alloc_rc": 0, "count": 2});
        assert_eq!(output_problem(Some(&ok), Workload::Probe, 2), None);
        assert_eq!(
            output_problem(Some(&ok), Workload::Probe, 1).as_deref(),
            Some("saw 2 GPUs, expected 1")
        );
        let no_dev = json!({"init_rc": 100, "count": 0});
        assert_eq!(
            output_problem(Some(&no_dev), Workload::Probe, 1).as_deref(),
            Some("cuInit returned 100")
        );
        let err = json!({"error": "cannot load libcuda.so.1"});
        assert!(output_problem(Some(&err), Workload::Probe, 1)
            .unwrap()
            .contains("cannot load"));
        let torch = json!({"count": 1, "init_ms": 3.0});
        assert_eq!(output_problem(Some(&torch), Workload::Torch, 1), None);
    }

    #[test]
    fn shell_line_quotes_what_needs_it() {
        let argv: Vec<OsString> = [
            "gpuslice", "bench", "init", "--counts", "1,8", "a b", "it's",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        assert_eq!(
            shell_line(&argv),
            r"gpuslice bench init --counts 1,8 'a b' 'it'\''s'"
        );
    }
}
