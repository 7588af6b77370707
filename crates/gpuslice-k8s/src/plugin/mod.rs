//! `gpuslice device-plugin`: the kubelet device plugin (API v1beta1).
//!
//! One gRPC server per resource, each on its own unix socket in the plugin
//! directory (`gpuslice-<resource>.sock`, the `endpoint` of its
//! registration): `<prefix>/gpu` (whole GPUs), `<prefix>/gpu.shared` (R
//! replicas per GPU, `<uuid>::<r>`, capped by the shim) and, with the
//! mixed MIG strategy, `<prefix>/mig-<profile>`. See [`resources`] for what
//! Allocate answers, [`preferred`] for GetPreferredAllocation, [`health`]
//! for XID health, [`roles`] for which resource each GPU is in, and
//! [`ledgers`] for removing the ledger directories of pods that are gone,
//! and [`partitions`] for the driver's memory partitions of replicas.
//!
//! Lifecycle ([`serve`]): load the config, discover the GPUs, start the
//! health watcher, bind the sockets, register each resource with
//! `kubelet.sock`. Then every `poll`: when `kubelet.sock` is re-created (a
//! kubelet restart, which also deletes our sockets) or one of our sockets
//! is gone, bind again and re-register. A reload (SIGHUP) re-reads the
//! config and rediscovers; a config that does not load leaves the running
//! plugin as it is. Every `ledgerCleanup.intervalSeconds`, a sweep asks
//! the kubelet's PodResources API which devices pods hold and removes the
//! ledger directories of the others that no process uses.

pub mod config;
/// The XID watcher (gpuslice-health), which ListAndWatch follows.
pub use gpuslice_health as health;
pub mod hostpid;
pub mod ledgers;
pub mod partitions;
pub mod preferred;
pub mod resources;
pub mod roles;
pub mod server;

/// The generated kubelet device-plugin API.
#[allow(clippy::all, missing_docs)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

use anyhow::{Context, Result};
use config::Config;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::HostRoot;
use resources::Plan;
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

#[derive(Debug, Clone)]
pub struct Options {
    /// The config file, re-read on reload; None: `config` as given.
    pub config_path: Option<PathBuf>,
    pub config: Config,
    pub host_root: HostRoot,
    /// NVML to load (discovery and health); None: `libnvidia-ml.so.1`.
    pub nvml_lib: Option<PathBuf>,
    /// How often the plugin directory is checked for a kubelet restart.
    pub poll: Duration,
    /// Root's enforcer over the shared replicas ([`crate::enforcer`]):
    /// what it does with a GPU process the shim does not hold; None: off
    /// (the policy file's `root_enforcer = "off"`).
    pub enforcer: Option<gpuslice_ledger::enforcer::Unshimmed>,
}

impl Options {
    pub fn new(config: Config, host_root: HostRoot) -> Self {
        Options {
            config_path: None,
            config,
            host_root,
            nvml_lib: None,
            poll: Duration::from_millis(100),
            enforcer: Some(gpuslice_ledger::enforcer::Unshimmed::default()),
        }
    }
}

/// What the plugin is doing, for tests, the self-test and logs.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Resource names served and registered, in order.
    pub resources: Vec<String>,
    /// Successful Register calls so far (all resources).
    pub registrations: u64,
    /// When the last round of registrations completed.
    pub registered_at: Option<Instant>,
    /// Config loads (the first and every reload that succeeded).
    pub generations: u64,
    pub warnings: Vec<String>,
    pub last_error: Option<String>,
    pub health: health::Snapshot,
    pub ledgers: LedgerSweeps,
}

/// How many removed directory names [`LedgerSweeps`] keeps (a daemon runs
/// for months).
pub const REMOVED_KEPT: usize = 256;

/// What the ledger sweeps did.
#[derive(Debug, Clone, Default)]
pub struct LedgerSweeps {
    /// Sweeps that ran (the kubelet answered).
    pub sweeps: u64,
    /// Directories removed so far (the last [`REMOVED_KEPT`] of them).
    pub removed: Vec<String>,
    /// The last sweep's directories whose pod is gone but a process may remain.
    pub in_use: Vec<String>,
    pub last_error: Option<String>,
}

pub enum Control {
    Reload,
    Stop,
}

/// A plugin running on its own thread (tests, self-test).
pub struct Handle {
    ctl: mpsc::UnboundedSender<Control>,
    pub state: watch::Receiver<State>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Handle {
    pub fn reload(&self) {
        let _ = self.ctl.send(Control::Reload);
    }

    /// Stops it (removing its sockets) and returns how it ended.
    pub fn stop(mut self) -> Result<()> {
        let _ = self.ctl.send(Control::Stop);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => anyhow::bail!("the device plugin thread panicked"),
            None => Ok(()),
        }
    }

    /// Waits until `f(state)` holds.
    pub fn wait_for(&self, timeout: Duration, f: impl Fn(&State) -> bool) -> Result<State> {
        let end = Instant::now() + timeout;
        loop {
            let s = self.state.borrow().clone();
            if f(&s) {
                return Ok(s);
            }
            if Instant::now() > end {
                anyhow::bail!("device plugin: condition not reached in {timeout:?}; state {s:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.ctl.send(Control::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the plugin on a thread with its own runtime.
pub fn spawn(opts: Options) -> Result<Handle> {
    let (ctl, rx) = mpsc::unbounded_channel();
    let (state_tx, state) = watch::channel(State::default());
    let thread = std::thread::Builder::new()
        .name("gpuslice-device-plugin".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(serve(opts, rx, state_tx))
        })?;
    Ok(Handle {
        ctl,
        state,
        thread: Some(thread),
    })
}

/// Runs the plugin until SIGTERM or SIGINT; SIGHUP reloads (the CLI).
pub fn run(opts: Options) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (ctl, rx) = mpsc::unbounded_channel();
        let (state_tx, _state) = watch::channel(State::default());
        let mut hup = signal(SignalKind::hangup())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let sig = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = hup.recv() => {
                        tracing::info!("SIGHUP: reloading the config");
                        let _ = ctl.send(Control::Reload);
                    }
                    _ = term.recv() => { let _ = ctl.send(Control::Stop); return; }
                    _ = int.recv() => { let _ = ctl.send(Control::Stop); return; }
                }
            }
        });
        let r = serve(opts, rx, state_tx).await;
        sig.abort();
        r
    })
}

/// One loaded config: its plan, health watcher and servers.
struct Generation {
    plan: Arc<Plan>,
    _watcher: health::Watcher,
    health: watch::Receiver<health::Snapshot>,
    served: Vec<server::Served>,
    registered: bool,
    kubelet_id: Option<(u64, u64)>,
    _sweeper: Option<AbortOnDrop>,
    _enforcer: Option<crate::enforcer::Running>,
}

/// A task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn load(
    opts: &Options,
) -> Result<(
    Arc<Plan>,
    health::Watcher,
    watch::Receiver<health::Snapshot>,
)> {
    let cfg = match &opts.config_path {
        Some(p) => Config::load(p)?,
        None => opts.config.clone(),
    };
    cfg.validate()?;
    let inv = discover(
        &opts.host_root,
        &DiscoverOptions {
            nvml_lib: opts.nvml_lib.clone(),
            ..Default::default()
        },
    )?;
    let plan = Plan::new(cfg, opts.host_root.clone(), inv)?;
    plan.prepare()
        .with_context(|| format!("cannot write {} (stateDir)", plan.preload_file().display()))?;
    partitions::write_spec(&plan).with_context(|| {
        format!(
            "the shared replicas' CDI spec {} (driverPartitions)",
            partitions::spec_path(&plan).display()
        )
    })?;
    for w in &plan.warnings {
        tracing::warn!("{w}");
    }
    let (tx, rx) = watch::channel(health::Snapshot::default());
    let watcher = health::start(&plan.inv, &plan.cfg.health, opts.nvml_lib.clone(), tx);
    Ok((Arc::new(plan), watcher, rx))
}

fn kubelet_id(dir: &Path) -> Option<(u64, u64)> {
    let md = std::fs::metadata(dir.join(server::KUBELET_SOCKET)).ok()?;
    Some((md.dev(), md.ino()))
}

impl Generation {
    fn new(opts: &Options, state: &Arc<watch::Sender<State>>) -> Result<Self> {
        let (plan, watcher, health) = load(opts)?;
        let sweeper = plan
            .cfg
            .ledger_cleanup
            .enabled
            .then(|| AbortOnDrop(tokio::spawn(sweep_ledgers(plan.clone(), state.clone()))));
        let enforcer = match opts.enforcer {
            Some(policy) if plan.shares() => {
                let dir = plan.cfg.ledger_dir.clone();
                let escapes = if plan.cfg.refuse_unenforceable {
                    gpuslice_ledger::enforcer::Escapes::Refuse
                } else {
                    gpuslice_ledger::enforcer::Escapes::Flag
                };
                let watch = move || ledgers::watched(&dir, escapes);
                Some(crate::enforcer::spawn(
                    policy,
                    opts.nvml_lib.clone(),
                    watch,
                )?)
            }
            _ => None,
        };
        std::fs::create_dir_all(&plan.cfg.plugin_dir).with_context(|| {
            format!(
                "cannot create the plugin dir {}",
                plan.cfg.plugin_dir.display()
            )
        })?;
        Ok(Generation {
            plan,
            _watcher: watcher,
            health,
            served: Vec::new(),
            registered: false,
            kubelet_id: None,
            _sweeper: sweeper,
            _enforcer: enforcer,
        })
    }

    fn dir(&self) -> &Path {
        &self.plan.cfg.plugin_dir
    }

    async fn stop_serving(&mut self) {
        for s in self.served.drain(..) {
            s.shutdown().await;
        }
        self.registered = false;
    }

    /// (Re)binds every socket.
    async fn start_serving(&mut self) -> Result<()> {
        self.stop_serving().await;
        for i in 0..self.plan.resources.len() {
            let svc = server::Service {
                plan: self.plan.clone(),
                res: i,
                health: self.health.clone(),
            };
            self.served.push(server::serve(self.dir(), svc)?);
        }
        Ok(())
    }

    async fn register_all(&mut self) -> Result<u64> {
        let mut n = 0;
        for r in &self.plan.resources {
            server::register(self.dir(), &r.endpoint(), &r.name).await?;
            n += 1;
        }
        self.registered = true;
        Ok(n)
    }

    /// One poll: serve again and re-register after a kubelet restart.
    async fn tick(&mut self, state: &watch::Sender<State>) {
        let id = kubelet_id(self.dir());
        let sockets_gone = self.served.iter().any(|s| !s.socket.exists());
        let restarted = id.is_some() && id != self.kubelet_id;
        if restarted || sockets_gone || self.served.is_empty() {
            if restarted && self.kubelet_id.is_some() {
                tracing::info!("kubelet.sock re-created: serving again and re-registering");
            }
            if let Err(e) = self.start_serving().await {
                tracing::warn!("{e:#}");
                state.send_modify(|s| s.last_error = Some(format!("{e:#}")));
                return;
            }
        }
        if id.is_none() {
            // No kubelet: keep serving, register when it comes.
            self.kubelet_id = None;
            self.registered = false;
            return;
        }
        if !self.registered {
            match self.register_all().await {
                Ok(n) => {
                    self.kubelet_id = id;
                    tracing::info!(
                        "registered {} with the kubelet",
                        self.plan
                            .resources
                            .iter()
                            .map(|r| r.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    state.send_modify(|s| {
                        s.registrations += n;
                        s.registered_at = Some(Instant::now());
                        s.last_error = None;
                    });
                }
                Err(e) => {
                    tracing::warn!("{e:#}");
                    state.send_modify(|s| s.last_error = Some(format!("{e:#}")));
                }
            }
        }
    }
}

/// The plugin's main loop, until `Control::Stop` (or the sender is dropped).
pub async fn serve(
    opts: Options,
    mut ctl: mpsc::UnboundedReceiver<Control>,
    state: watch::Sender<State>,
) -> Result<()> {
    let state = Arc::new(state);
    let mut gen = Generation::new(&opts, &state)?;
    let publish = |gen: &Generation, state: &watch::Sender<State>| {
        state.send_modify(|s| {
            s.resources = gen.plan.resources.iter().map(|r| r.name.clone()).collect();
            s.warnings = gen.plan.warnings.clone();
            s.generations += 1;
        })
    };
    publish(&gen, &state);
    let mut tick = tokio::time::interval(opts.poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut hrx = gen.health.clone();
    let mut health_alive = true;
    loop {
        tokio::select! {
            c = ctl.recv() => match c {
                Some(Control::Reload) => match Generation::new(&opts, &state) {
                    Ok(new) => {
                        gen.stop_serving().await;
                        gen = new;
                        hrx = gen.health.clone();
                        health_alive = true;
                        publish(&gen, &state);
                        gen.tick(&state).await;
                    }
                    Err(e) => {
                        tracing::error!("reload failed, keeping the running config: {e:#}");
                        state.send_modify(|s| s.last_error = Some(format!("reload: {e:#}")));
                    }
                },
                Some(Control::Stop) | None => {
                    gen.stop_serving().await;
                    return Ok(());
                }
            },
            _ = tick.tick() => gen.tick(&state).await,
            r = hrx.changed(), if health_alive => {
                if r.is_err() {
                    health_alive = false;
                }
                let h = hrx.borrow_and_update().clone();
                state.send_modify(|s| s.health = h);
            }
        }
    }
}

/// Every `ledgerCleanup.intervalSeconds`: the ledger directories there
/// are, then the slice ids of the devices the kubelet says pods hold, then
/// [`ledgers::sweep`] of the former. No answer, no sweep.
async fn sweep_ledgers(plan: Arc<Plan>, state: Arc<watch::Sender<State>>) {
    let cfg = &plan.cfg.ledger_cleanup;
    let mut tick = tokio::time::interval(Duration::from_secs(cfg.interval_seconds));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let dir = plan.cfg.ledger_dir.clone();
        let boards = plan.cfg.board_dir.clone();
        let listed = ledgers::listed(&dir);
        let held =
            match gpuslice_metrics::pods::list(&cfg.pod_resources_socket, Duration::from_secs(5))
                .await
            {
                Ok(a) => a
                    .iter()
                    .map(|a| resources::slice_id(&a.device_id))
                    .collect::<HashSet<String>>(),
                Err(e) => {
                    let e = format!("ledger cleanup skipped: {e:#}");
                    tracing::warn!("{e}");
                    state.send_modify(|s| s.ledgers.last_error = Some(e));
                    continue;
                }
            };
        let grace = Duration::from_secs(cfg.grace_seconds);
        let swept = match tokio::task::spawn_blocking(move || {
            ledgers::sweep(&dir, &boards, listed, &held, grace)
        })
        .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("ledger sweep: {e}");
                continue;
            }
        };
        for name in &swept.removed {
            tracing::info!("removed the ledger directory {name}: its pod is gone");
        }
        for e in &swept.errors {
            tracing::warn!("ledger cleanup: {e}");
        }
        state.send_modify(|s| {
            let l = &mut s.ledgers;
            l.sweeps += 1;
            l.removed.extend(swept.removed);
            let over = l.removed.len().saturating_sub(REMOVED_KEPT);
            l.removed.drain(..over);
            l.in_use = swept.in_use;
            l.last_error = swept.errors.into_iter().next();
        });
    }
}
