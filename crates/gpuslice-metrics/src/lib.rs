//! gpuslice-metrics: the Prometheus exporter behind `gpuslice exporter`.
//!
//! A collector thread samples, every interval, per-GPU telemetry from NVML
//! (under the host-root rules of [`gpuslice_core::discover`]), per-slice
//! memory accounting from the ledgers, and pod assignments from the kubelet
//! PodResources API, and renders the result once; XID counters come from
//! an NVML event set waited on in a thread of its own ([`xid`]). `/metrics`
//! serves the last rendering plus `gpuslice_exporter_sample_age_seconds`: a
//! scrape never waits on NVML, the ledgers or the kubelet.

#![forbid(unsafe_code)]

pub mod bench;
pub mod dra;
pub mod gpu;
pub mod pods;
pub mod sample;
pub mod server;
pub mod slices;
pub mod xid;

use gpuslice_core::discover::{discover, DiscoverOptions, DEFAULT_NVML_LIB};
use gpuslice_core::{HostRoot, Inventory};
use nvml_wrapper::Nvml;
use sample::{Labels, Sample};
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Default `--listen`, as dcgm-exporter.
pub const DEFAULT_LISTEN: &str = ":9400";
/// How long a PodResources `List` may take before the collection goes on without it.
const POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(2);
/// How often discovery (and loading NVML) is retried while it fails.
const REDISCOVER_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct Config {
    /// `host:port`, `:port` (all IPv4 addresses) or `[v6]:port`.
    pub listen: String,
    pub interval: Duration,
    pub host_root: HostRoot,
    pub ledger_dir: PathBuf,
    /// The kubelet's PodResources socket; None leaves pod labels out.
    pub pod_resources_socket: Option<PathBuf>,
    /// The DRA claims prepared on this node; None leaves them out.
    pub dra_claims: Option<dra::DraClaims>,
}

/// The rendered last sample, in both text formats, without the age.
pub struct Rendered {
    pub openmetrics: String,
    pub classic: String,
    pub taken: Instant,
}

/// What the collector and the server share.
pub struct Shared {
    current: RwLock<Arc<Rendered>>,
    pub interval: Duration,
}

impl Shared {
    pub fn current(&self) -> Arc<Rendered> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set(&self, r: Rendered) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(r);
    }
}

/// A running exporter.
pub struct Exporter {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: std::thread::JoinHandle<io::Result<()>>,
}

impl Exporter {
    /// Binds the listener (failing fast when it cannot), takes the first
    /// sample, then starts the collector and the server threads.
    pub fn start(cfg: Config) -> Result<Exporter, ExporterError> {
        if cfg.interval.is_zero() {
            return Err(ExporterError::ZeroInterval);
        }
        let addr = parse_listen(&cfg.listen)?;
        let listener =
            TcpListener::bind(addr).map_err(|source| ExporterError::Bind { addr, source })?;
        let addr = listener.local_addr()?;
        let mut collector = Collector::new(cfg.clone());
        let first = collector.collect();
        let shared = Arc::new(Shared {
            current: RwLock::new(Arc::new(first)),
            interval: cfg.interval,
        });
        let sh = shared.clone();
        std::thread::Builder::new()
            .name("collector".into())
            .spawn(move || collector.run(&sh))?;
        let sh = shared.clone();
        let server = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || server::serve(listener, sh))?;
        tracing::info!("serving /metrics on http://{addr}");
        Ok(Exporter {
            addr,
            shared,
            server,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Serves until the server fails.
    pub fn wait(self) -> Result<(), ExporterError> {
        Ok(self
            .server
            .join()
            .map_err(|_| ExporterError::ServerPanicked)??)
    }
}

/// Why the exporter could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExporterError {
    #[error("--interval must be more than 0")]
    ZeroInterval,
    #[error("--listen {0:?}: expected HOST:PORT or :PORT")]
    Listen(String),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("the HTTP server thread panicked")]
    ServerPanicked,
}

/// `:9400` → `0.0.0.0:9400`; else anything `ToSocketAddrs` takes.
pub fn parse_listen(s: &str) -> Result<SocketAddr, ExporterError> {
    let s = s.trim();
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_string(),
    };
    full.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| ExporterError::Listen(s.to_string()))
}

/// `1s`, `500ms`, `2m`, `1.5s`, or plain seconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let (num, unit) = gpuslice_ledger::split_unit(s);
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1e3,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

struct Collector {
    cfg: Config,
    inventory: Option<Inventory>,
    nvml: Option<Nvml>,
    last_discovery: Option<Instant>,
    collections: u64,
    /// XID events, watched once NVML is loaded.
    xid: Option<xid::Watcher>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Collector {
    fn new(cfg: Config) -> Collector {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| tracing::warn!("no runtime for the PodResources client: {e}"))
            .ok();
        Collector {
            cfg,
            inventory: None,
            nvml: None,
            last_discovery: None,
            collections: 0,
            xid: None,
            rt,
        }
    }

    fn run(mut self, shared: &Shared) {
        let mut next = Instant::now() + self.cfg.interval;
        loop {
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            }
            next += self.cfg.interval;
            // After a long stall, do not try to catch up.
            if next < Instant::now() {
                next = Instant::now() + self.cfg.interval;
            }
            shared.set(self.collect());
        }
    }

    /// Discovery (static facts: UUIDs, bus ids, models) and NVML, once, then
    /// again every [`REDISCOVER_EVERY`] while either is missing.
    fn ensure_discovered(&mut self) {
        let complete = self.inventory.is_some()
            && (self.nvml.is_some()
                || self
                    .inventory
                    .as_ref()
                    .is_some_and(|i| !i.sources.iter().any(|s| s == "nvml")));
        let due = match self.last_discovery {
            None => true,
            Some(t) => t.elapsed() >= REDISCOVER_EVERY,
        };
        if complete || !due {
            return;
        }
        self.last_discovery = Some(Instant::now());
        let opts = DiscoverOptions {
            pci_details: false,
            ..Default::default()
        };
        match discover(&self.cfg.host_root, &opts) {
            Ok(inv) => {
                // discover() applied the host-root rule: it used NVML only
                // where NVML describes this root.
                if inv.sources.iter().any(|s| s == "nvml") && self.nvml.is_none() {
                    match gpuslice_cuda_load::open_nvml(None) {
                        Ok(n) => {
                            self.nvml = Some(n);
                            let uuids = inv.gpus.iter().map(|g| g.uuid.clone()).collect();
                            self.xid = Some(xid::Watcher::start(DEFAULT_NVML_LIB, uuids));
                        }
                        Err(e) => tracing::warn!("NVML: {e}"),
                    }
                } else if let Some(why) = &inv.nvml_error {
                    tracing::warn!("no per-GPU telemetry: {why}");
                }
                self.inventory = Some(inv);
            }
            Err(e) => tracing::warn!("discovery failed (retrying): {e}"),
        }
    }

    fn collect(&mut self) -> Rendered {
        let t0 = Instant::now();
        self.ensure_discovered();
        let mut s = Sample::default();
        let mut nvml_ok = false;
        if let Some(inv) = &self.inventory {
            let driver = inv.driver_version.clone().unwrap_or_default();
            for g in &inv.gpus {
                let mut l = gpu::labels(g);
                l.push(("driver_version", driver.clone()));
                s.push(sample::GPU_INFO, &l, 1.0);
                if let Some(nvml) = &self.nvml {
                    nvml_ok |= gpu::collect(nvml, g, &mut s);
                }
            }
        }
        s.push(
            sample::EXP_NVML_UP,
            &Labels::new(),
            f64::from(u8::from(nvml_ok)),
        );
        self.xid
            .as_ref()
            .map(xid::Watcher::counts)
            .unwrap_or_default()
            .push(self.inventory.as_ref(), &mut s);
        slices::collect(
            &self.cfg.ledger_dir,
            self.inventory.as_ref(),
            self.nvml.as_ref(),
            &mut s,
        );
        if let Some(claims) = &self.cfg.dra_claims {
            match (claims.0)() {
                Ok(c) => dra::collect(&c, self.inventory.as_ref(), self.nvml.as_ref(), &mut s),
                Err(e) => tracing::debug!("no DRA claims: {e}"),
            }
        }
        self.collect_pods(&mut s);
        self.collections += 1;
        s.push(
            sample::EXP_COLLECTIONS,
            &Labels::new(),
            self.collections as f64,
        );
        s.push(
            sample::EXP_COLLECT,
            &Labels::new(),
            t0.elapsed().as_secs_f64(),
        );
        let openmetrics = s.render();
        Rendered {
            classic: sample::to_classic(&openmetrics),
            openmetrics,
            taken: Instant::now(),
        }
    }

    fn collect_pods(&mut self, s: &mut Sample) {
        let (Some(sock), Some(rt)) = (&self.cfg.pod_resources_socket, &self.rt) else {
            return;
        };
        if !sock.exists() {
            return;
        }
        let up = match rt.block_on(pods::list(sock, POD_RESOURCES_TIMEOUT)) {
            Ok(list) => {
                for a in list {
                    let Some(g) = self.inventory.as_ref().and_then(|inv| {
                        let i = slices::gpu_of(inv, &a.uuid)?;
                        inv.gpus.iter().find(|g| g.index == i)
                    }) else {
                        continue;
                    };
                    let mut l = gpu::labels(g);
                    l.extend([
                        ("namespace", a.namespace),
                        ("pod", a.pod),
                        ("container", a.container),
                        ("resource", a.resource),
                        ("device_id", a.device_id),
                    ]);
                    s.push(sample::GPU_POD_INFO, &l, 1.0);
                }
                1.0
            }
            Err(e) => {
                tracing::debug!("{e:#}");
                0.0
            }
        };
        s.push(sample::EXP_PODRES_UP, &Labels::new(), up);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_listen_and_interval() {
        assert_eq!(
            parse_listen(":9400").unwrap(),
            "0.0.0.0:9400".parse().unwrap()
        );
        assert_eq!(
            parse_listen("127.0.0.1:0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert!(parse_listen("nope").is_err());
        assert_eq!(parse_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_duration("1x"), None);
    }
}
