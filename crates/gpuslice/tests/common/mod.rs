//! Helpers shared by the CLI's integration tests (modules of one binary);
//! those other crates' tests share too are in gpuslice-testkit.

/// The `gpuslice` binary under test.
pub const GPUSLICE: &str = env!("CARGO_BIN_EXE_gpuslice");

pub mod slice;

/// `gpuslice --host-root <h>` with the fake driver's environment, in the
/// C locale (the tests match its messages).
pub fn gpuslice_on(h: &fakegpu::FakeHost) -> std::process::Command {
    let mut c = h.command(GPUSLICE);
    c.arg("--host-root").arg(h.root()).env("LC_ALL", "C");
    c
}

/// A script's preamble for a CDI device run on the fake host `h`: the
/// spec sets `LD_LIBRARY_PATH` to the container's library directory,
/// which a host does not have; the fake driver is found through its own.
pub fn fake_driver_preamble(h: &fakegpu::FakeHost) -> String {
    let (_, ld) = h
        .env()
        .into_iter()
        .find(|(k, _)| k == "LD_LIBRARY_PATH")
        .expect("the fake host sets LD_LIBRARY_PATH");
    format!("export LD_LIBRARY_PATH={ld}; ")
}

/// All a command printed: its stdout, then its stderr.
pub fn printed(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// The JSON document a command printed on stdout; fails with all it
/// printed where that is not one.
pub fn json_stdout(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON on stdout ({e}):\n{}", printed(out)))
}

/// Asserts that `out` is a success's, its stderr the failure's message.
pub fn assert_success(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The stdout of a command that must have succeeded (else the test fails
/// with its stderr).
pub fn stdout_of_success(out: &std::process::Output) -> String {
    assert_success(out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Some tests must run with no other test of this binary (its tests are
/// threads of one process): those that measure shares of GPU time, which
/// the fake GPU serves from the CPU (beside another test's processes on a
/// 2-core machine the shares would say more about the load than about
/// gpuslice), and one that opens `gpuslice-full` for writing (while another
/// test runs it, that is `Text file busy`). They hold [`alone`]; every other
/// test holds [`beside_others`] and runs only between them.
static ALONE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Whether `test`, which needs root, may run here (see
/// [`gpuslice_testkit::precondition`]).
pub fn root_may_run(test: &str) -> bool {
    gpuslice_testkit::precondition(test, gpuslice_testkit::needs_root())
}

/// Fails unless the tests run as root (as CI runs them).
pub fn assert_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests need root (CI)"
    );
}

/// Held by a test that must run with no other test.
pub fn alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    ALONE
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Held by every other test: not while one runs alone.
pub fn beside_others() -> std::sync::RwLockReadGuard<'static, ()> {
    ALONE
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// [`beside_others`], then the fake host `builder` builds (bound in this
/// order, the guard is dropped last).
pub fn host_beside_others(
    builder: fakegpu::FakeHostBuilder,
) -> (std::sync::RwLockReadGuard<'static, ()>, fakegpu::FakeHost) {
    let beside = beside_others();
    (beside, builder.build().expect("build fake host"))
}

/// `gpuslice exporter` on a free loopback port of the fake host `h` over
/// the ledger directory `ledgers`, killed on drop, and its address.
pub fn exporter(
    h: &fakegpu::FakeHost,
    ledgers: &std::path::Path,
) -> (gpuslice_testkit::process::Kill, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = gpuslice_testkit::process::Kill(
        std::process::Command::new(GPUSLICE)
            .arg("--host-root")
            .arg(h.root())
            .envs(h.env())
            .args(["exporter", "--listen", &addr, "--interval", "200ms"])
            .arg("--ledger-dir")
            .arg(ledgers)
            .spawn()
            .unwrap(),
    );
    (child, addr)
}

/// The strings of the JSON array `v` (panics on anything else).
pub fn strings(v: &serde_json::Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|a| a.as_str().unwrap_or_else(|| panic!("not a string: {a}")))
        .collect()
}

/// What a command run in a slice printed: its stdout, then its stderr less
/// the warning every `run --privileged` prints.
pub fn printed_in_slice(out: &std::process::Output) -> String {
    let stderr: String = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with("gpuslice: WARNING: --privileged"))
        .map(|l| format!("{l}\n"))
        .collect();
    String::from_utf8_lossy(&out.stdout).into_owned() + &stderr
}

/// `GET path` from `addr` over plain HTTP/1.0: the whole answer.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// Scrapes the exporter at `addr` until `found` finds what it looks for in
/// its /metrics, and returns that; fails saying `missing` (and the last
/// scrape) after 20 s.
pub fn metrics_until<T>(addr: &str, missing: &str, found: impl Fn(&str) -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = http_get(addr, "/metrics").unwrap_or_default();
        if let Some(t) = found(&text) {
            return t;
        }
        assert!(std::time::Instant::now() < deadline, "{missing}:\n{text}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Writes a DRA plugin checkpoint in `dir` with one prepared claim,
/// `team-a/train` (uid `uid-1`), a share of GPU 0: 20 GiB and 30 %, its
/// slice `uid-1-0`.
pub fn write_dra_checkpoint(dir: &std::path::Path) {
    write_dra_checkpoint_with(dir, vec![]);
}

/// [`write_dra_checkpoint`], the claim's limits records being `records`.
pub fn write_dra_checkpoint_with(dir: &std::path::Path, records: Vec<std::path::PathBuf>) {
    use gpuslice_dra::checkpoint::{Checkpoint, PreparedClaim, PreparedDevice};
    use gpuslice_dra::claim::{Allocated, DeviceKind};
    std::fs::create_dir_all(dir).unwrap();
    let mut c = Checkpoint::load(dir).unwrap();
    c.claims.insert(
        "uid-1".into(),
        PreparedClaim {
            namespace: "team-a".into(),
            name: "train".into(),
            uid: "uid-1".into(),
            resource_version: Some("7".into()),
            devices: vec![PreparedDevice {
                allocated: Allocated {
                    request: "gpu".into(),
                    pool: "node-a".into(),
                    device: "gpu-0-shared".into(),
                    share_id: Some("uid-1-share".into()),
                    kind: DeviceKind::Shared { gpu: 0 },
                    caps: Some(gpuslice_ledger::limits::DeviceCaps {
                        memory: gpuslice_ledger::limits::MemorySize(20 << 30),
                        compute: gpuslice_ledger::limits::ComputeShare::from_whole_percent(30),
                    }),
                },
                cdi_device_id: "gpuslice.dev/claim=uid-1-0".into(),
            }],
            cdi_spec: dir.join("spec.json"),
            records,
            slice_dirs: vec![],
            unenforceable: vec![],
        },
    );
    c.save().unwrap();
}

/// The commands of README.md's no-GPU demo, as written: the first `sh`
/// block of its "Try it without a GPU" section, less its first line (the
/// build: the tests run the binaries cargo built for them).
pub fn readme_demo() -> Vec<String> {
    let readme = include_str!("../../../../README.md");
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Try it without a GPU"))
        .expect("README.md has a \"Try it without a GPU\" section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("the section opens with an sh block");
    let mut lines = block.lines().map(str::to_string);
    let build = lines.next().unwrap_or_default();
    assert!(build.contains("cargo build --release"), "{build}");
    lines.filter(|l| !l.trim().is_empty()).collect()
}

/// A README command with its paths moved for a test: `./target/release/`
/// to the directory of the binaries under test, `/tmp/fakehost` to `host`.
pub fn readme_command(line: &str, host: &std::path::Path) -> String {
    let bins = std::path::Path::new(GPUSLICE).parent().unwrap();
    line.replace("./target/release/", &format!("{}/", bins.display()))
        .replace("/tmp/fakehost", &host.display().to_string())
}
