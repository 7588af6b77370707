//! Descriptors the command inherits: 0–2, and `--preserve-fds N` more
//! (3 .. 3+N, as runc). Anything else the caller had open (an `O_PATH` fd
//! of the host's `/dev` or of a GPU node) would be a way around the
//! private `/dev`.

use std::io;
use std::os::fd::RawFd;

#[derive(Debug, thiserror::Error)]
pub enum FdError {
    #[error("--preserve-fds {count}: descriptor {fd} is not open; pass only descriptors 3..{end} that the caller opened", end = 3 + count)]
    NotOpen { count: u32, fd: RawFd },
    #[error("closing inherited descriptors: {0}")]
    Close(io::Error),
}

/// Checks, before the launcher opens anything, that the descriptors to
/// preserve are open: a gap would later be filled by one of the
/// launcher's own (a pipe, the cgroup's) and passed on by mistake.
pub fn check_preserved(count: u32) -> Result<(), FdError> {
    for fd in 3..3 + count as RawFd {
        // SAFETY: F_GETFD only reads the flags of a descriptor number.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            return Err(FdError::NotOpen { count, fd });
        }
    }
    Ok(())
}

/// Marks every descriptor from 3 close-on-exec except the `count`
/// preserved ones, which lose that flag. The launcher's own pipes stay
/// usable until exec. One `close_range(2)`; no allocation.
pub fn close_on_exec_beyond(count: u32) -> Result<(), FdError> {
    let first = 3 + count;
    // SAFETY: close_range takes integers; CLOEXEC only sets a flag.
    if unsafe { libc::close_range(first, u32::MAX, libc::CLOSE_RANGE_CLOEXEC as i32) } != 0 {
        return Err(FdError::Close(io::Error::last_os_error()));
    }
    for fd in 3..first as RawFd {
        // SAFETY: F_SETFD only clears the close-on-exec flag of a descriptor
        // [`check_preserved`] found open.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } == -1 {
            return Err(FdError::Close(io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Closes every descriptor from 3: for the slice's init, which never
/// execs, so close-on-exec would not close anything.
pub fn close_all_beyond_stdio() -> Result<(), FdError> {
    // SAFETY: close_range takes integers; nothing of ours is used after.
    if unsafe { libc::close_range(3, u32::MAX, 0) } != 0 {
        return Err(FdError::Close(io::Error::last_os_error()));
    }
    Ok(())
}
