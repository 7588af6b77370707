//! `run --user`, the sudo default, the admin policy, GPU node aliases and
//! host-root symlinks, on the fake GPU host with the real kernel. Needs
//! root (CI runs as root); users and groups are made for the test and
//! removed after.

use fakegpu::FakeHost;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

const GPUSLICE: &str = env!("CARGO_BIN_EXE_gpuslice");
const PROBE: &str = env!("CARGO_BIN_EXE_gpuslice-cuda-probe");

/// A fake host of `n` GPUs that other users may traverse (its tempdir is
/// root's 0700 by default, which would hide the slice's `/dev` from them).
fn host(n: u32) -> FakeHost {
    let h = FakeHost::builder().gpus(n).build().expect("fake host");
    std::fs::set_permissions(h.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
    h
}

/// `gpuslice --host-root <fake> ARGS` as root, with no sudo variables of
/// whoever runs the tests.
fn gpuslice(h: &FakeHost, args: &[&str]) -> Command {
    let mut c = Command::new(GPUSLICE);
    c.arg("--host-root")
        .arg(h.root())
        .args(args)
        .envs(h.env())
        .env("LC_ALL", "C")
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .env_remove("GPUSLICE_POLICY");
    c
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// A user (and its own primary and extra group) made for one test with
/// useradd/groupadd, removed on drop.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
    extra_gid: u32,
}

impl TestUser {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "{}{}",
            std::process::id() % 100_000,
            N.fetch_add(1, Ordering::SeqCst)
        );
        let name = format!("gpst{tag}");
        let extra = format!("gpsx{tag}");
        for g in [&name, &extra] {
            sh(&format!("groupadd {g}"));
        }
        sh(&format!(
            "useradd -M -d /nonexistent/{name} -s /bin/sh -g {name} -G {extra} {name}"
        ));
        let id = |flag: &str, who: &str| -> u32 {
            let out = Command::new("id").args([flag, who]).output().unwrap();
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
        };
        let gid_of = |g: &str| -> u32 {
            let out = Command::new("getent").args(["group", g]).output().unwrap();
            String::from_utf8_lossy(&out.stdout)
                .split(':')
                .nth(2)
                .unwrap()
                .parse()
                .unwrap()
        };
        Self {
            uid: id("-u", &name),
            gid: id("-g", &name),
            extra_gid: gid_of(&extra),
            name,
        }
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        // userdel also removes the user's own group where USERGROUPS_ENAB
        // is on; groupdel makes sure of it elsewhere (quietly).
        for (cmd, arg) in [
            ("userdel", self.name.clone()),
            ("groupdel", format!("gpsx{}", &self.name[4..])),
            ("groupdel", self.name.clone()),
        ] {
            let _ = Command::new(cmd).arg(arg).stderr(Stdio::null()).status();
        }
    }
}

fn sh(cmd: &str) {
    let st = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(st.success(), "{cmd}");
}

/// A policy file root alone can write (root-owned 0700 directory, 0644
/// file), as `GPUSLICE_POLICY` must name.
struct PolicyFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn policy(text: &str) -> PolicyFile {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    PolicyFile { _dir: dir, path }
}

/// `gpuslice run` as if `user` had called `sudo gpuslice …`.
fn sudo(h: &FakeHost, user: &TestUser, p: &PolicyFile, args: &[&str]) -> Command {
    let mut c = gpuslice(h, args);
    c.env("SUDO_UID", user.uid.to_string())
        .env("SUDO_GID", user.gid.to_string())
        .env("GPUSLICE_POLICY", &p.path);
    c
}

/// The Uid, Gid, Groups and CapEff lines of /proc/self/status in the slice.
const STATUS: &str =
    "grep -E '^(Uid|Gid|Groups|CapEff):' /proc/self/status; echo \"user=$USER home=$HOME\"";

fn status_line(out: &str, key: &str) -> Vec<u32> {
    let line = out
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("{key}: {out}"));
    line[key.len()..]
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

#[test]
fn user_by_name_and_id_runs_with_its_groups_and_no_root_powers() {
    let h = host(2);
    let u = TestUser::new();
    for spec in [u.name.clone(), u.uid.to_string()] {
        let out = gpuslice(
            &h,
            &[
                "run", "--gpus", "1", "--user", &spec, "--", "sh", "-c", STATUS,
            ],
        )
        .output()
        .unwrap();
        let t = text(&out);
        assert!(out.status.success(), "--user {spec}: {t}");
        assert_eq!(status_line(&t, "Uid:"), [u.uid; 4], "--user {spec}: {t}");
        assert_eq!(status_line(&t, "Gid:"), [u.gid; 4], "--user {spec}: {t}");
        let mut groups = status_line(&t, "Groups:");
        groups.sort();
        let mut want = vec![u.gid, u.extra_gid];
        want.sort();
        assert_eq!(groups, want, "--user {spec}: supplementary groups: {t}");
        assert!(
            t.contains("CapEff:\t0000000000000000"),
            "--user {spec}: {t}"
        );
        assert!(
            t.contains(&format!("user={} home=/nonexistent/{}", u.name, u.name)),
            "{t}"
        );
    }
    // USER:GROUP by name; a bare numeric id the database does not know.
    let spec = format!("{}:gpsx{}", u.name, &u.name[4..]);
    let out = gpuslice(
        &h,
        &[
            "run", "--gpus", "1", "--user", &spec, "--", "sh", "-c", STATUS,
        ],
    )
    .output()
    .unwrap();
    assert_eq!(
        status_line(&text(&out), "Gid:"),
        [u.extra_gid; 4],
        "{}",
        text(&out)
    );
    let out = gpuslice(
        &h,
        &[
            "run",
            "--gpus",
            "1",
            "--user",
            "4242:4343",
            "--",
            "sh",
            "-c",
            STATUS,
        ],
    )
    .output()
    .unwrap();
    let t = text(&out);
    assert_eq!(status_line(&t, "Uid:"), [4242; 4], "{t}");
    assert_eq!(status_line(&t, "Gid:"), [4343; 4], "{t}");
    assert!(status_line(&t, "Groups:").is_empty(), "{t}");
    // Without --user, root stays root (the opt-out the test can fail on).
    let out = gpuslice(&h, &["run", "--gpus", "1", "--", "sh", "-c", STATUS])
        .output()
        .unwrap();
    assert_eq!(status_line(&text(&out), "Uid:"), [0; 4]);
    // The selected GPU still works for the user; the others stay hidden.
    let out = gpuslice(
        &h,
        &[
            "run",
            "--gpus",
            "1",
            "--user",
            &u.name,
            "--",
            PROBE,
            "--ignore-visible-devices",
        ],
    )
    .output()
    .unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(v["count"], 1, "{v}");
    // An unknown user: exit 125, one line.
    let out = gpuslice(
        &h,
        &[
            "run",
            "--gpus",
            "1",
            "--user",
            "no-such-user-zz",
            "--",
            "true",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no such user") && err.trim().lines().count() == 1,
        "{err}"
    );
}

#[test]
fn under_sudo_the_command_runs_as_the_caller_unless_the_policy_allows_root() {
    let h = host(2);
    let u = TestUser::new();
    let root_h = h.root().display().to_string();
    let p = policy(&format!(
        "host_roots = [{root_h:?}]\n[[rule]]\nusers = [{:?}]\ngpus = [\"all\"]\n",
        u.name
    ));
    let out = sudo(
        &h,
        &u,
        &p,
        &["run", "--gpus", "1", "--", "sh", "-c", STATUS],
    )
    .output()
    .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(status_line(&t, "Uid:"), [u.uid; 4], "{t}");
    assert!(t.contains(&format!("user={}", u.name)), "{t}");
    // --user root: refused by this policy, allowed by one that says so.
    let out = sudo(
        &h,
        &u,
        &p,
        &["run", "--gpus", "1", "--user", "root", "--", "id", "-u"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(text(&out).contains("allow_root = false"), "{}", text(&out));
    let p_root = policy(&format!(
        "host_roots = [{root_h:?}]\n[[rule]]\nusers = [{:?}]\ngpus = [\"all\"]\nallow_root = true\n",
        u.name
    ));
    let out = sudo(
        &h,
        &u,
        &p_root,
        &["run", "--gpus", "1", "--user", "root", "--", "id", "-u"],
    )
    .output()
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "0\n",
        "{}",
        text(&out)
    );
    // Another user's identity: never.
    let out = sudo(
        &h,
        &u,
        &p_root,
        &["run", "--gpus", "1", "--user", "nobody", "--", "id", "-u"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out).contains("runs commands only as itself"),
        "{}",
        text(&out)
    );
}

/// Slice cgroups and ledgers a refused run must not leave.
fn leftovers(h: &FakeHost, ledgers: &Path) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir(ledgers)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().display().to_string())
        .collect();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let r = h.root().display().to_string();
    left.extend(mounts.lines().filter(|l| l.contains(&r)).map(String::from));
    left
}

#[test]
fn the_policy_allows_and_refuses_selections_caps_users_and_privileges() {
    let h = host(4);
    let u = TestUser::new();
    let other = TestUser::new();
    let ledgers = tempfile::tempdir().unwrap();
    let root_h = h.root().display().to_string();
    let p = policy(&format!(
        "host_roots = [{root_h:?}]\n\
         [[rule]]\nname = \"team\"\ngroups = [\"gpsx{}\"]\ngpus = [\"1\", \"3\"]\nmax_memory = \"1GiB\"\nmax_compute = 50\n",
        &u.name[4..]
    ));
    let allowed: &[&[&str]] = &[
        &["--gpus", "1", "--memory", "1GiB", "--compute", "50"],
        &["--gpus", "1,3", "--memory", "512MiB", "--compute", "10"],
        &["--gpus", "none", "--memory", "1GiB", "--compute", "50"],
    ];
    for args in allowed {
        let mut a = vec!["run"];
        a.extend_from_slice(args);
        a.extend(["--", "true"]);
        let out = sudo(&h, &u, &p, &a)
            .env("GPUSLICE_LEDGER_DIR", ledgers.path())
            .output()
            .unwrap();
        // `none` with --memory: refused by the CLI, not by the policy.
        if args[1] == "none" {
            assert!(
                text(&out).contains("need at least one GPU"),
                "{args:?}: {}",
                text(&out)
            );
            continue;
        }
        assert!(out.status.success(), "{args:?}: {}", text(&out));
    }
    let refused: &[(&[&str], &str)] = &[
        (
            &["--gpus", "0", "--memory", "1GiB", "--compute", "50"],
            "GPU 0",
        ),
        (
            &["--gpus", "all", "--memory", "1GiB", "--compute", "50"],
            "GPU 0",
        ),
        (&["--gpus", "1", "--compute", "50"], "without --memory"),
        (
            &["--gpus", "1", "--memory", "2GiB", "--compute", "50"],
            "max_memory",
        ),
        (&["--gpus", "1", "--memory", "1GiB"], "without --compute"),
        (
            &["--gpus", "1", "--memory", "1GiB", "--compute", "60"],
            "max_compute = 50",
        ),
        (
            &[
                "--gpus",
                "1",
                "--memory",
                "1GiB",
                "--compute",
                "50",
                "--isolation",
                "env",
            ],
            "allow_privileged",
        ),
        (
            &[
                "--gpus",
                "1",
                "--memory",
                "1GiB",
                "--compute",
                "50",
                "--user",
                "root",
            ],
            "allow_root",
        ),
        (
            &[
                "--gpus",
                "1",
                "--memory",
                "1GiB",
                "--compute",
                "50",
                "--user",
                "0:0",
            ],
            "allow_root",
        ),
    ];
    for (args, want) in refused {
        let mut a = vec!["run"];
        a.extend_from_slice(args);
        a.extend(["--", "touch", "/tmp/gpuslice-policy-must-not-run"]);
        let out = sudo(&h, &u, &p, &a)
            .env("GPUSLICE_LEDGER_DIR", ledgers.path())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line: {err}"
        );
        assert!(
            err.contains("refused by policy") && err.contains("rule \"team\""),
            "{args:?}: {err}"
        );
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            !Path::new("/tmp/gpuslice-policy-must-not-run").exists(),
            "{args:?} ran"
        );
    }
    // Not named by any rule; a host root the policy does not list.
    let out = sudo(&h, &other, &p, &["run", "--gpus", "1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out).contains("no rule of the policy names user"),
        "{}",
        text(&out)
    );
    let elsewhere = host(4);
    let out = sudo(&elsewhere, &u, &p, &["run", "--gpus", "1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out).contains("not in the policy's host_roots"),
        "{}",
        text(&out)
    );
    // No policy file at all: nobody but root.
    let missing = PolicyFile {
        _dir: tempfile::tempdir().unwrap(),
        path: PathBuf::from("/nonexistent/gpuslice/policy.toml"),
    };
    let out = sudo(&h, &u, &missing, &["run", "--gpus", "none", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out).contains("no policy file"), "{}", text(&out));
    // Root itself is not bound by the policy (the test can fail: the same
    // refused request passes for root).
    let out = gpuslice(
        &h,
        &["run", "--gpus", "0", "--isolation", "env", "--", "true"],
    )
    .env("GPUSLICE_POLICY", &p.path)
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        leftovers(&h, ledgers.path()).is_empty(),
        "{:?}",
        leftovers(&h, ledgers.path())
    );
}

#[test]
fn bad_policy_files_are_refused_naming_the_field() {
    let h = host(1);
    let u = TestUser::new();
    for (body, want) in [
        (
            "[[rule]]\nusers = [\"x\"]\ngpus = [\"0\"]\nmax_mem = \"1GiB\"\n",
            "rule[0].max_mem: line 4: unknown field `max_mem`",
        ),
        (
            "[[rule]]\nusers = [\"x\"]\nmax_memory = 1024\n",
            "rule[0].max_memory: line 3: invalid type: integer `1024`, expected a string",
        ),
        (
            "[[rule]]\nusers = [\"x\"]\nallow_root = \"yes\"\n",
            "rule[0].allow_root",
        ),
        (
            "[[rule]]\ngpus = [\"0\"]\n",
            "rule[0]: names no users and no groups",
        ),
    ] {
        let p = policy(body);
        let out = sudo(&h, &u, &p, &["run", "--gpus", "0", "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{body}: {err}");
        assert!(err.contains(want), "{body}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}

#[test]
fn a_non_root_caller_cannot_point_gpuslice_at_its_own_policy() {
    let h = host(1);
    let u = TestUser::new();
    let root_h = h.root().display().to_string();
    let permissive = format!(
        "host_roots = [{root_h:?}]\n[[rule]]\nusers = [{:?}]\ngpus = [\"all\"]\nallow_root = true\nallow_privileged = true\n",
        u.name
    );
    // Under sudo: a file the user owns, or one in a directory the user may write.
    let p = policy(&permissive);
    std::os::unix::fs::chown(&p.path, Some(u.uid), None).unwrap();
    let out = sudo(
        &h,
        &u,
        &p,
        &["run", "--gpus", "0", "--user", "root", "--", "true"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out).contains(&format!("owned by uid {}", u.uid)),
        "{}",
        text(&out)
    );
    std::os::unix::fs::chown(&p.path, Some(0), None).unwrap();
    std::fs::set_permissions(
        p.path.parent().unwrap(),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let out = sudo(
        &h,
        &u,
        &p,
        &["run", "--gpus", "0", "--user", "root", "--", "true"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out).contains("world-writable"), "{}", text(&out));
    // The same file, made root's: now honoured (so the refusals above are
    // the ownership checks, not something else).
    std::fs::set_permissions(
        p.path.parent().unwrap(),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let out = sudo(
        &h,
        &u,
        &p,
        &["run", "--gpus", "0", "--user", "root", "--", "id", "-u"],
    )
    .output()
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "0\n",
        "{}",
        text(&out)
    );

    // A setuid-root install run by the user: GPUSLICE_POLICY is ignored
    // (only /etc/gpuslice/policy.toml counts), whoever owns the file.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("gpuslice");
    std::fs::copy(GPUSLICE, &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={}", u.uid),
            &format!("--regid={}", u.gid),
            "--init-groups",
        ])
        .arg(&exe)
        .args([
            "--host-root",
            &root_h,
            "run",
            "--gpus",
            "0",
            "--user",
            "root",
            "--",
            "id",
            "-u",
        ])
        .envs(h.env())
        .env("GPUSLICE_POLICY", &p.path)
        .env_remove("SUDO_UID")
        .output()
        .expect("setpriv (util-linux)");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(125), "{t}");
    assert!(t.contains("/etc/gpuslice/policy.toml"), "{t}");
    assert!(!t.contains(&p.path.display().to_string()), "{t}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains('0'), "{t}");
    // Every other command of the setuid binary runs as the user: a CDI
    // spec cannot be written where only root may write (with root kept,
    // gpuslice-full, exec'ed from the setuid binary, would write it).
    std::fs::copy(
        Path::new(GPUSLICE).with_file_name("gpuslice-full"),
        dir.path().join("gpuslice-full"),
    )
    .unwrap();
    let private = tempfile::tempdir().unwrap(); // root's, 0700
    let spec = private.path().join("spec.json");
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={}", u.uid),
            &format!("--regid={}", u.gid),
            "--init-groups",
        ])
        .arg(&exe)
        .args(["--host-root", &root_h, "cdi", "generate", "--output"])
        .arg(&spec)
        .envs(h.env())
        .output()
        .unwrap();
    assert!(!spec.exists(), "written as root: {}", text(&out));
    assert!(text(&out).contains("ermission denied"), "{}", text(&out));
}

#[test]
fn gpu_node_aliases_are_hidden_by_device_number() {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    let h = host(4);
    let dev = h.root().join("dev");
    let node = |path: &Path, minor| {
        mknod(
            path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(195, minor),
        )
        .unwrap()
    };
    std::fs::create_dir_all(dev.join("sub/deeper")).unwrap();
    node(&dev.join("gpu-alias0"), 0);
    node(&dev.join("sub/nvidia0"), 0);
    node(&dev.join("sub/deeper/x2"), 2);
    node(&dev.join("gpu-alias1"), 1);
    std::os::unix::fs::symlink("nvidia0", dev.join("link0")).unwrap();
    let d = dev.display();
    let script = format!(
        "for p in gpu-alias0 sub/nvidia0 sub/deeper/x2 link0 nvidia0 gpu-alias1 nvidia1; do \
         if [ -e {d}/$p ]; then echo \"$p: shown\"; else echo \"$p: gone\"; fi; done"
    );
    let run = |extra: &[&str]| {
        let mut a = vec!["run", "--gpus", "1"];
        a.extend_from_slice(extra);
        a.extend(["--", "sh", "-c", &script]);
        let out = gpuslice(&h, &a).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let want = "gpu-alias0: gone\nsub/nvidia0: gone\nsub/deeper/x2: gone\nlink0: gone\n\
                nvidia0: gone\ngpu-alias1: shown\nnvidia1: shown\n";
    // As root (overlay with whiteouts) and as a user (the same view).
    assert_eq!(run(&[]), want);
    assert_eq!(run(&["--user", "nobody"]), want);
    // Through a user namespace (a rootless caller's tmpfs mirror).
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", GPUSLICE])
        .args(["--host-root", &h.root().display().to_string()])
        .args(["run", "--gpus", "1", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{}", text(&out));
    // With nothing hidden (--isolation cgroup: no private /dev) the aliases
    // are there: the assertions above can fail.
    assert!(run(&["--isolation", "cgroup"]).contains("gpu-alias0: shown"));
}

#[test]
fn host_root_symlinks_out_of_the_root_are_refused_and_nothing_is_read() {
    let h = host(2);
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = secret_dir.path().join("shadow");
    std::fs::write(
        &secret,
        "root:TOPSECRET:1:0:99999:7:::\nModifyDeviceFiles: 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let params = h.root().join("proc/driver/nvidia/params");
    let cat = format!("cat {}", params.display());
    // The opt-out the test can fail on: a plain params is shown (with
    // ModifyDeviceFiles forced to 0).
    let out = gpuslice(
        &h,
        &[
            "run", "--gpus", "1", "--user", "nobody", "--", "sh", "-c", &cat,
        ],
    )
    .output()
    .unwrap();
    assert!(
        text(&out).contains("ModifyDeviceFiles: 0"),
        "{}",
        text(&out)
    );

    std::fs::remove_file(&params).unwrap();
    std::os::unix::fs::symlink(&secret, &params).unwrap();
    for user in [&["--user", "nobody"][..], &[]] {
        let mut a = vec!["run", "--gpus", "1"];
        a.extend_from_slice(user);
        a.extend(["--", "sh", "-c", &cat]);
        let out = gpuslice(&h, &a).output().unwrap();
        let t = text(&out);
        assert_eq!(out.status.code(), Some(125), "{user:?}: {t}");
        assert!(
            t.contains("params") && t.contains("symbolic link"),
            "{user:?}: {t}"
        );
        assert!(!t.contains("TOPSECRET"), "{user:?}: {t}");
    }
    std::fs::remove_file(&params).unwrap();
    std::fs::write(&params, "ModifyDeviceFiles: 1\n").unwrap();

    // A masked GPU directory that links out: error, no mount lands there.
    let gpus = h.root().join("proc/driver/nvidia/gpus");
    let bus0 = std::fs::read_dir(&gpus)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .min()
        .unwrap();
    let moved = secret_dir.path().join("gpu0");
    std::fs::rename(&bus0, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &bus0).unwrap();
    let out = gpuslice(&h, &["run", "--gpus", "1", "--", "true"])
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(125), "{t}");
    assert!(t.contains("symbolic link"), "{t}");
    std::fs::remove_file(&bus0).unwrap();
    std::fs::rename(&moved, &bus0).unwrap();

    // The root's /dev linking out of it.
    let dev = h.root().join("dev");
    let real_dev = secret_dir.path().join("dev");
    std::fs::rename(&dev, &real_dev).unwrap();
    std::os::unix::fs::symlink(&real_dev, &dev).unwrap();
    let out = gpuslice(&h, &["run", "--gpus", "1", "--", "true"])
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(125), "{t}");
    assert!(t.contains("symbolic link"), "{t}");
    std::fs::remove_file(&dev).unwrap();
    std::fs::rename(&real_dev, &dev).unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&secret_dir.path().display().to_string()));
}
