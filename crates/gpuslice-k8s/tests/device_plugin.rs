//! The device plugin against a test kubelet speaking the real v1beta1
//! protocol over unix sockets, on a fake GPU host (4 GPUs, GPU 3 in MIG
//! mode with two 1g.18gb instances). The fake NVML is loaded in-process,
//! so every test of this binary shares one host (FAKEGPU_ROOT).

use fakegpu::FakeHost;
use gpuslice_core::HostRoot;
use gpuslice_k8s::plugin::config::Config;
use gpuslice_k8s::plugin::testkubelet::{allocate_one, first_list, preferred_one, TestKubelet};
use gpuslice_k8s::plugin::{spawn, Handle, Options};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tonic::Code;

const GIB: u64 = 1 << 30;

fn host() -> &'static FakeHost {
    static HOST: OnceLock<FakeHost> = OnceLock::new();
    HOST.get_or_init(|| {
        let h = FakeHost::builder().gpus(4).mig(3, 2).build().unwrap();
        // The fake NVML reads its host from the environment at init.
        std::env::set_var("FAKEGPU_ROOT", h.root());
        h
    })
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

async fn setup(extra: &str) -> (tempfile::TempDir, Handle, TestKubelet) {
    let t = tempfile::tempdir().unwrap();
    let cfg = config(t.path(), extra);
    let kubelet = TestKubelet::start(&cfg.plugin_dir).await.unwrap();
    let plugin = start(cfg);
    (t, plugin, kubelet)
}

const ALL: [&str; 3] = [
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-1g.18gb",
];

#[tokio::test]
async fn registers_each_resource_and_lists_devices_with_numa() {
    let (_t, _p, mut k) = setup("").await;
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
    // GPU 3 is in MIG mode: offered only as MIG devices.
    let want: Vec<(String, String, i64)> = (0..3)
        .map(|i| (uuid(i), "Healthy".to_string(), [0, 0, 1][i]))
        .collect();
    assert_eq!(got, want);

    let mut c = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    let (devs, _s) = first_list(&mut c).await.unwrap();
    assert_eq!(devs.len(), 3 * 4);
    assert!(devs.iter().all(|d| d.id.len() <= 63));
    assert_eq!(devs[5].id, format!("{}::1", uuid(1)));

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
    let (t, _p, mut k) = setup("strategies: {cdi: true}").await;
    k.registrations_of(&ALL, Duration::from_secs(10))
        .await
        .unwrap();
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
    let (t, _p, mut k) = setup("").await;
    k.registrations_of(&ALL, Duration::from_secs(10))
        .await
        .unwrap();
    let mut c = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    let mem = host().gpus()[1].memory_bytes;
    // One replica: 1/4 of the GPU.
    let r = allocate_one(&mut c, &[format!("{}::3", uuid(1))])
        .await
        .unwrap();
    assert_eq!(r.envs["GPUSLICE_MEMORY_LIMIT"], (mem / 4).to_string());
    assert_eq!(r.envs["GPUSLICE_COMPUTE_LIMIT"], "25");
    assert_eq!(r.envs["CUDA_VISIBLE_DEVICES"], uuid(1));
    assert!(dev_paths(&r).contains("/dev/nvidia1") && !dev_paths(&r).contains("/dev/nvidia0"));
    let slice = r.envs["GPUSLICE_SLICE"].clone();
    assert_eq!(
        r.envs["GPUSLICE_LEDGER"],
        format!("/run/gpuslice/slices/{slice}.ledger")
    );
    let mounts: Vec<(String, String, bool)> = r
        .mounts
        .iter()
        .map(|m| (m.container_path.clone(), m.host_path.clone(), m.read_only))
        .collect();
    let ledger_dir = t.path().join("ledgers").join(&slice);
    assert_eq!(
        mounts,
        vec![
            (
                "/usr/local/gpuslice/libgpuslice.so".into(),
                t.path().join("libgpuslice.so").display().to_string(),
                true
            ),
            (
                "/etc/ld.so.preload".into(),
                t.path().join("state/ld.so.preload").display().to_string(),
                true
            ),
            (
                "/run/gpuslice/slices".into(),
                ledger_dir.display().to_string(),
                false
            ),
            (
                "/run/gpuslice/gpus".into(),
                t.path().join("boards").display().to_string(),
                false
            ),
        ]
    );
    assert!(ledger_dir.is_dir());
    assert_eq!(r.envs["GPUSLICE_BOARD_DIR"], "/run/gpuslice/gpus");
    assert!(
        !r.envs.contains_key("GPUSLICE_COMPUTE_MODE"),
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
    assert_eq!(r.envs["GPUSLICE_MEMORY_LIMIT"], (mem / 4).to_string());
    assert!(mem > 100 * GIB);
}

#[tokio::test]
async fn allocates_mig_devices_with_their_caps() {
    let (_t, _p, mut k) = setup("").await;
    k.registrations_of(&ALL, Duration::from_secs(10))
        .await
        .unwrap();
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
    let (_t, _p, mut k) = setup("").await;
    k.registrations_of(&ALL, Duration::from_secs(10))
        .await
        .unwrap();
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
async fn preferred_allocation_uses_topology_and_packs_replicas() {
    let (_t, _p, mut k) = setup("").await;
    k.registrations_of(&ALL, Duration::from_secs(10))
        .await
        .unwrap();
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

    let mut s = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    let (devs, _st) = first_list(&mut s).await.unwrap();
    let avail: Vec<String> = devs.iter().map(|d| d.id.clone()).collect();
    // Packing: 3 replicas on one GPU.
    let got = preferred_one(&mut s, &avail, &[], 3).await.unwrap();
    let gpus: BTreeSet<_> = got
        .iter()
        .map(|i| i.split("::").next().unwrap().to_string())
        .collect();
    assert_eq!(gpus.len(), 1, "{got:?}");
    // must_include on GPU 2 pulls the rest onto GPU 2.
    let must = format!("{}::2", uuid(2));
    let got = preferred_one(&mut s, &avail, std::slice::from_ref(&must), 4)
        .await
        .unwrap();
    assert_eq!(got[0], must);
    assert!(got.iter().all(|i| i.starts_with(&uuid(2))), "{got:?}");
    // With only partial room, the fewest GPUs: 3 free on GPU 0, 4 on GPU 1 → 5 = 4 + 1.
    let avail2: Vec<String> = avail
        .iter()
        .filter(|i| **i != format!("{}::0", uuid(0)) && !i.starts_with(&uuid(2)))
        .cloned()
        .collect();
    let got = preferred_one(&mut s, &avail2, &[], 5).await.unwrap();
    let on1 = got.iter().filter(|i| i.starts_with(&uuid(1))).count();
    assert_eq!(on1, 4, "{got:?}");
}

#[tokio::test]
async fn spread_option_spreads_replicas() {
    let (_t, _p, mut k) = setup("sharing: {spread: true}").await;
    k.registrations_of(&ALL, Duration::from_secs(10))
        .await
        .unwrap();
    let mut s = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    let (devs, _st) = first_list(&mut s).await.unwrap();
    let avail: Vec<String> = devs.iter().map(|d| d.id.clone()).collect();
    let got = preferred_one(&mut s, &avail, &[], 3).await.unwrap();
    let gpus: BTreeSet<_> = got
        .iter()
        .map(|i| i.split("::").next().unwrap().to_string())
        .collect();
    assert_eq!(gpus.len(), 3, "{got:?}");
}

#[tokio::test]
async fn guaranteed_mode_lets_replicas_borrow() {
    let (t, _p, mut k) = setup("sharing: {computeMode: guaranteed}").await;
    k.registrations_of(&ALL, Duration::from_secs(10))
        .await
        .unwrap();
    let mut c = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    let r = allocate_one(&mut c, &[format!("{}::0", uuid(2))])
        .await
        .unwrap();
    assert_eq!(r.envs["GPUSLICE_COMPUTE_MODE"], "guaranteed");
    assert_eq!(r.envs["GPUSLICE_COMPUTE_LIMIT"], "25");
    let boards = t.path().join("boards");
    assert!(r
        .mounts
        .iter()
        .any(|m| m.container_path == "/run/gpuslice/gpus"
            && m.host_path == boards.display().to_string()
            && !m.read_only));
    // World-writable and sticky, like /tmp: replicas run as any user.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        boards.metadata().unwrap().permissions().mode() & 0o7777,
        0o1777
    );
}

#[tokio::test]
async fn reregisters_after_a_kubelet_restart() {
    let (t, p, mut k) = setup("").await;
    k.registrations_of(&ALL, Duration::from_secs(10))
        .await
        .unwrap();
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
    // Served again on fresh sockets.
    let mut c = k.dial("gpuslice-gpu.sock").await.unwrap();
    let (devs, _s) = first_list(&mut c).await.unwrap();
    assert_eq!(devs.len(), 3);
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
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("config.yaml");
    let plugins = t.path().join("plugins");
    let write = |replicas: &str| {
        let text = format!(
            "pluginDir: {}\nledgerDir: {}\nstateDir: {}\nsharing:\n  replicas: {replicas}\nstrategies: {{mig: none}}\n",
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
    assert_eq!(first_list(&mut c).await.unwrap().0.len(), 3 * 2);

    write("8");
    p.reload();
    k.registrations_of(&two, Duration::from_secs(10))
        .await
        .unwrap();
    let mut c = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    assert_eq!(first_list(&mut c).await.unwrap().0.len(), 3 * 8);

    std::fs::write(&file, "sharing: {replicaz: 3}\n").unwrap();
    p.reload();
    let s = p
        .wait_for(Duration::from_secs(5), |s| s.last_error.is_some())
        .unwrap();
    assert!(s.last_error.unwrap().contains("sharing.replicaz"));
    let mut c = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    assert_eq!(
        first_list(&mut c).await.unwrap().0.len(),
        3 * 8,
        "still the old config"
    );
    p.stop().unwrap();
    assert!(
        !plugins.join("gpuslice-gpu.sock").exists(),
        "socket removed on stop"
    );
}
