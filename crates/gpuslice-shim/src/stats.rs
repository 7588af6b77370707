//! Calls per interposed family, counted only with `GPUSLICE_LOG` set and
//! logged at exit: which interposed functions a program calls how often
//! (e.g. per training step), the first thing to know when a workload runs
//! slower under the shim. Off, a call costs one relaxed load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::sys::log_line;

const MAX: usize = 64;
static ON: AtomicBool = AtomicBool::new(false);
static CALLS: [AtomicU64; MAX] = [const { AtomicU64::new(0) }; MAX];

/// Starts counting (the constructor, when logging is on).
pub fn enable() {
    ON.store(true, Ordering::Relaxed);
}

#[inline]
pub fn count(family: usize) {
    if ON.load(Ordering::Relaxed) {
        if let Some(c) = CALLS.get(family) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Logs the non-zero counts (the destructor); `all` lists the families in
/// declaration order (`families::ALL`: a family counts at its index).
pub fn report<F: std::fmt::Debug>(all: &[F]) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let counts: Vec<String> = all
        .iter()
        .enumerate()
        .filter_map(|(i, f)| {
            let n = CALLS.get(i)?.load(Ordering::Relaxed);
            (n > 0).then(|| format!("{f:?}={n}"))
        })
        .collect();
    log_line(&format!(
        "pid {} calls: {}",
        std::process::id(),
        counts.join(" ")
    ));
}
