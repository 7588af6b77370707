//! The memory ledger of one gpuslice slice: a small fixed-size file, mapped
//! shared by every process of the slice (through the shim), by `gpuslice
//! slices` and by the exporter.
//!
//! # Layout (version 2, little-endian, 334 080 bytes)
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 256 | header: magic `GPUSLDGR`, version, geometry, state, slice id, repair counters; at 192, the slice's line for each GPU's turns ([`turn_order`]) |
//! | 256 | 32 × 128 | devices: cap, used, peak, refusals, UUID |
//! | 4352 | 1024 × 320 | process slots: state word (pid, tag), start time, pid namespace, name, bytes per device |
//! | 332032 | 32 × 64 | compute (version 2): share, burst, token bucket, GPU time used, throttled time, launch counters |
//!
//! Version 1 is version 2 without the compute section (332 032 bytes); it
//! is still read (no compute share: [`Ledger::compute_share`] is 0 and the
//! compute setters refuse). Version 2 files are refused by version-1
//! readers with a message naming both versions.
//!
//! # Protocol
//! - A reservation is a compare-and-swap on the device's `used` word that
//!   fails when it would pass the cap; it is made *before* the driver call
//!   and undone with [`Ledger::release`] if the driver fails, so concurrent
//!   processes can never jointly pass the cap.
//! - Each process owns one slot, claimed by a compare-and-swap on the slot's
//!   state word and keyed by pid + start time (`/proc/<pid>/stat` field 22).
//!   The slot mirrors the bytes the process holds per device. Slots never
//!   move; a slot is only reused after being freed.
//! - Whoever notices a dead slot (the next [`Ledger::attach`], and
//!   [`Ledger::reap`] as `gpuslice slices` runs it) reclaims it: the slot's
//!   bytes are swapped out and subtracted from the devices, so a SIGKILLed
//!   process's bytes come back. Slots of another pid namespace are left
//!   alone (their pids mean nothing here).
//! - Order of updates: a reservation adds to the device first, then to the
//!   slot; a release takes from the slot first, then from the device. A
//!   process killed between the two steps therefore leaves the device
//!   *over*-counted (never under), which errs on the side of the cap; such
//!   leftovers are repaired when a process finds no other live slot.
//! - Readers need no lock: every shared word is read atomically.
//!
//! Nothing on the reservation path allocates, locks, or makes a syscall.

pub mod board;
mod bucket;
mod dir;
pub mod enforcement;
pub mod enforcer;
mod error;
mod file;
pub mod hostpid;
mod layout;
pub mod limits;
mod map;
mod memory;
mod planted;
pub mod procfs;
mod sigbus;
mod size;
mod slots;
mod snapshot;
pub mod turn_order;

pub use bucket::{Refill, DEFAULT_BURST_NS, FULL_SHARE};
pub use dir::{ensure_dir, ledger_dir, list_dir, scan_dir, DirScan, Junk, DEFAULT_DIR, DIR_ENV};
pub use error::{Error, Result};
pub use file::{DeviceSpec, Ledger};
pub use layout::{
    FILE_SIZE, FILE_SIZE_V1, MAGIC, MAX_DEVICES, MAX_ID_LEN, MAX_SLOTS, UNLIMITED, VERSION,
    VERSION_1,
};
pub use limits::valid_slice_id;
pub use memory::OverCap;
pub use size::{parse_size, split_unit};
pub use slots::{Reaped, Slot};
pub use snapshot::{ComputeUsage, DeviceUsage, ProcessState, ProcessUsage, Snapshot};

#[cfg(test)]
mod tests;
