//! Finding the cgroup hierarchy to use: cgroup2 or the v1 `devices`
//! controller, from `statfs` and `/proc/self/mountinfo`.

use super::{CgroupError, Version, SLICES_DIR};
use crate::mountinfo::MOUNTINFO;
use std::fs;
use std::path::{Path, PathBuf};

/// Where slice cgroups are made, and how the device policy is applied there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupDriver {
    /// A cgroup v1 hierarchy with the `devices` controller, mounted at `devices_root`.
    V1 { devices_root: PathBuf },
    /// A cgroup2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid hosts).
    V2 { root: PathBuf },
}

impl CgroupDriver {
    /// Finds the cgroup hierarchies in `/proc/self/mountinfo`. Without a
    /// preference, v2 when a cgroup2 mount exists, else v1; a preference
    /// that is not available is an error.
    pub fn detect(preference: Option<Version>) -> Result<CgroupDriver, CgroupError> {
        // The common case first: a cgroup2 mount at /sys/fs/cgroup (a
        // v2-only host) is what the mountinfo scan picks too. One statfs
        // instead of reading every mount: hundreds on a Kubernetes node, on
        // the start-up path of every `gpuslice run`.
        // Then a hybrid host's cgroup2 at /sys/fs/cgroup/unified, which the
        // scan would pick next (its second usual place).
        if preference != Some(Version::V1) {
            let is_v2 = |p: &Path| {
                nix::sys::statfs::statfs(p)
                    .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
            };
            let unified = Path::new("/sys/fs/cgroup");
            if let Some(root) = [unified, &unified.join("unified")]
                .into_iter()
                .find(|p| is_v2(p))
            {
                return Ok(CgroupDriver::V2 {
                    root: root.to_path_buf(),
                });
            }
        }
        let text = fs::read_to_string(MOUNTINFO).map_err(|source| CgroupError::Mountinfo {
            path: MOUNTINFO.into(),
            source,
        })?;
        Self::from_mountinfo(&text, preference)
    }

    /// [`detect`](Self::detect) from the text of a mountinfo file.
    pub fn from_mountinfo(
        mountinfo: &str,
        preference: Option<Version>,
    ) -> Result<CgroupDriver, CgroupError> {
        let mut v2 = Vec::new();
        let mut v1 = Vec::new();
        for m in crate::mountinfo::mounts(mountinfo) {
            match m.fstype {
                "cgroup2" => v2.push(m.mount_point),
                "cgroup" if m.super_opts.split(',').any(|o| o == "devices") => {
                    v1.push(m.mount_point)
                }
                _ => {}
            }
        }
        let pick = |mut found: Vec<PathBuf>, usual: &[&str]| {
            let at = usual
                .iter()
                .find_map(|u| found.iter().position(|p| p == Path::new(u)))
                .unwrap_or(0);
            (!found.is_empty()).then(|| found.swap_remove(at))
        };
        let v2 = pick(v2, &["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]);
        let v1 = pick(v1, &["/sys/fs/cgroup/devices"]);
        let found = match (&v1, &v2) {
            (None, None) => "no cgroup mounts with device control".to_string(),
            (Some(p), None) => format!("only a v1 devices hierarchy at {}", p.display()),
            (None, Some(p)) => format!("only cgroup2 at {}", p.display()),
            (Some(a), Some(b)) => {
                format!("v1 devices at {}, cgroup2 at {}", a.display(), b.display())
            }
        };
        let v1 = v1.map(|devices_root| CgroupDriver::V1 { devices_root });
        let v2 = v2.map(|root| CgroupDriver::V2 { root });
        let (chosen, wanted) = match preference {
            Some(Version::V1) => (v1, "cgroup v1 hierarchy with the devices controller"),
            Some(Version::V2) => (v2, "cgroup2 mount"),
            None => (v2.or(v1), "cgroup2 mount or cgroup v1 devices hierarchy"),
        };
        chosen.ok_or_else(|| CgroupError::Unavailable {
            wanted: wanted.into(),
            found,
        })
    }

    pub fn version(&self) -> Version {
        match self {
            CgroupDriver::V1 { .. } => Version::V1,
            CgroupDriver::V2 { .. } => Version::V2,
        }
    }

    /// The hierarchy's mount point.
    pub fn root(&self) -> &Path {
        match self {
            CgroupDriver::V1 { devices_root } => devices_root,
            CgroupDriver::V2 { root } => root,
        }
    }

    /// `<root>/gpuslice`, the parent of every slice cgroup.
    pub fn slices_dir(&self) -> PathBuf {
        self.root().join(SLICES_DIR)
    }
}
