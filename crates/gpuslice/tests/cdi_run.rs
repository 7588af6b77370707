//! `gpuslice run --cdi-device` on the fake GPU host: a DRA-prepared
//! claim's CDI device run with no container runtime. The fake driver in
//! the slice sees exactly the claim's cap and only its GPU; the command
//! cannot write its limits record (at the fixed place or at its host path)
//! nor another slice's ledger; a spec's other mounts are made exactly as
//! it says; bad input is refused with one line, exit 125, and nothing left
//! behind. Needs root (CI runs it as root) and the workspace built.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::{Arc, OnceLock};

use fakegpu::FakeHost;
use gpuslice_core::HostRoot;
use gpuslice_dra::apiserver::KubeApi;
use gpuslice_dra::driver::{spec_path, ClaimRef, Driver, Options};
use gpuslice_dra::DRIVER_NAME;
use gpuslice_testkit::fakeapi::{device_claim, shared_claim, FakeApiServer};
use serde_json::{json, Value};

use crate::common;
use common::slice::{gpuslice, slices_json};
use gpuslice_testkit::process::{spawn_until, Kill};
use gpuslice_testkit::{shim_client, shim_so};

const GIB: u64 = 1 << 30;

/// A fake host of 4 GPUs, and claims prepared on it by the DRA driver
/// (read from the API test double as kube-scheduler writes them), their
/// specs in `cdi`.
/// One fake host for the file's tests (discovery's fake NVML serves it
/// while a test holds `gpuslice_testkit::fakenvml::serve`).
fn host() -> &'static FakeHost {
    static HOST: OnceLock<FakeHost> = OnceLock::new();
    HOST.get_or_init(|| {
        let h = FakeHost::builder().gpus(4).build().unwrap();
        std::fs::set_permissions(h.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
        h
    })
}

struct Prepared {
    host: &'static FakeHost,
    tmp: tempfile::TempDir,
    ledgers: tempfile::TempDir,
}

/// The claims stay prepared to the end: their slice directories (tmpfs
/// mounts) are unmounted here, or they would outlive the temp dir.
impl Drop for Prepared {
    fn drop(&mut self) {
        let kept = std::collections::HashSet::new();
        gpuslice_k8s::slicedir::sweep(&self.tmp.path().join("claims"), &kept);
    }
}

impl Prepared {
    /// Prepares `claims`: (uid, gpu, memory, compute); memory "" for the GPU whole.
    fn new(claims: &[(&str, u32, &str, &str)]) -> Prepared {
        common::assert_root();
        let host = host();
        let tmp = tempfile::tempdir().unwrap();
        let p = Prepared {
            host,
            tmp,
            ledgers: tempfile::tempdir().unwrap(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _nvml = gpuslice_testkit::fakenvml::serve(p.host.root());
        rt.block_on(async {
            let api = FakeApiServer::start().await;
            let root = HostRoot::new(p.host.root());
            let inventory = gpuslice_testkit::fakenvml::discover(p.host);
            let driver = Driver::new(
                Options {
                    driver_name: DRIVER_NAME.into(),
                    pool: "node-a".into(),
                    host_root: root,
                    inventory,
                    cdi_dir: p.cdi(),
                    state_dir: p.tmp.path().join("state"),
                    shim: Some(shim_so()),
                    hook: None,
                    strip_host_root: false,
                    policy: gpuslice_dra::publish::SharedPolicy::default(),
                    refuse_unenforceable: false,
                    claims_dir: Some(p.tmp.path().join("claims")),
                },
                Arc::new(KubeApi::new(&api.url, None).unwrap()),
            )
            .unwrap();
            for (uid, gpu, mem, compute) in claims {
                // No memory: the GPU whole.
                api.put_claim(if mem.is_empty() {
                    device_claim("ns", uid, uid, "node-a", &format!("gpu-{gpu}"))
                } else {
                    shared_claim("ns", uid, uid, "node-a", *gpu, mem, compute)
                });
                let c = ClaimRef {
                    namespace: "ns".into(),
                    name: uid.to_string(),
                    uid: uid.to_string(),
                };
                let got = driver.prepare(&[c]).await;
                let got = got[*uid].as_ref().unwrap();
                assert_eq!(got[0].cdi_device_id, id(uid));
            }
        });
        p
    }

    fn cdi(&self) -> PathBuf {
        self.tmp.path().join("cdi")
    }

    /// `gpuslice run --cdi-spec-dir <cdi> <args>`.
    fn run(&self, args: &[&str]) -> std::process::Command {
        let cdi = self.cdi();
        let mut all = vec!["run", "--cdi-spec-dir", cdi.to_str().unwrap()];
        all.extend_from_slice(args);
        gpuslice(self.host, self.ledgers.path(), &all)
    }

    /// What `run --cdi-device DEVICE -- sh -c SCRIPT` printed, which must
    /// succeed.
    fn run_sh(&self, device: &str, script: &str) -> String {
        let out = self
            .run(&["--cdi-device", device, "--", "sh", "-c", script])
            .output()
            .unwrap();
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));
        stdout
    }

    /// The host path of claim `uid`'s limits record.
    fn record(&self, uid: &str) -> PathBuf {
        gpuslice_cdi::limits_record_path(&self.cdi(), &format!("{uid}-0"))
    }

    /// Nothing of a slice is left: no ledger, no record, no share.
    fn assert_nothing_left(&self) {
        let left: Vec<_> = std::fs::read_dir(self.ledgers.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != "boards")
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
        // (The GPUs' boards themselves stay, as for any slice.)
        let shares = gpuslice_ledger::board::shares_dir(&self.ledgers.path().join("boards"));
        let shares: Vec<_> = walk(&shares).into_iter().filter(|p| p.is_file()).collect();
        assert!(shares.is_empty(), "share records left: {shares:?}");
    }
}

fn walk(p: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        out.push(e.path());
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}

fn id(uid: &str) -> String {
    format!("gpuslice.dev/claim={uid}-0")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The JSON lines the client printed.
fn lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn a_prepared_claim_runs_with_exactly_its_caps_and_only_its_gpu() {
    let _beside = common::beside_others();
    let p = Prepared::new(&[("claim-a", 2, "20Gi", "30"), ("claim-b", 1, "40Gi", "60")]);
    let c = shim_client();
    let c = c.to_str().unwrap();

    // A holder in claim B's slice: the victim of the attacks below.
    let holder = spawn_until(
        &mut p.run(&[
            "--cdi-device",
            &id("claim-b"),
            "--",
            "sh",
            "-c",
            &format!(
                "{}exec {c} hold 50000000",
                common::fake_driver_preamble(p.host)
            ),
        ]),
        "held 0",
    );
    let victim = Kill(holder);
    let v = slices_json(p.host, p.ledgers.path());
    let s = &v["slices"][0];
    assert_eq!(s["devices"][0]["cap_bytes"], 40 * GIB, "{v}");
    assert_eq!(s["devices"][0]["uuid"], p.host.gpus()[1].uuid, "{v}");
    assert_eq!(s["limits"], "root's record", "{v}");
    let victim_ledger = s["ledger"].as_str().unwrap().to_string();

    let record = p.record("claim-a");
    let before = std::fs::read(&record).unwrap();
    let script = format!(
        "{preamble}
         ls {root}/dev | grep '^nvidia' | grep -v caps | tr '\\n' ' '; echo
         echo CUDA=$CUDA_VISIBLE_DEVICES NVIDIA=$NVIDIA_VISIBLE_DEVICES
         {c} info
         {c} fill 1073741824
         echo x >> /run/gpuslice/slice/limits && echo WROTE-LIMITS
         umount /run/gpuslice/slice/limits 2>/dev/null && echo UNMOUNTED
         echo x >> {record} && echo WROTE-RECORD
         ls {cdi} 2>/dev/null | grep -q . && echo SEEN-SPECS
         echo x >> {victim_ledger} && echo WROTE-VICTIM
         test -e {root}/dev/nvidia1 && echo SEES-GPU1
         true",
        preamble = common::fake_driver_preamble(p.host),
        root = p.host.root().display(),
        record = record.display(),
        cdi = p.cdi().display(),
    );
    let stdout = p.run_sh(&id("claim-a"), &script);
    let mut l = stdout.lines();
    assert_eq!(
        l.next().unwrap().trim(),
        "nvidia-modeset nvidia-uvm nvidia-uvm-tools nvidia2 nvidiactl",
        "GPU 2's node and no other GPU's"
    );
    let uuid2 = &p.host.gpus()[2].uuid;
    assert_eq!(
        l.next().unwrap(),
        format!("CUDA={uuid2} NVIDIA={uuid2}"),
        "{stdout}"
    );
    let got = lines(&stdout);
    assert_eq!(got[0]["rc"], 0, "{stdout}");
    assert_eq!(
        got[0]["total"],
        20 * GIB,
        "mem_get_info total is the cap: {stdout}"
    );
    assert_eq!(got[1]["count"], 20, "{stdout}");
    assert_eq!(got[1]["total"], 20 * GIB, "{stdout}");
    assert_eq!(got[1]["fail_rc"], 2, "refused beyond it: {stdout}");
    for bad in [
        "WROTE-LIMITS",
        "UNMOUNTED",
        "WROTE-RECORD",
        "SEEN-SPECS",
        "WROTE-VICTIM",
        "SEES-GPU1",
    ] {
        assert!(!stdout.contains(bad), "{bad}:\n{stdout}");
    }
    assert_eq!(
        std::fs::read(&record).unwrap(),
        before,
        "the record is as the driver wrote it"
    );

    // The victim is as it was.
    let v = slices_json(p.host, p.ledgers.path());
    let s = &v["slices"][0];
    assert_eq!(s["devices"][0]["cap_bytes"], 40 * GIB, "{v}");
    assert_eq!(s["devices"][0]["used_bytes"], 50_000_000, "{v}");
    // Its command killed, the launcher cleans up after it.
    let pid = s["processes"][0]["pid"].as_i64().unwrap() as i32;
    // SAFETY: plain kill(2) of the process in the slice we started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let mut victim = victim;
    assert_eq!(victim.0.wait().unwrap().code(), Some(137));
    p.assert_nothing_left();
}

/// A hand-written spec for `example.com/test=d`: GPU 0's node, `edits`
/// merged over the device's edits; written root's, 0644, in `dir`.
fn write_spec(p: &Prepared, dir: &Path, edits: Value) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let node = p.host.path("dev/nvidia0");
    let mut e = json!({
        "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": node, "type": "c", "major": 195, "minor": 0}],
    });
    for (k, v) in edits.as_object().unwrap() {
        e[k] = v.clone();
    }
    let spec = json!({
        "cdiVersion": "0.6.0",
        "kind": "example.com/test",
        "devices": [{"name": "d", "containerEdits": e}],
    });
    let path = dir.join("test.json");
    std::fs::write(&path, spec.to_string()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

fn run_spec(p: &Prepared, dir: &Path, script: &str) -> Output {
    gpuslice(
        p.host,
        p.ledgers.path(),
        &[
            "run",
            "--cdi-spec-dir",
            dir.to_str().unwrap(),
            "--cdi-device",
            "example.com/test=d",
            "--",
            "sh",
            "-c",
            script,
        ],
    )
    .output()
    .unwrap()
}

#[test]
fn a_spec_mount_is_made_exactly_as_the_spec_says() {
    let _beside = common::beside_others();
    let p = Prepared::new(&[]);
    let secret = p.tmp.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("file"), "host data\n").unwrap();
    let target = p.tmp.path().join("mnt");
    std::fs::create_dir(&target).unwrap();
    let missing = p.tmp.path().join("not-here/sub");
    let dir = p.tmp.path().join("specs");
    write_spec(
        &p,
        &dir,
        json!({
            "env": ["FROM_SPEC=yes", "PATH=/usr/bin:/bin"],
            "mounts": [
                {"hostPath": secret, "containerPath": target, "options": ["ro", "nosuid", "nodev", "bind"]},
                {"hostPath": secret, "containerPath": missing, "options": ["ro", "bind"]},
            ],
        }),
    );
    let out = run_spec(
        &p,
        &dir,
        &format!(
            "cat {t}/file; echo x > {t}/new && echo WROTE; echo x >> {t}/file && echo WROTE
             grep ' {t} ' /proc/self/mountinfo | grep -q 'ro,nosuid,nodev' && echo FLAGS-OK
             echo FROM_SPEC=$FROM_SPEC; ls {r}/dev | grep '^nvidia' | grep -v caps | tr '\\n' ' '",
            t = target.display(),
            r = p.host.root().display()
        ),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));
    assert!(stdout.starts_with("host data\n"), "{stdout}");
    assert!(!stdout.contains("WROTE"), "{stdout}");
    assert!(stdout.contains("FLAGS-OK"), "{stdout}");
    assert!(stdout.contains("FROM_SPEC=yes"), "{stdout}");
    assert!(
        stdout.contains("nvidia-modeset nvidia-uvm nvidia-uvm-tools nvidia0 nvidiactl"),
        "{stdout}"
    );
    // On the host: nothing changed, nothing created, nothing mounted.
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
    assert_eq!(
        std::fs::read_to_string(secret.join("file")).unwrap(),
        "host data\n"
    );
    assert!(
        !p.tmp.path().join("not-here").exists(),
        "the launcher created a path on the host"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(target.to_str().unwrap()), "{mounts}");
    p.assert_nothing_left();
}

/// Refused with one line naming the fault, exit 125, nothing left.
fn assert_refused(p: &Prepared, out: &Output, says: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains(says), "expected {says:?} in: {err}");
    assert!(
        out.stdout.is_empty(),
        "the command ran: {}",
        text(&out.stdout)
    );
    p.assert_nothing_left();
}

#[test]
fn bad_cdi_input_is_refused_with_one_line_and_nothing_left() {
    let _beside = common::beside_others();
    let p = Prepared::new(&[("claim-a", 2, "20Gi", "30"), ("claim-c", 3, "10Gi", "10")]);
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--", "echo", "RAN"]);
        p.run(&all).output().unwrap()
    };
    let out = run(&["--cdi-device", "gpuslice.dev/claim=nope-0"]);
    assert_refused(&p, &out, "has no device \"nope-0\"");
    let out = run(&["--cdi-device", "example.com/none=x"]);
    assert_refused(&p, &out, "no spec of kind example.com/none");
    let out = run(&["--cdi-device", "claim-a-0"]);
    assert_refused(&p, &out, "is not VENDOR/CLASS=NAME");
    let out = run(&["--cdi-device", &id("claim-a"), "--gpus", "0"]);
    assert_refused(&p, &out, "--gpus");
    let out = run(&["--cdi-device", &id("claim-a"), "--memory", "1GiB"]);
    assert_refused(&p, &out, "--memory");
    let out = run(&[
        "--cdi-device",
        &id("claim-a"),
        "--cdi-device",
        &id("claim-c"),
    ]);
    assert_refused(&p, &out, "a second limits record");

    // A malformed spec among them.
    let junk = p.cdi().join("junk.json");
    std::fs::write(&junk, "{\"cdiVersion\": \"0.6.0\", \"kind\": 7}").unwrap();
    let out = run(&["--cdi-device", &id("claim-a")]);
    assert_refused(&p, &out, "junk.json is malformed");
    std::fs::remove_file(&junk).unwrap();

    // Specs are root's trust.
    let spec = spec_path(&p.cdi(), "claim-a");
    std::os::unix::fs::chown(&spec, Some(65534), None).unwrap();
    let out = run(&["--cdi-device", &id("claim-a")]);
    assert_refused(&p, &out, "owned by uid 65534, not root");
    std::os::unix::fs::chown(&spec, Some(0), None).unwrap();
    std::fs::set_permissions(p.cdi(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = run(&["--cdi-device", &id("claim-a")]);
    assert_refused(&p, &out, "is writable by others");
    std::fs::set_permissions(p.cdi(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&spec, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = run(&["--cdi-device", &id("claim-a")]);
    assert_refused(&p, &out, "is writable by others");
    std::fs::set_permissions(&spec, std::fs::Permissions::from_mode(0o644)).unwrap();

    // A record the claim's nodes do not select.
    let dir = p.tmp.path().join("specs");
    let shim = shim_so();
    let record = p.record("claim-a"); // GPU 2's; the spec names GPU 0
    write_spec(
        &p,
        &dir,
        json!({"mounts": [
            {"hostPath": shim, "containerPath": "/usr/local/gpuslice/libgpuslice.so", "options": ["ro", "bind"]},
            {"hostPath": record, "containerPath": "/run/gpuslice/slice/limits", "options": ["ro", "bind"]},
        ]}),
    );
    let out = run_spec(&p, &dir, "echo RAN");
    assert_refused(&p, &out, "which its device nodes do not select");
    // Hooks other than gpuslice's own.
    write_spec(
        &p,
        &dir,
        json!({"hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk", "hook", "update-ldcache"]}]}),
    );
    let out = run_spec(&p, &dir, "echo RAN");
    assert_refused(&p, &out, "runs no CDI hooks but gpuslice's own");
    // A node that is not a GPU's.
    write_spec(
        &p,
        &dir,
        json!({"deviceNodes": [{"path": "/dev/null", "hostPath": "/dev/null"}]}),
    );
    let out = run_spec(&p, &dir, "echo RAN");
    assert_refused(&p, &out, "is not an NVIDIA GPU node");
    // A node renamed in the slice.
    let gpu1 = p.host.path("dev/nvidia1");
    write_spec(
        &p,
        &dir,
        json!({"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": gpu1}]}),
    );
    let out = run_spec(&p, &dir, "echo RAN");
    assert_refused(&p, &out, "only at its host name");
    // The spec's own run works (the faults above were the faults).
    let out = p
        .run(&["--cdi-device", &id("claim-a"), "--", "echo", "RAN"])
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout), "RAN\n", "{}", text(&out.stderr));
}

#[test]
fn a_whole_gpu_claim_runs_uncapped_on_its_gpu_alone() {
    let _beside = common::beside_others();
    let p = Prepared::new(&[("whole", 1, "", "")]);
    let script = format!(
        "{}ls {}/dev | grep '^nvidia[0-9]'; {} info; test -e /run/gpuslice/slice/limits && echo CAPPED; true",
        common::fake_driver_preamble(p.host),
        p.host.root().display(),
        shim_client().display()
    );
    let stdout = p.run_sh(&id("whole"), &script);
    assert!(
        stdout.starts_with("nvidia1\n"),
        "GPU 1's node alone: {stdout}"
    );
    let got = lines(&stdout);
    assert_eq!(
        got[0]["total"],
        fakegpu::kernel::GPU_MEMORY_BYTES,
        "uncapped: {stdout}"
    );
    assert!(!stdout.contains("CAPPED"), "{stdout}");
    p.assert_nothing_left();
}

/// Two DRA claims sharing GPU 0 at 30 % and 60 %, each run by `run
/// --cdi-device` with kernels queued on one simulated GPU: each is held to
/// its share of the GPU's time, 2:1 (without the claims' compute caps
/// both would get about half). The bounds are wide below the shares: on a
/// loaded 2-core machine each got about 10 points less (the simulated
/// GPU's idle time between a throttled process's kernels), with or
/// without taking turns; the fake engine does not show what turns save a
/// real GPU (context switches), which the H200's `dra` part measures.
#[test]
fn two_claims_on_one_gpu_get_their_shares_of_its_time() {
    let _alone = common::alone();
    let p = Prepared::new(&[("claim-s", 0, "10Gi", "30"), ("claim-t", 0, "10Gi", "60")]);
    let engine = p.tmp.path().join("engine");
    std::fs::File::create(&engine).unwrap();
    std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o666)).unwrap();
    let c = shim_client();
    let script = format!(
        "{}exec {} --via procaddr compute kernel 200000 3 0.5",
        common::fake_driver_preamble(p.host),
        c.display()
    );
    let start = |uid: &str| {
        p.run(&["--cdi-device", &id(uid), "--", "sh", "-c", &script])
            .env("FAKEGPU_ENGINE", &engine)
            // The shim finds the boards where the spec binds them.
            .env_remove("GPUSLICE_BOARD_DIR")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start("claim-s"), start("claim-t"));
    let share = |child: std::process::Child| {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
        v["share"].as_f64().unwrap() * 100.0
    };
    let (s30, s60) = (share(a), share(b));
    let said = format!("30 % claim got {s30:.1} %, 60 % got {s60:.1} %");
    assert!((15.0..=36.0).contains(&s30), "{said}");
    assert!((40.0..=66.0).contains(&s60), "{said}");
    let ratio = s60 / s30;
    assert!(
        (1.6..=3.0).contains(&ratio),
        "60:30 is {ratio:.2}:1: {said}"
    );
}
