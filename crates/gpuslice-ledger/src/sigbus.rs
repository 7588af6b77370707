//! A file truncated under a mapping of it: a private copy, not a SIGBUS death.
//!
//! A process that touches a shared mapping past the end of its file gets
//! SIGBUS. A GPU's board is writable by every tenant of the GPU and a usage
//! ledger by its slice, so a tenant can truncate one under every other
//! process that maps it: other slices' shims (the board), and root's
//! readers (`gpuslice slices`, the exporter, a launcher reaping stale
//! ledgers). A *guarded* mapping is registered here; for a fault inside
//! one, this process's SIGBUS handler maps private zero pages over the
//! whole mapping and marks it lost. The process goes on with a copy of its
//! own that reads as if the file had been zeroed, which any writer of the
//! file can do anyway. Every other SIGBUS goes to the handler there was
//! before (by default the process dies of it, as without this module).
//!
//! Not guarded: a slice's own shim mapping its usage ledger. A private
//! copy would free that process from the slice's shared cap, so it dies of
//! the fault instead (the slice fails closed; it harmed only itself).
//!
//! Not covered: a program that installs a SIGBUS handler of its own after
//! this one and does not hand on faults it does not know.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// How many guarded mappings a process may hold at once (a shim holds a
/// board per GPU; readers map one ledger at a time). Past that, a mapping
/// is made unguarded.
const SLOTS: usize = 256;

struct Range {
    /// First byte; 0 while the slot is free or being filled.
    start: AtomicUsize,
    /// Length; non-zero while the slot is taken.
    len: AtomicUsize,
    writable: AtomicBool,
    lost: AtomicBool,
}

static RANGES: [Range; SLOTS] = [const {
    Range {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        writable: AtomicBool::new(false),
        lost: AtomicBool::new(false),
    }
}; SLOTS];

static INSTALL: Once = Once::new();
/// The SIGBUS disposition before ours, to hand other faults to.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A registered mapping; unregister (drop) it before unmapping.
pub struct Guard(usize);

impl Guard {
    /// Whether a truncation replaced the mapping with private zero pages.
    pub fn lost(&self) -> bool {
        RANGES[self.0].lost.load(Ordering::Relaxed)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let r = &RANGES[self.0];
        r.start.store(0, Ordering::Release);
        r.len.store(0, Ordering::Release);
    }
}

/// Guards the mapping of `len` bytes at `start`; None when every slot is
/// taken (the mapping is then as unguarded as any).
pub fn register(start: usize, len: usize, writable: bool) -> Option<Guard> {
    INSTALL.call_once(install);
    if len == 0 {
        return None;
    }
    let i = RANGES.iter().position(|r| {
        r.len
            .compare_exchange(0, len, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })?;
    let r = &RANGES[i];
    r.writable.store(writable, Ordering::Relaxed);
    r.lost.store(false, Ordering::Relaxed);
    r.start.store(start, Ordering::Release);
    Some(Guard(i))
}

fn install() {
    // SAFETY: a zeroed sigaction is a valid value (empty mask, no flags) and
    // is filled in below before use.
    let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
    ours.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
    ours.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
    // SAFETY: as above; the out-parameter is written by sigaction.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to initialised sigaction values; the handler
    // is an `extern "C"` function of the right signature for SA_SIGINFO.
    if unsafe { libc::sigaction(libc::SIGBUS, &ours, &mut old) } == 0 {
        let _ = PREVIOUS.set(old);
    }
}

/// The SIGBUS handler. Async-signal-safe: atomics, `mmap`, `sigaction`,
/// `raise`; it allocates nothing and cannot panic.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // Only a fault has an address (a sent SIGBUS has a pid there).
    let fault = code > 0;
    for r in RANGES.iter().filter(|_| fault) {
        let start = r.start.load(Ordering::Acquire);
        let len = r.len.load(Ordering::Acquire);
        if start == 0 || addr < start || addr - start >= len {
            continue;
        }
        let prot = if r.writable.load(Ordering::Relaxed) {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: MAP_FIXED over exactly a mapping this process made and
        // still holds (a guard is dropped before its munmap): its pages
        // become private zero pages, and the faulting access re-runs on them.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            r.lost.store(true, Ordering::Relaxed);
            return;
        }
        break;
    }
    hand_on(sig, info, ctx);
}

/// A SIGBUS that is not ours: to the handler there was before, else the
/// default action (the process dies of it).
fn hand_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let previous = PREVIOUS.get();
    let handler = previous.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    // SAFETY: as in `on_sigbus`.
    let sent = unsafe { (*info).si_code } <= 0;
    if handler == libc::SIG_IGN && sent {
        return;
    }
    if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
        if previous.is_some_and(|p| p.sa_flags & libc::SA_SIGINFO != 0) {
            // SAFETY: the previous handler was installed with SA_SIGINFO, so
            // it has this signature; it gets what the kernel gave us.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(handler) };
            f(sig, info, ctx);
        } else {
            // SAFETY: a plain handler takes the signal number alone.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            f(sig);
        }
        return;
    }
    // SAFETY: a zeroed sigaction with SIG_DFL (0) is the default action.
    let default: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer; then the signal is raised again: blocked while
    // this handler runs, it is delivered with the default action as the
    // handler returns (a fault would also re-run and kill).
    unsafe {
        libc::sigaction(sig, &default, std::ptr::null_mut());
        libc::raise(sig);
    }
}
