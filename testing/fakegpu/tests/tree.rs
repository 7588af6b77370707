//! The host tree's layout and formats. Needs root (mknod).

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use fakegpu::{FakeHost, Kernel};

fn char_dev(path: &Path) -> (u32, u32, u32) {
    let meta = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        meta.file_type().is_char_device(),
        "{} is a char device",
        path.display()
    );
    let rdev = meta.rdev();
    (
        libc::major(rdev),
        libc::minor(rdev),
        meta.permissions().mode() & 0o7777,
    )
}

fn read(host: &FakeHost, rel: &str) -> String {
    fs::read_to_string(host.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn device_nodes() {
    let host = FakeHost::builder()
        .gpus(2)
        .build()
        .expect("build fake host (needs root)");
    assert_eq!(char_dev(&host.path("dev/nvidiactl")), (195, 255, 0o666));
    assert_eq!(
        char_dev(&host.path("dev/nvidia-modeset")),
        (195, 254, 0o666)
    );
    assert_eq!(char_dev(&host.path("dev/nvidia-uvm")), (238, 0, 0o666));
    assert_eq!(
        char_dev(&host.path("dev/nvidia-uvm-tools")),
        (238, 1, 0o666)
    );
    assert_eq!(
        char_dev(&host.path("dev/nvidia-caps/nvidia-cap1")),
        (241, 1, 0o400)
    );
    assert_eq!(
        char_dev(&host.path("dev/nvidia-caps/nvidia-cap2")),
        (241, 2, 0o444)
    );
    assert_eq!(char_dev(&host.path("dev/dri/card0")).0, 226);
    for i in 0..2 {
        assert_eq!(char_dev(&host.node_path(i)), (195, i, 0o666));
        assert_eq!(
            char_dev(&host.path(format!("dev/dri/card{}", i + 1))).1,
            i + 1
        );
        assert_eq!(
            char_dev(&host.path(format!("dev/dri/renderD{}", 129 + i))).1,
            129 + i
        );
    }
    // The fake nodes have no driver behind them: opening gives ENXIO.
    let err = fs::File::open(host.node_path(0)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENXIO));

    host.remove_node(1).unwrap();
    assert!(!host.node_exists(1));
    host.create_node(1).unwrap();
    assert_eq!(char_dev(&host.node_path(1)), (195, 1, 0o666));
}

#[test]
fn procfs_formats() {
    let host = FakeHost::builder()
        .gpus(2)
        .modify_device_files(false)
        .build()
        .unwrap();
    let devices = read(&host, "proc/devices");
    let chars = devices.split("Block devices:").next().unwrap();
    for line in [
        "195 nvidia-frontend",
        "226 drm",
        "238 nvidia-uvm",
        "241 nvidia-caps",
    ] {
        assert!(
            chars.lines().any(|l| l.trim() == line),
            "{line} in proc/devices"
        );
    }
    assert!(read(&host, "proc/driver/nvidia/version")
        .starts_with("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build"));
    let params = read(&host, "proc/driver/nvidia/params");
    assert!(params.contains("ModifyDeviceFiles: 0\n"));
    assert!(params.contains("DeviceFileMode: 438\n"));
    host.set_modify_device_files(true).unwrap();
    assert!(read(&host, "proc/driver/nvidia/params").contains("ModifyDeviceFiles: 1\n"));

    let info = read(&host, "proc/driver/nvidia/gpus/0000:28:00.0/information");
    assert!(info.contains("Model: \t\t NVIDIA H200\n"));
    assert!(info.contains(&format!("GPU UUID: \t {}\n", host.gpus()[1].uuid)));
    assert!(info.contains("Bus Location: \t 0000:28:00.0\n"));
    assert!(info.contains("Device Minor: \t 1\n"));
}

#[test]
fn mig_capabilities_are_consistent() {
    let host = FakeHost::builder()
        .gpus(3)
        .mig(0, 1)
        .mig(2, 2)
        .build()
        .unwrap();
    let minors = read(&host, "proc/driver/nvidia-caps/mig-minors");
    assert!(minors.starts_with("config 1\nmonitor 2\n"));
    let mut seen = Vec::new();
    for gpu in host.gpus() {
        assert_eq!(gpu.mig_enabled, gpu.minor != 1);
        for mig in &gpu.migs {
            let gi = format!("gpu{}/gi{}/access", gpu.minor, mig.gi);
            let ci = format!("gpu{}/gi{}/ci{}/access", gpu.minor, mig.gi, mig.ci);
            assert!(minors.contains(&format!("{gi} {}\n", mig.gi_minor)));
            assert!(minors.contains(&format!("{ci} {}\n", mig.ci_minor)));
            let caps = "proc/driver/nvidia/capabilities";
            let gi_access = read(
                &host,
                &format!("{caps}/gpu{}/mig/gi{}/access", gpu.minor, mig.gi),
            );
            assert_eq!(
                gi_access,
                format!(
                    "DeviceFileMinor: {}\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
                    mig.gi_minor
                )
            );
            for minor in [mig.gi_minor, mig.ci_minor] {
                let node = host.path(format!("dev/nvidia-caps/nvidia-cap{minor}"));
                assert_eq!(char_dev(&node), (241, minor, 0o444));
                seen.push(minor);
            }
            assert_eq!(mig.profile, "1g.18gb");
            assert_eq!(mig.memory_bytes, 18 << 30);
        }
    }
    assert_eq!(seen, [3, 4, 5, 6, 7, 8]);
    assert_eq!(
        host.gpus()[2].migs[1].uuid,
        "MIG-fa4e0002-0002-4000-8000-000000000000"
    );
}

#[test]
fn sysfs_topology() {
    let host = FakeHost::builder()
        .gpus(4)
        .degraded_link(3)
        .build()
        .unwrap();
    let dev = |bus: &str, file: &str| read(&host, &format!("sys/bus/pci/devices/{bus}/{file}"));
    let numa: Vec<_> = host
        .gpus()
        .iter()
        .map(|g| dev(&g.pci_bus_id, "numa_node"))
        .collect();
    assert_eq!(numa, ["0\n", "0\n", "1\n", "1\n"]);
    assert_eq!(dev("0000:18:00.0", "vendor"), "0x10de\n");
    assert_eq!(dev("0000:18:00.0", "device"), "0x2335\n");
    assert_eq!(dev("0000:38:00.0", "local_cpulist"), "16-31\n");
    assert_eq!(
        dev("0000:18:00.0", "current_link_speed"),
        "32.0 GT/s PCIe\n"
    );
    assert_eq!(dev("0000:18:00.0", "current_link_width"), "16\n");
    assert_eq!(
        dev("0000:48:00.0", "current_link_speed"),
        "16.0 GT/s PCIe\n"
    );
    assert_eq!(dev("0000:48:00.0", "current_link_width"), "8\n");
    assert_eq!(dev("0000:48:00.0", "max_link_speed"), "32.0 GT/s PCIe\n");
    assert_eq!(dev("0000:48:00.0", "max_link_width"), "16\n");

    // DRM class links resolve inside the root.
    let canon = |rel: &str| fs::canonicalize(host.path(rel)).unwrap();
    let gpu1 = canon("sys/bus/pci/devices/0000:28:00.0");
    assert_eq!(canon("sys/class/drm/card2/device"), gpu1);
    assert_eq!(canon("sys/class/drm/renderD130/device"), gpu1);
    assert_eq!(read(&host, "sys/class/drm/card2/dev"), "226:2\n");
    assert_eq!(read(&host, "sys/class/drm/card0/device/vendor"), "0x1a03\n");
    assert_eq!(
        canon("sys/bus/pci/devices/0000:28:00.0/driver"),
        canon("sys/bus/pci/drivers/nvidia")
    );
}

#[test]
fn kernel_json_is_the_truth() {
    let host = FakeHost::builder()
        .gpus(3)
        .init_ms_per_gpu(7)
        .ctx_ms(2)
        .build()
        .unwrap();
    let kernel: Kernel = serde_json::from_str(&read(&host, ".fakegpu/kernel.json")).unwrap();
    assert_eq!(&kernel, host.kernel());
    assert_eq!(kernel.driver_version, "580.159.04");
    assert_eq!(kernel.cuda_version, 13000);
    assert_eq!((kernel.init_ms_per_gpu, kernel.ctx_ms), (7, 2));
    let g = &kernel.gpus[1];
    assert_eq!(g.uuid, "GPU-fa4e0001-0000-4000-8000-000000000001");
    assert_eq!(g.pci_bus_id, "0000:28:00.0");
    assert_eq!(g.nvlink_peers, ["0000:18:00.0", "0000:38:00.0"]);
    assert!(!g.mig_enabled);
}

#[test]
fn env_and_driver_links() {
    let host = FakeHost::builder().build().unwrap();
    let env = host.env();
    let get = |k: &str| {
        env.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(get("FAKEGPU_ROOT"), host.root().display().to_string());
    let lib_dir = host.driver_lib_dir();
    assert!(get("LD_LIBRARY_PATH").starts_with(&lib_dir.display().to_string()));
    for name in [
        "libcuda.so.1",
        "libcuda.so",
        "libnvidia-ml.so.1",
        "libnvidia-ml.so",
    ] {
        let target = fs::canonicalize(lib_dir.join(name)).unwrap();
        assert_eq!(target, fs::canonicalize(fakegpu::driver_so_path()).unwrap());
    }
}

#[test]
fn temporary_root_is_removed_unless_kept() {
    let host = FakeHost::builder().build().unwrap();
    let root = host.root().to_path_buf();
    drop(host);
    assert!(!root.exists());

    let kept = FakeHost::builder().build().unwrap().keep();
    assert!(kept.join("dev/nvidia0").symlink_metadata().is_ok());
    fs::remove_dir_all(&kept).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("host");
    let host = FakeHost::at(&at).gpus(2).build().unwrap();
    assert_eq!(host.root(), fs::canonicalize(&at).unwrap());
    drop(host);
    assert!(
        at.join("dev/nvidia1").symlink_metadata().is_ok(),
        "an explicit root is kept"
    );
}

#[test]
fn bad_configurations_are_refused() {
    assert!(FakeHost::builder().gpus(15).build().is_err());
    assert!(FakeHost::builder().gpus(2).mig(2, 1).build().is_err());
    assert!(FakeHost::builder().gpus(2).mig(0, 8).build().is_err());
    assert!(FakeHost::builder()
        .gpus(2)
        .degraded_link(5)
        .build()
        .is_err());
}

#[test]
fn a_gpu_unplugged_leaves_proc_dev_and_the_driver_and_comes_back() {
    let host = FakeHost::builder()
        .gpus(3)
        .build()
        .expect("build fake host (needs root)");
    let bus = host.gpus()[1].pci_bus_id.clone();
    let kernel = |h: &FakeHost| -> Vec<u32> {
        let k: Kernel = serde_json::from_str(&read(h, ".fakegpu/kernel.json")).unwrap();
        k.gpus.iter().map(|g| g.minor).collect()
    };
    host.unplug_gpu(1).unwrap();
    assert!(!host.path(format!("proc/driver/nvidia/gpus/{bus}")).exists());
    assert!(!host.node_exists(1));
    assert_eq!(kernel(&host), [0, 2]);
    assert!(host.node_exists(2), "the others stay");
    // Another leaves while GPU 1 is out; GPU 1 comes back alone.
    host.unplug_gpu(2).unwrap();
    host.plug_gpu(1).unwrap();
    assert_eq!(kernel(&host), [0, 1]);
    assert_eq!(char_dev(&host.node_path(1)), (195, 1, 0o666));
    assert!(
        read(&host, &format!("proc/driver/nvidia/gpus/{bus}/information"))
            .contains(&host.gpus()[1].uuid)
    );
    assert!(host.unplug_gpu(7).is_err(), "no such GPU");
}
