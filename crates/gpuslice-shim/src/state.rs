//! Process-wide state: configuration, the slice ledger, this process's
//! slot, and the reserve/release helpers the hooks share.
//!
//! Where the limits come from, in this order:
//! 1. the slice's root-written limits record at the fixed place
//!    ([`gpuslice_ledger::limits::SLICE_DIR`], a read-only mount the
//!    launcher / device plugin / CDI spec makes), else the directory
//!    `GPUSLICE_SLICE_DIR` names; the record is verified (root-owned,
//!    root-only writable, and at the fixed place on a read-only mount), and
//!    the usage ledger beside it is joined. Anything wrong with either
//!    *closes* the shim: `cuInit` fails with a message ([`closed`]); the
//!    environment's caps are never a fallback.
//! 2. no record: the environment's caps (self-imposed), as before.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use gpuslice_ledger::limits::{self, Located, SliceLimits};
use gpuslice_ledger::{DeviceSpec, Ledger, Slot, MAX_DEVICES, UNLIMITED};

use std::path::Path;

use crate::borrow::Boards;
use crate::config::{Config, NvmlMatch};
use crate::sys::log_line;

pub struct Shim {
    /// None: no cap or share anywhere; every hook passes straight through.
    pub ledger: Option<Ledger>,
    /// Some device has a memory cap.
    pub memory_active: bool,
    /// Some device has a compute share ([`Shim::compute`]).
    pub compute_active: bool,
    /// Compute share per device ordinal in basis points (0: none).
    pub compute: [u64; MAX_DEVICES],
    /// Seats on the GPUs' boards (work-conserving mode, or a capped slice
    /// on a GPU where others borrow); None: none.
    pub boards: Option<Boards>,
    /// Slices take turns on the GPU ([`crate::turns`]).
    pub handover: bool,
    pub caps: [u64; MAX_DEVICES],
    /// `GPUSLICE_CONTEXT_BYTES` (None: measured, see [`crate::resident`]).
    pub context_bytes: Option<u64>,
    pub log: bool,
    pub nvml: Vec<NvmlMatch>,
    /// The limits are root's (a verified limits record): a process that
    /// cannot join the ledger fails closed.
    pub recorded: bool,
    /// Why this process must not use CUDA (a capped slice whose records
    /// are unusable): `cuInit` fails with this.
    pub closed: Option<String>,
    /// The limits record, and whether it must be on a read-only mount
    /// (re-read for live share changes, [`refresh_shares`]).
    pub record: Option<(std::path::PathBuf, bool)>,
}

static SHIM: OnceLock<Shim> = OnceLock::new();

/// The configuration, read on first use (normally by the constructor).
#[inline]
pub fn shim() -> &'static Shim {
    match SHIM.get() {
        Some(s) => s,
        None => init(),
    }
}

/// The configuration if it was already read; never blocks (used by our
/// `dlsym`, which glibc or std may call while the configuration is read).
#[inline]
pub fn shim_if_ready() -> Option<&'static Shim> {
    SHIM.get()
}

#[cold]
pub fn init() -> &'static Shim {
    SHIM.get_or_init(|| Shim::new(Config::from_env()))
}

impl Shim {
    pub fn new(cfg: Config) -> Shim {
        match limits::locate(cfg.slice_dir.as_deref()) {
            Located::None => Self::self_imposed(cfg),
            Located::Slice { limits, paths } => match open_recorded(&limits, &paths.usage) {
                Ok(ledger) => {
                    let fixed = paths == limits::RecordPaths::in_slice();
                    let mut s = Self::recorded(cfg, limits, ledger);
                    s.record = Some((paths.limits, fixed));
                    s
                }
                Err(why) => Self::closed(cfg, why),
            },
            Located::Broken(e) => Self::closed(cfg, e.to_string()),
        }
    }

    /// A capped slice whose records cannot be used: nothing is passed
    /// through uncapped; CUDA initialisation fails.
    fn closed(cfg: Config, why: String) -> Shim {
        let why = format!("{why}; CUDA is refused in this slice (fails closed)");
        // Said by cuInit (every process of the slice loads the shim; most
        // never use CUDA).
        if cfg.log {
            log_line(&why);
        }
        Shim {
            ledger: None,
            memory_active: false,
            compute_active: false,
            compute: [0; MAX_DEVICES],
            boards: None,
            handover: false,
            caps: [UNLIMITED; MAX_DEVICES],
            context_bytes: cfg.context_bytes,
            log: cfg.log,
            nvml: cfg.nvml,
            recorded: true,
            closed: Some(why),
            record: None,
        }
    }

    /// Limits from root's record; the ledger pinned to them.
    fn recorded(cfg: Config, limits: SliceLimits, ledger: Ledger) -> Shim {
        let mut caps = [UNLIMITED; MAX_DEVICES];
        let mut compute = [0u64; MAX_DEVICES];
        for (i, d) in limits.devices.iter().enumerate() {
            caps[i] = d.cap_bytes();
            compute[i] = d.share_bp();
        }
        let compute_active = compute.iter().any(|&c| c != 0);
        let boards = compute_active
            .then(|| Boards::open(&ledger, &compute, limits.mode, Path::new(&cfg.board_dir)))
            .flatten();
        // NVML knows the devices by the record's UUIDs, whatever the
        // environment says.
        let nvml = limits
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| match d.uuid.is_empty() {
                true => cfg
                    .nvml
                    .get(i)
                    .cloned()
                    .unwrap_or(NvmlMatch::Index(i as u32)),
                false => NvmlMatch::Uuid(d.uuid.clone()),
            })
            .collect();
        if cfg.log {
            log_line(&format!(
                "pid {} slice {} (limits record, root's) caps [{}] compute [{}] mode {}",
                std::process::id(),
                limits.slice_id,
                shown_caps(&caps),
                shown_shares(&compute),
                limits.mode,
            ));
        }
        Self::limited(&cfg, Some(ledger), caps, compute, boards, nvml, true)
    }

    /// A shim that applies `caps` and `compute` (each active where a
    /// device has one), with the rest of its settings from `cfg`.
    fn limited(
        cfg: &Config,
        ledger: Option<Ledger>,
        caps: [u64; MAX_DEVICES],
        compute: [u64; MAX_DEVICES],
        boards: Option<Boards>,
        nvml: Vec<NvmlMatch>,
        recorded: bool,
    ) -> Shim {
        Shim {
            ledger,
            memory_active: caps.iter().any(|&c| c != UNLIMITED),
            compute_active: compute.iter().any(|&c| c != 0),
            compute,
            boards,
            handover: cfg.handover,
            caps,
            context_bytes: cfg.context_bytes,
            log: cfg.log,
            nvml,
            recorded,
            closed: None,
            record: None,
        }
    }

    /// No limits record: the environment's caps, self-imposed.
    fn self_imposed(mut cfg: Config) -> Shim {
        let log = cfg.log;
        for e in &cfg.errors {
            log_line(e);
        }
        let mut caps = [UNLIMITED; MAX_DEVICES];
        let ledger = open_ledger(&cfg);
        match &ledger {
            Some(l) => {
                for (d, cap) in caps.iter_mut().enumerate().take(l.device_count()) {
                    *cap = l.cap(d);
                }
            }
            None => caps[..cfg.caps.len()].copy_from_slice(&cfg.caps),
        }
        let mut compute = [0u64; MAX_DEVICES];
        if let Some(l) = &ledger {
            for (d, share) in compute.iter_mut().enumerate().take(l.device_count()) {
                let env = cfg.compute.get(d).copied().unwrap_or(0);
                if l.compute_share(d) == 0 && env > 0 {
                    // The ledger's share wins; the environment's fills in
                    // a ledger that has none (first writer wins).
                    if let Err(e) = l.set_compute(d, env, gpuslice_ledger::DEFAULT_BURST_NS) {
                        log_line(&format!("device {d}: compute share not set: {e}"));
                    }
                }
                *share = l.compute_share(d);
            }
        }
        let memory_active = caps.iter().any(|&c| c != UNLIMITED);
        let compute_active = compute.iter().any(|&c| c != 0);
        let ledger = ledger.filter(|_| memory_active || compute_active);
        let boards = ledger
            .as_ref()
            .filter(|_| compute_active)
            .and_then(|l| Boards::open(l, &compute, cfg.compute_mode, Path::new(&cfg.board_dir)));
        if log {
            let where_ = ledger.as_ref().map_or("none (no cap)".to_string(), |l| {
                l.path()
                    .map_or("private".into(), |p| p.display().to_string())
            });
            log_line(&format!(
                "pid {} ledger {where_} caps [{}] compute [{}] mode {:?}{}",
                std::process::id(),
                shown_caps(&caps),
                shown_shares(&compute),
                cfg.compute_mode,
                if boards.is_some() {
                    " (on the board)"
                } else {
                    ""
                }
            ));
        }
        let nvml = std::mem::take(&mut cfg.nvml);
        Self::limited(&cfg, ledger, caps, compute, boards, nvml, false)
    }

    /// Whether any hook has work to do (a ledger, or CUDA to refuse).
    pub fn active(&self) -> bool {
        self.ledger.is_some() || self.closed.is_some()
    }
}

fn shown_caps(caps: &[u64]) -> String {
    let v: Vec<String> = caps
        .iter()
        .take_while(|&&c| c != UNLIMITED)
        .map(|c| format!("{}MiB", c >> 20))
        .collect();
    v.join(",")
}

fn shown_shares(shares: &[u64]) -> String {
    let v: Vec<String> = shares
        .iter()
        .take_while(|&&c| c != 0)
        .map(|c| format!("{}%", *c as f64 / 100.0))
        .collect();
    v.join(",")
}

/// The usage ledger of a slice with a limits record: it must open
/// read-write (this process joins it), match the record, and is pinned to
/// it (caps and shares from the record, never from the file). Missing, it
/// is created (a CDI container's first process).
fn open_recorded(limits: &SliceLimits, usage: &Path) -> Result<Ledger, String> {
    // A CDI spec can mount the record but not make a ledger per container:
    // the first process makes it in the container's own (tmpfs) slice
    // directory. Everywhere else root made it.
    let mut ledger = match Ledger::open_in_slice(usage) {
        Err(gpuslice_ledger::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ledger::open_or_create(usage, &limits.slice_id, &limits.ledger_devices())
        }
        other => other,
    }
    .map_err(|e| e.to_string())?;
    if !ledger.writable() {
        return Err(format!(
            "the slice's usage ledger {} is read-only for this process (uid {})",
            usage.display(),
            // SAFETY: getuid has no preconditions.
            unsafe { libc::getuid() }
        ));
    }
    ledger.pin(limits).map_err(|e| e.to_string())?;
    Ok(ledger)
}

static RECORD_READ_NS: AtomicU64 = AtomicU64::new(0);
/// How often a live slice's limits record is re-read for share changes.
const RECORD_RECHECK_NS: u64 = 250_000_000;

/// Root may change a live slice's compute shares by rewriting its limits
/// record in place (the slice cannot: it is read-only there). Called by
/// the compute gate; re-reads and re-verifies the record at most every
/// [`RECORD_RECHECK_NS`] (one thread does; the others go on). Caps are
/// not changed live.
pub fn refresh_shares(now_ns: u64) {
    let s = shim();
    let (Some((path, need_ro)), Some(ledger)) = (&s.record, &s.ledger) else {
        return;
    };
    let last = RECORD_READ_NS.load(Ordering::Relaxed);
    if now_ns.saturating_sub(last) < RECORD_RECHECK_NS
        || RECORD_READ_NS
            .compare_exchange(last, now_ns, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    if let Ok(l) = limits::verify_and_read(path, *need_ro) {
        ledger.repin_shares(&l);
    }
}

/// `cuInit`'s verdict: None to go on to the driver, else why not. In a
/// slice with root's limits the process joins the ledger here, so a
/// process that cannot (no free slot) fails at initialisation rather than
/// running uncapped.
pub fn refuse_init() -> Option<String> {
    let s = shim();
    if let Some(why) = &s.closed {
        return Some(why.clone());
    }
    if !s.recorded || !(s.memory_active || s.compute_active) {
        return None;
    }
    let ledger = s.ledger.as_ref()?;
    match slot(ledger) {
        Some(_) => None,
        None => Some(format!(
            "cannot join the slice's usage ledger{}; CUDA is refused in this slice (fails closed)",
            ledger
                .path()
                .map_or(String::new(), |p| format!(" {}", p.display()))
        )),
    }
}

/// The slice's ledger file when it is configured and sound; else a private
/// one from the environment's caps (a per-process cap), or none.
fn open_ledger(cfg: &Config) -> Option<Ledger> {
    let count = cfg.caps.len().max(cfg.compute.len());
    let specs: Vec<DeviceSpec> = (0..count)
        .map(|i| DeviceSpec {
            uuid: cfg.uuid(i),
            cap: cfg.caps.get(i).copied().unwrap_or(UNLIMITED),
        })
        .collect();
    if let Some(path) = &cfg.ledger_path {
        let r = if specs.is_empty() {
            Ledger::open_in_slice(std::path::Path::new(path))
        } else {
            Ledger::open_or_create(std::path::Path::new(path), &cfg.slice_id, &specs)
        };
        match r {
            Ok(l) if l.writable() => return Some(l),
            Ok(_) => log_line(&format!(
                "ledger {path} is read-only for this process; caps are per process"
            )),
            Err(e) => log_line(&format!("{e}; caps are per process")),
        }
    }
    if specs.iter().all(|s| s.cap == UNLIMITED) && cfg.compute.iter().all(|&c| c == 0) {
        return None;
    }
    match Ledger::private(&cfg.slice_id, &specs) {
        Ok(l) => Some(l),
        Err(e) => {
            log_line(&format!("cannot set up accounting: {e}; no cap enforced"));
            None
        }
    }
}

// ------------------------------------------------------------- our slot

const UNATTACHED: usize = usize::MAX;
const ATTACHING: usize = usize::MAX - 1;
/// Attach failed, or we detached at exit: pass through.
const OFF: usize = usize::MAX - 2;

static SLOT: AtomicUsize = AtomicUsize::new(UNATTACHED);
static ATFORK: std::sync::Once = std::sync::Once::new();

#[inline]
fn slot(ledger: &Ledger) -> Option<Slot> {
    match SLOT.load(Ordering::Acquire) {
        OFF => None,
        UNATTACHED | ATTACHING => attach(ledger),
        i => Slot::from_index(i),
    }
}

#[cold]
fn attach(ledger: &Ledger) -> Option<Slot> {
    loop {
        match SLOT.compare_exchange(UNATTACHED, ATTACHING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(ATTACHING) => std::thread::yield_now(),
            Err(OFF) => return None,
            Err(i) => return Slot::from_index(i),
        }
    }
    ATFORK.call_once(|| {
        // SAFETY: registers a plain extern "C" handler; no other effect.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    });
    match ledger.attach() {
        Ok(s) => {
            SLOT.store(s.index(), Ordering::Release);
            Some(s)
        }
        Err(e) => {
            if shim_if_ready().is_some_and(|s| s.recorded) {
                // cuInit fails (refuse_init); `gpuslice slices` counts it.
                ledger.note_attach_failure();
                log_line(&format!("cannot join the slice ledger: {e}"));
            } else {
                log_line(&format!(
                    "cannot join the slice ledger: {e}; this process is not capped"
                ));
            }
            SLOT.store(OFF, Ordering::Release);
            None
        }
    }
}

/// A forked child is a new process: it takes its own slot when it first
/// allocates (CUDA itself does not survive fork; the charges this process
/// held are forgotten by `crate::resident`'s own handler).
extern "C" fn after_fork_child() {
    SLOT.store(UNATTACHED, Ordering::Release);
}

/// Releases everything at exit (the destructor).
pub fn detach_at_exit() {
    let Some(s) = SHIM.get() else { return };
    let Some(l) = &s.ledger else { return };
    let i = SLOT.swap(OFF, Ordering::AcqRel);
    if let Some(slot) = Slot::from_index(i) {
        l.detach(slot);
    }
}

// ------------------------------------------------------------- charging

/// Where a charge goes: a capped device of an active shim.
#[derive(Clone, Copy)]
pub struct Target {
    pub ledger: &'static Ledger,
    pub slot: Slot,
    pub dev: usize,
}

/// The target for device ordinal `dev`, without charging its context (for
/// the hooks that create contexts).
#[inline]
pub fn target_no_context(dev: i32) -> Option<Target> {
    let s = shim();
    let ledger = s.ledger.as_ref()?;
    let dev = usize::try_from(dev).ok().filter(|&d| d < MAX_DEVICES)?;
    if s.caps[dev] == UNLIMITED {
        return None;
    }
    let slot = slot(ledger)?;
    Some(Target { ledger, slot, dev })
}

// `Target::reserve` and the targets that charge a context at first use
// settle on a refusal: they are in `crate::resident`, above what they call.
impl Target {
    #[inline]
    pub fn release(self, bytes: u64) {
        self.ledger.release(self.slot, self.dev, bytes);
    }

    /// Adjusts the charge by `delta` after the fact (pool or graph growth
    /// seen after the call): grows within the cap when possible, else
    /// records the overshoot so later reservations fail.
    pub fn adjust(self, delta: i128) {
        if delta > 0 {
            let d = delta.min(u64::MAX as i128) as u64;
            if self.ledger.reserve(self.slot, self.dev, d).is_err() {
                self.ledger.charge_unchecked(self.slot, self.dev, d);
                if shim().log {
                    log_line(&format!(
                        "device {}: driver-side growth of {d} bytes passed the cap",
                        self.dev
                    ));
                }
            }
        } else if delta < 0 {
            self.release((-delta).min(u64::MAX as i128) as u64);
        }
    }
}

/// The release path when only the device index is known (frees).
#[inline]
pub fn release(dev: usize, bytes: u64) {
    let s = shim();
    let Some(l) = &s.ledger else { return };
    let i = SLOT.load(Ordering::Acquire);
    if let Some(slot) = Slot::from_index(i) {
        l.release(slot, dev, bytes);
    }
}

static REFUSALS_LOGGED: AtomicU64 = AtomicU64::new(0);

#[cold]
pub fn refused(dev: usize, bytes: u64, used: u64, cap: u64) {
    if shim().log && REFUSALS_LOGGED.fetch_add(1, Ordering::Relaxed) < 20 {
        log_line(&format!(
            "device {dev}: {bytes} bytes refused (slice uses {used} of {cap}): CUDA_ERROR_OUT_OF_MEMORY"
        ));
    }
}
