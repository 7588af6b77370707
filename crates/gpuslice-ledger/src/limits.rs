//! The slice contract: what a slice may use (memory cap and compute share
//! per device, compute mode), in one unit each, where its records are, and
//! how they are written and verified. The CLI, the device plugin, the CDI
//! generator and the shim all go through this module.
//!
//! # Records of a slice
//! Root (the launcher, the device plugin) writes a slice's limits into a
//! **limits record** the slice can only read, and creates its **usage
//! ledger** ([`crate::Ledger`]), which the slice's processes write:
//!
//! | host | inside the slice ([`SLICE_DIR`]) | owner, mode | slice sees it |
//! |---|---|---|---|
//! | `<ledger dir>/<id>/` | — | root, 0700 | not at all (masked) |
//! | `<ledger dir>/<id>/limits` | `limits` | root, 0644 | read-only bind mount |
//! | `<ledger dir>/<id>/usage` | `usage` | root, 0666 | read-write bind mount of that one file |
//! | `<ledger dir>/<id>/hostpid` | `hostpid` | root, 0666 socket | the launcher's host-pid resolver ([`crate::hostpid`]), bound in read-only |
//!
//! The usage file's mode lets any user of the slice (after `su nobody`)
//! join it; it is reachable only through the slice's own mount and by host
//! root, as its directory is 0700 and every other slice sees the ledger
//! directory masked. Caps and shares are taken from the limits record
//! alone: words of the usage ledger that repeat them are for display.
//!
//! # Units
//! Memory: bytes ([`MemorySize`], parsed from `20GiB`, `512MiB`, `1.5GB`,
//! bytes). Compute: a share of the GPU's time in basis points
//! ([`ComputeShare`], parsed from and shown as a percentage, `25`, `12.5`).

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::{FULL_SHARE, MAX_DEVICES, UNLIMITED};

/// The slice's records as its processes see them: a fixed place, mounted
/// by the launcher (and the device plugin / CDI spec), so the shim finds
/// its slice whatever the environment.
pub const SLICE_DIR: &str = "/run/gpuslice/slice";
/// The limits record's name in a slice directory.
pub const LIMITS_FILE: &str = "limits";
/// The usage ledger's name in a slice directory.
pub const USAGE_FILE: &str = "usage";
/// The shim's name in [`SLICE_DIR`] (what the slice's `/etc/ld.so.preload` names).
pub const SHIM_FILE: &str = "libgpuslice.so";
/// The host-pid resolver's name in a slice directory: a unix socket the
/// launcher serves, answering each connection with the connector's pid in
/// the host's PID namespace (see [`crate::hostpid`]).
pub const HOSTPID_FILE: &str = "hostpid";
/// Root's enforcer's kills of a slice, one line each, in its root-only
/// records directory on the host (beside the limits record).
pub const ENFORCEMENT_FILE: &str = "enforcement";
/// A slice directory elsewhere than [`SLICE_DIR`], for slices without a
/// mount namespace of their own (`run` as non-root). Read only when
/// [`SLICE_DIR`] holds no limits record.
pub const SLICE_DIR_ENV: &str = "GPUSLICE_SLICE_DIR";

/// Environment variables of the self-imposed (environment-only) mode and
/// of what `run` tells the child.
pub const ENV_MEMORY: &str = "GPUSLICE_MEMORY_LIMIT";
pub const ENV_COMPUTE: &str = "GPUSLICE_COMPUTE_LIMIT";
pub const ENV_MODE: &str = "GPUSLICE_COMPUTE_MODE";
pub const ENV_SLICE: &str = "GPUSLICE_SLICE";
/// The slice's usage ledger, for a slice without [`SLICE_DIR`] (`run` as
/// non-root): the shim maps this file.
pub const ENV_LEDGER: &str = "GPUSLICE_LEDGER";

/// The devices CUDA numbers, in the order of [`ENV_DEVICE_ORDER`].
pub const ENV_CUDA_VISIBLE: &str = "CUDA_VISIBLE_DEVICES";
/// How CUDA orders devices: [`PCI_BUS_ID`], as NVML and `/proc` do.
pub const ENV_DEVICE_ORDER: &str = "CUDA_DEVICE_ORDER";
pub const PCI_BUS_ID: &str = "PCI_BUS_ID";
/// The devices NVIDIA's container toolkit injects into a container.
pub const ENV_NVIDIA_VISIBLE: &str = "NVIDIA_VISIBLE_DEVICES";
/// [`ENV_NVIDIA_VISIBLE`]'s value for no device at all (`all` and an
/// empty value do not mean none to the toolkit).
pub const NO_DEVICES: &str = "void";

/// The variables of [`device_env`]: what a launcher removes from the
/// environment it inherits before it sets its slice's.
pub const DEVICE_ENV: [&str; 4] = [
    ENV_CUDA_VISIBLE,
    ENV_DEVICE_ORDER,
    ENV_NVIDIA_VISIBLE,
    ENV_SLICE,
];

/// The variables naming the devices a slice's processes may use
/// (`visible`: UUIDs or indices, comma-separated; empty for none), in PCI
/// bus order: the first three of [`DEVICE_ENV`]. A CDI spec of several
/// slices (a DRA claim's) names them all with these.
pub fn visibility_env(visible: &str) -> [(&'static str, String); 3] {
    let nvidia_visible = if visible.is_empty() {
        NO_DEVICES
    } else {
        visible
    };
    [
        (ENV_CUDA_VISIBLE, visible.to_string()),
        (ENV_DEVICE_ORDER, PCI_BUS_ID.to_string()),
        (ENV_NVIDIA_VISIBLE, nvidia_visible.to_string()),
    ]
}

/// The device environment of a slice's processes without limits (`run`'s
/// command, a device plugin's whole GPU): [`visibility_env`] and the
/// slice's id, in the order of [`DEVICE_ENV`]. A capped slice's is
/// [`SliceLimits::child_env`].
pub fn device_env(visible: &str, slice_id: &str) -> [(&'static str, String); 4] {
    let [cuda, order, nvidia] = visibility_env(visible);
    [cuda, order, nvidia, (ENV_SLICE, slice_id.to_string())]
}

/// Largest slice id: what a ledger's header stores, and short enough for a
/// cgroup's and a directory's name.
pub const MAX_SLICE_ID_LEN: usize = 63;

/// Whether `id` may name a slice: its cgroup (`<root>/gpuslice/<id>`), its
/// records' directory (`<ledger dir>/<id>/`) and its ledger's header. 1 to
/// [`MAX_SLICE_ID_LEN`] of `A-Z a-z 0-9 . _ -`, not starting with `.` (no
/// `.`, `..` or hidden name among the slices).
pub fn valid_slice_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_SLICE_ID_LEN
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The pid of the launcher of a `run` slice, which its id starts with
/// (`<pid>-<suffix>`, one dash, as `gpuslice_isolate::cgroup::new_slice_id`
/// makes it); None for ids of another form (a DRA claim's `<uid>-<n>`,
/// whose UUID has dashes of its own and may begin with digits, a device
/// plugin's).
pub fn launcher_pid(slice_id: &str) -> Option<u32> {
    let (pid, suffix) = slice_id.split_once('-')?;
    let decimal = !pid.starts_with('0') && pid.bytes().all(|b| b.is_ascii_digit());
    if !decimal || suffix.is_empty() || suffix.contains('-') {
        return None;
    }
    pid.parse().ok()
}

const HEADER: &str = "gpuslice-limits 1";

#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    #[error("{0:?} is not a size (e.g. 20GiB, 512MiB, 1.5GB, or bytes)")]
    BadSize(String),
    #[error("{0:?} is not a percentage in (0, 100] (e.g. 25 or 12.5)")]
    BadShare(String),
    #[error("{0:?} is not a compute mode (cap or guaranteed)")]
    BadMode(String),
    #[error("limits record {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("limits record {path}: line {line}: {what}")]
    Syntax {
        path: PathBuf,
        line: usize,
        what: String,
    },
    #[error(
        "limits record {path} is not trustworthy: {why} (it must be owned by root, \
         writable by root alone{ro})",
        ro = if *.need_ro { ", on a read-only mount" } else { "" }
    )]
    Untrusted {
        path: PathBuf,
        why: String,
        need_ro: bool,
    },
}

/// A memory cap in bytes (never 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MemorySize(pub u64);

impl MemorySize {
    /// A cap of `bytes`, when not 0.
    pub fn from_bytes(bytes: u64) -> Option<MemorySize> {
        (bytes > 0).then_some(MemorySize(bytes))
    }
}

impl FromStr for MemorySize {
    type Err = LimitsError;
    fn from_str(s: &str) -> Result<Self, LimitsError> {
        crate::parse_size(s)
            .filter(|&b| b > 0)
            .map(MemorySize)
            .ok_or_else(|| LimitsError::BadSize(s.to_string()))
    }
}

impl fmt::Display for MemorySize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A compute share in basis points of the GPU's time, 1..=10 000.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ComputeShare(u64);

impl ComputeShare {
    /// The share of `bp` basis points, when in 1..=10 000.
    pub fn from_basis_points(bp: u64) -> Option<ComputeShare> {
        (1..=FULL_SHARE).contains(&bp).then_some(ComputeShare(bp))
    }

    /// The share of `percent` whole percent, when in 1..=100 (a DRA
    /// claim's consumed `compute` capacity).
    pub fn from_whole_percent(percent: u64) -> Option<ComputeShare> {
        (1..=100)
            .contains(&percent)
            .then(|| ComputeShare(percent * 100))
    }

    /// `count` parts of `of` (a GPU shared by `of` replicas), at least 1 bp.
    pub fn fraction(count: u64, of: u64) -> ComputeShare {
        let bp = (FULL_SHARE * count / of.max(1)).clamp(1, FULL_SHARE);
        ComputeShare(bp)
    }

    pub fn basis_points(self) -> u64 {
        self.0
    }

    pub fn percent(self) -> f64 {
        self.0 as f64 / 100.0
    }
}

impl FromStr for ComputeShare {
    type Err = LimitsError;
    /// `25`, `12.5`, `50%`.
    fn from_str(s: &str) -> Result<Self, LimitsError> {
        let bad = || LimitsError::BadShare(s.to_string());
        let v: f64 = s
            .trim()
            .trim_end_matches('%')
            .trim()
            .parse()
            .map_err(|_| bad())?;
        if !(v > 0.0 && v <= 100.0) {
            return Err(bad());
        }
        Ok(ComputeShare(((v * 100.0).round() as u64).max(1)))
    }
}

impl fmt::Display for ComputeShare {
    /// As a percentage, the unit it is parsed from (`25`, `12.5`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.percent())
    }
}

/// How a slice's share is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Never more than the share.
    Cap = 0,
    /// At least the share when busy; more when the GPU has idle time.
    Guaranteed = 1,
}

impl FromStr for Mode {
    type Err = LimitsError;
    fn from_str(s: &str) -> Result<Self, LimitsError> {
        match s.trim() {
            "cap" => Ok(Mode::Cap),
            "guaranteed" => Ok(Mode::Guaranteed),
            other => Err(LimitsError::BadMode(other.to_string())),
        }
    }
}

/// `cap`: what a slice gets unless it asks for more (the device plugin's
/// `computeMode` and `run --compute-mode` default to it).
impl Default for Mode {
    fn default() -> Self {
        Mode::Cap
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Cap => "cap",
            Mode::Guaranteed => "guaranteed",
        })
    }
}

/// The limits of one device of a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLimits {
    /// As CUDA and NVML spell it (`GPU-…`, `MIG-…`).
    pub uuid: String,
    pub memory: Option<MemorySize>,
    pub compute: Option<ComputeShare>,
}

impl DeviceLimits {
    /// Cap in the ledger's unit ([`UNLIMITED`] for none).
    pub fn cap_bytes(&self) -> u64 {
        self.memory.map_or(UNLIMITED, |m| m.0)
    }

    /// Share in the ledger's unit (0 for none).
    pub fn share_bp(&self) -> u64 {
        self.compute.map_or(0, ComputeShare::basis_points)
    }
}

/// What a share of a GPU may use before it is bound to a device (a DRA
/// claim's consumed capacity): a memory cap, and a compute share or none
/// (best effort). [`DeviceCaps::on`] gives the device's [`DeviceLimits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCaps {
    pub memory: MemorySize,
    pub compute: Option<ComputeShare>,
}

impl DeviceCaps {
    pub fn memory_bytes(self) -> u64 {
        self.memory.0
    }

    /// The compute share in whole percent (DRA's unit), 0 for none.
    pub fn compute_percent(self) -> u32 {
        self.compute.map_or(0, |c| (c.basis_points() / 100) as u32)
    }

    /// For people: `<n> MiB, <p> %`, or `<n> MiB, best-effort compute`.
    pub fn describe(self) -> String {
        match self.compute {
            None => format!("{} MiB, best-effort compute", self.memory_bytes() >> 20),
            Some(c) => format!("{} MiB, {c} %", self.memory_bytes() >> 20),
        }
    }

    /// The limits of the device `uuid` under these caps.
    pub fn on(self, uuid: &str) -> DeviceLimits {
        DeviceLimits {
            uuid: uuid.to_string(),
            memory: Some(self.memory),
            compute: self.compute,
        }
    }
}

/// Everything a slice may use, per device in `CUDA_VISIBLE_DEVICES` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceLimits {
    pub slice_id: String,
    pub mode: Mode,
    pub devices: Vec<DeviceLimits>,
}

impl SliceLimits {
    /// (uuid, cap bytes) of each device with a memory cap.
    pub fn memory_caps(&self) -> Vec<(String, u64)> {
        self.devices
            .iter()
            .filter_map(|d| Some((d.uuid.clone(), d.memory?.0)))
            .collect()
    }

    /// [`SliceLimits::memory_caps`] of the whole GPUs: what the driver's
    /// memory partitions can hold (they do not apply to MIG devices).
    pub fn partition_caps(&self) -> Vec<(String, u64)> {
        let mut caps = self.memory_caps();
        caps.retain(|(uuid, _)| !uuid.starts_with("MIG-"));
        caps
    }

    /// The devices' UUIDs.
    pub fn uuids(&self) -> Vec<String> {
        self.devices.iter().map(|d| d.uuid.clone()).collect()
    }

    /// Whether any device has a cap or a share (the shim has work to do).
    pub fn limited(&self) -> bool {
        self.devices
            .iter()
            .any(|d| d.memory.is_some() || d.compute.is_some())
    }

    /// The usage ledger's devices.
    pub fn ledger_devices(&self) -> Vec<crate::DeviceSpec> {
        self.devices
            .iter()
            .map(|d| crate::DeviceSpec {
                uuid: d.uuid.clone(),
                cap: d.cap_bytes(),
            })
            .collect()
    }

    /// The variables the self-imposed mode reads (what a container gets
    /// when no limits record is mounted, and what `slices` shows): the
    /// slice's id and its limits, one unit each: bytes, and a percentage.
    pub fn limit_env(&self) -> Vec<(String, String)> {
        let mut env = vec![(ENV_SLICE.to_string(), self.slice_id.clone())];
        for (i, d) in self.devices.iter().enumerate() {
            if let Some(m) = d.memory {
                env.push((format!("{ENV_MEMORY}_{i}"), m.to_string()));
            }
        }
        // The shim's variable is one share for every visible device.
        if let Some(c) = self.devices.iter().filter_map(|d| d.compute).min() {
            env.push((ENV_COMPUTE.to_string(), c.to_string()));
            env.push((ENV_MODE.to_string(), self.mode.to_string()));
        }
        env
    }

    /// The whole environment of the slice's processes, the one every
    /// launcher of a capped slice gives (a device plugin's replica, a CDI
    /// shared variant): what [`device_env`] gives for `visible` and the
    /// slice's id, then the limits' variables — [`visibility_env`]
    /// followed by [`Self::limit_env`], which starts with the slice's id.
    pub fn child_env(&self, visible: &str) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = visibility_env(visible)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        env.extend(self.limit_env());
        env
    }

    /// The record's text.
    pub fn render(&self) -> String {
        let mut s = format!("{HEADER}\nslice {}\nmode {}\n", self.slice_id, self.mode);
        for d in &self.devices {
            let memory = d.memory.map_or("unlimited".into(), |m| m.to_string());
            let compute = d.compute.map_or(0, ComputeShare::basis_points);
            s.push_str(&format!(
                "device {} memory {memory} compute_bp {compute}\n",
                if d.uuid.is_empty() { "-" } else { &d.uuid }
            ));
        }
        s
    }

    /// Parses a record's text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<SliceLimits, LimitsError> {
        let bad = |line: usize, what: String| LimitsError::Syntax {
            path: path.to_path_buf(),
            line,
            what,
        };
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        match lines.next() {
            Some((_, HEADER)) => {}
            _ => return Err(bad(1, format!("does not start with {HEADER:?}"))),
        }
        let mut limits = SliceLimits {
            slice_id: String::new(),
            mode: Mode::Cap,
            devices: Vec::new(),
        };
        for (n, line) in lines {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [] => {}
                ["slice", id] if crate::valid_slice_id(id) => limits.slice_id = id.to_string(),
                ["mode", m] => limits.mode = m.parse().map_err(|e| bad(n, format!("{e}")))?,
                ["device", uuid, "memory", mem, "compute_bp", bp] => {
                    if limits.devices.len() == MAX_DEVICES {
                        return Err(bad(n, format!("more than {MAX_DEVICES} devices")));
                    }
                    let memory = match *mem {
                        "unlimited" => None,
                        m => Some(
                            m.parse::<u64>()
                                .ok()
                                .filter(|&b| b > 0)
                                .map(MemorySize)
                                .ok_or_else(|| {
                                    bad(n, format!("memory {m:?} is not a number of bytes"))
                                })?,
                        ),
                    };
                    let compute = match bp.parse::<u64>() {
                        Ok(0) => None,
                        Ok(v) => Some(ComputeShare::from_basis_points(v).ok_or_else(|| {
                            bad(n, format!("compute_bp {v} is not in 1..={FULL_SHARE}"))
                        })?),
                        Err(_) => return Err(bad(n, format!("compute_bp {bp:?} is not a number"))),
                    };
                    limits.devices.push(DeviceLimits {
                        uuid: if *uuid == "-" {
                            String::new()
                        } else {
                            uuid.to_string()
                        },
                        memory,
                        compute,
                    });
                }
                _ => return Err(bad(n, format!("unknown line {line:?}"))),
            }
        }
        if limits.slice_id.is_empty() {
            return Err(bad(0, "no valid `slice` line".into()));
        }
        Ok(limits)
    }

    /// Writes the slice's records under `host_dir` (`<ledger dir>/<id>`):
    /// the directory root-only, the limits record read-only for all, the
    /// usage ledger for the slice to write. Replaces nothing: a directory
    /// that exists is an error (slice ids are unique).
    pub fn write_records(&self, host_dir: &Path) -> Result<RecordPaths, crate::Error> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| crate::Error::Io { path, source }
        };
        fs::DirBuilder::new()
            .mode(0o700)
            .create(host_dir)
            .map_err(io(host_dir))?;
        self.write_records_in(host_dir)
    }

    /// Makes the slice's usage ledger at `usage` (mode 0666: the slice's
    /// processes run as any user), matching this record: its devices,
    /// caps and shares. Made by root before the slice starts, its file,
    /// and so the slice's key on the boards, is known to root, which can
    /// then vouch for the slice's shares there.
    pub fn create_usage(&self, usage: &Path) -> Result<(), crate::Error> {
        let ledger = crate::Ledger::create(usage, &self.slice_id, &self.ledger_devices())?;
        for (d, dev) in self.devices.iter().enumerate() {
            if let Some(c) = dev.compute {
                ledger.set_compute(d, c.basis_points(), crate::DEFAULT_BURST_NS)?;
            }
        }
        Ok(())
    }

    /// [`Self::write_records`] into `host_dir`, a directory the caller made
    /// root's and private (the device plugin's bounded tmpfs).
    pub fn write_records_in(&self, host_dir: &Path) -> Result<RecordPaths, crate::Error> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| crate::Error::Io { path, source }
        };
        let paths = RecordPaths::under(host_dir);
        let result = (|| {
            write_file_atomically(&paths.limits, self.render().as_bytes(), 0o644)
                .map_err(io(&paths.limits))?;
            self.create_usage(&paths.usage)
        })();
        if result.is_err() {
            paths.remove();
        }
        result.map(|()| paths)
    }
}

/// Where a slice's records are in one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordPaths {
    pub dir: PathBuf,
    pub limits: PathBuf,
    pub usage: PathBuf,
    /// The host-pid resolver's socket (made by the launcher, for slices it
    /// gives a mount namespace; absent otherwise).
    pub hostpid: PathBuf,
}

impl RecordPaths {
    pub fn under(dir: &Path) -> RecordPaths {
        RecordPaths {
            dir: dir.to_path_buf(),
            limits: dir.join(LIMITS_FILE),
            usage: dir.join(USAGE_FILE),
            hostpid: dir.join(HOSTPID_FILE),
        }
    }

    /// The records as the slice sees them.
    pub fn in_slice() -> RecordPaths {
        Self::under(Path::new(SLICE_DIR))
    }

    /// Removes the records and their directory (best effort: at exit).
    pub fn remove(&self) {
        let _ = fs::remove_file(&self.limits);
        let _ = fs::remove_file(&self.usage);
        let _ = fs::remove_file(&self.hostpid);
        let _ = fs::remove_file(self.dir.join(ENFORCEMENT_FILE));
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Not `gpuslice_core::atomic_file` (the product crates' one writer), for
/// two reasons: this crate is linked into the shim and depends on nothing
/// but libc, and a record lives only as long as its slice, in the slice's
/// directory that root made for it (no sync: after a crash the slice is
/// gone too; `create_new` refuses a planted `.tmp`).
fn write_file_atomically(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.set_permissions(fs::Permissions::from_mode(mode))?;
    f.write_all(data)?;
    drop(f);
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Where the shim found its slice, if anywhere.
#[derive(Debug)]
pub enum Located {
    /// A limits record (verified), and the usage ledger beside it.
    Slice {
        limits: SliceLimits,
        paths: RecordPaths,
    },
    /// A record is there but cannot be trusted or read: the slice is
    /// capped and must fail closed.
    Broken(LimitsError),
    /// No record: the environment's limits, if any, are self-imposed.
    None,
}

/// Finds the slice's records: [`SLICE_DIR`] first (then it must be on a
/// read-only mount), else the directory `env_dir` names (a slice without a
/// mount namespace; root-owned still required).
pub fn locate(env_dir: Option<&str>) -> Located {
    let fixed = RecordPaths::in_slice();
    if fixed.limits.symlink_metadata().is_ok() {
        return read_verified(&fixed, true);
    }
    match env_dir.filter(|d| !d.is_empty()) {
        Some(d) => {
            let paths = RecordPaths::under(Path::new(d));
            if paths.limits.symlink_metadata().is_ok() {
                read_verified(&paths, false)
            } else {
                Located::None
            }
        }
        None => Located::None,
    }
}

fn read_verified(paths: &RecordPaths, need_ro: bool) -> Located {
    match verify_and_read(&paths.limits, need_ro) {
        Ok(limits) => Located::Slice {
            limits,
            paths: paths.clone(),
        },
        Err(e) => Located::Broken(e),
    }
}

/// Reads a limits record after checking it is root's: a regular file
/// owned by uid 0, not writable by group or others, and (`need_ro`) on a
/// read-only mount, so that not even root in the slice can change it.
pub fn verify_and_read(path: &Path, need_ro: bool) -> Result<SliceLimits, LimitsError> {
    let untrusted = |why: String| LimitsError::Untrusted {
        path: path.to_path_buf(),
        why,
        need_ro,
    };
    let io = |source| LimitsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(untrusted("not a regular file".into()));
    }
    if meta.uid() != 0 {
        return Err(untrusted(format!("owned by uid {}", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(untrusted(format!("mode {:o}", meta.mode() & 0o7777)));
    }
    if need_ro && !crate::map::read_only_mount(&file).map_err(io)? {
        return Err(untrusted("its mount is writable".into()));
    }
    let text = io::read_to_string(file).map_err(io)?;
    SliceLimits::parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SliceLimits {
        SliceLimits {
            slice_id: "s-1".into(),
            mode: Mode::Guaranteed,
            devices: vec![
                DeviceLimits {
                    uuid: "GPU-a".into(),
                    memory: Some(MemorySize(20 << 30)),
                    compute: Some("12.5".parse().unwrap()),
                },
                DeviceLimits {
                    uuid: String::new(),
                    memory: None,
                    compute: None,
                },
            ],
        }
    }

    #[test]
    fn units_parse_once_and_show_the_same_way() {
        assert_eq!("20GiB".parse::<MemorySize>().unwrap(), MemorySize(20 << 30));
        assert!("0".parse::<MemorySize>().is_err());
        let e = "lots".parse::<MemorySize>().unwrap_err().to_string();
        assert!(e.contains("\"lots\" is not a size (e.g. 20GiB"), "{e}");
        let c: ComputeShare = "12.5%".parse().unwrap();
        assert_eq!((c.basis_points(), c.to_string()), (1250, "12.5".into()));
        assert_eq!("30".parse::<ComputeShare>().unwrap().to_string(), "30");
        for bad in ["0", "101", "-3", "x", "NaN"] {
            assert!(bad.parse::<ComputeShare>().is_err(), "{bad}");
        }
        assert_eq!(ComputeShare::fraction(1, 3).basis_points(), 3333);
        assert_eq!("guaranteed".parse::<Mode>().unwrap(), Mode::Guaranteed);
        assert!("fair".parse::<Mode>().is_err());
        assert_eq!(Mode::default(), Mode::Cap);
    }

    #[test]
    fn caps_take_only_what_the_units_allow() {
        assert_eq!(MemorySize::from_bytes(0), None);
        assert_eq!(MemorySize::from_bytes(1), Some(MemorySize(1)));
        for bad in [0, 101, 10_000] {
            assert_eq!(ComputeShare::from_whole_percent(bad), None, "{bad}");
        }
        let caps = DeviceCaps {
            memory: MemorySize(20 << 30),
            compute: ComputeShare::from_whole_percent(30),
        };
        assert_eq!(
            (caps.memory_bytes(), caps.compute_percent()),
            (20 << 30, 30)
        );
        assert_eq!(caps.describe(), "20480 MiB, 30 %");
        let on = caps.on("GPU-a");
        assert_eq!((on.cap_bytes(), on.share_bp()), (20 << 30, 3000));
        let best_effort = DeviceCaps {
            compute: None,
            ..caps
        };
        assert_eq!(best_effort.compute_percent(), 0);
        assert_eq!(best_effort.describe(), "20480 MiB, best-effort compute");
        assert_eq!(best_effort.on("GPU-a").share_bp(), 0);
    }

    /// One rule for every place a slice id names something: a cgroup, a
    /// directory, a ledger's header. What would climb out of the slices'
    /// directory, hide among them or not fit the header is refused.
    #[test]
    fn slice_ids_are_checked_once() {
        let longest = "a".repeat(MAX_SLICE_ID_LEN);
        for good in [
            "gs-1234.a_b",
            "4242-1f00a1",
            "k8s-GPU-a-r0",
            longest.as_str(),
        ] {
            assert!(valid_slice_id(good), "{good:?}");
        }
        let too_long = "a".repeat(MAX_SLICE_ID_LEN + 1);
        for bad in [
            "",
            "a/b",
            ".",
            "..",
            ".x",
            "a b",
            "x\0",
            "é",
            too_long.as_str(),
        ] {
            assert!(!valid_slice_id(bad), "{bad:?}");
        }
    }

    /// Only the form `run` makes names a launcher: a claim's UUID that
    /// begins with digits, or zeros, must not pass for one.
    #[test]
    fn a_run_slice_s_id_names_its_launcher_and_no_other_does() {
        assert_eq!(launcher_pid("1530-401f03e39a00"), Some(1530));
        for other in [
            "00001234-5678-4abc-8def-0123456789ab-0",
            "12345678-5678-4abc-8def-0123456789ab-0",
            "uid-a-0",
            "0-1f",
            "0042-1f",
            "42-",
            "42-a-b",
            "42",
            "k8s-GPU-a-r0",
        ] {
            assert_eq!(launcher_pid(other), None, "{other:?}");
        }
    }

    #[test]
    fn the_device_environment_is_one_set() {
        let env = device_env("GPU-a,GPU-b", "s-1");
        let names: Vec<&str> = env.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, DEVICE_ENV);
        assert_eq!(
            env.map(|(_, v)| v),
            ["GPU-a,GPU-b", "PCI_BUS_ID", "GPU-a,GPU-b", "s-1"].map(String::from)
        );
        // No device: the container toolkit must not read "all".
        let none = device_env("", "s-2");
        assert_eq!((none[0].1.as_str(), none[2].1.as_str()), ("", "void"));
    }

    /// A capped slice's processes get the device environment and the
    /// limits' variables, each once, the slice's id from the record.
    #[test]
    fn a_capped_slice_s_child_environment_is_the_device_one_and_its_limits() {
        let l = sample();
        let env = l.child_env("GPU-a");
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(&names[..4], DEVICE_ENV);
        assert_eq!(
            names[4..],
            [
                "GPUSLICE_MEMORY_LIMIT_0",
                "GPUSLICE_COMPUTE_LIMIT",
                "GPUSLICE_COMPUTE_MODE"
            ]
        );
        let value = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(value(ENV_CUDA_VISIBLE), Some("GPU-a"));
        assert_eq!(value(ENV_NVIDIA_VISIBLE), Some("GPU-a"));
        assert_eq!(value(ENV_SLICE), Some("s-1"));
        assert_eq!(value(ENV_MODE), Some("guaranteed"));
    }

    #[test]
    fn records_round_trip_and_bad_ones_say_where() {
        let l = sample();
        let text = l.render();
        assert_eq!(SliceLimits::parse(&text, Path::new("x")).unwrap(), l);
        let env = l.limit_env();
        assert!(env.contains(&("GPUSLICE_MEMORY_LIMIT_0".into(), (20u64 << 30).to_string())));
        assert!(env.contains(&("GPUSLICE_COMPUTE_LIMIT".into(), "12.5".into())));
        for (bad, want) in [
            ("nope\n", "line 1"),
            (
                "gpuslice-limits 1\nslice a\ndevice G memory 0 compute_bp 0\n",
                "line 3",
            ),
            (
                "gpuslice-limits 1\nslice a\ndevice G memory 1 compute_bp 10001\n",
                "10001",
            ),
            ("gpuslice-limits 1\nslice a\ncap 9\n", "unknown line"),
            ("gpuslice-limits 1\n", "no valid `slice`"),
        ] {
            let e = SliceLimits::parse(bad, Path::new("/r/limits"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("/r/limits") && e.contains(want), "{bad:?}: {e}");
        }
    }

    #[test]
    fn records_are_root_only_and_verified() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("s-1");
        let paths = sample().write_records(&host).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&host), 0o700);
        assert_eq!(mode(&paths.limits), 0o644);
        assert_eq!(mode(&paths.usage), 0o666);
        let ledger = crate::Ledger::open(&paths.usage).unwrap();
        assert_eq!(ledger.cap(0), 20 << 30);
        assert_eq!(ledger.compute_share(0), 1250);
        // A second slice of the same id: refused, the first left alone.
        assert!(sample().write_records(&host).is_err());
        assert!(paths.limits.exists());
        if nix_is_root() {
            assert_eq!(verify_and_read(&paths.limits, false).unwrap(), sample());
            // A tmpdir is not a read-only mount.
            let e = verify_and_read(&paths.limits, true)
                .unwrap_err()
                .to_string();
            assert!(e.contains("its mount is writable"), "{e}");
            fs::set_permissions(&paths.limits, fs::Permissions::from_mode(0o666)).unwrap();
            let e = verify_and_read(&paths.limits, false)
                .unwrap_err()
                .to_string();
            assert!(e.contains("mode 666"), "{e}");
            fs::set_permissions(&paths.limits, fs::Permissions::from_mode(0o644)).unwrap();
            std::os::unix::fs::chown(&paths.limits, Some(65534), None).unwrap();
            let e = verify_and_read(&paths.limits, false)
                .unwrap_err()
                .to_string();
            assert!(e.contains("owned by uid 65534"), "{e}");
        }
        paths.remove();
        assert!(!host.exists());
    }

    fn nix_is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }
}
