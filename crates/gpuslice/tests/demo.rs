//! The walkthrough README.md shows first on a machine without NVIDIA
//! hardware: `gpuslice fakehost DIR`, then `list` and `run` on it. Needs
//! root (mknod, mount namespaces, cgroups), as CI runs it.

mod common;
use common::GPUSLICE;
use std::path::Path;
use std::process::{Command, Output};

fn gpuslice(args: &[&str]) -> Output {
    Command::new(GPUSLICE).args(args).output().unwrap()
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
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fake");
    let d = dir.to_str().unwrap();

    let out = gpuslice(&["fakehost", d, "--gpus", "8"]);
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
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fake");
    let d = dir.to_str().unwrap();
    let out = gpuslice(&["fakehost", d, "--gpus", "99"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("1..=14"), "{err}");
    assert!(!dir.exists());

    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("keep"), "x").unwrap();
    let out = gpuslice(&["fakehost", d]);
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
