//! The params overlay: the driver's `/proc/driver/nvidia/params` without
//! `ModifyDeviceFiles` (a side file beside the spec), bound over the
//! container's by a `createContainer` hook, both its entry in a spec and
//! what it does when the runtime runs it. runc refuses mounts below
//! `/proc`, hence a hook (in the container's mount namespace, before
//! `pivot_root`) rather than a mount.

use crate::edits;
use crate::generate::Builder;
use crate::{CdiError, Result};
use container_device_interface::specs::config::Hook;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The side file holding the overlay, written next to the spec.
pub const PARAMS_FILE: &str = "gpuslice-params";

impl Builder<'_> {
    /// The overlay's hook (and its side file); None, with a warning, when
    /// the hook's binary is unknown or the host's params cannot be read.
    pub(crate) fn params_hook(&mut self) -> Option<Hook> {
        let params_path = self.root.nvidia_proc().join("params");
        let Some(hook) = self.opts.hook.clone() else {
            self.warnings
                .push("no params overlay: the gpuslice binary for the hook is unknown".into());
            return None;
        };
        let params = match std::fs::read_to_string(&params_path) {
            Ok(p) => p,
            Err(e) => {
                self.warnings
                    .push(format!("no params overlay: {}: {e}", params_path.display()));
                return None;
            }
        };
        let file = self.opts.spec_dir.join(PARAMS_FILE);
        self.side_files.push((
            file.clone(),
            gpuslice_isolate::driver_proc::params_without_modify(&params),
        ));
        let args = ["gpuslice", "cdi", "hook", "params", "--file"]
            .map(String::from)
            .into_iter()
            .chain([self.host(&file)])
            .collect();
        Some(edits::hook("createContainer", self.host(&hook), args))
    }
}

/// `gpuslice cdi hook params --file F`: run by the runtime as a
/// createContainer hook (container mount namespace, before pivot_root),
/// with the container state on stdin. Binds `file` read-only over the
/// container's `/proc/driver/nvidia/params` when that exists. Errors are
/// returned for the caller to report; the caller decides whether they fail
/// the container.
pub fn params_hook(state_json: &str, file: &Path) -> Result<Option<PathBuf>> {
    let state: Value = serde_json::from_str(state_json)
        .map_err(|e| CdiError::input("container state on stdin", e))?;
    let bundle = state["bundle"]
        .as_str()
        .ok_or_else(|| CdiError::input("the container state", "no bundle"))?;
    let config_path = Path::new(bundle).join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|source| CdiError::Read {
        path: config_path.clone(),
        source,
    })?;
    let config: Value = serde_json::from_str(&text)
        .map_err(|e| CdiError::input(config_path.display().to_string(), e))?;
    let rootfs = config["root"]["path"]
        .as_str()
        .ok_or_else(|| CdiError::input(config_path.display().to_string(), "no root.path"))?;
    let rootfs = Path::new(bundle).join(rootfs); // join keeps an absolute path
    let target = rootfs.join("proc/driver/nvidia/params");
    if !target.exists() {
        return Ok(None);
    }
    bind_ro(file, &target)?;
    Ok(Some(target))
}

pub(crate) fn bind_ro(src: &Path, dst: &Path) -> Result<()> {
    use rustix::mount::{mount_bind, mount_remount, MountFlags};
    mount_bind(src, dst).map_err(|e| CdiError::Mount {
        what: format!("bind {} over {}", src.display(), dst.display()),
        source: e.into(),
    })?;
    mount_remount(dst, MountFlags::BIND | MountFlags::RDONLY, "").map_err(|e| CdiError::Mount {
        what: format!("remount {} read-only", dst.display()),
        source: e.into(),
    })?;
    Ok(())
}
