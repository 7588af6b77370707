//! The fake driver's cuInit semantics, each run in a child process
//! (`fakegpu-probe`), since cuInit state is per process.
//!
//! Needs root (mknod) and the driver built: `cargo build -p fakegpu-driver`.

use fakegpu::{probe_command, run_probe, FakeHost, KernelMig, ProbeReport, TraceRecord};
use gpuslice_cuda_abi::cuda::{CUDA_ERROR_NO_DEVICE, CUDA_ERROR_OUT_OF_MEMORY};

fn host(gpus: u32) -> FakeHost {
    FakeHost::builder()
        .gpus(gpus)
        .build()
        .expect("build fake host (needs root)")
}

fn probe(host: &FakeHost, cvd: Option<&str>, args: &[&str]) -> (ProbeReport, TraceRecord) {
    let mut cmd = probe_command(host);
    cmd.args(args);
    if let Some(cvd) = cvd {
        cmd.env("CUDA_VISIBLE_DEVICES", cvd);
    }
    run_traced(host, &mut cmd)
}

/// Runs the probe command `cmd`: its report, and the trace line its cuInit
/// wrote.
fn run_traced(host: &FakeHost, cmd: &mut std::process::Command) -> (ProbeReport, TraceRecord) {
    let report = run_probe(cmd);
    let trace = host
        .trace()
        .unwrap()
        .into_iter()
        .find(|t| t.pid == report.pid)
        .expect("cuInit wrote a trace line");
    (report, trace)
}

#[test]
fn sees_every_gpu_in_pci_order() {
    let host = host(4);
    let (report, trace) = probe(&host, None, &[]);
    assert_eq!(report.init_rc, 0);
    assert_eq!(report.count, 4);
    let uuids: Vec<_> = report.devices.iter().map(|d| d.uuid.as_str()).collect();
    let expected: Vec<_> = host.gpus().iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(uuids, expected);
    assert_eq!(report.devices[1].name, "NVIDIA H200");
    assert_eq!(report.devices[1].pci_bus_id, "0000:28:00.0");
    assert_eq!(report.devices[1].total_mem, host.gpus()[1].memory_bytes);
    assert_eq!(report.proc_address_ok, Some(true));
    assert_eq!(trace.reachable, vec![0, 1, 2, 3]);
    assert!(trace.recreated.is_empty());
    assert_eq!(trace.visible, expected);
    assert_eq!(trace.root, host.root().display().to_string());
}

#[test]
fn missing_node_is_recreated_when_params_allow_and_root() {
    let host = host(4);
    host.remove_node(1).unwrap();
    assert!(!host.node_exists(1));
    let (report, trace) = probe(&host, None, &[]);
    assert_eq!(report.count, 4);
    assert!(trace.modify_device_files);
    assert_eq!(trace.recreated, vec![1]);
    assert_eq!(trace.reachable, vec![0, 1, 2, 3]);
    assert!(host.node_exists(1), "the driver re-created dev/nvidia1");
}

#[test]
fn missing_node_stays_hidden_with_modify_device_files_0() {
    let host = host(4);
    host.set_modify_device_files(false).unwrap();
    host.remove_node(1).unwrap();
    let (report, trace) = probe(&host, None, &[]);
    assert_eq!(report.count, 3);
    assert!(!trace.modify_device_files);
    assert!(trace.recreated.is_empty());
    assert_eq!(trace.reachable, vec![0, 2, 3]);
    assert!(!host.node_exists(1));
    let uuids: Vec<_> = report.devices.iter().map(|d| d.uuid.clone()).collect();
    assert!(!uuids.contains(&host.gpus()[1].uuid));
}

#[test]
fn missing_nvidiactl_without_modify_means_no_device() {
    let host = host(2);
    host.set_modify_device_files(false).unwrap();
    std::fs::remove_file(host.path("dev/nvidiactl")).unwrap();
    let (report, trace) = probe(&host, None, &[]);
    assert_eq!(report.init_rc, CUDA_ERROR_NO_DEVICE);
    assert!(!trace.ctl);
    assert!(trace.reachable.is_empty());
}

#[test]
fn empty_visible_devices_means_no_device() {
    let host = host(4);
    let (report, trace) = probe(&host, Some(""), &[]);
    assert_eq!(report.init_rc, CUDA_ERROR_NO_DEVICE);
    assert_eq!(report.count, 0);
    assert_eq!(trace.rc, CUDA_ERROR_NO_DEVICE);
    assert_eq!(trace.reachable, vec![0, 1, 2, 3]);
    assert!(trace.visible.is_empty());
}

#[test]
fn visible_devices_by_uuid_selects_one_but_all_are_reachable() {
    let host = host(4);
    let uuid = host.gpus()[2].uuid.clone();
    let (report, trace) = probe(&host, Some(&uuid), &[]);
    assert_eq!(report.count, 1);
    assert_eq!(report.devices[0].uuid, uuid);
    assert_eq!(report.devices[0].pci_bus_id, "0000:38:00.0");
    assert_eq!(trace.reachable, vec![0, 1, 2, 3]);
    assert_eq!(trace.visible, vec![uuid]);
}

#[test]
fn visible_devices_stop_at_first_invalid_item() {
    let host = host(4);
    let (report, _) = probe(&host, Some("3,9,0"), &[]);
    assert_eq!(report.count, 1);
    assert_eq!(report.devices[0].uuid, host.gpus()[3].uuid);
}

#[test]
fn init_cost_is_per_reachable_gpu() {
    let host = FakeHost::builder()
        .gpus(4)
        .init_ms_per_gpu(3)
        .build()
        .unwrap();
    let (_, all) = probe(&host, None, &[]);
    assert_eq!(all.init_sleep_ms, 12);
    // Selecting does not lower the cost: CUDA initialises what it reaches.
    let (_, one) = probe(&host, Some("0"), &[]);
    assert_eq!(one.init_sleep_ms, 12);
    host.set_modify_device_files(false).unwrap();
    host.remove_node(0).unwrap();
    host.remove_node(3).unwrap();
    let (_, two) = probe(&host, None, &[]);
    assert_eq!(two.init_sleep_ms, 6);
}

#[test]
fn env_override_of_init_cost() {
    let host = host(2);
    let mut cmd = probe_command(&host);
    cmd.env("FAKEGPU_INIT_MS_PER_GPU", "5");
    let report = run_probe(&mut cmd);
    let trace = host.trace().unwrap();
    let line = trace.iter().find(|t| t.pid == report.pid).unwrap();
    assert_eq!(line.init_sleep_ms, 10);
}

#[test]
fn memory_is_accounted_per_device() {
    let host = host(1);
    let gib = 1u64 << 30;
    let (report, _) = probe(&host, None, &["--alloc", &gib.to_string()]);
    let alloc = report.alloc.expect("alloc report");
    assert_eq!(alloc.rc, 0);
    assert_eq!(alloc.total, host.gpus()[0].memory_bytes);
    assert_eq!(alloc.free_before, alloc.total);
    assert_eq!(alloc.free_after, alloc.total - gib);

    let too_much = (host.gpus()[0].memory_bytes + 1).to_string();
    let (report, _) = probe(&host, None, &["--alloc", &too_much]);
    let alloc = report.alloc.unwrap();
    assert_eq!(alloc.rc, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(alloc.free_after, alloc.free_before);
}

#[test]
fn mig_instances_are_devices_and_selectable() {
    let host = FakeHost::builder().gpus(2).mig(1, 2).build().unwrap();
    let migs = &host.gpus()[1].migs;
    assert_eq!(migs.len(), 2);

    // Unset: the plain GPU, then the MIG instances of the MIG-enabled one.
    let (all, _) = probe(&host, None, &[]);
    let uuids: Vec<_> = all.devices.iter().map(|d| d.uuid.as_str()).collect();
    assert_eq!(
        uuids,
        [host.gpus()[0].uuid.as_str(), &migs[0].uuid, &migs[1].uuid]
    );

    let (one, trace) = probe(&host, Some(&migs[1].uuid), &["--alloc", "1024"]);
    assert_eq!(one.count, 1);
    assert_eq!(one.devices[0].name, "NVIDIA H200 MIG 1g.18gb");
    assert_eq!(one.devices[0].uuid, migs[1].uuid);
    assert_eq!(one.devices[0].total_mem, migs[1].memory_bytes);
    assert_eq!(one.alloc.unwrap().total, migs[1].memory_bytes);
    assert_eq!(trace.visible, vec![migs[1].uuid.clone()]);

    // The UUID of a MIG-enabled GPU selects nothing.
    let (none, _) = probe(&host, Some(&host.gpus()[1].uuid), &[]);
    assert_eq!(none.init_rc, CUDA_ERROR_NO_DEVICE);
}

#[test]
fn hidden_mig_capability_hides_the_instance() {
    let (host, cap) = without_cap_of_first_mig(2, |m| m.gi_minor);
    // Without its access file nothing tells nvidia-modprobe how to
    // re-create the node (as when /proc/driver/nvidia/capabilities is masked).
    let access = host.path("proc/driver/nvidia/capabilities/gpu0/mig/gi1/access");
    std::fs::remove_file(access).unwrap();
    let (report, trace) = probe(&host, None, &[]);
    assert_eq!(report.count, 1);
    assert_eq!(report.devices[0].uuid, host.gpus()[0].migs[1].uuid);
    assert!(trace.recreated_caps.is_empty());
    assert!(!cap.exists());
}

#[test]
fn probe_reports_nvml_view() {
    let host = host(3);
    host.set_modify_device_files(false).unwrap();
    host.remove_node(2).unwrap();
    let (report, _) = probe(&host, None, &["--nvml"]);
    let nvml = report.nvml.expect("nvml report");
    assert_eq!(nvml.init_rc, 0);
    assert_eq!(nvml.count, 2);
    assert_eq!(
        nvml.uuids,
        [host.gpus()[0].uuid.clone(), host.gpus()[1].uuid.clone()]
    );
}

#[test]
fn mig_capability_is_recreated_from_its_access_file() {
    let (host, cap) = without_cap_of_first_mig(1, |m| m.ci_minor);
    let ci_minor = host.gpus()[0].migs[0].ci_minor;
    let (report, trace) = probe(&host, None, &[]);
    assert_eq!(report.count, 1);
    assert_eq!(trace.recreated_caps, vec![ci_minor]);
    assert!(cap.exists());
}

/// A host whose one GPU has `instances` MIG instances, less the
/// `/dev/nvidia-caps` node `cap_minor` picks of the first instance's; gives
/// the host and the removed node's path.
fn without_cap_of_first_mig(
    instances: u32,
    cap_minor: fn(&KernelMig) -> u32,
) -> (FakeHost, std::path::PathBuf) {
    let host = FakeHost::builder()
        .gpus(1)
        .mig(0, instances)
        .build()
        .unwrap();
    let minor = cap_minor(&host.gpus()[0].migs[0]);
    let cap = host.path(format!("dev/nvidia-caps/nvidia-cap{minor}"));
    std::fs::remove_file(&cap).unwrap();
    (host, cap)
}

/// Runs the probe as `nobody`, who may neither bypass node modes nor mknod.
fn probe_unprivileged(host: &FakeHost) -> (ProbeReport, TraceRecord) {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // Let nobody append to the trace.
    std::fs::write(host.trace_path(), "").unwrap();
    std::fs::set_permissions(host.trace_path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut cmd = probe_command(host);
    cmd.uid(65534).gid(65534);
    run_traced(host, &mut cmd)
}

#[test]
fn denied_node_is_skipped() {
    use std::os::unix::fs::PermissionsExt;
    let host = host(4);
    // EACCES stands in for the device cgroup's EPERM: both are "denied".
    std::fs::set_permissions(host.node_path(1), std::fs::Permissions::from_mode(0o000)).unwrap();
    let (report, trace) = probe_unprivileged(&host);
    assert_eq!(report.count, 3);
    assert_eq!(trace.reachable, vec![0, 2, 3]);
    assert!(trace.recreated.is_empty());
}

#[test]
fn only_root_recreates_nodes() {
    let host = host(4);
    host.remove_node(1).unwrap();
    let (report, trace) = probe_unprivileged(&host);
    assert!(trace.modify_device_files);
    assert_eq!(report.count, 3);
    assert!(trace.recreated.is_empty());
    assert!(!host.node_exists(1));
}
