//! The slice's PID namespace: its own `/proc`, and an init.
//!
//! The launcher unshares a PID namespace before it forks, so its child is
//! PID 1 of a namespace of its own. That child mounts a fresh procfs on
//! `/proc` (only the slice's processes are in it: no other slice's or
//! host process to ptrace, signal, or reach through `/proc/<pid>/root`),
//! forks the command and stays as its init, as `docker --init` / tini:
//! - it reaps every process reparented to it (a PID 1 that does not
//!   leaves zombies);
//! - it relays the signals the launcher relays to it;
//! - it exits with the command's code, or 128 + the signal that killed
//!   it (which is what `run` exits with either way);
//! - when it exits, or is killed with its launcher (PDEATHSIG), the
//!   kernel kills every process left in the namespace: nothing the
//!   command started outlives the slice's cleanup unseen.
//!
//! The init keeps no descriptor but 0–2 and is not dumpable, so the
//! command cannot reach through `/proc/1/fd` or `/proc/1/mem` to what the
//! launcher had open.

use crate::devfs::ctx;
use crate::relay;
use nix::mount::{mount, MsFlags};
use nix::sys::signal::SigSet;
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::io;
use std::path::Path;

/// Mounts a procfs of the calling process's PID namespace on `/proc`. The
/// caller is PID 1 of that namespace, in a mount namespace of its own;
/// `/proc/sys`, `/proc/sysrq-trigger` and the rest of runc's list are
/// made read-only or masked after ([`crate::readonly::kernel_paths`], for
/// every `--pid` mode).
pub fn mount_proc() -> io::Result<()> {
    let proc = Path::new("/proc");
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), proc, Some("proc"), flags, None::<&str>)
        .map_err(|e| ctx(e.into(), "mount procfs on", proc))
}

/// The init's loop: relays `signals` (blocked in this thread, SIGCHLD
/// among them) to `command`, reaps whatever exits, and returns the code
/// to exit with once `command` has. Never fails: an init that stopped
/// reaping would be worse than one that reaps by polling.
pub fn supervise(command: Pid, signals: &SigSet) -> i32 {
    // Without a signalfd (out of fds) the loop still reaps, by blocking in
    // waitpid; relaying is what is lost.
    let sfd = SignalFd::with_flags(signals, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK).ok();
    loop {
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == command => return code,
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == command => return 128 + sig as i32,
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => continue, // an orphan reaped
                Err(nix::Error::EINTR) => continue,
                Err(_) => return crate::exit::EXIT_LAUNCH_FAILED, // no child: cannot happen
            }
        }
        match &sfd {
            Some(sfd) => {
                // Blocks until a signal is pending; SIGCHLD wakes it too.
                let mut fds = [nix::poll::PollFd::new(
                    std::os::fd::AsFd::as_fd(sfd),
                    nix::poll::PollFlags::POLLIN,
                )];
                let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE);
                relay::relay_pending(sfd, command);
            }
            None => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
}

/// Makes the calling process non-dumpable: its `/proc/<pid>` entries
/// become root's and ptrace-protected, whoever it runs as.
pub fn undumpable() -> io::Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(io::Error::from)
}
