//! The memory mapping behind a ledger. All `unsafe` of the crate is here
//! and in `sigbus.rs` (what a guarded mapping does when its file shrinks).
//!
//! A [`Mapping`] is a fixed-size region, either a shared mapping of a ledger
//! file or a private anonymous one. Every word other processes may change
//! concurrently is accessed through `AtomicU64`/`AtomicU32` views; plain byte
//! views are only handed out for regions written once before the file is
//! published (magic, geometry, device UUIDs, slice id).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
    /// Set for mappings of files that others may truncate (see `sigbus`).
    guard: Option<crate::sigbus::Guard>,
}

// SAFETY: the mapping is plain memory; every concurrently mutated word is
// accessed atomically (see the module comment), so sharing the pointer
// between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` shared (read-write when `writable`),
    /// guarded: if the file is truncated under it, this process reads
    /// private zero pages from then on instead of dying of SIGBUS
    /// ([`Mapping::lost`] tells).
    pub fn file_guarded(file: &File, len: usize, writable: bool) -> io::Result<Mapping> {
        let mut map = Self::file(file, len, writable)?;
        map.guard = crate::sigbus::register(map.ptr.as_ptr() as usize, len, writable);
        Ok(map)
    }

    /// Whether the file was truncated under this guarded mapping (it reads
    /// private zero pages since).
    pub fn lost(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.lost())
    }

    /// Maps `len` bytes of `file` shared (read-write when `writable`); a
    /// truncation of the file under it kills this process with SIGBUS.
    pub fn file(file: &File, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping chosen by the kernel (addr null); the fd is
        // valid for the duration of the call; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        Self::from_raw(ptr, len, writable)
    }

    /// A private zero-filled mapping of `len` bytes.
    pub fn anonymous(len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh anonymous mapping; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        Self::from_raw(ptr, len, true)
    }

    fn from_raw(ptr: *mut libc::c_void, len: usize, writable: bool) -> io::Result<Mapping> {
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Mapping {
            ptr,
            len,
            writable,
            guard: None,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn writable(&self) -> bool {
        self.writable
    }

    fn check(&self, off: usize, size: usize, align: usize) {
        assert!(
            off.is_multiple_of(align) && off.checked_add(size).is_some_and(|end| end <= self.len),
            "ledger layout: offset {off} size {size} outside mapping of {}",
            self.len
        );
    }

    /// The 8-byte word at `off` (8-aligned, inside the mapping).
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8, 8);
        // SAFETY: in bounds and 8-aligned (checked; mmap returns page-aligned
        // memory), valid for the life of `self`; AtomicU64 has the layout of
        // u64 and all concurrent access to such words is atomic.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// The 4-byte word at `off` (4-aligned, inside the mapping).
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4, 4);
        // SAFETY: as in `u64_at`, for a 4-byte word.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// Sleeps while the 4-byte word at `off` holds `expected`, at most
    /// `timeout_ns` (a shared futex: any process mapping the file may wake
    /// it). Returns early on a wake-up, a signal or a changed word.
    pub fn futex_wait(&self, off: usize, expected: u32, timeout_ns: u64) {
        let word = self.u32_at(off);
        let ts = libc::timespec {
            tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT on a 4-aligned word of this live mapping (not
        // FUTEX_PRIVATE: the word is shared between processes); `ts` is a
        // valid relative timeout; the result (EAGAIN, ETIMEDOUT, EINTR)
        // needs no handling: the caller re-reads the state.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                std::ptr::from_ref(word),
                libc::FUTEX_WAIT,
                expected,
                &ts,
            )
        };
    }

    /// Wakes every waiter on the 4-byte word at `off`.
    pub fn futex_wake(&self, off: usize) {
        let word = self.u32_at(off);
        // SAFETY: FUTEX_WAKE on a 4-aligned word of this live mapping; it
        // reads nothing else.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                std::ptr::from_ref(word),
                libc::FUTEX_WAKE,
                i32::MAX,
            )
        };
    }

    /// Bytes written once before publication, never changed after.
    pub fn bytes(&self, off: usize, len: usize) -> &[u8] {
        self.check(off, len, 1);
        // SAFETY: in bounds; callers only read regions that are immutable once
        // the ledger is published (magic, geometry, UUIDs, slice id), and
        // `&self` prevents `write_bytes` for as long as the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) }
    }

    /// Writes bytes into a region nobody else can see yet (a ledger being
    /// created, before it is linked into place).
    pub fn write_bytes(&mut self, off: usize, data: &[u8]) {
        assert!(self.writable, "write to a read-only ledger mapping");
        self.check(off, data.len(), 1);
        // SAFETY: in bounds, writable, `&mut self` excludes other views of
        // this process; the file is not yet visible to other processes.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Unguarded first: the SIGBUS handler must never map over a region
        // that is no longer ours.
        self.guard = None;
        // SAFETY: unmaps exactly the region mapped in `from_raw`; no
        // reference into it outlives `self` (they borrow `self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Sets the mode of `file` exactly (umask does not apply).
pub fn fchmod(file: &File, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscall on a valid fd.
    let rc = unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether a process with this pid exists (signal 0 probe).
pub fn pid_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks permission and existence.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether `file` is on a read-only mount (`ST_RDONLY`): then nobody,
/// root included, can write it without remounting.
pub fn read_only_mount(file: &File) -> io::Result<bool> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: valid fd and a buffer of the right type; checked below.
    let rc = unsafe { libc::fstatvfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatvfs succeeded and filled the struct.
    let st = unsafe { st.assume_init() };
    Ok(st.f_flag & libc::ST_RDONLY != 0)
}
