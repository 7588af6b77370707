//! `--strict`: the child cannot undo layers 1–3 even as root.
//!
//! Without CAP_SYS_ADMIN it cannot unmount the private /dev or the params
//! overlay, nor load BPF or move itself to another cgroup's namespace;
//! without CAP_MKNOD it cannot re-create a hidden node; without
//! CAP_SYS_PTRACE it cannot borrow a GPU fd from a host process; without
//! CAP_DAC_READ_SEARCH it cannot open_by_handle_at() its way around the
//! mount table. no_new_privs stops a setuid helper (nvidia-modprobe) from
//! getting any of them back.

use caps::{CapSet, Capability};
use std::io;

/// Capabilities that let a root child escape GPU isolation.
pub const DROPPED: &[Capability] = &[
    Capability::CAP_SYS_ADMIN,
    Capability::CAP_MKNOD,
    Capability::CAP_BPF,
    Capability::CAP_PERFMON,
    Capability::CAP_SYS_MODULE,
    Capability::CAP_SYS_RAWIO,
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_SYS_BOOT,
];

/// Drop [`DROPPED`] from every set (bounding first) and set no_new_privs.
pub fn lock_down() -> io::Result<()> {
    // After a switch to a non-root user (`identity::switch`) the permitted
    // and effective sets are already empty and the bounding set cannot be
    // changed (that takes CAP_SETPCAP); with no_new_privs, set below, no
    // exec can raise a capability from it.
    let may_bound =
        caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false);
    for &cap in DROPPED {
        // A capability this kernel does not know is one nobody can hold.
        if may_bound && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap).map_err(other)?;
        }
        for set in [
            CapSet::Ambient,
            CapSet::Inheritable,
            CapSet::Effective,
            CapSet::Permitted,
        ] {
            if caps::has_cap(None, set, cap).unwrap_or(false) {
                caps::drop(None, set, cap).map_err(other)?;
            }
        }
    }
    nix::sys::prctl::set_no_new_privs().map_err(io::Error::from)
}

fn other(e: caps::errors::CapsError) -> io::Error {
    io::Error::other(format!("dropping capabilities: {e}"))
}
