//! The compute share against the fake driver, whose kernels "run" for a
//! simulated time on a per-process GPU timeline: the achieved share of
//! simulated GPU busy time over wall time converges to the target for
//! every launch path, graph launches are metered, the processes of a slice
//! share one budget, and without a share the driver's own launch functions
//! are handed out.
//!
//! Needs the fake driver, the shim and the test client built (`cargo build
//! -p fakegpu-driver -p gpuslice-shim -p gpuslice-testkit`), as the
//! workspace test script does.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use fakegpu::FakeHost;
use gpuslice_ledger::Ledger;
use gpuslice_testkit::{shim_so, SHIM_FILE};
use serde_json::Value;

/// Simulated kernel time: 200 µs.
const KERNEL_NS: &str = "200000";
const SECONDS: &str = "1.6";
const WARMUP: &str = "0.4";

struct Slice {
    host: FakeHost,
    dir: tempfile::TempDir,
}

impl Slice {
    fn new() -> Slice {
        Slice {
            host: FakeHost::builder().gpus(1).build().expect("fake host"),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn boards(&self) -> PathBuf {
        self.dir.path().join("boards")
    }

    fn ledger_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.ledger"))
    }

    /// A client of slice `name` with compute share `pct` (None: no share).
    fn client(&self, name: &str, pct: Option<&str>, args: &[&str]) -> Command {
        let mut c = self.host.command(gpuslice_testkit::shim_client());
        c.args(args)
            .env("LD_PRELOAD", shim_so())
            .env("GPUSLICE_LEDGER", self.ledger_path(name))
            .env("GPUSLICE_SLICE", name)
            .env("CUDA_VISIBLE_DEVICES", &self.host.gpus()[0].uuid)
            .env("GPUSLICE_BOARD_DIR", self.boards())
            .env_remove("GPUSLICE_COMPUTE_MODE")
            .env_remove("GPUSLICE_MEMORY_LIMIT")
            .env_remove("GPUSLICE_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match pct {
            Some(p) => c.env("GPUSLICE_COMPUTE_LIMIT", p),
            None => c.env_remove("GPUSLICE_COMPUTE_LIMIT"),
        };
        c
    }
}

fn result(out: Output) -> Value {
    let text = crate::succeeded(&out);
    let last = text.lines().last().expect("a result line");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{last}: {e}"))
}

fn share(v: &Value) -> f64 {
    v["share"].as_str().map_or_else(
        || v["share"].as_f64().expect("share"),
        |s| s.parse().unwrap(),
    ) * 100.0
}

fn spawn(mut c: impl std::borrow::BorrowMut<Command>) -> Child {
    c.borrow_mut().spawn().expect("spawn client")
}

#[test]
fn the_share_converges_to_the_target_on_every_launch_path() {
    let _alone = crate::alone();
    let s = Slice::new();
    // (target %, --via, mode): every launch entry point, each lookup path.
    let cases = [
        ("10", "dlsym", "kernel"),
        ("30", "procaddr", "ex"),
        ("50", "procaddr", "coop"),
        ("70", "procaddr", "ptsz"),
        // 75, not 90: at 90 % the client's own wake-ups decide (the gate
        // sleeps between grants, and on a loaded or stolen-from VM the
        // fake GPU then idled: 77-86 % in CI runs of this and of earlier,
        // passing commits), which is not what this test is about.
        ("75", "global", "kernel"),
    ];
    // Two clients at a time: each must keep its fake GPU fed from the CPU,
    // and five at once on a 2-core CI machine starved the 90 % one (it
    // reached 85-86 %: the CPU's shortfall, not the meter's).
    let mut report = Vec::new();
    for wave in cases.chunks(2) {
        let children: Vec<(String, Child)> = wave
            .iter()
            .map(|(pct, via, mode)| {
                let name = format!("t{pct}");
                let mut c = s.client(
                    &name,
                    Some(pct),
                    &["--via", via, "compute", mode, KERNEL_NS, SECONDS, WARMUP],
                );
                // Each case on a board of its own, as if on a GPU of its own:
                // together the shares are 250 % of the one fake GPU, which
                // slices that see each other would split in proportion
                // (oversubscribed_caps_keep_their_proportions).
                c.env(
                    "GPUSLICE_BOARD_DIR",
                    s.dir.path().join(format!("boards-{name}")),
                );
                let child = spawn(c);
                (format!("{pct}% {via} {mode}"), child)
            })
            .collect();
        for ((what, child), (pct, _, _)) in children.into_iter().zip(wave) {
            let v = result(child.wait_with_output().unwrap());
            let got = share(&v);
            let target: f64 = pct.parse().unwrap();
            report.push(format!("{what}: {got:.1}% ({v})"));
            assert!(
                (got - target).abs() <= 3.0,
                "{what}: achieved {got:.1}%\n{}",
                report.join("\n")
            );
        }
    }
    // The ledger shows the share, the GPU time and the throttling.
    let l = Ledger::open(&s.ledger_path("t30")).unwrap();
    let c = &l.snapshot().compute[0];
    assert_eq!(c.share_bp, Some(3000));
    assert!(c.busy_ns > 400_000_000, "{c:?}");
    assert!(
        c.throttled_ns > 500_000_000 && c.delayed_launches > 0,
        "{c:?}"
    );
    eprintln!("{}", report.join("\n"));
}

/// Runs one client of slice `name` at `pct` % with kernels of `kernel_ns`
/// for 0.5 s after 0.1 s of warm-up; returns its result line and the GPU
/// time its slice's ledger holds.
fn metered_run(s: &Slice, name: &str, pct: &str, kernel_ns: &str) -> (Value, f64) {
    let v = result(
        s.client(
            name,
            Some(pct),
            &[
                "--via", "procaddr", "compute", "kernel", kernel_ns, "0.5", "0.1",
            ],
        )
        .output()
        .unwrap(),
    );
    let l = Ledger::open(&s.ledger_path(name)).unwrap();
    let charged = l.snapshot().compute[0].busy_ns as f64;
    (v, charged)
}

fn events_per_launch(v: &Value) -> f64 {
    v["event_records"].as_f64().unwrap() / v["launches"].as_f64().unwrap()
}

#[test]
fn a_busy_stream_pays_one_event_per_launch() {
    let _alone = crate::alone();
    // The client waits for the GPU after every 8 launches: the first
    // launch after each wait needs an event before it; the 200 µs kernels
    // fill a group each, measured from the event after the launch before.
    let s = Slice::new();
    let (v, charged) = metered_run(&s, "busy", "100", KERNEL_NS);
    let per = events_per_launch(&v);
    assert!(
        (1.0..=1.2).contains(&per),
        "events per launch {per:.3} ({v}); a pair each would be 2"
    );
    // And the GPU time is still measured right: the slice's ledger holds
    // the window's GPU time, plus at most the warm-up's.
    let busy = v["busy_ns"].as_f64().unwrap();
    assert!(
        charged >= busy * 0.99 && charged <= busy + 0.1e9 + 5e6,
        "ledger {charged} ns for {busy} ns of GPU time in the window ({v})"
    );
}

#[test]
fn short_kernels_on_a_busy_stream_share_their_events() {
    let _alone = crate::alone();
    // 20 µs kernels, 8 between waits: the first one gets a pair of
    // events, the others join one group closed by one event.
    let s = Slice::new();
    let (v, charged) = metered_run(&s, "short", "100", "20000");
    let per = events_per_launch(&v);
    assert!(
        per <= 0.5,
        "events per launch {per:.3} ({v}); one each would be 1"
    );
    eprintln!("short kernels at 100 %: {per:.3} events per launch");
    let busy = v["busy_ns"].as_f64().unwrap();
    assert!(
        charged >= busy * 0.97 && charged <= busy * 1.03 + 0.1e9,
        "ledger {charged} ns for {busy} ns of GPU time in the window ({v})"
    );
    // Grouped, they are still held to a share.
    let (v, _) = metered_run(&s, "short40", "40", "20000");
    let got = share(&v);
    assert!(
        (got - 40.0).abs() <= 3.0,
        "20 µs kernels at 40 %: {got:.1}% ({v})"
    );
    // Throttled, they are released a group's worth at a time (observed
    // 0.43 events per launch; one at a time would be 2).
    assert!(events_per_launch(&v) <= 0.7, "{v}");
    eprintln!("short kernels at 40 %: {v}");
}

#[test]
fn graph_launches_are_metered() {
    let _alone = crate::alone();
    let s = Slice::new();
    let run = |pct: Option<&str>, name: &str| {
        let mut c = s.client(
            name,
            pct,
            &[
                "--via", "procaddr", "compute", "graph", "0", SECONDS, WARMUP,
            ],
        );
        c.env("FAKEGPU_GRAPH_NS", "500000");
        spawn(&mut c)
    };
    let limited = run(Some("40"), "g40");
    let free = run(None, "gfree");
    let got = share(&result(limited.wait_with_output().unwrap()));
    let unlimited = share(&result(free.wait_with_output().unwrap()));
    assert!((got - 40.0).abs() <= 3.0, "graph at 40%: {got:.1}%");
    assert!(unlimited > 90.0, "graph without a share: {unlimited:.1}%");
}

#[test]
fn the_processes_of_a_slice_share_one_budget() {
    let _alone = crate::alone();
    let s = Slice::new();
    let children: Vec<Child> = (0..3)
        .map(|_| {
            spawn(s.client(
                "shared",
                Some("60"),
                &[
                    "--via", "procaddr", "compute", "kernel", KERNEL_NS, SECONDS, WARMUP,
                ],
            ))
        })
        .collect();
    let shares: Vec<f64> = children
        .into_iter()
        .map(|c| share(&result(c.wait_with_output().unwrap())))
        .collect();
    let total: f64 = shares.iter().sum();
    eprintln!("three processes at one 60% budget: {shares:?} = {total:.1}%");
    assert!(
        (total - 60.0).abs() <= 4.0,
        "three processes at one 60% budget: {shares:?} = {total:.1}%"
    );
    // First come, first served within the slice: each gets about a third.
    for s in &shares {
        assert!(
            (s - 20.0).abs() <= 4.0,
            "each process gets about a third of the budget: {shares:?}"
        );
    }
}

fn defining_file(c: &mut Command) -> String {
    crate::defined_in(&result(c.output().unwrap()))
}

#[test]
fn without_a_share_the_driver_s_own_launch_functions_are_handed_out() {
    let _alone = crate::alone();
    let s = Slice::new();
    for (via, name) in [
        ("procaddr", "cuLaunchKernel"),
        ("procaddr", "cuLaunchKernel_ptsz"),
        ("dlsym", "cuLaunchKernelEx"),
        ("procaddr", "cuLaunchCooperativeKernel"),
        ("procaddr", "cuGraphLaunch"),
    ] {
        // A memory cap alone does not interpose launches.
        let mut mem_only = s.client("m", None, &["--via", via, "addr", name]);
        mem_only.env("GPUSLICE_MEMORY_LIMIT", "1GiB");
        let got = defining_file(&mut mem_only);
        if name == "cuGraphLaunch" {
            // Graph launches settle graph memory under a memory cap.
            assert_eq!(got, SHIM_FILE, "{via} {name}");
        } else {
            assert_ne!(got, SHIM_FILE, "{via} {name} with a memory cap only");
        }
        let none = defining_file(&mut s.client("n", None, &["--via", via, "addr", name]));
        assert_ne!(none, SHIM_FILE, "{via} {name} with no limit");
        let limited = defining_file(&mut s.client("c", Some("50"), &["--via", via, "addr", name]));
        assert_eq!(limited, SHIM_FILE, "{via} {name} with a compute share");
    }
}

/// Runs `(slice, share %, mode)` clients side by side on the one fake GPU
/// (kernels of 200 µs) and returns each one's achieved share.
fn side_by_side(s: &Slice, clients: &[(&str, &str, &str)]) -> Vec<f64> {
    side_by_side_with(s, clients, KERNEL_NS, SECONDS, |_| {})
}

/// [`side_by_side`] with kernels of `kernel_ns`, measured over `seconds`,
/// and `setup` applied to every client.
fn side_by_side_with(
    s: &Slice,
    clients: &[(&str, &str, &str)],
    kernel_ns: &str,
    seconds: &str,
    setup: impl Fn(&mut Command),
) -> Vec<f64> {
    let children: Vec<Child> = clients
        .iter()
        .map(|(name, pct, mode)| {
            let mut c = s.client(
                name,
                Some(pct),
                &[
                    "--via", "procaddr", "compute", "kernel", kernel_ns, seconds, WARMUP,
                ],
            );
            c.env("GPUSLICE_COMPUTE_MODE", mode);
            setup(&mut c);
            spawn(c)
        })
        .collect();
    children
        .into_iter()
        .map(|c| share(&result(c.wait_with_output().unwrap())))
        .collect()
}

#[test]
fn a_guaranteed_share_borrows_idle_time_and_gives_it_back() {
    let _alone = crate::alone();
    // Alone, a guaranteed 30 % may use all but the 5 % margin.
    let alone = side_by_side(&Slice::new(), &[("g", "30", "guaranteed")]);
    assert!(alone[0] > 75.0, "guaranteed 30% alone: {alone:?}");
    // The same slice as a hard cap stays at 30 %.
    let capped = side_by_side(&Slice::new(), &[("c", "30", "cap")]);
    assert!((capped[0] - 30.0).abs() <= 3.0, "cap 30% alone: {capped:?}");
    // Beside a busy capped 50 %: that slice keeps its 50 %, the borrower
    // takes what is left (100 - 50 - 5).
    let pair = side_by_side(
        &Slice::new(),
        &[("g", "30", "guaranteed"), ("b", "50", "cap")],
    );
    assert!((pair[1] - 50.0).abs() <= 3.0, "the capped slice: {pair:?}");
    // It borrows clearly beyond its 30 % (observed 42-44 %; 45 % is all
    // but the margin) and never into the capped slice's 50 %.
    assert!(pair[0] > 36.0 && pair[0] <= 50.0, "the borrower: {pair:?}");
    // Two borrowers, 30 and 60: each keeps its guarantee, and together
    // they leave the margin. (Each has a fake GPU of its own: turns off,
    // as they would only idle one GPU while the other runs.)
    let two = side_by_side_with(
        &Slice::new(),
        &[("g1", "30", "guaranteed"), ("g2", "60", "guaranteed")],
        KERNEL_NS,
        SECONDS,
        |c| {
            c.env("GPUSLICE_COMPUTE_HANDOVER", "off");
        },
    );
    assert!(two[0] >= 28.0 && two[1] >= 58.0, "guarantees: {two:?}");
    assert!(two[0] + two[1] <= 97.0, "sum: {two:?}");
    eprintln!("alone {alone:?} capped {capped:?} pair {pair:?} two {two:?}");
}

#[test]
fn oversubscribed_caps_keep_their_proportions() {
    let _alone = crate::alone();
    // 40 + 80 asks for 120 % of the GPU: each slice gets 100/120 of its
    // share, 33 and 67. Each process has a fake GPU of its own here, so
    // turns would only idle one while the other runs: off, the scaling
    // alone shows.
    let no_turns = |c: &mut Command| {
        c.env("GPUSLICE_COMPUTE_HANDOVER", "off");
    };
    let pair = |a: &str, b: &str| {
        side_by_side_with(
            &Slice::new(),
            &[("a", a, "cap"), ("b", b, "cap")],
            KERNEL_NS,
            SECONDS,
            no_turns,
        )
    };
    let both = pair("40", "80");
    assert!((both[0] - 33.3).abs() <= 2.0, "{both:?}");
    assert!((both[1] - 66.7).abs() <= 3.0, "{both:?}");
    let ratio = both[0] / both[1] / 0.5;
    assert!(
        (ratio - 1.0).abs() <= 0.08,
        "ratio {ratio:.3} of 1:2: {both:?}"
    );
    // 30 + 70 is the whole GPU, no more: nobody is scaled (before the
    // slices took turns, a 90 % capacity made it 27/63).
    let fits = pair("30", "70");
    assert!(
        (fits[0] - 30.0).abs() <= 2.0 && (fits[1] - 70.0).abs() <= 3.0,
        "{fits:?}"
    );
    eprintln!("40/80 {both:?} 30/70 {fits:?}");
}

#[test]
fn idle_time_is_not_charged_when_another_thread_keeps_the_stream_busy() {
    let _alone = crate::alone();
    // Each round one thread leaves a group of short kernels open and goes
    // idle for 5 ms; another thread's 2 ms kernel then keeps the stream
    // busy while the first thread launches again. The stream being busy
    // says nothing about the first thread's group, which ran dry long ago:
    // joining it would charge the 5 ms idle and the other thread's kernel
    // once more (~7 ms a round on top of ~2.2 ms of GPU work).
    let s = Slice::new();
    let v = result(
        s.client(
            "shared",
            Some("100"),
            &["--via", "procaddr", "shared-stream", "40000", "20"],
        )
        .output()
        .unwrap(),
    );
    let busy = v["busy_ns"].as_f64().unwrap();
    let l = Ledger::open(&s.ledger_path("shared")).unwrap();
    let charged = l.snapshot().compute[0].busy_ns as f64;
    assert!(busy > 20.0 * 2.1e6, "{v}");
    assert!(
        (charged - busy).abs() <= busy * 0.05,
        "ledger {charged} ns for {busy} ns of GPU time ({v})"
    );
}

/// Two slices of long kernels on one GPU. The fake GPU here is
/// one engine for both processes (`FAKEGPU_ENGINE`), as a real GPU
/// without MPS runs one context at a time: an event pair around a launch
/// then spans whatever the other slice ran in between, and without turns
/// the slice charged for it falls far below its share. Taking turns
/// (crate::turns) leaves each slice's events timing its own work: the
/// pair holds 30/70 (the GPU busy all the time), within 5 % of 3:7 even
/// on a loaded machine.
#[test]
fn slices_take_turns_so_each_is_charged_its_own_work() {
    let _alone = crate::alone();
    // 1.5 ms kernels: an 8192^2 bf16 GEMM on the H200. Twice the other
    // tests' window: the 30 % slice runs only ~300 of them in 1.6 s, and
    // a loaded CI machine once left one window 5.1 % off.
    const LONG_NS: &str = "1500000";
    let pair = |handover: bool| {
        let s = Slice::new();
        let engine = s.dir.path().join("engine");
        side_by_side_with(
            &s,
            &[("a", "30", "cap"), ("b", "70", "cap")],
            LONG_NS,
            "3.2",
            |c| {
                c.env("FAKEGPU_ENGINE", &engine);
                if !handover {
                    c.env("GPUSLICE_COMPUTE_HANDOVER", "off");
                }
            },
        )
    };
    let off_by = |p: &[f64]| (p[0] / p[1] / (3.0 / 7.0) - 1.0).abs();
    let turns = pair(true);
    let without = pair(false);
    eprintln!("with turns {turns:?}, without {without:?}");
    // A few points less than 30/70 on a loaded 2-core CI machine (the
    // fake GPU is fed from the CPU, and the 70 % slice, fed most, loses
    // most): the ratio holds within a few percent either way.
    assert!(
        off_by(&turns) <= 0.07,
        "with turns: {turns:?} is {:.1} % off 3:7",
        off_by(&turns) * 100.0
    );
    // The test can fail: on the shared engine, without turns, the 70 %
    // slice is charged for the other's work and falls far below its share
    // (51-53 % observed); with turns it gets that time back.
    assert!(
        turns[1] - without[1] >= 4.0,
        "the 70 % slice got {turns:?} with turns, {without:?} without: is the engine shared?"
    );
}

/// A slice is one party however many processes launch for it.
/// A slice of 4 processes at 50 % beside a slice of 1 at 50 % on one
/// engine: each of the 4 is a context of its own, so they take the
/// slice's turns one at a time, in the order of the slice's line in its
/// own ledger (crate::turns). Without that line they raced for each
/// turn passed to the slice, one lost round after round, gave up on the
/// turns for a second and was time-sliced: the 4-process slice got
/// 38.8–41.8 % against its neighbour's 45 %. Over 6.4 s: over 3.2 s a
/// loaded machine spread the runs too much to tell the two apart.
#[test]
fn a_slice_of_four_processes_gets_its_share_beside_a_slice_of_one() {
    let _alone = crate::alone();
    let s = Slice::new();
    let engine = s.dir.path().join("engine");
    let mut slices = vec![("four", "50", "cap"); 4];
    slices.push(("one", "50", "cap"));
    let got = side_by_side_with(&s, &slices, "1500000", "6.4", |c| {
        c.env("FAKEGPU_ENGINE", &engine);
    });
    let four: f64 = got[..4].iter().sum();
    let one = got[4];
    let board = gpuslice_ledger::board::Board::open_existing(&s.boards(), &s.host.gpus()[0].uuid)
        .expect("the GPU's board");
    eprintln!(
        "4 processes at 50 %: {four:.1} % ({:.1?}), 1 process at 50 %: {one:.1} %, {} fallbacks, \
         load {}",
        &got[..4],
        board.fallbacks(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    // The CI bound, 3 points, on its share of the GPU time the
    // pair got: a loaded 2-core machine feeds the fake GPU less, both
    // slices then fall short of 50 % of wall time, but by as much.
    let of_pair = four / (four + one) * 100.0;
    assert!(
        of_pair >= 50.0 - 3.0,
        "a slice of 4 processes at 50 % got {of_pair:.1} % of the pair's GPU time: \
         {four:.1} % ({got:.1?}) beside one of 1 process ({one:.1} %)"
    );
}

/// The GPU's turn is a word on the board that every tenant can write. An
/// attacker that forges a turn held "forever" by another slot, or forges
/// waiters (which are passed the turn and never use it), and writes it
/// again every millisecond, costs a slice a few bounded waits a second,
/// after which the slice ignores the GPU's turns for a second: the slice
/// keeps its share. If a forged turn were honoured, a slice would stop; if
/// forged waiters were, it would idle two turns in three (a 70 % slice
/// then got 36 %).
#[test]
fn a_forged_turn_costs_a_slice_at_most_one_wait_a_second() {
    let _alone = crate::alone();
    // Slot 63 holds the turn for an hour from now.
    let forged_turn = |now_us: u64| (BOARD_TURN_AT, forged_turn_word(now_us));
    // Every slot waits.
    let forged_waiters = |_: u64| (BOARD_WAITING_AT, u64::MAX);
    for (what, pct, forge) in [
        (
            "turn",
            30.0,
            &forged_turn as &(dyn Fn(u64) -> (u64, u64) + Sync),
        ),
        ("waiters", 70.0, &forged_waiters),
        // Only the victim's own slot (the board's first) waits: its holder
        // must not leave the GPU idle handing over to a sibling that does
        // not exist (its line in its own ledger says none waits).
        ("own waiting bit", 70.0, &|_| (BOARD_WAITING_AT, 1)),
    ] {
        let got = beside_a_board_forger(pct, forge);
        assert!(
            got >= pct - 3.0,
            "forged {what}: a {pct} % slice got {got:.1} %"
        );
    }
}

/// A forger rewriting every ms a turn held far ahead by another
/// slot, and every waiting bit, took each turn from its holder; the
/// holder, finding the forged one idle a ms later, took it back without a
/// fault, so the slices never fell back and took turns evenly whatever
/// their shares (a capped 70 % slice beside a 30 % one got ~27 %). A turn
/// taken from its holder before its end or idle time is now a fault: the
/// pair falls back to the GPU's time-slicing, where the 70 % slice keeps
/// over half of the GPU on a loaded 2-core machine.
#[test]
fn a_forged_turn_with_forged_waiters_does_not_even_out_a_pair() {
    let _alone = crate::alone();
    let (pair, writes) = pair_beside_forger("both");
    eprintln!("beside a forged turn and forged waiters: {pair:?}");
    assert!(writes > 500, "the forger wrote the board {writes} times");
    // Before the fix it got 21–30 %, after it 55–58 % (load 2.5–3): the
    // bound sits between, with room for a slower CI machine.
    assert!(
        pair[1] >= 38.0,
        "beside a forged turn and forged waiters the 70 % slice got {:.1} % ({pair:?})",
        pair[1]
    );
}

/// The shares a capped 30/70 pair of 1.5 ms kernels on one engine gets
/// over 3.2 s beside the forger of `condition` ([`forge_condition`]), and
/// how many forges succeeded.
fn pair_beside_forger(condition: &str) -> (Vec<f64>, u64) {
    let s = Slice::new();
    let engine = s.dir.path().join("engine");
    with_board_forger(
        &s,
        |f, now_us, n| forge_condition(condition, f, now_us, n),
        || {
            side_by_side_with(
                &s,
                &[("a", "30", "cap"), ("b", "70", "cap")],
                "1500000",
                "3.2",
                |c| {
                    c.env("FAKEGPU_ENGINE", &engine);
                },
            )
        },
    )
}

/// Where the board header keeps the turn, the waiting slots and the
/// holder's end of work (bytes; `gpuslice_ledger::board`'s words 3, 4, 7).
const BOARD_TURN_AT: u64 = 24;
const BOARD_WAITING_AT: u64 = 32;
const BOARD_TAIL_AT: u64 = 56;

/// A turn held by slot 63 (a process of it) for an hour from `now_us`.
fn forged_turn_word(now_us: u64) -> u64 {
    gpuslice_ledger::board::Turn::new(63, 1, (now_us + 3_600_000_000) * 1000).raw()
}

/// The share a slice of `pct` % and 1.5 ms kernels gets alone on one
/// engine while the test rewrites the board word `forge(now_us)` names
/// every ms.
fn beside_a_board_forger(pct: f64, forge: &(dyn Fn(u64) -> (u64, u64) + Sync)) -> f64 {
    use std::os::unix::fs::FileExt;
    let s = Slice::new();
    let pct = pct.to_string();
    let mut c = s.client(
        "victim",
        Some(&pct),
        &[
            "--via", "procaddr", "compute", "kernel", "1500000", SECONDS, WARMUP,
        ],
    );
    c.env("FAKEGPU_ENGINE", s.dir.path().join("engine"));
    let victim = spawn(c);
    let (v, writes) = with_board_forger(
        &s,
        |f, now_us, _| {
            let (at, word) = forge(now_us);
            f.write_at(&word.to_le_bytes(), at).map(|_| ())
        },
        || result(victim.wait_with_output().unwrap()),
    );
    assert!(writes > 500, "the forger wrote the board {writes} times");
    share(&v)
}

/// Runs `body` while a thread opens the GPU board of `s` every ms and
/// calls `forge(file, now_us, n)` on it (`n`: the loop's count, from 0);
/// what `body` gave, and how many forges succeeded.
fn with_board_forger<T>(
    s: &Slice,
    forge: impl Fn(&std::fs::File, u64, u64) -> std::io::Result<()> + Sync,
    body: impl FnOnce() -> T,
) -> (T, u64) {
    let board = gpuslice_ledger::board::board_path(&s.boards(), &s.host.gpus()[0].uuid);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let forger = scope.spawn(|| {
            let (mut n, mut writes) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&board) {
                    let mut ts = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    };
                    // SAFETY: a valid out-pointer.
                    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
                    let now_us = ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000;
                    if forge(&f, now_us, n).is_ok() {
                        writes += 1;
                    }
                }
                n += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            writes
        });
        let got = body();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (got, forger.join().unwrap())
    })
}

/// Every tenant of a GPU can write its board, so one can also truncate it
/// under the other slices' mappings. A slice's processes must not die of
/// that (SIGBUS on the next read of the mapping): it keeps running, and
/// keeps its share.
#[test]
fn a_truncated_board_does_not_crash_the_slices_that_map_it() {
    let _alone = crate::alone();
    let s = Slice::new();
    let mut c = s.client(
        "victim",
        Some("50"),
        &[
            "--via", "procaddr", "compute", "kernel", "1500000", SECONDS, WARMUP,
        ],
    );
    c.env("FAKEGPU_ENGINE", s.dir.path().join("engine"));
    let victim = spawn(c);
    let board = gpuslice_ledger::board::board_path(&s.boards(), &s.host.gpus()[0].uuid);
    let t = std::time::Instant::now();
    while !board.exists() && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&board)
        .unwrap();
    f.set_len(0).unwrap();
    let v = result(victim.wait_with_output().unwrap());
    let got = share(&v);
    assert!(
        got > 40.0,
        "beside a truncated board a 50 % slice got {got:.1} %"
    );
}

/// What the forger of [`lying_slice_bound`]'s `condition` writes on the
/// board `f` at its `n`th ms: a turn held by a slot that never uses it,
/// every slot waiting, both, both with the holder's end of work an hour
/// ahead (so that it never looks idle), or the board truncated every
/// 200 ms; nothing for any other condition.
fn forge_condition(condition: &str, f: &std::fs::File, now_us: u64, n: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let turn = forged_turn_word(now_us).to_le_bytes();
    let waiters = u64::MAX.to_le_bytes();
    let tail = ((now_us + 3_600_000_000) * 1000).to_le_bytes();
    let writes: &[(&[u8; 8], u64)] = match condition {
        "turn" => &[(&turn, BOARD_TURN_AT)],
        "waiters" => &[(&waiters, BOARD_WAITING_AT)],
        "both" => &[(&turn, BOARD_TURN_AT), (&waiters, BOARD_WAITING_AT)],
        "both_tail" => &[
            (&tail, BOARD_TAIL_AT),
            (&turn, BOARD_TURN_AT),
            (&waiters, BOARD_WAITING_AT),
        ],
        "truncate" if n.is_multiple_of(200) => return f.set_len(0),
        _ => &[],
    };
    writes
        .iter()
        .try_for_each(|(word, at)| f.write_all_at(*word, *at))
}

/// The bound on a lying slice, measured (a benchmark, ignored:
/// about a minute of two busy CPUs a round). A capped 30/70 pair of 1.5 ms
/// kernels on one fake engine, alone and beside a forger that rewrites
/// the GPU's board every millisecond ([`forge_condition`]).
/// Conditions interleaved, rotated each round; medians and range per
/// slice, and what each forger cost against a forger that writes nothing
/// (`noop`), in points of wall time (1 point = 10 ms a second). Run:
/// `cargo test -p gpuslice-shim --test integration -- --ignored --nocapture compute::lying_slice_bound`
/// (`GPUSLICE_BENCH_ROUNDS`, default 3; `GPUSLICE_BENCH_OUT` writes the JSON).
#[test]
#[ignore = "benchmark: a minute a round on a quiet machine"]
fn lying_slice_bound() {
    let _alone = crate::alone();
    let rounds: usize = std::env::var("GPUSLICE_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    // "noop": the forger's loop (open the board every ms) writing nothing,
    // the baseline each cost is taken against (the fake GPU is fed from
    // the CPU the forger also uses).
    const CONDITIONS: [&str; 7] = [
        "alone",
        "noop",
        "turn",
        "waiters",
        "both",
        "both_tail",
        "truncate",
    ];
    // `GPUSLICE_BENCH_CASES`: a comma-separated list of conditions to run
    // (`noop`, the baseline, always runs).
    let only = std::env::var("GPUSLICE_BENCH_CASES").ok();
    let run = |name: &str| {
        name == "noop"
            || only
                .as_deref()
                .is_none_or(|o| o.split(',').any(|c| c == name))
    };
    let mut got: Vec<Vec<[f64; 2]>> = vec![Vec::new(); CONDITIONS.len()];
    for round in 0..rounds {
        for k in 0..CONDITIONS.len() {
            let c = (k + round) % CONDITIONS.len();
            if !run(CONDITIONS[c]) {
                continue;
            }
            let (pair, _) = pair_beside_forger(CONDITIONS[c]);
            eprintln!("round {round} {}: {pair:?}", CONDITIONS[c]);
            got[c].push([pair[0], pair[1]]);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let stats = |c: usize, i: usize| {
        let mut v: Vec<f64> = got[c].iter().map(|p| p[i]).collect();
        let m = median(&mut v);
        (m, v[0], v[v.len() - 1])
    };
    let mut out = Vec::new();
    for (c, name) in CONDITIONS.iter().enumerate() {
        if got[c].is_empty() {
            continue;
        }
        let slices: Vec<Value> = [("30", 0), ("70", 1)]
            .iter()
            .map(|(pct, i)| {
                let (m, lo, hi) = stats(c, *i);
                let (noop, _, _) = stats(1, *i);
                serde_json::json!({
                    "share": pct,
                    "median_percent": m, "min": lo, "max": hi,
                    "cost_points": noop - m,
                    "cost_ms_per_s": (noop - m) * 10.0,
                })
            })
            .collect();
        out.push(serde_json::json!({ "condition": name, "slices": slices }));
    }
    bench_report(
        "lying-slice bound, fake engine",
        "lying_slice_bound",
        serde_json::json!({
            "rounds": rounds,
            "conditions_selected": only,
            "kernel_ns": 1_500_000,
            "seconds": 3.2,
            "conditions": out,
        }),
    );
}

/// What one case of [`compute_scale`] gave: per slice the share of wall
/// time its processes' kernels took together, and on the GPU's board the
/// hand-overs and fallbacks to time-slicing over the whole run.
struct ScaleRun {
    got: Vec<f64>,
    launches: f64,
    wall_s: f64,
    handovers: u64,
    fallbacks: u64,
    /// Why processes fell back, as their log lines say, and how often.
    fallback_reasons: std::collections::BTreeMap<String, u64>,
}

/// Runs slices `(share %, processes)` side by side on one fake engine,
/// kernels of `kernel_ns`, measured over `seconds`.
fn on_one_engine(slices: &[(f64, usize)], kernel_ns: &str, seconds: &str) -> ScaleRun {
    let s = Slice::new();
    let engine = s.dir.path().join("engine");
    let t0 = std::time::Instant::now();
    let children: Vec<(usize, Child)> = slices
        .iter()
        .enumerate()
        .flat_map(|(i, &(pct, procs))| (0..procs).map(move |_| (i, pct)))
        .map(|(i, pct)| {
            let mut c = s.client(
                &format!("s{i}"),
                Some(&pct.to_string()),
                &[
                    "--via", "procaddr", "compute", "kernel", kernel_ns, seconds, WARMUP,
                ],
            );
            c.env("FAKEGPU_ENGINE", &engine).env("GPUSLICE_LOG", "1");
            (i, spawn(c))
        })
        .collect();
    let mut got = vec![0.0; slices.len()];
    let mut launches = 0.0;
    let mut fallback_reasons = std::collections::BTreeMap::new();
    for (i, c) in children {
        let out = c.wait_with_output().unwrap();
        for line in String::from_utf8_lossy(&out.stderr).lines() {
            // "device N: <why> in a second; turns ignored for 1 s ..."
            if let Some((head, _)) = line.split_once(" in a second; turns ignored") {
                let why = head.rsplit_once(": ").map_or(head, |(_, w)| w);
                *fallback_reasons.entry(why.to_string()).or_insert(0) += 1;
            }
        }
        let v = result(out);
        launches += v["launches"].as_f64().unwrap_or(0.0);
        got[i] += share(&v);
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let board = gpuslice_ledger::board::Board::open_existing(&s.boards(), &s.host.gpus()[0].uuid)
        .expect("the GPU's board");
    ScaleRun {
        got,
        launches,
        wall_s,
        handovers: u64::from(board.turn_seq()),
        fallbacks: board.fallbacks(),
        fallback_reasons,
    }
}

/// The scale benchmark on the fake engine (ignored: about a
/// minute on a quiet machine; the fake GPU is fed from the CPU, so a
/// 2-core machine shared with other work gives worse numbers). Equal
/// shares of 2, 4, 8 and 16 slices, 8 unequal shares summing to 100, the
/// 10/90 and 30/70 pairs and a slice of 4 processes beside a slice of 1,
/// 1.5 ms kernels (`GPUSLICE_BENCH_KERNEL_NS` for others). Reports each
/// slice's share of wall time against its target, the error (max and
/// mean, points), how busy the GPU was, hand-overs a second, what a
/// hand-over cost (GPU idle per hand-over and per launch, from the busy
/// shortfall of fully subscribed cases) and the fallbacks to
/// time-slicing. Run:
/// `cargo test -p gpuslice-shim --test integration -- --ignored --nocapture compute::compute_scale`
/// (`GPUSLICE_BENCH_OUT` writes the JSON).
#[test]
#[ignore = "benchmark: about a minute of two busy CPUs"]
fn compute_scale() {
    let _alone = crate::alone();
    let kernel_ns = std::env::var("GPUSLICE_BENCH_KERNEL_NS").unwrap_or_else(|_| "1500000".into());
    let seconds = "3.2";
    let cases: Vec<(&str, Vec<(f64, usize)>)> = vec![
        ("2x50", vec![(50.0, 1); 2]),
        ("4x25", vec![(25.0, 1); 4]),
        ("8x12.5", vec![(12.5, 1); 8]),
        ("16x6.25", vec![(6.25, 1); 16]),
        (
            "8 unequal",
            [5.0, 5.0, 10.0, 10.0, 15.0, 15.0, 20.0, 20.0]
                .iter()
                .map(|&p| (p, 1))
                .collect(),
        ),
        ("10/90", vec![(10.0, 1), (90.0, 1)]),
        ("30/70", vec![(30.0, 1), (70.0, 1)]),
        ("4 processes/1 at 50", vec![(50.0, 4), (50.0, 1)]),
    ];
    // `GPUSLICE_BENCH_CASES`: a comma-separated list of case names to run.
    let only = std::env::var("GPUSLICE_BENCH_CASES").ok();
    // The fake GPU is fed from the CPU: how loaded the machine was.
    let loadavg = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load_before = loadavg();
    let mut out = Vec::new();
    for (name, slices) in &cases {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|c| c == *name))
        {
            continue;
        }
        let r = on_one_engine(slices, &kernel_ns, seconds);
        let busy: f64 = r.got.iter().sum();
        let errors: Vec<f64> = r
            .got
            .iter()
            .zip(slices)
            .map(|(g, (t, _))| (g - t).abs())
            .collect();
        let max = errors.iter().cloned().fold(0.0, f64::max);
        let mean = errors.iter().sum::<f64>() / errors.len() as f64;
        let per_s = r.handovers as f64 / r.wall_s;
        // Every case asks for the whole GPU: what it was not busy is what
        // the scheme cost (hand-overs, and the CPU feeding the fake GPU).
        let idle_ms_per_s = (100.0 - busy).max(0.0) * 10.0;
        let idle_us_per_handover = if per_s > 0.0 {
            idle_ms_per_s * 1000.0 / per_s
        } else {
            0.0
        };
        let launches_per_s = r.launches / seconds.parse::<f64>().unwrap();
        eprintln!(
            "{name}: busy {busy:.1} %, {:.1?} (max error {max:.1}, mean {mean:.1} points), \
             {per_s:.0} hand-overs/s, {} fallbacks {:?}",
            r.got, r.fallbacks, r.fallback_reasons
        );
        out.push(serde_json::json!({
            "case": name,
            "targets_percent": slices.iter().map(|(t, _)| t).collect::<Vec<_>>(),
            "processes": slices.iter().map(|(_, p)| p).collect::<Vec<_>>(),
            "got_percent": r.got,
            "error_max_points": max,
            "error_mean_points": mean,
            "gpu_busy_percent": busy,
            "handovers_per_s": per_s,
            "idle_us_per_handover": idle_us_per_handover,
            "idle_us_per_launch": if launches_per_s > 0.0 { idle_ms_per_s * 1000.0 / launches_per_s } else { 0.0 },
            "fallbacks": r.fallbacks,
            "fallback_reasons": r.fallback_reasons,
        }));
    }
    bench_report(
        "compute shares at scale, fake engine",
        "compute_scale",
        serde_json::json!({
            "kernel_ns": kernel_ns,
            "seconds": seconds,
            "loadavg_before": load_before.trim(),
            "loadavg_after": loadavg().trim(),
            "cases": out,
        }),
    );
}

/// Prints a fake-engine benchmark's report, and writes it to
/// `GPUSLICE_BENCH_OUT` when that is set: the benchmark's name, the
/// command that reruns its `test`, the time and the GPU, then `fields`.
fn bench_report(benchmark: &str, test: &str, fields: Value) {
    let mut report = serde_json::json!({
        "benchmark": benchmark,
        "command": format!(
            "cargo test -p gpuslice-shim --test integration -- --ignored --nocapture compute::{test}"
        ),
        "unix_time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "gpu": "fakegpu (one shared engine, FAKEGPU_ENGINE)",
    });
    if let (Some(r), Value::Object(f)) = (report.as_object_mut(), fields) {
        r.extend(f);
    }
    let text = serde_json::to_string_pretty(&report).unwrap();
    println!("{text}");
    if let Some(path) = std::env::var_os("GPUSLICE_BENCH_OUT") {
        std::fs::write(path, &text).unwrap();
    }
}

/// The CI bound on the fake engine: each slice's share of the time the
/// GPU was busy (what the slices got together) within 3 points of its
/// target. Of the busy time, not of the wall: the CPU feeds the fake GPU,
/// and a loaded machine leaves it idle for every slice alike.
fn assert_shares_of_the_busy_time(slices: &[(f64, usize)]) {
    let r = on_one_engine(slices, "1500000", "3.2");
    let busy: f64 = r.got.iter().sum();
    let of_busy: Vec<f64> = r.got.iter().map(|g| g * 100.0 / busy).collect();
    for (i, (got, (target, _))) in of_busy.iter().zip(slices).enumerate() {
        assert!(
            (got - target).abs() <= 3.0,
            "slice {i} got {got:.1} % of the busy time for a share of {target} % \
             (all: {of_busy:.1?} of the busy time, {:.1?} of the wall; GPU busy {busy:.1} %, \
             {} fallbacks {:?}, load {})",
            r.got,
            r.fallbacks,
            r.fallback_reasons,
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        );
    }
}

/// Eight busy slices of 12.5 % on one GPU each get their share.
#[test]
fn eight_equal_slices_each_get_their_share() {
    let _alone = crate::alone();
    assert_shares_of_the_busy_time(&[(12.5, 1); 8]);
}

/// Sixteen busy slices of 6.25 % on one GPU each get their share.
#[test]
fn sixteen_equal_slices_each_get_their_share() {
    let _alone = crate::alone();
    assert_shares_of_the_busy_time(&[(6.25, 1); 16]);
}

/// Eight busy slices of unequal shares summing to 100 % each get theirs.
#[test]
fn eight_unequal_slices_each_get_their_share() {
    let _alone = crate::alone();
    let slices: Vec<(f64, usize)> = [5.0, 5.0, 10.0, 10.0, 15.0, 15.0, 20.0, 20.0]
        .iter()
        .map(|&p| (p, 1))
        .collect();
    assert_shares_of_the_busy_time(&slices);
}

/// A 10/90 pair, the split HAMi's users report landing at 1:6-8.
#[test]
fn a_ten_ninety_pair_gets_its_shares() {
    let _alone = crate::alone();
    assert_shares_of_the_busy_time(&[(10.0, 1), (90.0, 1)]);
}
