//! The compute share: every kernel and graph launch of a limited device
//! draws GPU time from the slice's token bucket in the ledger
//! ([`gpuslice_ledger::Ledger::compute_tokens`]), refilled at the share of
//! wall time; a launch waits while the bucket is empty. See
//! docs/compute-share.md.
//!
//! GPU time is measured, not guessed from grid sizes, with events
//! recorded on the launch's stream around *groups* of launches: the time
//! from the event before a group to the one after it is what the group
//! cost. An event costs the GPU a few microseconds (on the H200 a 35 µs
//! kernel ran 3.3 % slower with one event after each launch, 6.9 % with a
//! pair around each), so a stream that stays busy pays one event per
//! group, not per launch:
//! - a group starts from the previous group's end event when that is
//!   still pending on the same stream (the GPU goes from one to the other
//!   without a gap), else from an event recorded just before its launch;
//! - a launch joins the open group while the GPU has not reached the group
//!   yet (its start event is pending), or reached it so recently that the
//!   group's own work is surely still running: no gap inside the group;
//! - the group is closed (its end event recorded) once it holds
//!   [`GROUP_NS`] of estimated GPU time or [`GROUP_MAX`] launches, when
//!   the GPU has reached it, when a launch must wait for the bucket, or at
//!   the first launch after a fresh start.
//!
//! Whether the *stream* is busy says nothing here: work the shim does not
//! meter (a memset, a copy, a wait on another stream) keeps it busy after
//! the group ran dry (on the H200, a GEMM loop's first launch after 2 s
//! idle joined the group left open by the loop before, and the idle time
//! was charged). A group that may have run dry before it was closed is not
//! measured: its launches keep their estimates (a moving average of
//! measured launches of their kind on that device). Every launch is
//! charged its estimate at once, corrected when its group is measured; at
//! most [`DEPTH`] groups per thread are in flight unmeasured, so queued
//! work cannot run far ahead of the budget.
//!
//! Hot path: no lock, no allocation, no getenv, no logging. Per-thread
//! state lives in a const-initialised thread-local ring; the events are
//! created once per ring slot (the first launches of a thread).

use std::cell::Cell;
use std::ffi::{c_float, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use gpuslice_ledger::{Ledger, FULL_SHARE, MAX_DEVICES};

use crate::cuda::*;
use crate::driver::{nap, now_ns};
use crate::real::Real;
use crate::state::shim;

/// Groups in flight per thread before a launch waits for the oldest.
pub const DEPTH: usize = 32;
/// Estimated GPU time a group gathers before its end event is recorded:
/// a group of 35 µs kernels pays one event (~1 µs) per ~200 µs.
pub const GROUP_NS: u64 = 200_000;
/// Launches a group gathers at most.
pub const GROUP_MAX: u64 = 16;
/// A join that took longer than this (or than half the group's estimated
/// work) from the check that the group was still ahead to the launch's
/// return may have let the group run dry first (the thread lost the CPU):
/// the group is not trusted to have no gap.
const STALL_NS: u64 = 50_000;
/// How long after its start event was last seen pending a group is still
/// surely running (at most a quarter of its estimated work).
const AHEAD_NS: u64 = 20_000;
/// Longest single sleep while the bucket is empty (reaction time).
const MAX_NAP_NS: u64 = 2_000_000;
const MIN_NAP_NS: u64 = 20_000;
/// Longest wait for one launch to finish before it is written off as
/// unmeasured (its estimate stays charged).
const MAX_WAIT_NS: u64 = 2_000_000_000;

static EVENT_CREATE: Real = Real::named(c"cuEventCreate");
static EVENT_RECORD: Real = Real::named(c"cuEventRecord");
static EVENT_QUERY: Real = Real::named(c"cuEventQuery");
static EVENT_SYNC: Real = Real::named(c"cuEventSynchronize");
static EVENT_ELAPSED_V2: Real = Real::named(c"cuEventElapsedTime_v2");
static EVENT_ELAPSED: Real = Real::named(c"cuEventElapsedTime");

/// What is launched: estimates are kept apart.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Kernel = 0,
    Graph = 1,
}

/// Moving average of measured GPU time per launch, per kind and device.
static ESTIMATE: [[AtomicU64; MAX_DEVICES]; 2] =
    [const { [const { AtomicU64::new(0) }; MAX_DEVICES] }; 2];

/// Threads of this process whose newest group's end a hand-over waits
/// for (one slot each, while the thread lives).
const THREAD_SLOTS: usize = 64;
/// Per slot: the newest end event its thread recorded (null: none), so
/// that a hand-over by one thread waits for every thread's queued work.
static NEWEST_END: [AtomicPtr<c_void>; THREAD_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; THREAD_SLOTS];
/// Slots in use, a bit each.
static THREAD_SLOTS_USED: AtomicU64 = AtomicU64::new(0);

/// This thread's slot in [`NEWEST_END`], given back when it ends (its
/// events outlive it: they are never destroyed).
struct ThreadSlot(Option<usize>);

impl ThreadSlot {
    fn claim() -> ThreadSlot {
        let mut used = THREAD_SLOTS_USED.load(Ordering::Relaxed);
        loop {
            let free = (!used).trailing_zeros() as usize;
            if free >= THREAD_SLOTS {
                return ThreadSlot(None); // past 64 threads: not waited for
            }
            match THREAD_SLOTS_USED.compare_exchange_weak(
                used,
                used | 1 << free,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return ThreadSlot(Some(free)),
                Err(seen) => used = seen,
            }
        }
    }
}

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            NEWEST_END[i].store(std::ptr::null_mut(), Ordering::Release);
            THREAD_SLOTS_USED.fetch_and(!(1 << i), Ordering::AcqRel);
        }
    }
}

thread_local! {
    static THREAD_SLOT: ThreadSlot = ThreadSlot::claim();
}

/// Publishes `end`, just recorded, as this thread's newest end event.
fn publish_end(end: CUevent) {
    let _ = THREAD_SLOT.try_with(|s| {
        if let Some(i) = s.0 {
            NEWEST_END[i].store(end, Ordering::Release);
        }
    });
}

/// Waits for the newest end event of every thread of this process but
/// this one: their queued work on the GPU (a thread's groups run in
/// order on its stream; a thread launching into several streams at once
/// is waited for on its newest group's stream only).
fn sync_other_threads() {
    // SAFETY: cuEventSynchronize(CUevent).
    let Some(sync) = (unsafe { EVENT_SYNC.func::<pfn::EventSynchronize>() }) else {
        return;
    };
    let mine = THREAD_SLOT.try_with(|s| s.0).ok().flatten();
    let used = THREAD_SLOTS_USED.load(Ordering::Acquire);
    for i in (0..THREAD_SLOTS).filter(|&i| used & 1 << i != 0 && Some(i) != mine) {
        let end = NEWEST_END[i].load(Ordering::Acquire);
        if !end.is_null() {
            // SAFETY: an event of ours (created by a ring, never destroyed),
            // recorded at least once.
            unsafe { sync(end) };
        }
    }
}

/// A group of launches on one stream, measured by one pair of events.
struct Entry {
    /// This slot's own events (created once, reused).
    start: Cell<CUevent>,
    end: Cell<CUevent>,
    /// What the group is measured from: `start`, or the previous group's
    /// `end`; null once the group cannot be measured.
    from: Cell<CUevent>,
    stream: Cell<CUstream>,
    /// Estimates charged for the group's launches, summed.
    est: Cell<u64>,
    count: Cell<u64>,
    dev: Cell<usize>,
    kind: Cell<usize>,
    /// Still gathering launches: `end` not recorded yet.
    open: Cell<bool>,
    /// When `from` was last seen pending (CLOCK_MONOTONIC ns).
    ahead_at: Cell<u64>,
}

impl Entry {
    const fn new() -> Entry {
        Entry {
            start: Cell::new(std::ptr::null_mut()),
            end: Cell::new(std::ptr::null_mut()),
            from: Cell::new(std::ptr::null_mut()),
            stream: Cell::new(std::ptr::null_mut()),
            est: Cell::new(0),
            count: Cell::new(0),
            dev: Cell::new(0),
            kind: Cell::new(0),
            open: Cell::new(false),
            ahead_at: Cell::new(0),
        }
    }

    /// Whether a launch of `kind` on `stream` of `dev` may join this group.
    fn takes(&self, stream: CUstream, dev: usize, kind: Kind) -> bool {
        self.open.get()
            && self.stream.get() == stream
            && self.dev.get() == dev
            && self.kind.get() == kind as usize
    }

    /// Whether the group's own work is surely not done at `now`: the GPU
    /// has not reached it (its start is pending; remembered as of `now`),
    /// or reached it after it was last seen so less than a quarter of its
    /// estimated work ago.
    fn ahead(&self, now: u64) -> bool {
        if self.from.get().is_null() {
            return false;
        }
        if pending(self.from.get()) {
            self.ahead_at.set(now);
            return true;
        }
        now.saturating_sub(self.ahead_at.get()) < (self.est.get() / 4).min(AHEAD_NS)
    }

    /// Whether the group is full, fresh, or `reached` by the GPU (its start
    /// done): time to record its end, while its own work still runs.
    fn due(&self, reached: bool) -> bool {
        reached
            || self.from.get() == self.start.get()
            || self.est.get() >= GROUP_NS
            || self.count.get() >= GROUP_MAX
    }
}

/// This thread's launches in flight, oldest at `head`.
struct Ring {
    e: [Entry; DEPTH],
    head: Cell<usize>,
    len: Cell<usize>,
    busy: Cell<bool>,
}

thread_local! {
    static RING: Ring = const {
        Ring {
            e: [const { Entry::new() }; DEPTH],
            head: Cell::new(0),
            len: Cell::new(0),
            busy: Cell::new(false),
        }
    };
}

fn elapsed_fn() -> Option<pfn::EventElapsedTime> {
    // SAFETY: cuEventElapsedTime_v2 has this signature.
    let v2 = unsafe { EVENT_ELAPSED_V2.func::<pfn::EventElapsedTime>() };
    // SAFETY: so does cuEventElapsedTime, its predecessor.
    v2.or_else(|| unsafe { EVENT_ELAPSED.func::<pfn::EventElapsedTime>() })
}

/// Whether launches on device ordinal `dev` are metered: the ledger that
/// holds their share, else None.
#[inline]
fn limited(dev: usize) -> Option<&'static Ledger> {
    let s = shim();
    if *s.compute.get(dev)? == 0 {
        return None;
    }
    s.ledger.as_ref()
}

/// Runs a launch (`call`) on `stream` under the compute share of the
/// current device. `real.ptsz()`: the launch function is the per-thread-stream
/// flavour (its NULL stream is the calling thread's stream).
#[inline]
pub fn launch(
    stream: CUstream,
    real: &crate::real::Real,
    kind: Kind,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if !shim().compute_active {
        return call();
    }
    // Asked only when metering: it scans the per-thread-stream table.
    metered(stream, real.ptsz(), kind, call)
}

fn metered(stream: CUstream, ptsz: bool, kind: Kind, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(dev) = crate::driver::current_device().and_then(|d| usize::try_from(d).ok()) else {
        return call();
    };
    let Some(ledger) = limited(dev) else {
        return call();
    };
    // A launch into a capturing stream adds a node to a graph: no GPU work
    // now (the graph is metered when launched), and no event may be
    // recorded or queried for it.
    if crate::driver::capturing(stream) {
        return call();
    }
    let rec_stream = if stream.is_null() && ptsz {
        CU_STREAM_PER_THREAD as CUstream
    } else {
        stream
    };
    // try_with: a launch from a thread-local destructor passes unmetered.
    let mut call = Some(call);
    let r = RING.try_with(|ring| {
        if ring.busy.replace(true) {
            return None; // re-entered (a launch from within a launch)
        }
        let f = call.take()?;
        let rc = ring.launch(ledger, dev, rec_stream, kind, f);
        ring.busy.set(false);
        Some(rc)
    });
    match (r, call) {
        (Ok(Some(rc)), _) => rc,
        (_, Some(f)) => f(),
        _ => CUDA_ERROR_NOT_INITIALIZED,
    }
}

impl Ring {
    fn at(&self, i: usize) -> &Entry {
        &self.e[i % DEPTH]
    }

    /// The newest group, if any.
    fn newest(&self) -> Option<&Entry> {
        let len = self.len.get();
        (len > 0).then(|| self.at(self.head.get() + len - 1))
    }

    fn launch(
        &self,
        ledger: &Ledger,
        dev: usize,
        stream: CUstream,
        kind: Kind,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let _turn = crate::driver::relaxed(|| {
            self.harvest(ledger);
            // One slot stays free: the newest group's `end` may be the
            // `from` of the next one, so its slot must not be reused
            // before that one is measured.
            if self.len.get() >= DEPTH - 1 {
                self.wait_oldest(ledger);
            }
            let est = ESTIMATE[kind as usize][dev].load(Ordering::Relaxed);
            self.gate(ledger, dev, est);
            crate::turns::acquire(dev, est, &Queued { ring: self, ledger })
        });
        let est = ESTIMATE[kind as usize][dev].load(Ordering::Relaxed);
        ledger.compute_charge(dev, est as i64);
        let t0 = now_ns();
        let joined = self
            .newest()
            .filter(|g| g.takes(stream, dev, kind) && g.ahead(t0));
        let est_before = joined.map_or(0, |g| g.est.get());
        if joined.is_none() {
            self.close_newest(ledger, t0);
        }
        let group = joined.or_else(|| self.open_group(stream, dev, kind, t0));
        let rc = call();
        if rc != CUDA_SUCCESS {
            ledger.compute_charge(dev, -(est as i64));
            if group.is_some_and(|g| g.count.get() == 0) {
                self.len.set(self.len.get() - 1); // opened for this launch
            }
            return rc;
        }
        let Some(g) = group else {
            // Not measurable (no events): the estimate stays charged.
            book(ledger, dev, est, 1);
            return rc;
        };
        g.est.set(g.est.get() + est);
        g.count.set(g.count.get() + 1);
        let chained = g.from.get() != g.start.get();
        let reached = chained && !pending(g.from.get());
        // The group has no gap if its first launch was queued before the
        // group it is chained to ended (checked now, conservatively), and
        // later ones while the group was ahead, without a stall between
        // the check and the launch.
        let gap = if g.count.get() == 1 {
            reached
        } else {
            now_ns() - t0 > (est_before / 2).min(STALL_NS)
        };
        if gap {
            g.from.set(std::ptr::null_mut());
        }
        if gap || g.due(reached) {
            self.close(ledger, g);
        }
        rc
    }

    /// Opens a group for a launch on `stream` of `dev`: chained to the
    /// newest group when that one is still pending there, else from an
    /// event recorded now. None when events are not available.
    fn open_group(&self, stream: CUstream, dev: usize, kind: Kind, now: u64) -> Option<&Entry> {
        let slot = self.at(self.head.get() + self.len.get());
        let record = self.events(slot)?;
        match self.chained_from(stream, dev) {
            Some(prev_end) => slot.from.set(prev_end),
            None => {
                slot.from.set(slot.start.get());
                // SAFETY: an event of this slot, the caller's stream.
                if unsafe { record(slot.start.get(), stream) } != CUDA_SUCCESS {
                    return None;
                }
            }
        }
        slot.stream.set(stream);
        slot.dev.set(dev);
        slot.kind.set(kind as usize);
        slot.est.set(0);
        slot.count.set(0);
        slot.open.set(true);
        slot.ahead_at.set(now);
        self.len.set(self.len.get() + 1);
        Some(slot)
    }

    /// Closes the newest group if it is open: its end is recorded while
    /// its own work surely still runs, else (it may have run dry: the time
    /// from its start would count the idle GPU) it is dropped unmeasured.
    fn close_newest(&self, ledger: &Ledger, now: u64) {
        let Some(g) = self.newest().filter(|g| g.open.get()) else {
            return;
        };
        if !g.ahead(now) {
            g.from.set(std::ptr::null_mut());
        }
        self.close(ledger, g);
    }

    /// Records the newest group's end event; a group that is not
    /// measurable (or whose end cannot be recorded) is settled at once on
    /// its estimates.
    fn close(&self, ledger: &Ledger, g: &Entry) {
        g.open.set(false);
        // SAFETY: cuEventRecord(CUevent, CUstream).
        let record = unsafe { EVENT_RECORD.func::<pfn::EventRecord>() };
        let recorded = !g.from.get().is_null()
            // SAFETY: an event of this slot, the group's stream.
            && record.is_some_and(|r| unsafe { r(g.end.get(), g.stream.get()) } == CUDA_SUCCESS);
        if recorded {
            publish_end(g.end.get());
        } else {
            // The newest group: nothing is chained to it yet.
            self.len.set(self.len.get() - 1);
            book(ledger, g.dev.get(), g.est.get(), g.count.get());
        }
    }

    /// The newest group's end event, when that group ran on `stream` of
    /// `dev` and is still queued or running: the next group on `stream`
    /// starts when it ends.
    fn chained_from(&self, stream: CUstream, dev: usize) -> Option<CUevent> {
        let prev = self.newest()?;
        if prev.open.get() || prev.stream.get() != stream || prev.dev.get() != dev {
            return None;
        }
        pending(prev.end.get()).then(|| prev.end.get())
    }

    /// The slot's events, created on first use; and cuEventRecord.
    fn events(&self, slot: &Entry) -> Option<pfn::EventRecord> {
        // SAFETY: cuEventRecord(CUevent, CUstream).
        let record = unsafe { EVENT_RECORD.func::<pfn::EventRecord>() }?;
        if slot.end.get().is_null() {
            // SAFETY: cuEventCreate(CUevent*, unsigned).
            let create = unsafe { EVENT_CREATE.func::<pfn::EventCreate>() }?;
            let (mut a, mut b): (CUevent, CUevent) = (std::ptr::null_mut(), std::ptr::null_mut());
            // SAFETY: valid out-pointers; default flags (timing enabled).
            let ok =
                unsafe { create(&mut a, 0) == CUDA_SUCCESS && create(&mut b, 0) == CUDA_SUCCESS };
            if !ok || a.is_null() || b.is_null() {
                return None;
            }
            slot.start.set(a);
            slot.end.set(b);
        }
        Some(record)
    }

    /// Measures the groups that finished, oldest first, and settles their
    /// charges.
    fn harvest(&self, ledger: &Ledger) {
        if self.len.get() == 0 {
            return;
        }
        // SAFETY: cuEventQuery(CUevent).
        let Some(query) = (unsafe { EVENT_QUERY.func::<pfn::EventQuery>() }) else {
            return;
        };
        let elapsed = elapsed_fn();
        while self.len.get() > 0 {
            let e = self.at(self.head.get());
            if e.open.get() {
                break;
            }
            // SAFETY: an event of ours.
            let q = unsafe { query(e.end.get()) };
            if q == CUDA_ERROR_NOT_READY {
                break;
            }
            let mut ms: c_float = -1.0;
            // A null `from`: not measurable, the estimates stand.
            if q == CUDA_SUCCESS && !e.from.get().is_null() {
                if let Some(el) = elapsed {
                    // SAFETY: valid out-pointer, events of ours.
                    if unsafe { el(&mut ms, e.from.get(), e.end.get()) } != CUDA_SUCCESS {
                        ms = -1.0;
                    }
                }
            }
            self.settle(ledger, e, ms);
        }
    }

    /// Settles the oldest group with the measured `ms` (negative: could
    /// not be measured, the estimates stand).
    fn settle(&self, ledger: &Ledger, e: &Entry, ms: c_float) {
        let (dev, est, count) = (e.dev.get(), e.est.get(), e.count.get().max(1));
        let ns = if ms >= 0.0 {
            let ns = (f64::from(ms) * 1e6) as u64;
            ledger.compute_charge(dev, ns as i64 - est as i64);
            let per_launch = ns / count;
            let avg = &ESTIMATE[e.kind.get()][dev];
            let old = avg.load(Ordering::Relaxed);
            let new = if old == 0 {
                per_launch
            } else {
                old - old / 8 + per_launch / 8
            };
            avg.store(new, Ordering::Relaxed);
            ns
        } else {
            est
        };
        book(ledger, dev, ns, count);
        self.head.set((self.head.get() + 1) % DEPTH);
        self.len.set(self.len.get() - 1);
    }

    /// Waits until every group in flight is done and settles them.
    fn drain(&self, ledger: &Ledger) {
        self.close_newest(ledger, now_ns());
        // SAFETY: cuEventSynchronize(CUevent).
        if let Some(sync) = unsafe { EVENT_SYNC.func::<pfn::EventSynchronize>() } {
            for i in 0..self.len.get() {
                // SAFETY: a recorded event of ours (only the newest group is
                // ever open, and it was just closed).
                unsafe { sync(self.at(self.head.get() + i).end.get()) };
            }
        }
        self.harvest(ledger);
    }

    /// The ring is full: waits for the oldest group to finish.
    fn wait_oldest(&self, ledger: &Ledger) {
        // SAFETY: cuEventQuery(CUevent).
        let Some(query) = (unsafe { EVENT_QUERY.func::<pfn::EventQuery>() }) else {
            return;
        };
        let t0 = now_ns();
        let e = self.at(self.head.get());
        if e.open.get() {
            self.close_newest(ledger, t0); // only the newest is ever open
        }
        // SAFETY: an event of ours.
        while self.len.get() > 0 && unsafe { query(e.end.get()) } == CUDA_ERROR_NOT_READY {
            if now_ns() - t0 > MAX_WAIT_NS {
                self.settle(ledger, e, -1.0);
                return;
            }
            nap(MIN_NAP_NS);
        }
        self.harvest(ledger);
    }

    /// Waits while the slice's bucket of `dev` is empty.
    ///
    /// Fairness between the processes (and threads) of one slice: a
    /// launcher that has just been served comes back to an empty bucket
    /// first, so if every waiter napped only until the bucket refills, the
    /// last winner would also be the first to wake and win again (we saw
    /// one of three processes take 77 % of a shared budget). Two rules
    /// approximate first come, first served without any shared queue:
    /// - a launcher that finds the bucket empty on arrival goes to the back
    ///   of the line: its first nap is longer by one launch's worth of
    ///   refill (`est`, at most half the burst);
    /// - a waiter ages: it may start once the bucket is within what
    ///   accrued while it waited (at most `est`) of empty, so the oldest
    ///   waiter wakes and goes first.
    ///
    /// The debt this allows is bounded by one launch, so the long-run rate
    /// is still exactly the share; alone, a launcher loses nothing (the
    /// bucket keeps refilling during its longer first nap).
    ///
    /// A launcher of short launches that has to wait waits until the bucket
    /// holds a group's worth ([`GROUP_NS`], at most a quarter of the
    /// burst): released one at a time, each would find the GPU idle and
    /// need a pair of events; released together they run back to back and
    /// share a group's end event.
    fn gate(&self, ledger: &Ledger, dev: usize, est: u64) {
        let boards = shim().boards.as_ref();
        let burst = ledger.compute_burst(dev);
        let limit = est.min(burst / 2);
        let t0 = now_ns();
        crate::state::refresh_shares(t0);
        let mut now = t0;
        let mut behind = limit;
        let mut want: i64 = 0;
        loop {
            // The share in force (it can change in a live slice), as the
            // other slices of the GPU bend it: borrowing idle time, or all
            // scaled down while oversubscribed (crate::borrow).
            let share = ledger.compute_share(dev);
            let refill = boards.and_then(|b| b.refill(dev, now, share));
            let share = refill.map_or(share, |r| r.rate(share)).max(1);
            let tokens = ledger.compute_tokens_at(dev, now, refill);
            let aged = (u128::from(now - t0) * u128::from(share) / u128::from(FULL_SHARE))
                .min(u128::from(limit)) as i64;
            if tokens.saturating_add(aged) > want {
                break;
            }
            if now == t0 {
                // About to wait: the GPU will run dry on this thread's
                // work, so its open group is closed while it still can
                // be measured.
                self.close_newest(ledger, now);
                if est < GROUP_NS {
                    want = GROUP_NS.min(burst / 4) as i64;
                }
            }
            let short = want
                .saturating_add(1)
                .saturating_sub(tokens.saturating_add(aged));
            let debt = short.max(1) as u64 + std::mem::take(&mut behind);
            let wall = (u128::from(debt) * u128::from(FULL_SHARE) / u128::from(share))
                .min(u128::from(MAX_NAP_NS)) as u64;
            // Waiting for our own bucket: a turn of ours that another
            // slice wants is handed over first (each nap: it may want it
            // only now).
            crate::turns::yield_idle(dev, &Queued { ring: self, ledger });
            nap(wall.max(MIN_NAP_NS));
            self.harvest(ledger);
            now = now_ns();
        }
        if now > t0 {
            ledger.compute_throttled(dev, now - t0);
        }
    }
}

/// This thread's queued work, as taking turns sees it.
struct Queued<'a> {
    ring: &'a Ring,
    ledger: &'a Ledger,
}

impl crate::turns::Queue for Queued<'_> {
    fn queued_ns(&self) -> u64 {
        let r = self.ring;
        (0..r.len.get())
            .map(|i| r.at(r.head.get() + i).est.get())
            .sum()
    }

    fn close(&self) {
        self.ring.close_newest(self.ledger, now_ns());
    }

    fn drain(&self) {
        self.ring.drain(self.ledger);
    }

    fn drain_process(&self) {
        self.ring.drain(self.ledger);
        sync_other_threads();
    }

    fn trim(&self, ns: u64) {
        // Harvested already: this launch began with it.
        while self.queued_ns() > ns && self.ring.len.get() > 0 {
            self.ring.wait_oldest(self.ledger);
        }
    }
}

/// Whether the work before `event` (recorded, ours) is still queued or
/// running.
fn pending(event: CUevent) -> bool {
    // SAFETY: cuEventQuery(CUevent).
    let Some(query) = (unsafe { EVENT_QUERY.func::<pfn::EventQuery>() }) else {
        return false;
    };
    // SAFETY: an event of ours, recorded.
    unsafe { query(event) == CUDA_ERROR_NOT_READY }
}

/// Books `ns` of GPU time for `launches` launches on `dev`: in the ledger,
/// and on the GPU's board when the slice has a seat there.
fn book(ledger: &Ledger, dev: usize, ns: u64, launches: u64) {
    ledger.compute_record(dev, ns, launches);
    if let Some(b) = &shim().boards {
        b.record(dev, ns, now_ns());
    }
}
