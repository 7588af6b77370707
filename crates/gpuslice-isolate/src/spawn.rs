//! Forking the child straight into its cgroup.
//!
//! Joining a cgroup by writing `cgroup.procs` takes the kernel's
//! `cgroup_threadgroup_rwsem` for writing, which waits out an RCU grace
//! period: 1 to 10 ms per launch on the CI-like host (bimodal; p90 of a
//! whole launch 14 ms against a median of 4), more than the rest of the
//! launch. `clone3(CLONE_INTO_CGROUP)` (Linux 5.7, cgroup v2 only) creates
//! the child inside the cgroup instead, under the read side of that lock.
//! Where it is refused (older kernel, seccomp filter, cgroup v1) the
//! launcher falls back to fork and a `cgroup.procs` write in the child.

use nix::unistd::Pid;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `CLONE_INTO_CGROUP` (include/uapi/linux/sched.h).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`, 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Which side of a successful [`fork_into_cgroup`] we are on.
pub enum Forked {
    Parent(Pid),
    Child,
}

/// Whether this process has exactly one thread. A raw `clone3` skips
/// glibc's fork handlers (which make malloc safe to use in the child of a
/// multi-threaded parent), so it is only used when there is no other thread.
fn single_threaded() -> bool {
    gpuslice_ledger::procfs::own_stat().map(|s| s.num_threads) == Some(1)
}

/// Forks a child that starts inside the cgroup v2 directory `cgroup_dir`.
/// `Err` when the kernel refuses (the caller then forks and joins the
/// cgroup itself) or when the process has other threads.
///
/// # Safety
///
/// As `fork(2)`: the child may only run async-signal-safe code, or code
/// that cannot meet a lock another thread held (there is none: this is
/// only done single-threaded), until it execs or `_exit`s.
pub unsafe fn fork_into_cgroup(cgroup_dir: BorrowedFd<'_>) -> Result<Forked, nix::Error> {
    if !single_threaded() {
        return Err(nix::Error::EAGAIN);
    }
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup_dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: a fork-like clone3 (no CLONE_VM, no new stack): both sides
    // return here with copies of the same memory; `args` is a valid
    // clone_args of the size passed. The caller upholds fork's contract.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match rc {
        -1 => Err(nix::Error::last()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(Pid::from_raw(pid as i32))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn clone_args_has_the_kernel_s_size() {
        assert_eq!(std::mem::size_of::<CloneArgs>(), 88);
    }

    #[test]
    fn a_multi_threaded_process_is_refused_before_any_clone() {
        // A thread that outlives the call, whatever the test harness does.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || rx.recv());
        let dir = std::fs::File::open("/").unwrap();
        assert!(!single_threaded());
        // SAFETY: refused before any clone happens.
        let r = unsafe { fork_into_cgroup(dir.as_fd()) };
        assert!(matches!(r, Err(nix::Error::EAGAIN)));
        drop(tx);
        let _ = t.join();
    }
}
