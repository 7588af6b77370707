//! The seccomp filter of a confined command, built with libseccomp (the
//! `libseccomp` crate over the C library, linked statically).
//!
//! A deny list (the rest is allowed), as docker's default profile is in
//! effect for these calls: each denied call returns EPERM, so a program
//! that probes (a mount helper, an unshare check) fails cleanly instead
//! of being killed. It stops what the dropped capabilities alone would not
//! stop where a capability is not checked or is not ours to drop:
//! namespace calls (unshare/setns/clone with namespace flags: a user
//! namespace needs no capability and hands out all of them inside),
//! ptrace and `process_vm_*` (the same uid needs no capability), the new
//! mount API, `open_by_handle_at`, keyrings, `perf_event_open`, `bpf`,
//! module, kexec, reboot, swap, `acct`, `userfaultfd`, io_uring (which
//! would run calls this filter never sees).
//!
//! `clone3` gets ENOSYS, as under docker: its flags are in memory a filter
//! cannot read, and ENOSYS makes glibc fall back to `clone`, whose flags
//! the filter checks.
//!
//! Only the native ABI passes (a call made through another, such as
//! i386's `int 0x80`, kills the thread; libseccomp's x86-64 filter also
//! refuses x32 numbers) — see docs/security.md.
//!
//! One program, its calls in a binary tree (libseccomp's
//! `SCMP_FLTATR_CTL_OPTIMIZE` level 2): when a filter is installed the
//! kernel runs it for every system call number to build its action cache,
//! so an install costs about the number of calls times the length of the
//! path through the filter. seccompiler's linear chain of ~50 calls (two
//! programs, 324 + 10 instructions) made the install the slowest step on
//! the command's way to exec; bench/README.md (issue 15) has the figures.
//!
//! The filter is compiled in the launcher, after the fork, while the
//! child makes its namespaces, and installed by the command's process as
//! its last step before exec (after the user switch and the capability
//! drop, which use some of these calls).

use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};
use std::io::Read;

/// A classic BPF program, as the kernel takes it.
pub type BpfProgram = Vec<libc::sock_filter>;

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the seccomp filter with libseccomp: {0}")]
    Build(#[from] libseccomp::error::SeccompError),
    #[error("exporting the seccomp filter: {0}")]
    Export(std::io::Error),
    #[error("installing the seccomp filter: {0}")]
    Install(std::io::Error),
    #[error("the seccomp filter did not arrive whole from the launcher")]
    Transfer,
}

/// Calls a confined command gets EPERM for, whatever their arguments.
const DENIED: &[libc::c_long] = &[
    // Mounts, old and new API: the private /dev and the params overlay
    // stay in place, no new devtmpfs or procfs.
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    // Other processes.
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    // Namespaces.
    libc::SYS_unshare,
    libc::SYS_setns,
    // The device filter and the kernel.
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_fanotify_init,
    libc::SYS_userfaultfd,
    // Files by handle: around the mount table and the private /dev.
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    // Keyrings are not namespaced.
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    // io_uring runs calls this filter does not see.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_uselib,
];

/// Every `CLONE_NEW*` flag: a `clone` with any of them is denied.
const NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWCGROUP,
    0x80, // CLONE_NEWTIME
];

/// The confined command's filter: the denied calls get EPERM, `clone` with
/// a namespace flag EPERM, `clone3` ENOSYS, everything else passes. One
/// program (returned in a list: the pipe's format carries any number).
pub fn compile() -> Result<Vec<BpfProgram>, SeccompError> {
    let mut ctx = ScmpFilterContext::new(ScmpAction::Allow)?;
    ctx.set_ctl_optimize(2)?;
    let eperm = ScmpAction::Errno(libc::EPERM);
    for &nr in DENIED {
        ctx.add_rule(eperm, syscall(nr))?;
    }
    // Rules of a call are or-ed: one per namespace flag in clone's first
    // argument (the flags on every architecture we build for).
    for &flag in NAMESPACE_FLAGS {
        let flag = flag as u64;
        let cmp = ScmpArgCompare::new(0, ScmpCompareOp::MaskedEqual(flag), flag);
        ctx.add_rule_conditional(eperm, syscall(libc::SYS_clone), &[cmp])?;
    }
    ctx.add_rule(ScmpAction::Errno(libc::ENOSYS), syscall(libc::SYS_clone3))?;
    Ok(vec![export(&ctx)?])
}

fn syscall(nr: libc::c_long) -> ScmpSyscall {
    // System call numbers fit an i32 on every architecture.
    ScmpSyscall::from(nr as i32)
}

/// The program libseccomp generated, read back through a pipe
/// (`seccomp_export_bpf`; the in-memory export needs libseccomp 2.6).
fn export(ctx: &ScmpFilterContext) -> Result<BpfProgram, SeccompError> {
    let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| SeccompError::Export(e.into()))?;
    // A filter of a few hundred instructions fits the pipe's buffer.
    ctx.export_bpf(&tx)?;
    drop(tx);
    let mut bytes = Vec::new();
    std::fs::File::from(rx)
        .read_to_end(&mut bytes)
        .map_err(SeccompError::Export)?;
    // Native-endian `struct sock_filter`s: code u16, jt u8, jf u8, k u32.
    Ok(bytes
        .chunks_exact(8)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect())
}

/// `filters` as bytes for the pipe from the launcher to its child, which
/// installs what [`compile`] made in the launcher while the child built its
/// mounts: per program a little-endian `u32` length, then its instructions
/// (code, jt, jf, k).
pub fn encode(filters: &[BpfProgram]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in filters {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        for i in f {
            out.extend_from_slice(&i.code.to_le_bytes());
            out.extend_from_slice(&[i.jt, i.jf]);
            out.extend_from_slice(&i.k.to_le_bytes());
        }
    }
    out
}

/// The programs [`encode`] wrote; an error for anything cut short.
pub fn decode(mut bytes: &[u8]) -> Result<Vec<BpfProgram>, SeccompError> {
    let mut filters = Vec::new();
    while !bytes.is_empty() {
        let (len, rest) = bytes
            .split_first_chunk::<4>()
            .ok_or(SeccompError::Transfer)?;
        let len = u32::from_le_bytes(*len) as usize;
        let body = rest.get(..len * 8).ok_or(SeccompError::Transfer)?;
        filters.push(
            body.chunks_exact(8)
                .map(|c| libc::sock_filter {
                    code: u16::from_le_bytes([c[0], c[1]]),
                    jt: c[2],
                    jf: c[3],
                    k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
                })
                .collect(),
        );
        bytes = &rest[len * 8..];
    }
    Ok(filters)
}

/// Installs `filters` on the calling thread (sets no_new_privs first, as
/// the kernel requires without CAP_SYS_ADMIN). The child is single-threaded.
pub fn install(filters: &[BpfProgram]) -> Result<(), SeccompError> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| SeccompError::Install(e.into()))?;
    for f in filters {
        let prog = libc::sock_fprog {
            len: u16::try_from(f.len()).map_err(|_| SeccompError::Transfer)?,
            filter: f.as_ptr().cast_mut(),
        };
        // SAFETY: `prog` points at `f`'s instructions, alive for the call;
        // the kernel copies the program and checks it before installing.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &prog as *const libc::sock_fprog,
            )
        };
        if rc != 0 {
            return Err(SeccompError::Install(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a forked child: install the filters, then try `f`; the child's
    /// exit code is the errno it got (0 for success).
    fn errno_under_filter(f: fn() -> libc::c_long) -> i32 {
        let filters = compile().unwrap();
        // SAFETY: the child only makes raw syscalls and _exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = match install(&filters) {
                    Ok(()) if f() == -1 => nix::errno::Errno::last_raw(),
                    Ok(()) => 0,
                    Err(_) => 255,
                };
                // SAFETY: _exit in the forked child.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                match nix::sys::wait::waitpid(child, None).unwrap() {
                    nix::sys::wait::WaitStatus::Exited(_, c) => c,
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn the_filters_cross_the_pipe_unchanged_and_a_cut_one_is_refused() {
        let filters = compile().unwrap();
        let bytes = encode(&filters);
        let back = decode(&bytes).unwrap();
        assert_eq!(back.len(), filters.len());
        for (a, b) in back.iter().zip(&filters) {
            assert_eq!(a.len(), b.len());
            assert!(a
                .iter()
                .zip(b)
                .all(|(x, y)| (x.code, x.jt, x.jf, x.k) == (y.code, y.jt, y.jf, y.k)));
        }
        assert!(decode(&bytes[..bytes.len() - 3]).is_err());
        assert!(decode(&bytes[..2]).is_err());
        assert!(decode(&[]).unwrap().is_empty());
    }

    #[test]
    fn namespace_calls_are_denied_and_a_plain_fork_is_not() {
        fn unshare_user() -> libc::c_long {
            // SAFETY: unshare takes a flag word.
            libc::c_long::from(unsafe { libc::unshare(libc::CLONE_NEWUSER) })
        }
        fn clone3_null() -> libc::c_long {
            // SAFETY: a null clone_args pointer is refused by the kernel
            // (EFAULT) or the filter (ENOSYS); nothing is written.
            unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) }
        }
        fn umount_nonexistent() -> libc::c_long {
            // SAFETY: a NUL-terminated path and a flag word.
            unsafe { libc::syscall(libc::SYS_umount2, c"/nonexistent".as_ptr(), 0) }
        }
        fn getpid_ok() -> libc::c_long {
            // SAFETY: getpid takes nothing and cannot fail.
            let pid = unsafe { libc::syscall(libc::SYS_getpid) };
            if pid > 0 {
                0
            } else {
                -1
            }
        }
        assert_eq!(errno_under_filter(unshare_user), libc::EPERM);
        assert_eq!(errno_under_filter(clone3_null), libc::ENOSYS);
        assert_eq!(errno_under_filter(umount_nonexistent), libc::EPERM);
        // getpid is allowed: the filter is a deny list.
        assert_eq!(errno_under_filter(getpid_ok), 0);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_numbers_are_refused_even_where_the_kernel_lacks_x32() {
        let filters = compile().unwrap();
        // SAFETY: the child only makes raw syscalls and _exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                if install(&filters).is_err() {
                    // SAFETY: _exit in the forked child.
                    unsafe { libc::_exit(255) }
                }
                // getpid under the x32 numbering: unfiltered, the kernel
                // would answer ENOSYS (no x32) or run it.
                // SAFETY: getpid takes nothing.
                unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
                // SAFETY: _exit in the forked child.
                unsafe { libc::_exit(0) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(
                    status,
                    nix::sys::wait::WaitStatus::Signaled(
                        child,
                        nix::sys::signal::Signal::SIGSYS,
                        false
                    ),
                    "an x32 call must be killed by the filter"
                );
            }
        }
    }
}
