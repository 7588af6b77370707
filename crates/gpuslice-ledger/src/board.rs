//! The per-GPU board of the work-conserving compute mode.
//!
//! A slice with a *guaranteed* share (rather than a hard cap) may use GPU
//! time that other slices of the same GPU leave idle. To see what they
//! leave, every such slice publishes its GPU time on a board: one small
//! file per GPU (`<dir>/<uuid>.board`), mapped shared by the shims of every
//! slice on that GPU, whatever their mode. Each slice owns one slot, keyed
//! by its ledger's identity, and adds the GPU time it measures there.
//! Readers turn two snapshots into rates.
//!
//! # Layout (version 2, 4 160 bytes)
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 64 | header: magic `GPUSLBRD`, version, slot count, the GPU's turn, who waits for it, the turn's futex word, fallbacks to time-slicing |
//! | 64 | 64 × 64 | slots: key (0 = free), share (basis points), mode, GPU ns used, last update (CLOCK_MONOTONIC ns) |
//!
//! The turn (header words 3–5; zero reads as "free"): which slot's slice,
//! and which of its processes, may have work on the GPU now and until
//! when, so that two slices' kernels are not time-sliced into each other's
//! measurements ([`Turn`], the shim's `turns` module). Word 6 counts the
//! times a process gave up on the turns and fell back to the GPU's
//! time-slicing (a turn held or forged against the rules), for reports;
//! word 7 is when the holder's queued work ends, as it estimates it.
//! Version 1 (the turn without a process) is refused.
//!
//! An all-zero file is an empty board: a new file needs no initialisation
//! beyond its header, which is written with compare-and-swap, so processes
//! racing to create it agree. A slot is claimed by compare-and-swap on its
//! key; a slot not updated for [`STALE_NS`] may be taken over. A crashed
//! process leaves only a slot whose counter stops growing: to readers, an
//! idle slice.
//!
//! Trust: the board file is writable by every tenant of the GPU, so what a
//! slot says about itself (its use, its share) is a claim, not a fact.
//! Shares that scale other slices come from **root-written share records**
//! instead ([`publish_share`], `<dir>/shares/<uuid>/<key>`, root-owned,
//! read-only in slices): a slot without one asks for nothing, and one with
//! one asks for at most that share. So whatever is written on the board, a
//! capped slice refills at no less than `share × 100 % / Σ root-written
//! shares` when they pass 100 % (see the shim's `borrow` module), and its
//! own share and cap are never read from here.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::map::{self, Mapping};

/// First eight bytes of a board, as a little-endian word.
const MAGIC: u64 = u64::from_le_bytes(*b"GPUSLBRD");
pub const BOARD_VERSION: u64 = 2;
/// Slots per board (slices with a compute share on one GPU).
pub const BOARD_SLOTS: usize = 64;
const HEADER: usize = 64;
const SLOT: usize = 64;
pub const BOARD_SIZE: usize = HEADER + BOARD_SLOTS * SLOT;
/// A slot untouched this long may be reused by another slice.
pub const STALE_NS: u64 = 10_000_000_000;

const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_SLOTS: usize = 16;
const H_TURN: usize = 24;
const H_WAITING: usize = 32;
/// A 4-byte futex word, bumped whenever the turn is passed on.
const H_TURN_SEQ: usize = 40;
const H_FALLBACKS: usize = 48;
const H_TAIL: usize = 56;
const S_KEY: usize = 0;
const S_SHARE: usize = 8;
const S_MODE: usize = 16;
const S_BUSY: usize = 24;
const S_BEAT: usize = 32;

/// How a slice's share is applied (the slice contract's, stored in a
/// slot as its discriminant).
pub use crate::limits::Mode;

/// One slot as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoardSlot {
    pub key: u64,
    pub share_bp: u64,
    pub mode: Mode,
    pub busy_ns: u64,
    pub beat_ns: u64,
}

/// The GPU's turn as one word: the holder's slot + 1 in the top 7 bits
/// (0: free), the holding process's tag in the next 17 (0: passed to the
/// slot, not yet taken up by one of its processes), and the end of the
/// turn in µs of CLOCK_MONOTONIC, modulo 2^40 (12.7 days; a turn ends
/// within seconds of now, so it is read back relative to now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn(u64);

const TURN_TIME_BITS: u32 = 40;
const TURN_TAG_BITS: u32 = 17;
const TURN_TIME_MASK: u64 = (1 << TURN_TIME_BITS) - 1;
/// Process tags are 1..=TURN_TAG_MAX.
pub const TURN_TAG_MAX: u32 = (1 << TURN_TAG_BITS) - 1;

impl Turn {
    pub const FREE: Turn = Turn(0);

    /// The turn of `tag` (0: any process) of `slot`, until `until_ns`.
    pub fn new(slot: usize, tag: u32, until_ns: u64) -> Turn {
        Turn(
            ((slot as u64 + 1) << (TURN_TIME_BITS + TURN_TAG_BITS))
                | (u64::from(tag & TURN_TAG_MAX) << TURN_TIME_BITS)
                | ((until_ns / 1000) & TURN_TIME_MASK),
        )
    }

    /// The word as stored (for tests that forge it).
    pub fn raw(self) -> u64 {
        self.0
    }

    /// The slot whose slice has the turn; None when it is free.
    pub fn holder(self) -> Option<usize> {
        match self.0 >> (TURN_TIME_BITS + TURN_TAG_BITS) {
            0 => None,
            h => Some(h as usize - 1),
        }
    }

    /// The process of the holding slot that has it (0: none yet).
    pub fn tag(self) -> u32 {
        ((self.0 >> TURN_TIME_BITS) as u32) & TURN_TAG_MAX
    }

    /// When the holder's turn ends (CLOCK_MONOTONIC ns, µs precision): the
    /// time with the stored low bits nearest to `now_ns`.
    pub fn until_ns(self, now_ns: u64) -> u64 {
        let now_us = now_ns / 1000;
        let half = 1u64 << (TURN_TIME_BITS - 1);
        let stored = self.0 & TURN_TIME_MASK;
        let mut us = (now_us & !TURN_TIME_MASK) | stored;
        if us > now_us + half {
            us = us.saturating_sub(1 << TURN_TIME_BITS);
        } else if us + half < now_us {
            us += 1 << TURN_TIME_BITS;
        }
        us * 1000
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "{path} is not a gpuslice board of version {BOARD_VERSION} ({BOARD_SIZE} bytes); \
         remove it (it holds no state that outlives the slices using it)"
    )]
    Foreign { path: PathBuf },
    #[error("{path}: all {BOARD_SLOTS} slots are held by live slices")]
    Full { path: PathBuf },
}

pub struct Board {
    map: Mapping,
    path: PathBuf,
}

/// Where the boards are unless [`BOARD_DIR_ENV`] names another directory.
pub const DEFAULT_BOARD_DIR: &str = "/run/gpuslice/gpus";
pub const BOARD_DIR_ENV: &str = "GPUSLICE_BOARD_DIR";

/// The boards' directory: [`BOARD_DIR_ENV`] or [`DEFAULT_BOARD_DIR`].
pub fn board_dir() -> PathBuf {
    crate::dir::env_dir_or(BOARD_DIR_ENV, DEFAULT_BOARD_DIR)
}

/// A slice's key on the boards: from its ledger file's device and inode,
/// the same for every process of the slice whatever its mount namespace
/// (and for `gpuslice slices` reading it); never 0 (a free slot).
pub fn slice_key(dev: u64, ino: u64) -> u64 {
    // splitmix64 of the pair.
    let mut z = dev.rotate_left(32) ^ ino ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).max(1)
}

/// The key of the slice whose ledger is at `ledger`.
pub fn ledger_key(ledger: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(ledger)?;
    Ok(slice_key(m.dev(), m.ino()))
}

/// The board file of GPU `uuid` in `dir`.
pub fn board_path(dir: &Path, uuid: &str) -> PathBuf {
    let safe: String = uuid
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("{safe}.board"))
}

/// Where root-written share records are: `<dir>/shares`.
pub fn shares_dir(dir: &Path) -> PathBuf {
    dir.join("shares")
}

fn share_record(dir: &Path, uuid: &str, key: u64) -> PathBuf {
    let gpu = board_path(dir, uuid).with_extension("");
    shares_dir(dir)
        .join(gpu.file_name().unwrap_or_default())
        .join(format!("{key:016x}"))
}

/// Records, as root, that the slice `key` has `share_bp` on GPU `uuid`
/// (what oversubscription scaling may count for it). The directories are
/// created root-owned 0755; one that exists owned by someone else is
/// refused (the board directory is world-writable: a tenant may have made
/// it first). Returns the record, to be removed when the slice ends.
pub fn publish_share(dir: &Path, uuid: &str, key: u64, share_bp: u64) -> io::Result<PathBuf> {
    let record = share_record(dir, uuid, key);
    let gpu_dir = record.parent().unwrap_or(dir);
    for d in [shares_dir(dir).as_path(), gpu_dir] {
        root_owned_dir(d)?;
    }
    std::fs::write(
        &record,
        format!(
            "{share_bp}
"
        ),
    )?;
    std::fs::set_permissions(&record, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    Ok(record)
}

/// Records, as root, the share of every device of `limits` that has one
/// for the slice whose usage ledger is `usage` ([`publish_share`]): what
/// lets the other slices of those GPUs count it and take turns with it.
/// Returns the records, to be removed when the slice ends; on an error
/// none is left.
pub fn publish_shares(
    dir: &Path,
    usage: &Path,
    limits: &crate::limits::SliceLimits,
) -> io::Result<Vec<PathBuf>> {
    let key = ledger_key(usage)?;
    let mut records = Vec::new();
    for d in &limits.devices {
        let Some(c) = d.compute else { continue };
        match publish_share(dir, &d.uuid, key, c.basis_points()) {
            Ok(r) => records.push(r),
            Err(e) => {
                for r in &records {
                    let _ = std::fs::remove_file(r);
                }
                return Err(e);
            }
        }
    }
    Ok(records)
}

/// Makes `d` a directory, root-owned 0755, unless it is one. Called as
/// root: whatever else is there (`shares` planted by a local user in the
/// world-writable board directory before root made it, which made every
/// `run --compute` fail) is removed first and the directory made anew;
/// not as root, it is refused.
fn root_owned_dir(d: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let ours = |m: &std::fs::Metadata| m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0;
    for _ in 0..4 {
        match std::fs::DirBuilder::new().mode(0o755).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let m = std::fs::symlink_metadata(d)?;
        if ours(&m) {
            return Ok(());
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            break;
        }
        // Root did not make it: it goes (no link is followed).
        if m.is_dir() {
            std::fs::remove_dir_all(d)?;
        } else {
            std::fs::remove_file(d)?;
        }
    }
    Err(io::Error::other(format!(
        "{} is not a root-owned directory writable by root alone; remove it",
        d.display()
    )))
}

/// Makes the board directory `dir` (world-writable and sticky: every
/// tenant of a GPU writes its board) and its root-owned `shares`
/// directory, as root, for bind-mounting them into slices: the boards
/// read-write, the shares read-only over them.
pub fn prepare_dir(dir: &Path) -> io::Result<()> {
    crate::ensure_dir(dir).map_err(io::Error::other)?;
    root_owned_dir(&shares_dir(dir))
}

/// Makes, as root, the board of GPU `uuid` in `dir` one root made: a
/// regular file owned by uid 0, of a board's size and header, is kept;
/// anything else there (a file a local user planted first in the sticky
/// directory to squat the GPU's board, which switched off taking turns
/// on it, a link, a FIFO, a directory) is removed and a board made in its
/// place, root-owned 0666 (every tenant of the GPU writes it). Called
/// when a slice with a compute share starts (`gpuslice run`). Once root
/// owns it, the sticky bit keeps other users from removing or renaming
/// it, and in a slice the directory is read-only. Returns its path.
pub fn prepare_board(dir: &Path, uuid: &str) -> io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let path = board_path(dir, uuid);
    for _ in 0..4 {
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() && m.uid() == 0 && m.len() == BOARD_SIZE as u64 => {
                if Board::open_or_create(dir, uuid).is_ok() {
                    return Ok(path);
                }
                std::fs::remove_file(&path)?;
            }
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path)?,
            Ok(_) => std::fs::remove_file(&path)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(file) => {
                map::fchmod(&file, 0o666)?;
                file.set_len(BOARD_SIZE as u64)?;
                drop(file);
                Board::open_or_create(dir, uuid).map_err(io::Error::other)?;
                return Ok(path);
            }
            // Planted again between the removal and the creation: again.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!(
        "{}: something keeps taking its place",
        path.display()
    )))
}

/// Removes slice `key`'s share record on GPU `uuid` (the slice is gone),
/// best effort: one nobody may remove stays.
pub fn withdraw_share(dir: &Path, uuid: &str, key: u64) {
    let _ = std::fs::remove_file(share_record(dir, uuid, key));
}

/// Removes, on every GPU, the share records of the slice whose usage
/// ledger is `usage` (the slice is going: its directory is about to be
/// swept or replaced), best effort. Left behind, they would pile up in the
/// host's `/run`, one per replica or claim that ever ran.
pub fn withdraw_shares_of(dir: &Path, usage: &Path) {
    let Ok(key) = ledger_key(usage) else {
        return; // no ledger: no share was recorded for it
    };
    for gpu in std::fs::read_dir(shares_dir(dir))
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = std::fs::remove_file(gpu.path().join(format!("{key:016x}")));
    }
}

/// The root-written share of slice `key` on GPU `uuid`, if there is a
/// record and it is root's (file and directory owned by uid 0, writable
/// by root alone); None otherwise: a slot nobody vouched for.
pub fn root_share(dir: &Path, uuid: &str, key: u64) -> Option<u64> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let record = share_record(dir, uuid, key);
    let trusted = |m: &std::fs::Metadata| m.uid() == 0 && m.mode() & 0o022 == 0;
    for d in [shares_dir(dir), record.parent()?.to_path_buf()] {
        if !trusted(&std::fs::symlink_metadata(d).ok()?) {
            return None;
        }
    }
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&record)
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || !trusted(&m) {
        return None;
    }
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    text.trim()
        .parse()
        .ok()
        .filter(|&bp| bp <= crate::FULL_SHARE)
}

impl Board {
    /// Opens the board of GPU `uuid` in `dir`, creating it (mode 0666, as
    /// every tenant of the GPU must write it) when there is none.
    pub fn open_or_create(dir: &Path, uuid: &str) -> Result<Board, BoardError> {
        let path = board_path(dir, uuid);
        let io_err = |source| BoardError::Io {
            path: path.clone(),
            source,
        };
        // The directory is world-writable: never follow a link planted
        // there, and open nothing but a regular file (a device node planted
        // there would be opened, with whatever its open does, before a
        // check after the open could refuse it).
        let file = match crate::planted::open_or_create_rw(&path, 0o666) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                return Err(BoardError::Foreign { path });
            }
            Err(e) => return Err(io_err(e)),
        };
        let meta = file.metadata().map_err(io_err)?;
        let len = meta.len();
        if len == 0 {
            // A new file: the owner widens its mode past the umask, and
            // every racer sets the same length (zeros are a valid board).
            let _ = map::fchmod(&file, 0o666);
            file.set_len(BOARD_SIZE as u64).map_err(io_err)?;
        } else if len != BOARD_SIZE as u64 {
            return Err(BoardError::Foreign { path });
        }
        let map = Mapping::file_guarded(&file, BOARD_SIZE, true).map_err(io_err)?;
        let board = Board { map, path };
        board.adopt_header()?;
        Ok(board)
    }

    fn adopt_header(&self) -> Result<(), BoardError> {
        let magic = self.map.u64_at(H_MAGIC);
        if magic
            .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.map
                .u64_at(H_VERSION)
                .store(BOARD_VERSION, Ordering::Release);
            self.map
                .u64_at(H_SLOTS)
                .store(BOARD_SLOTS as u64, Ordering::Release);
            return Ok(());
        }
        if magic.load(Ordering::Acquire) != MAGIC {
            return Err(BoardError::Foreign {
                path: self.path.clone(),
            });
        }
        // The creator may still be writing the rest of the header.
        let version = self.map.u64_at(H_VERSION).load(Ordering::Acquire);
        if version != 0 && version != BOARD_VERSION {
            return Err(BoardError::Foreign {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn word(&self, slot: usize, field: usize) -> &AtomicU64 {
        self.map.u64_at(HEADER + slot * SLOT + field)
    }

    /// The slot of the slice `key` (non-zero), claiming a free or stale
    /// one when it has none; records its share and mode.
    pub fn claim(
        &self,
        key: u64,
        share_bp: u64,
        mode: Mode,
        now_ns: u64,
    ) -> Result<usize, BoardError> {
        assert_ne!(key, 0, "0 marks a free slot");
        let slot =
            match (0..BOARD_SLOTS).find(|&s| self.word(s, S_KEY).load(Ordering::Acquire) == key) {
                Some(s) => s,
                None => self.take_slot(key, now_ns)?,
            };
        self.word(slot, S_SHARE).store(share_bp, Ordering::Relaxed);
        self.word(slot, S_MODE)
            .store(mode as u64, Ordering::Relaxed);
        self.word(slot, S_BEAT).store(now_ns, Ordering::Release);
        Ok(slot)
    }

    fn take_slot(&self, key: u64, now_ns: u64) -> Result<usize, BoardError> {
        for s in 0..BOARD_SLOTS {
            let k = self.word(s, S_KEY);
            let old = k.load(Ordering::Acquire);
            let beat = self.word(s, S_BEAT).load(Ordering::Acquire);
            let free = old == 0 || now_ns.saturating_sub(beat) > STALE_NS;
            if free
                && k.compare_exchange(old, key, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                // A taken-over slot starts from zero for its new owner;
                // readers see the counter drop and skip that interval.
                self.word(s, S_BUSY).store(0, Ordering::Relaxed);
                self.word(s, S_BEAT).store(now_ns, Ordering::Release);
                return Ok(s);
            }
        }
        Err(BoardError::Full {
            path: self.path.clone(),
        })
    }

    /// Whether `slot` is still held by slice `key` (a slot silent for
    /// [`STALE_NS`] may have been taken over).
    pub fn holds(&self, slot: usize, key: u64) -> bool {
        slot < BOARD_SLOTS && self.word(slot, S_KEY).load(Ordering::Acquire) == key
    }

    /// Adds `busy_ns` of measured GPU time to `slot`.
    pub fn record(&self, slot: usize, busy_ns: u64, now_ns: u64) {
        self.word(slot, S_BUSY)
            .fetch_add(busy_ns, Ordering::Relaxed);
        self.word(slot, S_BEAT).store(now_ns, Ordering::Relaxed);
    }

    /// Opens an existing board read-only (for reports); None when there is
    /// none or it is not a board.
    pub fn open_existing(dir: &Path, uuid: &str) -> Option<Board> {
        let path = board_path(dir, uuid);
        // Root reads it (`gpuslice slices`, doctor) in a directory every
        // user may write: nothing planted there is opened.
        let file = crate::planted::open_read_only(&path).ok()?;
        if file.metadata().ok()?.len() != BOARD_SIZE as u64 {
            return None;
        }
        let map = Mapping::file_guarded(&file, BOARD_SIZE, false).ok()?;
        (map.u64_at(H_MAGIC).load(Ordering::Acquire) == MAGIC).then_some(Board { map, path })
    }

    /// The slot of slice `key`, if it has one.
    pub fn find(&self, key: u64) -> Option<BoardSlot> {
        self.snapshot()
            .into_iter()
            .find(|(_, s)| s.key == key)
            .map(|(_, s)| s)
    }

    /// Every claimed slot.
    pub fn snapshot(&self) -> Vec<(usize, BoardSlot)> {
        (0..BOARD_SLOTS)
            .filter_map(|s| Some((s, self.slot(s)?)))
            .collect()
    }

    /// Slot `s` as read now; None when unclaimed (or out of range).
    /// Allocation-free (the shim reads every slot each window).
    pub fn slot(&self, s: usize) -> Option<BoardSlot> {
        if s >= BOARD_SLOTS {
            return None;
        }
        let key = self.word(s, S_KEY).load(Ordering::Acquire);
        (key != 0).then(|| BoardSlot {
            key,
            share_bp: self.word(s, S_SHARE).load(Ordering::Relaxed),
            mode: if self.word(s, S_MODE).load(Ordering::Relaxed) == 1 {
                Mode::Guaranteed
            } else {
                Mode::Cap
            },
            busy_ns: self.word(s, S_BUSY).load(Ordering::Relaxed),
            beat_ns: self.word(s, S_BEAT).load(Ordering::Relaxed),
        })
    }

    /// Who has the GPU's turn now.
    pub fn turn(&self) -> Turn {
        Turn(self.map.u64_at(H_TURN).load(Ordering::Acquire))
    }

    /// Takes the turn for process `tag` of `slot` until `until_ns`, if it
    /// is still `seen` (free, expired, passed to `slot`, or ours to
    /// extend). Whether it was taken.
    pub fn take_turn(&self, seen: Turn, slot: usize, tag: u32, until_ns: u64) -> bool {
        slot < BOARD_SLOTS
            && self
                .map
                .u64_at(H_TURN)
                .compare_exchange(
                    seen.0,
                    Turn::new(slot, tag, until_ns).0,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Passes the turn, if it is still `seen`, to `slot` (whichever of its
    /// processes takes it up) until `until_ns`, and wakes the waiters.
    pub fn pass_turn(&self, seen: Turn, slot: usize, until_ns: u64) -> bool {
        let passed = self.take_turn(seen, slot, 0, until_ns);
        if passed {
            self.map.u32_at(H_TURN_SEQ).fetch_add(1, Ordering::AcqRel);
            self.map.futex_wake(H_TURN_SEQ);
        }
        passed
    }

    /// The slot the turn goes to after `slot`'s: the first slot of
    /// `among` after it (in a circle) that waits for the turn, else
    /// `slot` itself if it waits (another process of the same slice).
    pub fn next_waiting(&self, slot: usize, among: u64) -> Option<usize> {
        let slot = slot % BOARD_SLOTS;
        let waiting = self.waiting() & (among | 1 << slot);
        if waiting == 0 {
            return None; // every launch of a slice alone asks: no scan
        }
        // Bit i of the rotated word is slot `slot + 1 + i` (mod 64); the
        // slot itself comes last.
        let i = waiting.rotate_right(slot as u32 + 1).trailing_zeros() as usize;
        Some((slot + 1 + i) % BOARD_SLOTS)
    }

    /// The slots waiting for the turn, one bit each.
    pub fn waiting(&self) -> u64 {
        self.map.u64_at(H_WAITING).load(Ordering::Acquire)
    }

    /// The turn's sequence number: read it before the turn, then
    /// [`Board::wait_turn`] with it sleeps until the turn is passed on.
    /// It also counts hand-overs (modulo 2^32).
    pub fn turn_seq(&self) -> u32 {
        self.map.u32_at(H_TURN_SEQ).load(Ordering::Acquire)
    }

    /// Sleeps until the turn is passed on after `seq` was read, at most
    /// `timeout_ns`.
    pub fn wait_turn(&self, seq: u32, timeout_ns: u64) {
        self.map.futex_wait(H_TURN_SEQ, seq, timeout_ns);
    }

    /// Publishes, as the holder, when the work it has queued ends
    /// (CLOCK_MONOTONIC ns, estimated).
    pub fn set_tail(&self, ns: u64) {
        self.map.u64_at(H_TAIL).store(ns, Ordering::Relaxed);
    }

    /// Publishes, as the holder, that its work ends at `ns` at the
    /// earliest (another thread of the holding process may have queued
    /// work that ends later): the tail now.
    pub fn raise_tail(&self, ns: u64) -> u64 {
        self.map
            .u64_at(H_TAIL)
            .fetch_max(ns, Ordering::Relaxed)
            .max(ns)
    }

    /// Puts back the tail `before` if the tail is still `ours` (a would-be
    /// taker that lost the turn to another withdraws its tail).
    pub fn restore_tail(&self, ours: u64, before: u64) {
        let _ = self.map.u64_at(H_TAIL).compare_exchange(
            ours,
            before,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// When the holder said its queued work ends ([`Board::set_tail`]).
    pub fn tail(&self) -> u64 {
        self.map.u64_at(H_TAIL).load(Ordering::Relaxed)
    }

    /// Counts a process's fallback to the GPU's time-slicing.
    pub fn note_fallback(&self) {
        self.map.u64_at(H_FALLBACKS).fetch_add(1, Ordering::Relaxed);
    }

    /// Fallbacks to time-slicing counted on this board so far.
    pub fn fallbacks(&self) -> u64 {
        self.map.u64_at(H_FALLBACKS).load(Ordering::Relaxed)
    }

    /// Marks `slot` as waiting for the turn (or no longer).
    pub fn set_waiting(&self, slot: usize, waiting: bool) {
        if slot >= BOARD_SLOTS {
            return;
        }
        let bit = 1u64 << slot;
        let w = self.map.u64_at(H_WAITING);
        if waiting {
            w.fetch_or(bit, Ordering::AcqRel);
        } else {
            w.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// Publishes the share of the slice holding `slot` (it may change
    /// while the slice runs: its ledger's share word is live).
    pub fn set_share(&self, slot: usize, share_bp: u64) {
        if slot < BOARD_SLOTS {
            self.word(slot, S_SHARE).store(share_bp, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board() -> (tempfile::TempDir, Board) {
        let dir = tempfile::tempdir().unwrap();
        let b = Board::open_or_create(dir.path(), "GPU-1234").unwrap();
        (dir, b)
    }

    /// Root's reader opens no link planted where a board would be (the
    /// directory is 1777): here one to a real board elsewhere.
    #[test]
    fn a_link_planted_as_a_board_is_not_opened() {
        let (dir, _b) = board();
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            board_path(dir.path(), "GPU-1234"),
            board_path(other.path(), "GPU-1234"),
        )
        .unwrap();
        assert!(Board::open_existing(other.path(), "GPU-1234").is_none());
        assert!(Board::open_existing(dir.path(), "GPU-1234").is_some());
    }

    /// A device node planted where a board would be (a container with
    /// CAP_MKNOD can make one in the boards' directory) is refused before
    /// it is opened: here one of an unregistered major, whose open fails
    /// with ENXIO (an Io error), so a Foreign answer shows no open was made.
    #[test]
    fn a_device_node_planted_as_a_board_is_never_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = board_path(dir.path(), "GPU-1234");
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mknod reads nothing else.
        let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(511, 0)) };
        // Needs root, as the tests do (scripts/test.sh).
        assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
        match Board::open_or_create(dir.path(), "GPU-1234") {
            Err(BoardError::Foreign { .. }) => {}
            Err(e) => panic!("opened: {e}"),
            Ok(_) => panic!("a device node was taken for a board"),
        }
        // A FIFO as well (opened read-write it would not block, but it is
        // no board either).
        std::fs::remove_file(&path).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        assert!(matches!(
            Board::open_or_create(dir.path(), "GPU-1234"),
            Err(BoardError::Foreign { .. })
        ));
    }

    /// Every tenant of the GPU can truncate its board under the others'
    /// mappings: a writer and a reader of it read zeros from then on (a
    /// private copy each), and live (without the guard this test process
    /// would die of SIGBUS).
    #[test]
    fn a_board_truncated_under_its_mappings_reads_as_zeros() {
        let (dir, b) = board();
        let reader = Board::open_existing(dir.path(), "GPU-1234").unwrap();
        let a = b.claim(11, 3000, Mode::Cap, 1).unwrap();
        assert_eq!(reader.snapshot().len(), 1);
        std::fs::OpenOptions::new()
            .write(true)
            .open(board_path(dir.path(), "GPU-1234"))
            .and_then(|f| f.set_len(0))
            .unwrap();
        assert!(reader.snapshot().is_empty());
        assert!(b.snapshot().is_empty());
        assert!(b.map.lost() && reader.map.lost());
        // The writer's copy is its own now: it still works, alone.
        b.record(a, 500, 2);
        assert!(reader.snapshot().is_empty());
    }

    #[test]
    fn slices_claim_their_own_slot_and_keep_it() {
        let (dir, b) = board();
        let a = b.claim(11, 3000, Mode::Guaranteed, 1).unwrap();
        let c = b.claim(22, 5000, Mode::Cap, 1).unwrap();
        assert_ne!(a, c);
        // A second process of slice 11, through another mapping.
        let b2 = Board::open_or_create(dir.path(), "GPU-1234").unwrap();
        assert_eq!(b2.claim(11, 3000, Mode::Guaranteed, 2).unwrap(), a);
        b.record(a, 500, 3);
        b2.record(a, 250, 4);
        b.record(c, 1000, 4);
        let snap = b2.snapshot();
        assert_eq!(snap.len(), 2);
        let (_, sa) = snap.iter().find(|(s, _)| *s == a).unwrap();
        assert_eq!(
            (sa.busy_ns, sa.share_bp, sa.mode),
            (750, 3000, Mode::Guaranteed)
        );
        assert_eq!(b2.slot(c).map(|s| s.busy_ns), Some(1000));
        // A share changed in a live slice is published for the others.
        b.set_share(a, 2500);
        assert_eq!(b2.slot(a).map(|s| s.share_bp), Some(2500));
        assert_eq!(b.slot(BOARD_SLOTS), None);
    }

    #[test]
    fn the_turn_passes_by_compare_and_swap_and_wakes_its_waiters() {
        let (dir, b) = board();
        let other = Board::open_or_create(dir.path(), "GPU-1234").unwrap();
        let all = u64::MAX;
        assert_eq!(b.turn(), Turn::FREE, "a new board's turn is free");
        assert!(b.take_turn(Turn::FREE, 3, 77, 5_000_000));
        let t = other.turn();
        assert_eq!(
            (t.holder(), t.tag(), t.until_ns(4_000_000)),
            (Some(3), 77, 5_000_000)
        );
        // Taken from a stale view: refused.
        assert!(!other.take_turn(Turn::FREE, 7, 1, 9_000_000));
        assert!(!other.pass_turn(Turn::FREE, 7, 0));
        // Waiting is per slot; a slot comes last after itself (another
        // process of its slice waits), and only slots `among` count.
        other.set_waiting(7, true);
        assert_eq!(b.next_waiting(3, all), Some(7));
        assert_eq!(b.next_waiting(7, all), Some(7));
        assert_eq!(b.next_waiting(3, 1 << 3), None, "7 is not counted");
        // A waiter sleeps on the sequence word until the turn is passed.
        let seq = other.turn_seq();
        let waiter = std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            other.wait_turn(seq, 5_000_000_000);
            (t0.elapsed(), other.turn())
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(b.pass_turn(t, 7, 6_000_000));
        let (slept, seen) = waiter.join().unwrap();
        assert_eq!(
            (seen.holder(), seen.tag(), seen.until_ns(6_000_000)),
            (Some(7), 0, 6_000_000),
            "passed to the slot, for whichever of its processes takes it up"
        );
        assert!(
            slept < std::time::Duration::from_secs(4),
            "woken by the pass, not the timeout: {slept:?}"
        );
        assert_eq!(b.turn_seq(), seq.wrapping_add(1));
        b.set_waiting(7, false);
        assert_eq!(b.next_waiting(3, all), None);
        // Waiters are served in a circle from the holder on.
        for w in [1, 5, 9] {
            b.set_waiting(w, true);
        }
        assert_eq!(b.next_waiting(5, all), Some(9));
        assert_eq!(b.next_waiting(9, all), Some(1));
        assert_eq!(b.next_waiting(0, all), Some(1));
        assert_eq!(b.next_waiting(0, 1 << 9), Some(9));
        b.set_waiting(63, true);
        assert_eq!(b.next_waiting(9, all), Some(63));
        assert_eq!(b.next_waiting(63, all), Some(1));
        // The last slot and the largest tag round-trip; out-of-range slots
        // take nothing.
        assert!(b.take_turn(b.turn(), BOARD_SLOTS - 1, TURN_TAG_MAX, 1_000));
        assert_eq!(
            (b.turn().holder(), b.turn().tag()),
            (Some(BOARD_SLOTS - 1), TURN_TAG_MAX)
        );
        assert!(!b.take_turn(b.turn(), BOARD_SLOTS, 1, 1_000));
        // Fallbacks are counted for reports.
        b.note_fallback();
        assert_eq!(b.fallbacks(), 1);
    }

    /// The end of a turn is kept in 40 bits of µs and read back relative
    /// to now, across the wrap.
    #[test]
    fn a_turn_s_end_is_read_back_across_the_wrap() {
        let wrap = (1u64 << TURN_TIME_BITS) * 1000;
        for now in [
            5_000_000,
            wrap - 1_000_000,
            wrap + 3_000_000,
            40 * wrap + 7_000,
        ] {
            for d in [0i64, 4_000_000, -4_000_000, 3_600_000_000_000] {
                let until = (now as i64 + d) as u64 / 1000 * 1000;
                let t = Turn::new(5, 9, until);
                assert_eq!(t.until_ns(now), until, "now {now} d {d}");
                assert_eq!((t.holder(), t.tag()), (Some(5), 9));
            }
        }
    }

    #[test]
    fn a_stale_slot_is_taken_over_and_a_full_board_says_so() {
        let (_dir, b) = board();
        for key in 1..=BOARD_SLOTS as u64 {
            b.claim(key, 100, Mode::Cap, 1_000).unwrap();
        }
        b.record(0, 777, 1_000);
        // Everyone is live: no room.
        let err = b.claim(999, 100, Mode::Cap, 2_000).unwrap_err();
        assert!(err.to_string().contains("all 64 slots"), "{err}");
        // Later, slot 5 has been silent past STALE_NS while the others beat.
        let later = 1_000 + STALE_NS + 1;
        for s in (0..BOARD_SLOTS).filter(|&s| s != 5) {
            b.record(s, 0, later);
        }
        let s = b.claim(999, 100, Mode::Cap, later).unwrap();
        assert_eq!(s, 5);
        assert_eq!(
            b.snapshot()[5].1.busy_ns,
            0,
            "a taken-over slot starts at zero"
        );
    }

    #[test]
    fn foreign_files_are_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = board_path(dir.path(), "GPU-x");
        std::fs::write(&path, b"not a board").unwrap();
        let err = Board::open_or_create(dir.path(), "GPU-x").err().unwrap();
        assert!(err.to_string().contains("remove it"), "{err}");
        std::fs::write(&path, vec![7u8; BOARD_SIZE]).unwrap();
        assert!(matches!(
            Board::open_or_create(dir.path(), "GPU-x"),
            Err(BoardError::Foreign { .. })
        ));
        // A link planted in the (world-writable) directory is not followed:
        // the file it points to is left as it was.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"").unwrap();
        std::os::unix::fs::symlink(&victim, board_path(dir.path(), "GPU-y")).unwrap();
        assert!(Board::open_or_create(dir.path(), "GPU-y").is_err());
        assert_eq!(std::fs::metadata(&victim).unwrap().len(), 0);
    }

    #[test]
    fn share_records_count_only_when_root_wrote_them() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(root_share(d, "GPU-1", 42), None, "no record");
        let rec = publish_share(d, "GPU-1", 42, 3000).unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return; // records need root; CI runs this as root
        }
        assert_eq!(root_share(d, "GPU-1", 42), Some(3000));
        assert_eq!(root_share(d, "GPU-1", 43), None);
        assert_eq!(root_share(d, "GPU-2", 42), None);
        // A record someone else owns, or one anyone may write, is no record.
        std::os::unix::fs::chown(&rec, Some(65534), None).unwrap();
        assert_eq!(root_share(d, "GPU-1", 42), None);
        std::os::unix::fs::chown(&rec, Some(0), None).unwrap();
        std::fs::set_permissions(&rec, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        assert_eq!(root_share(d, "GPU-1", 42), None);
        // A shares directory a tenant made first (squatting it made every
        // `run --compute` fail), or a file or link there, is
        // replaced by root's, never used as it was.
        let other = tempfile::tempdir().unwrap();
        let planted = shares_dir(other.path());
        let plants: [&dyn Fn(); 3] = [
            &|| {
                std::fs::create_dir_all(planted.join("GPU-1")).unwrap();
                std::os::unix::fs::chown(&planted, Some(65534), None).unwrap();
            },
            &|| std::fs::write(&planted, b"junk").unwrap(),
            &|| std::os::unix::fs::symlink(d, &planted).unwrap(),
        ];
        for plant in plants {
            plant();
            publish_share(other.path(), "GPU-1", 1, 100).unwrap();
            let m = std::fs::symlink_metadata(&planted).unwrap();
            assert!(m.is_dir() && m.uid() == 0, "{m:?}");
            assert_eq!(root_share(other.path(), "GPU-1", 1), Some(100));
            std::fs::remove_dir_all(&planted).unwrap();
        }
        // The link's target was not touched.
        assert_eq!(root_share(d, "GPU-1", 42), None);
        assert!(rec.exists());
    }

    /// A holder raises the tail, never lowers it: another of its threads
    /// may have published a later end of work, which stands; the tail
    /// returned is what waiters read.
    #[test]
    fn raise_tail_keeps_the_later_end_of_work() {
        let (_dir, b) = board();
        assert_eq!(b.raise_tail(5_000), 5_000);
        assert_eq!(b.tail(), 5_000);
        assert_eq!(
            b.raise_tail(3_000),
            5_000,
            "an earlier end lowered the tail"
        );
        assert_eq!(b.tail(), 5_000);
        assert_eq!(b.raise_tail(9_000), 9_000);
        assert_eq!(b.tail(), 9_000);
        // A pass sets the tail outright (the taker's half a turn).
        b.set_tail(1_000);
        assert_eq!(b.raise_tail(2_000), 2_000);
    }

    #[test]
    fn uuids_make_plain_file_names() {
        let p = board_path(Path::new("/run/x"), "MIG-GPU-ab/../c");
        assert_eq!(p, Path::new("/run/x/MIG-GPU-ab____c.board"));
    }

    /// Root replaces whatever it did not make where a GPU's board goes (a
    /// junk file, a link, a directory), and keeps a board it made.
    #[test]
    fn root_replaces_a_squatted_board_and_keeps_its_own() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, b"keep me").unwrap();
        let p = board_path(dir.path(), "GPU-1");
        let plants: [&dyn Fn(); 3] = [
            &|| std::fs::write(&p, b"junk").unwrap(),
            &|| std::os::unix::fs::symlink(&elsewhere, &p).unwrap(),
            &|| std::fs::create_dir_all(p.join("sub")).unwrap(),
        ];
        for plant in plants {
            plant();
            assert_eq!(prepare_board(dir.path(), "GPU-1").unwrap(), p);
            let m = std::fs::symlink_metadata(&p).unwrap();
            assert!(m.is_file() && m.len() == BOARD_SIZE as u64 && m.mode() & 0o777 == 0o666);
            assert!(Board::open_existing(dir.path(), "GPU-1").is_some());
            std::fs::remove_file(&p).unwrap();
        }
        assert_eq!(std::fs::read(&elsewhere).unwrap(), b"keep me");
        // Its own board, in use, is kept (same inode).
        prepare_board(dir.path(), "GPU-1").unwrap();
        let ino = std::fs::metadata(&p).unwrap().ino();
        prepare_board(dir.path(), "GPU-1").unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino);
    }
}
