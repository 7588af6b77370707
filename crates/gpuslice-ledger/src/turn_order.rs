//! The order in which the processes of one slice take up the GPU's turns
//! passed to the slice (the shim's `turns` module).
//!
//! The turn on a GPU's board is passed to a *slot* (a slice); which of the
//! slice's processes takes it up was a race, and one process could lose it
//! round after round until it gave up on the turns. The order is a ticket
//! queue per device, kept in the slice's own usage ledger: only the slice's
//! processes can write that file, so a neighbour on the GPU (which can
//! write the board) cannot forge it, and how many of the slice's processes
//! wait is read from it, not from the board's waiting bits.
//!
//! Layout: the ledger header's bytes 192–255 (zero in ledgers of either
//! version until used), a 16-bit word per device (two per 4-byte word):
//! the next ticket to hand out in the high byte, the ticket served next in
//! the low byte. Tickets wrap at 256; a ticket less than 128 ahead of the
//! one served is in line, any other has been passed over.

use std::sync::atomic::{AtomicU32, Ordering};

/// Where the per-device words start in the ledger's header.
pub(crate) const OFFSET: usize = 192;
/// Bytes of the header they take: 16 bits for each of the ledger's devices.
pub(crate) const SIZE: usize = crate::MAX_DEVICES * 2;

/// One device's ticket queue of a slice.
pub struct TurnOrder<'a> {
    word: &'a AtomicU32,
    shift: u32,
}

/// How far `ticket` is behind the one served (`serving`): 0 for the one
/// served next; 128 or more for a ticket passed over.
pub fn distance(serving: u8, ticket: u8) -> u8 {
    ticket.wrapping_sub(serving)
}

/// Whether a ticket `distance` from the one served is still in line.
pub fn in_line(distance: u8) -> bool {
    distance < 128
}

impl<'a> TurnOrder<'a> {
    /// Device `dev`'s queue in the 4-byte header word `word`.
    pub(crate) fn new(word: &'a AtomicU32, dev: usize) -> TurnOrder<'a> {
        TurnOrder {
            word,
            shift: (dev % 2) as u32 * 16,
        }
    }

    fn halves(&self, w: u32) -> (u8, u8) {
        let v = w >> self.shift;
        ((v >> 8) as u8, v as u8)
    }

    fn with(&self, w: u32, next: u8, serving: u8) -> u32 {
        let v = u32::from(next) << 8 | u32::from(serving);
        w & !(0xffff << self.shift) | v << self.shift
    }

    /// Changes the queue by `f(next, serving)` (compare-and-swap; the other
    /// device of the word is left as it is); the queue as it was.
    fn update(&self, f: impl Fn(u8, u8) -> Option<(u8, u8)>) -> (u8, u8) {
        let mut w = self.word.load(Ordering::Acquire);
        loop {
            let (next, serving) = self.halves(w);
            let Some((n, s)) = f(next, serving) else {
                return (next, serving);
            };
            match self.word.compare_exchange_weak(
                w,
                self.with(w, n, s),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return (next, serving),
                Err(seen) => w = seen,
            }
        }
    }

    /// Takes the next ticket: this process waits behind every ticket
    /// handed out before.
    pub fn take(&self) -> u8 {
        self.update(|next, serving| Some((next.wrapping_add(1), serving)))
            .0
    }

    /// The ticket served next.
    pub fn serving(&self) -> u8 {
        self.halves(self.word.load(Ordering::Acquire)).1
    }

    /// Tickets handed out and not served yet (the slice's processes
    /// waiting for the turn, and any that left the line).
    pub fn waiting(&self) -> u8 {
        let (next, serving) = self.halves(self.word.load(Ordering::Acquire));
        next.wrapping_sub(serving)
    }

    /// `ticket` was served (its process took the turn up): the next one is
    /// served next, and the tickets before it, if still waiting, were
    /// passed over. A ticket already passed over changes nothing.
    pub fn served(&self, ticket: u8) {
        self.update(|next, serving| {
            in_line(distance(serving, ticket))
                .then(|| (next, ticket.wrapping_add(1)))
                .filter(|_| in_line(distance(ticket.wrapping_add(1), next)))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_are_served_in_order_and_passed_over_ones_know_it() {
        let words = [AtomicU32::new(0)];
        let (a, b) = (TurnOrder::new(&words[0], 0), TurnOrder::new(&words[0], 1));
        let (t0, t1, t2) = (a.take(), a.take(), a.take());
        assert_eq!((t0, t1, t2), (0, 1, 2));
        assert_eq!(a.waiting(), 3);
        // The other device of the word is its own queue.
        assert_eq!((b.take(), b.waiting(), a.waiting()), (0, 1, 3));
        a.served(t0);
        assert_eq!((a.serving(), a.waiting()), (1, 2));
        // t2 takes the turn up before t1 (t1's process left the line): t1
        // is passed over and knows it.
        a.served(t2);
        assert_eq!((a.serving(), a.waiting()), (3, 0));
        assert!(!in_line(distance(a.serving(), t1)));
        a.served(t1);
        assert_eq!(a.serving(), 3, "a passed-over ticket changes nothing");
        assert_eq!(b.serving(), 0);
        // Around the wrap.
        for _ in 0..300 {
            let t = a.take();
            assert_eq!(distance(a.serving(), t), 0);
            a.served(t);
        }
        assert_eq!(a.waiting(), 0);
    }
}
