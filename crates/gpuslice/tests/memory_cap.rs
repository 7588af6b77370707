//! `gpuslice run --memory` on the fake GPU host: the shim is preloaded, the
//! slice's ledger holds the cap, `gpuslice slices` shows the live process,
//! and the ledger is removed when the child exits. Needs root and the fake
//! driver, the shim and its test client built (scripts/test.sh builds the
//! workspace first).

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use fakegpu::FakeHost;
use serde_json::Value;

mod common;
use common::slice::{client, gpuslice, slices_json, slices_text};

#[test]
fn run_with_memory_caps_the_child_and_slices_shows_it() {
    let h = FakeHost::builder().gpus(2).build().unwrap();
    let ledgers = tempfile::tempdir().unwrap();
    let client = client();
    let client = client.to_str().unwrap();

    let out = gpuslice(
        &h,
        ledgers.path(),
        &[
            "run", "--gpus", "1", "--memory", "100MiB", "--", client, "fill", "7340032",
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["count"], 14, "{v}");
    assert_eq!(v["total"], 100 << 20, "{v}");
    assert_eq!(v["fail_rc"], 2, "{v}");
    assert_eq!(
        std::fs::read_dir(ledgers.path()).unwrap().count(),
        0,
        "ledger removed after the child exits"
    );

    // A holder inside a slice, seen from outside by `slices`.
    let mut holder = gpuslice(
        &h,
        ledgers.path(),
        &[
            "run", "--gpus", "0", "--memory", "1GiB", "--", client, "hold", "50000000",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held 0");
    let v = slices_json(&h, ledgers.path());
    let s = &v["slices"][0];
    assert_eq!(s["devices"][0]["cap_bytes"], 1u64 << 30, "{v}");
    assert_eq!(s["devices"][0]["used_bytes"], 50_000_000, "{v}");
    assert_eq!(s["devices"][0]["uuid"], h.gpus()[0].uuid, "{v}");
    assert_eq!(s["processes"][0]["bytes"][0], 50_000_000, "{v}");
    assert_eq!(s["processes"][0]["state"], "live", "{v}");
    let text = slices_text(&h, ledgers.path());
    assert!(text.contains("used 48MiB / cap 1024MiB"), "{text}");

    // SIGKILL the process in the slice; the launcher exits with 128+9 and
    // removes the ledger.
    let pid = s["processes"][0]["pid"].as_i64().unwrap() as i32;
    // The slice has its own PID namespace (where the shim recorded pid 2):
    // `slices` shows the host's pid for it, from NSpid.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.contains("Name:\tgpuslice-shim-c")
            && status.contains("NSpid:\t")
            && status
                .lines()
                .any(|l| l.starts_with("NSpid:") && l.ends_with("\t2")),
        "pid {pid} is not the slice's client: {status}"
    );
    // SAFETY: plain kill(2) of the child we started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let status = holder.wait().unwrap();
    assert_eq!(status.code(), Some(137));
    assert_eq!(std::fs::read_dir(ledgers.path()).unwrap().count(), 0);
}

#[test]
fn a_bad_memory_size_fails_before_the_child_starts() {
    let h = FakeHost::builder().gpus(1).build().unwrap();
    let ledgers = tempfile::tempdir().unwrap();
    let out = gpuslice(
        &h,
        ledgers.path(),
        &["run", "--gpus", "0", "--memory", "lots", "--", "true"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a size"));
}

#[test]
fn the_ledger_of_a_sigkilled_launcher_is_reaped_but_never_while_a_process_uses_it() {
    let h = FakeHost::builder().gpus(1).build().unwrap();
    let ledgers = tempfile::tempdir().unwrap();
    let client = client();
    let client = client.to_str().unwrap();
    let mut launcher = gpuslice(
        &h,
        ledgers.path(),
        &[
            "run", "--gpus", "0", "--memory", "1GiB", "--", client, "hold", "1000000",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(launcher.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held 0");
    let v = slices_json(&h, ledgers.path());
    let ledger = v["slices"][0]["ledger"].as_str().unwrap().to_string();
    let child = v["slices"][0]["processes"][0]["pid"].as_i64().unwrap() as i32;

    // SIGKILL the launcher: it cannot remove its ledger; its child dies
    // with it (parent-death signal).
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // SAFETY: kill(pid, 0) only probes for existence.
    while unsafe { libc::kill(child, 0) } == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(std::path::Path::new(&ledger).exists(), "left behind");

    // A live process joins the orphaned ledger: it must not be reaped.
    // The installed name, or the build tree's.
    let shim = fakegpu::artifact_dirs()
        .into_iter()
        .flat_map(|d| [d.join("libgpuslice.so"), d.join("libgpuslice_shim.so")])
        .find(|p| p.is_file())
        .expect("the shim built (cargo build -p gpuslice-shim)");
    let mut user = h
        .command(client)
        .args(["hold", "2000000"])
        .env("LD_PRELOAD", &shim)
        .env("GPUSLICE_LEDGER", &ledger)
        .env("CUDA_VISIBLE_DEVICES", &h.gpus()[0].uuid)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(user.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held 0");
    let v = slices_json(&h, ledgers.path());
    assert_eq!(
        v["slices"].as_array().unwrap().len(),
        1,
        "kept while used: {v}"
    );
    assert_eq!(v["slices"][0]["devices"][0]["used_bytes"], 2_000_000, "{v}");

    // Once nobody uses it, `gpuslice slices` reaps it.
    user.kill().unwrap();
    user.wait().unwrap();
    let v = slices_json(&h, ledgers.path());
    assert_eq!(v["slices"].as_array().unwrap().len(), 0, "{v}");
    assert!(!std::path::Path::new(&ledger).exists(), "ledger reaped");
}

#[test]
fn slices_of_dead_creators_are_reaped_but_the_device_plugin_s_are_left_to_it() {
    let h = FakeHost::builder().gpus(1).build().unwrap();
    let ledgers = tempfile::tempdir().unwrap();
    let shim = fakegpu::artifact_dirs()
        .into_iter()
        .flat_map(|d| [d.join("libgpuslice.so"), d.join("libgpuslice_shim.so")])
        .find(|p| p.is_file())
        .expect("the shim built (cargo build -p gpuslice-shim)");
    // Each ledger is created by a process that then dies (SIGKILL): its
    // creator is gone and no live process holds a slot.
    let make = |slice: &str| {
        let dir = ledgers.path().join(slice);
        std::fs::create_dir(&dir).unwrap();
        let usage = dir.join("usage");
        let mut c = h
            .command(client())
            .args(["hold", "1000000"])
            .env("LD_PRELOAD", &shim)
            .env("GPUSLICE_LEDGER", &usage)
            .env("GPUSLICE_SLICE", slice)
            .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
            .env("CUDA_VISIBLE_DEVICES", &h.gpus()[0].uuid)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "held 0");
        c.kill().unwrap();
        c.wait().unwrap();
        usage
    };
    let plugin = make("k8s-GPU-1-r0");
    let ours = make("1234-abc");
    let v = slices_json(&h, ledgers.path());
    let listed: Vec<&str> = v["slices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["slice"].as_str())
        .collect();
    assert_eq!(listed, ["k8s-GPU-1-r0"], "{v}");
    assert!(!ours.exists(), "a dead creator's slice is reaped");
    assert!(
        plugin.exists(),
        "the plugin's replica is its sweep's to remove"
    );
}
