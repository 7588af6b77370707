//! What a root command keeps of root: capabilities (every set, bounding
//! included) and no_new_privs.
//!
//! gpuslice gives the command the host's filesystem and network (no rootfs,
//! no network namespace), so the kept set is docker's default *less* what
//! only a container's own network namespace makes harmless, and less
//! CAP_MKNOD (a node the command makes itself is the way around a private
//! `/dev`):
//!
//! | docker keeps      | here | why                                                |
//! |-------------------|------|----------------------------------------------------|
//! | CHOWN, DAC_OVERRIDE, FSETID, FOWNER, SETGID, SETUID, SETPCAP, SETFCAP, KILL, SYS_CHROOT, AUDIT_WRITE | kept | what root tools (su, package managers, chown in build scripts) expect; none reaches a GPU, a cgroup or another slice's process |
//! | MKNOD             | dropped | re-creating a hidden GPU node                   |
//! | NET_RAW           | dropped | the host's network: raw sockets sniff and spoof the host's traffic |
//! | NET_BIND_SERVICE  | dropped | the host's network: squatting the host's ports below 1024 |
//!
//! Everything else (SYS_ADMIN, SYS_PTRACE, SYS_MODULE, BPF, PERFMON,
//! NET_ADMIN, SYS_RAWIO, DAC_READ_SEARCH, SYS_BOOT, SYS_TIME…) is dropped.
//!
//! `--strict` keeps nothing: a root command is uid 0 without any
//! capability (it still owns root-owned files: see docs/security.md).
//! `--privileged` keeps everything and sets nothing: today's full root.

use caps::{CapSet, Capability, CapsHashSet};
use std::io;

/// How much of root the command keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privileges {
    /// Full root, no seccomp filter, no namespaces beyond the GPU layers:
    /// not a boundary.
    Privileged,
    /// [`DEFAULT_KEPT`], no_new_privs, the seccomp filter.
    Default,
    /// No capability, no_new_privs, the seccomp filter.
    Strict,
}

/// The capabilities a root command keeps by default (module docs).
pub const DEFAULT_KEPT: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FSETID,
    Capability::CAP_FOWNER,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETPCAP,
    Capability::CAP_SETFCAP,
    Capability::CAP_KILL,
    Capability::CAP_SYS_CHROOT,
    Capability::CAP_AUDIT_WRITE,
];

impl Privileges {
    /// The capabilities kept; None: all of them (no change).
    pub fn kept(self) -> Option<&'static [Capability]> {
        match self {
            Self::Privileged => None,
            Self::Default => Some(DEFAULT_KEPT),
            Self::Strict => Some(&[]),
        }
    }

    /// Whether the command is confined (capabilities, no_new_privs, seccomp).
    pub fn confined(self) -> bool {
        self != Self::Privileged
    }
}

/// Reduce the bounding set of the calling thread to `kept`, so that no
/// later exec can get the others back. Takes CAP_SETPCAP: call it before a
/// switch to a non-root user, which loses it.
pub fn limit_bounding(kept: &[Capability]) -> io::Result<()> {
    for cap in caps::all() {
        // A capability this kernel does not know is one nobody holds.
        if !kept.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap).map_err(other)?;
        }
    }
    Ok(())
}

/// Reduce the other capability sets of the calling thread to `kept`:
/// ambient and inheritable emptied (nothing is passed on by them),
/// effective and permitted cut to `kept`; and set no_new_privs, so a
/// setuid or file-capability program gains nothing either. Lowering needs
/// no capability, so this also holds after a switch to a non-root user
/// (which has already emptied them).
///
/// Must run after the namespaces and mounts are made (they need
/// CAP_SYS_ADMIN), after [`limit_bounding`] and the user switch
/// (setuid/setgid need their capabilities), before the seccomp filter.
pub fn drop_to(kept: &[Capability]) -> io::Result<()> {
    let kept: CapsHashSet = kept.iter().copied().collect();
    caps::clear(None, CapSet::Ambient).map_err(other)?;
    caps::clear(None, CapSet::Inheritable).map_err(other)?;
    for set in [CapSet::Effective, CapSet::Permitted] {
        let now = caps::read(None, set).map_err(other)?;
        caps::set(None, set, &now.intersection(&kept).copied().collect()).map_err(other)?;
    }
    nix::sys::prctl::set_no_new_privs().map_err(io::Error::from)
}

fn other(e: caps::errors::CapsError) -> io::Error {
    io::Error::other(format!("dropping capabilities: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_keeps_no_capability_that_undoes_the_isolation() {
        for cap in [
            Capability::CAP_SYS_ADMIN,
            Capability::CAP_SYS_PTRACE,
            Capability::CAP_SYS_MODULE,
            Capability::CAP_BPF,
            Capability::CAP_PERFMON,
            Capability::CAP_MKNOD,
            Capability::CAP_NET_ADMIN,
            Capability::CAP_NET_RAW,
            Capability::CAP_SYS_RAWIO,
            Capability::CAP_DAC_READ_SEARCH,
            Capability::CAP_SYS_BOOT,
            Capability::CAP_SYS_TIME,
        ] {
            assert!(!DEFAULT_KEPT.contains(&cap), "{cap}");
        }
        assert_eq!(Privileges::Strict.kept(), Some(&[][..]));
        assert_eq!(Privileges::Privileged.kept(), None);
    }
}
