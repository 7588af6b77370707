//! NFD labels on the fake host: discovery plus the fake NVML.

use fakegpu::FakeHost;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::HostRoot;
use gpuslice_k8s::labels::{self, valid_value};
use gpuslice_k8s::plugin::config::Config;

#[test]
fn fake_host_labels() {
    let h = FakeHost::builder().gpus(4).mig(1, 2).build().unwrap();
    // The fake NVML describes the host named here.
    let nvml = gpuslice_testkit::fakenvml::serve(h.root());
    let opts = DiscoverOptions {
        nvml_lib: Some(h.nvml_lib()),
        ..Default::default()
    };
    let inv = discover(&HostRoot::new(h.root()), &opts).unwrap();
    let facts = labels::nvml_facts(Some(&h.nvml_lib()));
    assert_eq!(facts.compute_capability, Some((9, 0)));
    // GPU 1 is in MIG mode: it serves its MIG devices.
    let cfg = Config::parse(
        "prefix: example.com\n\
         roles: [{gpus: [0], role: whole}, {gpus: others, role: shared, replicas: 8}]\n",
    )
    .unwrap();
    let l = labels::labels(&inv, &facts, Some(&cfg), &cfg.prefix).unwrap();
    let want = [
        ("gpu.product", "NVIDIA-H200"),
        ("gpu.memory", "143771"),
        ("gpu.count", "4"),
        ("gpu.compute.major", "9"),
        ("gpu.compute.minor", "0"),
        ("cuda.driver-version.full", "580.159.04"),
        ("cuda.driver-version.major", "580"),
        ("cuda.runtime-version.full", "13.0"),
        ("mig.capable", "true"),
        ("mig.strategy", "mixed"),
        ("gpu.nvlink", "true"),
        ("gpu.form-factor", "SXM"),
        ("gpu.sharing-strategy", "gpuslice"),
        ("gpu.replicas", "8"),
        ("gpu.0.role", "whole"),
        ("gpu.1.role", "mig"),
        ("gpu.2.role", "shared"),
        ("gpu.2.replicas", "8"),
        ("gpu.3.role", "shared"),
        ("gpu.3.replicas", "8"),
    ];
    for (k, v) in want {
        assert_eq!(
            l.get(&format!("example.com/{k}")).map(String::as_str),
            Some(v),
            "{k} in {l:#?}"
        );
    }
    for (k, v) in &l {
        assert!(k.starts_with("example.com/") && valid_value(v), "{k}={v}");
    }
    assert!(!l.contains_key("example.com/gpu.0.replicas"));

    // A role the GPU cannot serve says none; a GPU named twice is refused
    // as the plugin refuses it.
    let cfg =
        Config::parse("roles: [{gpus: [1], role: whole}, {gpus: others, role: whole}]").unwrap();
    let unfit = labels::labels(&inv, &facts, Some(&cfg), "x.io").unwrap();
    assert_eq!(unfit["x.io/gpu.1.role"], "none");
    assert_eq!(unfit["x.io/gpu.sharing-strategy"], "none");
    assert_eq!(unfit["x.io/gpu.replicas"], "1");
    let cfg =
        Config::parse("roles: [{gpus: [0], role: whole}, {gpus: ['0-1'], role: mig}]").unwrap();
    let e = labels::labels(&inv, &facts, Some(&cfg), "x.io").unwrap_err();
    assert!(
        format!("{e:#}").starts_with("roles[1].gpus[0]: GPU 0"),
        "{e:#}"
    );

    // The file NFD reads: comments and name=value lines only.
    let out = h
        .root()
        .join("etc/kubernetes/node-feature-discovery/features.d/gpuslice");
    labels::write_atomic(&out, &labels::render(&l)).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = text.lines().filter(|s| !s.starts_with('#')).collect();
    assert_eq!(lines.len(), l.len());
    assert!(lines.iter().all(|s| s.split_once('=').is_some()));
    assert!(text.contains("example.com/gpu.product=NVIDIA-H200\n"));

    // No config: no sharing labels; one GPU without NVLink peers is PCIe.
    drop(nvml);
    let one = FakeHost::builder().gpus(1).build().unwrap();
    let _nvml = gpuslice_testkit::fakenvml::serve(one.root());
    let inv = gpuslice_testkit::fakenvml::discover(&one);
    let l = labels::labels(
        &inv,
        &labels::nvml_facts(Some(&one.nvml_lib())),
        None,
        "nvidia.com",
    )
    .unwrap();
    assert_eq!(l["nvidia.com/gpu.form-factor"], "PCIe");
    assert_eq!(l["nvidia.com/gpu.nvlink"], "false");
    assert!(!l.contains_key("nvidia.com/gpu.replicas"));
}
