//! The device plugin's self-test (the GPU machine's check, in crate
//! gpuslice-bench) on the fake host: the plugin registers with the test
//! kubelet, and what each Allocate answers, applied by `gpuslice run`,
//! lets the CUDA probe see exactly the allocated GPUs. Needs root.

use crate::common;
use common::GPUSLICE;
use fakegpu::FakeHost;
use std::process::Command;

#[test]
fn the_selftest_passes_on_the_fake_host() {
    let _beside = common::beside_others();
    let h = FakeHost::builder().gpus(2).build().unwrap();
    let probe = fakegpu::artifact_dirs()
        .into_iter()
        .map(|d| d.join("gpuslice-cuda-probe"))
        .find(|p| p.is_file())
        .expect("gpuslice-cuda-probe built (cargo build -p gpuslice)");
    let out = Command::new(GPUSLICE)
        .arg("--host-root")
        .arg(h.root())
        .args([
            "device-plugin-selftest",
            "--watch-secs",
            "1",
            "--restarts",
            "1",
        ])
        .args(["--bench-allocs", "5", "--label", "fake host", "--probe"])
        .arg(&probe)
        .envs(h.env())
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(report["pass"], true, "{report:#}");
    assert!(out.status.success(), "{report:#}");
    let checks = report["checks"].as_object().map_or(0, |c| c.len())
        + report["checks"].as_array().map_or(0, |c| c.len());
    assert!(checks > 0, "{report:#}");
}
