//! Launch marks: with `GPUSLICE_LAUNCH_MARKS=1`, `run` writes one line per
//! step of a launch to stderr, `gpuslice-mark STEP NS` (CLOCK_MONOTONIC,
//! the clock Python's `time.monotonic_ns` reads), from the launcher and
//! from its child until exec. `scripts/device_launch_phases.py` turns them
//! into the time each step takes on the real host.
//!
//! A mark is one `write(2)` from a stack buffer: no allocation and no lock,
//! so the forked child may mark too. Off, a mark is one relaxed load.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// The variable that turns marks on.
pub const MARKS_ENV: &str = "GPUSLICE_LAUNCH_MARKS";

static ON: AtomicBool = AtomicBool::new(false);

/// Reads [`MARKS_ENV`] once; call first thing in `main`.
pub fn init() {
    if std::env::var_os(MARKS_ENV).is_some_and(|v| v == "1") {
        ON.store(true, Ordering::Relaxed);
    }
}

/// Marks that `step` is done, if marks are on.
pub fn mark(step: &str) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let Ok(now) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) else {
        return;
    };
    let ns = now.tv_sec() as u128 * 1_000_000_000 + now.tv_nsec() as u128;
    let mut buf = [0u8; 96];
    let mut cur = std::io::Cursor::new(&mut buf[..]);
    if writeln!(cur, "gpuslice-mark {step} {ns}").is_err() {
        return;
    }
    let len = cur.position() as usize;
    let _ = nix::unistd::write(std::io::stderr(), &buf[..len]);
}
