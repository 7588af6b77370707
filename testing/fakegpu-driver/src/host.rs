//! Reading the fake host: the kernel truth, module parameters, device nodes.
//!
//! The schema of `.fakegpu/kernel.json` comes from crate `fakegpu-schema`,
//! shared with `fakegpu` (the writer) without linking its test-only host
//! builder into this cdylib.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub use fakegpu_schema::{Kernel, KernelGpu, KernelMig};

/// Major of `/dev/nvidia*` (the NVIDIA frontend).
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// Major of `/dev/nvidia-caps/*` on the fake host (dynamic on a real one:
/// read from `proc/devices`).
pub const NVIDIA_CAPS_MAJOR_DEFAULT: u32 = 241;

/// The host root the driver reads, from `FAKEGPU_ROOT` (default `/`).
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
}

impl Host {
    pub fn from_env() -> Self {
        let root = std::env::var_os("FAKEGPU_ROOT")
            .filter(|r| !r.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"));
        Host { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// The kernel truth, GPUs in PCI bus-id order (the order the real
    /// driver enumerates them in). None when no driver is "loaded".
    pub fn kernel(&self) -> Option<Kernel> {
        let text = fs::read_to_string(self.path(".fakegpu/kernel.json")).ok()?;
        let mut kernel: Kernel = serde_json::from_str(&text).ok()?;
        kernel
            .gpus
            .sort_by_key(|g| g.pci_bus_id.to_ascii_lowercase());
        Some(kernel)
    }

    /// `ModifyDeviceFiles` of `proc/driver/nvidia/params`; the driver's
    /// default (1) when the file or the line is missing.
    pub fn modify_device_files(&self) -> bool {
        let value = fs::read_to_string(self.path("proc/driver/nvidia/params"))
            .ok()
            .and_then(|text| param_value(&text, "ModifyDeviceFiles"));
        value.as_deref() != Some("0")
    }

    /// `DeviceFileModify` of a MIG capability's access file
    /// (`proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<g>[/ci<c>]/access`).
    /// The real nvidia-modprobe consults this, not the module parameter,
    /// when it re-creates `/dev/nvidia-caps` nodes. Missing file → false
    /// (nothing to re-create from).
    pub fn cap_modify(&self, gpu_minor: u32, gi: u32, ci: Option<u32>) -> bool {
        let mut rel = format!("proc/driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}");
        if let Some(ci) = ci {
            rel.push_str(&format!("/ci{ci}"));
        }
        rel.push_str("/access");
        fs::read_to_string(self.path(&rel))
            .ok()
            .and_then(|text| param_value(&text, "DeviceFileModify"))
            .is_some_and(|v| v == "1")
    }

    /// Major of `nvidia-caps` from `proc/devices`.
    pub fn caps_major(&self) -> u32 {
        fs::read_to_string(self.path("proc/devices"))
            .ok()
            .and_then(|text| char_major(&text, "nvidia-caps"))
            .unwrap_or(NVIDIA_CAPS_MAJOR_DEFAULT)
    }
}

/// Value of a `Key: value` line.
fn param_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// Major of a character device named `name` in `/proc/devices` format.
fn char_major(text: &str, name: &str) -> Option<u32> {
    text.lines()
        .skip_while(|l| !l.starts_with("Character devices:"))
        .take_while(|l| !l.starts_with("Block devices:"))
        .find_map(|l| {
            let (major, n) = l.trim().split_once(' ')?;
            (n.trim() == name).then(|| major.parse().ok())?
        })
}

/// A device node the driver wants to open.
pub struct Node<'a> {
    pub path: &'a Path,
    pub major: u32,
    pub minor: u32,
    pub mode: u32,
    /// Read-only open (capability nodes are 0444), else read-write.
    pub read_only: bool,
}

/// What opening a node told us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The open succeeded, or failed with ENXIO: the node exists and the
    /// device cgroup lets us through; only the (absent) kernel module is
    /// missing behind it, which on the fake host stands for "present".
    Reachable,
    /// ENOENT.
    Missing,
    /// EPERM (device cgroup), EACCES (mode, nodev mount) or anything else.
    Denied,
}

pub fn access(node: &Node) -> Access {
    let result = fs::OpenOptions::new()
        .read(true)
        .write(!node.read_only)
        .open(node.path);
    match result {
        Ok(_) => Access::Reachable,
        Err(e) => match e.raw_os_error() {
            Some(libc::ENXIO) => Access::Reachable,
            Some(libc::ENOENT) => Access::Missing,
            _ => Access::Denied,
        },
    }
}

/// Outcome of [`open_or_recreate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub reachable: bool,
    pub recreated: bool,
}

/// Opens a node like libcuda does: a missing node is re-created (and the
/// open retried) when `may_create`, i.e. the driver allows modifying device
/// files and the caller may mknod.
pub fn open_or_recreate(node: &Node, may_create: bool) -> Opened {
    match access(node) {
        Access::Reachable => Opened {
            reachable: true,
            recreated: false,
        },
        Access::Missing if may_create && mknod_char(node).is_ok() => Opened {
            reachable: access(node) == Access::Reachable,
            recreated: true,
        },
        _ => Opened {
            reachable: false,
            recreated: false,
        },
    }
}

/// Whether the effective uid is 0 (who may mknod, as libcuda assumes).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn mknod_char(node: &Node) -> io::Result<()> {
    if let Some(dir) = node.path.parent() {
        fs::create_dir_all(dir)?;
    }
    let c_path = CString::new(node.path.as_os_str().as_bytes())?;
    let dev = libc::makedev(node.major, node.minor);
    // SAFETY: c_path is a valid NUL-terminated path for the call's duration.
    let rc = unsafe { libc::mknod(c_path.as_ptr(), libc::S_IFCHR | node.mode, dev) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // mknod applies the umask; the driver sets the exact mode.
    fs::set_permissions(node.path, fs::Permissions::from_mode(node.mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_params_lines() {
        let text = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\nDeviceFileMode: 438\n";
        assert_eq!(param_value(text, "ModifyDeviceFiles").as_deref(), Some("0"));
        assert_eq!(param_value(text, "Missing"), None);
    }

    #[test]
    fn reads_char_majors_only() {
        let text = "Character devices:\n  1 mem\n195 nvidia-frontend\n241 nvidia-caps\n\nBlock devices:\n241 nvidia-caps\n";
        assert_eq!(char_major(text, "nvidia-caps"), Some(241));
        assert_eq!(char_major(text, "mem"), Some(1));
        assert_eq!(char_major(text, "sd"), None);
    }

    #[test]
    fn missing_params_default_to_modify() {
        let dir = std::env::temp_dir().join(format!("fakegpu-driver-test-{}", std::process::id()));
        let host = Host { root: dir };
        assert!(host.modify_device_files());
        assert!(host.kernel().is_none());
    }
}
