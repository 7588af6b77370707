//! Process-wide state: configuration, the slice ledger, this process's
//! slot, and the reserve/release helpers the hooks share.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

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
    pub caps: [u64; MAX_DEVICES],
    /// `GPUSLICE_CONTEXT_BYTES` (None: measured, see [`crate::resident`]).
    pub context_bytes: Option<u64>,
    pub log: bool,
    pub nvml: Vec<NvmlMatch>,
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
            let shown: Vec<String> = caps
                .iter()
                .take_while(|&&c| c != UNLIMITED)
                .map(|c| format!("{}MiB", c >> 20))
                .collect();
            let shares: Vec<String> = compute
                .iter()
                .take_while(|&&c| c != 0)
                .map(|c| format!("{}%", *c as f64 / 100.0))
                .collect();
            log_line(&format!(
                "pid {} ledger {where_} caps [{}] compute [{}] mode {:?}{}",
                std::process::id(),
                shown.join(","),
                shares.join(","),
                cfg.compute_mode,
                if boards.is_some() {
                    " (on the board)"
                } else {
                    ""
                }
            ));
        }
        Shim {
            ledger,
            memory_active,
            compute_active,
            compute,
            boards,
            caps,
            context_bytes: cfg.context_bytes,
            log,
            nvml: cfg.nvml,
        }
    }

    pub fn active(&self) -> bool {
        self.ledger.is_some()
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
            Ledger::open(std::path::Path::new(path))
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
            log_line(&format!(
                "cannot join the slice ledger: {e}; this process is not capped"
            ));
            SLOT.store(OFF, Ordering::Release);
            None
        }
    }
}

/// A forked child is a new process: it takes its own slot when it first
/// allocates (CUDA itself does not survive fork).
extern "C" fn after_fork_child() {
    SLOT.store(UNATTACHED, Ordering::Release);
    crate::resident::reset_after_fork();
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

/// The target for device ordinal `dev`, or None to pass through. A
/// context no hook saw being created is charged here, at first use.
#[inline]
pub fn target(dev: i32) -> Option<Target> {
    let t = target_no_context(dev)?;
    if !crate::resident::CONTEXT_CHARGED[t.dev].load(Ordering::Relaxed) {
        crate::resident::charge_existing_context(t);
    }
    Some(t)
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

/// The target for the current context's device.
#[inline]
pub fn target_current() -> Option<Target> {
    if !shim().active() {
        return None;
    }
    target(crate::hooks::current_device()?)
}

impl Target {
    /// Reserves `bytes` before the driver call. On refusal, first reclaims
    /// dead processes' bytes, settles stale pool/graph charges (they may
    /// have shrunk) and this process's driver-held memory to what NVML
    /// measures, and tries again.
    #[inline]
    pub fn reserve(self, bytes: u64) -> bool {
        if self.ledger.reserve(self.slot, self.dev, bytes).is_ok() {
            return true;
        }
        self.reserve_slow(bytes)
    }

    #[cold]
    fn reserve_slow(self, bytes: u64) -> bool {
        let _ = self.ledger.reap();
        crate::hooks::settle_device(self);
        let _ = crate::resident::settle(self, crate::resident::Why::Refusal);
        match self.ledger.reserve(self.slot, self.dev, bytes) {
            Ok(()) => true,
            Err(over) => {
                refused(self.dev, bytes, over.used, over.cap);
                false
            }
        }
    }

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
fn refused(dev: usize, bytes: u64, used: u64, cap: u64) {
    if shim().log && REFUSALS_LOGGED.fetch_add(1, Ordering::Relaxed) < 20 {
        log_line(&format!(
            "device {dev}: {bytes} bytes refused (slice uses {used} of {cap}): CUDA_ERROR_OUT_OF_MEMORY"
        ));
    }
}
