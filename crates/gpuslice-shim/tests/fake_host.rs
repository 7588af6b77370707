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
use gpuslice_testkit::process::spawn_until;
use gpuslice_testkit::{shim_so, SHIM_FILE};
use serde_json::Value;

const MIB: u64 = 1 << 20;
/// The fake driver's pool reserve grows in 32 MiB steps, as the H200's.
const POOL_STEP: u64 = 32 * MIB;

struct Slice {
    /// Not while a compute test measures (see `crate::alone`).
    _beside_others: std::sync::RwLockReadGuard<'static, ()>,
    host: FakeHost,
    _dir: tempfile::TempDir,
    ledger: PathBuf,
    cap: String,
}

fn slice(cap: &str) -> Slice {
    slice_on(FakeHost::builder().gpus(2), cap)
}

/// A slice on a fake host built by `builder` (contexts and modules holding
/// device memory, for the physical-cap tests).
fn slice_on(builder: fakegpu::FakeHostBuilder, cap: &str) -> Slice {
    let host = builder.build().expect("fake host");
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("test.ledger");
    Slice {
        _beside_others: crate::beside_others(),
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
    crate::succeeded(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn n(v: &Value, k: &str) -> i64 {
    v[k].as_i64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// The integers of the client's array field `k`.
fn integers(v: &Value, k: &str) -> Vec<i64> {
    v[k].as_array()
        .unwrap_or_else(|| panic!("{k} in {v}"))
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// A client step's `[ledger, NVML]` pair: what the slice is charged and
/// what the driver holds for the process at that step.
fn charged_and_held(v: &Value, k: &str) -> (u64, u64) {
    let pair = |i: usize| {
        v[k][i]
            .as_u64()
            .unwrap_or_else(|| panic!("{k}[{i}] in {v}"))
    };
    (pair(0), pair(1))
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
        // The pool's reserve, grown in 32 MiB steps.
        exact("cuMemAllocAsync", POOL_STEP);
        exact("cuMemAllocAsync_ptsz", POOL_STEP);
        exact("cuMemAllocFromPoolAsync", POOL_STEP);
        exact("cuMemCreate", 4 * MIB);
        // Whole 2 MiB pages, as the driver backs plain arrays.
        exact("cuArrayCreate", 4 * MIB);
        exact("cuArray3DCreate", 4 * MIB);
        // (4096 + 1024 + 256 + 64) KiB over four levels.
        exact("cuMipmappedArrayCreate", 6 * MIB);
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
        assert_eq!(n(o, "charged"), POOL_STEP as i64, "{via}: {o}");
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

/// The 32-bit ABI's `cuMemGetInfo` and `cuDeviceTotalMem` show the cap as
/// the 64-bit calls do, clamped to what 32 bits hold (the fake GPU's
/// memory is larger than that).
#[test]
fn the_32_bit_mem_info_and_total_show_the_cap_clamped_to_32_bits() {
    for (cap, shown) in [("100MiB", 100 * MIB), ("8GiB", u64::from(u32::MAX))] {
        let s = slice(cap);
        for via in ["dlsym", "global"] {
            let v = &s.run(&["--via", via, "info-32"])[0];
            assert_eq!((n(v, "rc"), n(v, "rc_total")), (0, 0), "{v}");
            for k in ["total", "free", "device_total"] {
                assert_eq!(n(v, k) as u64, shown, "{cap} {via} {k}: {v}");
            }
        }
    }
}

#[test]
fn two_processes_share_one_cap() {
    let s = slice("100MiB");
    let mut holder = spawn_until(&mut s.client(&["hold", &(60 * MIB).to_string()]), "held 0");
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
    assert!(!v["file"].as_str().unwrap().is_empty(), "{v}");
    crate::defined_in(v)
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

// ------------------------------------------------------------ physical cap

const CTX: u64 = 96 * MIB;
const MODULE: u64 = 8 * MIB;

fn physical_slice(cap: &str) -> Slice {
    slice_on(
        FakeHost::builder()
            .gpus(2)
            .ctx_bytes(CTX)
            .module_bytes(MODULE),
        cap,
    )
}

#[test]
fn contexts_modules_and_limits_are_charged_as_the_driver_holds_them() {
    let s = physical_slice("1GiB");
    for via in ["dlsym", "procaddr", "global"] {
        let v = &s.run(&["--via", via, "resident"])[0];
        // The context as NVML measures it (the estimate is settled by the
        // first memory query), not 0 and not the 1 GiB estimate.
        assert_eq!(n(v, "context") as u64, CTX, "{via}: {v}");
        assert_eq!(n(v, "rc_load"), 0, "{via}: {v}");
        assert_eq!(n(v, "module") as u64, MODULE, "{via}: {v}");
        // 64 MiB of heap over the default 8 MiB the context holds.
        assert_eq!(n(v, "rc_heap"), 0, "{via}: {v}");
        assert_eq!(n(v, "heap") as u64, 56 * MIB, "{via}: {v}");
        assert_eq!(
            n(v, "total") as u64,
            1 << 30,
            "{via}: total is the cap: {v}"
        );
        assert_eq!(n(v, "after_unload") as u64, 56 * MIB, "{via}: {v}");
        assert_eq!(n(v, "after_heap_back"), 0, "{via}: {v}");
    }
    assert_eq!(s.ledger().used(0), 0, "all released at exit");
}

#[test]
fn context_bytes_overrides_the_measurement() {
    let s = physical_slice("1GiB");
    let out = s
        .client(&["resident"])
        .env("GPUSLICE_CONTEXT_BYTES", "300MiB")
        .output()
        .unwrap();
    let v = &lines(&out)[0];
    assert_eq!(n(v, "context") as u64, 300 * MIB, "{v}");
}

#[test]
fn a_context_that_does_not_fit_is_refused() {
    // 150 MiB: the 96 MiB context fits only once measured (the 1 GiB
    // estimate does not); beside 146 MiB a second one does not.
    let s = physical_slice("150MiB");
    let first = hold(&s, 50 * MIB);
    assert_eq!(first.1, (0, 0), "the first process fits");
    // A second context (96 MiB) does not fit beside 146 MiB.
    let second = hold(&s, MIB);
    assert_eq!(second.1 .0, 2, "context refused with OUT_OF_MEMORY");
    let sum = nvml_sum(&s);
    assert!(sum <= 150 * MIB, "physical {sum} over the cap");
    drop((first, second));
}

/// A child killed when dropped (a failed assertion leaves no holder behind).
struct Held(std::process::Child);

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `hold-soft BYTES`: (child, (context rc, alloc rc)), once the
/// slice's charge has settled (the context is measured in the background
/// after its estimate is reserved).
fn hold(s: &Slice, bytes: u64) -> (Held, (i64, i64)) {
    let mut c = s
        .client(&["hold-soft", &bytes.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{line}: {e}"));
    let c = Held(c);
    // Wait for the background measurement: the ledger then holds what
    // NVML counts for the slice's processes.
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while s.ledger().used(0) > nvml_sum(s) && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (c, (n(&v, "ctx"), n(&v, "alloc")))
}

/// What the host's NVML sums over the processes on GPU 0.
fn nvml_sum(s: &Slice) -> u64 {
    let out = s
        .host
        .command(gpuslice_testkit::shim_client())
        .arg("nvml-procs")
        .output()
        .unwrap();
    n(&lines(&out)[0], "sum") as u64
}

#[test]
fn several_processes_in_one_slice_stay_within_the_cap_in_physical_memory() {
    // Each process: a 96 MiB context and a 200 MiB allocation (296 MiB);
    // a 1000 MiB cap holds three, and a fourth's context (888 + 96 = 984)
    // but not its allocation; a fifth gets no context.
    for procs in [1usize, 2, 5, 8] {
        let s = physical_slice("1000MiB");
        let held: Vec<_> = (0..procs).map(|_| hold(&s, 200 * MIB)).collect();
        let ok = held.iter().filter(|h| h.1 == (0, 0)).count();
        let sum = nvml_sum(&s);
        assert!(
            sum <= 1000 * MIB,
            "{procs} processes: physical {} MiB over the 1000 MiB cap: {:?}",
            sum / MIB,
            held.iter().map(|h| h.1).collect::<Vec<_>>()
        );
        assert_eq!(ok, procs.min(3), "{procs} processes");
        if procs >= 4 {
            assert_eq!(held[3].1, (0, 2), "the fourth's allocation is refused");
        }
        if procs >= 5 {
            assert_eq!(held[4].1 .0, 2, "the fifth's context is refused");
        }
    }
}

#[test]
fn every_process_charges_its_own_context() {
    // Each process of the slice holds its own context: the ledger holds at
    // least what NVML sums over them.
    let s = physical_slice("1GiB");
    let a = hold(&s, 10 * MIB);
    let b = hold(&s, 10 * MIB);
    assert_eq!((a.1, b.1), ((0, 0), (0, 0)));
    assert_eq!(s.ledger().used(0), 2 * (CTX + 10 * MIB));
    assert_eq!(nvml_sum(&s), 2 * (CTX + 10 * MIB));
}

#[test]
fn a_forked_child_s_exit_keeps_the_parent_s_charges() {
    let s = slice("1GiB");
    let v = &s.run(&["fork", &(30 * MIB).to_string()])[0];
    assert_eq!(n(v, "rc"), 0, "{v}");
    assert_eq!(n(v, "child_status"), 0, "{v}");
    assert!(n(v, "before") as u64 >= 30 * MIB, "{v}");
    assert_eq!(
        n(v, "after_child"),
        n(v, "before"),
        "the child released the parent's bytes: {v}"
    );
    assert_eq!(s.ledger().used(0), 0, "all released at the parent's exit");
}

#[test]
fn two_devices_are_charged_and_capped_each_on_its_own() {
    let s = physical_slice("1GiB");
    let both = format!("{},{}", s.host.gpus()[0].uuid, s.host.gpus()[1].uuid);
    let run = |b0: u64, b1: u64| {
        let out = s
            .client(&["two-devices", &b0.to_string(), &b1.to_string()])
            .env("CUDA_VISIBLE_DEVICES", &both)
            .output()
            .unwrap();
        lines(&out)[0].clone()
    };
    // Each device: its own context (as NVML measures it) and allocation.
    let v = run(100 * MIB, 300 * MIB);
    assert_eq!((n(&v, "rc0"), n(&v, "rc1")), (0, 0), "{v}");
    assert_eq!(n(&v, "used0") as u64, CTX + 100 * MIB, "{v}");
    assert_eq!(n(&v, "used1") as u64, CTX + 300 * MIB, "{v}");
    assert_eq!(n(&v, "free1") as u64, (1 << 30) - CTX - 300 * MIB, "{v}");
    // Device 1's cap is its own: what device 0 holds does not count there,
    // and an allocation over it on device 1 is refused.
    let v = run(800 * MIB, 1000 * MIB);
    assert_eq!(n(&v, "rc0"), 0, "{v}");
    assert_eq!(n(&v, "rc1"), 2, "over device 1's cap: {v}");
    assert_eq!(n(&v, "used1") as u64, CTX, "{v}");
    assert_eq!((s.ledger().used(0), s.ledger().used(1)), (0, 0));
}

#[test]
fn a_handle_released_while_mapped_stays_charged_until_its_last_unmap() {
    // The driver holds the memory until the unmap, and the charge follows it.
    let size = (64 * MIB).to_string();
    charge_follows_the_driver(
        &["dlsym", "procaddr"],
        |via| vec!["--via", via, "vmm-mapped", size.as_str()],
        &[
            "rc_create",
            "rc_reserve",
            "rc_map",
            "rc_release",
            "rc_unmap",
        ],
        [
            ("mapped", ""),
            ("released", "released while mapped"),
            ("unmapped", "after the last unmap"),
        ],
    );
}

/// In a 1 GiB physical slice, the client run `args(case)` for each case
/// reports every `rcs` field 0, and [ledger, NVML] at its three `steps`
/// are: the context and 64 MiB at the first, the same at the second (the
/// driver still holds the memory), the context alone at the third. Each
/// step's text names it in a failure.
fn charge_follows_the_driver<'a>(
    cases: &[&'a str],
    args: impl Fn(&'a str) -> Vec<&'a str>,
    rcs: &[&str],
    steps: [(&str, &str); 3],
) {
    let s = physical_slice("1GiB");
    for &case in cases {
        let v = &s.run(&args(case))[0];
        for rc in rcs {
            assert_eq!(n(v, rc), 0, "{case} {rc}: {v}");
        }
        let [(held, _), (kept, kept_why), (gone, gone_why)] = steps;
        let held = charged_and_held(v, held);
        assert_eq!(held, (CTX + 64 * MIB, CTX + 64 * MIB), "{case}: {v}");
        assert_eq!(charged_and_held(v, kept), held, "{case}: {kept_why}: {v}");
        assert_eq!(
            charged_and_held(v, gone),
            (CTX, CTX),
            "{case}: {gone_why}: {v}"
        );
    }
    assert_eq!(s.ledger().used(0), 0);
}

/// The first line of the client run `args` in a 1 GiB physical slice that
/// sees both GPUs (device 0 current).
fn on_both_devices(args: &[&str]) -> Value {
    let s = physical_slice("1GiB");
    let both = format!("{},{}", s.host.gpus()[0].uuid, s.host.gpus()[1].uuid);
    let out = s
        .client(args)
        .env("CUDA_VISIBLE_DEVICES", &both)
        .output()
        .unwrap();
    lines(&out).swap_remove(0)
}

#[test]
fn a_stream_ordered_allocation_is_charged_to_the_stream_s_device() {
    let v = &on_both_devices(&["async-device", &(10 * MIB).to_string()]);
    assert_eq!(n(v, "rc"), 0, "{v}");
    // The driver takes it from device 1's pool (a reserve grown in 32 MiB
    // steps), though device 0's context is current.
    assert_eq!(
        n(v, "used0"),
        n(v, "before0"),
        "charged to the current device: {v}"
    );
    assert_eq!(n(v, "used1") - n(v, "before1"), POOL_STEP as i64, "{v}");
}

#[test]
fn a_pool_s_allocations_are_charged_where_the_pool_s_memory_is() {
    let v = &on_both_devices(&["pool-location", &(10 * MIB).to_string()]);
    let at = |k: &str| integers(v, k);
    // [rc, change on device 0, change on device 1], device 0 current; the
    // pools reserve in 32 MiB steps.
    let step = POOL_STEP as i64;
    assert_eq!(at("device1"), [0, 0, step], "the pool's device: {v}");
    assert_eq!(at("host"), [0, 0, 0], "host memory is not the GPU's: {v}");
    assert_eq!(
        at("managed"),
        [0, 0, step],
        "managed memory, charged where it is (as cuMemAllocManaged's): {v}"
    );
    assert_eq!(
        at("default1"),
        [0, 0, step],
        "device 1's default pool, from device 0: {v}"
    );
}

#[test]
fn a_slice_whose_host_pid_resolver_does_not_answer_keeps_the_estimates() {
    // The resolver's socket is at the fixed place but nobody listens (a
    // launcher gone, a device plugin restarted): the shim must not fall
    // back to a pid it cannot trust; the context stays charged its
    // estimate (1 GiB, not the 96 MiB NVML would show) and the process
    // runs on. Built in a private mount namespace: the host's /run is
    // untouched.
    let s = physical_slice("2GiB");
    let dead = s._dir.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    let script = format!(
        "mount -t tmpfs none /run && mkdir -p /run/gpuslice/slice && \
         touch /run/gpuslice/slice/hostpid && \
         mount --bind {} /run/gpuslice/slice/hostpid && exec \"$@\"",
        dead.display()
    );
    let inner = s.client(&["resident"]);
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"])
        .arg(gpuslice_testkit::shim_client())
        .arg("resident");
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let out = c.env("GPUSLICE_LOG", "1").output().unwrap();
    let v = &lines(&out)[0];
    assert_eq!(n(v, "context") as u64, 1024 * MIB, "{v}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("host pid resolver"), "{err}");
}

#[test]
fn a_pool_destroyed_with_allocations_outstanding_stays_charged_until_they_are_freed() {
    // The driver keeps a destroyed pool's memory while an allocation from
    // it is outstanding, and the charge follows it.
    let size = (64 * MIB).to_string();
    charge_follows_the_driver(
        &["cuMemFreeAsync", "cuMemFree"],
        |free| vec!["pool-destroy", size.as_str(), free],
        &["rc_create", "rc_alloc", "rc_destroy", "rc_free"],
        [
            ("allocated", ""),
            ("destroyed", "released at the destroy"),
            ("freed", "after the last free"),
        ],
    );
}

/// A stream-ordered pool grows by whole steps (32 MiB on the H200), more
/// than a small allocation asks for: filled with 16 MiB allocations up to a
/// cap that ends half a step above a step boundary, the pool must stop
/// below the cap as NVML counts it, not one step over. With a driver whose
/// step is larger than the shim expects (`FAKEGPU_POOL_STEP`, 96 MiB), the
/// growth that does not fit is taken back and refused.
#[test]
fn a_stream_ordered_pool_stays_within_the_cap_in_physical_memory() {
    // 96 MiB context + 29 steps of 32 MiB + 16 MiB.
    let cap = CTX + 29 * POOL_STEP + 16 * MIB;
    let s = physical_slice(&format!("{}MiB", cap / MIB));
    for step in [None, Some(96 * MIB)] {
        let mut c = s.client(&["fill", &(16 * MIB).to_string(), "async"]);
        if let Some(step) = step {
            c.env("FAKEGPU_POOL_STEP", step.to_string());
        }
        let v = &lines(&c.output().unwrap())[0];
        assert_eq!(n(v, "fail_rc"), 2, "ends refused: {step:?} {v}");
        let (ledger, nvml) = (n(v, "ledger_full") as u64, n(v, "nvml_full") as u64);
        assert!(nvml <= cap, "NVML {nvml} > cap {cap}: {step:?} {v}");
        assert_eq!(
            ledger, nvml,
            "the ledger is what the driver holds: {step:?} {v}"
        );
        let want = match step {
            None => 29 * 2,
            // Steps of 96 MiB: 9 fit (864 MiB), 6 allocations each.
            Some(_) => 9 * 6,
        };
        assert_eq!(n(v, "count"), want, "{step:?} {v}");
    }
    assert_eq!(s.ledger().used(0), 0);
}

/// `dlvsym` is a lookup the shim does not interpose: it must not hand a
/// program the driver's own allocation functions around the cap. The
/// driver's libraries define no symbol versions (the H200's libcuda 580
/// neither: PART memphys `dlvsym`), and glibc's `dlvsym` asks for a
/// version, so it finds none of their functions, in the library's handle
/// or in the global scope; should it ever find one, it must be the shim's.
#[test]
fn dlvsym_never_hands_out_the_driver_s_own_allocation_functions() {
    let s = slice("1GiB");
    let names = [
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemAllocAsync",
        "cuMemCreate",
        "cuGetProcAddress_v2",
        "cuDeviceTotalMem_v2",
    ];
    for via in ["dlsym", "global"] {
        let mut args = vec!["--via", via, "dlvsym"];
        args.extend(names);
        let results = s.run(&args);
        assert_eq!(results.len(), names.len() * 2 * 4, "{via}: {results:?}");
        for v in &results {
            let file = v["file"].as_str().unwrap();
            let base = Path::new(file).file_name().and_then(|f| f.to_str());
            assert!(
                file.is_empty() || base == Some(SHIM_FILE),
                "{via}: dlvsym reached the driver: {v}"
            );
        }
    }
}

/// A context limit that makes the driver hold more than the cap leaves
/// (a 2 GiB malloc heap in a 1 GiB slice) is refused with OUT_OF_MEMORY,
/// the previous value is put back, and the driver holds nothing more.
#[test]
fn a_context_limit_past_the_cap_is_refused_and_undone() {
    let s = physical_slice("1GiB");
    // CU_LIMIT_MALLOC_HEAP_SIZE = 2; the default heap is 8 MiB.
    let v = &s.run(&["set-limit", "2", &(2048 * MIB).to_string()])[0];
    assert_eq!(n(v, "rc"), 2, "{v}");
    assert_eq!(n(v, "rc_get"), 0, "{v}");
    assert_eq!(n(v, "limit") as u64, 8 * MIB, "the previous value: {v}");
    assert_eq!(v["after"], v["before"], "[ledger, NVML] unchanged: {v}");
    let v = &s.run(&["set-limit", "2", &(256 * MIB).to_string()])[0];
    assert_eq!(n(v, "rc"), 0, "within the cap: {v}");
    let grew = |i: usize| v["after"][i].as_u64().unwrap() - v["before"][i].as_u64().unwrap();
    assert_eq!((grew(0), grew(1)), (248 * MIB, 248 * MIB), "{v}");
}

/// Arrays are charged what the driver backs them with, as the H200 showed:
/// a plain array whole 2 MiB pages (a 256 KiB one takes 2 MiB, and the
/// driver reports no memory requirements for it), a deferred-mapping one
/// nothing (the memory mapped into it is a `cuMemCreate` handle's, charged
/// there).
#[test]
fn arrays_are_charged_what_the_driver_backs_them_with() {
    let s = physical_slice("1GiB");
    let v = &s.run(&["arrays"])[0];
    let at = |k: &str| integers(v, k);
    // [rc, ledger change, NVML change].
    let two = 2 * MIB as i64;
    assert_eq!(at("small_1d"), [0, two, two], "{v}");
    assert_eq!(at("deferred_2d"), [0, 0, 0], "{v}");
    assert_eq!(at("deferred_mipmapped"), [0, 0, 0], "{v}");
}
