//! libgpuslice.so preloaded into a CUDA client running against the fake
//! driver (per-device memory): every allocation path is charged and
//! released, the cap holds under 32 processes, a SIGKILLed process's bytes
//! come back, and an uncapped process gets the driver's own functions.
//!
//! Needs the fake driver and the test client built (`cargo build -p
//! fakegpu-driver -p gpuslice-testkit`), as the workspace test script does.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use fakegpu::FakeHost;
use gpuslice_ledger::Ledger;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// The shim as cargo writes it (installed, it is renamed libgpuslice.so).
const SHIM_FILE: &str = "libgpuslice_shim.so";

fn shim_so() -> PathBuf {
    fakegpu::artifact_dirs()
        .into_iter()
        .map(|d| d.join(SHIM_FILE))
        .find(|p| p.is_file())
        .expect("libgpuslice_shim.so next to the test binary (cargo build -p gpuslice-shim)")
}

struct Slice {
    host: FakeHost,
    _dir: tempfile::TempDir,
    ledger: PathBuf,
    cap: String,
}

fn slice(cap: &str) -> Slice {
    let host = FakeHost::builder().gpus(2).build().expect("fake host");
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("test.ledger");
    Slice {
        host,
        _dir: dir,
        ledger,
        cap: cap.to_string(),
    }
}

impl Slice {
    fn client(&self, args: &[&str]) -> Command {
        let mut c = self.host.command(gpuslice_testkit::shim_client());
        c.args(args)
            .env("LD_PRELOAD", shim_so())
            .env("GPUSLICE_MEMORY_LIMIT", &self.cap)
            .env("GPUSLICE_LEDGER", &self.ledger)
            .env("GPUSLICE_SLICE", "test")
            .env("CUDA_VISIBLE_DEVICES", &self.host.gpus()[0].uuid)
            .env_remove("GPUSLICE_LOG");
        c
    }

    fn run(&self, args: &[&str]) -> Vec<Value> {
        let out = self.client(args).output().expect("spawn client");
        lines(&out)
    }

    fn ledger(&self) -> Ledger {
        Ledger::open(&self.ledger).expect("ledger")
    }
}

fn lines(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "client failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn n(v: &Value, k: &str) -> i64 {
    v[k].as_i64().unwrap_or_else(|| panic!("{k} in {v}"))
}

#[test]
fn every_allocation_path_is_charged_and_released_whichever_way_it_is_looked_up() {
    let s = slice("1GiB");
    for via in ["dlsym", "procaddr", "global"] {
        let results = s.run(&["--via", via, "paths"]);
        let by_path = |p: &str| {
            results
                .iter()
                .find(|v| v["path"] == p)
                .unwrap_or_else(|| panic!("{p} missing: {results:?}"))
        };
        for v in &results {
            assert_eq!(n(v, "rc"), 0, "{via}: {v}");
            assert_eq!(n(v, "free_rc"), 0, "{via}: {v}");
            assert!(n(v, "charged") > 0, "{via}: not charged: {v}");
            assert_eq!(n(v, "after_free"), 0, "{via}: not released: {v}");
        }
        assert_eq!(results.len(), 11, "{via}: {results:?}");
        let exact = |p: &str, bytes: u64| {
            assert_eq!(n(by_path(p), "charged") as u64, bytes, "{via} {p}");
        };
        exact("cuMemAlloc", 3 * MIB);
        // Pitch 1024 (1000 rounded to 512) × 1024 rows.
        exact("cuMemAllocPitch", MIB);
        exact("cuMemAllocManaged", 5 * MIB);
        // Pool reserve grows in 2 MiB steps.
        exact("cuMemAllocAsync", 8 * MIB);
        exact("cuMemAllocAsync_ptsz", 8 * MIB);
        exact("cuMemAllocFromPoolAsync", 10 * MIB);
        exact("cuMemCreate", 4 * MIB);
        // The driver's requirement (64 KiB aligned), not the estimate.
        exact("cuArrayCreate", 4 * MIB);
        exact("cuArray3DCreate", 4 * MIB);
        exact("cuMipmappedArrayCreate", (4096 + 1024 + 256 + 64) * 1024);
        exact("graph mem node", 11 * MIB);
    }
    assert_eq!(s.ledger().used(0), 0);
}

/// Stream-ordered allocations on a capturing stream are graph allocation
/// nodes: the shim must not touch the pool then (reading a pool attribute
/// while capturing is refused and invalidates the capture), nor charge
/// them; the graph's memory is charged when it is launched.
#[test]
fn allocations_during_stream_capture_become_graph_memory_charged_at_launch() {
    let s = slice("1GiB");
    for via in ["dlsym", "procaddr", "global"] {
        let results = s.run(&["--via", via, "capture", "4", &(8 * MIB).to_string()]);
        assert_eq!(results.len(), 3, "{via}: {results:?}");
        let g = &results[0];
        for k in [
            "rc_begin",
            "rc_mem_info",
            "rc_is_capturing",
            "rc_end",
            "rc_instantiate",
            "rc_launch",
            "rc_exec_destroy",
            "rc_trim",
        ] {
            assert_eq!(n(g, k), 0, "{via} {k}: {g}");
        }
        assert_eq!(
            g["rc_allocs"],
            serde_json::json!([0, 0, 0, 0]),
            "{via}: {g}"
        );
        assert_eq!(n(g, "status"), 1, "still capturing: {via}: {g}");
        assert_eq!(n(g, "charged_during"), 0, "{via}: {g}");
        assert_eq!(n(g, "charged_launched"), 32 * MIB as i64, "{via}: {g}");
        assert_eq!(n(g, "after_trim"), 0, "{via}: {g}");

        let p = &results[1];
        for k in ["rc_begin", "rc_alloc", "rc_end", "charged_during"] {
            assert_eq!(n(p, k), 0, "{via} {k}: {p}");
        }

        let o = &results[2];
        for k in [
            "rc_begin",
            "rc_alloc",
            "rc_mem_info",
            "rc_end",
            "rc_free",
            "after_free",
        ] {
            assert_eq!(n(o, k), 0, "{via} {k}: {o}");
        }
        assert_eq!(n(o, "charged"), 8 * MIB as i64, "{via}: {o}");
    }
    assert_eq!(s.ledger().used(0), 0);
}

/// A captured allocation reserves nothing, so one larger than what is left
/// of the cap is not refused while capturing; the graph's memory is charged
/// at launch even past the cap (docs/shim.md: a graph can overshoot once).
#[test]
fn a_captured_allocation_is_not_refused_against_the_cap_and_is_charged_at_launch() {
    let s = slice("24MiB");
    let g = &s.run(&["capture", "1", &(32 * MIB).to_string()])[0];
    assert_eq!(g["rc_allocs"], serde_json::json!([0]), "{g}");
    for k in ["rc_end", "rc_instantiate", "rc_launch", "charged_during"] {
        assert_eq!(n(g, k), 0, "{k}: {g}");
    }
    assert_eq!(n(g, "charged_launched"), 32 * MIB as i64, "{g}");
    assert_eq!(n(g, "after_trim"), 0, "{g}");
    assert_eq!(s.ledger().used(0), 0);
}

#[test]
fn over_the_cap_allocations_fail_with_out_of_memory_and_mem_info_shows_the_cap() {
    let s = slice("100MiB");
    for via in ["dlsym", "procaddr", "global"] {
        let v = &s.run(&["--via", via, "fill", &(7 * MIB).to_string()])[0];
        assert_eq!(n(v, "fail_rc"), 2, "CUDA_ERROR_OUT_OF_MEMORY: {v}");
        assert_eq!(n(v, "count"), 14, "{v}");
        assert_eq!(n(v, "total") as u64, 100 * MIB, "{v}");
        assert_eq!(n(v, "free_before") as u64, 100 * MIB, "{v}");
        assert_eq!(n(v, "free_full") as u64, 2 * MIB, "{v}");
        assert_eq!(n(v, "ledger_full") as u64, 98 * MIB, "{v}");
        assert_eq!(n(v, "ledger_after"), 0, "{v}");
    }
}

#[test]
fn two_processes_share_one_cap() {
    let s = slice("100MiB");
    let mut holder = s
        .client(&["hold", &(60 * MIB).to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held 0");
    let v = &s.run(&["fill", &(7 * MIB).to_string()])[0];
    // 40 MiB left: 5 blocks of 7 MiB.
    assert_eq!(n(v, "count"), 5, "{v}");
    assert_eq!(n(v, "total") as u64, 100 * MIB, "{v}");
    assert_eq!(n(v, "free_before") as u64, 40 * MIB, "{v}");

    // SIGKILL the holder: its 60 MiB come back at the next attach.
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(s.ledger().used(0), 60 * MIB);
    let v = &s.run(&["fill", &(7 * MIB).to_string()])[0];
    assert_eq!(n(v, "count"), 14, "{v}");
    assert_eq!(s.ledger().used(0), 0);
    let snap = s.ledger().snapshot();
    assert_eq!(snap.reclaimed_slots, 1);
    assert_eq!(snap.reclaimed_bytes, 60 * MIB);
}

#[test]
fn thirty_two_processes_of_random_allocations_never_pass_the_cap() {
    let s = slice("256MiB");
    let started = Instant::now();
    let kids: Vec<_> = (0..32u64)
        .map(|i| {
            s.client(&[
                "stress",
                "10",
                &(i * 7919 + 17).to_string(),
                &(24 * MIB).to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let (mut ok, mut oom) = (0, 0);
    for k in kids {
        let out = k.wait_with_output().unwrap();
        let v = &lines(&out)[0];
        assert!(n(v, "max_seen") as u64 <= 256 * MIB, "{v}");
        ok += n(v, "ok");
        oom += n(v, "oom");
    }
    assert!(started.elapsed().as_secs() >= 10);
    assert!(ok > 1000 && oom > 0, "ok {ok} oom {oom}");
    let l = s.ledger();
    assert_eq!(l.used(0), 0);
    assert!(l.peak(0) <= 256 * MIB);
    assert!(l.snapshot().processes.is_empty());
}

fn defining_file(s: &Slice, capped: bool, via: &str, name: &str) -> String {
    let mut c = s.client(&["--via", via, "addr", name]);
    if !capped {
        c.env_remove("GPUSLICE_MEMORY_LIMIT")
            .env_remove("GPUSLICE_LEDGER");
    }
    let v = &lines(&c.output().unwrap())[0];
    let file = v["file"].as_str().unwrap().to_string();
    assert!(!file.is_empty(), "{v}");
    Path::new(&file)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn without_a_cap_the_driver_s_own_functions_are_handed_out() {
    let s = slice("1GiB");
    for (via, name) in [
        ("dlsym", "cuMemAlloc_v2"),
        ("procaddr", "cuMemAlloc_v2"),
        ("procaddr", "cuMemAllocAsync_ptsz"),
        ("dlsym", "cuGetProcAddress_v2"),
    ] {
        let uncapped = defining_file(&s, false, via, name);
        assert_ne!(uncapped, SHIM_FILE, "{via} {name}");
        let capped = defining_file(&s, true, via, name);
        assert_eq!(capped, SHIM_FILE, "{via} {name}");
    }
}

#[test]
fn a_corrupt_ledger_is_reported_and_the_cap_still_holds_per_process() {
    let s = slice("100MiB");
    std::fs::write(&s.ledger, vec![7u8; 4096]).unwrap();
    let out = s
        .client(&["fill", &(7 * MIB).to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a gpuslice ledger"), "{err}");
    let v = &lines(&out)[0];
    assert_eq!(n(v, "count"), 14, "{v}");
}
