//! The mapped file: creating it atomically, opening and checking it, the
//! limits pinned from root's record, and the words of its header.

use crate::error::{io_err, Error, Result};
use crate::layout::*;
use crate::map::{self, Mapping};
use crate::{limits, planted, valid_slice_id};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// One device of a new ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The device's UUID as CUDA and NVML spell it (`GPU-…`, `MIG-…`); may
    /// be empty when unknown.
    pub uuid: String,
    /// Cap in bytes, or [`UNLIMITED`].
    pub cap: u64,
}

/// A mapped ledger.
pub struct Ledger {
    pub(crate) map: Mapping,
    pub(crate) path: Option<PathBuf>,
    pub(crate) device_count: usize,
    pub(crate) version: u32,
    /// Caps and shares from the slice's root-written limits record
    /// ([`limits`]): when set, they win over the file's words, which the
    /// slice itself can write.
    pub(crate) pinned: Option<Box<Pinned>>,
}

/// This process's copy of a slice's limits (see [`Ledger::pin`]).
pub(crate) struct Pinned {
    /// Root's name for the slice and its devices: what reports label it
    /// with and look for its cgroup by (the file's copies are the slice's
    /// to write, so a slice could rename itself out of its own report).
    pub(crate) slice_id: String,
    pub(crate) uuids: Vec<String>,
    pub(crate) caps: [u64; MAX_DEVICES],
    /// Root may change a live slice's shares ([`Ledger::repin_shares`]).
    pub(crate) shares: [AtomicU64; MAX_DEVICES],
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
    /// [`DEFAULT_BURST_NS`](crate::DEFAULT_BURST_NS) whatever the file says.
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

    pub(crate) fn dev(&self, dev: usize, field: usize) -> &AtomicU64 {
        self.map.u64_at(DEVICES_OFF + dev * DEVICE_SIZE + field)
    }

    pub(crate) fn slot_word(&self, slot: usize, field: usize) -> &AtomicU64 {
        self.map.u64_at(SLOTS_OFF + slot * SLOT_SIZE + field)
    }

    pub(crate) fn slot_bytes_word(&self, slot: usize, dev: usize) -> &AtomicU64 {
        self.slot_word(slot, S_BYTES + dev * 8)
    }
}
