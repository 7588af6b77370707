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
//!
//! The child's steps, in this order (each needs what the next takes away):
//! 1. join the slice cgroup (cgroup v1; on v2 it was created inside it);
//! 2. namespaces: mount and cgroup (the cgroup namespace is rooted at the
//!    slice cgroup it is now in), a user namespace for a non-root caller;
//!    the PID namespace was unshared by the launcher, so the child is its
//!    PID 1 ([`pidns`]);
//! 3. mounts (propagation private): a fresh `/proc`, runc's read-only and
//!    masked paths on whichever `/proc` the slice has, the private `/dev`,
//!    the params overlay and the masked GPU dirs on that `/proc`, `/sys`
//!    read-only, every other pseudo-filesystem sealed ([`readonly`]);
//! 4. wait for the launcher's device filter;
//! 5. descriptors beyond 0–2 (and `--preserve-fds`) close-on-exec ([`fds`]);
//! 6. the bounding set down to the kept capabilities (that takes
//!    CAP_SETPCAP, which a switch to a non-root user loses; runc's order);
//! 7. the user switch ([`identity::switch`]: CAP_SETUID/CAP_SETGID; a
//!    non-root uid leaves every capability behind);
//! 8. the other capability sets down to the kept ones, no_new_privs
//!    ([`privileges`]);
//! 9. the seccomp filter, last, so the calls above are not filtered
//!    ([`seccomp`]);
//! 10. exec.
//!
//! With a PID namespace the child is its init, and the command's process
//! is forked from it right after step 2: it takes steps 5–9 (the seccomp
//! install is the slowest step of a launch) while the init takes steps 3
//! and 4 in the mount namespace they share, and execs only when the init
//! writes that both are done (`init_main`). It is our code until then,
//! holds nothing of the host's `/dev`, and sees the mounts as they land.
//!
//! Meanwhile the launcher sends, through pipes, in the order the child
//! needs them: the compiled seccomp filter (step 9), the survey of the
//! host's `/dev` for the overlay (step 3), and a byte once the device
//! filter is on the slice cgroup (step 4).

use crate::cgroup::{self, CgroupDriver, SliceCgroup};
use crate::devfs::{self, NodeMode};
use crate::identity::{self, Identity};
use crate::marks::mark;
use crate::privileges::Privileges;
use crate::spawn::{self, Forked};
use crate::{driver_proc, fds, hostpid, pidns, privileges, readonly, relay, seccomp, slicefs};
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
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use thiserror::Error;

pub use crate::exit::EXIT_LAUNCH_FAILED;
pub use crate::pidfd::pidfd_open;

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
    /// What the command keeps of root; anything but
    /// [`Privileges::Privileged`] also gets the seccomp filter, a cgroup
    /// namespace, a read-only `/sys` and no inherited descriptors.
    pub privileges: Privileges,
    /// A PID namespace with its own `/proc` and an init (`--pid host`:
    /// false). Needs root: the launcher unshares it.
    pub pid_namespace: bool,
    /// Descriptors 3 .. 3+N the command inherits (`--preserve-fds N`).
    pub preserve_fds: u32,
    /// Who the command runs as (`--user`, or the sudo caller); None keeps
    /// the launcher's own ids.
    pub identity: Option<Identity>,
    /// The slice's limits record, usage ledger and shim at their fixed
    /// place, and other slices' records hidden ([`slicefs`]); needs a
    /// mount namespace, so it makes one.
    pub slice_files: Option<slicefs::SliceFiles>,
    /// Bind mounts a CDI spec asks for, made before the slice's files
    /// (which they cannot cover: those are mounted over them).
    pub binds: Vec<slicefs::Bind>,
    /// Files and directories every slice loads, bound read-only over
    /// themselves ([`crate::loaded::protected_paths`]); canonical paths.
    pub protected: Vec<std::path::PathBuf>,
    /// `--read-only-root`: every mount of the host read-only in the
    /// slice but these directories (canonical) and the slice's own
    /// mounts ([`readonly::read_only_root`]).
    pub read_only_root: Option<Vec<std::path::PathBuf>>,
}

impl SandboxPlan {
    /// Whether the child makes a mount namespace: for the GPU layers, the
    /// slice's files, the PID namespace's `/proc`, or a read-only `/sys`.
    pub fn mount_namespace(&self) -> bool {
        self.private_dev.is_some()
            || self.params_overlay.is_some()
            || !self.masked_gpus.is_empty()
            || self.slice_files.is_some()
            || !self.binds.is_empty()
            || self.pid_namespace
            || self.privileges.confined()
    }
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
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
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
        relay::RELAYED.iter().for_each(|s| signals.add(*s));
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
    launch_watched(signals, plan, slice_id, cmd, None)
}

/// What a caller does at points of a launch (root's enforcer and the
/// driver's memory partitions: `gpuslice run`). Every method runs on the
/// launcher's only thread and must not block for long.
pub trait Hooks {
    /// How often [`Hooks::tick`] runs while the child runs (None: never).
    fn tick_every(&self) -> Option<std::time::Duration> {
        None
    }
    /// Called every [`Hooks::tick_every`] while the launcher waits for the
    /// child, between signals relayed and host-pid requests answered.
    fn tick(&mut self) {}
    /// The slice's cgroup `dir` exists and is empty: before the fork, so
    /// before any process of the slice runs.
    fn cgroup_made(&mut self, _dir: &Path) {}
    /// Every process of the slice is gone; the cgroup `dir` is removed next.
    fn cgroup_ending(&mut self, _dir: &Path) {}
    /// A dead launcher's empty slice cgroup `dir` is removed next.
    fn reaping(&mut self, _dir: &Path) {}
}

/// [`launch`], with `hooks` called at their points.
pub fn launch_watched<'h>(
    signals: &SignalGuard,
    plan: &SandboxPlan,
    slice_id: &str,
    cmd: &ChildCommand,
    mut hooks: Option<&mut (dyn Hooks + 'h)>,
) -> Result<i32, LaunchError> {
    let cgroup = match &plan.cgroup {
        Some(driver) => {
            match hooks.as_deref_mut() {
                Some(h) => cgroup::reap_stale_with(driver, &mut |dir| h.reaping(dir)),
                None => cgroup::reap_stale(driver),
            };
            let c = SliceCgroup::create_empty(driver, slice_id)?;
            if let Some(h) = hooks.as_deref_mut() {
                h.cgroup_made(c.path());
            }
            Some(c)
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
    // Listening before the fork: the child binds it into the slice.
    let resolver = match &plan.slice_files {
        Some(f) => {
            Some(
                hostpid::Resolver::bind(&f.hostpid).map_err(|source| LaunchError::Sys {
                    what: "listening for host-pid requests",
                    source,
                })?,
            )
        }
        None => None,
    };
    mark("cgroup-made");
    let (err_rx, err_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys("pipe"))?;
    // The device filter goes on while the child builds its namespace: the
    // child execs only once a byte comes through here (~0.1 ms of BPF
    // verifying off every launch on the H200).
    let (go_rx, go_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys("pipe"))?;
    // The seccomp filter comes through here: compiled while the child
    // builds its mounts, installed by whoever execs the command.
    let (filters_rx, filters_tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys("pipe"))?;
    // The host /dev's survey comes through here: walked by the launcher
    // while the child makes its namespaces (see devfs::mount_private_dev).
    let (survey_rx, survey_tx) = if plan.private_dev == Some(NodeMode::Whiteout) {
        let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys("pipe"))?;
        (Some(rx), Some(tx))
    } else {
        (None, None)
    };
    if plan.pid_namespace {
        // The next child of this process is PID 1 of a new namespace. The
        // launcher forks once and starts no thread after this (the kernel
        // refuses new threads across a pending PID namespace).
        unshare(CloneFlags::CLONE_NEWPID).map_err(sys("unshare(pid namespace)"))?;
    }

    // SAFETY: the child runs ordinary Rust code until exec. gpuslice run
    // starts no threads of its own (the clone3 path checks there is none);
    // if NVML did, glibc's fork handlers leave malloc and stdio usable in
    // the child, and the child calls nothing else another thread could
    // hold a lock in.
    let (forked, procs) = unsafe { fork_child(cgroup_dir.as_ref(), procs) }?;
    let child = match forked {
        Forked::Child => {
            mark("c-start");
            drop((err_rx, go_tx, filters_tx, survey_tx));
            let pipes = ChildPipes {
                go: go_rx,
                filters: filters_rx,
                survey: survey_rx,
            };
            let (code, err) = child_main(plan, procs, signals, pipes, cmd).unwrap_err();
            let mut tx = File::from(err_tx);
            let _ = tx.write_all(format!("{code} {err}").as_bytes());
            // SAFETY: _exit skips atexit handlers and destructors of the
            // parent's state that this forked copy must not run.
            unsafe { libc::_exit(code) }
        }
        Forked::Parent(child) => child,
    };
    mark("forked");
    drop((err_tx, procs, go_rx, filters_rx, survey_rx));
    // While the child builds its namespaces, in the order it needs them:
    // the seccomp filter (the command's process installs it first), the
    // survey (the init's private /dev), the device filter (before exec).
    let prepared = seccomp_filters(plan).and_then(|filters| {
        let _ = File::from(filters_tx).write_all(&seccomp::encode(&filters));
        if let Some(tx) = survey_tx {
            send_survey(plan, tx);
        }
        match &cgroup {
            Some(c) => Ok(c.apply(&plan.policy)?),
            None => Ok(()),
        }
    });
    if let Err(e) = prepared {
        // The child never execs: it is waiting for the byte.
        let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
        let _ = waitpid(child, None);
        return Err(e); // the cgroup is removed on drop
    }
    let _ = File::from(go_tx).write_all(b"1");
    mark("filter-on");

    let setup_error = read_to_end(err_rx);
    let code = wait_relaying(
        child,
        &signals.signals,
        resolver.as_ref(),
        hooks.as_deref_mut(),
    );
    mark("child-exited");
    drop(resolver);
    if let Some(c) = cgroup {
        // Without a PID namespace (or with --privileged) a process the
        // command left behind is still running in the slice.
        match c.kill_remaining() {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                slice = slice_id,
                "killed {n} process(es) left in the slice after its command exited"
            ),
            Err(e) => tracing::warn!(slice = slice_id, "{e}"),
        }
        if let Some(h) = hooks {
            h.cgroup_ending(c.path());
        }
        if let Err(e) = c.remove() {
            tracing::warn!("{e}");
        }
        mark("cgroup-removed");
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

/// The seccomp filter the command installs (none for `--privileged`).
fn seccomp_filters(plan: &SandboxPlan) -> Result<Vec<seccomp::BpfProgram>, LaunchError> {
    Ok(if plan.privileges.confined() {
        seccomp::compile()?
    } else {
        vec![]
    })
}

/// Walks the host `/dev` for the child's overlay and sends what it found.
/// On an error nothing is sent, and the child walks `/dev` itself (and
/// reports the error if it has it too).
fn send_survey(plan: &SandboxPlan, to: OwnedFd) {
    match devfs::Survey::of(&plan.root.dev(), &plan.policy) {
        Ok(survey) => {
            let _ = File::from(to).write_all(&survey.encode());
        }
        Err(e) => tracing::debug!("surveying /dev for the child: {e}"),
    }
}

/// The pipes the child reads from the launcher.
struct ChildPipes {
    /// A byte once the device filter is on.
    go: OwnedFd,
    /// The seccomp filter ([`seccomp::encode`]).
    filters: OwnedFd,
    /// The host `/dev`'s survey ([`devfs::Survey::encode`]), when the
    /// private `/dev` is an overlay.
    survey: Option<OwnedFd>,
}

/// The launcher's survey of `/dev`, or None (the child then makes its own).
fn receive_survey(from: Option<OwnedFd>) -> Option<devfs::Survey> {
    let mut bytes = Vec::new();
    File::from(from?).read_to_end(&mut bytes).ok()?;
    devfs::Survey::decode(&bytes)
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

/// Child side: the steps of the module docs. Returns only on failure,
/// with the exit code and a one-line reason (for the init: never).
fn child_main(
    plan: &SandboxPlan,
    procs: Option<File>,
    signals: &SignalGuard,
    pipes: ChildPipes,
    cmd: &ChildCommand,
) -> Result<std::convert::Infallible, (i32, String)> {
    if plan.pid_namespace {
        return init_main(plan, procs, signals, pipes, cmd);
    }
    let ChildPipes {
        go,
        filters,
        survey,
    } = pipes;
    setup_child(plan, procs, survey).map_err(setup_failed)?;
    mark("c-mounted");
    wait_for(go)?;
    mark("c-go");
    let filters = receive_filters(plan, filters).map_err(setup_failed)?;
    confine(plan, &filters).map_err(setup_failed)?;
    mark("c-confined");
    refresh_cwd(plan);
    exec_command(cmd, &signals.old_mask)
}

/// Why the child could not build or enter the sandbox; the launcher gets
/// it as one line (with [`EXIT_LAUNCH_FAILED`]).
#[derive(Debug, thiserror::Error)]
enum SetupError {
    /// A system call, named.
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        #[source]
        source: nix::Error,
    },
    /// An I/O step, named.
    #[error("{what}: {source}")]
    Step {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// A mount or a file the sandbox needs (the error names it).
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    #[error(transparent)]
    Fds(#[from] fds::FdError),
    #[error("switching to uid {uid}: {source}")]
    Identity {
        uid: u32,
        #[source]
        source: identity::IdentityError,
    },
    #[error("the launcher exited during the user switch")]
    LauncherGone,
}

impl SetupError {
    fn sys(what: &'static str) -> impl FnOnce(nix::Error) -> SetupError {
        move |source| SetupError::Sys { what, source }
    }

    fn step(what: &'static str) -> impl FnOnce(io::Error) -> SetupError {
        move |source| SetupError::Step { what, source }
    }
}

/// The launcher's side of a [`SetupError`]: the exit code and the line.
fn setup_failed(e: SetupError) -> (i32, String) {
    (EXIT_LAUNCH_FAILED, e.to_string())
}

/// The seccomp filter the launcher compiled: all of it, and for a
/// confined command at least one program (a launcher gone before sending
/// it must not leave the command unfiltered).
fn receive_filters(
    plan: &SandboxPlan,
    from: OwnedFd,
) -> Result<Vec<seccomp::BpfProgram>, SetupError> {
    let mut bytes = Vec::new();
    File::from(from)
        .read_to_end(&mut bytes)
        .map_err(SetupError::step("reading the seccomp filter"))?;
    let filters = seccomp::decode(&bytes)?;
    if plan.privileges.confined() && filters.is_empty() {
        return Err(seccomp::SeccompError::Transfer.into());
    }
    Ok(filters)
}

/// Blocks until the launcher's byte comes: the device filter is on.
fn wait_for(go: OwnedFd) -> Result<(), (i32, String)> {
    let mut byte = [0u8; 1];
    if !matches!(File::from(go).read(&mut byte), Ok(1)) {
        // The launcher could not put the device filter on; it says why.
        return Err((EXIT_LAUNCH_FAILED, String::new()));
    }
    Ok(())
}

/// The child as PID 1 of the slice's namespace. The command's process is
/// forked as soon as the namespaces exist, and confines itself
/// (capabilities, the user switch, seccomp, whose install is the slowest
/// step of a launch) while the init builds the mounts in the namespace
/// they share; it execs once the init says the mounts and the launcher's
/// device filter are in place. The init then supervises it.
fn init_main(
    plan: &SandboxPlan,
    procs: Option<File>,
    signals: &SignalGuard,
    pipes: ChildPipes,
    cmd: &ChildCommand,
) -> Result<std::convert::Infallible, (i32, String)> {
    let failed = |e: String| (EXIT_LAUNCH_FAILED, e);
    let ChildPipes {
        go,
        filters,
        survey,
    } = pipes;
    join_cgroup(procs).map_err(setup_failed)?;
    unshare_namespaces(plan).map_err(setup_failed)?;
    let (ready_rx, ready_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| failed(format!("pipe: {e}")))?;
    // SAFETY: this process is single-threaded (the launcher starts no
    // thread and this is its forked child), so the command's process may
    // run ordinary Rust code until it execs.
    let command = match unsafe { fork() }.map_err(|e| failed(format!("fork: {e}")))? {
        ForkResult::Child => {
            drop((ready_tx, go, survey));
            // An error goes the launcher's way, as the init's would.
            return command_main(plan, ready_rx, cmd, &signals.old_mask, filters);
        }
        ForkResult::Parent { child } => child,
    };
    drop((ready_rx, filters));
    build_mounts(plan, survey).map_err(setup_failed)?;
    mark("c-mounted");
    wait_for(go)?;
    mark("c-go");
    // Before the command runs: /proc/1 becomes root's and ptrace-protected.
    let _ = pidns::undumpable();
    // A command that already failed to confine itself has said why.
    let _ = File::from(ready_tx).write_all(b"1");
    // The init confines itself as the command did, off the launch's path
    // now: it holds nothing the command could use, but stays no stronger.
    let own = if plan.privileges.confined() {
        seccomp::compile().map_err(SetupError::from)
    } else {
        Ok(vec![])
    };
    if let Err(e) = own.and_then(|own| confine(plan, &own)) {
        let _ = nix::sys::signal::kill(command, Signal::SIGKILL);
        return Err(failed(format!("confining the slice's init: {e}")));
    }
    // The launcher reads the error pipe to its end: the init's copy must
    // go (the command's closes on exec), with every other descriptor the
    // init does not need.
    let _ = fds::close_all_beyond_stdio();
    let code = pidns::supervise(command, &signals.signals);
    mark("c-reaped");
    // SAFETY: as the caller's _exit: nothing of the parent's state runs.
    unsafe { libc::_exit(code) }
}

/// The command's process under an init: steps 5–9, then exec once the
/// init says the slice is ready.
fn command_main(
    plan: &SandboxPlan,
    ready: OwnedFd,
    cmd: &ChildCommand,
    old_mask: &SigSet,
    filters: OwnedFd,
) -> Result<std::convert::Infallible, (i32, String)> {
    // Dies with the init (which dies with the launcher).
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(SetupError::sys("prctl"))
        .map_err(setup_failed)?;
    let filters = receive_filters(plan, filters).map_err(setup_failed)?;
    confine(plan, &filters).map_err(setup_failed)?;
    mark("c2-confined");
    let mut byte = [0u8; 1];
    if !matches!(File::from(ready).read(&mut byte), Ok(1)) {
        // The init failed (and said why) or is gone.
        // SAFETY: _exit in a forked child.
        unsafe { libc::_exit(EXIT_LAUNCH_FAILED) }
    }
    refresh_cwd(plan);
    exec_command(cmd, old_mask)
}

/// Under a read-only root the working directory may now be a mount of
/// its own (bound writable over itself) that the process's old working
/// directory, on the mount below, does not reach: enter it again by name.
fn refresh_cwd(plan: &SandboxPlan) {
    if plan.read_only_root.is_some() {
        if let Ok(dir) = std::env::current_dir() {
            let _ = std::env::set_current_dir(dir);
        }
    }
}

/// Steps 5–9: descriptors, capabilities around the user switch,
/// no_new_privs, seccomp.
fn confine(plan: &SandboxPlan, filters: &[seccomp::BpfProgram]) -> Result<(), SetupError> {
    let kept = plan.privileges.kept();
    if plan.privileges.confined() {
        fds::close_on_exec_beyond(plan.preserve_fds)?;
    }
    if let Some(kept) = kept {
        privileges::limit_bounding(kept)?;
    }
    if let Some(id) = &plan.identity {
        switch_identity(id)?;
    }
    if let Some(kept) = kept {
        privileges::drop_to(kept)?;
    }
    mark("c-caps");
    if plan.privileges.confined() {
        seccomp::install(filters)?;
    }
    Ok(())
}

/// Become `id`, and die with the launcher again: a change of credentials
/// clears the parent-death signal set in step 1.
fn switch_identity(id: &Identity) -> Result<(), SetupError> {
    let parent = nix::unistd::getppid();
    identity::switch(id).map_err(|source| SetupError::Identity {
        uid: id.uid,
        source,
    })?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(SetupError::sys("prctl"))?;
    if nix::unistd::getppid() != parent {
        return Err(SetupError::LauncherGone);
    }
    Ok(())
}

/// The exit code and message of a command that could not be executed:
/// 127 when it does not exist, 126 otherwise (as a shell).
fn exec_failed(cmd: &ChildCommand, err: nix::Error) -> (i32, String) {
    let code = match err {
        nix::Error::ENOENT => 127,
        _ => 126,
    };
    let name = cmd.argv[0].to_string_lossy();
    (
        code,
        format!("cannot execute {name}: {}", io::Error::from(err)),
    )
}

/// The command's side: default SIGPIPE, the caller's signal mask, exec.
fn exec_command(
    cmd: &ChildCommand,
    old_mask: &SigSet,
) -> Result<std::convert::Infallible, (i32, String)> {
    // The launcher ignores SIGPIPE ([`SignalGuard::block`]) and exec keeps
    // an ignored signal ignored: without this, `gpuslice run -- yes | head`
    // would leave `yes` writing into a closed pipe (std's Command resets
    // it the same way).
    // SAFETY: SIG_DFL installs no handler; single-threaded child.
    unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) }
        .map_err(|e| (EXIT_LAUNCH_FAILED, format!("resetting SIGPIPE: {e}")))?;
    old_mask.thread_set_mask().map_err(|e| {
        (
            EXIT_LAUNCH_FAILED,
            format!("restoring the signal mask: {e}"),
        )
    })?;
    let err = nix::unistd::execvpe(&cmd.argv[0], &cmd.argv, &cmd.env).unwrap_err();
    Err(exec_failed(cmd, err))
}

/// Steps 1–3.
fn setup_child(
    plan: &SandboxPlan,
    procs: Option<File>,
    survey: Option<OwnedFd>,
) -> Result<(), SetupError> {
    join_cgroup(procs)?;
    if plan.mount_namespace() {
        enter_mount_namespace(plan, survey)?;
    }
    Ok(())
}

/// Step 1, after making this process die with the launcher: a killed
/// launcher must not leave a child running unsupervised in a cgroup nobody
/// removes (with a PID namespace, the whole namespace goes with it).
fn join_cgroup(procs: Option<File>) -> Result<(), SetupError> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(SetupError::sys("prctl"))?;
    if let Some(procs) = procs {
        cgroup::enter_self(&procs).map_err(SetupError::step("joining the slice cgroup"))?;
    }
    Ok(())
}

fn enter_mount_namespace(plan: &SandboxPlan, survey: Option<OwnedFd>) -> Result<(), SetupError> {
    unshare_namespaces(plan)?;
    build_mounts(plan, survey)
}

/// Step 2: the mount namespace (and cgroup and user namespaces).
fn unshare_namespaces(plan: &SandboxPlan) -> Result<(), SetupError> {
    let mut flags = CloneFlags::CLONE_NEWNS;
    if plan.user_namespace {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    if plan.privileges.confined() {
        // Rooted at the slice cgroup the child is in by now: /proc/self/cgroup
        // says `/`, and (with nsdelegate) no cgroup outside is writable.
        flags |= CloneFlags::CLONE_NEWCGROUP;
    }
    unshare(flags).map_err(SetupError::sys("unshare(mount namespace)"))?;
    mark("c-unshared");
    if plan.user_namespace {
        crate::userns::map_self()?;
    }
    Ok(())
}

/// Step 3: the mounts, in the namespace [`unshare_namespaces`] made.
fn build_mounts(plan: &SandboxPlan, survey: Option<OwnedFd>) -> Result<(), SetupError> {
    // Private, both ways: our mounts must not propagate back to the host,
    // and no mount the host makes after the launch (a procfs, a cgroup2,
    // a bpffs…) may enter the slice past the seal below, which sees only
    // the mounts there are now (a slave would receive them). The price:
    // a host mount made later (autofs, a new NFS share) is not seen in a
    // running slice, and one the host unmounts stays mounted in it until
    // the slice ends. Made here, not with the namespace, so the command's
    // process (which has no mounts to make) is forked a step earlier: it
    // shares the namespace and execs only once the init is done.
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(SetupError::sys("making / a private mount"))?;
    // The mirror must get the host's exact modes; the child gets our umask back.
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::empty());

    // First: the driver's procfs overlays below go on the slice's /proc.
    if plan.pid_namespace {
        pidns::mount_proc()?;
        mark("c-proc");
    }
    if plan.privileges.confined() {
        // The slice's /proc, whichever it is (the host's with --pid host).
        readonly::kernel_paths()?;
    }
    let dev = plan.root.dev();
    if let Some(nodes) = plan.private_dev {
        // The root's /dev itself must not be a link out of it.
        plan.root.open_beneath(
            "dev",
            nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY,
        )?;
        // No logging here: a forked child must not take the stderr lock
        // another thread of the parent may have held at fork.
        let surveyed = receive_survey(survey);
        devfs::mount_private_dev(&dev, &plan.policy, nodes, surveyed)?;
        mark("c-dev");
    }
    if let Some(params) = &plan.params_overlay {
        // Stage on the private /dev's tmpfs when there is one; else on /dev/shm.
        let staging = if plan.private_dev.is_some() {
            dev.clone()
        } else {
            "/dev/shm".into()
        };
        driver_proc::overlay_params(&plan.root, params, &staging)?;
    }
    driver_proc::mask_gpu_dirs(&plan.root, &plan.masked_gpus)?;
    mark("c-procfs");
    for b in &plan.binds {
        b.mount()?;
    }
    for p in &plan.protected {
        match readonly::read_only_bind(p) {
            // Gone since the launcher listed it: nothing left to change.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    mark("c-protected");
    if let Some(files) = &plan.slice_files {
        slicefs::mount_slice_files(files)?;
    }
    if plan.privileges.confined() {
        read_only_sys(plan)?;
        if let Some(writable) = &plan.read_only_root {
            let mut writable = writable.clone();
            let mut keep: Vec<&Path> = vec![Path::new("/proc"), Path::new("/dev")];
            let dev = plan.root.dev();
            keep.push(&dev);
            if let Some(f) = &plan.slice_files {
                keep.push(&f.dir);
                // The boards, which the slice's shim writes (their root-written
                // shares below stay read-only mounts of their own).
                writable.extend(f.visible.iter().filter(|v| v.is_dir()).cloned());
            }
            keep.extend(
                plan.binds
                    .iter()
                    .filter(|b| !b.read_only)
                    .map(|b| b.target.as_path()),
            );
            readonly::read_only_root(&writable, &keep)?;
        }
        // Last: every other pseudo-filesystem mount there is by now.
        readonly::seal_pseudo_filesystems(Path::new("/proc"))?;
    }
    nix::sys::stat::umask(umask);
    Ok(())
}

/// `/sys` read-only with everything below it, and the cgroup hierarchy in
/// use when it is mounted elsewhere.
fn read_only_sys(plan: &SandboxPlan) -> io::Result<()> {
    let sys = Path::new("/sys");
    readonly::read_only_tree(sys)?;
    match &plan.cgroup {
        Some(driver) if !driver.root().starts_with(sys) => readonly::read_only_tree(driver.root()),
        _ => Ok(()),
    }
}

/// Wait for `child`, relaying signals other processes send us and
/// answering the slice's host-pid requests. The child's exit is watched
/// through a pidfd, so it cannot be missed even if a SIGCHLD went
/// elsewhere.
fn wait_relaying<'h>(
    child: Pid,
    signals: &SigSet,
    resolver: Option<&hostpid::Resolver>,
    mut hooks: Option<&mut (dyn Hooks + 'h)>,
) -> Result<i32, LaunchError> {
    let every = hooks.as_ref().and_then(|h| h.tick_every());
    let mut next_tick = every.map(|e| std::time::Instant::now() + e);
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
        let mut fds = vec![
            PollFd::new(pidfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
        ];
        if let Some(r) = resolver {
            fds.push(PollFd::new(r.as_fd(), PollFlags::POLLIN));
        }
        let timeout = match next_tick {
            Some(t) => {
                let ms = t
                    .saturating_duration_since(std::time::Instant::now())
                    .as_millis();
                PollTimeout::try_from(ms.min(60_000) as i32).unwrap_or(PollTimeout::ZERO)
            }
            None => PollTimeout::NONE,
        };
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::Error::EINTR) => {}
            Err(e) => return Err(sys("poll")(e)),
        }
        if let (Some(t), Some(e), Some(h)) = (next_tick, every, hooks.as_deref_mut()) {
            if std::time::Instant::now() >= t {
                h.tick();
                next_tick = Some(std::time::Instant::now() + e);
            }
        }
        let requests = fds
            .get(2)
            .and_then(|f| f.revents())
            .is_some_and(|r| !r.is_empty());
        relay::relay_pending(&sfd, child);
        if let (true, Some(r)) = (requests, resolver) {
            r.serve();
        }
    }
}
