//! `gpuslice device-plugin-selftest` (hidden): drives the device plugin
//! (gpuslice-k8s::plugin) with the test kubelet (the GPU machine has no
//! Kubernetes) and benchmarks it: every GPU whole, then every GPU shared
//! (two replicas packed onto one GPU, both slices running CUDA at once).
//! What each Allocate answers is applied by `gpuslice run` with the CUDA
//! probe. Reports JSON.

use crate::Setup;
use anyhow::{bail, Context, Result};
use clap::Args;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::HostRoot;
use gpuslice_k8s::plugin::config::Config;
use gpuslice_k8s::plugin::{self, Options};
use gpuslice_ledger::limits::{ENV_CUDA_VISIBLE, ENV_SLICE};
use gpuslice_testkit::kubelet::{
    self as testkubelet, allocate_one, first_list, next_list, preferred_one, PodDevices,
    PodResources, TestKubelet,
};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct SelftestArgs {
    /// Write the JSON report here.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Replicas per GPU in the shared phase.
    #[arg(long, default_value_t = 4)]
    pub replicas: u32,
    /// Watch ListAndWatch for health changes this long (no XID is expected).
    #[arg(long, default_value_t = 60)]
    pub watch_secs: u64,
    /// Allocate calls per resource for the latency figures (0: none).
    #[arg(long, default_value_t = 0)]
    pub bench_allocs: usize,
    /// Kubelet restarts for the re-registration figures.
    #[arg(long, default_value_t = 3)]
    pub restarts: usize,
    /// The CUDA probe run through `gpuslice run` with each allocation [default: gpuslice-cuda-probe next to this binary].
    #[arg(long, value_name = "PATH")]
    pub probe: Option<PathBuf>,
    /// Label of the host in the report (e.g. "fake host").
    #[arg(long, default_value = "")]
    pub label: String,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn sh(cmd: &mut std::process::Command) -> Value {
    sh_all(vec![cmd]).remove(0)
}

fn output_json(o: std::io::Result<std::process::Output>) -> Value {
    match o {
        Ok(o) => json!({
            "rc": o.status.code(),
            "stdout": String::from_utf8_lossy(&o.stdout).trim(),
            "stderr": String::from_utf8_lossy(&o.stderr).chars().rev().take(2000).collect::<String>().chars().rev().collect::<String>(),
        }),
        Err(e) => json!({"rc": null, "error": e.to_string()}),
    }
}

/// Runs the commands at the same time; their results in order.
fn sh_all(cmds: Vec<&mut std::process::Command>) -> Vec<Value> {
    use std::process::Stdio;
    let children: Vec<std::io::Result<std::process::Child>> = cmds
        .into_iter()
        .map(|c| c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn())
        .collect();
    children
        .into_iter()
        .map(|c| output_json(c.and_then(|c| c.wait_with_output())))
        .collect()
}

/// `gpuslice run` applying an Allocate answer (its GPUs and memory cap)
/// to `what`.
fn run_with(
    setup: &Setup,
    exe: &std::path::Path,
    r: &plugin::v1beta1::ContainerAllocateResponse,
    what: &[&std::ffi::OsStr],
) -> std::process::Command {
    let visible = r.envs.get(ENV_CUDA_VISIBLE).cloned().unwrap_or_default();
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--host-root")
        .arg(&setup.host_root)
        .args(["run", "--gpus", &visible]);
    if let Some(m) = r.envs.get(&memory_env()) {
        cmd.args(["--memory", m]);
    }
    cmd.arg("--").args(what);
    cmd
}

/// The probe's JSON (its last line) and whether it allocated.
fn probe_result(run: &Value) -> (Value, bool) {
    let probe_json: Value = run["stdout"]
        .as_str()
        .and_then(|s| s.lines().last())
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    let ok = run["rc"] == json!(0)
        && probe_json["error"].is_null()
        && probe_json["alloc_rc"] == json!(0);
    (probe_json, ok)
}

fn allocation_json(r: &plugin::v1beta1::ContainerAllocateResponse) -> Value {
    json!({
        "envs": r.envs,
        "devices": r.devices.iter().map(|d| json!([d.container_path, d.host_path, d.permissions])).collect::<Vec<_>>(),
        "mounts": r.mounts.iter().map(|m| json!([m.container_path, m.host_path, m.read_only])).collect::<Vec<_>>(),
    })
}

async fn bench_allocs(client: &mut testkubelet::Client, id: &str, n: usize) -> Result<Value> {
    let ids = [id.to_string()];
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        allocate_one(client, &ids).await?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    Ok(json!({
        "calls": ms.len(), "mean_ms": mean, "p50_ms": pct(&mut ms, 0.5),
        "p99_ms": pct(&mut ms, 0.99), "max_ms": pct(&mut ms, 1.0),
    }))
}

pub fn selftest(setup: &Setup, args: &SelftestArgs) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut report = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "label": args.label,
        "date_unix": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    });
    let r = rt.block_on(selftest_async(setup, args, &mut report));
    let ok = match &r {
        Ok(ok) => *ok,
        Err(e) => {
            report["error"] = json!(format!("{e:#}"));
            false
        }
    };
    report["pass"] = json!(ok);
    let text = serde_json::to_string_pretty(&report)?;
    match &args.out {
        Some(p) => std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?,
        None => println!("{text}"),
    }
    Ok(if ok { 0 } else { 1 })
}

/// Two phases on the host's GPUs: every GPU whole (register, list with
/// NUMA, Allocate + the probe), then every GPU shared (one resource only;
/// two one-replica Allocates packed onto the first GPU, both slices running
/// the probe at once; re-registration after kubelet restarts; health).
async fn selftest_async(setup: &Setup, args: &SelftestArgs, rep: &mut Value) -> Result<bool> {
    let exe = setup.gpuslice.clone();
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let probe = args
        .probe
        .clone()
        .unwrap_or_else(|| dir.join("gpuslice-cuda-probe"));
    let tmp = tempfile::tempdir()?;
    let podres_socket = tmp.path().join("pod-resources/kubelet.sock");
    let mut base = Config {
        plugin_dir: tmp.path().join("plugins"),
        ledger_dir: tmp.path().join("ledgers"),
        state_dir: tmp.path().join("state"),
        board_dir: tmp.path().join("boards"),
        shim: setup.shim.clone(),
        ..Config::default()
    };
    base.ledger_cleanup.interval_seconds = 1;
    base.ledger_cleanup.grace_seconds = 0;
    base.ledger_cleanup.pod_resources_socket = podres_socket.clone();
    let mut whole_cfg = Config {
        roles: Config::parse("roles: [{gpus: others, role: whole}]")?.roles,
        ..base.clone()
    };
    whole_cfg.ledger_cleanup.enabled = false;
    let shared_cfg = Config {
        roles: Config::parse(&format!(
            "roles: [{{gpus: others, role: shared, replicas: {}}}]",
            args.replicas
        ))?
        .roles,
        ..base.clone()
    };
    rep["roles"] = json!({"whole": "roles: [{gpus: others, role: whole}]",
        "shared": format!("roles: [{{gpus: others, role: shared, replicas: {}}}]", args.replicas)});
    let root = HostRoot::new(&setup.host_root);
    let inv = discover(&root, &DiscoverOptions::default())?;
    rep["gpus"] = json!(inv
        .gpus
        .iter()
        .map(|g| json!({
            "index": g.index, "uuid": g.uuid, "model": g.model, "pci_bus_id": g.pci_bus_id,
            "numa_node": g.numa_node, "memory_bytes": g.memory_bytes,
        }))
        .collect::<Vec<_>>());
    rep["driver_version"] = json!(inv.driver_version);
    rep["cuda_version"] = json!(inv.cuda_version);
    let Some(g0) = inv.gpus.first().cloned() else {
        bail!("no GPU");
    };
    let mut ok = true;
    let mut check = |rep: &mut Value, name: &str, pass: bool, detail: Value| {
        ok &= pass;
        rep["checks"][name] = json!({"pass": pass, "detail": detail});
    };
    let spawn = |cfg: &Config| {
        let mut opts = Options::new(cfg.clone(), root.clone());
        opts.poll = Duration::from_millis(100);
        plugin::spawn(opts)
    };

    // Phase 1: every GPU whole.
    let mut k = TestKubelet::start(&base.plugin_dir).await?;
    let t0 = Instant::now();
    let p = spawn(&whole_cfg)?;
    let regs = k
        .registrations_of(&["nvidia.com/gpu"], Duration::from_secs(20))
        .await?;
    let reg: Vec<Value> = regs
        .iter()
        .map(|r| json!({"resource": r.req.resource_name, "endpoint": r.req.endpoint, "version": r.req.version, "after_ms": (r.at - t0).as_secs_f64() * 1e3}))
        .collect();
    check(rep, "registered", true, json!(reg));
    rep["plugin_warnings"] = json!(p.state.borrow().warnings);

    // ListAndWatch: the GPU with the NUMA node sysfs gives.
    let mut c = k.dial("gpuslice-gpu.sock").await?;
    let (devs, _stream) = first_list(&mut c).await?;
    let sys_numa = std::fs::read_to_string(root.join(format!(
        "sys/bus/pci/devices/{}/numa_node",
        g0.pci_bus_id.to_lowercase()
    )))
    .ok()
    .and_then(|s| s.trim().parse::<i64>().ok());
    let listed: Vec<Value> = devs
        .iter()
        .map(|d| json!({"id": d.id, "health": d.health, "numa": d.topology.as_ref().and_then(|t| t.nodes.first()).map(|n| n.id)}))
        .collect();
    let d0 = devs.iter().find(|d| d.id == g0.uuid);
    let numa = d0
        .and_then(|d| d.topology.as_ref())
        .and_then(|t| t.nodes.first())
        .map(|n| n.id);
    let want_numa = sys_numa.filter(|n| *n >= 0);
    check(
        rep,
        "listed_with_numa",
        d0.is_some_and(|d| d.health == "Healthy") && numa == want_numa,
        json!({"listed": listed, "sysfs_numa_node": sys_numa}),
    );

    let r = allocate_one(&mut c, std::slice::from_ref(&g0.uuid)).await?;
    let run = sh(&mut run_with(setup, &exe, &r, &[probe.as_os_str()]));
    let (probe_json, probe_ok) = probe_result(&run);
    let env_ok = r.envs.get(ENV_CUDA_VISIBLE) == Some(&g0.uuid)
        && !r.envs.contains_key(&memory_env())
        && r.devices
            .iter()
            .any(|d| d.container_path == format!("/dev/nvidia{}", g0.minor));
    check(
        rep,
        "allocate_gpu",
        env_ok && probe_ok,
        json!({"id": g0.uuid, "allocation": allocation_json(&r), "run": run, "probe": probe_json}),
    );
    if args.bench_allocs > 0 {
        rep["bench"]["allocate_gpu"] = bench_allocs(&mut c, &g0.uuid, args.bench_allocs).await?;
    }
    p.stop()?;

    // Phase 2: every GPU shared. The whole resource is gone: no GPU is in two.
    let podres = PodResources::start(&podres_socket).await?;
    let p = spawn(&shared_cfg)?;
    let names = ["nvidia.com/gpu.shared"];
    k.registrations_of(&names, Duration::from_secs(20)).await?;
    let served = p.state.borrow().resources.clone();
    let mut cs = k.dial("gpuslice-gpu.shared.sock").await?;
    let (sdevs, _ss) = first_list(&mut cs).await?;
    let all: Vec<String> = sdevs.iter().map(|d| d.id.clone()).collect();
    let on_g0 = all.iter().filter(|i| i.starts_with(&g0.uuid)).count();
    check(
        rep,
        "one_role_per_gpu",
        !served.iter().any(|r| r == "nvidia.com/gpu") && on_g0 == args.replicas as usize,
        json!({"resources": served, "shared_ids": all}),
    );
    // Two pods of one replica each, the second asked after the first got
    // its replica: packing puts both on the first GPU.
    let first = preferred_one(&mut cs, &all, &[], 1).await?;
    let rest: Vec<String> = all.iter().filter(|i| !first.contains(i)).cloned().collect();
    let second = preferred_one(&mut cs, &rest, &[], 1).await?;
    let packed = first.len() == 1
        && second.len() == 1
        && first[0].starts_with(&g0.uuid)
        && second[0].starts_with(&g0.uuid);
    check(
        rep,
        "packed",
        packed,
        json!({"first": first, "second": second}),
    );
    // The kubelet lists both pods (the sweep keeps their ledger dirs).
    podres.set(vec![
        PodDevices::new("a", "nvidia.com/gpu.shared", &first),
        PodDevices::new("b", "nvidia.com/gpu.shared", &second),
    ]);
    let ra = allocate_one(&mut cs, &first).await?;
    let rb = allocate_one(&mut cs, &second).await?;
    let mut runs = sh_all(vec![
        &mut run_with(setup, &exe, &ra, &[probe.as_os_str()]),
        &mut run_with(setup, &exe, &rb, &[probe.as_os_str()]),
    ]);
    let want_mem = g0
        .memory_bytes
        .map(|m| (m / u64::from(args.replicas)).to_string());
    let mut slices = Vec::new();
    let mut all_ok = true;
    for (r, run) in [(&ra, runs.remove(0)), (&rb, runs.remove(0))] {
        let (probe_json, probe_ok) = probe_result(&run);
        let env_ok = r.envs.get(ENV_CUDA_VISIBLE) == Some(&g0.uuid)
            && r.envs.get(&memory_env()) == want_mem.as_ref();
        all_ok &= env_ok && probe_ok;
        slices.push(json!({"allocation": allocation_json(r), "run": run, "probe": probe_json}));
    }
    // The cap as NVML reports it inside one slice (informative).
    let smi = ra.envs.get(&memory_env()).map(|_| {
        let q = [
            "nvidia-smi",
            "--query-gpu=memory.total",
            "--format=csv,noheader,nounits",
        ]
        .map(std::ffi::OsStr::new);
        sh(&mut run_with(setup, &exe, &ra, &q))
    });
    check(
        rep,
        "allocate_gpu.shared",
        all_ok,
        json!({"slices": slices, "expected_memory_limit": want_mem,
               "nvidia_smi_memory_total_mib_in_slice": smi}),
    );
    // Both pods gone: the sweep removes their ledger dirs (no process uses them).
    let slices: Vec<String> = [&ra, &rb]
        .iter()
        .filter_map(|r| r.envs.get(ENV_SLICE).cloned())
        .collect();
    let kept = slices.iter().all(|s| base.ledger_dir.join(s).is_dir());
    podres.set(vec![]);
    let t = Instant::now();
    let gone = |p: &plugin::Handle| {
        let st = p.state.borrow();
        slices.iter().all(|s| st.ledgers.removed.contains(s))
    };
    while !gone(&p) && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let removed = gone(&p) && slices.iter().all(|s| !base.ledger_dir.join(s).exists());
    check(
        rep,
        "ledger_cleanup",
        kept && removed && slices.len() == 2,
        json!({"slices": slices, "kept_while_listed": kept, "removed_after_ms": t.elapsed().as_secs_f64() * 1e3,
               "ledgers": format!("{:?}", p.state.borrow().ledgers)}),
    );
    if args.bench_allocs > 0 {
        rep["bench"]["allocate_gpu.shared"] =
            bench_allocs(&mut cs, &first[0], args.bench_allocs).await?;
    }
    let mut stream = first_list(&mut cs).await?.1;
    if args.restarts > 0 {
        let mut lat = Vec::new();
        for _ in 0..args.restarts {
            k.stop().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let t = Instant::now();
            k = TestKubelet::start(&base.plugin_dir).await?;
            let regs = k.registrations_of(&names, Duration::from_secs(10)).await?;
            let last = regs.iter().map(|r| r.at - t).max().unwrap_or_default();
            lat.push(last.as_secs_f64() * 1e3);
        }
        let worst = lat.iter().copied().fold(0.0, f64::max);
        check(
            rep,
            "reregistration",
            worst <= 1000.0,
            json!({"latencies_ms": lat, "max_ms": worst, "poll_ms": 100}),
        );
        cs = k.dial("gpuslice-gpu.shared.sock").await?;
        stream = first_list(&mut cs).await?.1;
    }

    // Health: no event and no change for watch_secs.
    let t = Instant::now();
    let mut updates = Vec::new();
    while t.elapsed() < Duration::from_secs(args.watch_secs) {
        let left = Duration::from_secs(args.watch_secs).saturating_sub(t.elapsed());
        match next_list(&mut stream, left).await {
            Ok(l) => updates.push(json!(l
                .iter()
                .map(|d| [d.id.clone(), d.health.clone()])
                .collect::<Vec<_>>())),
            Err(e) if e.to_string().contains("no ListAndWatch update") => break,
            Err(e) => return Err(e),
        }
    }
    let h = p.state.borrow().health.clone();
    check(
        rep,
        "health_quiet",
        updates.is_empty() && h.critical_events == 0 && h.unhealthy.is_empty(),
        json!({"secs": args.watch_secs, "updates": updates, "watching": h.watching,
               "critical_events": h.critical_events, "ignored_events": h.ignored_events}),
    );
    k.stop().await;
    p.stop()?;
    podres.stop().await;
    Ok(ok)
}

/// The variable a replica's cap of ordinal 0 is told in (the slice
/// contract's spelling; the shim reads the limits record, not this).
fn memory_env() -> String {
    format!("{}_0", gpuslice_ledger::limits::ENV_MEMORY)
}
