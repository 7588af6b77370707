//! Process slots: claiming one per process, freeing it, and reclaiming
//! the slots (and bytes) of dead processes.

use crate::error::{Error, Result};
use crate::file::now_ms;
use crate::layout::*;
use crate::memory::sub_saturating;
use crate::{map, procfs, Ledger};
use std::sync::atomic::Ordering;

/// A claimed process slot (index into the slot table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(pub(crate) usize);

impl Slot {
    pub fn index(self) -> usize {
        self.0
    }

    /// The slot at `index` (as kept by a process that attached), if in range.
    pub fn from_index(index: usize) -> Option<Slot> {
        (index < MAX_SLOTS).then_some(Slot(index))
    }
}

/// What [`Ledger::reap`] reclaimed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reaped {
    pub slots: u64,
    pub bytes: u64,
    /// Devices whose leftover count was reset (see the crate docs).
    pub repaired: u64,
}

impl Ledger {
    /// Claims a slot for this process, first reclaiming dead slots (and a
    /// slot left by this pid's previous image, before an exec).
    pub fn attach(&self) -> Result<Slot> {
        if !self.writable() {
            return Err(Error::ReadOnly);
        }
        let me = std::process::id();
        let stat = procfs::stat(me).ok_or(Error::NoProcStat)?;
        let pidns = procfs::own_pid_namespace();
        self.reap_inner(Some((me, stat.start_time)), None);
        for i in 0..MAX_SLOTS {
            let state = self.slot_word(i, S_STATE);
            if state.load(Ordering::Relaxed) != FREE {
                continue;
            }
            if state
                .compare_exchange(
                    FREE,
                    word(me, CLAIMING),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                continue;
            }
            self.slot_word(i, S_START)
                .store(stat.start_time, Ordering::Relaxed);
            self.slot_word(i, S_PIDNS).store(pidns, Ordering::Relaxed);
            let mut comm = [0u8; 16];
            let n = stat.comm.len().min(15);
            comm[..n].copy_from_slice(&stat.comm.as_bytes()[..n]);
            self.slot_word(i, S_COMM).store(
                u64::from_le_bytes(comm[..8].try_into().unwrap_or_default()),
                Ordering::Relaxed,
            );
            self.slot_word(i, S_COMM + 8).store(
                u64::from_le_bytes(comm[8..].try_into().unwrap_or_default()),
                Ordering::Relaxed,
            );
            self.slot_word(i, S_ATTACHED_MS)
                .store(now_ms(), Ordering::Relaxed);
            for d in 0..MAX_DEVICES {
                self.slot_bytes_word(i, d).store(0, Ordering::Relaxed);
            }
            state.store(word(me, LIVE), Ordering::SeqCst);
            self.repair_if_alone(Some(i));
            return Ok(Slot(i));
        }
        Err(Error::SlotsExhausted)
    }

    /// Releases everything `slot` holds and frees it (normal exit).
    pub fn detach(&self, slot: Slot) {
        let state = self.slot_word(slot.0, S_STATE);
        let w = state.load(Ordering::SeqCst);
        if w & TAG_MASK == LIVE {
            self.reclaim(slot.0, w, false);
        }
    }

    /// Reclaims the slots of dead processes (of this pid namespace) and
    /// repairs leftovers when no process is attached.
    pub fn reap(&self) -> Result<Reaped> {
        if !self.writable() {
            return Err(Error::ReadOnly);
        }
        let mut reaped = Reaped::default();
        self.reap_inner(None, Some(&mut reaped));
        reaped.repaired = self.repair_if_alone(None);
        Ok(reaped)
    }

    fn reap_inner(&self, stale_image: Option<(u32, u64)>, mut out: Option<&mut Reaped>) {
        let pidns = procfs::own_pid_namespace();
        let foreign = self.foreign_pids(pidns, None);
        for i in 0..MAX_SLOTS {
            let w = self.slot_word(i, S_STATE).load(Ordering::SeqCst);
            let pid = (w >> 32) as u32;
            let dead = match w & TAG_MASK {
                LIVE => {
                    let start = self.slot_word(i, S_START).load(Ordering::Relaxed);
                    let ns = self.slot_word(i, S_PIDNS).load(Ordering::Relaxed);
                    if ns == pidns {
                        stale_image == Some((pid, start))
                            || procfs::liveness(pid, start) == procfs::Liveness::Dead
                    } else {
                        foreign.liveness(ns, pid, start) == Some(procfs::Liveness::Dead)
                    }
                }
                // A reclaimer that died half-way: finish its work.
                RECLAIMING => !map::pid_exists(pid),
                _ => false,
            };
            if dead {
                let bytes = self.reclaim(i, w, true);
                if let Some(r) = out.as_deref_mut() {
                    r.slots += 1;
                    r.bytes += bytes;
                }
            }
        }
    }

    /// Moves slot `i` from state word `w` to RECLAIMING, returns its bytes
    /// to the devices, frees it. Returns the bytes reclaimed (0 when another
    /// process got there first). `count`: record it in the header's
    /// reclaim counters (not done for a process's own detach).
    fn reclaim(&self, i: usize, w: u64, count: bool) -> u64 {
        let state = self.slot_word(i, S_STATE);
        let pid = (w >> 32) as u32;
        let reclaiming = word(pid, RECLAIMING);
        if w != reclaiming
            && state
                .compare_exchange(w, reclaiming, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
        {
            return 0;
        }
        let mut total = 0;
        for d in 0..self.device_count {
            let b = self.slot_bytes_word(i, d).swap(0, Ordering::SeqCst);
            total += sub_saturating(self.dev(d, D_USED), b);
        }
        if state
            .compare_exchange(reclaiming, FREE, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
            && count
        {
            self.map
                .u64_at(H_RECLAIMED_SLOTS)
                .fetch_add(1, Ordering::Relaxed);
            self.map
                .u64_at(H_RECLAIMED_BYTES)
                .fetch_add(total, Ordering::Relaxed);
        }
        total
    }

    /// When no slot but `mine` (holding nothing) is in use, any bytes still
    /// on a device were left by a process killed between its two updates;
    /// reset them. Returns the number of devices reset.
    fn repair_if_alone(&self, mine: Option<usize>) -> u64 {
        let observed: Vec<u64> = (0..self.device_count)
            .map(|d| self.dev(d, D_USED).load(Ordering::SeqCst))
            .collect();
        if observed.iter().all(|&u| u == 0) {
            return 0;
        }
        for i in 0..MAX_SLOTS {
            let w = self.slot_word(i, S_STATE).load(Ordering::SeqCst);
            if Some(i) == mine {
                if (0..self.device_count)
                    .any(|d| self.slot_bytes_word(i, d).load(Ordering::SeqCst) != 0)
                {
                    return 0;
                }
            } else if w != FREE {
                return 0;
            }
        }
        let mut repaired = 0;
        for (d, &u) in observed.iter().enumerate() {
            if u != 0
                && self
                    .dev(d, D_USED)
                    .compare_exchange(u, 0, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            {
                repaired += 1;
            }
        }
        if repaired > 0 {
            self.map
                .u64_at(H_REPAIRS)
                .fetch_add(repaired, Ordering::Relaxed);
        }
        repaired
    }

    /// The slots' processes of other PID namespaces, seen from ours: an
    /// empty scan (no `/proc` walk) when every live slot is of ours, as in
    /// the shim inside a slice.
    pub(crate) fn foreign_pids(&self, pidns: u64, among: Option<&[u32]>) -> procfs::ForeignPids {
        let others: std::collections::HashSet<u64> = (0..MAX_SLOTS)
            .filter(|&i| self.slot_word(i, S_STATE).load(Ordering::Acquire) & TAG_MASK == LIVE)
            .map(|i| self.slot_word(i, S_PIDNS).load(Ordering::Relaxed))
            .filter(|&ns| ns != pidns)
            .collect();
        if others.is_empty() {
            return procfs::ForeignPids::default();
        }
        match among {
            Some(pids) => procfs::ForeignPids::scan_among(&others, pids),
            None => procfs::ForeignPids::scan(&others),
        }
    }
}
