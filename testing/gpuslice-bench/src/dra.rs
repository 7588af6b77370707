//! The DRA driver (gpuslice-dra) driven with no Kubernetes: the API
//! server is gpuslice-testkit's `FakeApiServer` TEST DOUBLE, the kubelet
//! is the test kubelet over the plugin's real sockets, and the GPUs are
//! the host's (`--host-root`).
//!
//! - `gpuslice bench dra`: `NodePrepareResources` latency per claim over
//!   many claims (the API read and the CDI write included), and how soon
//!   the ResourceSlices are re-published after a GPU's health changes.
//! - `gpuslice bench dra-selftest` (hidden): the H200 check's two phases:
//!   `prepare` publishes the GPUs and prepares claims written the way
//!   kube-scheduler writes them, leaving their CDI specs for
//!   `gpuslice run --cdi-device`; `unprepare` (a restarted plugin, from its
//!   checkpoint) removes them.

use crate::{host, Setup};
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::{HostRoot, Inventory};
use gpuslice_dra::apiserver::KubeApi;
use gpuslice_dra::driver::{Driver, Options};
use gpuslice_dra::publish::{follow, slice_name, SharedPolicy, UNHEALTHY_TAINT};
use gpuslice_dra::server::{serve, Served, Sockets};
use gpuslice_dra::DRIVER_NAME;
use gpuslice_health::Snapshot;
use gpuslice_testkit::dra_kubelet::{register, Registered};
use gpuslice_testkit::fakeapi::{shared_claim, FakeApiServer};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NODE: &str = "bench-node";

#[derive(Debug, Args)]
pub struct DraArgs {
    /// NodePrepareResources calls, one claim each.
    #[arg(long, default_value_t = 1000)]
    pub claims: usize,
    /// Claims kept prepared at once (the oldest is unprepared past this): each takes 1 % and 256 MiB of a GPU.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub window: u32,
    /// Health changes to time (each: unhealthy, then healthy again).
    #[arg(long, default_value_t = 10)]
    pub health_rounds: usize,
    /// How the health changes: `xid` injects an XID into the fake NVML of a fake host (its watcher then reports it); `synthetic` sends the watcher's report itself (a real GPU cannot be made to raise one) [default: xid on a fake host, else synthetic].
    #[arg(long, value_enum)]
    pub health: Option<HealthSource>,
    /// Write the JSON result here too.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthSource {
    Xid,
    Synthetic,
}

#[derive(Debug, Args)]
pub struct DraSelftestArgs {
    #[arg(value_enum)]
    pub phase: Phase,
    /// The work directory: CDI specs in `cdi/`, the checkpoint in `state/`, sockets in `plugins*/`.
    #[arg(long, value_name = "DIR")]
    pub work: PathBuf,
    /// A claim on the shared device of --gpu: MEMORY:COMPUTE as the pod asks (e.g. 20Gi:30); repeatable.
    #[arg(long, value_name = "MEM:PCT", default_values_t = ["20Gi:30".to_string(), "40Gi:60".to_string()])]
    pub claim: Vec<String>,
    /// The GPU (index) the claims share.
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
    /// Write the JSON report here too.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Phase {
    Prepare,
    Unprepare,
}

/// The host's GPUs, with NVML (memory sizes: the over-commit check needs them).
fn inventory(setup: &Setup) -> Result<Inventory> {
    let root = HostRoot::new(&setup.host_root);
    let nvml_lib = fake_nvml(&setup.host_root)?;
    discover(
        &root,
        &DiscoverOptions {
            nvml_lib,
            ..DiscoverOptions::default()
        },
    )
    .context("discovering the GPUs")
}

/// A fake host's NVML (`gpuslice-fakehost`: the built fake driver, which
/// follows `FAKEGPU_ROOT`); None on a real host.
fn fake_nvml(root: &Path) -> Result<Option<PathBuf>> {
    if !gpuslice_core::simulation::is_simulated(root) {
        return Ok(None);
    }
    let lib = fakegpu::try_driver_so_path()
        .map_err(|why| anyhow!("a fake host needs the fake NVML: {why}"))?;
    std::env::set_var("FAKEGPU_ROOT", root);
    Ok(Some(lib))
}

/// The driver on `work`'s state, served on its sockets, and the test
/// kubelet registered with it.
struct Plugin {
    driver: Arc<Driver>,
    _served: Served,
    kubelet: Registered,
}

impl Plugin {
    async fn start(setup: &Setup, inv: &Inventory, work: &Path, api_url: &str) -> Result<Plugin> {
        let opts = Options {
            driver_name: DRIVER_NAME.into(),
            pool: NODE.into(),
            host_root: HostRoot::new(&setup.host_root),
            inventory: inv.clone(),
            cdi_dir: work.join("cdi"),
            state_dir: work.join("state"),
            shim: Some(setup.shim.clone()),
            hook: Some(setup.gpuslice.clone()),
            strip_host_root: false,
            policy: gpuslice_dra::publish::SharedPolicy::default(),
            refuse_unenforceable: false,
            // The claims' slice directories (tmpfs mounts) in the work
            // directory, not the host's /run.
            claims_dir: Some(work.join("claims")),
        };
        let api = Arc::new(KubeApi::new(api_url, None)?);
        let driver = Arc::new(Driver::new(opts, api)?);
        let sockets = Sockets {
            plugins_dir: work.join("plugins"),
            registry_dir: work.join("plugins_registry"),
        };
        let health = gpuslice_dra::feed::NodeFeed::fixed(
            NODE,
            gpuslice_dra::publish::SharedPolicy::default(),
            inv.clone(),
        );
        let served = serve(driver.clone(), &sockets, health)?;
        let kubelet = register(&sockets.registration(DRIVER_NAME), DRIVER_NAME).await;
        Ok(Plugin {
            driver,
            _served: served,
            kubelet,
        })
    }

    async fn prepare(&mut self, ns: &str, name: &str, uid: &str) -> Result<Vec<String>> {
        let r = self.kubelet.prepare(&[(ns, name, uid)]).await?;
        let c = r
            .claims
            .get(uid)
            .ok_or_else(|| anyhow!("no answer for claim {uid}"))?;
        if !c.error.is_empty() {
            bail!("claim {ns}/{name}: {}", c.error);
        }
        Ok(c.devices
            .iter()
            .flat_map(|d| d.cdi_device_ids.clone())
            .collect())
    }

    async fn unprepare(&mut self, ns: &str, name: &str, uid: &str) -> Result<()> {
        let r = self.kubelet.unprepare(&[(ns, name, uid)]).await?;
        match r.claims.get(uid) {
            Some(c) if c.error.is_empty() => Ok(()),
            Some(c) => bail!("unprepare {ns}/{name}: {}", c.error),
            None => bail!("no answer for claim {uid}"),
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn write_out(setup: &Setup, out: Option<&Path>, report: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    if let Some(p) = out {
        std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
    }
    if setup.json || out.is_none() {
        println!("{text}");
    }
    Ok(())
}

/// Milliseconds: p50, p90, p99, max, mean, n (null for no samples).
fn latency(ms: &mut [f64]) -> Value {
    if ms.is_empty() {
        return Value::Null;
    }
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    json!({
        "n": ms.len(),
        "p50_ms": at(0.5),
        "p90_ms": at(0.9),
        "p99_ms": at(0.99),
        "max_ms": at(1.0),
        "mean_ms": ms.iter().sum::<f64>() / ms.len() as f64,
    })
}

/// The p99 a prepare may take, and the slices' publication after a
/// health change.
const PREPARE_P99_MS: f64 = 20.0;
const PUBLISH_MAX_MS: f64 = 1000.0;

pub fn run(setup: &Setup, args: &DraArgs) -> Result<i32> {
    if args.claims == 0 {
        bail!("--claims 0: give at least 1");
    }
    let (date, _) = crate::utc_now();
    let inv = inventory(setup)?;
    if inv.gpus.is_empty() {
        bail!(
            "no GPU below {}: the driver has nothing to prepare",
            setup.host_root.display()
        );
    }
    let source = args
        .health
        .unwrap_or(if fake_nvml(&setup.host_root)?.is_some() {
            HealthSource::Xid
        } else {
            HealthSource::Synthetic
        });
    let rt = runtime()?;
    let (prepare, unprepare) = rt.block_on(bench_prepare(setup, &inv, args))?;
    let health = rt.block_on(bench_health(setup, &inv, args, source))?;
    let mut prep = prepare;
    let mut unprep = unprepare;
    let prep = latency(&mut prep);
    let unprep = latency(&mut unprep);
    let publish_max = health["to_taint"]["max_ms"]
        .as_f64()
        .unwrap_or(f64::INFINITY)
        .max(
            health["to_untaint"]["max_ms"]
                .as_f64()
                .unwrap_or(f64::INFINITY),
        );
    let pass = prep["p99_ms"].as_f64().is_some_and(|p| p <= PREPARE_P99_MS)
        && publish_max <= PUBLISH_MAX_MS;
    let report = json!({
        "benchmark": "dra",
        "date": date,
        "argv": std::env::args().collect::<Vec<_>>(),
        "host_root": setup.host_root,
        "host": host::facts(&setup.host_root, &inv),
        "api_server": "FakeApiServer (gpuslice-testkit), a TEST DOUBLE on 127.0.0.1 over HTTP/1.1",
        "kubelet": "the test kubelet (gpuslice-testkit::dra_kubelet), v1 DRAPlugin over the plugin's unix socket",
        "prepare": {
            "what": "NodePrepareResources of one shared-device claim (GET claim from the double, limits record and CDI spec written, checkpoint fsynced), timed at the test kubelet",
            "claims": args.claims,
            "window": args.window,
            "latency": prep,
            "unprepare_latency": unprep,
            "criterion": format!("p99 <= {PREPARE_P99_MS} ms"),
        },
        "health": health,
        "criteria": format!("prepare p99 <= {PREPARE_P99_MS} ms; ResourceSlice re-published <= {PUBLISH_MAX_MS} ms after each health change (taint and untaint)"),
        "pass": pass,
    });
    write_out(setup, args.out.as_deref(), &report)?;
    if !setup.json && args.out.is_some() {
        println!(
            "NodePrepareResources over {} claims: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; re-published after a health change within {:.1} ms (max); pass: {pass}",
            args.claims,
            prep["p50_ms"].as_f64().unwrap_or_default(),
            prep["p99_ms"].as_f64().unwrap_or_default(),
            prep["max_ms"].as_f64().unwrap_or_default(),
            publish_max,
        );
    }
    Ok(if pass { 0 } else { 1 })
}

/// Prepares `claims` claims one call each, rolling over the GPUs, keeping
/// `window` prepared; the prepare and unprepare latencies (ms).
async fn bench_prepare(
    setup: &Setup,
    inv: &Inventory,
    args: &DraArgs,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let work = tempfile::tempdir()?;
    let api = FakeApiServer::start().await;
    let mut plugin = Plugin::start(setup, inv, work.path(), &api.url).await?;
    let gpus: Vec<u32> = inv.gpus.iter().map(|g| g.index).collect();
    let name = |i: usize| format!("claim-{i}");
    let uid = |i: usize| format!("bench-uid-{i}");
    for i in 0..args.claims {
        let g = gpus[i % gpus.len()];
        api.put_claim(shared_claim(
            "bench",
            &name(i),
            &uid(i),
            NODE,
            g,
            "256Mi",
            "1",
        ));
    }
    let window = args.window as usize * gpus.len();
    // Warm: the first call opens the channels and connections.
    plugin.prepare("bench", &name(0), &uid(0)).await?;
    plugin.unprepare("bench", &name(0), &uid(0)).await?;
    let (mut prep, mut unprep) = (Vec::new(), Vec::new());
    for i in 0..args.claims {
        let t = Instant::now();
        let ids = plugin.prepare("bench", &name(i), &uid(i)).await?;
        prep.push(t.elapsed().as_secs_f64() * 1e3);
        if ids.len() != 1 {
            bail!("claim {i}: {} CDI devices, expected 1", ids.len());
        }
        if i >= window {
            let j = i - window;
            let t = Instant::now();
            plugin.unprepare("bench", &name(j), &uid(j)).await?;
            unprep.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    // The last window's claims too: nothing of the benchmark stays
    // mounted on the host.
    for j in args.claims.saturating_sub(window)..args.claims {
        plugin.unprepare("bench", &name(j), &uid(j)).await?;
    }
    let gets = api.gets();
    if gets < args.claims as u64 {
        bail!(
            "the double served {gets} GETs for {} prepares: the API read was skipped",
            args.claims
        );
    }
    drop(plugin.driver);
    Ok((prep, unprep))
}

/// Health changes of the first GPU, each timed from the change to the
/// published slice showing it (its devices tainted, then untainted).
async fn bench_health(
    setup: &Setup,
    inv: &Inventory,
    args: &DraArgs,
    source: HealthSource,
) -> Result<Value> {
    let fake = FakeApiServer::start().await;
    let api = KubeApi::new(&fake.url, None)?;
    let (tx, rx) = tokio::sync::watch::channel(Snapshot::default());
    let gpu = inv.gpus[0].clone();
    let mut watching = rx.clone();
    let health = gpuslice_health::Config {
        recover_after_seconds: 1,
        ..Default::default()
    };
    // The XID watcher on the fake NVML, or none (the changes are sent here).
    let (watcher, synthetic) = match source {
        HealthSource::Xid => {
            let lib = fake_nvml(&setup.host_root)?
                .ok_or_else(|| anyhow!("--health xid needs a fake host (gpuslice-fakehost)"))?;
            (
                Some(gpuslice_health::start(inv, &health, Some(lib), tx)),
                None,
            )
        }
        HealthSource::Synthetic => (None, Some(tx)),
    };
    let (_inv_tx, inv_rx) = tokio::sync::watch::channel(inv.clone());
    let policy = SharedPolicy::default();
    let name = slice_name(NODE, DRIVER_NAME, 0);
    let tainted = |fake: &FakeApiServer| {
        fake.slices()
            .get(&name)
            .and_then(|s| s["spec"]["devices"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .any(|d| {
                d["name"] == format!("gpu-{}", gpu.index)
                    && d["taints"][0]["key"] == UNHEALTHY_TAINT
            })
    };
    let published = |fake: &FakeApiServer| fake.slices().contains_key(&name);
    let rounds = args.health_rounds;
    let measure = async {
        wait(Duration::from_secs(10), || published(&fake)).await?;
        if watcher.is_some() {
            tokio::time::timeout(
                Duration::from_secs(10),
                watching.wait_for(|s| s.watching == "events"),
            )
            .await
            .map_err(|_| anyhow!("the XID watcher did not start"))??;
        }
        let (mut to_taint, mut to_untaint, mut seen) = (vec![], vec![], vec![]);
        for _ in 0..rounds {
            let t = Instant::now();
            match &synthetic {
                Some(tx) => tx.send_modify(|s| {
                    s.unhealthy.insert(gpu.index, "XID 79".into());
                }),
                None => inject_xid(&setup.host_root, &gpu.uuid, 79)?,
            }
            if watcher.is_some() {
                // When the watcher told: the publication's own share.
                let w = tokio::time::timeout(
                    Duration::from_secs(5),
                    watching.wait_for(|s| s.unhealthy.contains_key(&gpu.index)),
                )
                .await;
                if w.is_ok() {
                    seen.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            wait(Duration::from_secs(5), || tainted(&fake)).await?;
            to_taint.push(t.elapsed().as_secs_f64() * 1e3);
            // Recovery: the watcher's (recoverAfterSeconds 1), timed from
            // its report; a synthetic one from sending it.
            let t = match &synthetic {
                Some(tx) => {
                    let t = Instant::now();
                    tx.send_modify(|s| {
                        s.unhealthy.remove(&gpu.index);
                    });
                    t
                }
                None => {
                    tokio::time::timeout(
                        Duration::from_secs(10),
                        watching.wait_for(|s| !s.unhealthy.contains_key(&gpu.index)),
                    )
                    .await
                    .map_err(|_| anyhow!("GPU {} did not recover", gpu.index))??;
                    Instant::now()
                }
            };
            wait(Duration::from_secs(5), || !tainted(&fake)).await?;
            to_untaint.push(t.elapsed().as_secs_f64() * 1e3);
        }
        anyhow::Ok((to_taint, to_untaint, seen))
    };
    let publisher = follow(
        &api,
        DRIVER_NAME,
        gpuslice_dra::feed::NodeFeed::enforced(NODE, policy, inv_rx, rx),
        Duration::from_secs(3600),
    );
    let (mut to_taint, mut to_untaint, mut seen) = tokio::select! {
        r = measure => r?,
        _ = publisher => bail!("the publisher stopped"),
    };
    drop(watcher);
    Ok(json!({
        "source": source,
        "what": match source {
            HealthSource::Xid => "XID 79 appended to the fake NVML's event source; to_taint: from the injection to the double holding the GPU's devices tainted (the watcher's event delivery included; watcher_ms: until the watcher reported it); to_untaint: from the watcher reporting recovery (recoverAfterSeconds 1) to the taints gone",
            HealthSource::Synthetic => "the health watcher's report sent directly (a real GPU raises no XID on demand); to_taint / to_untaint: from the report to the double holding the GPU's devices tainted / untainted",
        },
        "gpu": gpu.index,
        "rounds": rounds,
        "to_taint": latency(&mut to_taint),
        "to_untaint": latency(&mut to_untaint),
        "watcher_ms": latency(&mut seen),
        "slice_writes": fake.slice_writes(),
        "criterion": format!("max <= {PUBLISH_MAX_MS} ms"),
    }))
}

/// The fake NVML's event source below a fake host (`fakegpu::FakeHost::inject_xid`).
fn inject_xid(root: &Path, uuid: &str, xid: u64) -> Result<()> {
    fakegpu::inject_xid_below(root, uuid, xid).context("injecting an XID into the fake NVML")
}

/// Polls `ok` every millisecond until it holds, or fails after `limit`.
async fn wait(limit: Duration, mut ok: impl FnMut() -> bool) -> Result<()> {
    let t = Instant::now();
    while !ok() {
        if t.elapsed() > limit {
            bail!("not seen within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// `gpuslice bench dra-selftest prepare|unprepare`.
pub fn selftest(setup: &Setup, args: &DraSelftestArgs) -> Result<i32> {
    let (date, _) = crate::utc_now();
    let inv = inventory(setup)?;
    let mut report = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "date": date,
        "phase": format!("{:?}", args.phase).to_lowercase(),
        "api_server": "FakeApiServer (gpuslice-testkit), a TEST DOUBLE",
        "work": args.work,
    });
    std::fs::create_dir_all(&args.work)?;
    let rt = runtime()?;
    let r = match args.phase {
        Phase::Prepare => rt.block_on(selftest_prepare(setup, &inv, args, &mut report)),
        Phase::Unprepare => rt.block_on(selftest_unprepare(setup, &inv, args, &mut report)),
    };
    let pass = match r {
        Ok(p) => p,
        Err(e) => {
            report["error"] = json!(format!("{e:#}"));
            false
        }
    };
    report["pass"] = json!(pass);
    write_out(setup, args.out.as_deref(), &report)?;
    Ok(if pass { 0 } else { 1 })
}

fn selftest_claims(args: &DraSelftestArgs) -> Result<Vec<(String, String, String)>> {
    args.claim
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (m, p) = c
                .split_once(':')
                .ok_or_else(|| anyhow!("--claim {c:?}: MEMORY:COMPUTE, e.g. 20Gi:30"))?;
            Ok((format!("slice-{i}"), m.to_string(), p.to_string()))
        })
        .collect()
}

async fn selftest_prepare(
    setup: &Setup,
    inv: &Inventory,
    args: &DraSelftestArgs,
    rep: &mut Value,
) -> Result<bool> {
    let gpu = inv
        .gpus
        .iter()
        .find(|g| g.index == args.gpu)
        .ok_or_else(|| anyhow!("--gpu {}: no such GPU ({} found)", args.gpu, inv.gpus.len()))?;
    let fake = FakeApiServer::start().await;
    let api = KubeApi::new(&fake.url, None)?;
    // Publication: the GPU and its shared device with its capacities.
    let (_tx, rx) = tokio::sync::watch::channel(Snapshot::default());
    let (_inv_tx, inv_rx) = tokio::sync::watch::channel(inv.clone());
    let policy = SharedPolicy::default();
    let shared = format!("gpu-{}", gpu.index);
    let name = slice_name(NODE, DRIVER_NAME, 0);
    let published = async {
        wait(Duration::from_secs(10), || {
            fake.slices().get(&name).is_some_and(|s| {
                s["spec"]["devices"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|d| d["name"] == shared.as_str()))
            })
        })
        .await
    };
    tokio::select! {
            r = published => r.context("the shared device was not published")?,
            _ = follow(
    &api,
    DRIVER_NAME,
    gpuslice_dra::feed::NodeFeed::enforced(NODE, policy, inv_rx, rx),
    Duration::from_secs(3600),
    ) => bail!("the publisher stopped"),
        }
    let slice = fake.slices().remove(&name).unwrap_or_default();
    let devices = slice["spec"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let dev = devices
        .iter()
        .find(|d| d["name"] == shared.as_str())
        .cloned()
        .unwrap_or_default();
    rep["published"] = json!({
        "devices": devices.iter().map(|d| d["name"].clone()).collect::<Vec<_>>(),
        "shared_device": dev,
        "whole_gpu_attributes": devices.iter().find(|d| d["name"] == format!("gpu-{}", gpu.index)).map(|d| d["attributes"].clone()),
    });
    let mut plugin = Plugin::start(setup, inv, &args.work, &fake.url).await?;
    let mut claims = vec![];
    let mut ok = dev["allowMultipleAllocations"] == json!(true);
    for (name, mem, pct) in selftest_claims(args)? {
        let uid = format!("selftest-{name}");
        fake.put_claim(shared_claim(
            "selftest", &name, &uid, NODE, gpu.index, &mem, &pct,
        ));
        let t = Instant::now();
        let r = plugin.prepare("selftest", &name, &uid).await;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let entry = match r {
            Ok(ids) => {
                let record =
                    gpuslice_cdi::limits_record_path(&args.work.join("cdi"), &format!("{uid}-0"));
                json!({
                    "claim": name, "uid": uid, "memory": mem, "compute": pct,
                    "cdi_device_ids": ids, "prepare_ms": ms,
                    "limits_record": std::fs::read_to_string(&record).ok(),
                })
            }
            Err(e) => {
                ok = false;
                json!({"claim": name, "uid": uid, "memory": mem, "compute": pct, "error": format!("{e:#}")})
            }
        };
        claims.push(entry);
    }
    rep["gpu"] = json!({"index": gpu.index, "uuid": gpu.uuid, "model": gpu.model, "memory_bytes": gpu.memory_bytes});
    rep["claims"] = json!(claims);
    let (healthy, health) = device_health(setup, inv).await?;
    rep["health"] = health;
    ok &= healthy;
    rep["cdi_spec_dir"] = json!(args.work.join("cdi"));
    Ok(ok)
}

/// What the plugin's health service reports for the host's devices, with
/// the XID watcher on the host's NVML (the real one on a GPU machine) and
/// the shim's state: every device Healthy once the watcher runs (waits up
/// to 10 s for it), as the kubelet would hear it.
async fn device_health(setup: &Setup, inv: &Inventory) -> Result<(bool, Value)> {
    use gpuslice_dra::health::Health;
    let (xids_tx, xids) = tokio::sync::watch::channel(Snapshot::default());
    let _watcher = gpuslice_health::start(
        inv,
        &Default::default(),
        fake_nvml(&setup.host_root)?,
        xids_tx,
    );
    let feed = gpuslice_dra::feed::NodeFeed {
        pool: NODE.into(),
        policy: SharedPolicy::default(),
        inventory: tokio::sync::watch::channel(inv.clone()).1,
        enforcement: tokio::sync::watch::channel(gpuslice_dra::daemon::enforcement_problem(Some(
            &setup.shim,
        )))
        .1,
        xids,
    };
    let mut updates = gpuslice_dra::health::follow(feed);
    let t = Instant::now();
    let mut last = Vec::new();
    while t.elapsed() < Duration::from_secs(10) {
        match tokio::time::timeout(Duration::from_secs(10), updates.recv()).await {
            Ok(Some(list)) => {
                let known = list.iter().all(|d| d.health != Health::Unknown);
                last = list;
                if known {
                    break;
                }
            }
            _ => break,
        }
    }
    let healthy = !last.is_empty() && last.iter().all(|d| d.health == Health::Healthy);
    let report = last
        .iter()
        .map(|d| json!({"device": d.device, "health": format!("{:?}", d.health), "message": d.message}))
        .collect::<Vec<_>>();
    Ok((
        healthy,
        json!({"devices": report, "seconds_to_known": t.elapsed().as_secs_f64()}),
    ))
}

async fn selftest_unprepare(
    setup: &Setup,
    inv: &Inventory,
    args: &DraSelftestArgs,
    rep: &mut Value,
) -> Result<bool> {
    // A restarted plugin: the prepared claims come from its checkpoint
    // (no API read is needed to unprepare).
    let fake = FakeApiServer::start().await;
    let mut plugin = Plugin::start(setup, inv, &args.work, &fake.url).await?;
    let prepared = plugin.driver.prepared().await;
    let mut ok = !prepared.is_empty();
    let mut done = vec![];
    for (uid, c) in &prepared {
        let r = plugin.unprepare(&c.namespace, &c.name, uid).await;
        let left: Vec<&PathBuf> = std::iter::once(&c.cdi_spec)
            .chain(&c.records)
            .filter(|p| p.exists())
            .collect();
        ok &= r.is_ok() && left.is_empty();
        done.push(
            json!({"uid": uid, "error": r.err().map(|e| format!("{e:#}")), "left_behind": left}),
        );
    }
    ok &= plugin.driver.prepared().await.is_empty();
    rep["unprepared"] = json!(done);
    Ok(ok)
}
