//! Device nodes: present with the right numbers, with the modes the driver
//! would give them, and whether libcuda may re-create hidden ones
//! (`ModifyDeviceFiles`).

use crate::{list, Check, Context};
use gpuslice_core::model::{NVIDIACTL_MINOR, NVIDIA_MAJOR};
use gpuslice_core::{HostRoot, Inventory};
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

pub fn checks(ctx: &Context) -> Vec<Check> {
    let inv = match &ctx.inv {
        Ok(inv) => inv,
        Err(_) => {
            let why = "no NVIDIA driver found (see driver.loaded)";
            return [
                "devices.nodes",
                "devices.permissions",
                "devices.modify-device-files",
            ]
            .iter()
            .map(|n| Check::skip(n, why, ""))
            .collect();
        }
    };
    let nodes = expected_nodes(inv);
    vec![
        presence(&ctx.root, &nodes),
        permissions(&ctx.root, &nodes),
        modify_device_files(inv),
    ]
}

/// A node the host should have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Below `/dev`.
    pub path: String,
    pub major: u32,
    pub minor: u32,
    /// Missing is a failure (GPU nodes, nvidiactl); else a warning.
    pub required: bool,
    /// Mode checked against the driver's `DeviceFileMode` (the frontend
    /// and UVM nodes; MIG caps have their own modes).
    pub mode_checked: bool,
}

/// nvidiactl, one node per GPU, nvidia-uvm(-tools) when the UVM module
/// registered its major, and the access caps of the MIG instances.
pub fn expected_nodes(inv: &Inventory) -> Vec<Expected> {
    let node = |path: String, major, minor, required, mode_checked| Expected {
        path,
        major,
        minor,
        required,
        mode_checked,
    };
    let mut out = vec![node(
        "nvidiactl".into(),
        NVIDIA_MAJOR,
        NVIDIACTL_MINOR,
        true,
        true,
    )];
    for g in &inv.gpus {
        out.push(node(
            format!("nvidia{}", g.minor),
            NVIDIA_MAJOR,
            g.minor,
            true,
            true,
        ));
    }
    if let Some(uvm) = inv.majors.nvidia_uvm {
        out.push(node("nvidia-uvm".into(), uvm, 0, false, true));
        out.push(node("nvidia-uvm-tools".into(), uvm, 1, false, true));
    }
    if let Some(caps) = inv.majors.nvidia_caps {
        for m in inv.gpus.iter().flat_map(|g| &g.migs) {
            for minor in [m.gi_access_minor, m.ci_access_minor].into_iter().flatten() {
                out.push(node(
                    format!("nvidia-caps/nvidia-cap{minor}"),
                    caps,
                    minor,
                    false,
                    false,
                ));
            }
        }
    }
    out
}

fn dev_path(root: &HostRoot, rel: &str) -> PathBuf {
    root.dev().join(rel)
}

fn presence(root: &HostRoot, nodes: &[Expected]) -> Check {
    const NAME: &str = "devices.nodes";
    let mut missing_required = Vec::new();
    let mut missing_optional = Vec::new();
    let mut wrong = Vec::new();
    for n in nodes {
        let p = dev_path(root, &n.path);
        let want = format!("{}:{}", n.major, n.minor);
        match fs::metadata(&p) {
            Err(_) => {
                let entry = format!("/dev/{} ({want})", n.path);
                if n.required {
                    missing_required.push(entry)
                } else {
                    missing_optional.push(entry)
                }
            }
            Ok(m) if !m.file_type().is_char_device() => {
                wrong.push(format!("/dev/{} is not a char device", n.path))
            }
            Ok(m) => {
                let rdev = m.rdev();
                let (major, minor) = (libc::major(rdev), libc::minor(rdev));
                if (major, minor) != (n.major, n.minor) {
                    wrong.push(format!("/dev/{} is {major}:{minor}, not {want}", n.path));
                }
            }
        }
    }
    if !missing_required.is_empty() || !wrong.is_empty() {
        let mut what = Vec::new();
        if !missing_required.is_empty() {
            what.push(format!("missing {}", list(&missing_required, 4)));
        }
        if !wrong.is_empty() {
            what.push(list(&wrong, 4));
        }
        return Check::fail(
            NAME,
            format!("{}: CUDA cannot see those GPUs", what.join("; ")),
            "as root: nvidia-modprobe -c <minor> (or mknod -m 666 /dev/nvidia<N> c 195 <N>, \
             /dev/nvidiactl c 195 255); in a container, pass the devices (--device, CDI) \
             or mount the host's /dev",
        );
    }
    if !missing_optional.is_empty() {
        return Check::warn(
            NAME,
            format!("missing {}", list(&missing_optional, 4)),
            "as root: nvidia-modprobe -u -c 0 creates the UVM nodes (CUDA needs them); \
             nvidia-modprobe -f /proc/driver/nvidia/capabilities/... the MIG caps",
        );
    }
    Check::pass(
        NAME,
        format!(
            "{} nodes present with the right numbers: {}",
            nodes.len(),
            list(&nodes.iter().map(|n| n.path.clone()).collect::<Vec<_>>(), 6)
        ),
    )
}

/// `DeviceFileMode`, `DeviceFileUID`, `DeviceFileGID` from the driver's
/// params (defaults 0666, 0, 0 when absent).
pub fn driver_file_mode(root: &HostRoot) -> (u32, u32, u32) {
    let text = fs::read_to_string(root.nvidia_proc().join("params")).unwrap_or_default();
    let get = |key: &str, default: u32| {
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == key)
            .and_then(|(_, v)| v.trim().parse::<u32>().ok())
            .unwrap_or(default)
    };
    (
        get("DeviceFileMode", 0o666) & 0o7777,
        get("DeviceFileUID", 0),
        get("DeviceFileGID", 0),
    )
}

fn permissions(root: &HostRoot, nodes: &[Expected]) -> Check {
    const NAME: &str = "devices.permissions";
    let (mode, uid, gid) = driver_file_mode(root);
    let mut unusable = Vec::new();
    let mut differs = Vec::new();
    let mut seen = 0;
    for n in nodes.iter().filter(|n| n.mode_checked) {
        let Ok(m) = fs::metadata(dev_path(root, &n.path)) else {
            continue;
        };
        seen += 1;
        let have = m.mode() & 0o7777;
        if have & 0o600 != 0o600 {
            unusable.push(format!("/dev/{} {have:04o}", n.path));
        } else if have != mode || m.uid() != uid || m.gid() != gid {
            differs.push(format!(
                "/dev/{} {have:04o} {}:{}",
                n.path,
                m.uid(),
                m.gid()
            ));
        }
    }
    let driver = format!("{mode:04o} {uid}:{gid}");
    if seen == 0 {
        return Check::skip(NAME, "no NVIDIA device node to check", "");
    }
    if !unusable.is_empty() {
        return Check::fail(
            NAME,
            format!(
                "not readable and writable even by their owner: {}",
                list(&unusable, 4)
            ),
            format!("chmod {mode:o} the nodes (the driver's DeviceFileMode)"),
        );
    }
    if !differs.is_empty() {
        let world = mode & 0o006 == 0o006;
        return Check::warn(
            NAME,
            format!(
                "{} differ from the driver's DeviceFileMode/UID/GID {driver}{}",
                list(&differs, 4),
                if world {
                    ": users the driver would admit are refused, and libcuda or \
                     nvidia-modprobe re-create nodes with the driver's mode"
                } else {
                    ""
                }
            ),
            format!(
                "chmod {mode:o} and chown {uid}:{gid} the nodes, or set NVreg_DeviceFileMode/UID/GID \
                 to what you want (options nvidia … in /etc/modprobe.d)"
            ),
        );
    }
    Check::pass(
        NAME,
        format!("{seen} nodes have the driver's mode {driver}"),
    )
}

fn modify_device_files(inv: &Inventory) -> Check {
    const NAME: &str = "devices.modify-device-files";
    if inv.modify_device_files {
        Check::warn(
            NAME,
            "ModifyDeviceFiles: 1: libcuda re-creates hidden /dev/nvidia* nodes for root \
             callers, so a container or sandbox that merely leaves nodes out does not hide \
             GPUs (gpuslice run masks it per slice with its params overlay)",
            "options nvidia NVreg_ModifyDeviceFiles=0 in /etc/modprobe.d/nvidia.conf, then \
             reload the driver (create the nodes at boot with nvidia-modprobe -c <N>)",
        )
    } else {
        Check::pass(
            NAME,
            "ModifyDeviceFiles: 0: libcuda does not re-create hidden device nodes",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{expect, Status};
    use fakegpu::FakeHost;
    use gpuslice_core::discover::{discover, DiscoverOptions};

    fn inv(h: &FakeHost) -> Inventory {
        let opts = DiscoverOptions {
            use_nvml: false,
            ..Default::default()
        };
        discover(&HostRoot::new(h.root()), &opts).unwrap()
    }

    fn run(h: &FakeHost) -> Vec<Check> {
        let inv = inv(h);
        let root = HostRoot::new(h.root());
        let nodes = expected_nodes(&inv);
        vec![
            presence(&root, &nodes),
            permissions(&root, &nodes),
            modify_device_files(&inv),
        ]
    }

    /// Needs root (the fake host mknods).
    #[test]
    fn healthy_then_each_fault() {
        let h = FakeHost::builder()
            .gpus(2)
            .mig(1, 2)
            .modify_device_files(false)
            .build()
            .expect("fake host (needs root)");
        let c = run(&h);
        assert!(c.iter().all(|c| c.status == Status::Pass), "{c:#?}");
        assert!(c[0].detail.contains("nvidia-cap"), "{}", c[0].detail);

        h.remove_node(1).unwrap();
        let c = run(&h);
        expect(&c[0], Status::Fail, "/dev/nvidia1 (195:1)");
        assert!(c[0].fix.contains("nvidia-modprobe"), "{}", c[0].fix);
        h.create_node(1).unwrap();

        fs::remove_file(h.path("dev/nvidia-uvm-tools")).unwrap();
        expect(&run(&h)[0], Status::Warn, "");

        fakegpu::tree::mknod_char(&h.path("dev/nvidia-uvm-tools"), 238, 1, 0o600).unwrap();
        let c = run(&h);
        expect(&c[0], Status::Pass, "");
        expect(&c[1], Status::Warn, "nvidia-uvm-tools 0600");

        fakegpu::tree::mknod_char(&h.path("dev/nvidia0"), 195, 7, 0o000).unwrap();
        let c = run(&h);
        expect(&c[0], Status::Fail, "is 195:7, not 195:0");
        expect(&c[1], Status::Fail, "");

        h.set_modify_device_files(true).unwrap();
        let c = modify_device_files(&inv(&h));
        expect(&c, Status::Warn, "");
        assert!(c.fix.contains("NVreg_ModifyDeviceFiles=0"), "{}", c.fix);
    }
}
