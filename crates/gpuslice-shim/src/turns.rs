//! Slices take turns on a GPU: the work of one slice at a time is on it.
//!
//! Without MPS the GPU never runs two contexts' kernels at once; it
//! time-slices them. An event pair around a kernel then measures the
//! kernel *and* whatever another context ran while it was switched out,
//! so the slice with work in flight is charged for its neighbour's time
//! (on the H200 a 30/70 pair of 8192² GEMM slices was 13.6 % off 3:7 with
//! the time shares held exactly, docs/compute-share.md). Taking turns
//! removes the overlap: a slice launches only while it has the GPU's turn
//! (a word on the GPU's board, [`gpuslice_ledger::board::Turn`]), and
//! before it gives the turn to a waiting slice its queued work has
//! finished. Each slice's events then time its own work alone.
//!
//! - A turn lasts [`QUANTUM_NS`] while another slice waits; nobody
//!   waiting, the holder keeps it (a slice alone never drains).
//! - A slice taking turns queues at most a turn's worth of work per
//!   thread; with a waiter, a launch that would start after the end of
//!   the turn (after the work already queued) hands over first. Nobody
//!   waiting, the turn is extended past the queued work.
//! - A holder about to wait for its own bucket hands over at once
//!   ([`yield_idle`]): the GPU is not left idle for the turn's rest.
//! - A turn is passed to the next waiting slot (in a circle from the
//!   holder's), which a futex on the board wakes; a turn not passed on
//!   [`GRACE_NS`] after its end is taken.
//!
//! **Trust.** The board is writable by every tenant of the GPU, so a
//! hostile slice can hold the turn, or forge one, forever, or forge
//! waiters that are passed the turn and never use it. A waiter waits at
//! most [`MAX_WAIT_NS`] in all for one launch, and takes a turn not passed
//! on [`GRACE_NS`] after its end once a second; past either, the turns of
//! that GPU are ignored for [`BACKOFF_NS`] (the GPU's own time-slicing, as
//! without turns). So a liar's waits cost a slice at most `MAX_WAIT_NS`
//! plus two turns and their grace (32 ms) per `BACKOFF_NS` beyond what its
//! share already allows (its bucket refills meanwhile); but a liar that
//! forges again every millisecond keeps the GPU's slices without turns,
//! and so mis-charged as without them (measured in docs/security.md: a
//! 70 % slice beside a 30 % one fell from ~61 % to ~52 %); one that keeps to the
//! protocol gets a turn in two, as a neighbour that launches without
//! pause gets half the GPU from the time-slicing itself.
//!
//! Not covered: the queued work of *other* threads or processes of the
//! holding slice is not waited for when one of them hands over (each
//! drains its own), and a launch from a context whose events cannot be
//! used is not held (it is charged by estimate anyway).

use std::sync::atomic::{AtomicU64, Ordering};

use gpuslice_ledger::board::{Board, Turn};
use gpuslice_ledger::MAX_DEVICES;

use crate::driver::now_ns;
use crate::state::shim;

/// How long a turn lasts while another slice waits for it.
pub const QUANTUM_NS: u64 = 4_000_000;
/// A turn not passed on this long after its end is taken (its holder's
/// last launch may start at the end and run this long).
pub const GRACE_NS: u64 = QUANTUM_NS;
/// The longest a launch waits for the turn before the GPU's turns are
/// ignored for [`BACKOFF_NS`] (a turn held or forged against the rules).
pub const MAX_WAIT_NS: u64 = 4 * QUANTUM_NS;
pub const BACKOFF_NS: u64 = 1_000_000_000;

/// Per device: until when this process ignores the GPU's turns.
static IGNORE_UNTIL: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Per device: when this process last found a turn not passed on in time.
static LAST_FAULT: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// What a turn needs of the launching thread's queued work.
pub trait Queue {
    /// Estimated GPU time of this thread's work still queued (ns).
    fn queued_ns(&self) -> u64;
    /// Closes the open group: the thread is about to wait.
    fn close(&self);
    /// Waits until this thread's queued work is done (and settles it).
    fn drain(&self);
    /// Waits until this thread's queued work is estimated at `ns` at most.
    fn trim(&self, ns: u64);
}

/// The board of `dev` and our slot on it, when this process takes turns
/// there now.
fn seat(dev: usize, now: u64) -> Option<(&'static Board, usize)> {
    let s = shim();
    if !s.handover || IGNORE_UNTIL.get(dev)?.load(Ordering::Relaxed) > now {
        return None;
    }
    s.boards.as_ref()?.seat(dev, now)
}

/// Waits until this slice has `dev`'s turn for a launch estimated at
/// `est_ns`, handing the turn over first when it is ours, others wait,
/// and the launch would start after its end.
pub fn acquire(dev: usize, est_ns: u64, queue: &dyn Queue) {
    let Some((board, slot)) = seat(dev, now_ns()) else {
        return;
    };
    // Never more queued than a turn holds, so that handing over (and a
    // waiter's wait) takes a turn's length at most.
    queue.trim(QUANTUM_NS.saturating_sub(est_ns));
    // When we began waiting for another slice's turn.
    let mut waiting_since: Option<u64> = None;
    loop {
        let now = now_ns();
        let seq = board.turn_seq();
        let turn = board.turn();
        match turn.holder() {
            None => {
                if board.take_turn(turn, slot, now + QUANTUM_NS) {
                    break;
                }
            }
            Some(h) if h == slot => {
                let until = turn.until_ns();
                // When the work queued before this launch ends.
                let start = now + queue.queued_ns();
                let Some(next) = board.next_waiting(slot) else {
                    // Nobody waits: the turn is extended, always past our
                    // queued work, so that one who comes waits for that.
                    if until < start + est_ns + QUANTUM_NS / 2 {
                        board.take_turn(turn, slot, (start + est_ns).max(now + QUANTUM_NS));
                    }
                    break;
                };
                // A launch that starts within the turn is ours to make (a
                // turn is not cut short by a kernel's length).
                if start <= until {
                    break;
                }
                // Our turn is up and `next` waits: our queued work first,
                // so that theirs starts on an idle GPU.
                pass(board, turn, next, queue);
            }
            Some(h) => {
                let since = *waiting_since.get_or_insert(now);
                if now - since > MAX_WAIT_NS {
                    ignore_turns(dev, now);
                    break;
                }
                let until = turn.until_ns();
                if now > until + GRACE_NS {
                    // Not passed on in time: its holder died, or lies (a
                    // forged waiter that was passed the turn). Once a
                    // second that is taken in stride; twice, the GPU's
                    // turns are ignored.
                    if repeated_fault(dev, now) {
                        ignore_turns(dev, now);
                        break;
                    }
                    // Taken, and its holder no longer counts as waiting
                    // (a live one says so again).
                    if board.take_turn(turn, slot, now + QUANTUM_NS) {
                        board.set_waiting(h, false);
                        break;
                    }
                    continue;
                }
                if now == since {
                    queue.close();
                }
                board.set_waiting(slot, true);
                let left = (until + GRACE_NS - now).min(MAX_WAIT_NS - (now - since));
                board.wait_turn(seq, left.max(10_000));
            }
        }
    }
    if waiting_since.is_some() {
        board.set_waiting(slot, false);
    }
}

/// Hands our `turn` to the waiting slot `next`, once our queued work is
/// done: a full turn from now.
fn pass(board: &Board, turn: Turn, next: usize, queue: &dyn Queue) {
    queue.drain();
    board.pass_turn(turn, next, now_ns() + QUANTUM_NS);
}

/// Before this thread waits for its own bucket: a turn of ours that a
/// waiter wants is handed over now (our queued work first).
pub fn yield_idle(dev: usize, queue: &dyn Queue) {
    let Some((board, slot)) = seat(dev, now_ns()) else {
        return;
    };
    let turn = board.turn();
    if turn.holder() == Some(slot) {
        if let Some(next) = board.next_waiting(slot) {
            pass(board, turn, next, queue);
        }
    }
}

/// Records a turn found not passed on in time; whether another was found
/// less than [`BACKOFF_NS`] before.
fn repeated_fault(dev: usize, now: u64) -> bool {
    let last = LAST_FAULT[dev].swap(now, Ordering::Relaxed);
    last != 0 && now - last < BACKOFF_NS
}

fn ignore_turns(dev: usize, now: u64) {
    IGNORE_UNTIL[dev].store(now + BACKOFF_NS, Ordering::Relaxed);
    if shim().log {
        crate::sys::log_line(&format!(
            "device {dev}: waited {} ms for the GPU's turn; turns ignored for {} s \
             (one held or forged against the rules)",
            MAX_WAIT_NS / 1_000_000,
            BACKOFF_NS / 1_000_000_000
        ));
    }
}
