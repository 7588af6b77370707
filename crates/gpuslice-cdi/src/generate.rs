//! The host's spec (`gpuslice cdi generate`): one device per GPU index
//! and UUID, per MIG device (`<gpu>:<mig>` and `MIG-…`), `all`, and the
//! shared variants ([`crate::shared`]); the common edits (control nodes,
//! driver files, the params overlay, the variables recording how it was
//! generated).

use crate::driver_files::{self, BINS, BIN_DIRS, LIBS};
use crate::edits::{self, bind, char_node, device, Edits};
use crate::options::{caps_string, Capability, Options};
use crate::spec::{ANN_CAPS, ANN_DRIVER, ANN_SHARED, ANN_STRIP};
use crate::{CdiError, Generated, Result};
use container_device_interface::specs::config::{Device, DeviceNode};
use gpuslice_core::model::{NVIDIACTL_MINOR, NVIDIA_MAJOR, NVIDIA_MODESET_MINOR};
use gpuslice_core::{DevicePolicy, HostRoot, Inventory, Selection};
use gpuslice_ledger::limits::{ENV_DEVICE_ORDER, PCI_BUS_ID};
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Inside the container: where driver libraries are mounted (and `LD_LIBRARY_PATH` points).
pub const CONTAINER_LIB_DIR: &str = "/usr/local/nvidia/lib64";

/// Read-only bind options of the driver's files.
const RO: &[&str] = &["ro", "nosuid", "nodev", "bind"];

/// Discovers the GPUs below `root` and builds the spec.
pub fn generate(root: &HostRoot, opts: &Options) -> Result<Generated> {
    generate_for(root, &opts.discover(root)?, opts)
}

/// [`generate`] for an inventory already discovered below `root`.
pub fn generate_for(root: &HostRoot, inv: &Inventory, opts: &Options) -> Result<Generated> {
    let mut b = Builder::new(root, inv, opts);
    let devices = b.host_devices()?;
    let common = b.common_edits();
    let spec = edits::spec(&opts.kind(), devices, Some(common))?;
    Ok(b.finish(spec))
}

/// What a spec is built from, and what building it gathers on the way.
pub(crate) struct Builder<'a> {
    pub(crate) root: &'a HostRoot,
    pub(crate) inv: &'a Inventory,
    pub(crate) opts: &'a Options,
    pub(crate) warnings: Vec<String>,
    pub(crate) side_files: Vec<(PathBuf, String)>,
}

impl<'a> Builder<'a> {
    pub(crate) fn new(root: &'a HostRoot, inv: &'a Inventory, opts: &'a Options) -> Self {
        Builder {
            root,
            inv,
            opts,
            warnings: Vec::new(),
            side_files: Vec::new(),
        }
    }

    pub(crate) fn finish(self, spec: container_device_interface::specs::config::Spec) -> Generated {
        Generated {
            spec,
            side_files: self.side_files,
            warnings: self.warnings,
        }
    }

    /// A host path as written into the spec.
    pub(crate) fn host(&self, seen: &Path) -> String {
        if self.opts.strip_host_root {
            if let Ok(rel) = seen.strip_prefix(self.root.path()) {
                return Path::new("/").join(rel).display().to_string();
            }
        }
        seen.display().to_string()
    }

    /// A side file written beside the spec (once, however many devices
    /// name it).
    pub(crate) fn side_file(&mut self, path: PathBuf, content: String) {
        if !self.side_files.iter().any(|(p, _)| *p == path) {
            self.side_files.push((path, content));
        }
    }

    fn host_devices(&mut self) -> Result<Vec<Device>> {
        let inv = self.inv;
        let mut devices = Vec::new();
        for gpu in &inv.gpus {
            let edits = self.selection_edits(&Selection::gpus([gpu.index]));
            devices.push(device(&gpu.index.to_string(), edits.clone()));
            devices.push(device(&gpu.uuid, edits));
            for mig in &gpu.migs {
                let e = self.selection_edits(&mig_selection(gpu.index, mig.index));
                devices.push(device(&format!("{}:{}", gpu.index, mig.index), e.clone()));
                if let Some(u) = &mig.uuid {
                    devices.push(device(u, e));
                }
            }
        }
        for gpu in &inv.gpus {
            devices.extend(self.shared_devices(gpu));
        }
        if !inv.gpus.is_empty() {
            let all = Selection::gpus(inv.gpus.iter().map(|g| g.index));
            devices.push(device("all", self.selection_edits(&all)));
        }
        if devices.is_empty() {
            return Err(CdiError::NoGpus {
                root: self.root.path().to_path_buf(),
            });
        }
        Ok(devices)
    }

    /// Device nodes of a selection, without the control nodes (common).
    pub(crate) fn selection_edits(&self, sel: &Selection) -> Edits {
        let policy = DevicePolicy::for_selection(self.inv, sel);
        let graphics = self.opts.capabilities.contains(&Capability::Graphics);
        let mut nodes = Vec::new();
        for rule in &policy.rules {
            for &minor in &rule.allowed {
                let rel = if rule.major == NVIDIA_MAJOR {
                    if minor == NVIDIACTL_MINOR || minor == NVIDIA_MODESET_MINOR {
                        continue;
                    }
                    format!("nvidia{minor}")
                } else if Some(rule.major) == self.inv.majors.nvidia_caps {
                    format!("nvidia-caps/nvidia-cap{minor}")
                } else if graphics {
                    match self.dri_name(minor) {
                        Some(n) => format!("dri/{n}"),
                        None => continue,
                    }
                } else {
                    continue;
                };
                nodes.push(self.node(&rel, rule.major, minor));
            }
        }
        edits::nodes(nodes)
    }

    fn node(&self, rel: &str, major: u32, minor: u32) -> DeviceNode {
        char_node(rel, self.host(&self.root.dev().join(rel)), major, minor)
    }

    fn dri_name(&self, minor: u32) -> Option<String> {
        let dir = self.root.dev().join("dri");
        fs::read_dir(dir).ok()?.flatten().find_map(|e| {
            let md = e.metadata().ok()?;
            let ok = md.file_type().is_char_device()
                && libc::major(md.rdev()) == gpuslice_core::model::DRM_MAJOR
                && libc::minor(md.rdev()) == minor;
            ok.then(|| e.file_name().to_string_lossy().into_owned())
        })
    }

    /// The edits every device of the spec shares: the control nodes, the
    /// driver's files, the params overlay and the environment.
    pub(crate) fn common_edits(&mut self) -> Edits {
        let nodes = self.control_nodes();
        let mut mounts = self.driver_lib_mounts();
        mounts.extend(self.driver_tool_mounts());
        let hooks: Vec<_> = self.params_hook().into_iter().collect();
        let caps = &self.opts.capabilities;
        let shared: Vec<String> = self.opts.shared.iter().map(u32::to_string).collect();
        let env = vec![
            format!("{ANN_CAPS}={}", caps_string(caps)),
            format!(
                "{ANN_DRIVER}={}",
                self.inv.driver_version.as_deref().unwrap_or("unknown")
            ),
            format!("{ANN_SHARED}={}", shared.join(",")),
            format!("{ANN_STRIP}={}", self.opts.strip_host_root),
            format!("{ENV_DEVICE_ORDER}={PCI_BUS_ID}"),
            format!("LD_LIBRARY_PATH={CONTAINER_LIB_DIR}"),
        ];
        let mut e = edits::nodes(nodes);
        e.env = Some(env);
        e.mounts = (!mounts.is_empty()).then_some(mounts);
        e.hooks = (!hooks.is_empty()).then_some(hooks);
        e
    }

    fn control_nodes(&mut self) -> Vec<DeviceNode> {
        let mut nodes = Vec::new();
        let dev = self.root.dev();
        for name in [
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-uvm-tools",
            "nvidia-modeset",
        ] {
            let p = dev.join(name);
            match fs::metadata(&p) {
                Ok(md) if md.file_type().is_char_device() => {
                    nodes.push(self.node(name, libc::major(md.rdev()), libc::minor(md.rdev())));
                }
                _ if name == "nvidiactl" => self.warnings.push(format!(
                    "{} is missing: containers cannot use the GPUs",
                    p.display()
                )),
                _ => {}
            }
        }
        nodes
    }

    fn driver_lib_mounts(&mut self) -> Vec<container_device_interface::specs::config::Mount> {
        let mut mounts = Vec::new();
        let version = self.inv.driver_version.clone();
        let lib_dirs = driver_files::lib_dirs(self.root);
        for (cap, stem, names) in LIBS {
            if !self.opts.capabilities.contains(cap) {
                continue;
            }
            let found = driver_files::find_lib(self.root, &lib_dirs, stem, version.as_deref());
            let Some((file, versioned)) = found else {
                if *stem == "libcuda" || *stem == "libnvidia-ml" {
                    self.warnings.push(format!(
                        "{stem}.so not found below {}: containers get no {} library",
                        self.root.path().display(),
                        cap.name()
                    ));
                }
                continue;
            };
            let mut container_names = vec![versioned];
            container_names.extend(names.iter().map(|s| s.to_string()));
            container_names.dedup();
            for n in container_names {
                mounts.push(bind(
                    self.host(&file),
                    format!("{CONTAINER_LIB_DIR}/{n}"),
                    RO,
                ));
            }
        }
        mounts
    }

    fn driver_tool_mounts(&self) -> Vec<container_device_interface::specs::config::Mount> {
        BINS.iter()
            .filter(|(cap, _)| self.opts.capabilities.contains(cap))
            .filter_map(|(_, bin)| {
                let p = BIN_DIRS
                    .iter()
                    .map(|d| self.root.join(d).join(bin))
                    .find(|p| p.is_file())?;
                Some(bind(self.host(&p), format!("/usr/bin/{bin}"), RO))
            })
            .collect()
    }
}

/// The selection of MIG device `mig` of GPU `gpu`.
pub(crate) fn mig_selection(gpu: u32, mig: u32) -> Selection {
    Selection {
        gpus: vec![],
        migs: vec![(gpu, mig)],
    }
}
