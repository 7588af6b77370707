//! Process handles that cannot name another process: a pidfd stays bound
//! to the process it was opened for, however its pid is reused.

use nix::unistd::Pid;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// A pidfd for `pid`: readable once the process exits.
pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
