//! Descriptors the command inherits: 0–2, and `--preserve-fds N` more
//! (3 .. 3+N, as runc). Anything else the caller had open (an `O_PATH` fd
//! of the host's `/dev` or of a GPU node) would be a way around the
//! private `/dev`.

use std::io;
use std::os::fd::RawFd;

#[derive(Debug, thiserror::Error)]
pub enum FdError {
    #[error("--preserve-fds {count}: descriptor {fd} is not open; pass only descriptors 3..{end} that the caller opened", end = 3 + *count as u64)]
    NotOpen { count: u32, fd: RawFd },
    #[error("--preserve-fds {count}: out of range; allowed 0..={max} (3 + N must stay within the descriptor limit, RLIMIT_NOFILE {limit})")]
    OutOfRange { count: u32, max: u64, limit: u64 },
    #[error("closing inherited descriptors: {0}")]
    Close(io::Error),
}

/// Checks, before the launcher opens anything, that the descriptors to
/// preserve are open: a gap would later be filled by one of the
/// launcher's own (a pipe, the cgroup's) and passed on by mistake. And
/// first that `3 + count` is a descriptor number the process can have
/// (below its soft `RLIMIT_NOFILE`): a count past it names descriptors
/// that cannot exist, and one near `u32::MAX` would wrap `3 + count`
/// round to the command's own stdio.
pub fn check_preserved(count: u32) -> Result<(), FdError> {
    let limit = nofile_limit();
    let max = limit.saturating_sub(3);
    if u64::from(count) > max {
        return Err(FdError::OutOfRange { count, max, limit });
    }
    // In range: 3 + count <= limit, which is at most i32::MAX here.
    for fd in 3..3 + count as RawFd {
        // SAFETY: F_GETFD only reads the flags of a descriptor number.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            return Err(FdError::NotOpen { count, fd });
        }
    }
    Ok(())
}

/// The soft descriptor limit: no descriptor numbered at or past it can be
/// open, and none past `i32::MAX` can exist at all.
fn nofile_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
        rl.rlim_cur
    } else {
        1024
    };
    cur.min(i32::MAX as u64)
}

/// Marks every descriptor from 3 close-on-exec except the `count`
/// preserved ones, which lose that flag. The launcher's own pipes stay
/// usable until exec. One `close_range(2)`; no allocation. `count` was
/// checked by [`check_preserved`]; one that would wrap is refused here too.
pub fn close_on_exec_beyond(count: u32) -> Result<(), FdError> {
    let Some(first) = count.checked_add(3).filter(|f| *f <= i32::MAX as u32) else {
        let limit = nofile_limit();
        return Err(FdError::OutOfRange {
            count,
            max: limit.saturating_sub(3),
            limit,
        });
    };
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
