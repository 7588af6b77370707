//! Memory: caps, the reservation protocol (compare-and-swap on a
//! device's `used` word, then the slot's mirror), releases.

use crate::layout::*;
use crate::{Ledger, Slot};
use std::sync::atomic::{AtomicU64, Ordering};

/// A reservation was refused: it would pass the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverCap {
    pub cap: u64,
    pub used: u64,
}

/// Subtracts up to `n` from `w` without wrapping; returns what was taken.
pub(crate) fn sub_saturating(w: &AtomicU64, n: u64) -> u64 {
    let mut cur = w.load(Ordering::Relaxed);
    loop {
        let take = cur.min(n);
        match w.compare_exchange_weak(cur, cur - take, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return take,
            Err(v) => cur = v,
        }
    }
}

impl Ledger {
    /// Cap of device `dev` in bytes ([`UNLIMITED`] for none, and for an
    /// index past the ledger's devices).
    pub fn cap(&self, dev: usize) -> u64 {
        if dev >= self.device_count {
            return UNLIMITED;
        }
        match &self.pinned {
            Some(p) => p.caps[dev],
            None => self.dev(dev, D_CAP).load(Ordering::Relaxed),
        }
    }

    /// Bytes charged on device `dev` by all processes of the slice.
    pub fn used(&self, dev: usize) -> u64 {
        if dev >= self.device_count {
            return 0;
        }
        self.dev(dev, D_USED).load(Ordering::Acquire)
    }

    /// Highest `used` ever reached on `dev`.
    pub fn peak(&self, dev: usize) -> u64 {
        if dev >= self.device_count {
            return 0;
        }
        self.dev(dev, D_PEAK).load(Ordering::Relaxed)
    }

    /// Device `dev`'s UUID: the limits record's when pinned, else the file's.
    pub fn uuid(&self, dev: usize) -> String {
        if dev >= self.device_count {
            return String::new();
        }
        if let Some(p) = &self.pinned {
            return p.uuids.get(dev).cloned().unwrap_or_default();
        }
        str_field(
            self.map
                .bytes(DEVICES_OFF + dev * DEVICE_SIZE + D_UUID, UUID_LEN),
        )
    }

    /// Reserves `bytes` on `dev` for `slot`, unless that would pass the cap.
    /// Hot path: one compare-and-swap loop and two atomic adds.
    pub fn reserve(&self, slot: Slot, dev: usize, bytes: u64) -> std::result::Result<(), OverCap> {
        if dev >= self.device_count {
            return Err(OverCap { cap: 0, used: 0 });
        }
        let cap = self.cap(dev);
        let used = self.dev(dev, D_USED);
        let mut cur = used.load(Ordering::Relaxed);
        let new = loop {
            let Some(new) = cur.checked_add(bytes).filter(|&n| n <= cap) else {
                self.dev(dev, D_REFUSALS).fetch_add(1, Ordering::Relaxed);
                return Err(OverCap { cap, used: cur });
            };
            match used.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break new,
                Err(v) => cur = v,
            }
        };
        let peak = self.dev(dev, D_PEAK);
        if new > peak.load(Ordering::Relaxed) {
            peak.fetch_max(new, Ordering::Relaxed);
        }
        self.slot_bytes_word(slot.0, dev)
            .fetch_add(bytes, Ordering::AcqRel);
        Ok(())
    }

    /// Charges `bytes` whatever the cap (for memory the driver already
    /// handed out that could not be reserved beforehand).
    pub fn charge_unchecked(&self, slot: Slot, dev: usize, bytes: u64) {
        if dev >= self.device_count {
            return;
        }
        let new = self
            .dev(dev, D_USED)
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        self.dev(dev, D_PEAK).fetch_max(new, Ordering::Relaxed);
        self.slot_bytes_word(slot.0, dev)
            .fetch_add(bytes, Ordering::AcqRel);
    }

    /// Returns `bytes` of `slot` on `dev` (at most what the slot holds);
    /// gives back how much was released.
    pub fn release(&self, slot: Slot, dev: usize, bytes: u64) -> u64 {
        if dev >= self.device_count {
            return 0;
        }
        let taken = sub_saturating(self.slot_bytes_word(slot.0, dev), bytes);
        sub_saturating(self.dev(dev, D_USED), taken);
        taken
    }

    /// Bytes `slot` holds on `dev`.
    pub fn slot_bytes(&self, slot: Slot, dev: usize) -> u64 {
        if dev >= self.device_count {
            return 0;
        }
        self.slot_bytes_word(slot.0, dev).load(Ordering::Acquire)
    }
}
