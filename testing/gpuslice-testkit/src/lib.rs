//! Test support shared by gpuslice's test suites; not part of any product
//! binary's start-up path.
//!
//! - [`precondition`]: what a test that cannot run on this host does. It
//!   never passes silently: under `CI=true` it fails; elsewhere it fails
//!   too, naming what is missing, unless the caller asked to skip
//!   (`GPUSLICE_TEST_SKIP=1`), and then says `SKIPPED` with the reason.
//! - [`kubelet`]: the kubelet's side of the device-plugin protocol, for
//!   the device-plugin tests and `gpuslice device-plugin-selftest`.
//! - [`dra_kubelet`]: the kubelet's side of DRA plugin registration and of
//!   the DRA service (v1 and v1beta1), for the DRA driver's tests.
//! - [`fakeapi`]: `FakeApiServer`, a test double of the few kube-apiserver
//!   endpoints the DRA driver uses.
//! - [`manifests`]: deploy/ manifests checked against k8s-openapi's types.
//! - [`podman`]: a real container runtime for the CDI tests.
//! - [`pod`]: a pod's process without the shim, staged without a runtime
//!   (the plugins' enforcer tests).
//! - Helper binaries the tests spawn ([`built`]): `gpuslice-ledger-exercise`
//!   (the ledger's multi-process tests) and `gpuslice-shim-client` (a CUDA
//!   driver client for the shim's tests and the memory-cap and compute tests;
//!   see [`shim_client`]); the shim itself ([`shim_so`]).
//! - [`fakenvml`]: the one fake NVML a test process loads, shared by the
//!   tests of one binary without racing on `FAKEGPU_ROOT`.
//! - [`process`]: children the tests start: killed on drop, awaited until
//!   they say they are ready.
//! - [`temphost`]: a host root in a temporary directory holding the files
//!   a test writes there (checks that read a host's files).
//! - [`every_test_file_is_a_module`]: each crate's integration tests are one
//!   binary (`tests/tests.rs`); this checks it leaves no file out.

pub mod dra_kubelet;
pub mod fakeapi;
pub mod fakenvml;
pub mod kubelet;
pub mod manifests;
pub mod module_graph;
pub mod pod;
pub mod podman;
pub mod process;
pub mod temphost;

use std::path::PathBuf;

/// A binary of the workspace the tests spawn, built into the running test's
/// target directory; panics with how to build it when it is missing.
pub fn built(name: &str, package: &str) -> PathBuf {
    let dirs = fakegpu::artifact_dirs();
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found in {dirs:?}: build it with `cargo build -p {package}`")
        })
}

/// The shim's test client (`gpuslice-shim-client`), built with this crate.
pub fn shim_client() -> PathBuf {
    built("gpuslice-shim-client", "gpuslice-testkit")
}

/// The shim's file as cargo writes it (installed, it is renamed
/// `libgpuslice.so`).
pub const SHIM_FILE: &str = "libgpuslice_shim.so";

/// The shim as built beside the running test ([`SHIM_FILE`]), the newest
/// copy: `cargo test` refreshes `deps/`, `cargo build` the one above it,
/// and the newer one is the shim just built.
pub fn shim_so() -> PathBuf {
    fakegpu::artifact_dirs()
        .into_iter()
        .map(|d| d.join(SHIM_FILE))
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .expect("libgpuslice_shim.so next to the test binary (cargo build -p gpuslice-shim)")
}

/// The `.rs` files and module folders directly in `tests_dir` that
/// `main_source` (the text of its `tests.rs`) does not declare with
/// `mod name;`. Each crate builds one integration-test binary from
/// `tests/tests.rs` (`autotests = false`, as ripgrep does), so a file left
/// out would never be compiled, let alone run.
pub fn undeclared_test_modules(tests_dir: &std::path::Path, main_source: &str) -> Vec<String> {
    let declared: std::collections::BTreeSet<&str> = main_source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    let mut missing: Vec<String> = std::fs::read_dir(tests_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", tests_dir.display()))
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = if path.is_dir() {
                // A folder is a module when it holds Rust (`common/mod.rs`);
                // others hold data (scripts, C sources).
                path.join("mod.rs").is_file().then(|| path.file_name())??
            } else {
                (path.extension()? == "rs").then(|| path.file_stem())??
            };
            let name = name.to_str()?.to_string();
            (name != "tests" && !declared.contains(name.as_str())).then_some(name)
        })
        .collect();
    missing.sort();
    missing
}

/// A test, in a crate's `tests/tests.rs`, that fails when a file of its
/// `tests/` folder is not one of the binary's modules.
#[macro_export]
macro_rules! every_test_file_is_a_module {
    () => {
        #[test]
        fn every_test_file_is_a_module_of_this_binary() {
            let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests"));
            let left_out = $crate::undeclared_test_modules(
                dir,
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tests.rs")),
            );
            assert!(
                left_out.is_empty(),
                "declare them in tests/tests.rs (`mod name;`), or they never run: {left_out:?}"
            );
        }
    };
}

/// Set to `1` to skip, outside CI, the tests this host cannot run.
pub const SKIP_ENV: &str = "GPUSLICE_TEST_SKIP";

/// A file each skip is appended to, one line each, so that the runner
/// (`scripts/test.sh`) counts and lists skips: libtest shows a passing
/// test's output to no one.
pub const SKIP_LOG_ENV: &str = "GPUSLICE_TEST_SKIP_LOG";

fn record_skip(line: &str) {
    let Some(path) = std::env::var_os(SKIP_LOG_ENV) else {
        return;
    };
    if let Err(e) = append_line(std::path::Path::new(&path), line) {
        // The skip must not go unseen: without its record it fails.
        panic!("{line}, and it could not be recorded in {path:?}: {e}");
    }
}

/// One line appended (`O_APPEND`: tests in parallel never interleave
/// within a line this short).
fn append_line(path: &std::path::Path, line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(format!("{line}\n").as_bytes())
}

/// The limit for a daemon's background reaction (re-publishing, putting
/// a slice right) in a test that sets its slow path (poll, resync) to an
/// hour: far under that, so only the fast path (inotify, a watch) can
/// meet it, and far over what the fast path takes on an idle host (tenths
/// of a second), so a loaded 2-core CI host does not fail it. How fast
/// the fast path is belongs to a benchmark, not to a test.
pub const FAST_PATH_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Polls `ok` every 10 ms until it holds, and returns how long that took;
/// panics naming `what` once `limit` has passed (async tests of daemons
/// that act in the background: publishing, watching, hot-plug).
pub async fn wait_until(
    what: &str,
    limit: std::time::Duration,
    mut ok: impl FnMut() -> bool,
) -> std::time::Duration {
    let t0 = std::time::Instant::now();
    while !ok() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    t0.elapsed()
}

/// Whether this is a CI run (`CI=true`), where every test must run.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether `test` may run: true when `unmet` is None. When it is the
/// reason the test cannot run here: panics (always under CI), or with
/// `GPUSLICE_TEST_SKIP=1` outside CI prints `SKIPPED <test>: <reason>` and
/// returns false.
pub fn precondition(test: &str, unmet: Option<String>) -> bool {
    let skip = std::env::var(SKIP_ENV).is_ok_and(|v| v == "1");
    match verdict(test, unmet, in_ci(), skip) {
        Verdict::Run => true,
        Verdict::Skip(line) => {
            eprintln!("{line}");
            record_skip(&line);
            false
        }
        Verdict::Fail(message) => panic!("{message}"),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Run,
    Skip(String),
    Fail(String),
}

fn verdict(test: &str, unmet: Option<String>, ci: bool, skip: bool) -> Verdict {
    match unmet {
        None => Verdict::Run,
        Some(why) if ci => Verdict::Fail(format!(
            "{test} cannot run on this CI host: {why}; CI must run it"
        )),
        Some(why) if skip => Verdict::Skip(format!("SKIPPED {test}: {why} ({SKIP_ENV}=1)")),
        Some(why) => Verdict::Fail(format!(
            "{test} cannot run on this host: {why} (set {SKIP_ENV}=1 to skip it knowingly)"
        )),
    }
}

/// None as root; else why not.
pub fn needs_root() -> Option<String> {
    // Effective uid from procfs: no unsafe, no libc binding here.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .map(str::to_string);
    match euid.as_deref() {
        Some("0") => None,
        _ => Some("needs root (run the tests as root, as scripts/test.sh does)".into()),
    }
}

/// None when `program` is on PATH; else why not, with the package to install.
pub fn needs_program(program: &str, package: &str) -> Option<String> {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()));
    (!found).then(|| format!("{program} is not installed (apt-get install {package})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unmet_precondition_never_passes_silently() {
        let why = || Some("no widget".to_string());
        assert_eq!(verdict("t", None, true, false), Verdict::Run);
        assert_eq!(verdict("t", None, false, false), Verdict::Run);
        // CI: a failure, even when asked to skip.
        for skip in [false, true] {
            let Verdict::Fail(m) = verdict("t", why(), true, skip) else {
                panic!("CI must fail")
            };
            assert!(
                m.contains("CI must run it") && m.contains("no widget"),
                "{m}"
            );
        }
        // Elsewhere: a failure naming the opt-out, or a SKIPPED line with it.
        let Verdict::Fail(m) = verdict("t", why(), false, false) else {
            panic!("must fail without the opt-out")
        };
        assert!(
            m.contains("GPUSLICE_TEST_SKIP=1") && m.contains("no widget"),
            "{m}"
        );
        assert_eq!(
            verdict("t", why(), false, true),
            Verdict::Skip("SKIPPED t: no widget (GPUSLICE_TEST_SKIP=1)".into())
        );
    }

    #[test]
    fn skips_are_recorded_one_line_each_for_the_runner() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skipped.txt");
        append_line(&log, "SKIPPED a: x").unwrap();
        append_line(&log, "SKIPPED b: y").unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            ["SKIPPED a: x", "SKIPPED b: y"]
        );
        assert!(append_line(&dir.path().join("no/such/dir"), "SKIPPED c").is_err());
    }

    #[test]
    fn test_files_left_out_of_the_binary_are_named() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["a.rs", "b.rs", "tests.rs", "notes.md"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        std::fs::create_dir_all(dir.path().join("common")).unwrap();
        std::fs::write(dir.path().join("common/mod.rs"), "").unwrap();
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/attack.py"), "").unwrap();
        let main = "//! doc\nmod a;\n";
        assert_eq!(undeclared_test_modules(dir.path(), main), ["b", "common"]);
        let main = "mod a;\nmod b;\nmod common;\n";
        assert!(undeclared_test_modules(dir.path(), main).is_empty());
    }

    #[test]
    fn programs_are_found_on_path() {
        assert_eq!(needs_program("sh", "dash"), None);
        assert!(needs_program("no-such-program-gpuslice", "x")
            .is_some_and(|w| w.contains("apt-get install x")));
    }
}
