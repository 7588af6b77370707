//! `gpuslice run` on the fake GPU host, with the real kernel: mknod'ed
//! nodes, mount namespaces, device cgroups v1 and v2. Needs root (CI runs
//! as root; see scripts/test.sh).

use fakegpu::{FakeHost, FakeHostBuilder};
use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use common::GPUSLICE;
const PROBE: &str = env!("CARGO_BIN_EXE_gpuslice-cuda-probe");

fn fake_host(gpus: u32, modify_device_files: bool) -> FakeHostBuilder {
    FakeHost::builder()
        .gpus(gpus)
        .modify_device_files(modify_device_files)
}

/// `gpuslice --host-root <fake> run <args>` with the fake driver's env.
fn gpuslice(h: &FakeHost, args: &[&str]) -> Command {
    let mut c = common::gpuslice_on(h);
    c.args(args);
    c
}

fn run(h: &FakeHost, args: &[&str]) -> Output {
    gpuslice(h, args).output().expect("spawn gpuslice")
}

/// The probe's JSON line from a `run` whose command is the probe.
fn probe(h: &FakeHost, run_args: &[&str], probe_args: &[&str]) -> Value {
    let mut args = vec!["run"];
    args.extend_from_slice(run_args);
    args.push("--");
    args.push(PROBE);
    args.extend_from_slice(probe_args);
    let out = run(h, &args);
    assert!(
        out.status.success(),
        "gpuslice {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("probe output {:?}: {e}", out.stdout))
}

/// [`probe`] in a `run --gpus 1 --isolation ISO`.
fn probe_isolated(h: &FakeHost, iso: &str, probe_args: &[&str]) -> Value {
    probe(h, &["--gpus", "1", "--isolation", iso], probe_args)
}

fn count(v: &Value) -> i64 {
    v["count"].as_i64().unwrap_or(-1)
}

/// What a shell in the slice gets when it opens `path` read-write:
/// "ok", or the error text (ENXIO means the fake node was reachable).
fn open_in_slice(h: &FakeHost, run_args: &[&str], script: &str) -> String {
    let mut args = vec!["run"];
    args.extend_from_slice(run_args);
    args.extend(["--", "sh", "-c", script]);
    common::printed_in_slice(&run(h, &args))
}

fn node(h: &FakeHost, minor: u32) -> String {
    h.root()
        .join(format!("dev/nvidia{minor}"))
        .display()
        .to_string()
}

/// Shell code that prints `<label>: ok` or `<label>: <error>` for opening
/// `path` read-only (`<>` would create a missing file).
fn try_open(label: &str, path: &str) -> String {
    format!("echo \"{label}: $( ( exec 3<{path} ) 2>&1 && echo ok)\"; ")
}

#[test]
fn device_count_inside_the_slice_equals_the_selection() {
    let (_beside, h) = common::host_beside_others(fake_host(4, true));
    for (sel, want) in [("1", 1), ("0,2", 2), ("all", 4)] {
        for cg in ["v1", "v2"] {
            let v = probe(
                &h,
                &["--gpus", sel, "--cgroup", cg],
                &["--ignore-visible-devices"],
            );
            assert_eq!(count(&v), want, "--gpus {sel} --cgroup {cg}: {v}");
        }
    }
    let v = probe(&h, &["--gpus", "none"], &["--ignore-visible-devices"]);
    assert_eq!(v["init_rc"], 100, "--gpus none must leave no device: {v}");
}

/// The device layers themselves, under `--privileged` (full root, the
/// host's PID namespace): what holds even when the command may mknod and
/// reach the host's /dev through /proc (tests/boundary.rs: the default
/// takes those paths away too).
#[test]
fn unselected_nodes_fail_by_every_path_and_selected_ones_open() {
    let (_beside, h) = common::host_beside_others(fake_host(4, true));
    for cg in ["v1", "v2"] {
        let made = h.root().join(format!("made-{cg}"));
        let script = format!(
            "{}{}{}mknod {made} c 195 0 2>&1; {}",
            try_open("selected", &node(&h, 1)),
            try_open("hidden", &node(&h, 0)),
            try_open("via-proc-root", &format!("/proc/$PPID/root{}", node(&h, 2))),
            try_open("made", &made.display().to_string()),
            made = made.display()
        );
        let out = open_in_slice(
            &h,
            &["--gpus", "1", "--cgroup", cg, "--privileged"],
            &script,
        );
        let line = |label: &str| {
            out.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("{label}: {out}"))
                .to_string()
        };
        // ENXIO: the node opened as far as a fake node can, i.e. it was reachable.
        assert!(
            line("selected").contains("No such device or address"),
            "{cg}: {out}"
        );
        assert!(
            line("hidden").contains("No such file"),
            "{cg}: not in the private /dev: {out}"
        );
        // The host's /dev through another mount namespace: the cgroup still says no.
        assert!(
            line("via-proc-root").contains("Operation not permitted"),
            "{cg}: {out}"
        );
        // A node the child makes itself: the cgroup refuses the mknod or the open.
        let made_line = line("made");
        assert!(
            made_line.contains("Operation not permitted")
                || (out.contains("mknod")
                    && out.contains("Operation not permitted")
                    && made_line.contains("No such file")),
            "{cg}: {out}"
        );
        assert!(!out.contains(": ok"), "{cg}: {out}");
        let _ = std::fs::remove_file(made);
    }
}

#[test]
fn namespace_alone_is_defeated_by_modify_device_files() {
    let (_beside, h) = common::host_beside_others(fake_host(4, true));
    let trace = h.root().join("trace-ns.jsonl");
    let mut c = gpuslice(
        &h,
        &[
            "run",
            "--gpus",
            "1",
            "--isolation",
            "namespace",
            // Full root: libcuda may mknod (the default drops CAP_MKNOD).
            "--privileged",
            "--",
            PROBE,
            "--ignore-visible-devices",
        ],
    );
    let out = c.env("FAKEGPU_TRACE", &trace).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(count(&v), 4, "libcuda re-creates the hidden nodes: {v}");
    let t = std::fs::read_to_string(&trace).unwrap();
    assert!(t.contains("\"recreated\":[0,2,3]"), "trace: {t}");
}

#[test]
fn env_alone_is_a_hint_a_process_can_ignore() {
    let (_beside, h) = common::host_beside_others(fake_host(4, true));
    let v = probe_isolated(&h, "env", &[]);
    assert_eq!(count(&v), 1, "{v}");
    let v = probe_isolated(&h, "env", &["--ignore-visible-devices"]);
    assert_eq!(count(&v), 4, "{v}");
}

#[test]
fn cgroup_alone_holds_and_full_holds() {
    let (_beside, h) = common::host_beside_others(fake_host(4, true));
    for iso in ["cgroup", "full"] {
        let v = probe_isolated(&h, iso, &["--ignore-visible-devices"]);
        assert_eq!(count(&v), 1, "--isolation {iso}: {v}");
    }
}

#[test]
fn full_isolation_does_not_recreate_nodes_and_masks_proc() {
    let (_beside, h) = common::host_beside_others(fake_host(4, true));
    let script = format!(
        "grep ModifyDeviceFiles {r}/proc/driver/nvidia/params; ls {r}/proc/driver/nvidia/gpus/*/ | grep -c information; ls {r}/dev | grep -c '^nvidia[0-9]'",
        r = h.root().display()
    );
    let out = open_in_slice(&h, &["--gpus", "0,2"], &script);
    assert_eq!(out, "ModifyDeviceFiles: 0\n2\n2\n");
    // The host's tree is untouched.
    let params = std::fs::read_to_string(h.root().join("proc/driver/nvidia/params")).unwrap();
    assert!(params.contains("ModifyDeviceFiles: 1"));

    // Every masked dir (one tmpfs, the others bind mounts of it) is empty
    // and read-only, even for root.
    let script = format!(
        "for d in {r}/proc/driver/nvidia/gpus/*; do [ -e $d/information ] && continue; \
         touch $d/x 2>/dev/null && echo writable || echo ro; done",
        r = h.root().display()
    );
    let out = open_in_slice(&h, &["--gpus", "0"], &script);
    assert_eq!(out, "ro\nro\nro\n");
}

#[test]
fn the_private_dev_shows_the_live_host_dev_but_the_hidden_nodes() {
    let (_beside, h) = common::host_beside_others(fake_host(4, false));
    let dev = h.root().join("dev");
    // What a real host's /dev has besides the driver's nodes: other
    // devices, subdirectories, symlinks, and filesystems mounted inside.
    nix::sys::stat::mknod(
        &dev.join("ttyS9"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o620),
        nix::sys::stat::makedev(4, 73),
    )
    .unwrap();
    std::fs::create_dir_all(dev.join("disk/by-id")).unwrap();
    std::os::unix::fs::symlink("../../ttyS9", dev.join("disk/by-id/serial")).unwrap();
    std::fs::create_dir(dev.join("shm")).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &dev.join("shm"),
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    std::fs::write(dev.join("shm/marker"), "host\n").unwrap();

    let d = dev.display();
    let script = format!(
        "ls {d} | grep -c '^nvidia[0-9]'; \
         readlink -f {d}/disk/by-id/serial; cat {d}/shm/marker; echo slice > {d}/shm/from-slice; \
         touch {d}/slice-file && echo made; mkdir {d}/slice-dir && echo made-dir"
    );
    let out = open_in_slice(&h, &["--gpus", "1"], &script);
    // The host's /dev appears after the slice has gone (a file made in
    // the slice's /dev stays the slice's; one made in its /dev/shm is the
    // host's, as that is the host's mount).
    let host_ttys = dev.join("ttyS9").exists();
    let shm_file = std::fs::read_to_string(dev.join("shm/from-slice")).unwrap_or_default();
    let leaked = dev.join("slice-file").exists() || dev.join("slice-dir").exists();
    nix::mount::umount(&dev.join("shm")).unwrap();
    assert_eq!(
        out,
        format!("1\n{d}/ttyS9\nhost\nmade\nmade-dir\n"),
        "inside the slice"
    );
    assert!(host_ttys && shm_file == "slice\n" && !leaked, "on the host");
}

/// Under `--privileged` a selection that hides nothing needs no mount
/// namespace; by default one is made anyway (the slice's /proc, a
/// read-only /sys), with a cgroup namespace rooted at the slice cgroup.
#[test]
fn a_selection_that_hides_nothing_makes_no_mount_namespace_but_keeps_the_cgroup() {
    let (_beside, h) = common::host_beside_others(fake_host(2, true));
    let host_ns = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let script = "readlink /proc/self/ns/mnt; grep -c gpuslice /proc/self/cgroup";
    let all = open_in_slice(&h, &["--gpus", "all", "--privileged"], script);
    let one = open_in_slice(&h, &["--gpus", "1", "--privileged"], script);
    let host_ns = host_ns.display().to_string();
    assert_eq!(all, format!("{host_ns}\n1\n"), "--gpus all: {all}");
    let mut lines = one.lines();
    assert_ne!(lines.next(), Some(host_ns.as_str()), "--gpus 1: {one}");
    assert_eq!(lines.next(), Some("1"), "--gpus 1: {one}");
    for sel in ["all", "1"] {
        let out = open_in_slice(
            &h,
            &["--gpus", sel, "--cgroup", "v2"],
            "readlink /proc/self/ns/mnt; grep '^0::' /proc/self/cgroup",
        );
        let mut lines = out.lines();
        assert_ne!(lines.next(), Some(host_ns.as_str()), "--gpus {sel}: {out}");
        assert_eq!(lines.next(), Some("0::/"), "--gpus {sel}: {out}");
    }
}

#[test]
fn the_command_gets_default_signal_dispositions() {
    // The launcher ignores SIGPIPE (it must live to clean up); the command
    // must not inherit that (`gpuslice run -- yes | head` has to end).
    let (_beside, h) = common::host_beside_others(fake_host(1, false));
    for iso in ["full", "env"] {
        let out = open_in_slice(
            &h,
            &["--gpus", "0", "--isolation", iso],
            "grep SigIgn /proc/self/status",
        );
        let mask = u64::from_str_radix(out.trim().trim_start_matches("SigIgn:").trim(), 16)
            .unwrap_or_else(|e| panic!("{iso}: {out:?}: {e}"));
        assert_eq!(
            mask & (1 << (libc::SIGPIPE - 1)),
            0,
            "{iso}: SIGPIPE ignored: {out}"
        );
    }
}

#[test]
fn environment_names_the_selection() {
    let (_beside, h) = common::host_beside_others(fake_host(4, false));
    let out = run(
        &h,
        &[
            "run",
            "--gpus",
            "2",
            "--cuda-cache",
            "/tmp/gpuslice-test-cache",
            "--",
            "env",
        ],
    );
    let env = String::from_utf8_lossy(&out.stdout);
    assert!(env.contains("CUDA_VISIBLE_DEVICES=GPU-fa4e0002-"), "{env}");
    assert!(
        env.contains("NVIDIA_VISIBLE_DEVICES=GPU-fa4e0002-"),
        "{env}"
    );
    assert!(env.contains("CUDA_DEVICE_ORDER=PCI_BUS_ID"));
    assert!(env.contains("GPUSLICE_SLICE="));
    assert!(env.contains("CUDA_CACHE_PATH=/tmp/gpuslice-test-cache"));
}

#[test]
fn strict_child_cannot_undo_the_isolation_as_root() {
    let (_beside, h) = common::host_beside_others(fake_host(4, true));
    let r = h.root().display().to_string();
    let script = format!(
        "mknod {r}/x c 195 0 2>&1 || echo mknod-denied; umount {r}/dev 2>&1 || echo umount-denied; \
         umount {r}/proc/driver/nvidia/params 2>&1 || echo umount-params-denied; grep NoNewPrivs /proc/self/status"
    );
    let out = open_in_slice(&h, &["--gpus", "1", "--strict"], &script);
    assert!(out.contains("mknod-denied"), "{out}");
    assert!(
        out.contains("umount-denied") && out.contains("umount-params-denied"),
        "{out}"
    );
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    let v = probe(
        &h,
        &["--gpus", "1", "--strict"],
        &["--ignore-visible-devices"],
    );
    assert_eq!(count(&v), 1, "{v}");
}

/// Mounts below `root` in our own mount namespace (the host's view).
fn mounts_below(root: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let r = root.display().to_string();
    info.lines()
        .filter(|l| l.contains(&r))
        .map(String::from)
        .collect()
}

fn cgroup_roots() -> Vec<PathBuf> {
    [
        "/sys/fs/cgroup/devices/gpuslice",
        "/sys/fs/cgroup/unified/gpuslice",
        "/sys/fs/cgroup/gpuslice",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|p| p.exists())
    .collect()
}

/// Slice cgroups a launcher with this pid made (named `<pid>-<suffix>`).
fn cgroups_of(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("{pid}-");
    cgroup_roots()
        .into_iter()
        .flat_map(|r| std::fs::read_dir(r).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

#[test]
fn bad_input_is_one_line_exit_125_and_leaves_nothing() {
    let (_beside, h) = common::host_beside_others(fake_host(4, true));
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--gpus", "9", "--", "true"],
            "no GPU matches \"9\"",
        ),
        (
            &["run", "--gpus", "1-", "--", "true"],
            "malformed GPU selector",
        ),
        (&["run", "--gpus", "1"], "required"),
        (
            &["run", "--gpus", "1", "--frobnicate", "--", "true"],
            "unexpected argument",
        ),
        (
            &["run", "--gpus", "1", "--", "/nonexistent/cmd"],
            "cannot execute",
        ),
    ];
    for (args, want) in cases {
        let child = gpuslice(&h, args).stderr(Stdio::piped()).spawn().unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        if args.contains(&"/nonexistent/cmd") {
            assert_eq!(code, Some(127), "{args:?}: {err}");
        } else {
            assert_eq!(code, Some(125), "{args:?}: {err}");
        }
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line, got {err:?}"
        );
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            cgroups_of(pid).is_empty(),
            "{args:?} left {:?}",
            cgroups_of(pid)
        );
    }
    assert!(
        mounts_below(h.root()).is_empty(),
        "{:?}",
        mounts_below(h.root())
    );
}

#[test]
fn exit_codes_and_signals_propagate() {
    let (_beside, h) = common::host_beside_others(fake_host(2, true));
    let code = |script: &str| {
        run(&h, &["run", "--gpus", "0", "--", "sh", "-c", script])
            .status
            .code()
    };
    assert_eq!(code("exit 7"), Some(7));
    assert_eq!(code("exit 0"), Some(0));
    assert_eq!(code("kill -KILL $$"), Some(128 + 9));

    // A SIGTERM sent to the launcher reaches the child, whose death is the launcher's code.
    let mut child = gpuslice(&h, &["run", "--gpus", "0", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    assert!(cgroups_of(child.id()).is_empty());
}

#[test]
fn a_killed_launchers_cgroup_is_reaped_by_the_next_run() {
    let (_beside, h) = common::host_beside_others(fake_host(2, true));
    for cg in ["v1", "v2"] {
        let mut child = gpuslice(
            &h,
            &["run", "--gpus", "0", "--cgroup", cg, "--", "sleep", "30"],
        )
        .spawn()
        .unwrap();
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while cgroups_of(pid).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left = cgroups_of(pid);
        assert_eq!(left.len(), 1, "{cg}: the slice cgroup exists while it runs");
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(9));
        // The child dies with its launcher (PDEATHSIG); its cgroup stays behind…
        // The orphaned child is reaped by pid 1, which can take a while here.
        let procs = || std::fs::read_to_string(left[0].join("cgroup.procs")).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !procs().trim().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(procs().trim(), "", "{cg}: the child outlived its launcher");
        // …until the next run reaps it (a run of a test beside this one may get there first).
        let out = gpuslice(&h, &["run", "--gpus", "0", "--cgroup", cg, "--", "true"])
            .env("GPUSLICE_LOG_LEVEL", "debug")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        // A run beside it that got there first may still be removing it.
        let deadline = Instant::now() + Duration::from_secs(2);
        while left[0].exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !left[0].exists(),
            "{cg}: stale cgroup {} not reaped: {err}",
            left[0].display()
        );
    }
}

#[test]
fn nothing_is_left_after_a_normal_run() {
    let (_beside, h) = common::host_beside_others(fake_host(2, true));
    let child = gpuslice(&h, &["run", "--gpus", "1", "--", "true"])
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(child.wait_with_output().unwrap().status.success());
    assert!(cgroups_of(pid).is_empty());
    assert!(mounts_below(h.root()).is_empty());
}

#[test]
fn a_rootless_caller_gets_the_private_dev_and_overlay_through_a_user_namespace() {
    let (_beside, h) = common::host_beside_others(fake_host(2, true));
    // The test host is private to root by default; nobody must be able to read it.
    std::fs::set_permissions(
        h.root(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let r = h.root().display().to_string();
    let script = format!(
        "id -u; grep ModifyDeviceFiles {r}/proc/driver/nvidia/params; ls {r}/dev | grep '^nvidia[0-9]'; \
         ls {r}/proc/driver/nvidia/gpus/*/ | grep -c information"
    );
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        GPUSLICE,
        "-v",
        "--host-root",
        &r,
    ]);
    c.args(["run", "--gpus", "1", "--", "sh", "-c", &script]);
    let out = c.output().expect("setpriv (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stdout, "65534\nModifyDeviceFiles: 0\nnvidia1\n1\n",
        "{stderr}"
    );
    assert!(
        stderr.contains("user_namespace=true"),
        "-v names the active layers: {stderr}"
    );
}

#[test]
fn the_inventory_is_cached_between_launches() {
    let (_beside, h) = common::host_beside_others(fake_host(2, true));
    let cache = tempfile::tempdir().unwrap();
    let launch = || {
        let out = gpuslice(&h, &["run", "--gpus", "1", "--", "true"])
            .env("GPUSLICE_CACHE_DIR", cache.path())
            .env("GPUSLICE_LOG_LEVEL", "debug")
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    assert!(launch().contains("cached=false"));
    assert!(launch().contains("cached=true"));
}

#[test]
fn the_child_starts_inside_its_cgroup_with_either_version() {
    let (_beside, h) = common::host_beside_others(fake_host(2, true));
    for cg in ["v1", "v2"] {
        let out = gpuslice(
            &h,
            &[
                "run",
                "--gpus",
                "1",
                "--cgroup",
                cg,
                // The host's cgroup namespace, to see the path (by default
                // the slice's cgroup is the root of its own: `0::/`).
                "--privileged",
                "--",
                "cat",
                "/proc/self/cgroup",
            ],
        )
        .env("GPUSLICE_LOG_LEVEL", "debug")
        .output()
        .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{stderr}");
        let line = if cg == "v2" {
            "0::/gpuslice/"
        } else {
            ":devices:/gpuslice/"
        };
        assert!(stdout.contains(line), "--cgroup {cg}: {stdout}");
        // On cgroup v2 the child is created in the cgroup (Linux >= 5.7);
        // v1 has no such clone and joins by writing cgroup.procs.
        assert_eq!(
            stderr.contains("forked into the slice cgroup (clone3)"),
            cg == "v2",
            "--cgroup {cg}: {stderr}"
        );
    }
}
