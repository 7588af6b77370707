//! Helpers shared by the CLI's integration tests (each test binary
//! includes this module and uses a part of it).

/// The `gpuslice` binary under test.
pub const GPUSLICE: &str = env!("CARGO_BIN_EXE_gpuslice");

#[allow(dead_code)] // Only the memory-cap, compute-share and slice-integrity tests use it.
pub mod slice;

/// A child process killed and reaped when the test lets go of it, passed
/// or panicking.
#[allow(dead_code)] // Only the CDI, exporter and slice-integrity tests use it.
pub struct Kill(pub std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpuslice exporter` on a free loopback port of the fake host `h` over
/// the ledger directory `ledgers`, killed on drop, and its address.
#[allow(dead_code)] // Only the escapes and slice-integrity tests use it.
pub fn exporter(h: &fakegpu::FakeHost, ledgers: &std::path::Path) -> (Kill, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = Kill(
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

/// Writes a DRA plugin checkpoint in `dir` with one prepared claim,
/// `team-a/train` (uid `uid-1`), a share of GPU 0: 20 GiB and 30 %, its
/// slice `uid-1-0`.
#[allow(dead_code)] // Only the slices and exporter tests use it.
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
#[allow(dead_code)] // Only the demo and top tests use it.
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
#[allow(dead_code)] // Only the demo and top tests use it.
pub fn readme_command(line: &str, host: &std::path::Path) -> String {
    let bins = std::path::Path::new(GPUSLICE).parent().unwrap();
    line.replace("./target/release/", &format!("{}/", bins.display()))
        .replace("/tmp/fakehost", &host.display().to_string())
}
