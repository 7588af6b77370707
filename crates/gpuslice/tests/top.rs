//! `gpuslice top` in a pseudo-terminal on the fake host of README's demo,
//! with the demo's two compute slices running: the frame the terminal
//! shows names both slices with their shares, `q` quits and gives the
//! terminal back. `--once` prints the same view as plain text. Needs root
//! (the slices), as CI runs it.
//!
//! With `GPUSLICE_TOP_CAPTURE=FILE` the bytes the terminal received are
//! kept in FILE (README's screenshot is rendered from such a capture by
//! `scripts/screenshot.py`).

use crate::common;
use common::GPUSLICE;
use gpuslice_testkit::process::Kill;

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ROWS: u16 = 30;
const COLS: u16 = 110;

struct Demo {
    _one: std::sync::RwLockWriteGuard<'static, ()>,
    _tmp: tempfile::TempDir,
    host: PathBuf,
    ledgers: PathBuf,
    /// The background commands, each leading a process group.
    runs: Vec<Child>,
}

impl Demo {
    /// README's fake host, then its compute line (run longer, so that top
    /// sees the slices for several seconds) and a 2 GiB slice holding 1.5
    /// GiB, in the background, once `gpuslice slices` shows them; none
    /// where `test` (it needs root) may not run.
    fn start(test: &str) -> Option<Demo> {
        if !common::root_may_run(test) {
            return None;
        }
        // The demo's shares are measured: one at a time.
        let one = common::alone();
        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path().join("fakehost");
        let ledgers = tmp.path().join("ledgers");
        let lines = common::readme_demo();
        let fakehost = common::readme_command(&lines[0], &host);
        let out = Demo::sh(&fakehost, &ledgers).output().unwrap();
        assert!(out.status.success(), "{fakehost}: {out:?}");
        let readme_compute = &lines[2];
        let compute = readme_compute.replace("compute 3 &", "compute 12 &");
        assert_ne!(&compute, readme_compute, "README's compute line changed");
        let memory = lines[1].replace("memory 3GiB", "memory 1536MiB 12");
        let runs = [compute, memory]
            .iter()
            .map(|line| {
                Demo::sh(&common::readme_command(line, &host), &ledgers)
                    .stdout(Stdio::null())
                    .process_group(0)
                    .spawn()
                    .unwrap()
            })
            .collect();
        let demo = Demo {
            _one: one,
            _tmp: tmp,
            host,
            ledgers,
            runs,
        };
        demo.wait_for_slices();
        Some(demo)
    }

    fn sh(line: &str, ledgers: &Path) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", line]);
        Demo::env(&mut c, ledgers);
        c
    }

    fn env(c: &mut Command, ledgers: &Path) {
        c.env_remove("FAKEGPU_ROOT")
            .env_remove("FAKEGPU_ENGINE")
            .env_remove("FAKEGPU_TRACE")
            .env("GPUSLICE_LEDGER_DIR", ledgers)
            .env("GPUSLICE_BOARD_DIR", ledgers.join("boards"));
    }

    fn top(&self, args: &[&str]) -> Command {
        let mut c = Command::new(GPUSLICE);
        c.arg("--host-root").arg(&self.host).arg("top").args(args);
        Demo::env(&mut c, &self.ledgers);
        c
    }

    /// Waits until `gpuslice slices` lists three slices with processes,
    /// the capped one holding its 1.5 GiB.
    fn wait_for_slices(&self) {
        let t0 = Instant::now();
        loop {
            let mut c = Command::new(GPUSLICE);
            c.arg("--host-root")
                .arg(&self.host)
                .args(["slices", "--json"]);
            Demo::env(&mut c, &self.ledgers);
            let out = c.output().unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let busy = v["slices"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|s| s["processes"].as_array().is_some_and(|p| !p.is_empty()))
                .count();
            let held = v["slices"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["devices"][0]["used_bytes"] == 1536u64 << 20);
            if busy == 3 && held {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the demo's slices did not start: {v}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Demo {
    /// SIGTERM to each command's group: `gpuslice run` relays it to its
    /// slice and removes the slice's records, as after Ctrl-C.
    fn drop(&mut self) {
        for c in &mut self.runs {
            // SAFETY: a plain kill(2) of the process group the child leads.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

/// A terminal of ROWS × COLS, as the pseudo-terminal's user sees it.
fn parser() -> vt100::Parser {
    let n = |v: u16| std::num::NonZero::new(v).unwrap();
    vt100::Parser::new(n(ROWS), n(COLS), 0)
}

/// A pseudo-terminal of ROWS × COLS: (master, slave).
fn openpty() -> (OwnedFd, OwnedFd) {
    let (mut master, mut slave) = (-1, -1);
    let size = libc::winsize {
        ws_row: ROWS,
        ws_col: COLS,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: valid out-pointers; no name buffer; a valid winsize.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened for us.
    unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

/// `cmd` on the terminal `slave`, as its session's controlling terminal.
fn spawn_on(cmd: &mut Command, slave: &OwnedFd) -> Child {
    let io = || Stdio::from(slave.try_clone().unwrap());
    cmd.stdin(io())
        .stdout(io())
        .stderr(io())
        .env("TERM", "xterm-256color");
    // SAFETY: between fork and exec only async-signal-safe calls (setsid,
    // ioctl) on the child's own descriptors.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// The share a `compute PCT%` line of the screen shows, when measured
/// over the last interval.
fn share_on(screen: &str, pct: u32) -> Option<f64> {
    let line = screen
        .lines()
        .find(|l| l.contains(&format!("compute  {pct}% cap")))?;
    if line.contains("since start") {
        return None;
    }
    let before = line.split("% of GPU time").next()?;
    before.rsplit(' ').next()?.parse().ok()
}

#[test]
fn top_shows_the_demo_slices_and_their_shares_live_and_q_quits() {
    let Some(demo) = Demo::start("top_shows_the_demo_slices_and_their_shares_live_and_q_quits")
    else {
        return;
    };

    let (master, slave) = openpty();
    // Killed if the test fails before `q`: a `gpuslice top` left running
    // keeps gpuslice-full busy for every later test (and run) on the host.
    let mut child = Kill(spawn_on(&mut demo.top(&[]), &slave));
    drop(slave);
    let received = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let received = received.clone();
        let mut m = std::fs::File::from(master.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            // EIO once the last process on the terminal has gone.
            while let Ok(n) = m.read(&mut buf) {
                if n == 0 {
                    break;
                }
                received.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    let screen = |bytes: &[u8]| {
        let mut p = parser();
        p.process(bytes);
        p.screen().contents()
    };
    // The second frame has rates over the last second.
    let t0 = Instant::now();
    let (shown, a, b) = loop {
        let bytes = received.lock().unwrap().clone();
        let s = screen(&bytes);
        if let (Some(a), Some(b)) = (share_on(&s, 30), share_on(&s, 70)) {
            break (s, a, b);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "no frame with both shares measured:\n{s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    if let Some(path) = std::env::var_os("GPUSLICE_TOP_CAPTURE") {
        std::fs::write(path, received.lock().unwrap().as_slice()).unwrap();
    }
    // Both compute slices and the capped one, each enforced.
    let slices = shown
        .lines()
        .filter(|l| l.trim_start_matches('│').starts_with("slice "))
        .count();
    assert_eq!(slices, 3, "{shown}");
    assert_eq!(
        shown
            .matches("enforced: 1 of 1 processes (root's record)")
            .count(),
        3,
        "{shown}"
    );
    assert!(shown.contains("SIMULATION"), "{shown}");
    assert!(
        shown.contains("memory 1536 MiB / cap 2048 MiB"),
        "the capped slice's use and cap: {shown}"
    );
    // Their shares, against their targets (the demo's loose band).
    assert!(
        (20.0..=33.0).contains(&a),
        "30 % slice shown at {a}:\n{shown}"
    );
    assert!(
        (50.0..=73.0).contains(&b),
        "70 % slice shown at {b}:\n{shown}"
    );

    // q quits, and the terminal is given back (the alternate screen left).
    let mut m = std::fs::File::from(master);
    m.write_all(b"q").unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "top did not quit on q"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    drop(m);
    let _ = reader.join();
    let all = received.lock().unwrap().clone();
    let mut p = parser();
    p.process(&all);
    assert!(
        !p.screen().alternate_screen(),
        "left in the alternate screen"
    );
}

#[test]
fn top_once_prints_the_same_view_as_text_and_needs_no_terminal() {
    let Some(demo) = Demo::start("top_once_prints_the_same_view_as_text_and_needs_no_terminal")
    else {
        return;
    };
    let out = demo.top(&["--once"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains('\x1b'), "plain text: {text:?}");
    let a = share_on(&text, 30).unwrap_or_else(|| panic!("{text}"));
    let b = share_on(&text, 70).unwrap_or_else(|| panic!("{text}"));
    assert!(
        (20.0..=33.0).contains(&a) && (50.0..=73.0).contains(&b),
        "{text}"
    );
    // The GPU the two slices share is busy (the fake NVML measures the
    // shared engine: ~90 %, less on a loaded machine), another is idle.
    let util = |gpu: &str| -> u32 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{gpu:<4} NVIDIA H200")))
            .unwrap_or_else(|| panic!("GPU {gpu}: {text}"));
        line.split("] ")
            .nth(1)
            .and_then(|r| r.trim_start().split('%').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line}"))
    };
    // (Unmeasured, the fake NVML would say 0 % and 50 %.)
    assert!(util("0") >= 50, "{text}");
    assert_eq!(util("5"), 0, "{text}");
    assert!(
        text.trim_end()
            .ends_with("(gpuslice-fakehost): simulated GPUs and use"),
        "{text}"
    );

    // Not on a terminal, the live view says what to do instead.
    let out = demo.top(&[]).stdin(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("top --once"), "{err}");
}
