//! `gpuslice labels` on the fake host: the NFD feature file, atomically
//! written, with the plugin config's sharing labels.

use fakegpu::FakeHost;

use crate::common;
use common::GPUSLICE;

#[test]
fn writes_the_feature_file() {
    let _beside = common::beside_others();
    let h = FakeHost::builder().gpus(2).build().unwrap();
    let cfg = h.path("plugin.yaml");
    std::fs::write(
        &cfg,
        "prefix: example.com\nroles: [{gpus: [1], role: shared, replicas: 3}, {gpus: others, role: whole}]\n",
    )
    .unwrap();
    let out = h.path("features.d/gpuslice");
    let o = h
        .command(GPUSLICE)
        .arg("--host-root")
        .arg(h.root())
        .arg("labels")
        .arg("--config")
        .arg(&cfg)
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    for want in [
        "example.com/gpu.product=NVIDIA-H200\n",
        "example.com/gpu.count=2\n",
        "example.com/gpu.replicas=3\n",
        "example.com/gpu.sharing-strategy=gpuslice\n",
        "example.com/gpu.0.role=whole\n",
        "example.com/gpu.1.role=shared\n",
        "example.com/gpu.1.replicas=3\n",
        "example.com/gpu.compute.major=9\n",
        "example.com/gpu.form-factor=SXM\n",
    ] {
        assert!(text.contains(want), "{want} not in\n{text}");
    }

    // stdout, and a bad prefix is refused.
    let o = h
        .command(GPUSLICE)
        .arg("--host-root")
        .arg(h.root())
        .args(["labels", "--output", "-"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("nvidia.com/gpu.count=2\n"), "{stdout}");
    assert!(!stdout.contains("gpu.replicas"));
    let o = h
        .command(GPUSLICE)
        .arg("--host-root")
        .arg(h.root())
        .args(["labels", "--prefix", "Not_A_Domain", "--output", "-"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("prefix"));
}
