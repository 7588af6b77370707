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
//! - **One party per slice.** The turn belongs to a slot (a slice) and,
//!   within it, to one process (a tag in the turn word): the processes of
//!   a slice are contexts of their own, which the GPU would time-slice
//!   into each other's measurements too. A slice is passed the turn once
//!   per round, whatever its number of processes: the process that takes
//!   it up launches, the others wait (their waits make the slot wait).
//!   Which one takes it up is the slice's *line*'s to say
//!   ([`TurnOrder`], in the slice's own ledger, which no neighbour can
//!   write): the next in line at once, the one after it [`TAKE_UP_NS`]
//!   later, and so on; a holder passes to its own slot only when the line
//!   says a sibling waits, and joins its back. A waiter's round bound
//!   restarts whenever its slice's line moves (the slice was served).
//! - A launch not estimated yet waits for its thread's queued work, so
//!   that a new process's first launches are measured alone and do not
//!   queue work no turn bounds.
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
//! waiters that are passed the turn and never use it. A slice whose limits
//! are root's waits for, and passes the turn to, only slots root recorded
//! a share for ([`crate::borrow::Boards::counted`]): forged slots are
//! neither. A waiter waits at most a round in all for one launch (a turn
//! and its grace for every counted slot that waits, 15 at most, and two
//! more: [`wait_bound`]), and takes a turn not passed on [`GRACE_NS`] after its
//! end once a second, as it finds a turn of its own taken before its end
//! or its idle time (no one keeping to the rules does; a forger does); past either, the turns of that GPU are ignored for
//! [`BACKOFF_NS`] (the GPU's own time-slicing, as without turns) and the
//! fallback is counted on the board. So a liar's waits cost a slice at
//! most a round plus two turns and their grace per `BACKOFF_NS` beyond
//! what its share already allows (its bucket refills meanwhile); but a liar that
//! forges again every millisecond keeps the GPU's slices without turns,
//! and so mis-charged as without them (measured in docs/security.md: a
//! 70 % slice beside a 30 % one fell from ~61 % to ~52 %); one that keeps to the
//! protocol gets a turn in two, as a neighbour that launches without
//! pause gets half the GPU from the time-slicing itself.
//!
//! A hand-over by one thread of the holding process lets no other start a
//! launch, waits for the launches they are making, and then for every
//! thread's queued work ([`Queue::drain_process`]). Not covered: another
//! thread's open group (at most a group's worth of work), and a launch
//! from a context whose events cannot be used is not held (it is charged
//! by estimate anyway).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use gpuslice_ledger::board::{Board, Turn, TURN_TAG_MAX};
use gpuslice_ledger::turn_order::{distance, in_line, TurnOrder};
use gpuslice_ledger::MAX_DEVICES;

use crate::driver::now_ns;
use crate::state::shim;

/// How long a turn lasts while another slice waits for it.
pub const QUANTUM_NS: u64 = 4_000_000;
/// A holder whose queued work ended this long ago (by its own estimate,
/// [`Board::tail`]) and which launched nothing since has gone idle (or
/// died): a waiter takes the turn, which is no fault.
pub const IDLE_NS: u64 = 1_000_000;
/// A turn not passed on this long after its end is taken (its holder's
/// last launch may start at the end and run this long).
pub const GRACE_NS: u64 = QUANTUM_NS;
pub const BACKOFF_NS: u64 = 1_000_000_000;

/// Per device: until when this process ignores the GPU's turns.
static IGNORE_UNTIL: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Turns passed on and left unused that a process takes in stride per
/// [`BACKOFF_NS`]: a waker slower than the take-up time is rare, forged
/// waiters leave every turn unused.
const UNUSED_PER_BACKOFF: u64 = 8;
/// Per device: turns found left unused since `UNUSED_SINCE`.
static UNUSED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static UNUSED_SINCE: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Per device: when this process last found a turn not passed on in time.
static LAST_FAULT: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Per device: the turns this process passed on (any thread), so that a
/// hold recorded before a pass is not mistaken for one taken from us.
static PASSES: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Per device: this process's last hold of the turn, [`held_word`]: the
/// [`PASSES`] count when it began (high 16 bits) and until when no
/// process keeping to the rules may take the turn from it (µs, low 48).
static HELD: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
const HELD_US_BITS: u32 = 48;
/// Per device: this process's ticket in its slice's order
/// ([`TurnOrder`]), `HAS_TICKET | ticket`; 0 for none.
static TICKET: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];
const HAS_TICKET: u32 = 0x100;
/// How long the process next in its slice's line has to take up a turn
/// passed to the slice before the one after it may (it left the line, or
/// wakes slowly): per place in the line.
const TAKE_UP_NS: u64 = QUANTUM_NS / 4;

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
    /// Waits until the process's queued work on the device is done: this
    /// thread's (settled, as [`Queue::drain`]) and every other thread's.
    fn drain_process(&self);
}

/// Per device: threads of this process handing its turn over now; while
/// one does, the others launch nothing under that turn.
static PASSING: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];
/// Per device: threads of this process let launch under its turn whose
/// launch has not returned yet ([`Launch`]).
static LAUNCHING: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];

/// A launch let under this process's turn, until it returns (dropped): a
/// hand-over by another thread of the process waits for it to be queued,
/// and then for its work ([`pass`]).
pub struct Launch(Option<usize>);

impl Drop for Launch {
    fn drop(&mut self) {
        if let Some(dev) = self.0 {
            LAUNCHING[dev].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Lets this thread launch under the process's turn of `dev`, unless
/// another of its threads is handing it over.
fn enter(dev: usize) -> Option<Launch> {
    LAUNCHING[dev].fetch_add(1, Ordering::SeqCst);
    let launch = Launch(Some(dev));
    (PASSING[dev].load(Ordering::SeqCst) == 0).then_some(launch)
}

/// This process's tag in the turn word: the same for its threads (one
/// context), another after a fork.
fn tag() -> u32 {
    static TAG: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    let seen = TAG.load(Ordering::Relaxed);
    if seen != 0 && (seen >> 32) as u32 == pid {
        return seen as u32;
    }
    // Distinct between the processes of a slice whatever PID namespaces
    // they run in: from the PID and the time it was first needed.
    let mixed = gpuslice_ledger::board::slice_key(u64::from(pid), now_ns());
    let tag = (mixed % u64::from(TURN_TAG_MAX)) as u32 + 1;
    TAG.store(u64::from(pid) << 32 | u64::from(tag), Ordering::Relaxed);
    tag
}

/// Where this process takes turns on `dev`, when it does now.
struct Seat {
    board: &'static Board,
    /// Our slice's slot on the board.
    slot: usize,
    /// The slots whose turns count ([`crate::borrow::Boards::counted`]).
    among: u64,
    /// Our slice's line for the turns passed to it, in its own ledger.
    order: Option<TurnOrder<'static>>,
}

fn seat(dev: usize, now: u64) -> Option<Seat> {
    let s = shim();
    if !s.handover || IGNORE_UNTIL.get(dev)?.load(Ordering::Relaxed) > now {
        return None;
    }
    let boards = s.boards.as_ref()?;
    let (board, slot) = boards.seat(dev, now)?;
    let order = s.ledger.as_ref().and_then(|l| l.turn_order(dev));
    Some(Seat {
        board,
        slot,
        among: boards.counted(dev),
        order,
    })
}

impl Seat {
    /// This process's ticket in its slice's line on `dev`: the one it
    /// holds while that is still in line, else a new one at the back.
    fn ticket(&self, dev: usize) -> Option<u8> {
        let order = self.order.as_ref()?;
        let held = TICKET[dev].load(Ordering::Relaxed);
        if held & HAS_TICKET != 0 && in_line(distance(order.serving(), held as u8)) {
            return Some(held as u8);
        }
        let t = order.take();
        TICKET[dev].store(HAS_TICKET | u32::from(t), Ordering::Relaxed);
        Some(t)
    }

    /// When this process may take up our slice's turn passed to it at
    /// `passed_at`: at once when it is next in line, else once each
    /// process before it had [`TAKE_UP_NS`] to.
    fn up_at(&self, dev: usize, passed_at: u64) -> u64 {
        match (self.ticket(dev), &self.order) {
            (Some(t), Some(order)) => {
                passed_at + u64::from(distance(order.serving(), t)) * TAKE_UP_NS
            }
            _ => 0,
        }
    }

    /// This process took the turn: its ticket, if still in line, is
    /// served (those before it were passed over and take new ones).
    fn took(&self, dev: usize) {
        let held = TICKET[dev].swap(0, Ordering::Relaxed);
        if let (true, Some(order)) = (held & HAS_TICKET != 0, &self.order) {
            order.served(held as u8);
        }
    }

    /// How many other processes of our slice wait for the turn: from the
    /// slice's own line, which a neighbour cannot forge (the board's
    /// waiting bits are anyone's); None without a line.
    fn siblings_waiting(&self, dev: usize) -> Option<u8> {
        let order = self.order.as_ref()?;
        let held = TICKET[dev].load(Ordering::Relaxed);
        let ours = held & HAS_TICKET != 0 && in_line(distance(order.serving(), held as u8));
        Some(order.waiting().saturating_sub(u8::from(ours)))
    }

    /// The slot the turn goes to after ours ([`Board::next_waiting`]); our
    /// own (a sibling waits) only when our slice's line says one does.
    fn next_waiting(&self, dev: usize) -> Option<usize> {
        let next = self.board.next_waiting(self.slot, self.among)?;
        if next == self.slot && self.siblings_waiting(dev) == Some(0) {
            // Our waiting bit without a sibling in line: stale, or forged
            // to make us drain and hand over to nobody.
            return self
                .board
                .next_waiting(self.slot, self.among & !(1 << self.slot))
                .filter(|&n| n != self.slot);
        }
        Some(next)
    }
}

/// The most waiting slots a waiter waits a turn for in one round. The
/// waiting bits are anyone's to write: a forger that sets them all, and
/// holds a turn whose holder never looks idle or late, would otherwise
/// keep a slice that trusts every slot waiting 64 turns per launch; past
/// this many slices waiting at once, a waiter may fall back instead.
const ROUND_SLOTS_MAX: u32 = 15;

/// The longest a process of `slot` waits for one launch: a round, a turn
/// and its grace for every counted slot that waits (at most
/// [`ROUND_SLOTS_MAX`]), and two more (the holder's, and one for a slot
/// that began to wait meanwhile).
fn wait_bound(board: &Board, slot: usize, among: u64) -> u64 {
    let ahead = (board.waiting() & among & !(1u64 << slot))
        .count_ones()
        .min(ROUND_SLOTS_MAX);
    (u64::from(ahead) + 2) * (QUANTUM_NS + GRACE_NS)
}

/// Waits until this slice has `dev`'s turn for a launch estimated at
/// `est_ns`, handing the turn over first when it is ours, others wait,
/// and the launch would start after its end. The launch is made while the
/// [`Launch`] returned lives.
pub fn acquire(dev: usize, est_ns: u64, queue: &dyn Queue) -> Launch {
    loop {
        let Some(seat) = seat(dev, now_ns()) else {
            return Launch(None);
        };
        if !wait_for_turn(&seat, dev, est_ns, queue) {
            return Launch(None);
        }
        // Still ours once let in: a hand-over by another of our threads
        // either waits for this launch, or finished before and the turn
        // is no longer ours (then we wait again).
        if let Some(launch) = enter(dev) {
            // Read once let in (a pass finished before is seen).
            let turn = seat.board.turn();
            if turn.holder() == Some(seat.slot) && turn.tag() == tag() {
                return launch;
            }
        }
        crate::driver::nap(MIN_WAIT_NS);
    }
}

/// The shortest sleep of a waiter.
const MIN_WAIT_NS: u64 = 10_000;

/// [`acquire`]'s wait; whether the turn is ours (else the GPU's turns are
/// ignored for now).
fn wait_for_turn(seat: &Seat, dev: usize, est_ns: u64, queue: &dyn Queue) -> bool {
    let (board, slot) = (seat.board, seat.slot);
    let tag = tag();
    let passes = PASSES[dev].load(Ordering::Acquire);
    if taken_from_us(dev, board.turn(), (slot, tag), passes, now_ns())
        && repeated_fault(dev, now_ns())
    {
        ignore_turns(board, dev, now_ns(), "found a second turn taken early");
        return false;
    }
    if est_ns == 0 {
        // Not estimated yet: this thread's queued work is not counted
        // (its launches are of unknown length), so it is waited for, and
        // the launch runs alone and is measured. Otherwise a new process
        // queues work no turn bounds and its neighbours, queued behind it,
        // measure that as their own: estimates many times too long, and
        // published ends of work that make every turn look held late.
        queue.drain();
    } else {
        // Never more queued than a turn holds, so that handing over (and
        // a waiter's wait) takes a turn's length at most.
        queue.trim(QUANTUM_NS.saturating_sub(est_ns));
    }
    // When we began waiting for another's turn.
    let mut waiting_since: Option<u64> = None;
    // When our slice was last served while we waited (a sibling took a
    // turn up: the slice's line moved), and how long we may wait from then.
    let mut round: Option<(u64, Option<u8>)> = None;
    let mut bound = 0;
    let holding = loop {
        let now = now_ns();
        let seq = board.turn_seq();
        let turn = board.turn();
        let ours = turn.holder() == Some(slot);
        let until = turn.until_ns(now);
        // Passed to our slice (no process of it yet): ours to take up when
        // we are next in our slice's line, or those before us let it be.
        let up_at = if ours && turn.tag() == 0 {
            seat.up_at(dev, until.saturating_sub(QUANTUM_NS).min(now))
        } else {
            u64::MAX
        };
        if turn.holder().is_none() || up_at <= now {
            let until = if ours { until } else { now + QUANTUM_NS };
            if take(board, turn, (slot, tag), now + est_ns, until) {
                seat.took(dev);
                break true;
            }
            continue;
        }
        if ours && turn.tag() == tag {
            // When the work queued before this launch ends.
            let start = now + queue.queued_ns();
            let Some(next) = seat.next_waiting(dev) else {
                // Nobody waits: the turn is extended, always past our
                // queued work, so that one who comes waits for that.
                if until < start + est_ns + QUANTUM_NS / 2 {
                    let until = (start + est_ns).max(now + QUANTUM_NS);
                    board.take_turn(turn, slot, tag, until);
                }
                break true;
            };
            // A launch that starts within the turn is ours to make (a
            // turn is not cut short by a kernel's length).
            if start <= until {
                break true;
            }
            // Our turn is up and `next` waits: our queued work first,
            // so that theirs starts on an idle GPU. Passed to our own
            // slice, it goes to the next of our line, and we join its back.
            pass(board, dev, turn, next, queue);
            continue;
        }
        // Another slice's turn, or another process's of ours.
        waiting_since.get_or_insert(now);
        let served = seat.order.as_ref().map(|o| o.serving());
        let since = match round {
            Some((since, seen)) if seen == served => since,
            // Our slice's line moved: it was served, a new round begins
            // (a neighbour cannot move it, the ledger is ours).
            _ => {
                round = Some((now, served));
                now
            }
        };
        bound = bound.max(wait_bound(board, slot, seat.among));
        // Read after the turn: a taker publishes its tail before it takes.
        let idle_from = board.tail().saturating_add(IDLE_NS);
        let idle = now > idle_from;
        let late = now > until + GRACE_NS;
        // Not passed on in time while its holder says it still has work
        // queued (it lies): once a second that is taken in stride; twice,
        // the GPU's turns are ignored.
        if late && !idle && repeated_fault(dev, now) {
            ignore_turns(board, dev, now, "found a second turn held past its end");
            break false;
        }
        // Passed to another slot that did not take it up: a slow waker
        // now and then, or forged waiters every turn.
        let unused = idle && turn.tag() == 0 && !ours;
        if unused && often_unused(dev, now) {
            ignore_turns(board, dev, now, "found turns left unused too often");
            break false;
        }
        // Late, or its holder's work is done and it launched nothing since
        // (it went idle, or died): the GPU idles, the turn is taken; and
        // its holder no longer counts as waiting (a live one says so again).
        if late || idle {
            if take(board, turn, (slot, tag), now + est_ns, now + QUANTUM_NS) {
                seat.took(dev);
                if let Some(h) = turn.holder().filter(|&h| h != slot) {
                    board.set_waiting(h, false);
                }
                break true;
            }
            continue;
        }
        // Checked after taking a turn that may be taken: a waiter kept off
        // the CPU past the bound finds the turn free, which is no fault.
        if now - since > bound {
            ignore_turns(board, dev, now, "waited past a round for the GPU's turn");
            break false;
        }
        // A turn that will neither end, nor go idle, nor come up to us
        // until a second past our bound would be waited out in vain (a
        // turn and its holder's end of work forged far ahead; an honest
        // holder's end is its queued work's, a launch or two away, and a
        // holder whose estimates came out long after a fallback may be
        // waited for): the GPU's turns are ignored now, not after a round.
        let ends = (until + GRACE_NS).min(idle_from).min(up_at);
        if ends > since + bound + BACKOFF_NS {
            ignore_turns(board, dev, now, "found a turn held past a round ahead");
            break false;
        }
        if Some(now) == waiting_since {
            queue.close();
            // In our slice's line from now on (the ticket is kept).
            seat.ticket(dev);
        }
        board.set_waiting(slot, true);
        let left = [until + GRACE_NS, since + bound, idle_from, up_at]
            .into_iter()
            .min()
            .unwrap_or(now)
            .saturating_sub(now);
        board.wait_turn(seq, left.max(MIN_WAIT_NS));
    };
    // A sibling that still waits keeps our slot waiting (it says so again
    // when it wakes, but it may sleep through the next pass).
    if waiting_since.is_some() && seat.siblings_waiting(dev).unwrap_or(0) == 0 {
        board.set_waiting(slot, false);
    }
    if holding {
        // When our work ends, for waiters to tell an idle holder; a
        // launch not estimated yet may take a turn.
        let est_ns = if est_ns == 0 { QUANTUM_NS } else { est_ns };
        let tail = board.raise_tail(now_ns() + queue.queued_ns() + est_ns);
        let turn = board.turn();
        if turn.holder() == Some(slot) && turn.tag() == tag {
            // Another process keeping to the rules takes it only once our
            // work is idle, or late (an extension by another of our
            // threads may move the end back by half a turn).
            let until = turn.until_ns(now_ns());
            let safe = tail
                .saturating_add(IDLE_NS)
                .min(until + GRACE_NS - QUANTUM_NS / 2);
            HELD[dev].fetch_max(held_word(passes, safe), Ordering::AcqRel);
        }
    }
    holding
}

/// [`HELD`]'s word for a hold begun at `passes` and safe until `ns`.
fn held_word(passes: u64, ns: u64) -> u64 {
    (passes & 0xffff) << HELD_US_BITS | (ns / 1000) & ((1 << HELD_US_BITS) - 1)
}

/// Whether `turn`, not ours (`slot`, `tag`), was taken from this process
/// against the rules: its hold recorded since our last pass was to last
/// beyond `now` (counted once). A forger that rewrites the turn word
/// takes it from whoever holds it; without this, waiters would take the
/// forged turn back as an idle holder's, without a fault, for ever.
fn taken_from_us(dev: usize, turn: Turn, (slot, tag): (usize, u32), passes: u64, now: u64) -> bool {
    if turn.holder() == Some(slot) && turn.tag() == tag {
        return false;
    }
    let held = HELD[dev].load(Ordering::Acquire);
    let safe_us = held & ((1 << HELD_US_BITS) - 1);
    held >> HELD_US_BITS == passes & 0xffff
        && now / 1000 < safe_us
        && HELD[dev]
            .compare_exchange(
                held,
                held_word(passes, 0),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
}

/// Takes `turn` for process `tag` of `slot` until `until`, publishing
/// first that its work ends at `tail` (a waiter that sees the new turn
/// then sees that tail, not the previous holder's idle one).
fn take(board: &Board, turn: Turn, (slot, tag): (usize, u32), tail: u64, until: u64) -> bool {
    let before = board.tail();
    board.set_tail(tail);
    if board.take_turn(turn, slot, tag, until) {
        return true;
    }
    // Another took it first: its holder's tail stands, not ours (which
    // would make that holder look idle early).
    board.restore_tail(tail, before);
    false
}

/// Hands our `turn` to the waiting slot `next`, once our queued work is
/// done (every thread's: a launch another thread was let make is waited
/// for, and no more are let in meanwhile): a full turn from now.
fn pass(board: &Board, dev: usize, turn: Turn, next: usize, queue: &dyn Queue) {
    PASSING[dev].fetch_add(1, Ordering::SeqCst);
    let t0 = now_ns();
    // A launch blocked in the driver is not waited for past a turn.
    while LAUNCHING[dev].load(Ordering::SeqCst) > 0 && now_ns() - t0 < QUANTUM_NS {
        crate::driver::nap(MIN_WAIT_NS);
    }
    queue.drain_process();
    let passes = PASSES[dev].fetch_add(1, Ordering::AcqRel) + 1;
    HELD[dev].store(held_word(passes, 0), Ordering::Release);
    let now = now_ns();
    // The slot passed the turn has half a turn to take it up before it
    // counts as idle.
    board.set_tail(now + QUANTUM_NS / 2);
    board.pass_turn(turn, next, now + QUANTUM_NS);
    PASSING[dev].fetch_sub(1, Ordering::SeqCst);
}

/// Before this thread waits for its own bucket: a turn of ours that a
/// waiter wants is handed over now (our queued work first).
pub fn yield_idle(dev: usize, queue: &dyn Queue) {
    let Some(seat) = seat(dev, now_ns()) else {
        return;
    };
    let turn = seat.board.turn();
    if turn.holder() == Some(seat.slot) && turn.tag() == tag() {
        if let Some(next) = seat.next_waiting(dev) {
            pass(seat.board, dev, turn, next, queue);
        }
    }
}

/// Records a turn passed on and left unused; whether more than
/// [`UNUSED_PER_BACKOFF`] were found in the last [`BACKOFF_NS`].
fn often_unused(dev: usize, now: u64) -> bool {
    let since = UNUSED_SINCE[dev].load(Ordering::Relaxed);
    if now.saturating_sub(since) > BACKOFF_NS {
        UNUSED_SINCE[dev].store(now, Ordering::Relaxed);
        UNUSED[dev].store(1, Ordering::Relaxed);
        return false;
    }
    UNUSED[dev].fetch_add(1, Ordering::Relaxed) + 1 > UNUSED_PER_BACKOFF
}

/// Records a turn found not passed on in time; whether another was found
/// less than [`BACKOFF_NS`] before.
fn repeated_fault(dev: usize, now: u64) -> bool {
    let last = LAST_FAULT[dev].swap(now, Ordering::Relaxed);
    last != 0 && now - last < BACKOFF_NS
}

fn ignore_turns(board: &Board, dev: usize, now: u64, why: &str) {
    IGNORE_UNTIL[dev].store(now + BACKOFF_NS, Ordering::Relaxed);
    board.note_fallback();
    if shim().log {
        crate::sys::log_line(&format!(
            "device {dev}: {why} in a second; turns ignored for {} s \
             (one held or forged against the rules)",
            BACKOFF_NS / 1_000_000_000
        ));
    }
}
