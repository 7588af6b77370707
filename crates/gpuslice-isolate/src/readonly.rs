//! What the slice sees of the host's kernel interfaces, read-only: `/sys`
//! with every mount below it (the cgroup filesystems among them, so no
//! process of the slice can move itself or another out of its cgroup by
//! writing `cgroup.procs`, nor detach, nor write a PCI device's
//! `remove`/`reset`); in the slice's `/proc`, whichever procfs it is (its
//! own with a PID namespace, the host's with `--pid host`), the paths
//! runc and Docker make read-only or mask ([`READ_ONLY_PATHS`],
//! [`MASKED_PATHS`]: `kernel.core_pattern` and friends are the host's);
//! and every other mount of a kernel pseudo-filesystem the slice's mount
//! namespace holds ([`seal_pseudo_filesystems`]: a second procfs, cgroup
//! or cgroup2 mount, bpffs, debugfs, tracefs, securityfs, binfmt_misc,
//! configfs, efivarfs, pstore, hugetlbfs…), read-only or, for a procfs,
//! masked.
//!
//! Flags set on mounts of the slice's own mount namespace: the host's
//! mounts are not touched, and a command without CAP_SYS_ADMIN (and with
//! the seccomp filter's ban on mount calls) cannot clear them. The
//! namespace is private ([`crate::launcher`]): a mount the host makes
//! after the launch does not enter it, so what was sealed here is all
//! the slice ever holds.

use crate::devfs::ctx;
use nix::mount::{mount, MsFlags};
use std::io;
use std::path::{Path, PathBuf};

/// Made read-only in the slice's `/proc`: runc's and Docker's
/// `ReadonlyPaths` (moby `daemon/pkg/oci/defaults.go`, runc
/// `libcontainer/specconv/example.go`, Kubernetes' `DefaultProcMount`).
pub const READ_ONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Masked in the slice (a file by `/dev/null`, a directory by an empty
/// read-only tmpfs): Docker's `defaultLinuxMaskedPaths` (moby
/// `daemon/pkg/oci/defaults.go`; `/proc/interrupts` and
/// `/sys/devices/virtual/powercap` since GHSA-6fw5-f8r9-fgfm and
/// GHSA-jq35-85cj-fj4p), as Kubernetes' `DefaultProcMount`. Docker also
/// masks each CPU's `thermal_throttle` directory; gpuslice does not (one
/// mount per CPU on every launch; `/sys` is read-only anyway).
pub const MASKED_PATHS: [&str; 12] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/sys/devices/virtual/powercap",
    "/sys/firmware",
];

/// The kernel pseudo-filesystems a slice gets read-only wherever they are
/// mounted (a procfs other than the slice's `/proc` is masked instead).
pub const PSEUDO_FILESYSTEMS: [&str; 17] = [
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "bpf",
    "debugfs",
    "tracefs",
    "securityfs",
    "binfmt_misc",
    "configfs",
    "efivarfs",
    "pstore",
    "hugetlbfs",
    "fusectl",
    "selinuxfs",
    "nfsd",
    "rpc_pipefs",
];

/// Applies [`READ_ONLY_PATHS`] and [`MASKED_PATHS`] in the calling
/// process's mount namespace (the slice's); paths this kernel lacks are
/// left out, as runc does.
pub fn kernel_paths() -> io::Result<()> {
    for p in READ_ONLY_PATHS.map(Path::new) {
        if p.exists() {
            read_only_bind(p)?;
        }
    }
    for p in MASKED_PATHS.map(Path::new) {
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => mask_dir(p)?,
            Ok(_) => {
                mount(
                    Some("/dev/null"),
                    p,
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
                .map_err(|e| ctx(e.into(), "mask", p))?;
                // Read-only, its other (possibly locked) flags kept.
                set_read_only(p, 0)?;
            }
            Err(_) => {}
        }
    }
    Ok(())
}

/// For each mount, whether a later one is at the same place (it is then
/// not reachable by its path). One map of each place's last mount: a
/// Kubernetes node has hundreds.
fn covered(mounts: &[crate::mountinfo::Mount<'_>]) -> Vec<bool> {
    let last: std::collections::HashMap<&Path, usize> = mounts
        .iter()
        .enumerate()
        .map(|(j, m)| (m.mount_point.as_path(), j))
        .collect();
    mounts
        .iter()
        .enumerate()
        .map(|(i, m)| last.get(m.mount_point.as_path()) != Some(&i))
        .collect()
}

/// Covers the directory `p` with an empty read-only tmpfs.
fn mask_dir(p: &Path) -> io::Result<()> {
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(
        Some("gpuslice-mask"),
        p,
        Some("tmpfs"),
        flags,
        Some("size=0,mode=555"),
    )
    .map_err(|e| ctx(e.into(), "mask", p))
}

/// `--read-only-root`: every mount of the calling process's mount
/// namespace read-only (each one `mount_setattr(2)`, its other flags
/// kept), but the directories of `writable`, each first bound onto itself
/// so that it is a mount of its own, and the mounts at or below `keep`
/// (the slice's `/proc`, `/dev`, records and read-write binds) or below a
/// writable one.
pub fn read_only_root(writable: &[PathBuf], keep: &[&Path]) -> io::Result<()> {
    for w in writable {
        mount(
            Some(w.as_path()),
            w.as_path(),
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| ctx(e.into(), "bind-mount onto", w))?;
    }
    let text = std::fs::read_to_string(crate::mountinfo::MOUNTINFO)
        .map_err(|e| ctx(e, "read", Path::new(crate::mountinfo::MOUNTINFO)))?;
    let mounts: Vec<_> = crate::mountinfo::mounts(&text).collect();
    let covered = covered(&mounts);
    for (i, m) in mounts.iter().enumerate() {
        let at = &m.mount_point;
        if m.mount_opts.split(',').any(|o| o == "ro")
            || keep.iter().any(|k| at.starts_with(k))
            || writable.iter().any(|w| at.starts_with(w))
            || covered[i]
        {
            continue;
        }
        match set_read_only(at, 0) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) => {}
            other => other?,
        }
    }
    Ok(())
}

/// Makes every kernel pseudo-filesystem ([`PSEUDO_FILESYSTEMS`]) of the
/// calling process's mount namespace read-only, but for `own_proc` (the
/// slice's `/proc`, done by [`kernel_paths`]) and what is below it; masks
/// every other procfs (read-only is not enough there: the host's pids,
/// `/proc/<pid>/root`, `environ`). Found in `/proc/self/mountinfo`; a
/// mount already read-only, or covered by a later one (unreachable by
/// path), is left as it is. Each is one `mount_setattr(2)` that sets
/// `MOUNT_ATTR_RDONLY` and changes nothing else: the mount's nosuid,
/// nodev, noexec and atime flags stay (a remount that dropped them would
/// fail with EPERM where they are locked).
pub fn seal_pseudo_filesystems(own_proc: &Path) -> io::Result<()> {
    let text = std::fs::read_to_string(crate::mountinfo::MOUNTINFO)
        .map_err(|e| ctx(e, "read", Path::new(crate::mountinfo::MOUNTINFO)))?;
    let mounts: Vec<_> = crate::mountinfo::mounts(&text).collect();
    let covered = covered(&mounts);
    let mut masked: Vec<PathBuf> = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        let at = &m.mount_point;
        if !PSEUDO_FILESYSTEMS.contains(&m.fstype)
            || at.starts_with(own_proc)
            || masked.iter().any(|p| at.starts_with(p))
            || covered[i]
        {
            continue;
        }
        let done = if m.fstype == "proc" {
            mask_dir(at).map(|()| masked.push(at.clone()))
        } else if m.mount_opts.split(',').any(|o| o == "ro") {
            Ok(())
        } else {
            set_read_only(at, 0)
        };
        match done {
            // Not reachable by this path (under a mask or another mount).
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) => {}
            other => other?,
        }
    }
    Ok(())
}

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
    set_read_only(mount_point, AT_RECURSIVE)
}

/// `mount_setattr(2)` setting `MOUNT_ATTR_RDONLY` on the mount at
/// `mount_point` (a symlink there is not followed), and with
/// `AT_RECURSIVE` on every mount below it.
fn set_read_only(mount_point: &Path, recursive: libc::c_uint) -> io::Result<()> {
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
            recursive | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
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
/// read-only with every mount below it (`/proc/sys/fs/binfmt_misc` under
/// `/proc/sys`): bound onto itself, then the tree set read-only.
pub fn read_only_bind(path: &Path) -> io::Result<()> {
    crate::devfs::bind_from(path, path)?;
    read_only_tree(path)
}
