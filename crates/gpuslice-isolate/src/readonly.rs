//! What the slice sees of the host's kernel interfaces, read-only: `/sys`
//! with every mount below it (the cgroup filesystems among them, so no
//! process of the slice can move itself or another out of its cgroup by
//! writing `cgroup.procs`, nor detach, nor write a PCI device's
//! `remove`/`reset`), and `/proc/sys` and `/proc/sysrq-trigger` of the
//! slice's procfs (`kernel.core_pattern` and friends are the host's).
//!
//! Flags set on mounts of the slice's own mount namespace: the host's
//! mounts are not touched, and a command without CAP_SYS_ADMIN (and with
//! the seccomp filter's ban on mount calls) cannot clear them.

use crate::devfs::ctx;
use nix::mount::{mount, MsFlags};
use std::io;
use std::path::Path;

/// `struct mount_attr` (include/uapi/linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// Makes the mount at `mount_point` and every mount below it read-only:
/// one `mount_setattr(2)` (Linux 5.12) whatever the number of mounts (a
/// hybrid cgroup host has a dozen under `/sys/fs/cgroup`).
pub fn read_only_tree(mount_point: &Path) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let path = std::ffi::CString::new(mount_point.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid NUL-terminated path and a mount_attr of the size passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        let hint = if e.raw_os_error() == Some(libc::ENOSYS) {
            " (mount_setattr needs Linux 5.12; or use --privileged, which is no boundary)"
        } else {
            ""
        };
        return Err(ctx(
            io::Error::new(e.kind(), format!("{e}{hint}")),
            "make read-only",
            mount_point,
        ));
    }
    Ok(())
}

/// Makes `path` (a file or directory, not necessarily a mount point)
/// read-only: bound onto itself, then remounted read-only.
pub fn read_only_bind(path: &Path) -> io::Result<()> {
    mount(
        Some(path),
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| ctx(e.into(), "bind-mount onto", path))?;
    let ro = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    mount(None::<&str>, path, None::<&str>, ro, None::<&str>)
        .map_err(|e| ctx(e.into(), "remount read-only", path))
}
