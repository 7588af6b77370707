//! `gpuslice run --memory` on the fake GPU host: the shim is preloaded, the
//! slice's ledger holds the cap, `gpuslice slices` shows the live process,
//! and the ledger is removed when the child exits. Needs root and the fake
//! driver, the shim and its test client built (scripts/test.sh builds the
//! workspace first).

use std::process::{Child, Stdio};

use fakegpu::FakeHost;
use serde_json::Value;

use crate::common;
use common::slice::{
    client_arg, gpuslice, run_capped, run_refused, slice_host, slices_json, slices_text,
};
use gpuslice_testkit::process::spawn_until;
use gpuslice_testkit::{shim_client, shim_so};

/// `gpuslice run --gpus 0 --memory 1GiB` of the client holding `bytes`,
/// once it holds them.
fn holder_in_slice(h: &FakeHost, ledgers: &std::path::Path, client: &str, bytes: &str) -> Child {
    spawn_until(
        &mut run_capped(h, ledgers, &[client, "hold", bytes]),
        "held 0",
    )
}

#[test]
fn run_with_memory_caps_the_child_and_slices_shows_it() {
    let (_beside, h, ledgers) = slice_host(2);
    let client = &client_arg();

    let out = gpuslice(
        &h,
        ledgers.path(),
        &[
            "run", "--gpus", "1", "--memory", "100MiB", "--", client, "fill", "7340032",
        ],
    )
    .output()
    .unwrap();
    common::assert_success(&out);
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
    let mut holder = holder_in_slice(&h, ledgers.path(), client, "50000000");
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

/// A DRA claim prepared on the host (the plugin's checkpoint below the
/// host root) is listed with its claim's namespace and name and what it
/// was granted.
#[test]
fn slices_shows_the_dra_claims_prepared_here() {
    let (_beside, h, ledgers) = slice_host(2);
    let v = slices_json(&h, ledgers.path());
    assert_eq!(v["dra_claims"], serde_json::json!([]), "{v}");
    common::write_dra_checkpoint(&h.path("var/lib/gpuslice/dra"));
    let v = slices_json(&h, ledgers.path());
    let c = &v["dra_claims"][0];
    assert_eq!(c["slice"], "uid-1-0", "{v}");
    assert_eq!(c["claim_namespace"], "team-a", "{v}");
    assert_eq!(c["claim_name"], "train", "{v}");
    assert_eq!(c["claim_uid"], "uid-1", "{v}");
    assert_eq!(c["device"], "gpu-0-shared", "{v}");
    assert_eq!(c["cap_bytes"], 20u64 << 30, "{v}");
    assert_eq!(c["compute_percent"], 30, "{v}");
    assert!(c["used_bytes"].is_null(), "no process of it started: {v}");
    let text = slices_text(&h, ledgers.path());
    assert!(
        text.contains("slice uid-1-0 (DRA claim team-a/train): gpu 0 gpu-0-shared  cap 20480MiB, compute share 30%"),
        "{text}"
    );
    // What its containers hold, from the claim's one ledger on the host
    // (a process of another pid namespace: it stays counted).
    let usage = h.path("run/gpuslice/claims/uid-1-0/usage");
    std::fs::create_dir_all(usage.parent().unwrap()).unwrap();
    let ledger = gpuslice_ledger::Ledger::create(
        &usage,
        "uid-1-0",
        &[gpuslice_ledger::DeviceSpec {
            uuid: "GPU-x".into(),
            cap: 20 << 30,
        }],
    )
    .unwrap();
    let slot = ledger.attach().unwrap();
    ledger.reserve(slot, 0, 3 << 30).unwrap();
    let v = slices_json(&h, ledgers.path());
    assert_eq!(v["dra_claims"][0]["used_bytes"], 3u64 << 30, "{v}");
    let text = slices_text(&h, ledgers.path());
    assert!(text.contains("used 3072MiB / cap 20480MiB"), "{text}");
    drop(ledger);
    // A checkpoint it cannot read is said, not taken for none.
    std::fs::write(h.path("var/lib/gpuslice/dra/checkpoint.json"), "{not json").unwrap();
    let v = slices_json(&h, ledgers.path());
    assert!(
        v["dra_error"]
            .as_str()
            .unwrap()
            .contains("not a gpuslice DRA checkpoint"),
        "{v}"
    );
}

#[test]
fn a_bad_memory_size_fails_before_the_child_starts() {
    let (_beside, h, ledgers) = slice_host(1);
    let err = run_refused(&h, ledgers.path(), &["--memory", "lots"]);
    assert!(err.contains("not a size"), "{err}");
}

#[test]
fn the_ledger_of_a_sigkilled_launcher_is_reaped_but_never_while_a_process_uses_it() {
    let (_beside, h, ledgers) = slice_host(1);
    let client = &client_arg();
    let mut launcher = holder_in_slice(&h, ledgers.path(), client, "1000000");
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
    let shim = shim_so();
    let mut user = spawn_until(
        h.command(client)
            .args(["hold", "2000000"])
            .env("LD_PRELOAD", &shim)
            .env("GPUSLICE_LEDGER", &ledger)
            .env("CUDA_VISIBLE_DEVICES", &h.gpus()[0].uuid),
        "held 0",
    );
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
    let (_beside, h, ledgers) = slice_host(1);
    let shim = shim_so();
    // Each ledger is created by a process that then dies (SIGKILL): its
    // creator is gone and no live process holds a slot.
    let make = |slice: &str| {
        let dir = ledgers.path().join(slice);
        std::fs::create_dir(&dir).unwrap();
        let usage = dir.join("usage");
        let mut c = spawn_until(
            h.command(shim_client())
                .args(["hold", "1000000"])
                .env("LD_PRELOAD", &shim)
                .env("GPUSLICE_LEDGER", &usage)
                .env("GPUSLICE_SLICE", slice)
                .env("GPUSLICE_MEMORY_LIMIT", "1GiB")
                .env("CUDA_VISIBLE_DEVICES", &h.gpus()[0].uuid),
            "held 0",
        );
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

/// A child killed when dropped (a failed assertion leaves no slice behind).
struct Launched(std::process::Child);

impl Drop for Launched {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn read_json_line(c: &mut std::process::Child) -> Value {
    let mut line = String::new();
    // One byte at a time: a BufReader would swallow the next line.
    let out = c.stdout.as_mut().unwrap();
    let mut b = [0u8; 1];
    while std::io::Read::read(out, &mut b).unwrap() == 1 && b[0] != b'\n' {
        line.push(b[0] as char);
    }
    serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

/// (pids, sum) NVML lists on GPU 0, asked on the host.
fn host_nvml(h: &FakeHost) -> (Vec<u64>, u64) {
    let out = h.command(shim_client()).arg("nvml-procs").output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&out.stdout)));
    let pids = v["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    (pids, v["sum"].as_u64().unwrap())
}

const MIB: u64 = 1 << 20;

#[test]
fn a_context_is_charged_as_the_driver_measures_it_inside_the_slice_s_pid_namespace() {
    let _beside = common::beside_others();
    // The fake driver, like the real one, knows processes by their host
    // pid; inside the slice's PID namespace the shim must find its own
    // (through the launcher's resolver) to read NVML's figure: else the
    // 1 GiB estimate stays charged instead of the 96 MiB context.
    const CTX: u64 = 96 * MIB;
    // (--pid, --user): a command as nobody resolves its host pid too.
    for (pid_mode, user) in [("private", "root"), ("host", "root"), ("private", "nobody")] {
        let h = FakeHost::builder().gpus(1).ctx_bytes(CTX).build().unwrap();
        let ledgers = tempfile::tempdir().unwrap();
        let client = &client_arg();
        let held = (10 * MIB).to_string();
        let mut c = Launched(
            gpuslice(
                &h,
                ledgers.path(),
                &[
                    "run",
                    "--gpus",
                    "0",
                    "--memory",
                    "1GiB",
                    "--pid",
                    pid_mode,
                    "--user",
                    user,
                    "--",
                    client,
                    "hold-soft",
                    &held,
                ],
            )
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
        );
        let v = read_json_line(&mut c.0);
        assert_eq!(
            (v["ctx"].as_i64(), v["alloc"].as_i64()),
            (Some(0), Some(0)),
            "{v}"
        );
        // The context is measured in the background once created.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut s = slices_json(&h, ledgers.path());
        while s["slices"][0]["devices"][0]["used_bytes"] != CTX + 10 * MIB
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
            s = slices_json(&h, ledgers.path());
        }
        let slice = &s["slices"][0];
        assert_eq!(
            slice["devices"][0]["used_bytes"],
            CTX + 10 * MIB,
            "--pid {pid_mode} --user {user}: the context charged as measured (not the 1 GiB estimate): {s}"
        );
        // The host's NVML lists the process by the host pid `slices` shows.
        let pid = slice["processes"][0]["pid"].as_u64().unwrap();
        let (pids, sum) = host_nvml(&h);
        assert_eq!(pids, [pid], "--pid {pid_mode} --user {user}: {s}");
        assert_eq!(sum, CTX + 10 * MIB, "--pid {pid_mode} --user {user}");
    }
}

#[test]
fn the_host_pid_resolver_tells_each_process_only_its_own_pid_and_outlives_a_flood() {
    let (_beside, h, ledgers) = slice_host(1);
    let client = &client_arg();
    // A tenant opens 1000 connections it never reads, then it and a child
    // it forked each ask.
    let mut c = Launched(
        run_capped(&h, ledgers.path(), &[client, "resolver", "1000"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let answers: Vec<Value> = (0..2).map(|_| read_json_line(&mut c.0)).collect();
    assert_eq!(answers[1]["idle"], 1000, "{answers:?}");
    let mut host_pids = Vec::new();
    for a in &answers {
        let answer = a["answer"].as_i64().unwrap();
        let inner = a["inner"].as_u64().unwrap();
        assert!(answer > 0, "answered: {a}");
        // The answer is the asker's host pid: that process's innermost pid
        // is the one it has in the slice.
        let status = std::fs::read_to_string(format!("/proc/{answer}/status")).unwrap();
        let nspid: Vec<u64> = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .unwrap()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(nspid.first(), Some(&(answer as u64)), "{status}");
        assert_eq!(
            nspid.last(),
            Some(&inner),
            "pid {answer} is not the asker: {status}"
        );
        assert!(nspid.len() > 1, "the asker is in the slice's PID namespace");
        assert!(status.contains("Name:\tgpuslice-shim-c"), "{status}");
        host_pids.push(answer);
    }
    assert_ne!(host_pids[0], host_pids[1], "each is told its own");
    // The launcher still does its job: the command's end is its exit code,
    // and the slice's records (the resolver's socket too) are gone.
    // SAFETY: plain kill(2) of the slice's command.
    assert_eq!(unsafe { libc::kill(host_pids[1] as i32, libc::SIGKILL) }, 0);
    assert_eq!(c.0.wait().unwrap().code(), Some(137));
    assert_eq!(std::fs::read_dir(ledgers.path()).unwrap().count(), 0);
}

#[test]
fn nvml_in_the_slice_lists_host_processes_by_host_pid_as_host_pid_drivers_do() {
    let _beside = common::beside_others();
    // A host-pid driver's process list (the fake models those; driver 580
    // translates pids into the caller's namespace instead, docs/shim.md
    // "Which pid is ours") is the same from inside the slice's PID
    // namespace: a process outside it is listed, live, under its host pid
    // (its liveness must not depend on the reader's /proc).
    const CTX: u64 = 96 * MIB;
    let h = FakeHost::builder().gpus(1).ctx_bytes(CTX).build().unwrap();
    let ledgers = tempfile::tempdir().unwrap();
    let client = shim_client();
    let mut outside = Launched(
        h.command(&client)
            .args(["hold-soft", &(10 * MIB).to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let v = read_json_line(&mut outside.0);
    assert_eq!(v["ctx"], 0, "{v}");
    let out = run_capped(
        &h,
        ledgers.path(),
        &[client.to_str().unwrap(), "nvml-procs"],
    )
    .output()
    .unwrap();
    common::assert_success(&out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pids"], serde_json::json!([outside.0.id()]), "{v}");
    assert_eq!(v["sum"], CTX + 10 * MIB, "{v}");
    // Gone, it is listed nowhere.
    drop(outside);
    assert_eq!(host_nvml(&h), (vec![], 0));
}
