//! The launcher: fork, put the child in its sandbox, exec, forward signals,
//! wait, clean up.
//!
//! The parent stays in the host's namespaces so it can always remove the
//! slice's cgroup; the child builds its mount namespace itself and reports
//! any failure before exec through a close-on-exec pipe, so `run` can tell
//! "gpuslice failed" (exit 125) from "the command failed" (its own code).
//!
//! `gpuslice run` is single-threaded, so the child may allocate between
//! fork and exec (no other thread can hold the allocator's lock).

use crate::cgroup::{self, CgroupDriver, SliceCgroup};
use crate::devfs::{self, NodeMode};
use crate::identity::{self, Identity};
use crate::spawn::{self, Forked};
use crate::{driver_proc, slicefs, strict};
use gpuslice_core::{DevicePolicy, HostRoot};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use thiserror::Error;

/// Exit code when gpuslice fails before the child runs (as `docker run`).
pub const EXIT_LAUNCH_FAILED: i32 = 125;

/// What the child's sandbox consists of; built by the caller from the
/// chosen isolation layers.
#[derive(Debug, Clone)]
pub struct SandboxPlan {
    pub root: HostRoot,
    pub policy: DevicePolicy,
    /// Layer 1: private /dev, with nodes re-created this way.
    pub private_dev: Option<NodeMode>,
    /// Enter a user namespace first (non-root callers).
    pub user_namespace: bool,
    /// Layer 2: params copy to bind over `/proc/driver/nvidia/params`.
    pub params_overlay: Option<String>,
    /// Layer 2: `/proc/driver/nvidia/gpus/<bus>` dirs to mask.
    pub masked_gpus: Vec<String>,
    /// Layer 3.
    pub cgroup: Option<CgroupDriver>,
    pub strict: bool,
    /// Who the command runs as (`--user`, or the sudo caller); None keeps
    /// the launcher's own ids.
    pub identity: Option<Identity>,
    /// The slice's limits record, usage ledger and shim at their fixed
    /// place, and other slices' records hidden ([`slicefs`]); needs a
    /// mount namespace, so it makes one.
    pub slice_files: Option<slicefs::SliceFiles>,
}

/// The program to run, its arguments and its whole environment.
#[derive(Debug, Clone)]
pub struct ChildCommand {
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
}

#[derive(Debug, Error)]
pub enum LaunchError {
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        source: io::Error,
    },
    /// The child failed before exec; `code` is what `run` exits with
    /// (125, or 126/127 when the command cannot be executed or found).
    #[error("{msg}")]
    Child { code: i32, msg: String },
}

fn sys(what: &'static str) -> impl FnOnce(nix::Error) -> LaunchError {
    move |e| LaunchError::Sys {
        what,
        source: e.into(),
    }
}

/// Signals the launcher relays to the child when another process sent
/// them; the ones a terminal sends reach the child directly, since it is in
/// the launcher's foreground process group.
const RELAYED: &[Signal] = &[
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
    Signal::SIGALRM,
];

/// The launcher's signal set, blocked from the start of `run`.
///
/// Signals must be blocked before any thread exists (NVML, when discovery
/// loads it, starts threads): a thread that does not block SIGCHLD or a
/// relayed signal would take it, and the launcher would never see it.
/// Threads inherit the mask of the thread that creates them.
pub struct SignalGuard {
    signals: SigSet,
    old_mask: SigSet,
}

impl SignalGuard {
    /// Block SIGCHLD and the relayed signals in the calling thread, and
    /// ignore SIGPIPE (the launcher must live to clean up even when a pipe
    /// to its child or its own stdout closes; the child gets the default
    /// back before exec); call it first thing, before anything may start a
    /// thread.
    pub fn block() -> Result<Self, LaunchError> {
        // SAFETY: SIG_IGN installs no handler.
        unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigIgn) }
            .map_err(sys("ignoring SIGPIPE"))?;
        let mut signals = SigSet::empty();
        signals.add(Signal::SIGCHLD);
        RELAYED.iter().for_each(|s| signals.add(*s));
        let old_mask = signals
            .thread_swap_mask(SigmaskHow::SIG_BLOCK)
            .map_err(sys("blocking signals"))?;
        Ok(Self { signals, old_mask })
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        let _ = self.old_mask.thread_set_mask();
    }
}

/// Run `cmd` in the sandbox `plan` describes; returns the code `run` exits
/// with: the child's, or 128 + signal when it was killed.
pub fn launch(
    signals: &SignalGuard,
    plan: &SandboxPlan,
    slice_id: &str,
    cmd: &ChildCommand,
) -> Result<i32, LaunchError> {
    let cgroup = match &plan.cgroup {
        Some(driver) => {
            cgroup::reap_stale(driver);
            Some(SliceCgroup::create_empty(driver, slice_id)?)
        }
        None => None,
    };
    // Opened before the fork: the child joins through one (clone3 into the
    // directory, else a write of `cgroup.procs`) without allocating.
    let (procs, cgroup_dir) = match &cgroup {
        Some(c) => c
            .open_procs()
            .and_then(|procs| Ok((Some(procs), c.open_dir()?)))
            .map_err(|source| LaunchError::Sys {
                what: "opening the slice cgroup",
                source,
            })?,
        None => (None, None),
    };
    let old_mask = &signals.old_mask;
    let (err_rx, err_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys("pipe"))?;
    // The device filter goes on while the child builds its namespace: the
    // child execs only once a byte comes through here (~0.1 ms of BPF
    // verifying off every launch on the H200).
    let (go_rx, go_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys("pipe"))?;

    // SAFETY: the child runs ordinary Rust code until exec. gpuslice run
    // starts no threads of its own (the clone3 path checks there is none);
    // if NVML did, glibc's fork handlers leave malloc and stdio usable in
    // the child, and the child calls nothing else another thread could
    // hold a lock in.
    let (forked, procs) = unsafe { fork_child(cgroup_dir.as_ref(), procs) }?;
    let child = match forked {
        Forked::Child => {
            drop(err_rx);
            drop(go_tx);
            let (code, err) = child_main(plan, procs, old_mask, go_rx, cmd).unwrap_err();
            let mut tx = File::from(err_tx);
            let _ = tx.write_all(format!("{code} {err}").as_bytes());
            // SAFETY: _exit skips atexit handlers and destructors of the
            // parent's state that this forked copy must not run.
            unsafe { libc::_exit(code) }
        }
        Forked::Parent(child) => child,
    };
    drop(err_tx);
    drop(procs);
    drop(go_rx);
    if let Some(c) = &cgroup {
        if let Err(e) = c.apply(&plan.policy) {
            // The child never execs: it is waiting for the byte.
            let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
            let _ = waitpid(child, None);
            return Err(e.into()); // the cgroup is removed on drop
        }
    }
    let _ = File::from(go_tx).write_all(b"1");

    let setup_error = read_to_end(err_rx);
    let code = wait_relaying(child, &signals.signals);
    if let Some(c) = cgroup {
        if let Err(e) = c.remove() {
            tracing::warn!("{e}");
        }
    }
    match setup_error
        .as_deref()
        .map(|m| m.split_once(' ').unwrap_or(("125", m)))
    {
        Some((code, msg)) => Err(LaunchError::Child {
            code: code.parse().unwrap_or(EXIT_LAUNCH_FAILED),
            msg: msg.to_string(),
        }),
        None => code,
    }
}

/// Forks the child: straight into the cgroup v2 directory when there is
/// one and the kernel allows ([`spawn`]), else a plain fork; returns the
/// `cgroup.procs` file the child must still join through (None once it is
/// in).
///
/// # Safety
///
/// As `fork(2)`.
unsafe fn fork_child(
    cgroup_dir: Option<&File>,
    procs: Option<File>,
) -> Result<(Forked, Option<File>), LaunchError> {
    if let Some(dir) = cgroup_dir {
        // SAFETY: passed on from the caller.
        match unsafe { spawn::fork_into_cgroup(dir.as_fd()) } {
            Ok(forked) => {
                if let Forked::Parent(pid) = forked {
                    tracing::debug!(%pid, "forked into the slice cgroup (clone3)");
                }
                return Ok((forked, None));
            }
            Err(e) => tracing::debug!("clone3 into the cgroup refused ({e}); fork and join"),
        }
    }
    // SAFETY: passed on from the caller.
    let forked = match unsafe { fork() }.map_err(sys("fork"))? {
        ForkResult::Child => Forked::Child,
        ForkResult::Parent { child } => Forked::Parent(child),
    };
    Ok((forked, procs))
}

fn read_to_end(fd: OwnedFd) -> Option<String> {
    let mut msg = String::new();
    let _ = File::from(fd).read_to_string(&mut msg);
    (!msg.is_empty()).then_some(msg)
}

/// Child side: join the cgroup, build the namespace, drop privileges,
/// exec. Returns only on failure, with the exit code and a one-line reason.
fn child_main(
    plan: &SandboxPlan,
    procs: Option<File>,
    old_mask: &SigSet,
    go: OwnedFd,
    cmd: &ChildCommand,
) -> Result<std::convert::Infallible, (i32, String)> {
    setup_child(plan, procs, old_mask).map_err(|e| (EXIT_LAUNCH_FAILED, e))?;
    let mut byte = [0u8; 1];
    if !matches!(File::from(go).read(&mut byte), Ok(1)) {
        // The launcher could not put the device filter on; it says why.
        return Err((EXIT_LAUNCH_FAILED, String::new()));
    }
    let err = nix::unistd::execvpe(&cmd.argv[0], &cmd.argv, &cmd.env).unwrap_err();
    let code = match err {
        nix::Error::ENOENT => 127,
        _ => 126,
    };
    let name = cmd.argv[0].to_string_lossy();
    Err((
        code,
        format!("cannot execute {name}: {}", io::Error::from(err)),
    ))
}

fn setup_child(plan: &SandboxPlan, procs: Option<File>, old_mask: &SigSet) -> Result<(), String> {
    // Die with the launcher: a killed launcher must not leave a child
    // running unsupervised in a cgroup nobody removes.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| format!("prctl: {e}"))?;
    if let Some(procs) = procs {
        cgroup::enter_self(&procs).map_err(|e| format!("joining the slice cgroup: {e}"))?;
    }
    if plan.private_dev.is_some()
        || plan.params_overlay.is_some()
        || !plan.masked_gpus.is_empty()
        || plan.slice_files.is_some()
    {
        enter_mount_namespace(plan)?;
    }
    // After the mounts (they need root), before privileges are dropped.
    if let Some(id) = &plan.identity {
        identity::switch(id).map_err(|e| format!("switching to uid {}: {e}", id.uid))?;
    }
    if plan.strict {
        strict::lock_down().map_err(|e| e.to_string())?;
    }
    // The launcher ignores SIGPIPE ([`SignalGuard::block`]) and exec keeps
    // an ignored signal ignored: without this, `gpuslice run -- yes | head`
    // would leave `yes` writing into a closed pipe (std's Command resets
    // it the same way).
    // SAFETY: SIG_DFL installs no handler; single-threaded child.
    unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) }
        .map_err(|e| format!("resetting SIGPIPE: {e}"))?;
    old_mask
        .thread_set_mask()
        .map_err(|e| format!("restoring the signal mask: {e}"))
}

fn enter_mount_namespace(plan: &SandboxPlan) -> Result<(), String> {
    let flags = if plan.user_namespace {
        CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS
    } else {
        CloneFlags::CLONE_NEWNS
    };
    unshare(flags).map_err(|e| format!("unshare(mount namespace): {e}"))?;
    if plan.user_namespace {
        crate::userns::map_self().map_err(|e| e.to_string())?;
    }
    // Our mounts must not propagate back to the host.
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| format!("making / a slave mount: {e}"))?;
    // The mirror must get the host's exact modes; the child gets our umask back.
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::empty());

    let dev = plan.root.dev();
    if let Some(nodes) = plan.private_dev {
        // The root's /dev itself must not be a link out of it.
        plan.root
            .open_beneath(
                "dev",
                nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY,
            )
            .map_err(|e| e.to_string())?;
        // No logging here: a forked child must not take the stderr lock
        // another thread of the parent may have held at fork.
        devfs::mount_private_dev(&dev, &plan.policy, nodes).map_err(|e| e.to_string())?;
    }
    if let Some(params) = &plan.params_overlay {
        // Stage on the private /dev's tmpfs when there is one; else on /dev/shm.
        let staging = if plan.private_dev.is_some() {
            dev.clone()
        } else {
            "/dev/shm".into()
        };
        driver_proc::overlay_params(&plan.root, params, &staging).map_err(|e| e.to_string())?;
    }
    driver_proc::mask_gpu_dirs(&plan.root, &plan.masked_gpus).map_err(|e| e.to_string())?;
    if let Some(files) = &plan.slice_files {
        slicefs::mount_slice_files(files).map_err(|e| e.to_string())?;
    }
    nix::sys::stat::umask(umask);
    Ok(())
}

/// Wait for `child`, relaying signals other processes send us. The child's
/// exit is watched through a pidfd, so it cannot be missed even if a
/// SIGCHLD went elsewhere.
fn wait_relaying(child: Pid, signals: &SigSet) -> Result<i32, LaunchError> {
    let sfd = SignalFd::with_flags(signals, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(sys("signalfd"))?;
    let pidfd = pidfd_open(child).map_err(|source| LaunchError::Sys {
        what: "pidfd_open",
        source,
    })?;
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)).map_err(sys("waitpid"))? {
            WaitStatus::Exited(_, code) => return Ok(code),
            WaitStatus::Signaled(_, sig, _) => return Ok(128 + sig as i32),
            _ => {}
        }
        let mut fds = [
            PollFd::new(pidfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::Error::EINTR) => {}
            Err(e) => return Err(sys("poll")(e)),
        }
        while let Ok(Some(info)) = sfd.read_signal() {
            let Ok(sig) = Signal::try_from(info.ssi_signo as i32) else {
                continue;
            };
            // A terminal's signals (SI_KERNEL) already reached the child.
            if sig != Signal::SIGCHLD && info.ssi_code != libc::SI_KERNEL {
                let _ = nix::sys::signal::kill(child, sig);
            }
        }
    }
}

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
