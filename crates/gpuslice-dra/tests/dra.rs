//! The kubelet side of the DRA driver, end to end over its real sockets:
//! a test kubelet registers it and calls NodePrepareResources /
//! NodeUnprepareResources in both API versions; claims come from the
//! FakeApiServer test double, written as kube-scheduler writes them; the
//! GPUs are the fake GPU host's.

use crate::common::{claim_ref, driver_options, NODE};
use fakegpu::FakeHost;
use gpuslice_cdi::limits_record_path;
use gpuslice_core::HostRoot;
use gpuslice_dra::api::v1;
use gpuslice_dra::apiserver::KubeApi;
use gpuslice_dra::driver::{spec_path, ClaimRef, Driver, Granted, Options, PrepareError};
use gpuslice_dra::feed::NodeFeed;
use gpuslice_dra::publish::SharedPolicy;
use gpuslice_dra::server::{get_info, serve, Served, Sockets};
use gpuslice_dra::DRIVER_NAME;
use gpuslice_k8s::grpc_wire::{grpc_go_authority, WireConn};
use gpuslice_ledger::limits::{
    verify_and_read, ComputeShare, DeviceLimits, MemorySize, Mode, SliceLimits, LIMITS_FILE,
    SLICE_DIR,
};
use gpuslice_testkit::dra_kubelet::{register, Registered};
use gpuslice_testkit::fakeapi::{claim_naming, device_claim, shared_claim, FakeApiServer};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

const GIB: u64 = 1 << 30;

fn host() -> &'static FakeHost {
    static HOST: OnceLock<FakeHost> = OnceLock::new();
    HOST.get_or_init(|| FakeHost::builder().gpus(4).mig(3, 2).build().unwrap())
}

struct Env {
    dir: tempfile::TempDir,
    api: FakeApiServer,
    /// The in-process fake NVML serves [`host`] for the whole test (the
    /// driver's health watcher calls it); dropped after everything else.
    _nvml: gpuslice_testkit::fakenvml::Serve,
}

/// A test that ends with claims still prepared (as a node may) leaves
/// their slice directories mounted: unmounted here, or every test run
/// would add tmpfs mounts to the host that outlive their temp dirs.
impl Drop for Env {
    fn drop(&mut self) {
        let kept = std::collections::HashSet::new();
        for (dir, e) in gpuslice_dra::claimfs::sweep(&self.dir.path().join("claims"), &kept) {
            eprintln!("left mounted: {}: {e}", dir.display());
        }
    }
}

impl Env {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("libgpuslice.so"), b"").unwrap();
        Env {
            dir,
            api: FakeApiServer::start().await,
            _nvml: gpuslice_testkit::fakenvml::serve(host().root()),
        }
    }

    fn cdi_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    fn sockets(&self) -> Sockets {
        Sockets {
            plugins_dir: self.dir.path().join("plugins"),
            registry_dir: self.dir.path().join("plugins_registry"),
        }
    }

    /// Starts the plugin (a fresh Driver on the same state: a restart).
    fn start(&self, shim: bool) -> Served {
        let driver = self.driver(shim);
        let health = NodeFeed::fixed(NODE, SharedPolicy::default(), driver.inventory());
        serve(driver, &self.sockets(), health).unwrap()
    }

    /// A Driver on this state and the fake host's GPUs, not served.
    fn driver(&self, shim: bool) -> Arc<Driver> {
        Arc::new(self.driver_with(self.options(shim)))
    }

    fn driver_with(&self, opts: Options) -> Driver {
        let api = Arc::new(KubeApi::new(&self.api.url, None).unwrap());
        Driver::new(opts, api).unwrap()
    }

    /// The driver's options on this state and the fake host's GPUs.
    fn options(&self, shim: bool) -> Options {
        let h = host();
        let inventory = gpuslice_testkit::fakenvml::discover(h);
        Options {
            shim: shim.then(|| self.dir.path().join("libgpuslice.so")),
            claims_dir: Some(self.dir.path().join("claims")),
            ..driver_options(HostRoot::new(h.root()), inventory, self.dir.path())
        }
    }

    /// A driver, not served, that has prepared claim `name` (`uid`): a
    /// share of 4 GiB and 10 % of GPU 1.
    async fn driver_with_a_share(&self, name: &str, uid: &str) -> (Arc<Driver>, ClaimRef) {
        let d = self.driver(true);
        self.api
            .put_claim(shared_claim("ns", name, uid, NODE, 1, "4Gi", "10"));
        let claim = claim_ref(name, uid);
        d.prepare(std::slice::from_ref(&claim)).await[uid]
            .as_ref()
            .unwrap();
        (d, claim)
    }

    /// A fresh state with the plugin started (with the shim or without)
    /// and a test kubelet that registered it.
    async fn serving(shim: bool) -> (Env, Served, Registered) {
        let e = Env::new().await;
        let served = e.start(shim);
        let k = e.kubelet().await;
        (e, served, k)
    }

    async fn kubelet(&self) -> Registered {
        register(&self.sockets().registration(DRIVER_NAME), DRIVER_NAME).await
    }

    /// Puts shared claim `ns/<name>` (uid `uid-<name>`) on this node: a
    /// share of GPU `gpu` with `memory` and `compute` %.
    fn put_share(&self, name: &str, gpu: u32, memory: &str, compute: &str) {
        let uid = format!("uid-{name}");
        let claim = shared_claim("ns", name, &uid, NODE, gpu, memory, compute);
        self.api.put_claim(claim);
    }

    /// [`Env::put_share`] of a request that named only the capacities
    /// `named` (fakeapi's `claim_naming`).
    fn put_naming(&self, name: &str, gpu: u32, named: &[&str], memory: &str, compute: &str) {
        let uid = format!("uid-{name}");
        let claim = claim_naming("ns", name, &uid, NODE, gpu, named, memory, compute);
        self.api.put_claim(claim);
    }

    fn spec(&self, uid: &str) -> Value {
        let p = spec_path(&self.cdi_dir(), uid);
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
    }
}

/// That the kubelet's answer `r` prepares claim `uid` (no error).
fn assert_granted(r: &v1::NodePrepareResourcesResponse, uid: &str) {
    assert_eq!(r.claims[uid].error, "", "{uid}");
}

/// That the kubelet's answer `r` refuses claim `uid` saying `why`.
fn assert_refused(r: &v1::NodePrepareResourcesResponse, uid: &str, why: &str) {
    let error = &r.claims[uid].error;
    assert!(error.contains(why), "{uid}: {error:?} does not say {why:?}");
}

/// The driver's refusal of claim `uid` in `r`, one line, after checking
/// that it is the refusal `is` expects.
fn driver_refusal(
    r: &BTreeMap<String, Result<Vec<Granted>, PrepareError>>,
    uid: &str,
    is: fn(&PrepareError) -> bool,
) -> String {
    let err = r[uid].as_ref().unwrap_err();
    assert!(is(err), "{uid}: {err:?}");
    gpuslice_dra::one_line(err)
}

fn env_of(device: &Value) -> Vec<String> {
    device["containerEdits"]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The limits record a capped CDI device binds at the fixed place,
/// checked the way the shim checks it (root's, not writable by others;
/// the read-only mount is the runtime's part: the bind must ask for it).
fn limits_record(device: &Value) -> SliceLimits {
    let mounts = device["containerEdits"]["mounts"].as_array().unwrap();
    let at = format!("{SLICE_DIR}/{LIMITS_FILE}");
    let m = mounts
        .iter()
        .find(|m| m["containerPath"] == at.as_str())
        .unwrap_or_else(|| panic!("no mount at {at}: {mounts:?}"));
    let opts: Vec<&str> = m["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap())
        .collect();
    assert!(opts.contains(&"ro") && opts.contains(&"bind"), "{opts:?}");
    verify_and_read(Path::new(m["hostPath"].as_str().unwrap()), false)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn node_paths(edits: &Value) -> Vec<String> {
    edits["deviceNodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| n["path"].as_str().unwrap().to_string())
        .collect()
}

/// `/dev/nvidia<digits>`: a GPU's own node (not nvidiactl, nvidia-uvm…).
fn gpu_nodes(paths: &[String]) -> Vec<String> {
    paths
        .iter()
        .filter(|p| {
            p.strip_prefix("/dev/nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .cloned()
        .collect()
}

#[tokio::test]
async fn registers_as_a_dra_plugin_with_both_versions() {
    let (e, served, k) = Env::serving(true).await;
    assert_eq!(k.info.r#type, "DRAPlugin");
    assert_eq!(k.info.name, DRIVER_NAME);
    assert_eq!(
        k.info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert_eq!(Path::new(&k.info.endpoint), served.dra_socket);
    let st = served.registration.lock().unwrap().clone();
    assert!(
        st.registered,
        "the plugin did not record the kubelet's status"
    );
    drop(served);
    assert!(!e.sockets().registration(DRIVER_NAME).exists());
    assert!(!e.sockets().dra(DRIVER_NAME).exists());
}

/// The `:authority` values kubelets and gRPC clients send on a unix
/// socket: grpc-go's (the kubelet's plugin watcher: the path without its
/// leading slash, percent-encoded), `localhost` (the kubelet's DRA and
/// device-manager clients), and the bare path (grpc-java, grpc-swift).
fn kubelet_authorities(sock: &Path) -> Vec<String> {
    vec![
        grpc_go_authority(sock),
        "localhost".into(),
        sock.display().to_string(),
    ]
}

/// A second plugin on the same sockets (an empty config once took over a
/// live kubelet's socket names) is refused, and the first keeps serving.
#[tokio::test]
async fn a_live_plugin_s_sockets_are_not_taken_over() {
    let e = Env::new().await;
    let served = e.start(true);
    let driver = e.driver(true);
    let again = serve(
        driver.clone(),
        &e.sockets(),
        NodeFeed::fixed(NODE, SharedPolicy::default(), driver.inventory()),
    );
    let err = again.err().expect("a second plugin was served").to_string();
    assert!(err.contains("another plugin serves this socket"), "{err}");
    let reg = served.registration_socket.clone();
    let info = tokio::task::spawn_blocking(move || {
        get_info(&reg, "localhost", std::time::Duration::from_secs(10))
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(info.name, DRIVER_NAME, "the first plugin still answers");
    // A socket nobody answers on (a killed plugin's) is replaced.
    drop(served);
    let stale = e.sockets().registration(DRIVER_NAME);
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let _served = e.start(true);
}

#[tokio::test]
async fn both_sockets_answer_every_authority_a_kubelet_sends() {
    let e = Env::new().await;
    let served = e.start(true);
    let reg = served.registration_socket.clone();
    let dra = served.dra_socket.clone();
    tokio::task::spawn_blocking(move || {
        for authority in kubelet_authorities(&reg) {
            let info = get_info(&reg, &authority, std::time::Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("GetInfo with :authority {authority:?}: {e}"));
            assert_eq!(info.name, DRIVER_NAME, "{authority}");
        }
        // The DRA service: an empty NodePrepareResources (prepares nothing).
        for authority in kubelet_authorities(&dra) {
            let mut conn =
                WireConn::connect(&dra, &authority, std::time::Duration::from_secs(10)).unwrap();
            let raw = conn
                .call(
                    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                    &[],
                )
                .unwrap_or_else(|e| panic!("NodePrepareResources with {authority:?}: {e}"));
            assert!(raw.is_empty(), "an empty answer to an empty request");
        }
    })
    .await
    .unwrap();
    drop(served);
}

/// The health service, as the kubelet watches it on the DRA socket:
/// the complete list at once (Unknown while no XID is watched), then a
/// critical XID on GPU 1 (Unhealthy, with the XID, in every version), then
/// the shim gone (every device Unhealthy: its slices are not enforced).
#[tokio::test]
async fn device_health_reaches_the_kubelet_in_every_version() {
    use gpuslice_dra::api::health::{v1 as h1, v1alpha1 as ha, v1beta1 as hb};
    use gpuslice_health::Snapshot;
    let e = Env::new().await;
    let driver = e.driver(true);
    let (xid_tx, xid_rx) = tokio::sync::watch::channel(Snapshot::default());
    let (enf_tx, enf_rx) = tokio::sync::watch::channel(None);
    let feed = NodeFeed {
        pool: NODE.into(),
        policy: SharedPolicy::default(),
        inventory: tokio::sync::watch::channel(driver.inventory()).1,
        xids: xid_rx,
        enforcement: enf_rx,
    };
    let served = serve(driver, &e.sockets(), feed).unwrap();
    let ch = gpuslice_k8s::plugin::server::dial(&served.dra_socket)
        .await
        .unwrap();
    let mut alpha = ha::dra_resource_health_client::DraResourceHealthClient::new(ch.clone())
        .node_watch_resources(ha::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut beta = hb::dra_resource_health_client::DraResourceHealthClient::new(ch.clone())
        .node_watch_resources(hb::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut ga = h1::dra_resource_health_client::DraResourceHealthClient::new(ch)
        .node_watch_resources(h1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    // (pool, device) -> (health, message) of one v1 or v1beta1 update.
    macro_rules! of {
        ($m:expr) => {
            $m.devices
                .iter()
                .map(|d| {
                    let id = d.device.clone().unwrap();
                    assert_eq!(id.pool_name, NODE);
                    assert!(d.last_updated_time > 1_700_000_000);
                    (id.device_name, (d.health, d.message.clone()))
                })
                .collect::<std::collections::BTreeMap<_, _>>()
        };
    }
    let first = of!(ga.message().await.unwrap().unwrap());
    assert!(
        first.contains_key("gpu-0") && first.contains_key("gpu-3-mig-0"),
        "{first:?}"
    );
    assert!(
        first
            .values()
            .all(|(h, m)| *h == h1::HealthStatus::Unknown as i32 && m.contains("no XID")),
        "{first:?}"
    );
    let a = alpha.message().await.unwrap().unwrap();
    assert_eq!(a.devices.len(), first.len());
    beta.message().await.unwrap().unwrap();

    xid_tx.send_modify(|s| {
        s.watching = "events".into();
        s.unhealthy.insert(1, "XID 79".into());
    });
    let now = of!(ga.message().await.unwrap().unwrap());
    assert_eq!(now["gpu-0"].0, h1::HealthStatus::Healthy as i32, "{now:?}");
    assert_eq!(
        now["gpu-1"].0,
        h1::HealthStatus::Unhealthy as i32,
        "{now:?}"
    );
    assert!(now["gpu-1"].1.contains("XID 79"), "{now:?}");
    let b = of!(beta.message().await.unwrap().unwrap());
    assert_eq!(b["gpu-1"].0, hb::HealthStatus::Unhealthy as i32);
    let a = alpha.message().await.unwrap().unwrap();
    let sick: Vec<_> = a
        .devices
        .iter()
        .filter(|d| d.health == ha::HealthStatus::Unhealthy as i32)
        .map(|d| d.device.clone().unwrap().device_name)
        .collect();
    assert!(
        sick.iter().all(|n| n.starts_with("gpu-1")) && !sick.is_empty(),
        "{sick:?}"
    );

    enf_tx.send(Some("the shim /x is missing".into())).unwrap();
    let now = of!(ga.message().await.unwrap().unwrap());
    assert!(
        now.values()
            .all(|(h, _)| *h == h1::HealthStatus::Unhealthy as i32),
        "{now:?}"
    );
    assert!(now["gpu-0"].1.contains("not enforced"), "{now:?}");
    drop(served);
}

/// gRPC C-core (Python's grpcio), whose default authority for a `unix:`
/// target is the percent-encoded socket path, registers the plugin too.
#[tokio::test]
async fn grpc_core_with_its_default_authority_gets_the_plugin_info() {
    let python = std::env::var("GPUSLICE_GRPCIO_PYTHON").unwrap_or_else(|_| "python3".into());
    let have = std::process::Command::new(&python)
        .args(["-c", "import grpc"])
        .status()
        .is_ok_and(|s| s.success());
    if !gpuslice_testkit::precondition(
        "grpc_core_with_its_default_authority_gets_the_plugin_info",
        (!have).then(|| format!("{python} has no grpcio (scripts/test.sh installs it)")),
    ) {
        return;
    }
    let e = Env::new().await;
    let served = e.start(true);
    let script = r#"
import grpc, sys
channel = grpc.insecure_channel("unix:" + sys.argv[1])
get_info = channel.unary_unary("/pluginregistration.Registration/GetInfo")
sys.stdout.buffer.write(get_info(b"", timeout=10))
"#;
    let sock = served.registration_socket.clone();
    // Blocking, off the runtime that serves the plugin.
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&python)
            .args(["-c", script])
            .arg(&sock)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "grpcio's GetInfo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    use prost::Message;
    let info = gpuslice_dra::api::registration::PluginInfo::decode(out.stdout.as_slice()).unwrap();
    assert_eq!(info.name, DRIVER_NAME);
    assert_eq!(Path::new(&info.endpoint), served.dra_socket);
}

#[tokio::test]
async fn shared_claim_in_v1_gets_exactly_its_caps_on_its_gpu_only() {
    let (e, _s, mut k) = Env::serving(true).await;
    e.put_share("a", 2, "20Gi", "30");
    let r = k.prepare(&[("ns", "a", "uid-a")]).await.unwrap();
    let got = &r.claims["uid-a"];
    assert_eq!(got.error, "");
    assert_eq!(got.devices.len(), 1);
    let d = &got.devices[0];
    assert_eq!(
        (d.pool_name.as_str(), d.device_name.as_str()),
        (NODE, "gpu-2")
    );
    assert_eq!(d.request_names, ["gpu"]);
    assert_eq!(d.cdi_device_ids, ["gpuslice.dev/claim=uid-a-0"]);

    // What the node enforces, in the claim's status for kubectl to show
    // (a server-side apply of status.devices as the driver's manager).
    let status = &e.api.claim("ns", "a").unwrap()["status"]["devices"];
    assert_eq!(status.as_array().map(Vec::len), Some(1), "{status}");
    let st = &status[0];
    assert_eq!(
        (&st["driver"], &st["pool"], &st["device"], &st["shareID"]),
        (
            &Value::from(DRIVER_NAME),
            &Value::from(NODE),
            &Value::from("gpu-2"),
            &Value::from("uid-a-share")
        )
    );
    assert_eq!(st["data"]["kind"], "share");
    assert_eq!(st["data"]["memoryBytes"], 20 * GIB);
    assert_eq!(st["data"]["computePercent"], 30);
    assert_eq!(
        st["data"]["enforcedBy"],
        serde_json::json!(["deviceNodes", "shim"])
    );
    assert_eq!(st["conditions"][0]["type"], "Ready");
    assert_eq!(st["conditions"][0]["status"], "True");

    let spec = e.spec("uid-a");
    assert_eq!(spec["kind"], "gpuslice.dev/claim");
    let devices = spec["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "one device per result, no others: {spec}");
    assert_eq!(devices[0]["name"], "uid-a-0");
    let uuid = host().gpus()[2].uuid.clone();
    // Root's limits record: exactly the consumed capacity, read-only at
    // the slice's fixed place (the shim takes caps from it alone).
    let record = limits_record(&devices[0]);
    assert_eq!(
        record,
        SliceLimits {
            slice_id: "uid-a-0".into(),
            mode: Mode::Cap,
            devices: vec![DeviceLimits {
                uuid: uuid.clone(),
                memory: Some(MemorySize(20 * GIB)),
                compute: ComputeShare::from_basis_points(3000),
            }],
        }
    );
    let env = env_of(&devices[0]);
    assert!(
        env.contains(&format!("GPUSLICE_MEMORY_LIMIT_0={}", 20 * GIB)),
        "{env:?}"
    );
    assert!(
        env.contains(&"GPUSLICE_COMPUTE_LIMIT=30".to_string()),
        "{env:?}"
    );
    // The claim's GPU made visible as `run` does, once for the whole spec;
    // nothing internal to gpuslice in the container's environment.
    let common = env_of(&spec);
    for var in ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"] {
        assert!(common.contains(&format!("{var}={uuid}")), "{common:?}");
        assert!(!env.iter().any(|v| v.starts_with(var)), "{env:?}");
    }
    assert!(
        !common
            .iter()
            .chain(&env)
            .any(|v| v.starts_with("GPUSLICE_CDI_")),
        "{common:?} {env:?}"
    );
    // The GPU's node and no other GPU's, in the device and in the common edits.
    let minor = host().gpus()[2].minor;
    assert_eq!(
        gpu_nodes(&node_paths(&devices[0]["containerEdits"])),
        [format!("/dev/nvidia{minor}")]
    );
    assert_eq!(
        gpu_nodes(&node_paths(&spec["containerEdits"])),
        Vec::<String>::new()
    );
    assert!(node_paths(&spec["containerEdits"]).contains(&"/dev/nvidiactl".to_string()));
    // The shim is preloaded.
    let mounts = devices[0]["containerEdits"]["mounts"].as_array().unwrap();
    let targets: Vec<&str> = mounts
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    assert!(targets.contains(&"/etc/ld.so.preload"), "{targets:?}");
    assert!(
        targets.contains(&gpuslice_cdi::CONTAINER_SHIM),
        "{targets:?}"
    );
    // The GPUs' boards are bound (the claim's slices take turns on the
    // GPU), made ready on the host, root's share records read-only.
    let board = |t: &str| {
        mounts
            .iter()
            .find(|m| m["containerPath"] == t)
            .unwrap_or_else(|| panic!("no mount at {t}: {targets:?}"))
    };
    let boards = board("/run/gpuslice/gpus");
    assert!(std::path::Path::new(boards["hostPath"].as_str().unwrap()).is_dir());
    let shares = board("/run/gpuslice/gpus/shares");
    assert!(
        shares["options"].as_array().unwrap().contains(&"ro".into()),
        "{shares}"
    );

    let record_file = limits_record_path(&e.cdi_dir(), "uid-a-0");
    assert!(record_file.exists());
    // One ledger for every container and pod of the claim: the slice's
    // directory is the host's, a tmpfs of its own (bounded, RAM), not a
    // tmpfs in each container (which multiplied the cap).
    let slice_dir = board(SLICE_DIR);
    let host_dir = std::path::PathBuf::from(slice_dir["hostPath"].as_str().unwrap());
    assert_eq!(host_dir, e.dir.path().join("claims").join("uid-a-0"));
    // Its usage ledger is root's making, and root vouches for its share on
    // the GPU's board (keyed by that ledger): the GPU's other slices count
    // it and pass it the turn, as they do `run`'s and the device plugin's.
    let usage = host_dir.join("usage");
    let opened = gpuslice_ledger::Ledger::open(&usage).unwrap();
    assert_eq!(opened.compute_share(0), 3000);
    let host_boards = std::path::PathBuf::from(boards["hostPath"].as_str().unwrap());
    let key = gpuslice_ledger::board::ledger_key(&usage).unwrap();
    assert_eq!(
        gpuslice_ledger::board::root_share(&host_boards, &uuid, key),
        Some(3000),
        "root's record of the claim's share"
    );
    assert!(
        slice_dir["type"].is_null() || slice_dir["type"] == "bind",
        "{slice_dir}"
    );
    let opts = slice_dir["options"].to_string();
    assert!(
        opts.contains("\"rw\"") && opts.contains("nosuid") && opts.contains("noexec"),
        "{opts}"
    );
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(host_dir.to_str().unwrap()))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{} is not a mount point", host_dir.display()));
    assert!(
        mounted.contains(" - tmpfs ") && mounted.contains("size=1024k"),
        "{mounted}"
    );
    // What a pod writes there is bounded: past 1 MiB the tmpfs is full.
    let junk = std::fs::write(host_dir.join("junk"), vec![0u8; 2 << 20]);
    assert!(junk.is_err(), "2 MiB fitted in the claim's slice directory");

    let u = k.unprepare(&[("ns", "a", "uid-a")]).await.unwrap();
    assert!(
        !host_dir.exists(),
        "unprepare left the claim's slice directory"
    );
    assert!(
        e.api.claim("ns", "a").unwrap()["status"]["devices"].is_null(),
        "unprepare leaves the driver's status entries"
    );
    assert_eq!(u.claims["uid-a"].error, "");
    assert!(!spec_path(&e.cdi_dir(), "uid-a").exists());
    assert!(!record_file.exists(), "unprepare left the limits record");
    assert_eq!(
        gpuslice_ledger::board::root_share(&host_boards, &uuid, key),
        None,
        "unprepare left root's record of the share"
    );
}

#[tokio::test]
async fn whole_gpu_and_mig_in_v1beta1_get_isolation_without_caps() {
    let (e, _s, mut k) = Env::serving(true).await;
    e.api
        .put_claim(device_claim("ns", "w", "uid-w", NODE, "gpu-1"));
    e.api
        .put_claim(device_claim("ns", "m", "uid-m", NODE, "gpu-3-mig-0"));
    let both = [("ns", "w", "uid-w"), ("ns", "m", "uid-m")];
    let r = k.prepare_v1beta1(&both).await.unwrap();
    for (name, uid, kind) in [("w", "uid-w", "whole"), ("m", "uid-m", "mig")] {
        assert_eq!(r.claims[uid].error, "", "{uid}");
        let st = &e.api.claim("ns", name).unwrap()["status"]["devices"][0];
        assert_eq!(st["data"]["kind"], kind, "{st}");
        assert_eq!(st["data"]["enforcedBy"], serde_json::json!(["deviceNodes"]));
        let spec = e.spec(uid);
        let env = env_of(&spec["devices"][0]);
        assert!(
            !env.iter().any(|v| v.starts_with("GPUSLICE_")),
            "{uid} capped: {env:?}"
        );
        assert!(
            spec["devices"][0]["containerEdits"]["mounts"].is_null(),
            "{uid}: no shim"
        );
    }
    let whole = node_paths(&e.spec("uid-w")["devices"][0]["containerEdits"]);
    assert_eq!(
        gpu_nodes(&whole),
        [format!("/dev/nvidia{}", host().gpus()[1].minor)]
    );
    let mig = node_paths(&e.spec("uid-m")["devices"][0]["containerEdits"]);
    assert!(
        mig.iter().any(|p| p.starts_with("/dev/nvidia-caps/")),
        "MIG caps nodes: {mig:?}"
    );
    let u = k.unprepare_v1beta1(&both).await.unwrap();
    assert_eq!(u.claims.len(), 2);
    assert!(u.claims.values().all(|c| c.error.is_empty()));
    assert!(std::fs::read_dir(e.cdi_dir())
        .unwrap()
        .flatten()
        .all(|f| !f.file_name().to_string_lossy().ends_with(".json")));
}

#[tokio::test]
async fn prepare_and_unprepare_are_idempotent() {
    let (e, _s, mut k) = Env::serving(true).await;
    e.put_share("a", 0, "10Gi", "10");
    let first = k.prepare(&[("ns", "a", "uid-a")]).await.unwrap();
    let gets = e.api.gets();
    let again = k.prepare(&[("ns", "a", "uid-a")]).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(
        e.api.gets(),
        gets,
        "a prepared claim is answered from the checkpoint"
    );
    for _ in 0..2 {
        let u = k.unprepare(&[("ns", "a", "uid-a")]).await.unwrap();
        assert_eq!(u.claims["uid-a"].error, "");
    }
    // Never prepared: also fine, and answered.
    let u = k.unprepare(&[("ns", "zz", "uid-zz")]).await.unwrap();
    assert_eq!(u.claims["uid-zz"].error, "");
}

#[tokio::test]
async fn a_restart_between_prepare_and_unprepare_loses_nothing() {
    let (e, s, mut k) = Env::serving(true).await;
    e.put_share("a", 0, "100Gi", "50");
    let first = k.prepare(&[("ns", "a", "uid-a")]).await.unwrap();
    assert_granted(&first, "uid-a");
    drop(s);
    drop(k);
    // The claim is gone from the API server: only the checkpoint knows it.
    e.api.delete_claim("ns", "a");
    let _s = e.start(true);
    let mut k = e.kubelet().await;
    assert_eq!(k.prepare(&[("ns", "a", "uid-a")]).await.unwrap(), first);
    // Its capacity still counts after the restart.
    e.put_share("b", 0, "60Gi", "10");
    let r = k.prepare(&[("ns", "b", "uid-b")]).await.unwrap();
    assert_refused(&r, "uid-b", "over-committed");
    let u = k.unprepare(&[("ns", "a", "uid-a")]).await.unwrap();
    assert_eq!(u.claims["uid-a"].error, "");
    assert!(!spec_path(&e.cdi_dir(), "uid-a").exists());
    // Now it fits.
    let r = k.prepare(&[("ns", "b", "uid-b")]).await.unwrap();
    assert_granted(&r, "uid-b");
}

/// A plugin killed between making a claim's slice directory and saving
/// its checkpoint leaves a mounted tmpfs no claim holds: the next start
/// unmounts and removes it, and keeps the directories of claims it holds.
#[tokio::test]
async fn a_restart_sweeps_slice_directories_no_claim_holds() {
    let (e, s, mut k) = Env::serving(true).await;
    e.put_share("a", 0, "10Gi", "10");
    assert_eq!(
        k.prepare(&[("ns", "a", "uid-a")]).await.unwrap().claims["uid-a"].error,
        ""
    );
    drop((s, k));
    let claims = e.dir.path().join("claims");
    let held: Vec<PathBuf> = std::fs::read_dir(&claims)
        .unwrap()
        .map(|d| d.unwrap().path())
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    let orphan = claims.join("uid-gone-0");
    gpuslice_dra::claimfs::make(&orphan).unwrap();
    std::fs::write(orphan.join("usage"), b"left by a pod").unwrap();
    assert!(mounted(&orphan));
    // Root's share record for it, as Prepare publishes one for a share.
    let boards = HostRoot::new(host().root()).join(gpuslice_ledger::board::DEFAULT_BOARD_DIR);
    gpuslice_ledger::board::prepare_dir(&boards).unwrap();
    let key = gpuslice_ledger::board::ledger_key(&orphan.join("usage")).unwrap();
    let share = gpuslice_ledger::board::publish_share(&boards, "GPU-orphaned", key, 2500).unwrap();
    let _s = e.start(true);
    assert!(!share.exists(), "the orphan's share record is withdrawn");
    assert!(!orphan.exists(), "the orphan is removed");
    assert!(!mounted(&orphan), "and unmounted");
    assert!(mounted(&held[0]), "the prepared claim's directory stays");
}

fn mounted(dir: &Path) -> bool {
    let at = dir.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(at))
}

/// A claim reserved for a privileged pod (or one in the host's pid
/// namespace) is prepared and marked, in its status (Enforced=False) and
/// the checkpoint that `slices` and the exporter read; a node that refuses
/// such claims refuses it, and prepares the same claim for a plain pod.
#[tokio::test]
async fn claims_of_pods_that_can_escape_their_caps_are_marked_or_refused() {
    let (e, _s, mut k) = Env::serving(true).await;
    let reserved = |claim: &mut Value, pod: &str| {
        claim["status"]["reservedFor"] =
            serde_json::json!([{"resource": "pods", "name": pod, "uid": format!("pod-uid-{pod}")}]);
    };
    e.api.put_pod(
        "ns",
        "root-pod",
        serde_json::json!({"hostPID": true, "containers": [
            {"name": "app", "securityContext": {"privileged": true}}]}),
    );
    e.api.put_pod(
        "ns",
        "plain-pod",
        serde_json::json!({"containers": [{"name": "app"}]}),
    );
    let mut c = shared_claim("ns", "esc", "uid-esc", NODE, 0, "1Gi", "10");
    reserved(&mut c, "root-pod");
    e.api.put_claim(c);
    let r = k.prepare(&[("ns", "esc", "uid-esc")]).await.unwrap();
    assert_granted(&r, "uid-esc");
    let st = &e.api.claim("ns", "esc").unwrap()["status"]["devices"][0]["conditions"];
    let enforced = st
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Enforced")
        .unwrap();
    assert_eq!(enforced["status"], "False", "{st}");
    let msg = enforced["message"].as_str().unwrap();
    assert!(
        msg.contains("hostPID") && msg.contains("container app: privileged"),
        "{msg}"
    );
    let marked = gpuslice_dra::checkpoint::prepared_slices(&e.dir.path().join("state")).unwrap();
    assert_eq!(marked[0].unenforceable.len(), 2, "{marked:?}");
    // A Warning Event on the claim, which the double accepted only as
    // valid for events.k8s.io/v1.
    let events = e.api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let ev = &events[0];
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["reason"], "Unenforceable");
    assert_eq!(ev["regarding"]["kind"], "ResourceClaim");
    assert_eq!(ev["regarding"]["name"], "esc");
    assert_eq!(ev["metadata"]["namespace"], "ns");
    let note = ev["note"].as_str().unwrap();
    assert!(
        note.contains("hostPID") && note.contains("privileged"),
        "{note}"
    );

    // A node that refuses them.
    let refusing = e.driver_with(Options {
        state_dir: e.dir.path().join("state-strict"),
        refuse_unenforceable: true,
        ..e.options(true)
    });
    let mut c = shared_claim("ns", "esc2", "uid-esc2", NODE, 1, "1Gi", "10");
    reserved(&mut c, "root-pod");
    e.api.put_claim(c);
    let mut ok = shared_claim("ns", "fine", "uid-fine", NODE, 1, "1Gi", "10");
    reserved(&mut ok, "plain-pod");
    e.api.put_claim(ok);
    let r = refusing
        .prepare(&[claim_ref("esc2", "uid-esc2"), claim_ref("fine", "uid-fine")])
        .await;
    let err = driver_refusal(&r, "uid-esc2", |e| {
        matches!(e, PrepareError::Unenforceable(..))
    });
    assert!(
        err.contains("--refuse-unenforceable") && err.contains("privileged"),
        "{err}"
    );
    assert!(!spec_path(&e.cdi_dir(), "uid-esc2").exists());
    assert!(r["uid-fine"].is_ok(), "{r:?}");
    let reasons: Vec<Value> = e
        .api
        .events()
        .iter()
        .map(|ev| ev["reason"].clone())
        .collect();
    assert_eq!(
        reasons,
        ["Unenforceable", "UnenforceableRefused"],
        "the plain pod's claim gets none"
    );
}

/// The double refuses an Event the real API server would (422): what the
/// driver posts is checked against the server's rules, not against itself.
#[tokio::test]
async fn the_api_double_validates_events_as_the_api_server_does() {
    let e = Env::new().await;
    let good = gpuslice_dra::apiserver::ClaimWarning {
        namespace: "ns".into(),
        claim: "c".into(),
        uid: "u".into(),
        reporter: DRIVER_NAME.into(),
        node: NODE.into(),
        action: "PrepareResources",
        reason: "Unenforceable",
        note: "x".repeat(5000),
    };
    let ev = serde_json::to_value(good.event()).unwrap();
    assert_eq!(
        ev["note"].as_str().unwrap().len(),
        1024,
        "cut to the API's limit"
    );
    let url = e.api.url.clone();
    let post = |body: Value| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            post_status(&url, "/apis/events.k8s.io/v1/namespaces/ns/events", &body)
        })
    };
    assert_eq!(post(ev.clone()).await.unwrap(), 201);
    assert_eq!(post(ev.clone()).await.unwrap(), 409, "a name is taken once");
    let mut legacy = ev.clone();
    legacy["metadata"]["name"] = "c.2".into();
    legacy["eventTime"] = Value::Null;
    assert_eq!(post(legacy).await.unwrap(), 422);
    let mut bad = ev.clone();
    bad["metadata"]["name"] = "c.3".into();
    bad["reportingController"] = "not a qualified name".into();
    assert_eq!(post(bad).await.unwrap(), 422);
    assert_eq!(e.api.events().len(), 1);
}

/// The HTTP status of a JSON POST to the double (`http://127.0.0.1:PORT`).
fn post_status(base: &str, path: &str, body: &Value) -> u16 {
    use std::io::{Read, Write};
    let host = base.trim_start_matches("http://").trim_end_matches('/');
    let mut c = std::net::TcpStream::connect(host).unwrap();
    let body = body.to_string();
    write!(
        c,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Two requests of one claim on one GPU (or two shares of two GPUs) would
/// mount two slices at the one slice directory of each container: the
/// last mount's caps would win (40 Gi/60 consumed, 30 Gi/50 enforced).
/// Refused at Prepare, with nothing left behind.
#[tokio::test]
async fn two_shares_in_one_claim_are_refused_not_capped_as_one() {
    let (e, _s, mut k) = Env::serving(true).await;
    let mut two = shared_claim("ns", "two", "uid-two", NODE, 0, "10Gi", "10");
    let results = two["status"]["allocation"]["devices"]["results"]
        .as_array_mut()
        .unwrap();
    let mut second = results[0].clone();
    second["request"] = "more".into();
    second["shareID"] = "uid-two-share-2".into();
    second["consumedCapacity"] = serde_json::json!({"memory": "30Gi", "compute": "50"});
    results.push(second);
    e.api.put_claim(two);
    let r = k.prepare(&[("ns", "two", "uid-two")]).await.unwrap();
    let err = &r.claims["uid-two"].error;
    assert!(err.contains("2 shares of GPUs (gpu-0, gpu-0)"), "{err}");
    assert!(err.contains("one request"), "{err}");
    assert!(!spec_path(&e.cdi_dir(), "uid-two").exists());
}

/// A container of a claim that ended whole (all its processes killed,
/// its pid namespace gone) leaves slots no other container can reclaim:
/// each reclaims only its own pid namespace's. The plugin, in the host's
/// pid namespace, gives their bytes back to the claim.
#[tokio::test]
async fn the_plugin_gives_back_what_a_dead_container_held_in_its_claim() {
    use gpuslice_testkit::process::spawn_until;
    use std::os::unix::process::CommandExt;
    let e = Env::new().await;
    let (d, claim) = e.driver_with_a_share("r", "uid-r").await;
    let dir = e.dir.path().join("claims").join("uid-r-0");
    let usage = dir.join("usage");
    let ledger = gpuslice_ledger::Ledger::create(
        &usage,
        "uid-r-0",
        &[gpuslice_ledger::DeviceSpec {
            uuid: host().gpus()[1].uuid.clone(),
            cap: 4 * GIB,
        }],
    )
    .unwrap();
    // A process of a container: its own pid namespace.
    let exercise = gpuslice_testkit::built("gpuslice-ledger-exercise", "gpuslice-testkit");
    let mut child = spawn_until(
        std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child"])
            .arg(&exercise)
            .args(["hold", usage.to_str().unwrap(), "0", &GIB.to_string()])
            .process_group(0),
        "held",
    );
    assert_eq!(ledger.used(0), GIB);
    // The whole container goes.
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    assert_eq!(ledger.used(0), GIB, "nothing reclaims it by itself");
    assert_eq!(d.reap_ledgers().await, GIB);
    assert_eq!(ledger.used(0), 0);
    drop(ledger);
    d.unprepare(&[claim]).await;
    assert!(!dir.exists());
}

/// One device per GPU: a whole-GPU claim as a 1.36 scheduler records it
/// (the request named no capacity and consumed all of it) is prepared
/// whole, uncapped and without the shim, and the node agrees with the
/// scheduler's arithmetic both ways: no share beside it, and no whole GPU
/// beside a share.
#[tokio::test]
async fn a_whole_gpu_is_all_of_its_capacity_and_excludes_shares_both_ways() {
    let (e, _s, mut k) = Env::serving(true).await;
    let mem = host().gpus()[1].memory_bytes.to_string();
    e.put_share("whole", 1, &mem, "100");
    let r = k.prepare(&[("ns", "whole", "uid-whole")]).await.unwrap();
    assert_granted(&r, "uid-whole");
    let spec = e.spec("uid-whole");
    let device = &spec["devices"][0];
    assert!(
        device["containerEdits"]["mounts"].is_null(),
        "no shim: {device}"
    );
    assert!(
        !env_of(device)
            .iter()
            .any(|v| v.starts_with("GPUSLICE_MEMORY_LIMIT")),
        "{device}"
    );
    // The scheduler would not place a share beside it (no capacity left);
    // the node refuses one all the same.
    e.put_share("share", 1, "1Gi", "10");
    let r = k.prepare(&[("ns", "share", "uid-share")]).await.unwrap();
    assert_refused(&r, "uid-share", "exclusive");

    // A share first, then the whole GPU: refused the other way round.
    e.put_share("s2", 2, "1Gi", "10");
    e.put_share("w2", 2, &mem, "100");
    let r = k
        .prepare(&[("ns", "s2", "uid-s2"), ("ns", "w2", "uid-w2")])
        .await
        .unwrap();
    assert_granted(&r, "uid-s2");
    assert_refused(&r, "uid-w2", "exclusive");
    // Nearly all of it is still a share, capped.
    e.put_share("s3", 0, "1Gi", "100");
    let r = k.prepare(&[("ns", "s3", "uid-s3")]).await.unwrap();
    assert_granted(&r, "uid-s3");
    assert!(env_of(&e.spec("uid-s3")["devices"][0])
        .iter()
        .any(|v| v.starts_with("GPUSLICE_MEMORY_LIMIT_0=")));
}

#[tokio::test]
async fn a_claim_that_names_no_compute_is_best_effort_and_blocks_no_share() {
    let (e, _s, mut k) = Env::serving(true).await;
    let uuid = host().gpus()[2].uuid.clone();
    // Memory only: the scheduler counted the policy's default, 1 %.
    e.put_naming("mem", 2, &["memory"], "20Gi", "1");
    let r = k.prepare(&[("ns", "mem", "uid-mem")]).await.unwrap();
    assert_granted(&r, "uid-mem");
    let device = &e.spec("uid-mem")["devices"][0];
    // Its memory is capped; its compute has no share (not the 1 % the
    // scheduler counted): not throttled, and no share of it on the board.
    let record = limits_record(device);
    assert_eq!(record.devices[0].memory, Some(MemorySize(20 * GIB)));
    assert_eq!(record.devices[0].compute, None, "{record:?}");
    assert!(
        !env_of(device)
            .iter()
            .any(|v| v.starts_with("GPUSLICE_COMPUTE_LIMIT")),
        "{device}"
    );
    let usage = e.dir.path().join("claims/uid-mem-0/usage");
    let key = gpuslice_ledger::board::ledger_key(&usage).unwrap();
    let boards = host().root().join("run/gpuslice/gpus");
    assert_eq!(
        gpuslice_ledger::board::root_share(&boards, &uuid, key),
        None
    );
    // So a share of all the GPU's time still fits beside it (before, the
    // claim counted 100 % and every share was refused).
    e.put_share("all", 2, "20Gi", "100");
    let r = k.prepare(&[("ns", "all", "uid-all")]).await.unwrap();
    assert_granted(&r, "uid-all");
    // A request that names no capacity at all is still the whole GPU
    // (all the memory), with no caps.
    let mem = host().gpus()[1].memory_bytes.to_string();
    e.put_naming("whole", 1, &[], &mem, "1");
    let r = k.prepare(&[("ns", "whole", "uid-whole")]).await.unwrap();
    assert_granted(&r, "uid-whole");
    let whole = &e.spec("uid-whole")["devices"][0];
    assert!(whole["containerEdits"]["mounts"].is_null(), "{whole}");
    k.unprepare(&[
        ("ns", "mem", "uid-mem"),
        ("ns", "all", "uid-all"),
        ("ns", "whole", "uid-whole"),
    ])
    .await
    .unwrap();
}

#[tokio::test]
async fn a_malformed_claim_fails_alone_and_leaves_nothing() {
    let (e, _s, mut k) = Env::serving(true).await;
    e.put_share("good", 0, "1Gi", "5");
    // A share as plugins before one device per GPU named it, whose
    // consumedCapacity the API server dropped.
    let mut no_cc = shared_claim("ns", "nocc", "uid-nocc", NODE, 0, "1Gi", "5");
    let r0 = no_cc["status"]["allocation"]["devices"]["results"][0]
        .as_object_mut()
        .unwrap();
    r0.remove("consumedCapacity");
    r0.insert("device".into(), "gpu-0-shared".into());
    e.api.put_claim(no_cc);
    e.put_share("big", 0, "1Gi", "150");
    e.put_share("frac", 0, "0.5", "5");
    e.api
        .put_claim(device_claim("ns", "name", "uid-name", NODE, "gpu-x"));
    e.api
        .put_claim(device_claim("ns", "pool", "uid-pool", "node-b", "gpu-0"));
    e.api
        .put_claim(device_claim("ns", "nogpu", "uid-nogpu", NODE, "gpu-9"));
    let mut unalloc = device_claim("ns", "un", "uid-un", NODE, "gpu-0");
    unalloc.as_object_mut().unwrap().remove("status");
    e.api.put_claim(unalloc);
    // Re-created under the same name: another uid.
    e.api
        .put_claim(device_claim("ns", "re", "uid-new", NODE, "gpu-0"));
    let cases = [
        ("nocc", "uid-nocc", "without consumedCapacity"),
        ("big", "uid-big", "not 1 to 100"),
        ("frac", "uid-frac", "not a whole number"),
        ("name", "uid-name", "not a device of ours"),
        ("pool", "uid-pool", "not this node's pool"),
        ("nogpu", "uid-nogpu", "not on this node"),
        ("un", "uid-un", "not allocated"),
        ("re", "uid-old", "deleted and re-created"),
        ("missing", "uid-missing", "not found"),
        ("bad", "../x", "a Kubernetes UID"),
    ];
    let mut claims = vec![("ns", "good", "uid-good")];
    claims.extend(cases.iter().map(|(n, u, _)| ("ns", *n, *u)));
    let r = k.prepare(&claims).await.unwrap();
    assert_eq!(r.claims.len(), claims.len(), "every claim gets an entry");
    assert_granted(&r, "uid-good");
    for (name, uid, why) in cases {
        let c = &r.claims[uid];
        assert!(c.error.contains(why), "{name}: {:?} lacks {why:?}", c.error);
        assert!(c.devices.is_empty());
        assert!(!spec_path(&e.cdi_dir(), uid).exists(), "{name} left a spec");
    }
    let spec_files = std::fs::read_dir(e.cdi_dir())
        .unwrap()
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".json"))
        .count();
    assert_eq!(spec_files, 1, "only the good claim's spec");
}

#[tokio::test]
async fn over_capacity_claims_are_refused_clearly() {
    let (e, _s, mut k) = Env::serving(true).await;
    // The fake GPU has 150,754,820,096 B (140.4 GiB).
    e.put_share("a", 0, "100Gi", "40");
    e.put_share("b", 0, "41Gi", "10");
    e.put_share("c", 0, "40Gi", "70");
    e.put_share("d", 0, "40Gi", "60");
    e.api
        .put_claim(device_claim("ns", "w", "uid-w", NODE, "gpu-0"));
    let r = k
        .prepare(&[
            ("ns", "a", "uid-a"),
            ("ns", "b", "uid-b"),
            ("ns", "c", "uid-c"),
            ("ns", "d", "uid-d"),
            ("ns", "w", "uid-w"),
        ])
        .await
        .unwrap();
    assert_granted(&r, "uid-a");
    let b = &r.claims["uid-b"].error;
    assert!(
        b.contains("GPU 0 would be over-committed") && b.contains("memory"),
        "{b}"
    );
    assert_refused(&r, "uid-c", "compute 70 % requested, 40 % already prepared");
    assert_eq!(r.claims["uid-d"].error, "", "40 + 60 % fits exactly");
    assert_refused(&r, "uid-w", "exclusive");
    for uid in ["uid-b", "uid-c", "uid-w"] {
        assert!(!spec_path(&e.cdi_dir(), uid).exists());
    }
}

/// Hot-plug hands the driver the GPUs there now: a claim on a GPU that
/// left is refused, one on a GPU still there is prepared.
#[tokio::test]
async fn prepare_checks_claims_against_the_gpus_there_now() {
    let e = Env::new().await;
    let d = e.driver(true);
    let mut inv = gpuslice_testkit::fakenvml::discover(host());
    inv.gpus.retain(|g| g.index != 2);
    d.set_inventory(inv);
    e.put_share("a", 2, "1Gi", "10");
    e.put_share("b", 1, "1Gi", "10");
    let r = d
        .prepare(&[claim_ref("a", "uid-a"), claim_ref("b", "uid-b")])
        .await;
    let a = driver_refusal(&r, "uid-a", |e| matches!(e, PrepareError::NoGpu(..)));
    assert!(a.contains("GPU 2 is not on this node"), "{a}");
    assert!(!spec_path(&e.cdi_dir(), "uid-a").exists());
    assert_eq!(r["uid-b"].as_ref().unwrap()[0].device, "gpu-1");
}

#[tokio::test]
async fn a_shared_claim_without_the_shim_is_refused() {
    let (e, _s, mut k) = Env::serving(false).await;
    e.put_share("a", 0, "1Gi", "10");
    let r = k.prepare(&[("ns", "a", "uid-a")]).await.unwrap();
    assert_refused(&r, "uid-a", "libgpuslice.so was not found");
    assert!(!spec_path(&e.cdi_dir(), "uid-a").exists());
}

#[tokio::test]
async fn several_claims_on_one_gpu_each_get_their_own_slice() {
    let (e, _s, mut k) = Env::serving(true).await;
    e.put_share("a", 1, "20Gi", "30");
    e.put_share("b", 1, "40Gi", "60");
    // Prepared in one call and in two: each its own spec, device and record.
    let r = k
        .prepare(&[("ns", "a", "uid-a"), ("ns", "b", "uid-b")])
        .await
        .unwrap();
    let uuid = host().gpus()[1].uuid.clone();
    for (uid, gib, pct) in [("uid-a", 20, 30), ("uid-b", 40, 60)] {
        let got = &r.claims[uid];
        assert_eq!(got.error, "", "{uid}");
        assert_eq!(
            got.devices[0].cdi_device_ids,
            [format!("gpuslice.dev/claim={uid}-0")]
        );
        let spec = e.spec(uid);
        let devices = spec["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1, "{uid}: only its own slice");
        let rec = limits_record(&devices[0]);
        assert_eq!(rec.slice_id, format!("{uid}-0"));
        assert_eq!(rec.devices.len(), 1);
        assert_eq!(rec.devices[0].uuid, uuid);
        assert_eq!(rec.devices[0].memory, Some(MemorySize(gib * GIB)));
        assert_eq!(
            rec.devices[0].compute,
            ComputeShare::from_basis_points(pct * 100)
        );
    }
    // The two records are different files: unpreparing one keeps the other.
    let u = k.unprepare(&[("ns", "a", "uid-a")]).await.unwrap();
    assert_eq!(u.claims["uid-a"].error, "");
    assert!(!limits_record_path(&e.cdi_dir(), "uid-a-0").exists());
    let rec = limits_record(&e.spec("uid-b")["devices"][0]);
    assert_eq!(rec.devices[0].memory, Some(MemorySize(40 * GIB)));
    // Over capacity with what is left: 40 Gi/60 % held, 30 Gi/50 % refused.
    e.put_share("c", 1, "30Gi", "50");
    let r = k.prepare(&[("ns", "c", "uid-c")]).await.unwrap();
    assert_refused(&r, "uid-c", "compute 50 % requested, 60 % already prepared");
    assert!(!limits_record_path(&e.cdi_dir(), "uid-c-0").exists());
}

/// A claim's pod whose process runs without the shim (its pod
/// covers the preload file; or it unshares a user and mount namespace and
/// covers the claim's records too) and takes more than the claim's memory.
/// Root's enforcer over the plugin's prepared slices (what `gpuslice dra`
/// runs) finds it by the claim's limits record in its root or its
/// container's, and kills it within about a second; the kill is recorded in
/// the plugin's state directory and goes with the claim. Without the
/// enforcer it holds its memory until the test gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_enforcer_kills_a_claim_s_process_that_runs_past_the_shim() {
    use gpuslice_testkit::pod::{Hide, PodProcess};
    use std::time::Duration;
    if !gpuslice_testkit::precondition(
        "the_enforcer_kills_a_claim_s_process_that_runs_past_the_shim",
        gpuslice_testkit::needs_root(),
    ) {
        return;
    }
    let e = Env::new().await;
    let (d, claim) = e.driver_with_a_share("x", "uid-x").await;
    let watched = d.clone();
    let _enforcer = gpuslice_k8s::enforcer::spawn(
        gpuslice_ledger::enforcer::Unshimmed::Kill,
        Some(host().nvml_lib()),
        move || watched.watched_slices(),
    )
    .unwrap();
    let record = limits_record_path(&e.cdi_dir(), "uid-x-0");
    let kills = gpuslice_dra::checkpoint::enforcement_dir(&e.dir.path().join("state"), "uid-x-0");
    let gpu = host().gpus()[1].uuid.clone();
    for hide in [Hide::Nothing, Hide::Records] {
        tokio::task::block_in_place(|| {
            let within = Duration::from_secs(3);
            PodProcess::start_and_expect_kill(host(), &record, &gpu, 5 * GIB, hide, within)
        });
    }
    let recorded = gpuslice_ledger::enforcer::read_kills(&kills);
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    assert!(recorded.iter().all(|k| k.bytes == 5 * GIB && k.uuid == gpu));
    d.unprepare(&[claim]).await;
    assert!(!kills.exists(), "the claim's records go with it");
}
