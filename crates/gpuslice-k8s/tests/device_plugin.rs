//! The device plugin against a test kubelet speaking the real v1beta1
//! protocol over unix sockets, on a fake GPU host (4 GPUs, GPU 3 in MIG
//! mode with two 1g.18gb instances). The fake NVML is loaded in-process,
//! so every test of this file shares one host, held with
//! `gpuslice_testkit::fakenvml::serve` by its [`StateDir`].
//!
//! Each GPU has one role. `MIXED` gives GPUs 0 and 1 the role whole and
//! GPU 2 shared (GPU 3, in MIG mode, serves its MIG devices); `SHARED`
//! shares GPUs 0-2; the empty config offers them whole.

use fakegpu::FakeHost;
use gpuslice_core::HostRoot;
use gpuslice_k8s::plugin::config::Config;
use gpuslice_k8s::plugin::{spawn, Handle, Options};
use gpuslice_ledger::board::board_path;
use gpuslice_testkit::kubelet::{allocate_one, first_list, preferred_one, Client, TestKubelet};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tonic::Code;

const GIB: u64 = 1 << 30;

fn host() -> &'static FakeHost {
    static HOST: OnceLock<FakeHost> = OnceLock::new();
    HOST.get_or_init(|| FakeHost::builder().gpus(4).mig(3, 2).build().unwrap())
}

/// A test's plugin state. The replicas' directories the plugin leaves
/// allocated are tmpfs mounts (`gpuslice_k8s::slicedir`): unmounted here,
/// or they would outlive the temp dir on the host. While it lives, the
/// in-process fake NVML serves [`host`] (the plugin's health watcher
/// calls it): declared first in a test, it goes last.
struct StateDir(tempfile::TempDir, gpuslice_testkit::fakenvml::Serve);

impl StateDir {
    fn new() -> Self {
        StateDir(
            tempfile::tempdir().unwrap(),
            gpuslice_testkit::fakenvml::serve(host().root()),
        )
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let kept = std::collections::HashSet::new();
        for (dir, e) in gpuslice_k8s::slicedir::sweep(&self.path().join("ledgers"), &kept) {
            eprintln!("left mounted: {}: {e}", dir.display());
        }
    }
}

fn config(dir: &Path, extra: &str) -> Config {
    let mut c = Config::parse(extra).unwrap();
    c.plugin_dir = dir.join("plugins");
    c.ledger_dir = dir.join("ledgers");
    c.state_dir = dir.join("state");
    c.board_dir = dir.join("boards");
    c.shim = dir.join("libgpuslice.so");
    c
}

fn start(cfg: Config) -> Handle {
    let h = host();
    let mut o = Options::new(cfg, HostRoot::new(h.root()));
    o.nvml_lib = Some(h.nvml_lib());
    o.poll = Duration::from_millis(50);
    spawn(o).unwrap()
}

fn uuid(i: usize) -> String {
    host().gpus()[i].uuid.clone()
}

/// The plugin on `cfg`, and a test kubelet that has seen each of
/// `resources` register.
async fn start_registered(cfg: Config, resources: &[&str]) -> (Handle, TestKubelet) {
    let mut kubelet = TestKubelet::start(&cfg.plugin_dir).await.unwrap();
    let plugin = start(cfg);
    kubelet
        .registrations_of(resources, Duration::from_secs(10))
        .await
        .unwrap();
    (plugin, kubelet)
}

/// [`start_registered`] on a fresh state with `extra` config.
async fn registered(extra: &str, resources: &[&str]) -> (StateDir, Handle, TestKubelet) {
    let t = StateDir::new();
    let (plugin, kubelet) = start_registered(config(t.path(), extra), resources).await;
    (t, plugin, kubelet)
}

/// [`registered`] with GPUs 0-2 shared (`SHARED`, with the `sharing`
/// options given), and a client of the shared resource.
async fn shared_replicas(sharing: &str) -> (StateDir, Handle, TestKubelet, Client) {
    let extra = match sharing {
        "" => SHARED.to_string(),
        options => format!("{SHARED}sharing: {{{options}}}"),
    };
    let (t, plugin, kubelet) = registered(&extra, &SHARED_AND_MIG).await;
    let client = kubelet.dial("gpuslice-gpu.shared.sock").await.unwrap();
    (t, plugin, kubelet, client)
}

const ALL: [&str; 3] = [
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-1g.18gb",
];
const WHOLE_AND_MIG: [&str; 2] = ["nvidia.com/gpu", "nvidia.com/mig-1g.18gb"];
const SHARED_AND_MIG: [&str; 2] = ["nvidia.com/gpu.shared", "nvidia.com/mig-1g.18gb"];
const MIXED: &str =
    "roles: [{gpus: [0, 1], role: whole}, {gpus: [2], role: shared, replicas: 4}]\n";
const SHARED: &str = "roles: [{gpus: others, role: shared, replicas: 4}]\n";

#[tokio::test]
async fn registers_each_resource_and_lists_devices_with_numa() {
    let (_t, _p, mut k) = registered(MIXED, &[]).await;
    let regs = k
        .registrations_of(&ALL, Duration::from_secs(10))
        .await
        .unwrap();
    let mut endpoints = BTreeSet::new();
    for r in &regs {
        assert_eq!(r.req.version, "v1beta1");
        assert!(
            r.req
                .options
                .as_ref()
                .unwrap()
                .get_preferred_allocation_available
        );
        assert!(!r.req.endpoint.contains('/'));
        endpoints.insert((r.req.resource_name.clone(), r.req.endpoint.clone()));
    }
    assert_eq!(endpoints.len(), 3, "{endpoints:?}");

    let mut c = k.dial("gpuslice-gpu.sock").await.unwrap();
    let (devs, _s) = first_list(&mut c).await.unwrap();
    let got: Vec<(String, String, i64)> = devs
        .iter()
        .map(|d| {
            (
                d.id.clone(),
                d.health.clone(),
                d.topology.as_ref().unwrap().nodes[0].id,
            )
        })
        .collect();
    // GPU 2 is shared, GPU 3 in MIG mode: offered only as MIG devices.
    let want: Vec<(String, String, i64)> = (0..2)
        .map(|i| (uuid(i), "Healthy".to_string(), 0))
        .collect();
    assert_eq!(got, want);

    let mut c = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    let (devs, _s) = first_list(&mut c).await.unwrap();
    let ids: Vec<_> = devs.iter().map(|d| d.id.clone()).collect();
    let want: Vec<_> = (0..4).map(|r| format!("{}::{r}", uuid(2))).collect();
    assert_eq!(ids, want);
    assert!(devs.iter().all(|d| d.id.len() <= 63));
    assert_eq!(devs[0].topology.as_ref().unwrap().nodes[0].id, 1);

    let mut c = k.dial("gpuslice-mig-1g.18gb.sock").await.unwrap();
    let (devs, _s) = first_list(&mut c).await.unwrap();
    let ids: Vec<_> = devs.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.iter().all(|i| i.starts_with("MIG-")), "{ids:?}");

    let opts = c
        .get_device_plugin_options(gpuslice_k8s::plugin::v1beta1::Empty {})
        .await
        .unwrap();
    assert!(opts.get_ref().get_preferred_allocation_available);
}

fn dev_paths(r: &gpuslice_k8s::plugin::v1beta1::ContainerAllocateResponse) -> BTreeSet<String> {
    r.devices.iter().map(|d| d.container_path.clone()).collect()
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn allocates_whole_gpus_with_exactly_their_nodes() {
    let (t, _p, k) = registered("strategies: {cdi: true}", &WHOLE_AND_MIG).await;
    let mut c = k.dial("gpuslice-gpu.sock").await.unwrap();
    let r = allocate_one(&mut c, &[uuid(2), uuid(0)]).await.unwrap();
    assert_eq!(
        dev_paths(&r),
        set(&[
            "/dev/nvidia0",
            "/dev/nvidia2",
            "/dev/nvidiactl",
            "/dev/nvidia-modeset",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools"
        ])
        .into_iter()
        .filter(|p| host().root().join(&p[1..]).exists())
        .collect()
    );
    assert!(r.devices.iter().any(|d| d.container_path == "/dev/nvidia2"
        && d.host_path == host().root().join("dev/nvidia2").display().to_string()
        && d.permissions == "rw"));
    let visible = format!("{},{}", uuid(0), uuid(2));
    assert_eq!(r.envs["CUDA_VISIBLE_DEVICES"], visible);
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], visible);
    assert_eq!(r.envs["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    assert!(r.envs.contains_key("GPUSLICE_SLICE"));
    assert!(!r.envs.contains_key("GPUSLICE_MEMORY_LIMIT"));
    assert!(r.mounts.is_empty());
    let cdi: Vec<_> = r.cdi_devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(
        cdi,
        vec![
            format!("gpuslice.dev/gpu={}", uuid(0)),
            format!("gpuslice.dev/gpu={}", uuid(2))
        ]
    );
    drop(t);
}

#[tokio::test]
async fn allocates_shared_replicas_with_the_shim_and_a_cap() {
    let (t, _p, _k, mut c) = shared_replicas("").await;
    let mem = host().gpus()[1].memory_bytes;
    // One replica: 1/4 of the GPU.
    let r = allocate_one(&mut c, &[format!("{}::3", uuid(1))])
        .await
        .unwrap();
    assert_eq!(r.envs["GPUSLICE_MEMORY_LIMIT_0"], (mem / 4).to_string());
    assert_eq!(r.envs["GPUSLICE_COMPUTE_LIMIT"], "25");
    assert_eq!(r.envs["CUDA_VISIBLE_DEVICES"], uuid(1));
    assert!(dev_paths(&r).contains("/dev/nvidia1") && !dev_paths(&r).contains("/dev/nvidia0"));
    let slice = r.envs["GPUSLICE_SLICE"].clone();
    assert!(
        !r.envs.contains_key("GPUSLICE_LEDGER"),
        "the fixed place, not a variable"
    );
    let mounts: Vec<(String, String, bool)> = r
        .mounts
        .iter()
        .map(|m| (m.container_path.clone(), m.host_path.clone(), m.read_only))
        .collect();
    let records = t.path().join("ledgers").join(&slice);
    let boards = t.path().join("boards");
    let inside = Path::new("/run/gpuslice/gpus");
    let mount = |container: &Path, host: &Path, read_only: bool| {
        (
            container.display().to_string(),
            host.display().to_string(),
            read_only,
        )
    };
    let state = t.path().join("state");
    let slice_dir = Path::new("/run/gpuslice/slice");
    assert_eq!(
        mounts,
        vec![
            mount(
                Path::new("/usr/local/gpuslice/libgpuslice.so"),
                &t.path().join("libgpuslice.so"),
                true
            ),
            mount(
                Path::new("/etc/ld.so.preload"),
                &state.join("ld.so.preload"),
                true
            ),
            mount(&slice_dir.join("limits"), &records.join("limits"), true),
            mount(&slice_dir.join("usage"), &records.join("usage"), false),
            mount(&slice_dir.join("hostpid"), &state.join("hostpid"), true),
            mount(inside, &boards, true),
            mount(
                &board_path(inside, &uuid(1)),
                &board_path(&boards, &uuid(1)),
                false
            ),
            mount(&inside.join("shares"), &boards.join("shares"), true),
        ]
    );
    // A capped replica takes turns on its GPU as a guaranteed one does:
    // the board is there and its share is vouched for by root.
    assert_takes_turns(&t, &r, &records, &uuid(1), 2500);
    // The host-pid resolver the plugin serves (in the host's PID
    // namespace) tells the connector its own pid.
    assert_eq!(
        gpuslice_ledger::hostpid::ask(&t.path().join("state/hostpid")).unwrap(),
        std::process::id()
    );
    // Root's record: root-only directory, read-only record; the replica's
    // ledger is all it may write.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: std::path::PathBuf| p.metadata().unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(records.clone()), 0o700);
    assert_eq!(mode(records.join("limits")), 0o644);
    let limits = gpuslice_ledger::limits::verify_and_read(&records.join("limits"), false).unwrap();
    assert_eq!(limits.devices[0].memory.unwrap().0, mem / 4);
    assert_eq!(limits.devices[0].share_bp(), 2500);
    assert_eq!(
        limits.mode,
        gpuslice_ledger::board::Mode::Cap,
        "a hard cap by default"
    );
    assert_eq!(
        std::fs::read_to_string(t.path().join("state/ld.so.preload")).unwrap(),
        "/usr/local/gpuslice/libgpuslice.so\n"
    );
    assert!(r.cdi_devices.is_empty(), "CDI is off by default");
    // Two replicas on one GPU and one on another: per-ordinal caps.
    let ids = [
        format!("{}::0", uuid(0)),
        format!("{}::1", uuid(0)),
        format!("{}::0", uuid(2)),
    ];
    let r = allocate_one(&mut c, &ids).await.unwrap();
    assert_eq!(
        r.envs["CUDA_VISIBLE_DEVICES"],
        format!("{},{}", uuid(0), uuid(2))
    );
    assert_eq!(r.envs["GPUSLICE_MEMORY_LIMIT_0"], (mem / 4 * 2).to_string());
    assert_eq!(r.envs["GPUSLICE_MEMORY_LIMIT_1"], (mem / 4).to_string());
    assert!(mem > 100 * GIB);
    // Of another slice's records, nothing is mounted writable: every
    // read-write mount is this replica's own usage ledger or the board of
    // one of its GPUs.
    let own = t.path().join("ledgers").join(&r.envs["GPUSLICE_SLICE"]);
    let writable: BTreeSet<String> = std::iter::once(own.join("usage"))
        .chain([0, 2].map(|i| board_path(&t.path().join("boards"), &uuid(i))))
        .map(|p| p.display().to_string())
        .collect();
    for m in r.mounts.iter().filter(|m| !m.read_only) {
        assert!(writable.contains(&m.host_path), "{m:?}");
    }
    // Allocated again (a new container for the same IDs): fresh records.
    let again = allocate_one(&mut c, &ids).await.unwrap();
    assert_eq!(again.envs["GPUSLICE_SLICE"], r.envs["GPUSLICE_SLICE"]);
}

#[tokio::test]
async fn allocates_mig_devices_with_their_caps() {
    let (_t, _p, k) = registered("", &WHOLE_AND_MIG).await;
    let mut c = k.dial("gpuslice-mig-1g.18gb.sock").await.unwrap();
    let (devs, _s) = first_list(&mut c).await.unwrap();
    let r = allocate_one(&mut c, &[devs[1].id.clone()]).await.unwrap();
    let paths = dev_paths(&r);
    assert!(paths.contains("/dev/nvidia3"), "{paths:?}");
    assert!(!paths.contains("/dev/nvidia0"));
    let caps: Vec<_> = paths
        .iter()
        .filter(|p| p.starts_with("/dev/nvidia-caps/"))
        .collect();
    assert_eq!(
        caps.len(),
        2,
        "GI and CI access caps of that instance only: {caps:?}"
    );
    assert_eq!(r.envs["CUDA_VISIBLE_DEVICES"], devs[1].id);
}

#[tokio::test]
async fn bad_and_foreign_requests_are_invalid_argument() {
    let (_t, _p, k) = registered("", &WHOLE_AND_MIG).await;
    let mut c = k.dial("gpuslice-gpu.sock").await.unwrap();
    let shared_id = format!("{}::0", uuid(0));
    let long = "x".repeat(10_000);
    for ids in [
        vec![],
        vec!["GPU-nope".to_string()],
        vec![shared_id.clone()], // another resource's ID
        vec![uuid(3)],           // the MIG-mode GPU is not offered whole
        vec![uuid(0), uuid(0)],  // twice
        vec![long.clone()],
        vec!["../../etc/passwd".to_string()],
    ] {
        let e = allocate_one(&mut c, &ids).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{ids:?}: {e}");
    }
    for (avail, must, size) in [
        (vec!["GPU-nope".to_string()], vec![], 1),
        (vec![uuid(0)], vec![uuid(0), uuid(1)], 1),
        (vec![uuid(0)], vec![], 2),
        (vec![uuid(0)], vec![], -1),
    ] {
        let e = preferred_one(&mut c, &avail, &must, size)
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Code::InvalidArgument,
            "{avail:?} {must:?} {size}: {e}"
        );
    }
    // Still serving.
    allocate_one(&mut c, &[uuid(1)]).await.unwrap();
}

#[tokio::test]
async fn preferred_allocation_of_whole_gpus_follows_topology() {
    let (_t, _p, k) = registered("", &WHOLE_AND_MIG).await;
    let mut c = k.dial("gpuslice-gpu.sock").await.unwrap();
    let all: Vec<String> = (0..3).map(uuid).collect();
    // GPUs 0,1 share NUMA node 0; 2 is alone on node 1.
    assert_eq!(
        preferred_one(&mut c, &all, &[], 2).await.unwrap(),
        vec![uuid(0), uuid(1)]
    );
    let got = preferred_one(&mut c, &all, &[uuid(1)], 2).await.unwrap();
    assert_eq!(got, vec![uuid(1), uuid(0)]);
    let got = preferred_one(&mut c, &all, &[uuid(2)], 2).await.unwrap();
    assert_eq!(got[0], uuid(2));
}

/// The GPU indices of replica IDs.
fn gpus_of(ids: &[String]) -> Vec<usize> {
    ids.iter()
        .map(|i| (0..4).find(|g| i.starts_with(&uuid(*g))).unwrap())
        .collect()
}

/// Replica IDs of the shared list minus `taken` replicas on each GPU.
fn available(all: &[String], taken: &[(usize, usize)]) -> Vec<String> {
    all.iter()
        .filter(|id| {
            !taken
                .iter()
                .any(|&(g, n)| (0..n).any(|r| **id == format!("{}::{r}", uuid(g))))
        })
        .cloned()
        .collect()
}

#[tokio::test]
async fn preferred_allocation_packs_replicas_onto_the_fullest_gpu() {
    let (_t, _p, _k, mut s) = shared_replicas("").await;
    let (devs, _st) = first_list(&mut s).await.unwrap();
    let all: Vec<String> = devs.iter().map(|d| d.id.clone()).collect();
    // The case: GPU 0 holds one replica; the next goes to GPU 0,
    // not to an empty GPU.
    let avail = available(&all, &[(0, 1)]);
    let got = preferred_one(&mut s, &avail, &[], 1).await.unwrap();
    assert_eq!(gpus_of(&got), vec![0]);
    // The fullest with room, even at a higher index: GPU 2 holds 3, GPU 1 holds 2.
    let avail = available(&all, &[(1, 2), (2, 3)]);
    let got = preferred_one(&mut s, &avail, &[], 1).await.unwrap();
    assert_eq!(gpus_of(&got), vec![2]);
    let got = preferred_one(&mut s, &avail, &[], 2).await.unwrap();
    assert_eq!(gpus_of(&got), vec![1, 1], "GPU 2 has room for one only");
    // Nothing empty yet: three on one GPU.
    let got = preferred_one(&mut s, &all, &[], 3).await.unwrap();
    assert_eq!(gpus_of(&got), vec![0, 0, 0]);
    // must_include on GPU 2 pulls the rest onto GPU 2.
    let must = format!("{}::2", uuid(2));
    let got = preferred_one(&mut s, &all, std::slice::from_ref(&must), 4)
        .await
        .unwrap();
    assert_eq!(got[0], must);
    assert_eq!(gpus_of(&got), vec![2; 4]);
    // No GPU holds five: the fewest GPUs (4 on the emptiest, then 1).
    let avail = available(&all, &[(0, 1)]);
    let avail: Vec<String> = avail
        .into_iter()
        .filter(|i| !i.starts_with(&uuid(2)))
        .collect();
    let got = preferred_one(&mut s, &avail, &[], 5).await.unwrap();
    assert_eq!(gpus_of(&got), vec![1, 1, 1, 1, 0]);
}

#[tokio::test]
async fn spread_option_spreads_replicas() {
    let (_t, _p, _k, mut s) = shared_replicas("spread: true").await;
    let (devs, _st) = first_list(&mut s).await.unwrap();
    let all: Vec<String> = devs.iter().map(|d| d.id.clone()).collect();
    let got = preferred_one(&mut s, &all, &[], 3).await.unwrap();
    assert_eq!(gpus_of(&got), vec![0, 1, 2]);
    // The emptiest first: GPU 0 holds one, so 1 and 2 come before it.
    let avail = available(&all, &[(0, 1)]);
    let got = preferred_one(&mut s, &avail, &[], 4).await.unwrap();
    assert_eq!(gpus_of(&got), vec![1, 2, 0, 1]);
}

/// The replica `r` (records in `records`) takes turns on GPU `gpu`: its
/// board, made by root, bound writable over the boards' directory bound
/// read-only (a replica can add or remove nothing there), the
/// shim told where they are, and root's record of its `share_bp` (keyed
/// by its usage ledger: what lets the other slices count it and pass it
/// the turn) read-only on top (a replica cannot vouch for a share of its
/// own making).
fn assert_takes_turns(
    t: &StateDir,
    r: &gpuslice_k8s::plugin::v1beta1::ContainerAllocateResponse,
    records: &Path,
    gpu: &str,
    share_bp: u64,
) {
    let boards = t.path().join("boards");
    let mounted = |inside: &Path, host: &Path, read_only: bool| {
        r.mounts.iter().any(|m| {
            m.container_path == inside.display().to_string()
                && m.host_path == host.display().to_string()
                && m.read_only == read_only
        })
    };
    let inside = Path::new("/run/gpuslice/gpus");
    assert!(mounted(inside, &boards, true), "{:?}", r.mounts);
    let board = board_path(&boards, gpu);
    assert!(
        mounted(&board_path(inside, gpu), &board, false),
        "{:?}",
        r.mounts
    );
    assert_eq!(
        std::fs::metadata(&board).unwrap().len(),
        gpuslice_ledger::board::BOARD_SIZE as u64
    );
    assert!(
        mounted(&inside.join("shares"), &boards.join("shares"), true),
        "{:?}",
        r.mounts
    );
    assert_eq!(r.envs["GPUSLICE_BOARD_DIR"], "/run/gpuslice/gpus");
    let key = gpuslice_ledger::board::ledger_key(&records.join("usage")).unwrap();
    assert_eq!(
        gpuslice_ledger::board::root_share(&boards, gpu, key),
        Some(share_bp),
        "root's record of the replica's share"
    );
}

#[tokio::test]
async fn guaranteed_mode_lets_replicas_borrow() {
    let (t, _p, _k, mut c) = shared_replicas("computeMode: guaranteed").await;
    let r = allocate_one(&mut c, &[format!("{}::0", uuid(2))])
        .await
        .unwrap();
    assert_eq!(r.envs["GPUSLICE_COMPUTE_MODE"], "guaranteed");
    assert_eq!(r.envs["GPUSLICE_COMPUTE_LIMIT"], "25");
    let slice = t.path().join("ledgers").join(&r.envs["GPUSLICE_SLICE"]);
    assert_takes_turns(&t, &r, &slice, &uuid(2), 2500);
    let boards = t.path().join("boards");
    // World-writable and sticky, like /tmp: replicas run as any user.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        boards.metadata().unwrap().permissions().mode() & 0o7777,
        0o1777
    );
}

#[tokio::test]
async fn reregisters_after_a_kubelet_restart() {
    let (t, p, k) = registered(MIXED, &ALL).await;
    let dir = t.path().join("plugins");
    // The kubelet goes away, then comes back: it wipes the sockets and
    // re-creates kubelet.sock.
    k.stop().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    let mut k = TestKubelet::start(&dir).await.unwrap();
    let regs = k
        .registrations_of(&ALL, Duration::from_secs(5))
        .await
        .unwrap();
    let took = regs.iter().map(|r| r.at - t0).max().unwrap();
    assert!(
        took < Duration::from_secs(1),
        "re-registration took {took:?}"
    );
    // Served again on fresh sockets, each GPU still in its one resource.
    let mut c = k.dial("gpuslice-gpu.sock").await.unwrap();
    let (devs, _s) = first_list(&mut c).await.unwrap();
    assert_eq!(devs.len(), 2);
    let mut c = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    let (devs, _s) = first_list(&mut c).await.unwrap();
    assert!(devs.iter().all(|d| d.id.starts_with(&uuid(2))) && devs.len() == 4);
    // The plugin counts a round once all its Register calls returned,
    // which can be a moment after the kubelet saw them.
    let mut state = p.state.clone();
    let counted = tokio::time::timeout(
        Duration::from_secs(5),
        state.wait_for(|s| s.registrations >= 6),
    )
    .await;
    assert!(
        matches!(counted, Ok(Ok(_))),
        "registrations counted: {}",
        p.state.borrow().registrations
    );
}

#[tokio::test]
async fn reload_rereads_the_config_and_keeps_running_on_a_bad_one() {
    let t = StateDir::new();
    let file = t.path().join("config.yaml");
    let plugins = t.path().join("plugins");
    let write = |replicas: &str| {
        let text = format!(
            "pluginDir: {}\nledgerDir: {}\nstateDir: {}\nstrategies: {{mig: none}}\n\
             roles: [{{gpus: [0], role: whole}}, {{gpus: others, role: shared, replicas: {replicas}}}]\n",
            plugins.display(),
            t.path().join("l").display(),
            t.path().join("s").display()
        );
        std::fs::write(&file, text).unwrap();
    };
    write("2");
    let mut k = TestKubelet::start(&plugins).await.unwrap();
    let h = host();
    let mut o = Options::new(Config::default(), HostRoot::new(h.root()));
    o.config_path = Some(file.clone());
    o.nvml_lib = Some(h.nvml_lib());
    o.poll = Duration::from_millis(50);
    let p = spawn(o).unwrap();
    let two = ["nvidia.com/gpu", "nvidia.com/gpu.shared"];
    k.registrations_of(&two, Duration::from_secs(10))
        .await
        .unwrap();
    let mut c = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    assert_eq!(first_list(&mut c).await.unwrap().0.len(), 2 * 2);
    assert!(p
        .state
        .borrow()
        .warnings
        .iter()
        .any(|w| w.contains("GPU 3 is in MIG mode")));

    write("8");
    p.reload();
    k.registrations_of(&two, Duration::from_secs(10))
        .await
        .unwrap();
    let mut c = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    assert_eq!(first_list(&mut c).await.unwrap().0.len(), 2 * 8);

    // Bad configs are refused, naming the field; the plugin keeps the old one.
    for (text, want) in [
        ("sharing: {replicaz: 3}\n", "sharing.replicaz"),
        // Index 1 and its UUID: one GPU in two roles.
        (
            &*format!(
                "roles: [{{gpus: [1], role: whole}}, {{gpus: ['{}'], role: shared, replicas: 2}}]\n",
                uuid(1)
            ),
            "roles[1].gpus[0]: GPU 1",
        ),
        ("roles: [{gpus: [0, 7], role: whole}]\n", "roles[0].gpus[1]: no GPU matches \"7\""),
        ("roles: [{gpus: others, role: shared, replicas: 0}]\n", "roles[0].replicas: 0"),
    ] {
        std::fs::write(&file, text).unwrap();
        p.reload();
        let s = p
            .wait_for(Duration::from_secs(5), |s| {
                s.last_error.as_deref().is_some_and(|e| e.contains(want))
            })
            .unwrap();
        assert!(s.generations == 2, "{text}: not loaded");
    }
    let mut c = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    assert_eq!(
        first_list(&mut c).await.unwrap().0.len(),
        2 * 8,
        "still the old config"
    );
    p.stop().unwrap();
    assert!(
        !plugins.join("gpuslice-gpu.sock").exists(),
        "socket removed on stop"
    );
}

/// The GPU indices a resource lists.
async fn listed_gpus(k: &TestKubelet, endpoint: &str) -> BTreeSet<usize> {
    let mut c = k.dial(endpoint).await.unwrap();
    let (devs, _s) = first_list(&mut c).await.unwrap();
    let ids: Vec<String> = devs.into_iter().map(|d| d.id).collect();
    gpus_of(&ids).into_iter().collect()
}

#[tokio::test]
async fn a_whole_and_a_shared_request_never_land_on_one_gpu() {
    let (_t, _p, k) = registered(MIXED, &ALL).await;
    let whole = listed_gpus(&k, "gpuslice-gpu.sock").await;
    let shared = listed_gpus(&k, "gpuslice-gpu.shared.sock").await;
    assert_eq!(whole, [0, 1].into());
    assert_eq!(shared, [2].into());
    assert!(whole.is_disjoint(&shared));

    // Whatever the kubelet asks, each resource hands out only its own GPUs.
    let mut w = k.dial("gpuslice-gpu.sock").await.unwrap();
    let mut s = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    for id in [uuid(2), uuid(3)] {
        let e = allocate_one(&mut w, std::slice::from_ref(&id))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{id} whole: {e}");
    }
    for g in [0, 1] {
        let e = allocate_one(&mut s, &[format!("{}::0", uuid(g))])
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "GPU {g} shared: {e}");
    }
    let a = allocate_one(&mut w, &[uuid(0), uuid(1)]).await.unwrap();
    let b = allocate_one(&mut s, &[format!("{}::0", uuid(2))])
        .await
        .unwrap();
    let nodes = |r: &gpuslice_k8s::plugin::v1beta1::ContainerAllocateResponse| -> BTreeSet<String> {
        dev_paths(r)
            .into_iter()
            .filter(|p| {
                p.strip_prefix("/dev/nvidia")
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .collect()
    };
    assert_eq!(nodes(&a), set(&["/dev/nvidia0", "/dev/nvidia1"]));
    assert_eq!(nodes(&b), set(&["/dev/nvidia2"]));
    assert_eq!(b.envs["CUDA_VISIBLE_DEVICES"], uuid(2));
}

#[tokio::test]
async fn a_bad_role_config_is_refused_at_start_naming_the_field() {
    for (text, want) in [
        (
            format!(
                "roles: [{{gpus: [0], role: whole}}, {{gpus: ['{}'], role: shared, replicas: 4}}]",
                host().gpus()[0].pci_bus_id
            ),
            "roles[1].gpus[0]: GPU 0",
        ),
        (
            "roles: [{gpus: [GPU-ffff], role: whole}]".to_string(),
            "roles[0].gpus[0]: no GPU matches \"GPU-ffff\"",
        ),
    ] {
        let t = StateDir::new();
        let p = start(config(t.path(), &text));
        let e = format!("{:#}", p.stop().unwrap_err());
        assert!(e.contains(want), "{text}: {e}");
        assert!(
            !t.path().join("plugins").exists()
                || std::fs::read_dir(t.path().join("plugins"))
                    .unwrap()
                    .next()
                    .is_none(),
            "no socket left behind"
        );
    }
}

/// Not a test of its own: the process `Attached` runs (with
/// GPUSLICE_TEST_ATTACH set) to hold a slot in a ledger until killed.
#[test]
fn helper_attach_to_a_ledger_and_wait() {
    let Ok(path) = std::env::var("GPUSLICE_TEST_ATTACH") else {
        return;
    };
    let l = gpuslice_ledger::Ledger::open_or_create(
        Path::new(&path),
        "k8s-test",
        &[gpuslice_ledger::DeviceSpec {
            uuid: "GPU-test".into(),
            cap: GIB,
        }],
    )
    .unwrap();
    let _slot = l.attach().unwrap();
    println!("attached {}", std::process::id());
    std::thread::sleep(Duration::from_secs(600));
}

/// A process holding a slot in the ledger at `path`, optionally in a pid
/// namespace of its own (as a container's processes are).
struct Attached(std::process::Child);

impl Attached {
    fn start(path: &Path, own_pid_namespace: bool) -> Self {
        use std::io::BufRead;
        let exe = std::env::current_exe().unwrap();
        let helper = gpuslice_testkit::process::test_name(
            module_path!(),
            "helper_attach_to_a_ledger_and_wait",
        );
        let mut cmd = if own_pid_namespace {
            let mut c = std::process::Command::new("unshare");
            c.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
                .arg(exe);
            c
        } else {
            std::process::Command::new(exe)
        };
        let mut child = cmd
            .args(["--exact", &helper, "--nocapture"])
            .env("GPUSLICE_TEST_ATTACH", path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let line = out
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("attached"));
        assert!(line.is_some(), "the helper did not attach");
        Attached(child)
    }

    fn kill(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// The test waits synchronously (wait_for, the helper): the PodResources
// server needs a runtime thread of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_dirs_go_once_their_pod_is_gone_and_no_process_uses_them() {
    use gpuslice_testkit::kubelet::{PodDevices, PodResources};
    let t = StateDir::new();
    let socket = t.path().join("pod-resources/kubelet.sock");
    let podres = PodResources::start(&socket).await.unwrap();
    let text = format!(
        "{SHARED}ledgerCleanup: {{intervalSeconds: 1, graceSeconds: 0, podResourcesSocket: {}}}",
        socket.display()
    );
    let (p, k) = start_registered(config(t.path(), &text), &SHARED_AND_MIG).await;
    let mut s = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    // Three pods, each with a replica; the kubelet lists them.
    let ids: Vec<Vec<String>> = (0..3).map(|g| vec![format!("{}::1", uuid(g))]).collect();
    let pods: Vec<PodDevices> = ["a", "b", "c"]
        .iter()
        .zip(&ids)
        .map(|(n, i)| PodDevices::new(n, "nvidia.com/gpu.shared", i))
        .collect();
    podres.set(pods.clone());
    let mut dirs = Vec::new();
    for i in &ids {
        let r = allocate_one(&mut s, i).await.unwrap();
        let slice = r.envs["GPUSLICE_SLICE"].clone();
        dirs.push((t.path().join("ledgers").join(&slice), slice));
    }
    let ledger = |d: &(std::path::PathBuf, String)| d.0.join(format!("{}.ledger", d.1));
    // a: a live process in a pid namespace of its own; b: a process
    // SIGKILLed while attached (its slot stays); c: no ledger at all.
    let a = Attached::start(&ledger(&dirs[0]), true);
    Attached::start(&ledger(&dirs[1]), false).kill();
    let sweeps = |n: u64| {
        let p = &p;
        move || {
            p.wait_for(Duration::from_secs(10), |s| s.ledgers.sweeps >= n)
                .unwrap()
        }
    };
    let now = p.state.borrow().ledgers.sweeps;
    let st = sweeps(now + 2)();
    assert!(
        st.ledgers.removed.is_empty(),
        "pods listed: {:?}",
        st.ledgers
    );
    assert!(dirs.iter().all(|d| d.0.is_dir()));

    // The kubelet drops every pod: b and c go, a stays while its process lives.
    podres.set(vec![]);
    let st = sweeps(st.ledgers.sweeps + 2)();
    let mut removed = st.ledgers.removed.clone();
    removed.sort();
    let mut want = vec![dirs[1].1.clone(), dirs[2].1.clone()];
    want.sort();
    assert_eq!(removed, want, "{:?}", st.ledgers);
    assert_eq!(st.ledgers.in_use, vec![dirs[0].1.clone()]);
    assert!(dirs[0].0.is_dir() && ledger(&dirs[0]).is_file());
    assert!(!dirs[1].0.exists() && !dirs[2].0.exists());
    assert_eq!(st.ledgers.last_error, None);

    // Its process gone (the namespace with it), a goes too.
    a.kill();
    let st = sweeps(st.ledgers.sweeps + 2)();
    assert!(st.ledgers.removed.contains(&dirs[0].1), "{:?}", st.ledgers);
    assert!(!dirs[0].0.exists());

    // No answer from the kubelet: nothing is removed, the error is said.
    podres.stop().await;
    let r = allocate_one(&mut s, &ids[0]).await.unwrap();
    let dir = t.path().join("ledgers").join(&r.envs["GPUSLICE_SLICE"]);
    let st = p
        .wait_for(Duration::from_secs(10), |s| {
            s.ledgers
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("PodResources"))
        })
        .unwrap();
    let n = st.ledgers.removed.len();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(dir.is_dir());
    assert_eq!(p.state.borrow().ledgers.removed.len(), n);
}

/// A replica's pod whose process runs without the shim — its
/// pod spec covers `/etc/ld.so.preload` with a `hostPath` of `/dev/null`,
/// or it unshares a user and mount namespace (no capability needed) and
/// covers the preload file and the slice's records there — and takes more
/// than the replica's cap. Root's enforcer in the plugin finds it by the
/// replica's limits record in its root, or in its container's (its
/// cgroup's) when it hid its own, and kills it within about a second,
/// recording the kill beside the replica's records. Without the enforcer it
/// holds its memory until the test gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_enforcer_kills_a_replica_s_process_that_runs_past_the_shim() {
    use gpuslice_testkit::pod::{Hide, PodProcess};
    if !gpuslice_testkit::precondition(
        "the_enforcer_kills_a_replica_s_process_that_runs_past_the_shim",
        gpuslice_testkit::needs_root(),
    ) {
        return;
    }
    let (t, _p, _k, mut c) = shared_replicas("").await;
    let cap = host().gpus()[1].memory_bytes / 4;
    for (r, hide) in [(0, Hide::Nothing), (1, Hide::Records)] {
        let resp = allocate_one(&mut c, &[format!("{}::{r}", uuid(1))])
            .await
            .unwrap();
        let records = t.path().join("ledgers").join(&resp.envs["GPUSLICE_SLICE"]);
        tokio::task::block_in_place(|| {
            let record = records.join("limits");
            let within = Duration::from_secs(3);
            PodProcess::start_and_expect_kill(host(), &record, &uuid(1), cap + GIB, hide, within)
        });
        let kills = gpuslice_ledger::enforcer::read_kills(&records);
        assert_eq!(kills.len(), 1, "{hide:?}: {kills:?}");
        assert_eq!(kills[0].bytes, cap + GIB, "{hide:?}: {kills:?}");
        assert_eq!(kills[0].uuid, uuid(1));
        // The staged pod runs as root in the host's namespaces (a
        // privileged, hostPID pod as the kernel shows it): recorded as
        // able to escape any cap, which `slices` and the exporter show.
        let escapes = gpuslice_ledger::enforcer::read_escapes(&records);
        let routes: Vec<&str> = escapes
            .iter()
            .filter(|e| e.pid == kills[0].pid)
            .flat_map(|e| e.routes.iter().map(String::as_str))
            .collect();
        assert!(routes.contains(&"hostPID"), "{hide:?}: {escapes:?}");
        if hide == Hide::Nothing {
            // Root's CAP_SYS_ADMIN of the host's user namespace; the
            // `unshare -Ur` one is its own namespace's, and not counted.
            assert!(routes.contains(&"CAP_SYS_ADMIN"), "{escapes:?}");
        } else {
            assert!(!routes.contains(&"CAP_SYS_ADMIN"), "{escapes:?}");
        }
    }
}

/// `driverPartitions` (the driver's memory partitions of replicas, issue
/// 25): a shared replica's Allocate names the replica's CDI device beside
/// its mounts, a whole GPU's does not; the plugin's spec holds, for that
/// device, only the memory-limit hooks, the set hook reading the
/// replica's own limits record. A `hook` that is not a file is refused at
/// start, naming the field (every replica's container would fail).
#[tokio::test]
async fn driver_partitions_name_a_replica_s_cdi_device_with_its_hooks() {
    let t = StateDir::new();
    let hook = t.path().join("gpuslice");
    std::fs::write(&hook, b"the hook binary").unwrap();
    let cdi_dir = t.path().join("cdi");
    let mut cfg = config(t.path(), MIXED);
    cfg.driver_partitions.enabled = true;
    cfg.driver_partitions.hook = hook.clone();
    cfg.driver_partitions.cdi_dir = cdi_dir.clone();
    let (_p, k) = start_registered(cfg, &ALL).await;
    let mut c = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    let (devices, _s) = first_list(&mut c).await.unwrap();
    let r = allocate_one(&mut c, &[devices[1].id.clone()])
        .await
        .unwrap();
    let slice = r.envs["GPUSLICE_SLICE"].clone();
    let names: Vec<_> = r.cdi_devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(names, [format!("gpuslice.dev/replica={slice}")]);
    assert!(r
        .mounts
        .iter()
        .any(|m| m.container_path == "/etc/ld.so.preload"));
    let mut whole = k.dial("gpuslice-gpu.sock").await.unwrap();
    let w = allocate_one(&mut whole, &[uuid(0)]).await.unwrap();
    assert!(w.cdi_devices.is_empty(), "{w:?}");

    let text =
        std::fs::read_to_string(cdi_dir.join("gpuslice-device-plugin-gpuslice.dev_replica.json"))
            .unwrap();
    let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(spec["kind"], "gpuslice.dev/replica");
    let device = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == slice.as_str())
        .unwrap_or_else(|| panic!("no device {slice}: {text}"));
    let edits = device["containerEdits"].as_object().unwrap();
    assert_eq!(edits.keys().collect::<Vec<_>>(), ["hooks"], "{text}");
    let hooks = edits["hooks"].as_array().unwrap();
    let by = |name: &str| {
        hooks
            .iter()
            .find(|h| h["hookName"] == name)
            .unwrap_or_else(|| panic!("no {name} hook: {text}"))
    };
    let set = by("createRuntime");
    assert_eq!(set["path"], hook.display().to_string());
    let record = t.path().join("ledgers").join(&slice).join("limits");
    let args: Vec<&str> = set["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args[..7],
        [
            "gpuslice",
            "cdi",
            "hook",
            "memory-limits",
            "set",
            "--limits",
            &record.display().to_string()
        ],
        "{text}"
    );
    assert!(record.is_file(), "Allocate wrote the record the hook reads");
    assert_eq!(by("poststop")["args"][4], "clear");

    let bad = StateDir::new();
    let mut cfg = config(bad.path(), MIXED);
    cfg.driver_partitions.enabled = true;
    cfg.driver_partitions.hook = bad.path().join("no-gpuslice");
    cfg.driver_partitions.cdi_dir = bad.path().join("cdi");
    let e = format!("{:#}", start(cfg).stop().unwrap_err());
    assert!(e.contains("driverPartitions.hook:"), "{e}");
    drop(t);
}
