//! `gpuslice cdi generate` consumed by a real container runtime: Debian's
//! podman (with runc) on the fake GPU host, from a local image holding
//! busybox-static (no registry). Needs root, podman, runc and
//! busybox-static (scripts/test.sh installs them).

use crate::common;
use fakegpu::FakeHost;
use gpuslice_testkit::podman::{nvidia_nodes, Image};
use std::path::{Path, PathBuf};
use std::process::Output;

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The podman tests one at a time: their specs share the runtime's spec
/// directory and the names of its side files.
static PODMAN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What a podman test holds: the guards that let it run beside the other
/// tests but alone among the podman tests, and a new directory with a
/// stand-in shim in it ([`stand_in_shim`]).
struct PodmanTest {
    tmp: tempfile::TempDir,
    shim: PathBuf,
    _podman: std::sync::MutexGuard<'static, ()>,
    _beside: std::sync::RwLockReadGuard<'static, ()>,
}

impl PodmanTest {
    fn new() -> Self {
        let _beside = common::beside_others();
        let _podman = PODMAN.lock().unwrap_or_else(|e| e.into_inner());
        let tmp = tempfile::tempdir().unwrap();
        Self {
            shim: stand_in_shim(tmp.path()),
            tmp,
            _podman,
            _beside,
        }
    }

    /// The test's directory.
    fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// [`generate_for_podman`] with the stand-in shim.
    fn generate(&self, host: &FakeHost, name: &str, args: &[&str]) -> PathBuf {
        generate_for_podman(host, &self.shim, name, args)
    }
}

/// The NVIDIA nodes of a container given GPU `gpu` alone, sorted.
fn one_gpus_nodes(gpu: u32) -> [String; 5] {
    ["nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"]
        .map(String::from)
        .into_iter()
        .chain([format!("nvidia{gpu}"), "nvidiactl".into()])
        .collect::<Vec<_>>()
        .try_into()
        .unwrap()
}

/// What a container that ran `ls /dev; echo ---; ...` printed after the
/// `---`, once it succeeded and its NVIDIA nodes are GPU `gpu`'s alone.
fn after_one_gpus_nodes(out: &Output, gpu: u32) -> String {
    assert!(out.status.success(), "{out:?}");
    let printed = text(out);
    let (dev, rest) = printed.split_once("---").unwrap();
    assert_eq!(nvidia_nodes(dev), one_gpus_nodes(gpu));
    rest.to_string()
}

/// Where the specs for podman go: podman 4.3 reads specs from /etc/cdi and
/// /var/run/cdi only.
const CDI_DIR: &str = "/var/run/cdi";

/// A stand-in shim in `dir`: busybox is static, nothing loads it.
fn stand_in_shim(dir: &Path) -> PathBuf {
    let shim = dir.join("libgpuslice.so");
    std::fs::write(&shim, b"not a real shim: busybox is static").unwrap();
    shim
}

/// `gpuslice cdi generate ARGS --output <CDI_DIR>/<name>-<pid>.yaml` on
/// `host` with the shim `shim` (see [`stand_in_shim`]), which must succeed,
/// and the spec.
fn generate_for_podman(host: &FakeHost, shim: &Path, name: &str, args: &[&str]) -> PathBuf {
    let spec = Path::new(CDI_DIR).join(format!("{name}-{}.yaml", std::process::id()));
    let out = common::gpuslice_on(host)
        .env("GPUSLICE_SHIM", shim)
        .args(["cdi", "generate"])
        .args(args)
        .arg("--output")
        .arg(&spec)
        .output()
        .unwrap();
    assert!(out.status.success(), "generate: {out:?}");
    spec
}

/// A busybox image in `dir` tagged `tag` that carries `spec`, its side
/// files and the limits records of `devices`.
fn image_with_spec(dir: &Path, tag: &str, spec: &Path, devices: &[String]) -> Image {
    let cdi_dir = Path::new(CDI_DIR);
    let mut image = Image::busybox(dir, tag);
    image.files = vec![
        spec.to_path_buf(),
        cdi_dir.join("gpuslice-params"),
        cdi_dir.join("gpuslice-ld.so.preload"),
    ];
    image.files.extend(
        devices
            .iter()
            .map(|d| gpuslice_cdi::limits_record_path(cdi_dir, d)),
    );
    image
}

#[test]
fn podman_runs_containers_with_the_generated_spec() {
    let t = PodmanTest::new();
    let host = FakeHost::builder().gpus(4).build().unwrap();
    let spec = t.generate(&host, "gpuslice-test", &[]);
    let check = common::gpuslice_on(&host)
        .env("GPUSLICE_SHIM", &t.shim)
        .args(["cdi", "check", "--spec"])
        .arg(&spec)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(0), "check: {check:?}");
    // The shared variants' limits records, written beside the spec.
    let shared: Vec<String> = (0..4)
        .flat_map(|gpu| [2, 4].map(|n| format!("{gpu}-shared-{n}")))
        .collect();
    let image = image_with_spec(t.dir(), "gpuslice-cdi-test", &spec, &shared);

    let one = image.run("gpuslice.dev/gpu=1", "ls /dev; echo ---; env");
    let env = after_one_gpus_nodes(&one, 1);
    assert!(
        env.contains("NVIDIA_DRIVER_CAPABILITIES=compute,utility"),
        "{env}"
    );
    assert!(env.contains("CUDA_DEVICE_ORDER=PCI_BUS_ID"), "{env}");
    assert!(!env.contains("GPUSLICE_MEMORY_LIMIT"), "{env}");

    let by_uuid = image.run(
        &format!("gpuslice.dev/gpu={}", fakegpu::kernel::gpu_uuid(2)),
        "ls /dev",
    );
    assert!(
        nvidia_nodes(&text(&by_uuid)).contains(&"nvidia2".to_string()),
        "{by_uuid:?}"
    );

    let all = image.run("gpuslice.dev/gpu=all", "ls /dev");
    let nodes = nvidia_nodes(&text(&all));
    for i in 0..4 {
        assert!(nodes.contains(&format!("nvidia{i}")), "{all:?}");
    }

    // Its GPU's board writable, nothing else of the host's
    // boards directory (no entry made there).
    let board =
        gpuslice_ledger::board::board_path(Path::new("/run/gpuslice/gpus"), &host.gpus()[3].uuid);
    let shared = image.run(
        "gpuslice.dev/gpu=3-shared-4",
        &format!("ls /dev; echo ---; cat /etc/ld.so.preload; test -f /usr/local/gpuslice/libgpuslice.so && echo shim-present; test -f /run/gpuslice/slice/limits && echo ledger-dir; (echo x >> /run/gpuslice/slice/limits) 2>/dev/null || echo limits-read-only; \
         (exec 3<>{b}) && echo own-board-writable; (: > /run/gpuslice/gpus/planted-$$) 2>/dev/null && echo boards-dir-writable; env", b = board.display()),
    );
    let rest = after_one_gpus_nodes(&shared, 3);
    assert!(
        rest.contains("/usr/local/gpuslice/libgpuslice.so\n"),
        "{rest}"
    );
    assert!(
        rest.contains("shim-present")
            && rest.contains("ledger-dir")
            && rest.contains("limits-read-only")
            && rest.contains("own-board-writable")
            && !rest.contains("boards-dir-writable"),
        "{rest}"
    );
    let quarter = fakegpu::kernel::GPU_MEMORY_BYTES / 4;
    assert!(
        rest.contains(&format!("GPUSLICE_MEMORY_LIMIT_0={quarter}")),
        "{rest}"
    );
    assert!(rest.contains("GPUSLICE_COMPUTE_LIMIT=25"), "{rest}");

    let unknown = image.run("gpuslice.dev/gpu=9", "true");
    assert!(!unknown.status.success());
    let err = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        err.contains("unresolvable CDI devices gpuslice.dev/gpu=9"),
        "{err}"
    );
}

#[test]
fn check_reports_a_driver_upgrade() {
    let (_beside, host) = common::host_beside_others(FakeHost::builder().gpus(1));
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("cdi").join("gpuslice.json");
    let gpuslice = |args: &[&str]| common::gpuslice_on(&host).args(args).output().unwrap();
    let spec_s = spec.to_str().unwrap();
    let out = gpuslice(&["cdi", "generate", "--output", spec_s]);
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&spec).unwrap()).unwrap();
    assert_eq!(json["kind"], "gpuslice.dev/gpu");
    assert_eq!(
        gpuslice(&["cdi", "check", "--spec", spec_s]).status.code(),
        Some(0)
    );
    let version = host.root().join("proc/driver/nvidia/version");
    let old = std::fs::read_to_string(&version).unwrap();
    std::fs::write(
        &version,
        old.replace(fakegpu::kernel::DRIVER_VERSION, "590.1.2"),
    )
    .unwrap();
    let out = gpuslice(&["cdi", "check", "--spec", spec_s]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "stale: driver {} in spec, 590.1.2 loaded; run gpuslice cdi generate\n",
            fakegpu::kernel::DRIVER_VERSION
        )
    );
}

/// A capped CDI slice's container gets the driver's hard limit
/// on its own cgroup v2 directory from the spec's `createRuntime` hook, on
/// a driver with memory partitions (the fake posing as R615); the
/// `poststop` hook clears it when the container ends. Without the hook the
/// driver holds no limit for the container.
#[test]
fn a_capped_slice_s_container_gets_the_driver_s_limit_from_its_hook() {
    let t = PodmanTest::new();
    let host = r615_host();
    let args = ["--class", "parttest", "--shared", "2"];
    let spec = t.generate(&host, "gpuslice-test-part", &args);
    let device = ["0-shared-2".to_string()];
    let image = image_with_spec(t.dir(), "gpuslice-cdi-part-test", &spec, &device);
    assert_limited_while_it_runs(
        &image,
        "gpuslice.dev/parttest=0-shared-2",
        &host,
        fakegpu::kernel::GPU_MEMORY_BYTES / 2,
    );
}

/// A shared variant's container makes no ledger root knows of when the
/// spec is written; its `createRuntime` hook makes it in the container's
/// own slice tmpfs and records the slice's share on its GPU's board under
/// the ledger's key, so that the other slices of the GPU count it and pass
/// it the turn; its `poststop` hook removes the record. Without the hooks
/// the container's ledger is its shim's and nobody vouches for it.
#[test]
fn a_shared_variant_s_container_is_vouched_for_on_its_gpu_s_board() {
    let t = PodmanTest::new();
    let host = FakeHost::builder().gpus(1).build().unwrap();
    let args = ["--class", "sharetest", "--shared", "2", "--format", "json"];
    let spec = t.generate(&host, "gpuslice-test-share", &args);
    let generated: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&spec).unwrap()).unwrap();
    let device = &generated["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "0-shared-2")
        .unwrap()["containerEdits"];
    let set = device["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["args"][3] == "share")
        .unwrap_or_else(|| panic!("no share hook: {device}"));
    let args = common::strings(&set["args"]);
    let boards = Path::new(args[args.iter().position(|a| *a == "--boards").unwrap() + 1]);
    let gpu_records = gpuslice_ledger::board::shares_dir(boards).join(
        gpuslice_ledger::board::board_path(Path::new("."), &host.gpus()[0].uuid)
            .with_extension("")
            .file_name()
            .unwrap(),
    );
    let device = ["0-shared-2".to_string()];
    let image = image_with_spec(t.dir(), "gpuslice-cdi-share-test", &spec, &device);
    let mut child = image
        .command(
            "gpuslice.dev/sharetest=0-shared-2",
            "stat -c '%u %a %d %i' /run/gpuslice/slice/usage; echo up; sleep 3",
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let stat = lines.next().map(Result::unwrap).unwrap_or_default();
    let up = lines.next().map(Result::unwrap);
    let records: Vec<(String, String)> = std::fs::read_dir(&gpu_records)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            (e.file_name().to_string_lossy().into_owned(), text)
        })
        .collect();
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(
        done.status.success() && up.as_deref() == Some("up"),
        "{stat} {stderr}"
    );
    // Root made the ledger in the container's own tmpfs, before the image ran.
    let f: Vec<u64> = stat.split(' ').map(|x| x.parse().unwrap()).collect();
    assert_eq!((f[0], f[1]), (0, 666), "{stat}");
    // Its key on the board is that ledger's, with the slice's share (50 %).
    let key = format!("{:016x}", gpuslice_ledger::board::slice_key(f[2], f[3]));
    assert!(
        records.contains(&(key.clone(), "5000\n".to_string())),
        "no record {key} in {}: {records:?}; {stderr}",
        gpu_records.display()
    );
    // Removed when it ended, and root's state of it gone.
    assert!(
        !gpu_records.join(&key).exists(),
        "the share record outlived its container"
    );
    assert_no_records_in(&host.path(gpuslice_cdi::share_hook::STATE_DIR));
}

/// Root's hooks left no record of a container in `state`.
fn assert_no_records_in(state: &Path) {
    assert_eq!(
        std::fs::read_dir(state).map_or(0, |d| d.count()),
        0,
        "records left in {}",
        state.display()
    );
}

/// A fake host of one GPU whose driver poses as R615 (memory partitions),
/// installed for the hooks to load.
fn r615_host() -> FakeHost {
    let host = FakeHost::builder()
        .gpus(1)
        .driver_version("615.20.01")
        .build()
        .unwrap();
    host.install_driver(&fakegpu::driver_so_path()).unwrap();
    host
}

/// Runs `device`'s container for a few seconds on `host` (a fake R615):
/// while it ran, its own cgroup v2 directory had the driver's limit (soft
/// 0, hard `hard`); once it ended the limit was cleared and root's record
/// of it gone.
fn assert_limited_while_it_runs(image: &Image, device: &str, host: &FakeHost, hard: u64) {
    let limits = host.path(".fakegpu/memlimits/0");
    let mut child = image
        .command(device, "cat /proc/self/cgroup; echo up; sleep 3")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let mut cgroup = None;
    for l in lines.by_ref() {
        let l = l.unwrap();
        if let Some(p) = l.strip_prefix("0::") {
            cgroup = Some(p.to_string());
        }
        if l == "up" {
            break;
        }
    }
    let Some(cgroup) = cgroup else {
        let out = child.wait_with_output().unwrap();
        panic!("the container did not start: {out:?}");
    };
    let set = std::fs::read_to_string(&limits).unwrap_or_default();
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{stderr}");
    // Set while it ran: soft 0, hard the slice's cap, on its own cgroup.
    let line = set
        .lines()
        .find(|l| l.ends_with(&cgroup))
        .unwrap_or_else(|| panic!("no limit on {cgroup}: {set:?}; {stderr}"));
    let f: Vec<&str> = line.splitn(3, ' ').collect();
    assert_eq!((f[0], f[1]), ("0", hard.to_string().as_str()), "{set}");
    assert!(
        Path::new(f[2]).join("cgroup.controllers").is_file() || !Path::new(f[2]).exists(),
        "a cgroup v2 directory: {set}"
    );
    // Cleared when it ended, and root's record of it gone.
    let after = std::fs::read_to_string(&limits).unwrap_or_default();
    assert!(
        !after.contains(&cgroup),
        "still limited after the end: {after:?}"
    );
    assert_no_records_in(&host.path(gpuslice_cdi::memory_hook::STATE_DIR));
}

/// The replicas' directories a device plugin leaves allocated are tmpfs
/// mounts (`gpuslice_k8s::slicedir`): unmounted on drop, or they would
/// outlive the temp dir on the host.
struct Unmounted(std::path::PathBuf);

impl Drop for Unmounted {
    fn drop(&mut self) {
        for (dir, e) in gpuslice_k8s::slicedir::sweep(&self.0, &Default::default()) {
            eprintln!("left mounted: {}: {e}", dir.display());
        }
    }
}

/// The CDI device a device plugin answers a shared Allocate with, on the
/// test kubelet's real v1beta1 wire: its response's `cdi_devices`, and the
/// mounts it had before.
fn allocate_a_shared_replica(
    plugin_dir: &Path,
) -> gpuslice_k8s::plugin::v1beta1::ContainerAllocateResponse {
    use gpuslice_testkit::kubelet::{allocate_one, first_list, TestKubelet};
    use std::time::Duration;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut k = TestKubelet::start(plugin_dir).await.unwrap();
        let regs = k
            .registrations_of(&["nvidia.com/gpu.shared"], Duration::from_secs(20))
            .await
            .unwrap();
        let mut c = k.dial(&regs[0].req.endpoint).await.unwrap();
        let (devices, _stream) = first_list(&mut c).await.unwrap();
        let resp = allocate_one(&mut c, &[devices[0].id.clone()])
            .await
            .unwrap();
        k.stop().await;
        resp
    })
}

/// A device-plugin shared replica's container gets the driver's
/// hard limit (R615+, the fake posing as 615) on its own cgroup v2
/// directory. Allocate names the replica's CDI device beside its mounts;
/// the runtime (podman, as containerd and CRI-O do with the CDI names the
/// kubelet hands them) runs the device's `createRuntime` hook, which sets
/// the replica's cap from root's limits record, and its `poststop` hook
/// clears it. Without the device or its hooks the driver holds no limit
/// for the container.
#[test]
fn a_device_plugin_replica_s_container_gets_the_driver_s_limit() {
    use gpuslice_k8s::plugin::{config::Config, spawn, Options};
    let t = PodmanTest::new();
    let host = r615_host();
    // The plugin discovers through the fake NVML in this process.
    let _nvml = gpuslice_testkit::fakenvml::serve(host.root());
    let kind = format!("gpuslice.dev/dptest{}", std::process::id());
    let mut cfg = Config::parse("roles: [{gpus: others, role: shared, replicas: 2}]\n").unwrap();
    cfg.plugin_dir = t.dir().join("plugins");
    cfg.ledger_dir = t.dir().join("ledgers");
    cfg.state_dir = t.dir().join("state");
    cfg.board_dir = t.dir().join("boards");
    cfg.shim = t.shim.clone();
    cfg.driver_partitions.enabled = true;
    cfg.driver_partitions.hook = env!("CARGO_BIN_EXE_gpuslice").into();
    cfg.driver_partitions.cdi_dir = CDI_DIR.into();
    cfg.driver_partitions.cdi_kind = kind.clone();
    let _unmounted = Unmounted(cfg.ledger_dir.clone());
    let plugin_dir = cfg.plugin_dir.clone();
    let mut opts = Options::new(cfg, gpuslice_core::HostRoot::new(host.root()));
    opts.nvml_lib = Some(host.nvml_lib());
    opts.enforcer = None;
    let plugin = spawn(opts).unwrap();
    let mut image = Image::busybox(t.dir(), "gpuslice-dp-part-test");
    image.files = vec![Path::new(CDI_DIR).join(format!(
        "gpuslice-device-plugin-{}.json",
        kind.replace('/', "_")
    ))];

    let resp = allocate_a_shared_replica(&plugin_dir);
    let slice = resp.envs["GPUSLICE_SLICE"].clone();
    let names: Vec<&str> = resp.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    let device = format!("{kind}={slice}");
    assert_eq!(names, [device.as_str()], "{resp:?}");
    assert!(
        resp.mounts
            .iter()
            .any(|m| m.container_path == "/etc/ld.so.preload"),
        "the mounts are kept for runtimes without CDI: {resp:?}"
    );

    assert_limited_while_it_runs(
        &image,
        &device,
        &host,
        fakegpu::kernel::GPU_MEMORY_BYTES / 2,
    );
    plugin.stop().unwrap();
}
