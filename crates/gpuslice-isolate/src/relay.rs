//! Relaying signals to the command: the launcher to the slice's init (or
//! the command), the init to the command.

use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use nix::unistd::Pid;

/// Signals relayed to the command when another process sent them; the
/// ones a terminal sends reach the command directly, since it is in the
/// launcher's foreground process group.
pub const RELAYED: &[Signal] = &[
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
    Signal::SIGALRM,
];

/// Reads every pending signal of `sfd` and sends on to `to` the ones
/// another process sent (a terminal's, SI_KERNEL, already got there).
/// SIGCHLD is left to the caller's waitpid.
pub fn relay_pending(sfd: &SignalFd, to: Pid) {
    while let Ok(Some(info)) = sfd.read_signal() {
        let Ok(sig) = Signal::try_from(info.ssi_signo as i32) else {
            continue;
        };
        if sig != Signal::SIGCHLD && info.ssi_code != libc::SI_KERNEL {
            let _ = nix::sys::signal::kill(to, sig);
        }
    }
}
