//! `gpuslice device-plugin`: the kubelet device plugin (gpuslice-k8s::plugin),
//! and the hidden `device-plugin-selftest` that drives it with the test
//! kubelet (the GPU machine has no Kubernetes) and benchmarks it.

use anyhow::{bail, Context, Result};
use clap::Args;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::HostRoot;
use gpuslice_k8s::plugin::config::Config;
use gpuslice_k8s::plugin::testkubelet::{allocate_one, first_list, next_list, TestKubelet};
use gpuslice_k8s::plugin::{self, Options};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::global::Global;

#[derive(Debug, Args)]
pub struct DevicePluginArgs {
    /// YAML config (prefix, replicas, strategies, shim, health; see docs/kubernetes.md); re-read on SIGHUP.
    #[arg(long, value_name = "FILE", env = "GPUSLICE_DEVICE_PLUGIN_CONFIG")]
    pub config: Option<PathBuf>,

    /// The kubelet's device-plugin directory (overrides the config's pluginDir).
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
}

fn base_config(path: Option<&PathBuf>) -> Result<Config> {
    match path {
        Some(p) => Config::load(p),
        None => Ok(Config::default()),
    }
}

pub fn run(global: &Global, args: &DevicePluginArgs) -> Result<i32> {
    let mut cfg = base_config(args.config.as_ref())?;
    if let Some(d) = &args.plugin_dir {
        cfg.plugin_dir = d.clone();
    }
    let mut opts = Options::new(cfg, HostRoot::new(&global.host_root));
    // A --plugin-dir override must survive reloads: reload from the file
    // only when nothing overrides it.
    if args.plugin_dir.is_none() {
        opts.config_path = args.config.clone();
    }
    plugin::run(opts)?;
    Ok(0)
}

#[derive(Debug, Args)]
pub struct SelftestArgs {
    /// Write the JSON report here.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Replicas per GPU of gpu.shared.
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
    match cmd.output() {
        Ok(o) => json!({
            "rc": o.status.code(),
            "stdout": String::from_utf8_lossy(&o.stdout).trim(),
            "stderr": String::from_utf8_lossy(&o.stderr).chars().rev().take(2000).collect::<String>().chars().rev().collect::<String>(),
        }),
        Err(e) => json!({"rc": null, "error": e.to_string()}),
    }
}

pub fn selftest(global: &Global, args: &SelftestArgs) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut report = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "label": args.label,
        "date_unix": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    });
    let r = rt.block_on(selftest_async(global, args, &mut report));
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

async fn selftest_async(global: &Global, args: &SelftestArgs, rep: &mut Value) -> Result<bool> {
    let exe = crate::binaries::gpuslice_exe()?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let probe = args
        .probe
        .clone()
        .unwrap_or_else(|| dir.join("gpuslice-cuda-probe"));
    let tmp = tempfile::tempdir()?;
    let mut cfg = Config {
        plugin_dir: tmp.path().join("plugins"),
        ledger_dir: tmp.path().join("ledgers"),
        state_dir: tmp.path().join("state"),
        shim: crate::shim::find().unwrap_or_else(|_| dir.join(crate::shim::FILE)),
        ..Config::default()
    };
    cfg.sharing.replicas = args.replicas;
    let root = HostRoot::new(&global.host_root);
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

    let mut k = TestKubelet::start(&cfg.plugin_dir).await?;
    let t0 = Instant::now();
    let mut opts = Options::new(cfg.clone(), root.clone());
    opts.poll = Duration::from_millis(100);
    let p = plugin::spawn(opts)?;
    let names = ["nvidia.com/gpu", "nvidia.com/gpu.shared"];
    let regs = k.registrations_of(&names, Duration::from_secs(20)).await?;
    let reg: Vec<Value> = regs
        .iter()
        .map(|r| json!({"resource": r.req.resource_name, "endpoint": r.req.endpoint, "version": r.req.version, "after_ms": (r.at - t0).as_secs_f64() * 1e3}))
        .collect();
    check(rep, "registered", true, json!(reg));
    rep["plugin_warnings"] = json!(p.state.borrow().warnings);

    // ListAndWatch: the GPU with the NUMA node sysfs gives.
    let mut c = k.dial("gpuslice-gpu.sock").await?;
    let (devs, mut stream) = first_list(&mut c).await?;
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

    // Allocate each kind, then run the probe with what it says.
    let mut cs = k.dial("gpuslice-gpu.shared.sock").await?;
    let (sdevs, _ss) = first_list(&mut cs).await?;
    for (kind, client, id) in [
        ("gpu", &mut c, g0.uuid.clone()),
        (
            "gpu.shared",
            &mut cs,
            sdevs.first().map(|d| d.id.clone()).unwrap_or_default(),
        ),
    ] {
        let r = allocate_one(client, std::slice::from_ref(&id)).await?;
        let visible = r
            .envs
            .get("CUDA_VISIBLE_DEVICES")
            .cloned()
            .unwrap_or_default();
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("--host-root")
            .arg(&global.host_root)
            .args(["run", "--gpus", &visible]);
        let mem = r.envs.get("GPUSLICE_MEMORY_LIMIT").cloned();
        if let Some(m) = &mem {
            cmd.args(["--memory", m]);
        }
        cmd.arg("--").arg(&probe);
        let run = sh(&mut cmd);
        let probe_json: Value = run["stdout"]
            .as_str()
            .and_then(|s| s.lines().last())
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        let probe_ok = run["rc"] == json!(0)
            && probe_json["error"].is_null()
            && probe_json["alloc_rc"] == json!(0);
        let want_mem = g0
            .memory_bytes
            .map(|m| (m / u64::from(args.replicas)).to_string());
        let env_ok = visible == g0.uuid
            && (kind == "gpu" || mem == want_mem)
            && r.devices
                .iter()
                .any(|d| d.container_path == format!("/dev/nvidia{}", g0.minor));
        // The cap as NVML reports it inside the slice (informative).
        let smi = mem.as_ref().map(|m| {
            sh(std::process::Command::new(&exe)
                .arg("--host-root")
                .arg(&global.host_root)
                .args([
                    "run",
                    "--gpus",
                    &visible,
                    "--memory",
                    m,
                    "--",
                    "nvidia-smi",
                    "--query-gpu=memory.total",
                    "--format=csv,noheader,nounits",
                ]))
        });
        check(
            rep,
            &format!("allocate_{kind}"),
            env_ok && probe_ok,
            json!({
                "id": id,
                "envs": r.envs,
                "devices": r.devices.iter().map(|d| json!([d.container_path, d.host_path, d.permissions])).collect::<Vec<_>>(),
                "mounts": r.mounts.iter().map(|m| json!([m.container_path, m.host_path, m.read_only])).collect::<Vec<_>>(),
                "expected_memory_limit": want_mem,
                "run": run,
                "probe": probe_json,
                "nvidia_smi_memory_total_mib_in_slice": smi,
            }),
        );
    }

    if args.bench_allocs > 0 {
        let mut b = json!({});
        for (kind, client, id) in [
            ("gpu", &mut c, g0.uuid.clone()),
            (
                "gpu.shared",
                &mut cs,
                sdevs.first().map(|d| d.id.clone()).unwrap_or_default(),
            ),
        ] {
            let ids = [id];
            let mut ms = Vec::with_capacity(args.bench_allocs);
            for _ in 0..args.bench_allocs {
                let t = Instant::now();
                allocate_one(client, &ids).await?;
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            let mean = ms.iter().sum::<f64>() / ms.len() as f64;
            b[format!("allocate_{kind}")] = json!({
                "calls": ms.len(), "mean_ms": mean, "p50_ms": pct(&mut ms, 0.5),
                "p99_ms": pct(&mut ms, 0.99), "max_ms": pct(&mut ms, 1.0),
            });
        }
        rep["bench"] = b;
    }
    if args.restarts > 0 {
        let mut lat = Vec::new();
        for _ in 0..args.restarts {
            k.stop().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let t = Instant::now();
            k = TestKubelet::start(&cfg.plugin_dir).await?;
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
        c = k.dial("gpuslice-gpu.sock").await?;
        stream = first_list(&mut c).await?.1;
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
    Ok(ok)
}
