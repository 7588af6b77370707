//! A lock-free map from a driver handle (device pointer, VMM handle,
//! array) to what was charged for it, in two tiers ([`Handles`]): a small
//! table that stays in cache, overflowing into a large one. Each tier is a
//! fixed-size [`Table`]: open addressing with linear probing, keys claimed by
//! compare-and-swap, tombstones on removal. Its memory is one lazily backed
//! anonymous mapping made on first insert, so inserts and removals never
//! allocate or lock.
//!
//! Why two tiers: keys are hashed over the whole table, so in one large
//! table every new handle lands on a cold cache line, often on a page never
//! touched before (two page faults: the zero page, then copy-on-write). A
//! driver that hands out a new address for every allocation then costs a
//! cache miss and, until all 4096 pages of a 16 MiB table are in, faults on
//! nearly every allocation. The small tier (256 KiB) holds the usual live
//! set with short probes; the large one only what does not fit.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

const EMPTY: u64 = 0;
const TOMB: u64 = u64::MAX;
/// Longest probe sequence an insert into a large table tries.
const MAX_PROBE: usize = 4096;
/// Longest probe sequence in a small (first-tier) table: lookups there stay
/// within a few cache lines.
const SMALL_PROBE: usize = 32;

#[repr(C)]
struct Entry {
    key: AtomicU64,
    val: AtomicU64,
}

pub struct Table {
    base: AtomicPtr<Entry>,
    bits: u32,
    max_probe: usize,
    /// Longest probe distance any insert used: lookups stop after it.
    probe_high: AtomicUsize,
}

/// Charged bytes and the ledger device, packed in one word.
pub fn pack(dev: usize, bytes: u64) -> u64 {
    ((dev as u64) << 58) | (bytes & ((1 << 58) - 1))
}

pub fn unpack(v: u64) -> (usize, u64) {
    ((v >> 58) as usize, v & ((1 << 58) - 1))
}

/// Two tiers: the small table first, the large one for what does not fit
/// there. A key lives in exactly one of them.
pub struct Handles {
    small: Table,
    large: Table,
}

impl Handles {
    pub const fn new(small_bits: u32, large_bits: u32) -> Handles {
        Handles {
            small: Table::with_probe(small_bits, SMALL_PROBE),
            large: Table::new(large_bits),
        }
    }

    /// Records `key → val`; false when both tiers are full around `key`.
    pub fn insert(&self, key: u64, val: u64) -> bool {
        self.small.insert(key, val) || self.large.insert(key, val)
    }

    /// Removes `key`, returning its value. The large tier is not looked at
    /// until something has overflowed into it (one atomic load).
    pub fn remove(&self, key: u64) -> Option<u64> {
        self.small.remove(key).or_else(|| self.large.remove(key))
    }

    /// The value of `key`, if recorded.
    pub fn get(&self, key: u64) -> Option<u64> {
        self.small.get(key).or_else(|| self.large.get(key))
    }
}

impl Table {
    pub const fn new(bits: u32) -> Table {
        Self::with_probe(bits, MAX_PROBE)
    }

    pub const fn with_probe(bits: u32, max_probe: usize) -> Table {
        Table {
            base: AtomicPtr::new(std::ptr::null_mut()),
            bits,
            max_probe,
            probe_high: AtomicUsize::new(0),
        }
    }

    fn len(&self) -> usize {
        1 << self.bits
    }

    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
    }

    fn entries(&self) -> Option<&[Entry]> {
        let p = self.base.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` came from `alloc` below: a live, never unmapped,
        // zero-initialised mapping of `len()` entries; Entry is two atomics,
        // valid for any bit pattern, including all zeroes.
        Some(unsafe { std::slice::from_raw_parts(p, self.len()) })
    }

    #[cold]
    fn alloc(&self) -> Option<&[Entry]> {
        let bytes = self.len() * std::mem::size_of::<Entry>();
        let p = crate::sys::anon(bytes)?.cast::<Entry>();
        match self.base.compare_exchange(
            std::ptr::null_mut(),
            p,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {}
            Err(_) => {
                // Another thread won; drop ours.
                // SAFETY: `p` is our own fresh mapping of `bytes`, unused.
                unsafe { libc::munmap(p.cast(), bytes) };
            }
        }
        self.entries()
    }

    /// Records `key → val`; false when the table is full around `key`
    /// (the caller then keeps the charge until exit). Keys 0 and `u64::MAX`
    /// are refused.
    pub fn insert(&self, key: u64, val: u64) -> bool {
        if key == EMPTY || key == TOMB {
            return false;
        }
        let Some(entries) = self.entries().or_else(|| self.alloc()) else {
            return false;
        };
        let mask = self.len() - 1;
        let mut i = self.home(key);
        for n in 0..self.max_probe.min(self.len()) {
            let e = &entries[i];
            let k = e.key.load(Ordering::Acquire);
            if (k == EMPTY || k == TOMB)
                && e.key
                    .compare_exchange(k, key, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                e.val.store(val, Ordering::Release);
                if n > self.probe_high.load(Ordering::Relaxed) {
                    self.probe_high.fetch_max(n, Ordering::AcqRel);
                }
                return true;
            }
            i = (i + 1) & mask;
        }
        false
    }

    /// Removes `key`, returning its value.
    pub fn remove(&self, key: u64) -> Option<u64> {
        if key == EMPTY || key == TOMB {
            return None;
        }
        let entries = self.entries()?;
        let mask = self.len() - 1;
        let mut i = self.home(key);
        for _ in 0..=self.probe_high.load(Ordering::Acquire) {
            let e = &entries[i];
            let k = e.key.load(Ordering::Acquire);
            if k == EMPTY {
                return None;
            }
            if k == key {
                let v = e.val.load(Ordering::Acquire);
                return e
                    .key
                    .compare_exchange(key, TOMB, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                    .then_some(v);
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// Looks `key` up without removing it.
    pub fn get(&self, key: u64) -> Option<u64> {
        let entries = self.entries()?;
        let mask = self.len() - 1;
        let mut i = self.home(key);
        for _ in 0..=self.probe_high.load(Ordering::Acquire) {
            let e = &entries[i];
            match e.key.load(Ordering::Acquire) {
                EMPTY => return None,
                k if k == key => return Some(e.val.load(Ordering::Acquire)),
                _ => i = (i + 1) & mask,
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_reuse() {
        let t = Table::new(4);
        assert_eq!(t.remove(5), None);
        for k in 1..=16u64 {
            assert!(t.insert(k * 512, pack(1, k)), "{k}");
        }
        assert!(!t.insert(99_999, 1), "full");
        assert_eq!(t.get(512 * 3).map(unpack), Some((1, 3)));
        assert_eq!(t.remove(512 * 3).map(unpack), Some((1, 3)));
        assert_eq!(t.remove(512 * 3), None);
        assert!(t.insert(99_999, pack(31, 7)), "tombstone reused");
        assert_eq!(t.remove(99_999).map(unpack), Some((31, 7)));
        assert!(!t.insert(0, 1));
    }

    #[test]
    fn the_small_tier_overflows_into_the_large_one() {
        let h = Handles::new(4, 10);
        // 16 slots in the small tier: the rest go to the large one.
        for k in 1..=200u64 {
            assert!(h.insert(k << 21, pack(0, k)), "{k}");
        }
        assert!(h.large.entries().is_some(), "overflowed");
        for k in 1..=200u64 {
            assert_eq!(h.get(k << 21).map(unpack), Some((0, k)), "{k}");
        }
        for k in (1..=200u64).rev() {
            assert_eq!(h.remove(k << 21).map(unpack), Some((0, k)), "{k}");
            assert_eq!(h.remove(k << 21), None);
        }
        // Freed small slots are used again first.
        assert!(h.insert(7, pack(1, 7)));
        assert_eq!(h.small.get(7).map(unpack), Some((1, 7)));
    }

    #[test]
    fn a_small_table_probes_only_a_few_slots() {
        let t = Table::with_probe(10, SMALL_PROBE);
        let keys: Vec<u64> = (1..=2000u64).map(|k| k * 0x20_0000).collect();
        let stored = keys.iter().filter(|&&k| t.insert(k, 1)).count();
        assert!(stored > 512 && stored <= 1024, "{stored}");
        assert!(
            stored < keys.len(),
            "some refused: they go to the large tier"
        );
        assert!(t.probe_high.load(Ordering::Relaxed) < SMALL_PROBE);
    }

    #[test]
    fn concurrent_threads_keep_their_keys() {
        static T: Handles = Handles::new(8, 12);
        let hs: Vec<_> = (0..4u64)
            .map(|th| {
                std::thread::spawn(move || {
                    for round in 0..200u64 {
                        let keys: Vec<u64> = (0..200)
                            .map(|i| (th << 40) | (round << 20) | (i + 1))
                            .collect();
                        for &k in &keys {
                            assert!(T.insert(k, pack(th as usize, k & 0xffff)));
                        }
                        for &k in &keys {
                            assert_eq!(T.remove(k).map(unpack), Some((th as usize, k & 0xffff)));
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }
}
