//! Whether gpuslice can isolate here: which cgroup hierarchy holds device
//! control, whether a device restriction can really be put in place there
//! (tried on a throwaway slice cgroup, exactly as `gpuslice run` makes
//! one: v1 `devices.deny` rules, or the v2 BPF device filter compiled,
//! loaded and attached), and whether user namespaces let non-root users
//! get the namespace layers.
//!
//! The hierarchy is this kernel's, found in `/proc/self/mountinfo` as `run`
//! finds it, whatever the host root; [`crate::Options::cgroup_root`]
//! points the checks at another mount instead.

use crate::{Check, Context};
use gpuslice_core::{DevicePolicy, HostRoot, MajorRule};
use gpuslice_isolate::cgroup::{new_slice_id, CgroupDriver, CgroupError, SliceCgroup};
use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};
use std::fs;
use std::path::{Path, PathBuf};

pub fn checks(ctx: &Context) -> Vec<Check> {
    let driver = cgroup_driver(ctx.cgroup_root.as_deref());
    let hierarchy = match &driver {
        Ok(d) => Check::pass(
            "isolation.cgroup",
            format!(
                "cgroup {} {} at {}",
                d.version(),
                match d {
                    CgroupDriver::V1 { .. } => "devices hierarchy",
                    CgroupDriver::V2 { .. } => "(unified)",
                },
                d.root().display()
            ),
        ),
        Err(e) => Check::fail(
            "isolation.cgroup",
            e.to_string(),
            "mount cgroup2 at /sys/fs/cgroup (or a v1 devices hierarchy); in a container, \
             mount the host's /sys/fs/cgroup read-write",
        ),
    };
    let filter = match &driver {
        Ok(d) => device_filter(d),
        Err(_) => Check::fail(
            "isolation.device-filter",
            "no cgroup hierarchy to make slice cgroups in: the device cgroup layer \
             (isolation layer 3) cannot be enforced",
            "fix isolation.cgroup first",
        ),
    };
    vec![
        hierarchy,
        filter,
        boundary(),
        userns(&ctx.root),
        compute_boards(&ctx.root),
    ]
}

/// What `run` confines a command with by default (docs/security.md): the
/// seccomp filter compiles for this architecture and this kernel filters
/// system calls, and it has PID, cgroup and mount namespaces. These are
/// this kernel's, whatever the host root.
pub fn boundary() -> Check {
    const NAME: &str = "isolation.boundary";
    const FIX: &str = "a kernel with CONFIG_SECCOMP_FILTER, CONFIG_PID_NS and CONFIG_CGROUPS \
                       (cgroup namespaces); without them only `run --privileged` works, which \
                       is not a boundary";
    let filters = match gpuslice_isolate::seccomp::compile() {
        Ok(f) => f,
        Err(e) => return Check::fail(NAME, format!("the seccomp filter: {e}"), FIX),
    };
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    if !status.lines().any(|l| l.starts_with("Seccomp:")) {
        return Check::fail(
            NAME,
            "this kernel has no seccomp (no Seccomp: in /proc/self/status)",
            FIX,
        );
    }
    let missing: Vec<&str> = ["pid", "cgroup", "mnt"]
        .into_iter()
        .filter(|ns| !Path::new("/proc/self/ns").join(ns).exists())
        .collect();
    if !missing.is_empty() {
        return Check::fail(
            NAME,
            format!("this kernel has no {} namespaces", missing.join(", ")),
            FIX,
        );
    }
    Check::pass(
        NAME,
        format!(
            "seccomp filter ({} programs) and PID, cgroup and mount namespaces available",
            filters.len()
        ),
    )
}

/// The GPUs' compute boards (docs/compute-share.md): a directory every
/// slice with a compute share writes, so sticky and world-writable like
/// /tmp, holding only boards.
pub fn compute_boards(root: &HostRoot) -> Check {
    use gpuslice_ledger::board::{self, Board};
    use std::os::unix::fs::MetadataExt;
    const NAME: &str = "isolation.compute-boards";
    let dir = root.join(board::board_dir());
    let Ok(meta) = fs::symlink_metadata(&dir) else {
        return Check::skip(
            NAME,
            format!(
                "{} does not exist: no slice with a compute share has run here",
                dir.display()
            ),
            "",
        );
    };
    let mode = meta.mode() & 0o7777;
    if !meta.is_dir() || meta.uid() != 0 || mode != 0o1777 {
        return Check::warn(
            NAME,
            format!(
                "{} is {} owned by uid {} with mode {mode:o}, not a root-owned directory with mode 1777",
                dir.display(),
                if meta.is_dir() { "a directory" } else { "not a directory" },
                meta.uid()
            ),
            format!(
                "rm -rf {d} (gpuslice run --compute re-creates it), or chown root {d} && chmod 1777 {d}",
                d = dir.display()
            ),
        );
    }
    let mut boards = 0;
    let mut slices = 0;
    let mut foreign = Vec::new();
    let shares = board::shares_dir(&dir);
    for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // Root's share records (`run --compute`, the device plugin, the
        // CDI specs' read-only bind) belong here.
        if entry.path() == shares {
            continue;
        }
        let uuid = name.strip_suffix(".board");
        match uuid.and_then(|u| Board::open_existing(&dir, u)) {
            Some(b) => {
                boards += 1;
                slices += b.snapshot().len();
            }
            None => foreign.push(name),
        }
    }
    if !foreign.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "{} holds files that are not boards: {}",
                dir.display(),
                foreign.join(", ")
            ),
            format!(
                "remove them from {} (a board holds nothing that outlives its slices)",
                dir.display()
            ),
        );
    }
    Check::pass(
        NAME,
        format!(
            "{boards} GPU board(s) in {}, {slices} slice slot(s) in use",
            dir.display()
        ),
    )
}

/// The hierarchy slices are made in: `over` when given (which must be a
/// cgroup2 mount or a v1 hierarchy with the devices controller), else the
/// one [`CgroupDriver::detect`] picks.
pub fn cgroup_driver(over: Option<&Path>) -> Result<CgroupDriver, CgroupRootError> {
    let Some(root) = over else {
        return Ok(CgroupDriver::detect(None)?);
    };
    let fs = statfs(root).map_err(|source| CgroupRootError::Statfs {
        root: root.into(),
        source,
    })?;
    let kind = fs.filesystem_type();
    if kind == CGROUP2_SUPER_MAGIC {
        Ok(CgroupDriver::V2 { root: root.into() })
    } else if kind == CGROUP_SUPER_MAGIC {
        if root.join("devices.deny").exists() {
            Ok(CgroupDriver::V1 {
                devices_root: root.into(),
            })
        } else {
            Err(CgroupRootError::NoDevicesController { root: root.into() })
        }
    } else {
        Err(CgroupRootError::NotCgroup { root: root.into() })
    }
}

/// Why [`cgroup_driver`] found no hierarchy to make slices in.
#[derive(Debug, thiserror::Error)]
pub enum CgroupRootError {
    #[error(transparent)]
    Detect(#[from] CgroupError),
    #[error("cgroup root {}: {source}", root.display())]
    Statfs {
        root: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("{} is a cgroup v1 hierarchy without the devices controller", root.display())]
    NoDevicesController { root: PathBuf },
    #[error("{} is not a cgroup filesystem", root.display())]
    NotCgroup { root: PathBuf },
}

/// A policy that denies one minor, so that v1 gets a rule and v2 a program.
fn probe_policy() -> DevicePolicy {
    DevicePolicy {
        rules: vec![MajorRule {
            major: gpuslice_core::model::NVIDIA_MAJOR,
            allowed: vec![],
            denied: vec![gpuslice_core::model::NVIDIA_MODESET_MINOR],
            deny_unlisted: false,
        }],
    }
}

/// Makes a throwaway slice cgroup with a device restriction, as `run`
/// does, and removes it.
fn device_filter(driver: &CgroupDriver) -> Check {
    const NAME: &str = "isolation.device-filter";
    let what = match driver {
        CgroupDriver::V1 { .. } => "devices.deny rules",
        CgroupDriver::V2 { .. } => {
            "a BPF_PROG_TYPE_CGROUP_DEVICE program (compiled, loaded, attached with \
             BPF_F_ALLOW_MULTI)"
        }
    };
    let id = format!("{}-doctor", new_slice_id());
    match SliceCgroup::create(driver, &id, &probe_policy()) {
        Ok(cg) => {
            let path = cg.path().to_path_buf();
            match cg.remove() {
                Ok(()) => Check::pass(
                    NAME,
                    format!(
                        "a throwaway cgroup below {} took {what} and was removed: \
                         device isolation can be enforced",
                        driver.slices_dir().display()
                    ),
                ),
                Err(e) => Check::warn(
                    NAME,
                    format!("device isolation works, but the probe cgroup stayed: {e}"),
                    format!("rmdir {}", path.display()),
                ),
            }
        }
        Err(e) => {
            // Without root this is how things are, not a fault of the host.
            let root = nix::unistd::geteuid().is_root();
            let fix = match &e {
                CgroupError::Create { .. } if root => {
                    "make the cgroup mount writable (a read-only /sys/fs/cgroup in a container: \
                     mount it rw, or run privileged)"
                }
                CgroupError::Create { .. } => {
                    "run as root, or delegate a writable cgroup subtree to this user \
                     (systemd: Delegate=yes)"
                }
                CgroupError::BpfLoad { .. } => {
                    "run as root (CAP_BPF + CAP_SYS_ADMIN) on a kernel with CONFIG_CGROUP_BPF=y"
                }
                CgroupError::BpfAttach { .. } => {
                    "run gpuslice where no ancestor cgroup holds a device program attached \
                     without BPF_F_ALLOW_MULTI (e.g. outside that container)"
                }
                CgroupError::DeviceRule { .. } => {
                    "run as root with CAP_SYS_ADMIN (v1 devices.deny)"
                }
                _ => "run as root on the host",
            };
            let detail = format!(
                "cannot put {what} on a slice cgroup: {e}; layer 3 of `gpuslice run` \
                 (the device cgroup) cannot be enforced"
            );
            if root {
                Check::fail(NAME, detail, fix)
            } else {
                Check::warn(NAME, format!("not root: {detail}"), fix)
            }
        }
    }
}

fn read_num(root: &HostRoot, rel: &str) -> Option<i64> {
    fs::read_to_string(root.join(rel)).ok()?.trim().parse().ok()
}

/// User namespaces for rootless slices (layers 1, 2 and 4 without root).
pub fn userns(root: &HostRoot) -> Check {
    const NAME: &str = "isolation.userns";
    const MAX: &str = "proc/sys/user/max_user_namespaces";
    let Some(max) = read_num(root, MAX) else {
        return Check::skip(
            NAME,
            format!(
                "cannot read {}: user-namespace support unknown",
                root.join(MAX).display()
            ),
            "mount the host's /proc below the host root to check rootless support",
        );
    };
    if max == 0 {
        return Check::warn(
            NAME,
            "user.max_user_namespaces = 0: non-root users cannot use gpuslice run \
             (root is unaffected)",
            "sysctl -w user.max_user_namespaces=15000 (persist in /etc/sysctl.d)",
        );
    }
    if read_num(root, "proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        return Check::warn(
            NAME,
            "kernel.unprivileged_userns_clone = 0: only root may create user namespaces, \
             so non-root users cannot use gpuslice run (root is unaffected)",
            "sysctl -w kernel.unprivileged_userns_clone=1 (persist in /etc/sysctl.d)",
        );
    }
    if read_num(
        root,
        "proc/sys/kernel/apparmor_restrict_unprivileged_userns",
    ) == Some(1)
    {
        return Check::warn(
            NAME,
            "kernel.apparmor_restrict_unprivileged_userns = 1 (Ubuntu ≥ 23.10): an \
             unprivileged user namespace gets no capabilities unless an AppArmor profile \
             allows it, so rootless gpuslice run cannot mount its private /dev \
             (root is unaffected)",
            "add an AppArmor profile for the gpuslice binary with `userns,` (as \
             /etc/apparmor.d/bwrap-userns-restrict does for bwrap), or sysctl -w \
             kernel.apparmor_restrict_unprivileged_userns=0",
        );
    }
    Check::pass(
        NAME,
        format!("user namespaces available to non-root users (max_user_namespaces {max})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;
    use gpuslice_testkit::temphost::TempHost;

    #[test]
    fn userns_sysctls() {
        let h = TempHost::new();
        let root = h.root();
        assert_eq!(userns(&root).status, Status::Skip);
        h.write("proc/sys/user/max_user_namespaces", "63422\n");
        assert_eq!(userns(&root).status, Status::Pass);
        h.write(
            "proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "1\n",
        );
        let c = userns(&root);
        assert_eq!(c.status, Status::Warn);
        assert!(c.fix.contains("userns,"), "{}", c.fix);
        h.write("proc/sys/kernel/unprivileged_userns_clone", "0\n");
        assert!(userns(&root).detail.contains("unprivileged_userns_clone"));
        h.write("proc/sys/user/max_user_namespaces", "0\n");
        assert!(userns(&root).detail.contains("max_user_namespaces = 0"));
    }

    #[test]
    fn override_roots_that_are_not_cgroups() {
        let e = cgroup_driver(Some(Path::new("/nonexistent/cgroup")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/cgroup"), "{e}");
        let tmp = tempfile::tempdir().unwrap();
        let e = cgroup_driver(Some(tmp.path())).unwrap_err().to_string();
        assert!(e.contains("not a cgroup filesystem"), "{e}");
    }

    /// As root on a host with cgroup2 (CI): the probe succeeds and leaves
    /// nothing behind.
    #[test]
    fn probe_on_this_host() {
        let driver = match cgroup_driver(None) {
            Ok(d @ CgroupDriver::V2 { .. }) => d,
            other => {
                let why = match other {
                    Err(e) => e.to_string(),
                    Ok(_) => "no cgroup2 here (cgroup v1 only)".to_string(),
                };
                // Fails here (always under CI) unless skipping was asked for.
                gpuslice_testkit::precondition("probe_on_this_host", Some(why));
                return;
            }
        };
        if !nix::unistd::geteuid().is_root() {
            assert_eq!(device_filter(&driver).status, Status::Warn);
            return;
        }
        let c = device_filter(&driver);
        assert_eq!(c.status, Status::Pass, "{c:?}");
        let left: Vec<_> = fs::read_dir(driver.slices_dir())
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{}-", std::process::id()))
            })
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
