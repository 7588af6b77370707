//! The work-conserving compute mode (`GPUSLICE_COMPUTE_MODE=guaranteed`):
//! a slice's share is what it is *guaranteed*; while the other slices of
//! its GPU leave time idle, its bucket refills faster, up to all the idle
//! time but [`MARGIN_BP`].
//!
//! What the others use comes from the GPU's board
//! ([`gpuslice_ledger::board`]): every slice with a share, in either mode,
//! adds the GPU time it measures to its slot there. Every [`WINDOW_NS`] one
//! thread of each borrowing process turns the growth of the other slots
//! into a rate (smoothed over ~4 windows) and sets the refill rate to
//! `max(share, 100 % − others − margin)`. When another slice gets busy its
//! use shows within a few windows and the borrower falls back to its share;
//! the margin is what a slice coming back from idle runs on until then.
//!
//! Not seen: GPU work of processes outside any slice with a share (the
//! borrower may take time from them, as time-slicing would anyway).

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use gpuslice_ledger::board::{self, Board, Mode};
use gpuslice_ledger::{Ledger, FULL_SHARE, MAX_DEVICES};

use crate::sys::log_line;

/// How often a borrower re-reads the board.
pub const WINDOW_NS: u64 = 20_000_000;
/// Idle time a borrower leaves unused, so a slice that wakes up gets GPU
/// time (and shows on the board) before the borrower backs off.
pub const MARGIN_BP: u64 = 500;

/// One device's board slot and, when borrowing, the rate state.
struct Seat {
    board: Board,
    key: u64,
    /// Our slot; moves if another slice took it over while we were idle.
    slot: AtomicUsize,
    share: u64,
    mode: Mode,
    borrowing: bool,
    /// Start of the current window (CLOCK_MONOTONIC ns; 0: not started).
    window_start: AtomicU64,
    /// The others' summed GPU ns at the start of the window.
    others_then: AtomicU64,
    /// The others' smoothed use, basis points.
    others_bp: AtomicU64,
    /// Refill rate in force, basis points.
    rate: AtomicU64,
}

/// Per-device seats on the GPUs' boards.
pub struct Boards {
    seats: Vec<Option<Seat>>,
}

/// Identifies a slice on a board: its ledger file, or this process for a
/// private ledger.
fn slice_key(ledger: &Ledger) -> u64 {
    ledger
        .path()
        .and_then(|p| board::ledger_key(p).ok())
        .unwrap_or_else(|| {
            board::slice_key(u64::from(std::process::id()), crate::compute::now_ns())
        })
}

impl Boards {
    /// Takes a seat on the board of every device with a share, in either
    /// mode: a capped slice that started before any borrower must still be
    /// seen by the borrowers that come later. (Cost: a file opened at start
    /// and one atomic add per measured launch.)
    pub fn open(ledger: &Ledger, shares: &[u64], mode: Mode, dir: &Path) -> Option<Boards> {
        let borrowing = mode == Mode::Guaranteed;
        // Best effort: a non-root slice may not create it under /run
        // (`gpuslice run` does, as root, sticky and world-writable).
        let _ = std::fs::create_dir_all(dir);
        let key = slice_key(ledger);
        let now = crate::compute::now_ns();
        let seats: Vec<Option<Seat>> = shares
            .iter()
            .enumerate()
            .take(MAX_DEVICES)
            .map(|(dev, &share)| {
                let uuid = ledger.uuid(dev);
                if share == 0 || uuid.is_empty() {
                    return None;
                }
                let seat = Board::open_or_create(dir, &uuid)
                    .and_then(|board| Ok((board.claim(key, share, mode, now)?, board)));
                match seat {
                    Ok((slot, board)) => Some(Seat {
                        board,
                        key,
                        slot: AtomicUsize::new(slot),
                        share,
                        mode,
                        borrowing,
                        window_start: AtomicU64::new(0),
                        others_then: AtomicU64::new(0),
                        others_bp: AtomicU64::new(0),
                        rate: AtomicU64::new(share),
                    }),
                    Err(e) => {
                        if borrowing {
                            log_line(&format!("device {dev}: {e}; the share is a hard cap"));
                        }
                        None
                    }
                }
            })
            .collect();
        seats
            .iter()
            .any(Option::is_some)
            .then_some(Boards { seats })
    }

    /// Publishes `busy_ns` of GPU time measured on `dev`.
    #[inline]
    pub fn record(&self, dev: usize, busy_ns: u64, now_ns: u64) {
        if let Some(Some(s)) = self.seats.get(dev) {
            if let Some(slot) = s.own_slot(now_ns) {
                s.board.record(slot, busy_ns, now_ns);
            }
        }
    }

    /// The refill rate for `dev` now: None when it does not borrow (the
    /// share applies).
    #[inline]
    pub fn rate(&self, dev: usize, now_ns: u64) -> Option<u64> {
        let s = self.seats.get(dev)?.as_ref().filter(|s| s.borrowing)?;
        let start = s.window_start.load(Ordering::Acquire);
        if now_ns.saturating_sub(start) >= WINDOW_NS
            && s.window_start
                .compare_exchange(start, now_ns, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            s.update(start, now_ns);
        }
        Some(s.rate.load(Ordering::Relaxed))
    }
}

impl Seat {
    /// Our slot, claimed again if a slice took it over while we were idle
    /// (None: the board is full; this use goes unpublished).
    fn own_slot(&self, now: u64) -> Option<usize> {
        let slot = self.slot.load(Ordering::Relaxed);
        if self.board.holds(slot, self.key) {
            return Some(slot);
        }
        let slot = self
            .board
            .claim(self.key, self.share, self.mode, now)
            .ok()?;
        self.slot.store(slot, Ordering::Relaxed);
        Some(slot)
    }

    /// Closes the window that began at `start` (0: the first one).
    fn update(&self, start: u64, now: u64) {
        let others = self.board.others_busy(self.slot.load(Ordering::Relaxed));
        let then = self.others_then.swap(others, Ordering::AcqRel);
        // A slot taken over by a new slice restarts at zero: skip that
        // window rather than read a huge difference.
        if start == 0 || others < then {
            return;
        }
        let used_bp = (u128::from(others - then) * u128::from(FULL_SHARE)
            / u128::from((now - start).max(1)))
        .min(u128::from(FULL_SHARE)) as u64;
        // Smoothed over ~4 windows, but up at once: a slice that gets busy
        // must get its share back quickly; idle time is taken gradually.
        let old = self.others_bp.load(Ordering::Relaxed);
        let smoothed = if used_bp >= old {
            used_bp
        } else {
            old - (old - used_bp) / 4
        };
        self.others_bp.store(smoothed, Ordering::Relaxed);
        let free = FULL_SHARE.saturating_sub(smoothed + MARGIN_BP);
        self.rate.store(free.max(self.share), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_ledger::{DeviceSpec, UNLIMITED};

    fn ledger(dir: &Path, name: &str, share: u64) -> Ledger {
        let l = Ledger::create(
            &dir.join(name),
            name,
            &[DeviceSpec {
                uuid: "GPU-b0a4d".into(),
                cap: UNLIMITED,
            }],
        )
        .unwrap();
        l.set_compute(0, share, 20_000_000).unwrap();
        l
    }

    #[test]
    fn a_borrower_takes_what_the_others_leave_and_gives_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let boards = dir.path().join("boards");
        let (la, lb) = (ledger(dir.path(), "a", 3000), ledger(dir.path(), "b", 5000));
        let a = Boards::open(&la, &[3000], Mode::Guaranteed, &boards).unwrap();
        let b = Boards::open(&lb, &[5000], Mode::Cap, &boards).unwrap();
        assert_eq!(b.rate(0, 1), None, "a capped slice never borrows");
        let ms = 1_000_000;
        assert_eq!(a.rate(0, 100 * ms), Some(3000), "first window: the share");
        // b idle for a window: a may use all but the margin.
        assert_eq!(a.rate(0, 120 * ms), Some(FULL_SHARE - MARGIN_BP));
        // b busy at its 50 %: a is back to 100 - 50 - 5 = 45 % at once.
        b.record(0, 10 * ms, 130 * ms);
        assert_eq!(a.rate(0, 140 * ms), Some(4500));
        // Within a window nothing is re-read.
        b.record(0, 20 * ms, 145 * ms);
        assert_eq!(a.rate(0, 150 * ms), Some(4500));
        // b takes all it can: a keeps its guaranteed 30 %.
        b.record(0, 18 * ms, 160 * ms);
        assert_eq!(a.rate(0, 160 * ms), Some(3000));
        // b goes idle: a takes the time back gradually.
        let rates: Vec<u64> = (9..14).map(|w| a.rate(0, w * 20 * ms).unwrap()).collect();
        assert!(rates.windows(2).all(|w| w[0] <= w[1]), "{rates:?}");
        assert!(
            rates[4] > 3000 && rates[4] < FULL_SHARE - MARGIN_BP,
            "{rates:?}"
        );
    }

    #[test]
    fn a_slot_taken_over_while_idle_is_claimed_anew() {
        let dir = tempfile::tempdir().unwrap();
        let boards = dir.path().join("boards");
        let la = ledger(dir.path(), "a", 3000);
        let a = Boards::open(&la, &[3000], Mode::Cap, &boards).unwrap();
        let first = a.seats[0].as_ref().unwrap().slot.load(Ordering::Relaxed);
        // a stays silent past STALE_NS: another slice takes its slot.
        let board = Board::open_or_create(&boards, &la.uuid(0)).unwrap();
        let late = crate::compute::now_ns() + board::STALE_NS + 1;
        let thief = board.claim(7, 100, Mode::Cap, late).unwrap();
        assert_eq!(thief, first);
        // a's next use goes to a slot of its own, not into the thief's.
        a.record(0, 5_000, late);
        let snap = board.snapshot();
        let key = board::ledger_key(la.path().unwrap()).unwrap();
        let (mine, slot) = snap.iter().find(|(_, s)| s.key == key).unwrap();
        assert_ne!(*mine, thief);
        assert_eq!(slot.busy_ns, 5_000);
        assert_eq!(snap.iter().find(|(s, _)| *s == thief).unwrap().1.busy_ns, 0);
    }

    #[test]
    fn without_a_board_directory_nobody_borrows_and_nothing_fails() {
        let dir = tempfile::tempdir().unwrap();
        let l = ledger(dir.path(), "c", 2000);
        let unusable = dir.path().join("c").join("boards"); // below a file
        assert!(Boards::open(&l, &[2000], Mode::Guaranteed, &unusable).is_none());
    }
}
