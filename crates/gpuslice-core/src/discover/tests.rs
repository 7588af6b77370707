//! End-to-end discovery over hand-made host trees.

use super::testtree::Tree;
use super::*;

const VERSION: &str = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build  \
                       (dvs-builder@U16-I3-B03-4-3)  Thu Nov 13 06:52:37 UTC 2025\n\
                       GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n";
const DEVICES: &str = "Character devices:\n  1 mem\n  4 /dev/vc/0\n195 nvidia-frontend\n\
                       237 nvidia-caps-imex-channels\n238 nvidia-uvm\n241 nvidia-caps\n\n\
                       Block devices:\n  7 loop\n  8 sd\n";

fn no_nvml() -> DiscoverOptions {
    DiscoverOptions {
        use_nvml: false,
        ..DiscoverOptions::default()
    }
}

fn run(t: &Tree) -> Inventory {
    discover(&t.root(), &no_nvml()).unwrap()
}

fn run_err(t: &Tree) -> DiscoverError {
    discover(&t.root(), &no_nvml()).unwrap_err()
}

/// Three GPUs whose minors do not follow bus order.
fn three_gpus() -> Tree {
    let t = Tree::new();
    t.gpu_on_bus("0000:3b:00.0", 0);
    t.gpu_on_bus("0000:18:00.0", 2);
    t.gpu_on_bus("0000:86:00.0", 1);
    t.write("proc/driver/nvidia/version", VERSION);
    t.write(
        "proc/driver/nvidia/params",
        "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\n",
    );
    t.write("proc/devices", DEVICES);
    t
}

#[test]
fn gpus_ordered_by_bus_id_with_minors_and_uuids() {
    let inv = run(&three_gpus());
    let got: Vec<(u32, u32, &str)> = inv
        .gpus
        .iter()
        .map(|g| (g.index, g.minor, g.pci_bus_id.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, 2, "0000:18:00.0"),
            (1, 0, "0000:3b:00.0"),
            (2, 1, "0000:86:00.0")
        ]
    );
    assert_eq!(inv.gpus[0].uuid, "GPU-18000000-0000-4000-8000-000000000000");
    assert_eq!(inv.gpus[1].model, "NVIDIA H200");
    assert_eq!(inv.gpu_by_minor(1).unwrap().pci_bus_id, "0000:86:00.0");
    assert_eq!(inv.driver_version.as_deref(), Some("580.159.04"));
    assert_eq!(inv.majors.nvidia_uvm, Some(238));
    assert_eq!(inv.majors.nvidia_caps, Some(241));
    assert!(!inv.modify_device_files);
    assert_eq!(inv.sources, vec!["procfs"]);
    assert!(inv.gpus.iter().all(|g| g.mig_enabled.is_none()));
}

#[test]
fn missing_optional_proc_files_give_defaults() {
    let t = Tree::new();
    t.gpu("0000:18:00.0", 0, "GPU-x");
    let inv = run(&t);
    assert!(
        inv.modify_device_files,
        "absent params means the driver default, 1"
    );
    assert_eq!(inv.driver_version, None);
    assert_eq!(inv.majors, Default::default());
}

#[test]
fn missing_driver_is_an_error_that_suggests_host_root() {
    let t = Tree::bare();
    t.mkdir("proc");
    let err = run_err(&t);
    assert!(matches!(err, DiscoverError::NoDriver { .. }));
    let msg = err.to_string();
    assert!(msg.contains(&t.path().join("proc/driver/nvidia").display().to_string()));
    assert!(msg.contains("--host-root") && !msg.contains('\n'), "{msg}");
}

#[test]
fn driver_without_gpus_is_empty_not_an_error() {
    let t = Tree::bare();
    t.mkdir("proc/driver/nvidia");
    assert!(run(&t).gpus.is_empty());
}

#[test]
fn unreadable_information_names_the_file() {
    let t = Tree::new();
    // A directory where the file should be fails with EISDIR, even as root.
    t.mkdir("proc/driver/nvidia/gpus/0000:18:00.0/information");
    let err = run_err(&t);
    assert!(matches!(err, DiscoverError::Read { .. }));
    assert!(
        err.to_string().contains("0000:18:00.0/information"),
        "{err}"
    );
}

/// GPU minor 0 with instances gi1/ci0, gi2/ci0, gi2/ci1 and a GPU instance
/// gi5 without compute instances; `access` files only where `with_access`.
fn mig_tree(with_access: bool) -> Tree {
    let t = Tree::new();
    t.gpu("0000:18:00.0", 0, "GPU-a");
    t.gpu("0000:2a:00.0", 1, "GPU-b");
    let base = "proc/driver/nvidia/capabilities/gpu0/mig";
    let access = |rel: &str, minor: u32| {
        if with_access {
            t.write(
                &format!("{base}/{rel}/access"),
                &format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
            );
        } else {
            t.mkdir(&format!("{base}/{rel}"));
        }
    };
    // Created out of order on purpose.
    access("gi2/ci1", 23);
    access("gi2", 21);
    access("gi2/ci0", 22);
    access("gi1", 12);
    access("gi1/ci0", 13);
    access("gi5", 48);
    t.write(
        "proc/driver/nvidia/capabilities/mig/config",
        "DeviceFileMinor: 1\n",
    );
    t
}

/// (index, gi, ci, gi cap minor, ci cap minor)
type MigRow = (u32, u32, u32, Option<u32>, Option<u32>);

fn mig_summary(g: &Gpu) -> Vec<MigRow> {
    g.migs
        .iter()
        .map(|m| {
            (
                m.index,
                m.gpu_instance,
                m.compute_instance,
                m.gi_access_minor,
                m.ci_access_minor,
            )
        })
        .collect()
}

const EXPECTED_MIGS: [MigRow; 3] = [
    (0, 1, 0, Some(12), Some(13)),
    (1, 2, 0, Some(21), Some(22)),
    (2, 2, 1, Some(21), Some(23)),
];

#[test]
fn mig_instances_from_capabilities() {
    let inv = run(&mig_tree(true));
    assert_eq!(mig_summary(&inv.gpus[0]), EXPECTED_MIGS);
    assert!(inv.gpus[0].migs.iter().all(|m| m.uuid.is_none()));
    assert!(inv.gpus[1].migs.is_empty());
}

#[test]
fn mig_minors_from_mig_minors_table() {
    let t = mig_tree(false);
    // The driver's table lists every possible instance; only those in the
    // capability tree exist.
    let mut table = String::from("config 1\nmonitor 2\n");
    for gi in 0..8 {
        table += &format!("gpu0/gi{gi}/access {}\n", 3 + gi * 9);
        for ci in 0..8 {
            table += &format!("gpu0/gi{gi}/ci{ci}/access {}\n", 4 + gi * 9 + ci);
        }
    }
    t.write("proc/driver/nvidia-caps/mig-minors", &table);
    let inv = run(&t);
    assert_eq!(mig_summary(&inv.gpus[0]), EXPECTED_MIGS);
    assert!(inv.gpus[1].migs.is_empty());
}

#[test]
fn mig_minors_alone_invent_no_instances() {
    let t = Tree::new();
    t.gpu("0000:18:00.0", 0, "GPU-a");
    t.write(
        "proc/driver/nvidia-caps/mig-minors",
        "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n",
    );
    assert!(run(&t).gpus[0].migs.is_empty());
}

#[test]
fn numa_pcie_and_cpus_from_sysfs() {
    let t = three_gpus();
    let gen5 = "32.0 GT/s PCIe";
    t.pci("0000:18:00.0", "0", [gen5, "16", gen5, "16"], "0-47,96-143");
    // Trained at Gen4 x8 on a Gen5 x16 slot; no NUMA information.
    t.pci(
        "0000:3b:00.0",
        "-1",
        ["16.0 GT/s PCIe", "8", gen5, "16"],
        "0-191",
    );
    let inv = run(&t);
    let (a, b, c) = (&inv.gpus[0], &inv.gpus[1], &inv.gpus[2]);
    assert_eq!(a.numa_node, Some(0));
    assert_eq!(a.local_cpus.as_deref(), Some("0-47,96-143"));
    let la = a.pcie.unwrap();
    assert_eq!((la.speed_gts, la.width), (32.0, 16));
    assert!(!la.degraded());
    assert_eq!(b.numa_node, None);
    let lb = b.pcie.unwrap();
    assert_eq!((lb.speed_gts, lb.width, lb.max_speed_gts), (16.0, 8, 32.0));
    assert!(lb.degraded());
    assert_eq!(
        (c.numa_node, c.pcie, c.local_cpus.as_deref()),
        (None, None, None)
    );
    assert_eq!(inv.sources, vec!["procfs", "sysfs"]);
}

#[test]
fn dri_minors_through_relative_and_absolute_links() {
    let t = three_gpus();
    let dev18 = "sys/devices/pci0000:00/0000:18:00.0";
    let dev3b = "sys/devices/pci0000:00/0000:3b:00.0";
    t.mkdir(dev18);
    t.mkdir(dev3b);
    t.link(
        "sys/bus/pci/devices/0000:18:00.0",
        "../../../devices/pci0000:00/0000:18:00.0",
    );
    // card0: a plain directory whose device link is absolute (host terms).
    t.link(
        "sys/class/drm/card0/device",
        "/sys/devices/pci0000:00/0000:18:00.0",
    );
    // renderD128: relative through /sys/bus/pci/devices.
    t.link(
        "sys/class/drm/renderD128/device",
        "../../../bus/pci/devices/0000:18:00.0",
    );
    // card1, renderD129: class entries are links into the device's drm/
    // directory, and `device` is relative to where they really are.
    for node in ["card1", "renderD129"] {
        t.link(
            &format!("{dev3b}/drm/{node}/device"),
            "../../../0000:3b:00.0",
        );
        t.link(
            &format!("sys/class/drm/{node}"),
            &format!("../../devices/pci0000:00/0000:3b:00.0/drm/{node}"),
        );
    }
    // Another vendor's card and a connector entry: not ours, not a node.
    t.link(
        "sys/class/drm/card2/device",
        "../../../devices/pci0000:00/0000:00:02.0",
    );
    t.link("sys/class/drm/card0-DP-1/device", "../../card0");
    t.write("sys/class/drm/version", "drm 1.1.0 20060810\n");

    let inv = run(&t);
    assert_eq!(inv.gpus[0].dri_minors, vec![0, 128]);
    assert_eq!(inv.gpus[1].dri_minors, vec![1, 129]);
    assert!(inv.gpus[2].dri_minors.is_empty());
    assert!(inv.sources.contains(&"sysfs".to_string()));
}

/// mknod needs root; elsewhere the test only checks that nothing is found.
fn mknod(t: &Tree, rel: &str, major: u32, minor: u32) -> bool {
    let p = t.path().join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::process::Command::new("mknod")
        .arg(&p)
        .args(["c", &major.to_string(), &minor.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn dri_and_majors_from_dev_when_sysfs_and_proc_devices_are_missing() {
    let t = Tree::new();
    t.gpu("0000:18:00.0", 0, "GPU-a");
    let made = mknod(&t, "dev/dri/card1", 226, 1)
        && mknod(&t, "dev/dri/renderD129", 226, 129)
        && mknod(&t, "dev/nvidia-uvm", 238, 0)
        && mknod(&t, "dev/nvidia-caps/nvidia-cap1", 241, 1);
    t.link("dev/dri/by-path/pci-0000:18:00.0-card", "../card1");
    t.link("dev/dri/by-path/pci-0000:18:00.0-render", "../renderD129");
    let inv = run(&t);
    if !made {
        // Fails here (always under CI) unless skipping was asked for; then
        // it checks only that nothing is invented.
        gpuslice_testkit::precondition(
            "dri_and_majors_from_dev_when_sysfs_and_proc_devices_are_missing",
            gpuslice_testkit::needs_root(),
        );
        assert!(inv.gpus[0].dri_minors.is_empty());
        return;
    }
    assert_eq!(inv.gpus[0].dri_minors, vec![1, 129]);
    assert_eq!(inv.majors.nvidia_uvm, Some(238));
    assert_eq!(inv.majors.nvidia_caps, Some(241));
    assert_eq!(inv.sources, vec!["procfs", "dev"]);

    // With /sys/class/drm present, /dev/dri is not consulted.
    t.mkdir("sys/class/drm");
    assert!(run(&t).gpus[0].dri_minors.is_empty());
}

#[test]
fn nvml_that_does_not_load_leaves_the_procfs_picture() {
    let t = three_gpus();
    let opts = DiscoverOptions {
        use_nvml: true,
        nvml_lib: Some(t.path().join("nonexistent/libnvidia-ml.so.1")),
        ..DiscoverOptions::default()
    };
    // The gate passes (FAKEGPU_ROOT names this tree), then loading fails.
    let inv = discover_with(&t.root(), &opts, Some(t.path()), &HostRoot::default()).unwrap();
    let why = inv.nvml_error.as_deref().unwrap();
    assert!(
        why.contains("NVML unavailable") && !why.contains('\n'),
        "{why}"
    );
    assert!(!inv.sources.contains(&"nvml".to_string()));
    assert_eq!(inv.gpus.len(), 3);
    assert_eq!(inv.cuda_version, None);
}

#[test]
fn nvml_is_not_asked_about_a_tree_it_does_not_describe() {
    let t = three_gpus();
    // Through the public entry: the tree is not /, and FAKEGPU_ROOT cannot
    // name a fresh temporary directory.
    let inv = discover(&t.root(), &DiscoverOptions::default()).unwrap();
    let why = inv.nvml_error.as_deref().unwrap();
    assert!(
        why.contains("NVML not used") && why.contains("FAKEGPU_ROOT"),
        "{why}"
    );
    assert!(!inv.sources.contains(&"nvml".to_string()));
    let off = run(&t);
    assert!(off.nvml_error.unwrap().contains("disabled"));
}

#[test]
fn nvml_gate_rule() {
    let opts = DiscoverOptions::default();
    let host = three_gpus();
    let system = HostRoot::default();
    let gate = |root: &HostRoot, fake: Option<&Path>, sys: &HostRoot| {
        nvml_gate(root, &opts, fake, sys).is_ok()
    };
    assert_eq!(
        nvml_gate(&system, &opts, None, &system).unwrap(),
        OsStr::new(DEFAULT_NVML_LIB)
    );
    assert!(gate(&host.root(), Some(host.path()), &system));
    let other = Tree::new();
    assert!(!gate(&host.root(), Some(other.path()), &system));
    // The same host seen through two mounts (here: two identical trees).
    let mirror = three_gpus();
    assert!(gate(&host.root(), None, &mirror.root()));
    // …but not when FAKEGPU_ROOT says a fake NVML serves another tree.
    assert!(!gate(&host.root(), Some(other.path()), &mirror.root()));
    // A tree with other GPUs, or with none, is another machine.
    mirror.gpu("0000:af:00.0", 3, "GPU-af");
    assert!(!gate(&host.root(), None, &mirror.root()));
    assert!(!gate(&Tree::new().root(), None, &Tree::new().root()));
    let custom = DiscoverOptions {
        use_nvml: true,
        nvml_lib: Some("/opt/nv/libnvidia-ml.so.1".into()),
        ..DiscoverOptions::default()
    };
    assert_eq!(
        nvml_gate(&system, &custom, None, &system).unwrap(),
        OsStr::new("/opt/nv/libnvidia-ml.so.1")
    );
}

#[test]
fn inventory_round_trips_through_json() {
    let inv = run(&mig_tree(true));
    let json = serde_json::to_string(&inv).unwrap();
    assert_eq!(serde_json::from_str::<Inventory>(&json).unwrap(), inv);
}

/// On a machine with the NVIDIA driver: `cargo test -p gpuslice-core --
/// --ignored real_host --nocapture` prints what discovery sees and checks
/// that procfs and NVML agree.
#[test]
#[ignore = "needs a real NVIDIA GPU"]
fn real_host_inventory() {
    let inv = discover(&HostRoot::default(), &DiscoverOptions::default()).unwrap();
    println!("{}", serde_json::to_string_pretty(&inv).unwrap());
    assert!(!inv.gpus.is_empty());
    assert!(inv.driver_version.is_some());
    assert_eq!(inv.nvml_error, None);
    assert!(inv.sources.contains(&"nvml".to_string()));
    let procfs_only = discover(&HostRoot::default(), &no_nvml()).unwrap();
    assert_eq!(procfs_only.gpus.len(), inv.gpus.len(), "NVML added GPUs");
    for (a, b) in inv.gpus.iter().zip(&procfs_only.gpus) {
        assert_eq!(
            (a.minor, &a.uuid, &a.pci_bus_id),
            (b.minor, &b.uuid, &b.pci_bus_id)
        );
        assert!(a.memory_bytes.is_some() && a.mig_enabled.is_some());
        assert_eq!(a.migs.len(), b.migs.len(), "MIG devices differ");
    }
}
