//! The walkthrough README.md shows first on a machine without NVIDIA
//! hardware: `gpuslice-fakehost DIR`, then `list` and `run` on it. Needs
//! root (mknod, mount namespaces, cgroups), as CI runs it.

use crate::common;
use common::GPUSLICE;
use std::path::Path;
use std::process::{Command, Output};

fn gpuslice(args: &[&str]) -> Output {
    Command::new(GPUSLICE).args(args).output().unwrap()
}

fn fakehost(args: &[&str]) -> Output {
    Command::new(fakegpu::fakehost_bin())
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

fn host_root_run(dir: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(GPUSLICE);
    c.arg("--host-root").arg(dir).arg("run").args(args);
    c.output().unwrap()
}

#[test]
fn fakehost_then_list_and_run_show_the_isolation_on_a_simulated_host() {
    let _beside = common::beside_others();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fake");
    let d = dir.to_str().unwrap();

    let out = fakehost(&[d, "--gpus", "8"]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(said.starts_with("SIMULATION:"), "{said}");
    assert!(
        said.contains(&format!("--host-root {} run --gpus 3", dir.display())),
        "{said}"
    );

    // list: the eight GPUs, labelled a simulation.
    let out = gpuslice(&["--host-root", d, "list"]);
    let listed = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        listed.lines().filter(|l| l.contains("NVIDIA H200")).count(),
        8,
        "{listed}"
    );
    assert!(listed.contains("SIMULATION:"), "{listed}");

    // run --gpus 3: of the GPU nodes only nvidia3 is left in the slice.
    let out = host_root_run(&dir, &["--gpus", "3", "--", "ls", &format!("{d}/dev")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let nodes: Vec<String> = text(&out.stdout)
        .lines()
        .filter(|l| {
            l.strip_prefix("nvidia")
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .map(str::to_string)
        .collect();
    assert_eq!(nodes, ["nvidia3"]);
    // The host's tree keeps all eight.
    for i in 0..8 {
        assert!(dir.join(format!("dev/nvidia{i}")).exists(), "nvidia{i}");
    }

    // The walkthrough's attack: re-creating GPU 2's node is refused (by
    // default the slice has no CAP_MKNOD; under --privileged, which keeps
    // it, by the device cgroup); GPU 3's own node is reachable (ENXIO: a
    // fake node has no driver behind it, but the open got past the cgroup).
    let script = format!("mknod {d}/dev/nvidia2 c 195 2; cat {d}/dev/nvidia3");
    for flags in [&[][..], &["--privileged"]] {
        let mut argv = vec!["--gpus", "3"];
        argv.extend_from_slice(flags);
        argv.extend(["--", "sh", "-c", &script]);
        let out = host_root_run(&dir, &argv);
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("{d}/dev/nvidia2: Operation not permitted")),
            "{flags:?}: {err}"
        );
        assert!(
            err.contains("No such device or address"),
            "{flags:?}: {err}"
        );
    }

    // The same, unisolated (--isolation env, --privileged): the node can
    // be made, which is what the cgroup stops above.
    let out = host_root_run(
        &dir,
        &[
            "--gpus",
            "3",
            "--isolation",
            "env",
            "--privileged",
            "--",
            "sh",
            "-c",
            &format!("mknod {d}/dev/probe2 c 195 2 && echo made"),
        ],
    );
    assert_eq!(text(&out.stdout).trim(), "made", "{}", text(&out.stderr));
    std::fs::remove_file(dir.join("dev/probe2")).unwrap();
}

#[test]
fn fakehost_refuses_bad_input_and_leaves_nothing_behind() {
    let _beside = common::beside_others();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fake");
    let d = dir.to_str().unwrap();
    let out = fakehost(&[d, "--gpus", "99"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("1..=14"), "{err}");
    assert!(!dir.exists());

    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("keep"), "x").unwrap();
    let out = fakehost(&[d]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("is not empty"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, ["keep"]);
}

/// The share a demo client's line reports: `(compute share 30%): got
/// 26.9% of the GPU's time`.
fn reported_share(out: &str, pct: u32) -> f64 {
    let line = out
        .lines()
        .find(|l| l.contains(&format!("(compute share {pct}%)")))
        .unwrap_or_else(|| panic!("no line of the {pct} % slice: {out}"));
    assert!(line.starts_with("SIMULATION: "), "{line}");
    line.split("got ")
        .nth(1)
        .and_then(|r| r.split('%').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no share in {line}"))
}

/// README.md's demo, its commands run as written (only the binaries'
/// directory and the fake host's path moved): a fake host with the fake
/// driver, a 2 GiB cap refusing a client's 3 GiB, and two slices at 30 and
/// 70 % of one simulated GPU at once, each held near its share.
#[test]
fn the_readme_demo_shows_the_cap_refuse_and_two_slices_share_a_gpu() {
    if !common::root_may_run("the_readme_demo_shows_the_cap_refuse_and_two_slices_share_a_gpu") {
        return;
    }
    let _alone = common::alone();
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("fakehost");
    let ledgers = tmp.path().join("ledgers");
    let lines = common::readme_demo();
    assert_eq!(
        lines.len(),
        3,
        "at most three commands after the build: {lines:?}"
    );
    let mut said = Vec::new();
    for line in &lines {
        let cmd = common::readme_command(line, &host);
        // What the README's reader has: no fake-driver variables of a test
        // run, the default slice directories moved out of other tests' way.
        let out = Command::new("sh")
            .args(["-c", &cmd])
            .env_remove("FAKEGPU_ROOT")
            .env_remove("FAKEGPU_ENGINE")
            .env_remove("FAKEGPU_TRACE")
            .env("GPUSLICE_LEDGER_DIR", &ledgers)
            .env("GPUSLICE_BOARD_DIR", ledgers.join("boards"))
            .output()
            .unwrap();
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{cmd}: {stdout}{}", text(&out.stderr));
        said.push(stdout);
    }
    // 1. The host, with its driver.
    assert!(said[0].starts_with("SIMULATION:"), "{}", said[0]);
    assert!(host.join(".fakegpu/lib/libcuda.so.1").exists());
    assert!(
        said[0].contains("The fake CUDA driver is installed in"),
        "{}",
        said[0]
    );
    // 2. The cap: 8 blocks of 256 MiB fit in 2 GiB, the 9th is refused by
    // the CUDA error a real driver gives.
    let mem = &said[1];
    assert!(
        mem.contains("cuMemGetInfo: 2.00 GiB total"),
        "the shim reports the cap: {mem}"
    );
    assert!(
        mem.contains(
            "SIMULATION: REFUSED at 2.00 GiB held: cuMemAlloc(256 MiB) returned \
             CUDA_ERROR_OUT_OF_MEMORY (2)"
        ),
        "{mem}"
    );
    // 3. The shares: 30 and 70 % on one engine, which the slices keep busy
    // by taking turns; a loose band for a loaded 2-core machine, and the ratio, which an
    // unshared or unenforced GPU would not give (each alone near 100 %,
    // or both near 50 % on one engine).
    let compute = &said[2];
    let (a, b) = (reported_share(compute, 30), reported_share(compute, 70));
    assert!((20.0..=33.0).contains(&a), "30 % slice got {a}: {compute}");
    assert!((50.0..=73.0).contains(&b), "70 % slice got {b}: {compute}");
    assert!(b / a >= 1.8 && b / a <= 3.0, "not 3:7: {a} / {b}");
}
