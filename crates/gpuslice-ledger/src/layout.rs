//! The file's layout: sizes, offsets and field positions of version 2 (and
//! 1), as the crate docs' table gives them, and the slot state word.

use crate::limits;

/// First eight bytes of every ledger.
pub const MAGIC: [u8; 8] = *b"GPUSLDGR";
/// The layout version this crate writes (it also reads [`VERSION_1`]).
pub const VERSION: u32 = 2;
/// The previous layout (no compute section), still read.
pub const VERSION_1: u32 = 1;
/// Devices one ledger can describe.
pub const MAX_DEVICES: usize = 32;
/// Processes one ledger can track at once.
pub const MAX_SLOTS: usize = 1024;
/// Cap value meaning "no cap".
pub const UNLIMITED: u64 = u64::MAX;

pub(crate) const HEADER_SIZE: usize = 256;
pub(crate) const DEVICE_SIZE: usize = 128;
pub(crate) const SLOT_SIZE: usize = 320;
pub(crate) const DEVICES_OFF: usize = HEADER_SIZE;
pub(crate) const SLOTS_OFF: usize = DEVICES_OFF + MAX_DEVICES * DEVICE_SIZE;
/// Size of a version-1 ledger file.
pub const FILE_SIZE_V1: usize = SLOTS_OFF + MAX_SLOTS * SLOT_SIZE;
pub(crate) const COMPUTE_OFF: usize = FILE_SIZE_V1;
pub(crate) const COMPUTE_SIZE: usize = 64;
/// Size of a version-2 ledger file.
pub const FILE_SIZE: usize = COMPUTE_OFF + MAX_DEVICES * COMPUTE_SIZE;
/// Largest slice id / UUID stored.
pub const MAX_ID_LEN: usize = limits::MAX_SLICE_ID_LEN;
pub(crate) const UUID_LEN: usize = 96;
/// Header `state` once the file is completely written.
pub(crate) const READY: u32 = 0x5245_4459;

// Header fields.
pub(crate) const H_VERSION: usize = 8;
pub(crate) const H_HEADER_SIZE: usize = 12;
pub(crate) const H_DEVICE_COUNT: usize = 16;
pub(crate) const H_MAX_DEVICES: usize = 20;
pub(crate) const H_MAX_SLOTS: usize = 24;
pub(crate) const H_SLOT_SIZE: usize = 28;
pub(crate) const H_DEVICE_SIZE: usize = 32;
pub(crate) const H_STATE: usize = 36;
pub(crate) const H_FILE_SIZE: usize = 40;
pub(crate) const H_CREATED_MS: usize = 48;
pub(crate) const H_CREATOR_PID: usize = 56;
pub(crate) const H_SLICE_ID: usize = 64;
pub(crate) const H_REPAIRS: usize = 128;
pub(crate) const H_RECLAIMED_SLOTS: usize = 136;
pub(crate) const H_RECLAIMED_BYTES: usize = 144;
pub(crate) const H_ATTACH_FAILURES: usize = 152;
const _: () = assert!(
    crate::turn_order::OFFSET >= 160
        && crate::turn_order::OFFSET + crate::turn_order::SIZE <= HEADER_SIZE
);

// Device fields.
pub(crate) const D_CAP: usize = 0;
pub(crate) const D_USED: usize = 8;
pub(crate) const D_PEAK: usize = 16;
pub(crate) const D_REFUSALS: usize = 24;
pub(crate) const D_UUID: usize = 32;

// Compute fields (version 2), per device.
pub(crate) const C_SHARE: usize = 0;
pub(crate) const C_BURST: usize = 8;
pub(crate) const C_TOKENS: usize = 16;
pub(crate) const C_LAST: usize = 24;
pub(crate) const C_BUSY: usize = 32;
pub(crate) const C_THROTTLED: usize = 40;
pub(crate) const C_LAUNCHES: usize = 48;
pub(crate) const C_DELAYED: usize = 56;

// Slot fields.
pub(crate) const S_STATE: usize = 0;
pub(crate) const S_START: usize = 8;
pub(crate) const S_PIDNS: usize = 16;
pub(crate) const S_COMM: usize = 24;
pub(crate) const S_ATTACHED_MS: usize = 40;
pub(crate) const S_BYTES: usize = 64;

// Tags in the low bits of a slot's state word; the pid is in the high 32.
pub(crate) const TAG_MASK: u64 = 3;
pub(crate) const FREE: u64 = 0;
pub(crate) const CLAIMING: u64 = 1;
pub(crate) const LIVE: u64 = 2;
pub(crate) const RECLAIMING: u64 = 3;

pub(crate) fn word(pid: u32, tag: u64) -> u64 {
    (u64::from(pid) << 32) | tag
}

pub(crate) fn str_field(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}
