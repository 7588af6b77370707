//! `gpuslice run --compute PCT` on the fake GPU host: the slice's ledger
//! holds the share, the child's simulated GPU time is held to it, and
//! `gpuslice slices` shows share, use and throttled time. Needs the fake
//! driver, the shim and its test client built (scripts/test.sh builds the
//! workspace first).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fakegpu::FakeHost;
use serde_json::Value;

use crate::common;
use common::slice::{gpuslice, host_and_ledgers, run_refused, slices_json, slices_text};
use gpuslice_testkit::shim_client;

/// `gpuslice run --gpus 0 <limits> -- <client> compute kernel` (200 µs
/// kernels, 1.2 s measured after 0.3 s).
fn run_client(h: &FakeHost, ledgers: &Path, limits: &[&str]) -> Command {
    let client = shim_client();
    let mut args = vec!["run", "--gpus", "0"];
    args.extend_from_slice(limits);
    args.extend([
        "--",
        client.to_str().unwrap(),
        "--via",
        "procaddr",
        "compute",
        "kernel",
        "200000",
        "1.2",
        "0.3",
    ]);
    gpuslice(h, ledgers, &args)
}

/// [`run_client`] started with its output piped, once it has run for
/// 0.9 s.
fn start_client(h: &FakeHost, ledgers: &Path, limits: &[&str]) -> Child {
    let child = run_client(h, ledgers, limits)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(900));
    child
}

/// The achieved share (%) from the client's output.
fn achieved(out: &std::process::Output) -> f64 {
    common::assert_success(out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["share"].as_f64().unwrap() * 100.0
}

#[test]
fn run_with_compute_holds_the_share_and_slices_shows_it() {
    let _alone = common::alone();
    let (h, ledgers) = host_and_ledgers(1);
    let child = start_client(&h, ledgers.path(), &["--compute", "40"]);
    let v = slices_json(&h, ledgers.path());
    let c = &v["slices"][0]["compute"][0];
    assert_eq!(c["share_percent"], 40.0, "{v}");
    assert_eq!(c["mode"], "cap", "{v}");
    assert!(c["busy_ns"].as_u64().unwrap() > 100_000_000, "{v}");
    assert!(c["throttled_ns"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(
        v["slices"][0]["devices"][0]["cap_bytes"],
        Value::Null,
        "{v}"
    );
    let text = slices_text(&h, ledgers.path());
    assert!(text.contains("compute share 40%"), "{text}");
    // Root vouches for the share on the GPU's board while the slice runs:
    // what lets the GPU's other slices count it and pass it the turn.
    let shares = ledgers.path().join("boards/shares").join(&h.gpus()[0].uuid);
    let records: Vec<String> = std::fs::read_dir(&shares)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(records, ["4000\n"], "{shares:?}");
    // A fake host is labelled a simulation, as `list` labels it; a real
    // host root (here: one without the fake host's kernel truth) is not.
    assert!(text.contains("SIMULATION:"), "{text}");
    assert_eq!(v["simulation"], true, "{v}");
    let real = tempfile::tempdir().unwrap();
    let out = Command::new(common::GPUSLICE)
        .arg("--host-root")
        .arg(real.path())
        .arg("slices")
        .env("GPUSLICE_LEDGER_DIR", ledgers.path())
        .env("GPUSLICE_BOARD_DIR", ledgers.path().join("boards"))
        .output()
        .unwrap();
    let said = common::stdout_of_success(&out);
    assert!(said.contains("compute share 40%"), "{said}");
    assert!(!said.contains("SIMULATION"), "{said}");

    let got = achieved(&child.wait_with_output().unwrap());
    assert!((got - 40.0).abs() <= 3.0, "achieved {got:.1}%");
    // The ledger is gone; the GPU's board (shared by all slices of that
    // GPU, like a lock file) stays.
    let left: Vec<_> = std::fs::read_dir(ledgers.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["boards"], "{left:?}");
    assert_eq!(std::fs::read_dir(&shares).unwrap().count(), 0, "{shares:?}");

    let err = run_refused(&h, ledgers.path(), &["--compute", "0"]);
    assert!(err.contains("not a percentage"), "{err}");
}

#[test]
fn a_guaranteed_share_runs_past_it_while_the_gpu_is_idle() {
    let _alone = common::alone();
    let (h, ledgers) = host_and_ledgers(1);
    let limits = ["--compute", "30", "--compute-mode", "guaranteed"];
    let child = start_client(&h, ledgers.path(), &limits);
    let v = slices_json(&h, ledgers.path());
    assert_eq!(v["slices"][0]["compute"][0]["mode"], "guaranteed", "{v}");
    let text = slices_text(&h, ledgers.path());
    assert!(
        text.contains("compute share 30% guaranteed (borrows idle time)"),
        "{text}"
    );
    let got = achieved(&child.wait_with_output().unwrap());
    assert!(got > 75.0, "guaranteed 30% alone on the GPU: {got:.1}%");
    let mut boards: Vec<_> = std::fs::read_dir(ledgers.path().join("boards"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    boards.sort();
    assert_eq!(
        boards,
        [format!("{}.board", h.gpus()[0].uuid), "shares".into()]
    );
    // The root-written share record went with the slice.
    let shares = ledgers.path().join("boards/shares").join(&h.gpus()[0].uuid);
    assert_eq!(std::fs::read_dir(&shares).unwrap().count(), 0, "{shares:?}");

    // A mode without a share, or a mode that does not exist: one clear line.
    for (args, want) in [
        (&["--compute-mode", "guaranteed"][..], "--compute"),
        (
            &["--compute", "30", "--compute-mode", "fair"][..],
            "possible values: cap, guaranteed",
        ),
    ] {
        let mut a = vec!["run", "--gpus", "0"];
        a.extend_from_slice(args);
        a.extend(["--", "true"]);
        let out = gpuslice(&h, ledgers.path(), &a).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{a:?}: {err}");
    }
}
