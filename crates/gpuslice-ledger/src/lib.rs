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
pub mod enforcement;
pub mod enforcer;
pub mod hostpid;
pub mod limits;
mod map;
mod planted;
pub mod procfs;
mod sigbus;
pub mod turn_order;

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub use limits::valid_slice_id;
use map::Mapping;

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
/// Where `run` puts slice ledgers (`<dir>/<slice-id>.ledger`).
pub const DEFAULT_DIR: &str = "/run/gpuslice/slices";
/// Environment variable naming the directory of ledgers (tests, non-root).
pub const DIR_ENV: &str = "GPUSLICE_LEDGER_DIR";

const HEADER_SIZE: usize = 256;
const DEVICE_SIZE: usize = 128;
const SLOT_SIZE: usize = 320;
const DEVICES_OFF: usize = HEADER_SIZE;
const SLOTS_OFF: usize = DEVICES_OFF + MAX_DEVICES * DEVICE_SIZE;
/// Size of a version-1 ledger file.
pub const FILE_SIZE_V1: usize = SLOTS_OFF + MAX_SLOTS * SLOT_SIZE;
const COMPUTE_OFF: usize = FILE_SIZE_V1;
const COMPUTE_SIZE: usize = 64;
/// Size of a version-2 ledger file.
pub const FILE_SIZE: usize = COMPUTE_OFF + MAX_DEVICES * COMPUTE_SIZE;
/// A compute share of 100 % in [`Ledger::compute_share`] units (basis points).
pub const FULL_SHARE: u64 = 10_000;

/// How a slice's bucket refills while other slices share its GPU (the
/// shim works it out from the GPU's [`board`] every few tens of ms).
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
/// Largest slice id / UUID stored.
pub const MAX_ID_LEN: usize = limits::MAX_SLICE_ID_LEN;
const UUID_LEN: usize = 96;
/// Header `state` once the file is completely written.
const READY: u32 = 0x5245_4459;

// Header fields.
const H_VERSION: usize = 8;
const H_HEADER_SIZE: usize = 12;
const H_DEVICE_COUNT: usize = 16;
const H_MAX_DEVICES: usize = 20;
const H_MAX_SLOTS: usize = 24;
const H_SLOT_SIZE: usize = 28;
const H_DEVICE_SIZE: usize = 32;
const H_STATE: usize = 36;
const H_FILE_SIZE: usize = 40;
const H_CREATED_MS: usize = 48;
const H_CREATOR_PID: usize = 56;
const H_SLICE_ID: usize = 64;
const H_REPAIRS: usize = 128;
const H_RECLAIMED_SLOTS: usize = 136;
const H_RECLAIMED_BYTES: usize = 144;
const H_ATTACH_FAILURES: usize = 152;
const _: () =
    assert!(turn_order::OFFSET >= 160 && turn_order::OFFSET + turn_order::SIZE <= HEADER_SIZE);

// Device fields.
const D_CAP: usize = 0;
const D_USED: usize = 8;
const D_PEAK: usize = 16;
const D_REFUSALS: usize = 24;
const D_UUID: usize = 32;

// Compute fields (version 2), per device.
const C_SHARE: usize = 0;
const C_BURST: usize = 8;
const C_TOKENS: usize = 16;
const C_LAST: usize = 24;
const C_BUSY: usize = 32;
const C_THROTTLED: usize = 40;
const C_LAUNCHES: usize = 48;
const C_DELAYED: usize = 56;

// Slot fields.
const S_STATE: usize = 0;
const S_START: usize = 8;
const S_PIDNS: usize = 16;
const S_COMM: usize = 24;
const S_ATTACHED_MS: usize = 40;
const S_BYTES: usize = 64;

// Tags in the low bits of a slot's state word; the pid is in the high 32.
const TAG_MASK: u64 = 3;
const FREE: u64 = 0;
const CLAIMING: u64 = 1;
const LIVE: u64 = 2;
const RECLAIMING: u64 = 3;

fn word(pid: u32, tag: u64) -> u64 {
    (u64::from(pid) << 32) | tag
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ledger {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a gpuslice ledger (no GPUSLDGR magic)")]
    Foreign { path: PathBuf },
    #[error(
        "ledger {path} has layout version {found}; this gpuslice reads versions {VERSION_1} \
         and {VERSION} (the slice was set up by a different gpuslice release)"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("ledger {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("a ledger holds at most {MAX_DEVICES} devices, {0} given")]
    TooManyDevices(usize),
    #[error("invalid slice id {0:?} (1-{MAX_ID_LEN} of A-Z a-z 0-9 . _ -, not starting with .)")]
    BadSliceId(String),
    #[error("all {MAX_SLOTS} process slots of the ledger are in use")]
    SlotsExhausted,
    #[error("the ledger is mapped read-only")]
    ReadOnly,
    #[error("ledger layout version 1 has no compute section")]
    NoCompute,
    #[error("cannot read this process's /proc/self/stat")]
    NoProcStat,
}

pub type Result<T> = std::result::Result<T, Error>;

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One device of a new ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The device's UUID as CUDA and NVML spell it (`GPU-…`, `MIG-…`); may
    /// be empty when unknown.
    pub uuid: String,
    /// Cap in bytes, or [`UNLIMITED`].
    pub cap: u64,
}

/// A reservation was refused: it would pass the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverCap {
    pub cap: u64,
    pub used: u64,
}

/// A claimed process slot (index into the slot table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(usize);

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

/// A mapped ledger.
pub struct Ledger {
    map: Mapping,
    path: Option<PathBuf>,
    device_count: usize,
    version: u32,
    /// Caps and shares from the slice's root-written limits record
    /// ([`limits`]): when set, they win over the file's words, which the
    /// slice itself can write.
    pinned: Option<Box<Pinned>>,
}

/// This process's copy of a slice's limits (see [`Ledger::pin`]).
struct Pinned {
    /// Root's name for the slice and its devices: what reports label it
    /// with and look for its cgroup by (the file's copies are the slice's
    /// to write, so a slice could rename itself out of its own report).
    slice_id: String,
    uuids: Vec<String>,
    caps: [u64; MAX_DEVICES],
    /// Root may change a live slice's shares ([`Ledger::repin_shares`]).
    shares: [AtomicU64; MAX_DEVICES],
}

/// `$GPUSLICE_LEDGER_DIR`, else [`DEFAULT_DIR`].
pub fn ledger_dir() -> PathBuf {
    std::env::var_os(DIR_ENV)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from)
}

/// Creates `dir` (and parents) world-writable with the sticky bit, like
/// `/tmp`, so unprivileged processes of a slice may create their ledger.
pub fn ensure_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o1777)
        .create(dir)
        .map_err(io_err(dir))?;
    // The umask may have narrowed the mode.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o1777)).map_err(io_err(dir))
}

/// Ledgers in `dir`, sorted: the usage ledgers of slices with a limits
/// record (`<dir>/<id>/usage`, see [`limits`]) and plain ledger files
/// (`<dir>/*.ledger`, regular files of a ledger's size); none when it is
/// missing. What else is there is [`DirScan::junk`].
pub fn list_dir(dir: &Path) -> Vec<PathBuf> {
    scan_dir(dir).ledgers
}

/// What the ledger directory (1777: any local user may add to it) holds.
#[derive(Debug, Default)]
pub struct DirScan {
    /// As [`list_dir`].
    pub ledgers: Vec<PathBuf>,
    /// Everything else but root's own directories (a slice's records being
    /// made or removed, the boards when kept there): `*.ledger` files of
    /// another size (300 empty ones planted by `nobody` made
    /// `gpuslice slices` print 300 error lines), links, FIFOs, sockets,
    /// other names. Sorted by path.
    pub junk: Vec<Junk>,
}

/// An entry of the ledger directory that is not a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Junk {
    pub path: PathBuf,
    /// Its owner (`u32::MAX` when it went before it could be looked at).
    pub uid: u32,
}

/// One pass over `dir`: each entry's type from the listing, one `lstat`
/// for a `*.ledger` file (its size), a directory (its owner, its `usage`)
/// or junk (its owner); nothing is opened and no link followed.
pub fn scan_dir(dir: &Path) -> DirScan {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = fs::read_dir(dir) else {
        return DirScan::default();
    };
    let mut scan = DirScan::default();
    let owner = |p: &Path| fs::symlink_metadata(p).map_or(u32::MAX, |m| m.uid());
    for e in entries.flatten() {
        let Ok(kind) = e.file_type() else { continue };
        let p = e.path();
        if kind.is_file() && p.extension().is_some_and(|x| x == "ledger") {
            match fs::symlink_metadata(&p) {
                Ok(m) if m.is_file() && [FILE_SIZE, FILE_SIZE_V1].contains(&(m.len() as usize)) => {
                    scan.ledgers.push(p)
                }
                Ok(m) => scan.junk.push(Junk {
                    path: p,
                    uid: m.uid(),
                }),
                Err(_) => {} // gone
            }
            continue;
        }
        if kind.is_dir() {
            let usage = p.join(limits::USAGE_FILE);
            if fs::symlink_metadata(&usage).is_ok_and(|m| m.is_file()) {
                scan.ledgers.push(usage);
                continue;
            }
            let uid = owner(&p);
            if uid != 0 {
                scan.junk.push(Junk { path: p, uid });
            }
            continue;
        }
        let uid = owner(&p);
        scan.junk.push(Junk { path: p, uid });
    }
    scan.ledgers.sort();
    scan.junk.sort_by(|a, b| a.path.cmp(&b.path));
    scan
}

/// Parses `20GiB`, `512MiB`, `1.5GB`, `8G`, `4096` (bytes). Binary units
/// (KiB, MiB, GiB, TiB, and the bare K/M/G/T) are powers of 1024; decimal
/// ones (KB, MB, GB, TB) powers of 1000.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    if num.is_empty() {
        return None;
    }
    if !num.contains('.') && mult == 1.0 {
        return num.parse().ok();
    }
    let v: f64 = num.parse().ok()?;
    let bytes = v * mult;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn str_field(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Subtracts up to `n` from `w` without wrapping; returns what was taken.
fn sub_saturating(w: &AtomicU64, n: u64) -> u64 {
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
    /// Creates a ledger at `path`, replacing any file there, atomically:
    /// readers see the old file or the complete new one.
    pub fn create(path: &Path, slice_id: &str, devices: &[DeviceSpec]) -> Result<Ledger> {
        Self::create_inner(path, slice_id, devices, true)
    }

    /// Opens the ledger at `path`, or creates it when there is none (two
    /// processes racing both end up with the same file). For the slice's
    /// own processes, as [`Ledger::open_in_slice`].
    pub fn open_or_create(path: &Path, slice_id: &str, devices: &[DeviceSpec]) -> Result<Ledger> {
        match Self::open_in_slice(path) {
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Self::create_inner(path, slice_id, devices, false)
            }
            other => other,
        }
    }

    /// A ledger in private anonymous memory (one process; no file).
    pub fn private(slice_id: &str, devices: &[DeviceSpec]) -> Result<Ledger> {
        let mut map = Mapping::anonymous(FILE_SIZE).map_err(io_err(Path::new("(anonymous)")))?;
        Self::init(&mut map, slice_id, devices)?;
        Ok(Ledger {
            map,
            path: None,
            device_count: devices.len(),
            version: VERSION,
            pinned: None,
        })
    }

    fn create_inner(
        path: &Path,
        slice_id: &str,
        devices: &[DeviceSpec],
        replace: bool,
    ) -> Result<Ledger> {
        if devices.len() > MAX_DEVICES {
            return Err(Error::TooManyDevices(devices.len()));
        }
        if !valid_slice_id(slice_id) {
            return Err(Error::BadSliceId(slice_id.to_string()));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .map_or_else(|| "ledger".into(), |n| n.to_string_lossy().into_owned());
        let tmp = dir.join(format!(
            ".{name}.{}.{}.tmp",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        let result = (|| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o666)
                .open(&tmp)
                .map_err(io_err(&tmp))?;
            map::fchmod(&file, 0o666).map_err(io_err(&tmp))?;
            file.set_len(FILE_SIZE as u64).map_err(io_err(&tmp))?;
            let mut map = Mapping::file(&file, FILE_SIZE, true).map_err(io_err(&tmp))?;
            Self::init(&mut map, slice_id, devices)?;
            if replace {
                fs::rename(&tmp, path).map_err(io_err(path))?;
            } else {
                match fs::hard_link(&tmp, path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        // Lost the race: use the winner's file.
                        drop(map);
                        return Self::open(path);
                    }
                    Err(e) => return Err(io_err(path)(e)),
                }
            }
            Ok(Ledger {
                map,
                path: Some(path.to_path_buf()),
                device_count: devices.len(),
                version: VERSION,
                pinned: None,
            })
        })();
        let _ = fs::remove_file(&tmp);
        result
    }

    fn init(map: &mut Mapping, slice_id: &str, devices: &[DeviceSpec]) -> Result<()> {
        if devices.len() > MAX_DEVICES {
            return Err(Error::TooManyDevices(devices.len()));
        }
        if !valid_slice_id(slice_id) {
            return Err(Error::BadSliceId(slice_id.to_string()));
        }
        map.write_bytes(0, &MAGIC);
        let u32s = [
            (H_VERSION, VERSION),
            (H_HEADER_SIZE, HEADER_SIZE as u32),
            (H_DEVICE_COUNT, devices.len() as u32),
            (H_MAX_DEVICES, MAX_DEVICES as u32),
            (H_MAX_SLOTS, MAX_SLOTS as u32),
            (H_SLOT_SIZE, SLOT_SIZE as u32),
            (H_DEVICE_SIZE, DEVICE_SIZE as u32),
            (H_CREATOR_PID, std::process::id()),
        ];
        for (off, v) in u32s {
            map.u32_at(off).store(v, Ordering::Relaxed);
        }
        map.u64_at(H_FILE_SIZE)
            .store(FILE_SIZE as u64, Ordering::Relaxed);
        map.u64_at(H_CREATED_MS).store(now_ms(), Ordering::Relaxed);
        map.write_bytes(H_SLICE_ID, slice_id.as_bytes());
        for (i, d) in devices.iter().enumerate() {
            let base = DEVICES_OFF + i * DEVICE_SIZE;
            map.u64_at(base + D_CAP).store(d.cap, Ordering::Relaxed);
            let uuid = d.uuid.as_bytes();
            map.write_bytes(base + D_UUID, &uuid[..uuid.len().min(UUID_LEN - 1)]);
        }
        map.u32_at(H_STATE).store(READY, Ordering::Release);
        Ok(())
    }

    /// Opens an existing ledger for a reader outside its slice (root's
    /// `gpuslice slices`, the exporter, a launcher reaping stale ledgers),
    /// read-write when permitted (else read-only: readable, but
    /// [`Ledger::attach`] and [`Ledger::reap`] fail). Guarded: a slice that
    /// truncates its file under this mapping leaves the reader a zeroed
    /// private copy ([`Ledger::lost`]), not a SIGBUS death.
    pub fn open(path: &Path) -> Result<Ledger> {
        Self::open_mapped(path, true)
    }

    /// Opens the slice's own ledger in one of its processes (the shim), as
    /// [`Ledger::open`] but without a reader's guards: the path is opened
    /// as given (the slice's fixed place, or its own), and a process whose
    /// ledger is truncated under it dies of SIGBUS, because a private copy
    /// would free it from the cap the slice's processes share (the slice
    /// fails closed, and only it could have done that).
    pub fn open_in_slice(path: &Path) -> Result<Ledger> {
        Self::open_mapped(path, false)
    }

    /// Whether the file was truncated under a guarded ledger (which reads
    /// as zeros since: nothing it says can be judged).
    pub fn lost(&self) -> bool {
        self.map.lost()
    }

    /// `outside`: for a reader outside the slice ([`Ledger::open`]), which
    /// opens nothing planted and maps the file guarded.
    fn open_mapped(path: &Path, outside: bool) -> Result<Ledger> {
        // Root's readers list a directory others may write: a link planted
        // there would have root open (and map) whatever it names.
        let planted = if outside {
            Some(planted::regular_file_handle(path).map_err(io_err(path))?)
        } else {
            None
        };
        let at = planted
            .as_ref()
            .map_or_else(|| path.to_path_buf(), planted::fd_path);
        let (file, writable) = match OpenOptions::new().read(true).write(true).open(&at) {
            Ok(f) => (f, true),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EROFS)) => {
                (File::open(&at).map_err(io_err(path))?, false)
            }
            Err(e) => return Err(io_err(path)(e)),
        };
        let size = file.metadata().map_err(io_err(path))?.len();
        let corrupt = |reason: String| Error::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        if size < MAGIC.len() as u64 {
            return Err(if size == 0 {
                corrupt("empty file".into())
            } else {
                Error::Foreign {
                    path: path.to_path_buf(),
                }
            });
        }
        // Map what is there (bounded) to inspect the header safely.
        let map_len = size.min(FILE_SIZE as u64 * 4) as usize;
        let map = if outside {
            Mapping::file_guarded(&file, map_len, writable)
        } else {
            Mapping::file(&file, map_len, writable)
        }
        .map_err(io_err(path))?;
        if map.bytes(0, MAGIC.len()) != MAGIC {
            return Err(Error::Foreign {
                path: path.to_path_buf(),
            });
        }
        if map.len() < HEADER_SIZE {
            return Err(corrupt(format!("{size} bytes, shorter than the header")));
        }
        let version = map.u32_at(H_VERSION).load(Ordering::Acquire);
        if version != VERSION && version != VERSION_1 {
            return Err(Error::Version {
                path: path.to_path_buf(),
                found: version,
            });
        }
        let geometry = [
            ("header size", H_HEADER_SIZE, HEADER_SIZE),
            ("max devices", H_MAX_DEVICES, MAX_DEVICES),
            ("max slots", H_MAX_SLOTS, MAX_SLOTS),
            ("slot size", H_SLOT_SIZE, SLOT_SIZE),
            ("device size", H_DEVICE_SIZE, DEVICE_SIZE),
        ];
        for (what, off, want) in geometry {
            let got = map.u32_at(off).load(Ordering::Relaxed) as usize;
            if got != want {
                return Err(corrupt(format!(
                    "{what} is {got}, version {version} has {want}"
                )));
            }
        }
        let want = if version == VERSION_1 {
            FILE_SIZE_V1
        } else {
            FILE_SIZE
        };
        let recorded = map.u64_at(H_FILE_SIZE).load(Ordering::Relaxed);
        if recorded != want as u64 || size != want as u64 {
            return Err(corrupt(format!(
                "file is {size} bytes, header says {recorded}, version {version} has {want}"
            )));
        }
        if map.u32_at(H_STATE).load(Ordering::Acquire) != READY {
            return Err(corrupt("header not marked complete".into()));
        }
        let device_count = map.u32_at(H_DEVICE_COUNT).load(Ordering::Relaxed) as usize;
        if device_count > MAX_DEVICES {
            return Err(corrupt(format!(
                "{device_count} devices (max {MAX_DEVICES})"
            )));
        }
        Ok(Ledger {
            map,
            path: Some(path.to_path_buf()),
            device_count,
            version,
            pinned: None,
        })
    }

    /// Takes caps and shares from the slice's limits record from now on:
    /// [`Ledger::cap`], [`Ledger::reserve`], [`Ledger::compute_share`]
    /// and the bucket's refill read these, never the file's words (which
    /// every process of the slice may write). The burst is bounded by
    /// [`DEFAULT_BURST_NS`] whatever the file says.
    pub fn pin(&mut self, limits: &limits::SliceLimits) -> Result<()> {
        if limits.devices.len() != self.device_count {
            return Err(Error::Corrupt {
                path: self.path.clone().unwrap_or_default(),
                reason: format!(
                    "{} devices, the slice's limits record has {}",
                    self.device_count,
                    limits.devices.len()
                ),
            });
        }
        let mut p = Pinned {
            slice_id: limits.slice_id.clone(),
            uuids: limits.devices.iter().map(|d| d.uuid.clone()).collect(),
            caps: [UNLIMITED; MAX_DEVICES],
            shares: [const { AtomicU64::new(0) }; MAX_DEVICES],
        };
        for (i, d) in limits.devices.iter().enumerate() {
            p.caps[i] = d.cap_bytes();
            p.shares[i] = AtomicU64::new(d.share_bp());
        }
        self.pinned = Some(Box::new(p));
        Ok(())
    }

    /// Takes the shares of a re-read limits record (root changed a live
    /// slice's share); the caps stay as pinned. Ignored unless pinned and
    /// of the same devices.
    pub fn repin_shares(&self, limits: &limits::SliceLimits) {
        if let Some(p) = &self.pinned {
            if limits.devices.len() == self.device_count {
                for (i, d) in limits.devices.iter().enumerate() {
                    p.shares[i].store(d.share_bp(), Ordering::Relaxed);
                }
            }
        }
    }

    /// Whether caps and shares come from a limits record ([`Ledger::pin`]).
    pub fn pinned(&self) -> bool {
        self.pinned.is_some()
    }

    /// Counts a process of the slice that could not attach (shown by
    /// `gpuslice slices`; that process's CUDA initialisation failed).
    pub fn note_attach_failure(&self) {
        if self.writable() {
            self.map
                .u64_at(H_ATTACH_FAILURES)
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Layout version of the file ([`VERSION_1`] or [`VERSION`]).
    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn writable(&self) -> bool {
        self.map.writable()
    }

    /// The slice's name: its limits record's when pinned, else the file's.
    pub fn slice_id(&self) -> String {
        match &self.pinned {
            Some(p) => p.slice_id.clone(),
            None => str_field(self.map.bytes(H_SLICE_ID, MAX_ID_LEN + 1)),
        }
    }

    pub fn device_count(&self) -> usize {
        self.device_count
    }

    fn dev(&self, dev: usize, field: usize) -> &AtomicU64 {
        self.map.u64_at(DEVICES_OFF + dev * DEVICE_SIZE + field)
    }

    fn slot_word(&self, slot: usize, field: usize) -> &AtomicU64 {
        self.map.u64_at(SLOTS_OFF + slot * SLOT_SIZE + field)
    }

    fn slot_bytes_word(&self, slot: usize, dev: usize) -> &AtomicU64 {
        self.slot_word(slot, S_BYTES + dev * 8)
    }

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
    fn foreign_pids(&self, pidns: u64, among: Option<&[u32]>) -> procfs::ForeignPids {
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

    // ------------------------------------------------------------ compute
    //
    // One token bucket of GPU time per device, shared by every process of
    // the slice: refilled at `share` of wall time (CLOCK_MONOTONIC, which
    // all processes of a host share) up to `burst`, drawn from by the GPU
    // time of the slice's launches. Tokens may go negative (work measured
    // after it ran); launches wait while they are not positive.

    fn cword(&self, dev: usize, field: usize) -> &AtomicU64 {
        self.map.u64_at(COMPUTE_OFF + dev * COMPUTE_SIZE + field)
    }

    /// The order of the slice's processes waiting for `dev`'s turn
    /// ([`turn_order`]); None past [`MAX_DEVICES`].
    pub fn turn_order(&self, dev: usize) -> Option<turn_order::TurnOrder<'_>> {
        (dev < MAX_DEVICES).then(|| {
            let word = self.map.u32_at(turn_order::OFFSET + dev / 2 * 4);
            turn_order::TurnOrder::new(word, dev)
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
    /// at the slice's share when given (what the GPU's [`board`] shows of
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

#[cfg(test)]
mod tests;
