//! Programs that reach the driver around the shim, on the fake
//! GPU host under `run --memory 1GiB`. The client is C
//! (`tests/escapes/driver_client.c`), compiled here with the system's C
//! compiler: an ordinary dynamically linked program, as a tenant would
//! write it.
//!
//! - the lookups the shim closes (`dlvsym` of glibc's `dlsym`, `dlmopen`
//!   of libcuda into a new namespace, `RTLD_NEXT` from a library linked to
//!   libcuda) are refused at the cap;
//! - what cannot be closed in the process (the driver's functions found in
//!   libcuda's ELF symbol table and called at their address) is caught by
//!   root's enforcer in the launcher, from the driver's own per-process
//!   accounting (the fake driver's NVML, as a driver without memory
//!   partitions, R580, reports it): the slice is brought back within its
//!   cap in about a second, and `gpuslice slices` shows the driver's
//!   number;
//!
//! - on a driver with memory partitions (a fake posing as R615+), `run
//!   --memory` sets the hard limit on the slice's cgroup and the driver
//!   refuses what the shim does not see at the cap; the limit is zeroed and
//!   cleared when the slice ends, and a SIGKILLed launcher's by the next
//!   `run`; `doctor` says whether partitions are available.
//!
//! Needs root (CI runs it as root), gcc and the workspace built.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use fakegpu::FakeHost;
use serde_json::Value;

use crate::common;
use common::metrics_until;
use common::slice::{run_capped, slices_json, slices_text};
use gpuslice_testkit::process::Kill;

const CHUNK: u64 = 256 << 20;
const CAP: u64 = 1 << 30;

/// `tests/escapes/driver_client.c`, compiled into `dir`.
fn driver_client(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/escapes/driver_client.c");
    let out = dir.join("driver_client");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = std::process::Command::new(&cc)
        .args(["-Wall", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e} (these tests need a C compiler)"));
    assert!(status.success(), "compiling {}", src.display());
    out
}

/// A one-GPU fake host (a driver without memory partitions, R580).
fn host() -> FakeHost {
    on_driver(FakeHost::builder().gpus(1))
}

/// A one-GPU fake host posing as a driver with memory partitions (R615+).
fn r615() -> FakeHost {
    on_driver(FakeHost::builder().gpus(1).driver_version("615.20.01"))
}

fn on_driver(b: fakegpu::FakeHostBuilder) -> FakeHost {
    common::assert_root();
    b.build().unwrap()
}

/// A test's fake host, its slices' ledgers and the client compiled for it.
struct Setup {
    h: FakeHost,
    ledgers: tempfile::TempDir,
    /// Where the client (and any library of the test) is built.
    bin: tempfile::TempDir,
    client: PathBuf,
}

impl Setup {
    fn on(h: FakeHost) -> Setup {
        let ledgers = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let client = driver_client(bin.path());
        Setup {
            h,
            ledgers,
            bin,
            client,
        }
    }

    fn ledgers(&self) -> &Path {
        self.ledgers.path()
    }

    fn client(&self) -> &str {
        self.client.to_str().unwrap()
    }

    /// `gpuslice run --gpus 0 --memory 1GiB -- ARGV` on this host.
    fn capped(&self, argv: &[&str]) -> std::process::Command {
        run_capped(&self.h, self.ledgers(), argv)
    }

    /// The client's JSON line, from `run --gpus 0 --memory 1GiB -- client
    /// HOW 40`, with `env` added to the client's environment.
    fn run_client(&self, how: &str, env: &[(&str, &Path)]) -> (Option<i32>, Value, String) {
        let out = self
            .capped(&[self.client(), how, "40"])
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let v = stdout
            .lines()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
            .unwrap_or_else(|| panic!("no JSON from the client: {stdout}\n{stderr}"));
        (out.status.code(), v, stderr)
    }

    /// `gpuslice run --gpus 0 --memory 1GiB -- CLIENT ARGS…` with its stdout
    /// piped, killed on drop, and the lines it prints.
    fn capped_client(
        &self,
        args: &[&str],
    ) -> (Kill, std::io::Lines<BufReader<std::process::ChildStdout>>) {
        let argv = [&[self.client()][..], args].concat();
        let mut child = Kill(self.capped(&argv).stdout(Stdio::piped()).spawn().unwrap());
        let lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
        (child, lines)
    }
}

/// The client's allocations stopped at the cap (`how` they were made),
/// refused with CUDA_ERROR_OUT_OF_MEMORY.
fn assert_refused_at_cap(v: &Value, how: &str) {
    let allocated = v["allocated"].as_u64().unwrap();
    assert!(allocated * CHUNK <= CAP, "past the cap {how}: {v}");
    assert_eq!(
        v["rc"], 2,
        "refused with CUDA_ERROR_OUT_OF_MEMORY ({how}): {v}"
    );
}

/// `dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34")` gave glibc's own `dlsym`,
/// and through it libcuda's `cuMemAlloc_v2` unwrapped: 40 × 256 MiB under
/// a 1 GiB cap. The shim's `dlvsym` hands out its own `dlsym`.
#[test]
fn dlvsym_of_dlsym_is_refused_at_the_cap() {
    let _beside = common::beside_others();
    let t = Setup::on(host());
    // The same through dlsym(<libc's handle>, "dlsym").
    for how in ["dlvsym", "libc"] {
        let (code, v, stderr) = t.run_client(how, &[]);
        assert_eq!(code, Some(0), "{v} {stderr}");
        assert_refused_at_cap(&v, &format!("through {how}"));
    }
}

/// `dlsym(RTLD_NEXT, "cuMemAlloc_v2")` in a library that has libcuda
/// among its dependencies gave the driver's own function (the next object
/// in that library's scope), 40 x 256 MiB under a 1 GiB cap: the shim
/// answers `RTLD_NEXT` for the names it interposes with its wrapper.
#[test]
fn rtld_next_from_a_library_linked_to_libcuda_is_refused_at_the_cap() {
    let _beside = common::beside_others();
    let t = Setup::on(host());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/escapes/next.c");
    let lib = t.bin.path().join("libnext.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg(format!("-L{}", t.h.driver_lib_dir().display()))
        .args(["-Wl,--no-as-needed", "-lcuda"])
        .status()
        .unwrap();
    assert!(status.success(), "compiling {}", src.display());
    let env = [("DRIVER_CLIENT_NEXT_LIB", lib.as_path())];
    let (code, v, stderr) = t.run_client("next", &env);
    assert_eq!(code, Some(0), "{v} {stderr}");
    assert_refused_at_cap(&v, "through RTLD_NEXT");
}

/// libcuda `dlmopen`ed into a new namespace (no shim there) allocated
/// 40 × 256 MiB under a 1 GiB cap; the shim's `dlmopen` refuses a new
/// namespace in a capped slice, with a `dlerror` saying so.
#[test]
fn dlmopen_of_libcuda_into_a_new_namespace_is_refused() {
    let _beside = common::beside_others();
    let t = Setup::on(host());
    let (code, v, stderr) = t.run_client("dlmopen", &[]);
    assert_eq!(code, Some(3), "the load is refused: {v} {stderr}");
    assert!(
        v["refused"]
            .as_str()
            .unwrap()
            .contains("dlmopen into a new namespace is refused in a capped slice"),
        "{v}"
    );
    assert!(
        stderr.contains("into a new link-map namespace refused"),
        "{stderr}"
    );
}

/// Reads lines until one that is `want` or starts with it (panics at EOF),
/// and returns those it read.
fn wait_line(lines: &mut impl Iterator<Item = std::io::Result<String>>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for l in lines {
        let l = l.unwrap();
        let done = l.trim() == want || l.starts_with(want);
        seen.push(l);
        if done {
            return seen;
        }
    }
    panic!("no {want:?} line: {seen:?}");
}

/// A program that joined through the shim and then allocates behind it
/// (cuMemAlloc_v2 found in libcuda's ELF symbol table): 10 GiB under a
/// 1 GiB cap. Root's enforcer reads the driver's accounting and kills it
/// within about a second; the kill is logged, and `gpuslice slices` shows
/// it while the slice lives on. Without the enforcer the process holds
/// its 10 GiB until the test gives up.
#[test]
fn the_enforcer_kills_a_process_that_takes_its_slice_over_the_cap() {
    let _beside = common::beside_others();
    let t = Setup::on(host());
    let (h, ledgers, c) = (&t.h, t.ledgers(), t.client());
    let script = format!("{c} elf 40 hold; echo \"rc $?\"; exec {c} plain 1 hold");
    let mut launcher = Kill(
        t.capped(&["sh", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = launcher.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            let _ = tx.send((Instant::now(), l));
        }
    });
    let mut lines = std::iter::from_fn(|| {
        rx.recv_timeout(Duration::from_secs(10))
            .ok()
            .map(|(t, l)| l.map(|l| format!("{} {l}", t.elapsed().as_micros())))
    });
    // Lines come as "<µs since read> <text>"; the first is the allocation.
    let first = wait_line(&mut lines.by_ref().map(|l| l.map(strip)), "{");
    let v: Value = serde_json::from_str(first.last().unwrap()).unwrap();
    assert_eq!(v["allocated"], 40, "the allocations got past the shim: {v}");
    let held = Instant::now();
    let after = wait_line(&mut lines.by_ref().map(|l| l.map(strip)), "rc ");
    let took = held.elapsed();
    assert_eq!(after.last().unwrap().trim(), "rc 137", "killed: {after:?}");
    assert!(took < Duration::from_secs(2), "killed only after {took:?}");
    wait_line(&mut lines.by_ref().map(|l| l.map(strip)), "held");

    // The slice lives on (the shell's next holder): `slices` shows the kill
    // and the driver's number.
    let v = slices_json(h, ledgers);
    let s = &v["slices"][0];
    let k = &s["enforcement_kills"][0];
    assert_eq!(k["reason"], "over_cap", "{v}");
    assert_eq!(k["name"], "driver_client", "{v}");
    assert!(k["driver_bytes"].as_u64().unwrap() >= 40 * CHUNK, "{v}");
    assert_eq!(s["devices"][0]["driver_used_bytes"], CHUNK, "{v}");
    let text = slices_text(h, ledgers);
    assert!(
        text.contains("KILLED by root's enforcer (the slice was over its cap): it held 10240MiB"),
        "{text}"
    );

    // The exporter counts the kill and reports the driver's number.
    let id = s["slice"].as_str().unwrap().to_string();
    let (_exporter, addr) = common::exporter(h, ledgers);
    let kills =
        format!("gpuslice_slice_enforcement_kills_total{{slice=\"{id}\",reason=\"over_cap\"}} 1");
    let driver = format!("gpuslice_slice_memory_driver_used_bytes{{slice=\"{id}\",");
    let (value, text) = metrics_until(&addr, "no enforcement series", |text| {
        let line = text.lines().find(|l| l.starts_with(&driver))?;
        let value = line.rsplit(' ').next().unwrap_or("").parse::<f64>().ok();
        text.contains(&kills).then(|| (value, text.to_string()))
    });
    assert_eq!(value, Some(CHUNK as f64), "{text}");
    drop(launcher);
}

fn strip(l: String) -> String {
    l.split_once(' ').map_or(l.clone(), |(_, t)| t.to_string())
}

/// A process that joined through the shim holds memory it allocated
/// behind it, under the cap: `gpuslice slices` shows the driver's number
/// next to the ledger's, and does not call it enforced.
#[test]
fn slices_shows_the_driver_s_number_and_never_calls_a_process_holding_more_enforced() {
    let _beside = common::beside_others();
    let t = Setup::on(host());
    let (h, ledgers) = (&t.h, t.ledgers());
    let (_child, mut lines) = t.capped_client(&["elf", "2", "hold"]);
    wait_line(&mut lines, "held");
    let v = slices_json(h, ledgers);
    let s = &v["slices"][0];
    assert_eq!(s["devices"][0]["driver_used_bytes"], 2 * CHUNK, "{v}");
    assert!(
        s["devices"][0]["used_bytes"].as_u64().unwrap() < CHUNK,
        "{v}"
    );
    assert_eq!(s["processes"][0]["driver_bytes"][0], 2 * CHUNK, "{v}");
    assert_eq!(s["processes"][0]["enforced"], false, "{v}");
    assert_eq!(s["driver"]["processes"][0]["accounted"], false, "{v}");
    let text = slices_text(h, ledgers);
    assert!(text.contains("driver 512MiB"), "{text}");
    assert!(
        text.contains("NOT ENFORCED: the driver says it holds 512MiB")
            && !text.contains("enforced\n"),
        "{text}"
    );
}

/// A GPU process of a capped slice that the shim does not hold at all
/// (every driver function found in libcuda's ELF symbol table): killed by
/// default; under a policy saying `unshimmed_gpu_process = "flag"`, left
/// running and flagged.
#[test]
fn an_unshimmed_gpu_process_is_killed_by_default_and_flagged_by_policy() {
    let _beside = common::beside_others();
    let t = Setup::on(host());
    let run = |policy: Option<&Path>| {
        let mut cmd = t.capped(&[t.client(), "elf-all", "1", "hold"]);
        match policy {
            Some(p) => cmd.env("GPUSLICE_POLICY", p),
            None => cmd.env("GPUSLICE_POLICY", "/nonexistent/policy.toml"),
        };
        let mut child = Kill(
            cmd.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
        wait_line(&mut lines, "held");
        child
    };
    // Default: killed within about a second.
    let mut killed = run(None);
    let deadline = Instant::now() + Duration::from_secs(3);
    let status = loop {
        if let Some(s) = killed.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "an unshimmed GPU process ran on");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(137));
    let mut err = String::new();
    std::io::Read::read_to_string(killed.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("a GPU process of the slice the shim does not hold"),
        "{err}"
    );

    // The admin's choice: flag.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "unshimmed_gpu_process = \"flag\"\n").unwrap();
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut flagged = run(Some(&policy));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        flagged.0.try_wait().unwrap().is_none(),
        "flagged, not killed"
    );
    let v = slices_json(&t.h, t.ledgers());
    let s = &v["slices"][0];
    assert_eq!(s["unenforced"][0]["name"], "driver_client", "{v}");
    assert_eq!(
        s["driver"]["processes"][0]["shim_bytes"],
        Value::Null,
        "{v}"
    );
}

/// The fake driver's record of its memory partitions on GPU 0 (see
/// fakegpu-driver's partitions.rs): `soft hard cgroup-path` lines.
fn partitions(h: &FakeHost) -> String {
    std::fs::read_to_string(h.path(".fakegpu/memlimits/0")).unwrap_or_default()
}

/// On a driver with memory partitions, the allocations a program makes
/// behind the shim are refused by the driver at the cap: `run --memory`
/// set the hard limit on the slice's cgroup before the command started,
/// and cleared it when the slice ended. Without the partition the program
/// gets 40 x 256 MiB (and only root's enforcer stops it, afterwards).
#[test]
fn with_driver_partitions_the_driver_refuses_what_the_shim_does_not_see() {
    let _beside = common::beside_others();
    let t = Setup::on(r615());
    let h = &t.h;
    let record = h.path(".fakegpu/memlimits/0");
    let script = format!("cat {}; exec {} elf 40", record.display(), t.client());
    let out = t.capped(&["sh", "-c", &script]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let limit = stdout
        .lines()
        .find(|l| l.starts_with("0 1073741824 /") && l.contains("/gpuslice/"))
        .unwrap_or_else(|| panic!("no hard limit on the slice's cgroup: {stdout}\n{stderr}"));
    let v: Value = stdout
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap();
    assert_refused_at_cap(&v, "behind the shim, by the driver");
    let cgroup = limit.splitn(3, ' ').nth(2).unwrap();
    assert!(
        !partitions(h).contains(cgroup),
        "the slice's limit was left: {}",
        partitions(h)
    );
}

/// A SIGKILLed launcher cannot clear its slice's partition: the next `run`
/// does, as it reaps the dead slice's cgroup (zeroing the soft limit
/// first, so no reservation is left on the ancestors).
#[test]
fn a_dead_launcher_s_driver_partition_is_cleared_by_the_next_run() {
    let _beside = common::beside_others();
    let t = Setup::on(r615());
    let (h, ledgers) = (&t.h, t.ledgers());
    let (mut launcher, mut lines) = t.capped_client(&["plain", "1", "hold"]);
    wait_line(&mut lines, "held");
    let left = partitions(h);
    let cgroup = left
        .lines()
        .find_map(|l| l.splitn(3, ' ').nth(2).filter(|p| p.contains("/gpuslice/")))
        .unwrap_or_else(|| panic!("no partition while the slice runs: {left:?}"))
        .to_string();
    // `slices` says which layers hold the slice's memory.
    let v = slices_json(h, ledgers);
    let s = &v["slices"][0];
    assert_eq!(
        s["memory_layers"],
        serde_json::json!(["shim", "driver"]),
        "{v}"
    );
    assert_eq!(s["driver_limits"][0]["hard_bytes"], CAP, "{v}");
    assert!(
        slices_text(h, ledgers).contains("(memory held by: shim, driver)"),
        "{}",
        slices_text(h, ledgers)
    );
    // And the exporter.
    let id = s["slice"].as_str().unwrap().to_string();
    let (exporter, addr) = common::exporter(h, ledgers);
    let want = format!("gpuslice_slice_memory_layer{{slice=\"{id}\",layer=\"driver\"}} 1");
    let text = metrics_until(&addr, "no driver layer", |text| {
        text.contains(&want).then(|| text.to_string())
    });
    assert!(
        text.contains(&format!(
            "gpuslice_slice_memory_layer{{slice=\"{id}\",layer=\"shim\"}} 1"
        )),
        "{text}"
    );
    drop(exporter);
    launcher.0.kill().unwrap();
    launcher.0.wait().unwrap();
    // Its command dies with it (the parent-death signal); the cgroup empties.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("{cgroup}/cgroup.procs"))
        .is_ok_and(|p| !p.trim().is_empty())
    {
        assert!(Instant::now() < deadline, "the slice's processes live on");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        partitions(h).contains(&cgroup),
        "a SIGKILLed launcher clears nothing"
    );
    let out = t.capped(&["true"]).output().unwrap();
    common::assert_success(&out);
    assert!(
        !Path::new(&cgroup).exists(),
        "the dead slice's cgroup reaped"
    );
    assert!(
        !partitions(h).contains(&cgroup),
        "the dead slice's partition left: {}",
        partitions(h)
    );
}

/// `doctor` says whether the driver's partitions are available, and why not.
#[test]
fn doctor_says_whether_the_driver_has_memory_partitions() {
    let _beside = common::beside_others();
    let check = |h: &FakeHost| {
        let out = std::process::Command::new(common::GPUSLICE)
            .arg("--host-root")
            .arg(h.root())
            .envs(h.env())
            .args(["doctor", "--json"])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "driver.memory-partitions")
            .cloned()
            .unwrap_or_else(|| panic!("no partitions check: {v}"))
    };
    let c = check(&r615());
    assert_eq!(c["status"], "pass", "{c}");
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .contains("available: driver 615.20.01"),
        "{c}"
    );
    let c = check(&host());
    assert_eq!(c["status"], "skip", "{c}");
    assert!(
        c["detail"].as_str().unwrap().contains("older than R615"),
        "{c}"
    );
}

/// A DRA claim's pod whose process runs without the shim (its
/// preload file covered) and holds memory on the claim's GPU. `gpuslice
/// slices` knows the process as the claim's by the claim's limits record
/// in its root, as the plugin's enforcer does, and shows it with the
/// driver's number, never as a claim holding nothing.
#[test]
fn slices_shows_a_claim_s_process_past_the_shim_with_the_driver_s_number() {
    let _beside = common::beside_others();
    use gpuslice_testkit::pod::{Hide, PodProcess};
    let h = host();
    let ledgers = tempfile::tempdir().unwrap();
    let dra = h.path("var/lib/gpuslice/dra");
    std::fs::create_dir_all(&dra).unwrap();
    let record = gpuslice_cdi::limits_record_path(&dra, "uid-1-0");
    let uuid = h.gpus()[0].uuid.clone();
    let limits = gpuslice_ledger::limits::SliceLimits {
        slice_id: "uid-1-0".into(),
        mode: gpuslice_ledger::board::Mode::Cap,
        devices: vec![gpuslice_ledger::limits::DeviceLimits {
            uuid: uuid.clone(),
            memory: Some(gpuslice_ledger::limits::MemorySize(CAP)),
            compute: None,
        }],
    };
    std::fs::write(&record, limits.render()).unwrap();
    std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o644)).unwrap();
    common::write_dra_checkpoint_with(&dra, vec![record.clone()]);
    let (_pod, held) = PodProcess::start(&h, &record, &uuid, 2 * CAP, Hide::Nothing);
    assert_eq!(held, "held 0");
    let v = slices_json(&h, ledgers.path());
    let c = &v["dra_claims"][0];
    assert_eq!(c["driver_used_bytes"], 2 * CAP, "{v}");
    let p = &c["driver"]["processes"][0];
    assert_eq!(p["driver_bytes"], 2 * CAP, "{v}");
    assert_eq!(p["shim_bytes"], Value::Null, "{v}");
    assert_eq!(p["accounted"], false, "{v}");
    let text = slices_text(&h, ledgers.path());
    assert!(
        text.contains("driver 2048MiB held by its processes")
            && text.contains("NOT ENFORCED: the driver says it holds 2048MiB"),
        "{text}"
    );
    // The exporter: the claim's memory by the driver, its process not
    // enforced.
    let (_exporter, addr) = common::exporter(&h, ledgers.path());
    let driver = "gpuslice_slice_memory_driver_used_bytes{slice=\"uid-1-0\",";
    let unenforced = "gpuslice_slice_process_enforced{slice=\"uid-1-0\",";
    let (d, u) = metrics_until(&addr, "no driver series for the claim", |text| {
        let line = |p: &str| text.lines().find(|l| l.starts_with(p)).map(str::to_string);
        Some((line(driver)?, line(unenforced)?))
    });
    let value = |l: &str| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
    assert_eq!(value(&d), Some((2 * CAP) as f64), "{d}");
    assert_eq!(value(&u), Some(0.0), "{u}");
}
