//! Compute: the slice's token bucket of GPU time per device (version 2).

use crate::error::{Error, Result};
use crate::layout::*;
use crate::Ledger;
use std::sync::atomic::{AtomicU64, Ordering};

/// A compute share of 100 % in [`Ledger::compute_share`] units (basis points).
pub const FULL_SHARE: u64 = 10_000;

/// How a slice's bucket refills while other slices share its GPU (the
/// shim works it out from the GPU's [`board`](crate::board) every few tens of ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refill {
    /// The part of the share that applies, basis points of it: below
    /// [`FULL_SHARE`] while the busy slices' shares add up to more than the
    /// GPU gives them together, so each keeps its proportion.
    pub scale_bp: u64,
    /// A floor in basis points of wall time: the idle time a guaranteed
    /// share may borrow (0 for a hard cap).
    pub borrow_bp: u64,
}

impl Refill {
    /// The refill rate, basis points of wall time, for a slice whose share
    /// is `share_bp`: never above all of the GPU.
    pub fn rate(self, share_bp: u64) -> u64 {
        (share_bp * self.scale_bp.min(FULL_SHARE) / FULL_SHARE)
            .max(self.borrow_bp)
            .min(FULL_SHARE)
    }
}
/// Default bucket size: GPU time a slice may run ahead after being idle.
pub const DEFAULT_BURST_NS: u64 = 20_000_000;

impl Ledger {
    // ------------------------------------------------------------ compute
    //
    // One token bucket of GPU time per device, shared by every process of
    // the slice: refilled at `share` of wall time (CLOCK_MONOTONIC, which
    // all processes of a host share) up to `burst`, drawn from by the GPU
    // time of the slice's launches. Tokens may go negative (work measured
    // after it ran); launches wait while they are not positive.

    pub(crate) fn cword(&self, dev: usize, field: usize) -> &AtomicU64 {
        self.map.u64_at(COMPUTE_OFF + dev * COMPUTE_SIZE + field)
    }

    /// The order of the slice's processes waiting for `dev`'s turn
    /// ([`crate::turn_order`]); None past [`crate::MAX_DEVICES`].
    pub fn turn_order(&self, dev: usize) -> Option<crate::turn_order::TurnOrder<'_>> {
        (dev < crate::MAX_DEVICES).then(|| {
            let word = self.map.u32_at(crate::turn_order::OFFSET + dev / 2 * 4);
            crate::turn_order::TurnOrder::new(word, dev)
        })
    }

    fn has_compute(&self, dev: usize) -> bool {
        self.version >= VERSION && dev < self.device_count
    }

    /// Compute share of `dev` in basis points of wall time (10 000 =
    /// 100 %); 0 when not limited (and for version-1 ledgers).
    pub fn compute_share(&self, dev: usize) -> u64 {
        if !self.has_compute(dev) {
            return 0;
        }
        match &self.pinned {
            Some(p) => p.shares[dev].load(Ordering::Relaxed),
            None => self.cword(dev, C_SHARE).load(Ordering::Relaxed),
        }
    }

    /// Bucket size of `dev` (ns of GPU time).
    pub fn compute_burst(&self, dev: usize) -> u64 {
        if !self.has_compute(dev) {
            return 0;
        }
        let burst = self.cword(dev, C_BURST).load(Ordering::Relaxed);
        if self.pinned.is_some() {
            // The file is the slice's to write: a bigger bucket would be
            // more GPU time.
            burst.clamp(1, DEFAULT_BURST_NS)
        } else {
            burst
        }
    }

    /// Sets the compute share of `dev` (basis points, 0 = none, at most
    /// [`FULL_SHARE`]) and the bucket size; the bucket starts full.
    pub fn set_compute(&self, dev: usize, share_bp: u64, burst_ns: u64) -> Result<()> {
        if !self.writable() {
            return Err(Error::ReadOnly);
        }
        if !self.has_compute(dev) {
            return Err(Error::NoCompute);
        }
        let burst = burst_ns.max(1);
        self.cword(dev, C_BURST).store(burst, Ordering::Relaxed);
        self.cword(dev, C_TOKENS)
            .store(burst as i64 as u64, Ordering::Relaxed);
        self.cword(dev, C_LAST).store(0, Ordering::Relaxed);
        self.cword(dev, C_SHARE)
            .store(share_bp.min(FULL_SHARE), Ordering::Release);
        Ok(())
    }

    /// Refills `dev`'s bucket up to `now_ns` and returns its tokens (ns of
    /// GPU time; negative when the slice is in debt). Lock-free: whoever
    /// advances the refill time by compare-and-swap adds what accrued.
    pub fn compute_tokens(&self, dev: usize, now_ns: u64) -> i64 {
        self.compute_tokens_at(dev, now_ns, None)
    }

    /// [`Ledger::compute_tokens`], refilling as `refill` says instead of
    /// at the slice's share when given (what the GPU's [`board`](crate::board) shows of
    /// the other slices: see [`Refill`]).
    pub fn compute_tokens_at(&self, dev: usize, now_ns: u64, refill: Option<Refill>) -> i64 {
        if !self.has_compute(dev) {
            return i64::MAX;
        }
        let tokens = self.cword(dev, C_TOKENS);
        let last_w = self.cword(dev, C_LAST);
        let last = last_w.load(Ordering::Acquire);
        if now_ns > last
            && last_w
                .compare_exchange(last, now_ns, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            let share = self.compute_share(dev);
            let share = refill.map_or(share, |r| r.rate(share));
            let burst = self.compute_burst(dev).min(i64::MAX as u64) as i64;
            let add = (u128::from(now_ns - last) * u128::from(share) / u128::from(FULL_SHARE))
                .min(i64::MAX as u128) as i64;
            let mut cur = tokens.load(Ordering::Relaxed);
            loop {
                let t = cur as i64;
                // Never more than a bucketful, whatever was written there.
                let new = if t >= burst {
                    burst
                } else {
                    t.saturating_add(add).min(burst)
                };
                match tokens.compare_exchange_weak(
                    cur,
                    new as u64,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return new,
                    Err(v) => cur = v,
                }
            }
        }
        (tokens.load(Ordering::Acquire) as i64)
            .min(self.compute_burst(dev).min(i64::MAX as u64) as i64)
    }

    /// Draws `ns` of GPU time from `dev`'s bucket (a negative value gives
    /// back an over-estimate).
    pub fn compute_charge(&self, dev: usize, ns: i64) {
        if self.has_compute(dev) && ns != 0 {
            self.cword(dev, C_TOKENS)
                .fetch_sub(ns as u64, Ordering::AcqRel);
        }
    }

    /// Records GPU time measured for `launches` launches of `dev`.
    pub fn compute_record(&self, dev: usize, busy_ns: u64, launches: u64) {
        if self.has_compute(dev) {
            self.cword(dev, C_BUSY)
                .fetch_add(busy_ns, Ordering::Relaxed);
            self.cword(dev, C_LAUNCHES)
                .fetch_add(launches, Ordering::Relaxed);
        }
    }

    /// Records a launch held back for `wait_ns`.
    pub fn compute_throttled(&self, dev: usize, wait_ns: u64) {
        if self.has_compute(dev) {
            self.cword(dev, C_THROTTLED)
                .fetch_add(wait_ns, Ordering::Relaxed);
            self.cword(dev, C_DELAYED).fetch_add(1, Ordering::Relaxed);
        }
    }
}
