//! A capped slice's edits: how a CDI slice's limits reach the shim, the
//! ONE place for `cdi generate`'s shared variants and DRA claims alike.

use crate::edits::{bind, tmpfs, Edits};
use crate::generate::Builder;
use container_device_interface::specs::config::Mount;
use gpuslice_ledger::board::{self, Mode, DEFAULT_BOARD_DIR};
use gpuslice_ledger::limits::{DeviceLimits, SliceLimits, LIMITS_FILE, SLICE_DIR};
use std::path::{Path, PathBuf};

/// Inside the container: the shim of the shared variants.
pub const CONTAINER_SHIM: &str = "/usr/local/gpuslice/libgpuslice.so";
/// Side files holding the shared variants' limits records: `<prefix><name>`.
pub const LIMITS_PREFIX: &str = "gpuslice-limits-";
/// The side file bound at the container's `/etc/ld.so.preload`.
pub const PRELOAD_FILE: &str = "gpuslice-ld.so.preload";

const RO: &[&str] = &["ro", "nosuid", "nodev", "bind"];
const RO_NOEXEC: &[&str] = &["ro", "nosuid", "nodev", "noexec", "bind"];
const RW_NOEXEC: &[&str] = &["rw", "nosuid", "nodev", "noexec", "bind"];

/// Where the limits record of the CDI slice `name` is written: beside the
/// spec, root-owned, bound read-only into the slice at the fixed place.
pub fn limits_record_path(spec_dir: &Path, name: &str) -> PathBuf {
    spec_dir.join(format!("{LIMITS_PREFIX}{name}"))
}

/// The limits of the capped CDI slice `name` (a shared variant, a DRA
/// claim's share) on one device: what its record says and its usage
/// ledger must match.
pub fn capped_slice(name: &str, device: DeviceLimits) -> SliceLimits {
    SliceLimits {
        slice_id: name.to_string(),
        mode: Mode::Cap,
        devices: vec![device],
    }
}

impl Builder<'_> {
    /// Writes a capped slice's limits into its device's edits: root's
    /// limits record of the slice (a side file beside the spec, root-owned
    /// 0644, [`limits_record_path`]) bound read-only at the fixed place,
    /// the shim preloaded through a bound `ld.so.preload`, the variables
    /// of [`SliceLimits::child_env`] naming the devices `visible` (None:
    /// only [`SliceLimits::limit_env`], where the spec names the devices
    /// of all its slices), the slice's directory where its usage
    /// ledger is made, the memory-limit hooks ([`crate::memory_hook`]), the
    /// GPU's board and the hooks that vouch for the slice's share on it
    /// ([`crate::share_hook`]).
    pub(crate) fn write_slice_limits(
        &mut self,
        edits: &mut Edits,
        shim: &Path,
        name: &str,
        device: DeviceLimits,
        visible: Option<&str>,
    ) {
        let preload = self.opts.spec_dir.join(PRELOAD_FILE);
        self.side_file(preload.clone(), format!("{CONTAINER_SHIM}\n"));
        let uuid = device.uuid.clone();
        let limits = capped_slice(name, device);
        let record = limits_record_path(&self.opts.spec_dir, name);
        self.side_files.push((record.clone(), limits.render()));
        let env = match visible {
            Some(visible) => limits.child_env(visible),
            None => limits.limit_env(),
        };
        edits.env = Some(env.into_iter().map(|(k, v)| format!("{k}={v}")).collect());
        let mut mounts = vec![
            bind(self.host(shim), CONTAINER_SHIM, RO),
            bind(self.host(&preload), "/etc/ld.so.preload", RO),
            self.slice_dir_mount(name),
            bind(
                self.host(&record),
                format!("{SLICE_DIR}/{LIMITS_FILE}"),
                RO_NOEXEC,
            ),
        ];
        let mut hooks = self.memory_limit_hooks(&record).unwrap_or_default();
        let boards = self.board_mounts(&uuid);
        if !boards.is_empty() {
            hooks.extend(self.share_hooks(&record).unwrap_or_default());
        }
        edits.hooks = (!hooks.is_empty()).then_some(hooks);
        mounts.extend(boards);
        edits.mounts = Some(mounts);
    }

    /// The slice's directory in the container, where its usage ledger is
    /// made: the host's `<slice_dirs>/<name>` (shared by every container
    /// of the slice), else a tmpfs of the container's own.
    fn slice_dir_mount(&self, name: &str) -> Mount {
        match &self.opts.slice_dirs {
            Some(dirs) => bind(self.host(&dirs.join(name)), SLICE_DIR, RW_NOEXEC),
            None => tmpfs(
                SLICE_DIR,
                &["nosuid", "nodev", "noexec", "mode=1777", "size=16m"],
            ),
        }
    }

    /// The GPU's board, made here as root (replacing one root did not
    /// make: a local user's squatted file), bound writable over the
    /// boards' directory bound read-only: the container writes its GPU's
    /// board (what a liar can do there is bounded: docs/security.md) and
    /// can neither add nor remove an entry of the host's directory. Root's
    /// share records in it read-only. None without boards, or (with a
    /// warning) when the board cannot be made.
    fn board_mounts(&mut self, uuid: &str) -> Vec<Mount> {
        let Some(boards) = self.opts.boards.clone() else {
            return Vec::new();
        };
        let file = match board::prepare_board(&boards, uuid) {
            Ok(file) => file,
            Err(e) => {
                self.warnings.push(format!(
                    "{}: {e}: this slice will not take turns on the GPU",
                    board::board_path(&boards, uuid).display()
                ));
                return Vec::new();
            }
        };
        let inside = Path::new(DEFAULT_BOARD_DIR);
        vec![
            bind(self.host(&boards), DEFAULT_BOARD_DIR, RO_NOEXEC),
            bind(
                self.host(&file),
                board::board_path(inside, uuid).display().to_string(),
                RW_NOEXEC,
            ),
            bind(
                self.host(&board::shares_dir(&boards)),
                board::shares_dir(inside).display().to_string(),
                RO_NOEXEC,
            ),
        ]
    }
}
