//! CLI plumbing that needs no GPU: completions, man page, list on the fake host.

use fakegpu::FakeHost;
use std::process::Command;

const GPUSLICE: &str = env!("CARGO_BIN_EXE_gpuslice");

#[test]
fn completions_and_man_page_come_from_the_cli_definition() {
    let out = Command::new(GPUSLICE)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && s.contains("--isolation") && s.contains("--gpus"),
        "{s}"
    );
    let out = Command::new(GPUSLICE).arg("man").output().unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && s.starts_with(".ie") || s.contains(".TH gpuslice"),
        "{s}"
    );
}

#[test]
fn list_shows_the_fake_gpus_with_and_without_nvml() {
    let h = FakeHost::builder().gpus(4).build().unwrap();
    let mut c = Command::new(GPUSLICE);
    c.arg("--host-root").arg(h.root()).args(["list", "--json"]);
    for (k, v) in h.env() {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["gpus"].as_array().unwrap().len(), 4);
    assert_eq!(v["gpus"][1]["pci_bus_id"], "0000:28:00.0");
    assert_eq!(v["gpus"][1]["numa_node"], 0);
    assert!(
        v["gpus"][1]["memory_bytes"].as_u64().unwrap() > 0,
        "memory from NVML: {v}"
    );
    assert!(
        v["sources"].as_array().unwrap().iter().any(|s| s == "nvml"),
        "{v}"
    );

    // Without NVML the facts come from procfs/sysfs alone, and it says so.
    let out = Command::new(GPUSLICE)
        .arg("--host-root")
        .arg(h.root())
        .arg("list")
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && s.contains("GPU-fa4e0003-") && s.contains("sources: procfs+sysfs"),
        "{s}"
    );
    assert!(s.contains("NVML not used"), "{s}");

    let out = Command::new(GPUSLICE)
        .args(["--host-root", "/nonexistent", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr)
            .trim_end()
            .lines()
            .count(),
        1
    );
}
