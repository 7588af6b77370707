//! What the other slices of a GPU do to a slice's refill rate, read from
//! the GPU's board ([`gpuslice_ledger::board`]): every slice with a share,
//! in either mode, adds the GPU time it measures to its slot there, and
//! every [`WINDOW_NS`] one thread of each process turns the growth of the
//! other slots into rates (smoothed over ~4 windows, up at once) and sets
//! its bucket's [`Refill`]:
//!
//! - **Oversubscription.** When the busy slices' shares add up to more
//!   than the whole GPU, each refills at its share scaled by
//!   `100 % / sum`, so they keep their proportions. Shares that add up to
//!   100 % or less are not scaled: the slices take turns on the GPU
//!   ([`crate::turns`]), so no context switch eats into a busy slice's
//!   work and the GPU can be kept busy all the time. (Before the turns, a
//!   90 % capacity stood in for the time the GPU's time-slicing lost.)
//! - **Borrowing** (`GPUSLICE_COMPUTE_MODE=guaranteed`): a slice's share is
//!   what it is *guaranteed*; while the others leave time idle its bucket
//!   refills at `100 % − others − margin` instead. When another slice gets
//!   busy its use shows within a few windows and the borrower falls back
//!   to its share; the margin is what a slice coming back from idle runs
//!   on until then.
//!
//! Not seen: GPU work of processes outside any slice with a share (a
//! borrower may take time from them, as time-slicing would anyway).
//!
//! **Trust.** The board is writable by every tenant of the GPU. A slice
//! whose limits come from a root-written record ([`Ledger::pinned`]) counts
//! another slot's demand only when root recorded a share for it
//! ([`board::root_share`]), and then at most that share; so whatever is
//! forged on the board (slots, shares, busy or zeroed counters), its scale
//! never falls below `100 % / Σ root-written shares of the slots present`
//! ([`scale_for`] with every such slot pressing on its whole share). The
//! same record decides whose turns it waits for and passes the turn to
//! ([`Boards::counted`]). A guaranteed slice keeps
//! `share × floor` too, as borrowing only ever adds. Self-imposed slices
//! (environment only) trust the slots' own shares, as before.

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use gpuslice_ledger::board::{self, Board, Mode, BOARD_SLOTS};
use gpuslice_ledger::{Ledger, Refill, FULL_SHARE, MAX_DEVICES};

use crate::sys::log_line;

/// How often the board is re-read.
pub const WINDOW_NS: u64 = 20_000_000;
/// Idle time a borrower leaves unused, so a slice that wakes up gets GPU
/// time (and shows on the board) before the borrower backs off.
pub const MARGIN_BP: u64 = 500;
/// A slice using less than this is not counted as busy (noise, a probe).
const BUSY_FLOOR_BP: u64 = 100;
/// How long a root-written share read for a slot is trusted before it is
/// read again (a record goes when its slice ends).
const ROOT_SHARE_TTL_NS: u64 = 1_000_000_000;

/// The board as seen at the end of the last window.
struct Window {
    /// Per slot: the key and GPU time read then.
    seen: [(u64, u64); BOARD_SLOTS],
    /// Per slot: smoothed use, basis points of wall time.
    use_bp: [u64; BOARD_SLOTS],
    /// Per slot: the key, its root-written share (None: nobody vouched for
    /// it) and when that was read.
    roots: [(u64, Option<u64>, u64); BOARD_SLOTS],
}

/// One device's board slot and the refill worked out from the board.
struct Seat {
    board: Board,
    key: u64,
    /// Our slot; moves if another slice took it over while we were idle.
    slot: AtomicUsize,
    share: u64,
    mode: Mode,
    /// Other slots' shares only from root-written records (our own limits
    /// are root's): in `dir`, for GPU `uuid`.
    root_shares: Option<(std::path::PathBuf, String)>,
    /// Start of the current window (CLOCK_MONOTONIC ns; 0: not started).
    window_start: AtomicU64,
    /// Only the thread that closes a window touches it (try_lock: never
    /// waits).
    window: Mutex<Window>,
    /// The [`Refill`] in force (two words: a reader may see one window's
    /// scale with the next one's borrow, which is harmless).
    scale_bp: AtomicU64,
    borrow_bp: AtomicU64,
    /// The slots whose turns count ([`Boards::counted`]), one bit each.
    counted: AtomicU64,
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
        .unwrap_or_else(|| board::slice_key(u64::from(std::process::id()), crate::driver::now_ns()))
}

impl Boards {
    /// Takes a seat on the board of every device with a share, in either
    /// mode: every slice must be seen by the others, whenever it started.
    /// (Cost: a file opened at start, one atomic add per measured launch
    /// and one read of the board per window.)
    pub fn open(ledger: &Ledger, shares: &[u64], mode: Mode, dir: &Path) -> Option<Boards> {
        // Best effort: a non-root slice may not create it under /run
        // (`gpuslice run` does, as root, sticky and world-writable).
        let _ = std::fs::create_dir_all(dir);
        let key = slice_key(ledger);
        let now = crate::driver::now_ns();
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
                        counted: AtomicU64::new(counted_slots(
                            &board,
                            ledger.pinned().then_some((dir, uuid.as_str())),
                        )),
                        board,
                        key,
                        slot: AtomicUsize::new(slot),
                        share,
                        mode,
                        root_shares: ledger.pinned().then(|| (dir.to_path_buf(), uuid.clone())),
                        window_start: AtomicU64::new(0),
                        window: Mutex::new(Window {
                            seen: [(0, 0); BOARD_SLOTS],
                            use_bp: [0; BOARD_SLOTS],
                            roots: [(0, None, 0); BOARD_SLOTS],
                        }),
                        scale_bp: AtomicU64::new(FULL_SHARE),
                        borrow_bp: AtomicU64::new(0),
                    }),
                    Err(e) => {
                        log_line(&format!(
                            "device {dev}: {e}; the share applies as it is, whatever \
                             the other slices of the GPU do"
                        ));
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

    /// `dev`'s board and this slice's slot on it (None: no seat), for
    /// taking turns on the GPU ([`crate::turns`]).
    #[inline]
    pub fn seat(&self, dev: usize, now_ns: u64) -> Option<(&Board, usize)> {
        let s = self.seats.get(dev)?.as_ref()?;
        Some((&s.board, s.own_slot(now_ns)?))
    }

    /// The slots of `dev`'s board whose turns this slice honours and
    /// passes the turn to, one bit each: those root recorded a share for
    /// when this slice's limits are root's (a slot anyone forged on the
    /// board is neither waited for nor passed the turn), re-read every
    /// [`WINDOW_NS`]; else every slot (self-imposed slices trust the
    /// board, as for shares).
    #[inline]
    pub fn counted(&self, dev: usize) -> u64 {
        self.seats
            .get(dev)
            .and_then(Option::as_ref)
            .map_or(0, |s| s.counted.load(Ordering::Relaxed))
    }

    /// How `dev`'s bucket refills now, for a slice whose share is
    /// `share_bp` (None: no seat, the share applies).
    #[inline]
    pub fn refill(&self, dev: usize, now_ns: u64, share_bp: u64) -> Option<Refill> {
        let s = self.seats.get(dev)?.as_ref()?;
        let start = s.window_start.load(Ordering::Acquire);
        if now_ns.saturating_sub(start) >= WINDOW_NS
            && s.window_start
                .compare_exchange(start, now_ns, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            s.update(start, now_ns, share_bp);
        }
        Some(Refill {
            scale_bp: s.scale_bp.load(Ordering::Relaxed),
            borrow_bp: s.borrow_bp.load(Ordering::Relaxed),
        })
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

    /// Closes the window that began at `start` (0: the first one, which
    /// only takes the readings) for a slice whose share is now `share`.
    fn update(&self, start: u64, now: u64, share: u64) {
        let Ok(mut w) = self.window.try_lock() else {
            return;
        };
        let own = self.slot.load(Ordering::Relaxed);
        if self.board.holds(own, self.key) {
            self.board.set_share(own, share);
        }
        let (mut others, mut demand, mut counted) = (0u64, 0u64, 0u64);
        for s in 0..BOARD_SLOTS {
            let other = self.board.slot(s).filter(|_| s != own);
            let now_seen = other.map_or((0, 0), |o| (o.key, o.busy_ns));
            let root = match &self.root_shares {
                Some((dir, uuid)) if now_seen.0 != 0 => {
                    root_share_of(&mut w.roots[s], dir, uuid, now_seen.0, now)
                }
                _ => None,
            };
            if self.root_shares.is_none() || root.is_some() {
                counted |= 1 << s;
            }
            let then = std::mem::replace(&mut w.seen[s], now_seen);
            // An empty slot, or one taken over by a new slice (its count
            // restarts): skip it this window rather than read a jump.
            if start == 0 || now_seen.0 == 0 || then.0 != now_seen.0 || now_seen.1 < then.1 {
                w.use_bp[s] = 0;
                continue;
            }
            let used = (u128::from(now_seen.1 - then.1) * u128::from(FULL_SHARE)
                / u128::from((now - start).max(1)))
            .min(u128::from(FULL_SHARE)) as u64;
            let old = w.use_bp[s];
            // Up at once: a slice that gets busy must get its share back
            // quickly; idle time is taken gradually.
            let smoothed = if used >= old {
                used
            } else {
                old - (old - used) / 4
            };
            w.use_bp[s] = smoothed;
            others += smoothed;
            let claimed = other.map_or(0, |o| o.share_bp);
            demand += match (&self.root_shares, root) {
                (None, _) => slice_demand(smoothed, claimed),
                // Never more than root gave it, whatever it claims.
                (Some(_), Some(root)) => slice_demand(smoothed, root).min(root),
                (Some(_), None) => 0,
            };
        }
        self.counted.store(counted, Ordering::Relaxed);
        if start == 0 {
            return;
        }
        self.scale_bp
            .store(scale_for(share, demand), Ordering::Relaxed);
        let borrow = match self.mode {
            Mode::Guaranteed => FULL_SHARE.saturating_sub(others + MARGIN_BP),
            Mode::Cap => 0,
        };
        self.borrow_bp.store(borrow, Ordering::Relaxed);
    }
}

/// The slots of `board` whose turns count: with `root` (the board
/// directory and the GPU's UUID, for a slice whose limits are root's),
/// the claimed slots with a root-written share record; else all.
fn counted_slots(board: &Board, root: Option<(&Path, &str)>) -> u64 {
    let Some((dir, uuid)) = root else {
        return u64::MAX;
    };
    (0..BOARD_SLOTS)
        .filter_map(|s| Some((s, board.slot(s)?.key)))
        .filter(|&(_, key)| board::root_share(dir, uuid, key).is_some())
        .fold(0, |m, (s, _)| m | 1 << s)
}

/// The root-written share of the slot keyed `key`, re-read at most every
/// [`ROOT_SHARE_TTL_NS`] (`cache`: what was read for that slot).
fn root_share_of(
    cache: &mut (u64, Option<u64>, u64),
    dir: &Path,
    uuid: &str,
    key: u64,
    now: u64,
) -> Option<u64> {
    if cache.0 != key || now.saturating_sub(cache.2) >= ROOT_SHARE_TTL_NS {
        *cache = (key, board::root_share(dir, uuid, key), now);
    }
    cache.1
}

/// What another slice asks of the GPU: its share while it uses at least
/// half of it (it is pressing on its share, or borrowing beyond it), else
/// what it uses.
fn slice_demand(use_bp: u64, share_bp: u64) -> u64 {
    if use_bp < BUSY_FLOOR_BP {
        0
    } else if share_bp > 0 && use_bp >= share_bp / 2 {
        share_bp
    } else {
        use_bp
    }
}

/// The part of our `share` that applies while the other slices ask for
/// `demand`: all of it unless together they ask for more than the GPU
/// has, then the same proportion for every slice.
fn scale_for(share: u64, demand: u64) -> u64 {
    let total = share + demand;
    if demand == 0 || total <= FULL_SHARE {
        FULL_SHARE
    } else {
        FULL_SHARE * FULL_SHARE / total
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

    /// Slice `name`'s ledger under `dir`, with share `share`, and its seat
    /// on the boards in `dir`/boards.
    fn seated(dir: &Path, name: &str, share: u64, mode: Mode) -> (Ledger, Boards) {
        let l = ledger(dir, name, share);
        let b = Boards::open(&l, &[share], mode, &dir.join("boards")).unwrap();
        (l, b)
    }

    /// The refill rate `b` gives a slice of share `share` at `now`.
    fn rate(b: &Boards, share: u64, now: u64) -> u64 {
        b.refill(0, now, share).unwrap().rate(share)
    }

    #[test]
    fn a_borrower_takes_what_the_others_leave_and_gives_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let (_la, a) = seated(dir.path(), "a", 3000, Mode::Guaranteed);
        let (_lb, b) = seated(dir.path(), "b", 5000, Mode::Cap);
        assert_eq!(rate(&b, 5000, 1), 5000, "a capped slice never borrows");
        let ms = 1_000_000;
        assert_eq!(rate(&a, 3000, 100 * ms), 3000, "first window: the share");
        // b idle for a window: a may use all but the margin.
        assert_eq!(rate(&a, 3000, 120 * ms), FULL_SHARE - MARGIN_BP);
        // b busy at its 50 %: a is back to 100 - 50 - 5 = 45 % at once.
        b.record(0, 10 * ms, 130 * ms);
        assert_eq!(rate(&a, 3000, 140 * ms), 4500);
        // Within a window nothing is re-read.
        b.record(0, 20 * ms, 145 * ms);
        assert_eq!(rate(&a, 3000, 150 * ms), 4500);
        // b takes all it can: a keeps its guaranteed 30 %.
        b.record(0, 18 * ms, 160 * ms);
        assert_eq!(rate(&a, 3000, 160 * ms), 3000);
        // b goes idle: a takes the time back gradually.
        let rates: Vec<u64> = (9..14).map(|w| rate(&a, 3000, w * 20 * ms)).collect();
        assert!(rates.windows(2).all(|w| w[0] <= w[1]), "{rates:?}");
        assert!(
            rates[4] > 3000 && rates[4] < FULL_SHARE - MARGIN_BP,
            "{rates:?}"
        );
    }

    #[test]
    fn oversubscribed_busy_slices_keep_their_proportions() {
        let dir = tempfile::tempdir().unwrap();
        let (_la, a) = seated(dir.path(), "a", 5000, Mode::Cap);
        let (_lb, b) = seated(dir.path(), "b", 5000, Mode::Cap);
        let ms = 1_000_000;
        // Window `w` closes at w * 20 ms; a and b each used `a_ms`, `b_ms`
        // of GPU time in it. Returns both rates.
        let window = |w: u64, a_ms: u64, b_ms: u64, b_share: u64| {
            a.record(0, a_ms * ms, w * 20 * ms - ms);
            b.record(0, b_ms * ms, w * 20 * ms - ms);
            (rate(&a, 5000, w * 20 * ms), rate(&b, b_share, w * 20 * ms))
        };
        assert_eq!(window(5, 0, 0, 5000), (5000, 5000), "first window");
        // Both busy, 50 + 50: the whole GPU, nobody is scaled (the slices
        // take turns, nothing is lost to time-slicing).
        assert_eq!(window(6, 10, 10, 5000), (5000, 5000));
        // b's share changed live to 75 %: 50 + 75 asks for 125 % of the
        // GPU, so each gets 100/125 of its share (a sees b's new share
        // once b has published it, a window later).
        window(7, 10, 12, 7500);
        assert_eq!(window(8, 10, 12, 7500), (4000, 6000));
        // b using under half of its share: a, busy at its share, counts
        // only b's use and keeps its 50 %; b's own rate is scaled (50 + 75
        // > 100), which costs it nothing while it uses 20 %.
        let rates: Vec<_> = (9..15).map(|w| window(w, 10, 4, 7500)).collect();
        assert_eq!(rates.last(), Some(&(5000, 6000)), "{rates:?}");
        // Alone, even a 95 % share is not scaled.
        let dir = tempfile::tempdir().unwrap();
        let (_lc, c) = seated(dir.path(), "c", 9500, Mode::Cap);
        c.record(0, 19 * ms, 119 * ms);
        assert_eq!(rate(&c, 9500, 100 * ms), 9500);
        assert_eq!(rate(&c, 9500, 120 * ms), 9500);
    }

    /// A ledger whose limits are root's (pinned), with a root-written
    /// share record on the board directory.
    fn pinned(dir: &Path, boards: &Path, name: &str, share: u64) -> Ledger {
        let mut l = ledger(dir, name, share);
        let limits = gpuslice_ledger::limits::SliceLimits {
            slice_id: name.into(),
            mode: Mode::Cap,
            devices: vec![gpuslice_ledger::limits::DeviceLimits {
                uuid: l.uuid(0),
                memory: None,
                compute: gpuslice_ledger::limits::ComputeShare::from_basis_points(share),
            }],
        };
        l.pin(&limits).unwrap();
        gpuslice_ledger::ensure_dir(boards).unwrap();
        let key = board::ledger_key(l.path().unwrap()).unwrap();
        board::publish_share(boards, &l.uuid(0), key, share).unwrap();
        l
    }

    /// The attack: forged busy slots claiming 100 % shares took a
    /// capped 30 % slice to 6.8 %. With root-written shares they count for
    /// nothing; a real slice counts for at most its recorded share; zeroed
    /// counters only make the others look idle. Runs as root (CI).
    #[test]
    fn forged_slots_full_boards_and_zeroed_counters_stay_within_the_floor() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "share records need root");
        let dir = tempfile::tempdir().unwrap();
        let boards = dir.path().join("boards");
        let la = pinned(dir.path(), &boards, "a", 3000);
        let a = Boards::open(&la, &[3000], Mode::Cap, &boards).unwrap();
        let ms = 1_000_000;
        let board = Board::open_or_create(&boards, &la.uuid(0)).unwrap();
        // Ten forged slots, "busy" at 100 % with 100 % shares.
        let forged: Vec<usize> = (0..10)
            .map(|k| board.claim(1000 + k, FULL_SHARE, Mode::Cap, 1).unwrap())
            .collect();
        let window = |w: u64, forged_ms: u64| {
            for &s in &forged {
                board.record(s, forged_ms * ms, w * 20 * ms - ms);
            }
            a.record(0, 6 * ms, w * 20 * ms - ms);
            rate(&a, 3000, w * 20 * ms)
        };
        assert_eq!(window(5, 0), 3000);
        for w in 6..12 {
            assert_eq!(
                window(w, 20),
                3000,
                "window {w}: forged slots moved a capped slice"
            );
        }
        // A real slice b with a root-written 90 %, busy: a is scaled to
        // 100 % / (30 + 90) of its share, never lower, forged slots or not.
        let lb = pinned(dir.path(), &boards, "b", 9000);
        let b = Boards::open(&lb, &[9000], Mode::Cap, &boards).unwrap();
        // b also lies on the board: it claims all of the GPU as its share.
        let bslot = b.seats[0].as_ref().unwrap().slot.load(Ordering::Relaxed);
        let floor = 3000 * (FULL_SHARE * FULL_SHARE / (3000 + 9000)) / FULL_SHARE;
        let mut seen = Vec::new();
        for w in 12..20 {
            board.set_share(bslot, FULL_SHARE);
            b.record(0, 19 * ms, w * 20 * ms - ms);
            seen.push(window(w, 20));
        }
        assert!(seen.iter().all(|&r| r >= floor), "{seen:?} below {floor}");
        assert_eq!(seen.last(), Some(&floor), "{seen:?}");
        // Zeroed counters (b's, forged ones): the others look idle, and a
        // capped slice goes back to its share, never above it.
        for w in 20..40 {
            // As an attacker would: straight into the (world-writable) file.
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(board.path())
                .unwrap();
            for &s in forged.iter().chain([&bslot]) {
                std::os::unix::fs::FileExt::write_at(&f, &[0u8; 8], (64 + s * 64 + 24) as u64)
                    .unwrap();
            }
            let r = window(w, 0);
            assert!((floor..=3000).contains(&r), "window {w}: {r}");
        }
        // A full board: a new slice gets no seat, and its share applies
        // unscaled (nobody can push it down through the board).
        for k in 0..BOARD_SLOTS as u64 {
            let _ = board.claim(5000 + k, FULL_SHARE, Mode::Cap, crate::driver::now_ns());
        }
        let lc = pinned(dir.path(), &boards, "c", 2000);
        assert!(Boards::open(&lc, &[2000], Mode::Cap, &boards).is_none());
    }

    #[test]
    fn a_slot_taken_over_while_idle_is_claimed_anew() {
        let dir = tempfile::tempdir().unwrap();
        let boards = dir.path().join("boards");
        let (la, a) = seated(dir.path(), "a", 3000, Mode::Cap);
        let first = a.seats[0].as_ref().unwrap().slot.load(Ordering::Relaxed);
        // a stays silent past STALE_NS: another slice takes its slot.
        let board = Board::open_or_create(&boards, &la.uuid(0)).unwrap();
        let late = crate::driver::now_ns() + board::STALE_NS + 1;
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
