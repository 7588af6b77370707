//! Multi-process tests of the ledger: many processes under one cap, and a
//! SIGKILLed process's bytes coming back.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuslice_ledger::{DeviceSpec, Ledger, ProcessState};
use gpuslice_testkit::process::spawn_until;

/// The helper process (crate gpuslice-testkit).
fn exercise() -> std::path::PathBuf {
    gpuslice_testkit::built("gpuslice-ledger-exercise", "gpuslice-testkit")
}
const MIB: u64 = 1 << 20;

fn ledger(dir: &std::path::Path, caps: &[u64]) -> (std::path::PathBuf, Ledger) {
    let path = dir.join("stress.ledger");
    let devices: Vec<_> = caps
        .iter()
        .map(|&cap| DeviceSpec {
            uuid: String::new(),
            cap,
        })
        .collect();
    let l = Ledger::create(&path, "stress", &devices).unwrap();
    (path, l)
}

#[test]
fn thirty_two_processes_for_ten_seconds_never_pass_the_cap_and_end_at_zero() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 1024 * MIB;
    let (path, l) = ledger(dir.path(), &[cap, cap]);
    let started = Instant::now();
    let children: Vec<_> = (0..32u64)
        .map(|i| {
            Command::new(exercise())
                .args(["random", path.to_str().unwrap()])
                .arg((i % 2).to_string())
                .arg("10")
                .arg((0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i + 1)).to_string())
                .arg((96 * MIB).to_string())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Watch from outside as well while they run.
    let mut outside_max = [0u64; 2];
    while started.elapsed() < Duration::from_secs(9) {
        for (d, m) in outside_max.iter_mut().enumerate() {
            let used = l.used(d);
            assert!(used <= cap, "device {d}: {used} > cap {cap}");
            *m = (*m).max(used);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut total_reserved = 0;
    let mut total_refused = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {text}");
        let v: serde_like::Line = serde_like::parse(&text);
        assert!(!v.exceeded && v.max_seen <= cap && v.left == 0, "{text}");
        total_reserved += v.reserved;
        total_refused += v.refused;
    }
    assert!(started.elapsed() >= Duration::from_secs(10));
    assert!(total_reserved > 1000, "too little work: {total_reserved}");
    assert!(total_refused > 0, "the cap was never reached");
    let s = l.snapshot();
    for d in &s.devices {
        assert_eq!(d.used, 0, "{d:?}");
        assert!(d.peak <= cap && d.peak > cap / 2, "{d:?}");
    }
    assert!(s.processes.is_empty(), "{:?}", s.processes);
    assert_eq!(s.reclaimed_slots, 0);
}

#[test]
fn a_sigkilled_process_is_reclaimed_by_reap_and_by_the_next_attach() {
    let dir = tempfile::tempdir().unwrap();
    let (path, l) = ledger(dir.path(), &[1024 * MIB]);
    let spawn_holder = |bytes: u64| {
        spawn_until(
            Command::new(exercise())
                .args(["hold", path.to_str().unwrap(), "0"])
                .arg(bytes.to_string()),
            "held",
        )
    };
    let mut a = spawn_holder(300 * MIB);
    let mut b = spawn_holder(500 * MIB);
    assert_eq!(l.used(0), 800 * MIB);
    let procs = l.snapshot().processes;
    assert_eq!(procs.len(), 2);
    assert!(procs.iter().all(|p| p.state == ProcessState::Live));
    assert!(procs
        .iter()
        .any(|p| p.pid == a.id() && p.bytes == [300 * MIB]));
    assert!(procs.iter().any(|p| p.comm.starts_with("gpuslice-ledger")));

    // Nothing to reap while both live.
    assert_eq!(l.reap().unwrap().slots, 0);

    a.kill().unwrap();
    a.wait().unwrap();
    let r = l.reap().unwrap();
    assert_eq!((r.slots, r.bytes), (1, 300 * MIB));
    assert_eq!(l.used(0), 500 * MIB);

    b.kill().unwrap();
    b.wait().unwrap();
    // Reclaimed by whoever attaches next.
    let other = Ledger::open(&path).unwrap();
    let s = other.attach().unwrap();
    assert_eq!(other.used(0), 0);
    other.reserve(s, 0, 1024 * MIB).unwrap();
    other.detach(s);
    let snap = other.snapshot();
    assert_eq!(snap.reclaimed_slots, 2);
    assert_eq!(snap.reclaimed_bytes, 800 * MIB);
}

/// A tiny reader for the exercise's JSON line (keeps serde out of the crate).
mod serde_like {
    pub struct Line {
        pub reserved: u64,
        pub refused: u64,
        pub max_seen: u64,
        pub left: u64,
        pub exceeded: bool,
    }

    fn field<'a>(text: &'a str, key: &str) -> &'a str {
        let pat = format!("\"{key}\":");
        let start = text.find(&pat).unwrap_or_else(|| panic!("{key} in {text}")) + pat.len();
        let rest = &text[start..];
        let end = rest.find([',', '}']).unwrap_or(rest.len());
        &rest[..end]
    }

    pub fn parse(text: &str) -> Line {
        let n = |k| field(text, k).parse::<u64>().unwrap();
        Line {
            reserved: n("reserved"),
            refused: n("refused"),
            max_seen: n("max_seen"),
            left: n("left"),
            exceeded: field(text, "exceeded") == "true",
        }
    }
}

/// A slice can truncate its usage ledger under every process that maps it.
/// Root's readers (`gpuslice slices`, the exporter, a launcher's reaping)
/// must live on, reading zeros; the slice's own process dies of SIGBUS (a
/// private copy would free it from the shared cap: it fails closed).
#[test]
fn a_truncated_ledger_leaves_its_readers_a_zeroed_copy_and_kills_its_slice() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let run = |mode: &str| {
        let (path, l) = ledger(dir.path(), &[MIB]);
        drop(l);
        Command::new(exercise())
            .args(["truncated", path.to_str().unwrap(), mode])
            .output()
            .unwrap()
    };
    let reader = run("reader");
    let text = String::from_utf8_lossy(&reader.stdout);
    assert!(
        reader.status.success(),
        "reader: {:?} {text}",
        reader.status
    );
    assert!(
        text.contains("lost=true slice_before=stress slice_after=\"\""),
        "{text}"
    );
    let slice = run("slice");
    assert_eq!(slice.status.signal(), Some(libc::SIGBUS), "{slice:?}");
}
