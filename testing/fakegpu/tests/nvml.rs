//! nvml-wrapper against the fake libnvidia-ml.so.1, in this process (which
//! reads its host from `FAKEGPU_ROOT` at init: held with
//! `gpuslice_testkit::fakenvml::serve`, so parallel tests do not race on it).

use fakegpu::FakeHost;
use nvml_wrapper::{Device, Nvml};

fn init(host: &FakeHost) -> Nvml {
    gpuslice_cuda_load::open_nvml(Some(&host.nvml_lib())).expect("nvmlInit against the fake driver")
}

/// GPU and compute instance ids of a MIG handle (nvml-wrapper has no
/// wrapper for these two calls).
fn instance_ids(nvml: &Nvml, mig: &Device) -> (u32, u32) {
    let lib = nvml.lib();
    let gi_fn = lib.nvmlDeviceGetGpuInstanceId.as_ref().unwrap();
    let ci_fn = lib.nvmlDeviceGetComputeInstanceId.as_ref().unwrap();
    let (mut gi, mut ci) = (u32::MAX, u32::MAX);
    // SAFETY: the handle belongs to this live Nvml; the out-pointers are
    // live locals of the type nvml.h declares.
    unsafe {
        assert_eq!(gi_fn(mig.handle(), &mut gi), 0);
        assert_eq!(ci_fn(mig.handle(), &mut ci), 0);
    }
    (gi, ci)
}

#[test]
fn nvml_wrapper_reads_the_fake_host() {
    let host = FakeHost::builder()
        .gpus(4)
        .mig(3, 2)
        .build()
        .expect("build fake host (needs root)");
    let _nvml = gpuslice_testkit::fakenvml::serve(host.root());

    let nvml = init(&host);
    assert_eq!(nvml.sys_driver_version().unwrap(), "580.159.04");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 13000);
    assert_eq!(nvml.device_count().unwrap(), 4);
    for (i, gpu) in host.gpus().iter().enumerate() {
        let dev = nvml.device_by_index(i as u32).unwrap();
        assert_eq!(dev.name().unwrap(), "NVIDIA H200");
        assert_eq!(dev.uuid().unwrap(), gpu.uuid);
        assert_eq!(dev.index().unwrap(), i as u32);
        assert_eq!(dev.minor_number().unwrap(), gpu.minor);
        let pci = dev.pci_info().unwrap();
        let bus = u32::from_str_radix(&gpu.pci_bus_id[5..7], 16).unwrap();
        assert_eq!(pci.bus_id, format!("00000000:{bus:02X}:00.0"));
        assert_eq!((pci.domain, pci.bus, pci.device), (0, bus, 0));
        let mem = dev.memory_info().unwrap();
        assert_eq!(mem.total, gpu.memory_bytes);
        assert_eq!(mem.free + mem.used + mem.reserved, mem.total);
        let (major, minor) = {
            let cc = dev.cuda_compute_capability().unwrap();
            (cc.major, cc.minor)
        };
        assert_eq!((major, minor), (9, 0));
        let by_uuid = nvml.device_by_uuid(gpu.uuid.as_str()).unwrap();
        assert_eq!(by_uuid.index().unwrap(), i as u32);
        let by_bus = nvml.device_by_pci_bus_id(pci.bus_id.as_str()).unwrap();
        assert_eq!(by_bus.index().unwrap(), i as u32);
    }

    // NVLink: every other GPU is a peer.
    let dev0 = nvml.device_by_index(0).unwrap();
    assert!(dev0.link_wrapper_for(2).is_active().unwrap());
    assert!(!dev0.link_wrapper_for(3).is_active().unwrap());
    let remote = dev0.link_wrapper_for(0).remote_pci_info().unwrap();
    assert_eq!(remote.bus_id, "00000000:28:00.0");

    // MIG on GPU 3.
    let dev3 = nvml.device_by_index(3).unwrap();
    assert!(dev3.mig_is_mig_device_handle().is_ok_and(|m| !m));
    assert_eq!(dev3.mig_device_count().unwrap(), 7);
    let mode = dev3.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    let mig = dev3.mig_device_by_index(1).unwrap();
    let kernel_mig = &host.gpus()[3].migs[1];
    assert!(mig.mig_is_mig_device_handle().unwrap());
    assert_eq!(mig.uuid().unwrap(), kernel_mig.uuid);
    assert_eq!(mig.name().unwrap(), "NVIDIA H200 MIG 1g.18gb");
    assert_eq!(instance_ids(&nvml, &mig), (kernel_mig.gi, kernel_mig.ci));
    assert_eq!(mig.memory_info().unwrap().total, kernel_mig.memory_bytes);
    assert_eq!(
        mig.mig_parent_device().unwrap().uuid().unwrap(),
        host.gpus()[3].uuid
    );
    assert!(dev3.mig_device_by_index(2).is_err());
    drop(nvml);

    // NVML never re-creates nodes, whatever ModifyDeviceFiles says.
    host.remove_node(1).unwrap();
    let nvml = init(&host);
    assert_eq!(nvml.device_count().unwrap(), 3);
    assert_eq!(
        nvml.device_by_index(1).unwrap().uuid().unwrap(),
        host.gpus()[2].uuid
    );
    assert!(!host.node_exists(1));
}
