//! A lock-free, point-in-time read of everything a ledger holds.

use crate::layout::*;
use crate::{procfs, Ledger};
use std::sync::atomic::Ordering;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceUsage {
    pub index: usize,
    pub uuid: String,
    /// None when unlimited.
    pub cap: Option<u64>,
    pub used: u64,
    pub peak: u64,
    pub refusals: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessState {
    Live,
    /// Being claimed or reclaimed right now.
    Transient,
    /// Live in a pid namespace this one cannot see into (pid as recorded
    /// there); a descendant namespace's processes are shown `Live` with our pid.
    OtherNamespace,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUsage {
    pub slot: usize,
    pub pid: u32,
    pub start_time: u64,
    pub comm: String,
    pub attached_unix_ms: u64,
    pub state: ProcessState,
    /// Bytes per device, indexed like [`Snapshot::devices`].
    pub bytes: Vec<u64>,
}

/// A device's compute share and its use (version-2 ledgers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeUsage {
    pub index: usize,
    /// Share in basis points (10 000 = 100 %); None when not limited.
    pub share_bp: Option<u64>,
    /// GPU time the slice's launches took, measured (ns).
    pub busy_ns: u64,
    /// Wall time launches were held back, summed over threads (ns).
    pub throttled_ns: u64,
    pub launches: u64,
    pub delayed_launches: u64,
}

/// A lock-free, point-in-time read of a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub slice_id: String,
    pub created_unix_ms: u64,
    pub creator_pid: u32,
    pub devices: Vec<DeviceUsage>,
    pub processes: Vec<ProcessUsage>,
    pub reclaimed_slots: u64,
    pub reclaimed_bytes: u64,
    pub repairs: u64,
    /// Processes of the slice that could not attach, so failed closed.
    pub attach_failures: u64,
    /// Layout version of the file.
    pub version: u32,
    /// Per device (empty for a version-1 ledger).
    pub compute: Vec<ComputeUsage>,
}

impl Ledger {
    /// Reads everything without taking a lock. Processes of other PID
    /// namespaces that can be seen from ours are shown live, with our pid
    /// for them.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_with(None)
    }

    /// [`Ledger::snapshot`] resolving other namespaces' processes among
    /// `pids` only (root's enforcer: the processes the driver lists), with
    /// no walk of `/proc`; any other process of another namespace is shown
    /// [`ProcessState::OtherNamespace`].
    pub fn snapshot_among(&self, pids: &[u32]) -> Snapshot {
        self.snapshot_with(Some(pids))
    }

    fn snapshot_with(&self, among: Option<&[u32]>) -> Snapshot {
        let pidns = procfs::own_pid_namespace();
        let foreign = self.foreign_pids(pidns, among);
        let devices = (0..self.device_count)
            .map(|d| {
                let cap = self.cap(d);
                DeviceUsage {
                    index: d,
                    uuid: self.uuid(d),
                    cap: (cap != UNLIMITED).then_some(cap),
                    used: self.used(d),
                    peak: self.peak(d),
                    refusals: self.dev(d, D_REFUSALS).load(Ordering::Relaxed),
                }
            })
            .collect();
        let mut processes = Vec::new();
        for i in 0..MAX_SLOTS {
            let w = self.slot_word(i, S_STATE).load(Ordering::Acquire);
            if w == FREE {
                continue;
            }
            let ns = self.slot_word(i, S_PIDNS).load(Ordering::Relaxed);
            let start_time = self.slot_word(i, S_START).load(Ordering::Relaxed);
            let recorded = (w >> 32) as u32;
            let (state, pid) = match w & TAG_MASK {
                LIVE if ns == pidns => (ProcessState::Live, recorded),
                LIVE => match foreign.resolve(ns, recorded, start_time) {
                    Some(here) => (ProcessState::Live, here),
                    None => (ProcessState::OtherNamespace, recorded),
                },
                _ => (ProcessState::Transient, recorded),
            };
            let mut comm = [0u8; 16];
            comm[..8].copy_from_slice(
                &self
                    .slot_word(i, S_COMM)
                    .load(Ordering::Relaxed)
                    .to_le_bytes(),
            );
            comm[8..].copy_from_slice(
                &self
                    .slot_word(i, S_COMM + 8)
                    .load(Ordering::Relaxed)
                    .to_le_bytes(),
            );
            processes.push(ProcessUsage {
                slot: i,
                pid,
                start_time,
                comm: str_field(&comm),
                attached_unix_ms: self.slot_word(i, S_ATTACHED_MS).load(Ordering::Relaxed),
                state,
                bytes: (0..self.device_count)
                    .map(|d| self.slot_bytes_word(i, d).load(Ordering::Relaxed))
                    .collect(),
            });
        }
        Snapshot {
            slice_id: self.slice_id(),
            created_unix_ms: self.map.u64_at(H_CREATED_MS).load(Ordering::Relaxed),
            creator_pid: self.map.u32_at(H_CREATOR_PID).load(Ordering::Relaxed),
            devices,
            processes,
            reclaimed_slots: self.map.u64_at(H_RECLAIMED_SLOTS).load(Ordering::Relaxed),
            reclaimed_bytes: self.map.u64_at(H_RECLAIMED_BYTES).load(Ordering::Relaxed),
            repairs: self.map.u64_at(H_REPAIRS).load(Ordering::Relaxed),
            attach_failures: self.map.u64_at(H_ATTACH_FAILURES).load(Ordering::Relaxed),
            version: self.version,
            compute: if self.version >= VERSION {
                (0..self.device_count)
                    .map(|d| {
                        let share = self.compute_share(d);
                        ComputeUsage {
                            index: d,
                            share_bp: (share != 0).then_some(share),
                            busy_ns: self.cword(d, C_BUSY).load(Ordering::Relaxed),
                            throttled_ns: self.cword(d, C_THROTTLED).load(Ordering::Relaxed),
                            launches: self.cword(d, C_LAUNCHES).load(Ordering::Relaxed),
                            delayed_launches: self.cword(d, C_DELAYED).load(Ordering::Relaxed),
                        }
                    })
                    .collect()
            } else {
                Vec::new()
            },
        }
    }
}
