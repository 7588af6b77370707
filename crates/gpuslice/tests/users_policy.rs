//! `run --user`, the sudo default, the admin policy, GPU node aliases and
//! host-root symlinks, on the fake GPU host with the real kernel. Needs
//! root (CI runs as root); users and groups are made for the test and
//! removed after.

use fakegpu::FakeHost;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::common;
use common::{printed, GPUSLICE};
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
    let mut c = common::gpuslice_on(h);
    c.args(args)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .env_remove("GPUSLICE_POLICY");
    c
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
fn sudo_cmd(h: &FakeHost, user: &TestUser, p: &PolicyFile, args: &[&str]) -> Command {
    let mut c = gpuslice(h, args);
    c.env("SUDO_UID", user.uid.to_string())
        .env("SUDO_GID", user.gid.to_string())
        .env("GPUSLICE_POLICY", &p.path);
    c
}

fn sudo(h: &FakeHost, user: &TestUser, p: &PolicyFile, args: &[&str]) -> Output {
    sudo_cmd(h, user, p, args).output().unwrap()
}

/// `gpuslice run …` as root, its output.
fn root_run(h: &FakeHost, args: &[&str]) -> Output {
    gpuslice(h, args).output().unwrap()
}

/// Exit 125 with one line saying `want`.
fn refused(out: &Output, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(want), "wanted {want:?}: {err}");
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A policy with one rule for `user` on every GPU of `h`, plus `extra` lines.
fn rule_for(h: &FakeHost, user: &TestUser, extra: &str) -> PolicyFile {
    policy(&format!(
        "host_roots = [{:?}]\n[[rule]]\nusers = [{:?}]\ngpus = [\"all\"]\n{extra}",
        h.root().display().to_string(),
        user.name
    ))
}

/// A fake host of `gpus` GPUs, a test user, and a policy with one rule
/// for that user on every GPU, plus `extra` lines (see [`rule_for`]).
fn bound_caller(gpus: u32, extra: &str) -> (FakeHost, TestUser, PolicyFile) {
    let h = host(gpus);
    let u = TestUser::new();
    let p = rule_for(&h, &u, extra);
    (h, u, p)
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

/// `run --gpus 1 [--user SPEC] -- sh -c STATUS` as root: its output.
fn status_as(h: &FakeHost, user: Option<&str>) -> String {
    let mut args = vec!["run", "--gpus", "1"];
    if let Some(spec) = user {
        args.extend(["--user", spec]);
    }
    args.extend(["--", "sh", "-c", STATUS]);
    let out = root_run(h, &args);
    assert!(out.status.success(), "--user {user:?}: {}", printed(&out));
    printed(&out)
}

#[test]
fn user_by_name_and_id_runs_with_its_groups_and_no_root_powers() {
    let _beside = common::beside_others();
    let h = host(2);
    let u = TestUser::new();
    let mut want_groups = vec![u.gid, u.extra_gid];
    want_groups.sort();
    for spec in [u.name.clone(), u.uid.to_string()] {
        let t = status_as(&h, Some(&spec));
        assert_eq!(status_line(&t, "Uid:"), [u.uid; 4], "--user {spec}: {t}");
        assert_eq!(status_line(&t, "Gid:"), [u.gid; 4], "--user {spec}: {t}");
        let mut groups = status_line(&t, "Groups:");
        groups.sort();
        assert_eq!(
            groups, want_groups,
            "--user {spec}: supplementary groups: {t}"
        );
        assert!(
            t.contains("CapEff:\t0000000000000000"),
            "--user {spec}: {t}"
        );
        let env = format!("user={} home=/nonexistent/{}", u.name, u.name);
        assert!(t.contains(&env), "{t}");
    }
    // USER:GROUP by name; a bare numeric id the database does not know.
    let t = status_as(&h, Some(&format!("{}:gpsx{}", u.name, &u.name[4..])));
    assert_eq!(status_line(&t, "Gid:"), [u.extra_gid; 4], "{t}");
    let t = status_as(&h, Some("4242:4343"));
    assert_eq!(status_line(&t, "Uid:"), [4242; 4], "{t}");
    assert_eq!(status_line(&t, "Gid:"), [4343; 4], "{t}");
    assert!(status_line(&t, "Groups:").is_empty(), "{t}");
    // Without --user, root stays root (the opt-out the test can fail on).
    assert_eq!(status_line(&status_as(&h, None), "Uid:"), [0; 4]);
    // The selected GPU still works for the user; the others stay hidden.
    let probe = [
        "run",
        "--gpus",
        "1",
        "--user",
        &u.name,
        "--",
        PROBE,
        "--ignore-visible-devices",
    ];
    let out = root_run(&h, &probe);
    let v = common::json_stdout(&out);
    assert_eq!(v["count"], 1, "{v}");
    // An unknown user: exit 125, one line.
    refused(
        &root_run(
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
        ),
        "no such user",
    );
}

#[test]
fn under_sudo_the_command_runs_as_the_caller_unless_the_policy_allows_root() {
    let _beside = common::beside_others();
    let (h, u, p) = bound_caller(2, "");
    let out = sudo(
        &h,
        &u,
        &p,
        &["run", "--gpus", "1", "--", "sh", "-c", STATUS],
    );
    let t = printed(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(status_line(&t, "Uid:"), [u.uid; 4], "{t}");
    assert!(t.contains(&format!("user={}", u.name)), "{t}");
    // --user root: refused by this policy, allowed by one that says so.
    let as_root = ["run", "--gpus", "1", "--user", "root", "--", "id", "-u"];
    refused(&sudo(&h, &u, &p, &as_root), "allow_root = false");
    let p_root = rule_for(&h, &u, "allow_root = true\n");
    assert_eq!(stdout(&sudo(&h, &u, &p_root, &as_root)), "0\n");
    // Another user's identity: never.
    let as_nobody = ["run", "--gpus", "1", "--user", "nobody", "--", "id", "-u"];
    refused(
        &sudo(&h, &u, &p_root, &as_nobody),
        "runs commands only as itself",
    );
}

/// Held by the tests whose runs make ledgers in the default directory (a
/// bound caller cannot choose another), so that one test's [`leftovers`]
/// never sees another's live slice come or go.
fn default_ledger_dir() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// What `after` holds that `before` did not (a run may also reap a stale
/// ledger that an earlier, killed test left: that one is gone, not new).
fn left_behind(before: &[String], after: Vec<String>) -> Vec<String> {
    after.into_iter().filter(|e| !before.contains(e)).collect()
}

/// Ledgers (in the default directory) and mounts below the fake host,
/// which a run must not leave.
fn leftovers(h: &FakeHost) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir(gpuslice_ledger::ledger_dir())
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
    let _beside = common::beside_others();
    let _ledgers = default_ledger_dir();
    let h = host(4);
    let u = TestUser::new();
    let other = TestUser::new();
    let before = leftovers(&h);
    let root_h = h.root().display().to_string();
    let p = policy(&format!(
        "host_roots = [{root_h:?}]\n\
         [[rule]]\nname = \"team\"\ngroups = [\"gpsx{}\"]\ngpus = [\"1\", \"3\"]\nmax_memory = \"1GiB\"\nmax_compute = 50\n",
        &u.name[4..]
    ));
    let run = |args: &str| {
        let mut a = vec!["run"];
        a.extend(args.split_whitespace());
        a.extend(["--", "touch", "/tmp/gpuslice-policy-must-not-run"]);
        sudo(&h, &u, &p, &a)
    };
    let caps = "--memory 1GiB --compute 50";
    for args in [
        format!("--gpus 1 {caps}"),
        "--gpus 1,3 --memory 512MiB --compute 10".into(),
    ] {
        let out = run(&args);
        assert!(out.status.success(), "{args}: {}", printed(&out));
        std::fs::remove_file("/tmp/gpuslice-policy-must-not-run").unwrap();
    }
    for (args, want) in [
        (format!("--gpus 0 {caps}"), "GPU 0"),
        (format!("--gpus all {caps}"), "GPU 0"),
        ("--gpus 1 --compute 50".into(), "without --memory"),
        ("--gpus 1 --memory 2GiB --compute 50".into(), "max_memory"),
        ("--gpus 1 --memory 1GiB".into(), "without --compute"),
        (
            "--gpus 1 --memory 1GiB --compute 60".into(),
            "max_compute = 50",
        ),
        (
            format!("--gpus 1 {caps} --isolation env"),
            "allow_privileged",
        ),
        (format!("--gpus 1 {caps} --user root"), "allow_root"),
        (format!("--gpus 1 {caps} --user 0:0"), "allow_root"),
    ] {
        let out = run(&args);
        refused(&out, want);
        refused(&out, "refused by policy");
        refused(&out, "rule \"team\"");
        assert!(
            !Path::new("/tmp/gpuslice-policy-must-not-run").exists(),
            "{args} ran"
        );
    }
    // Not named by any rule; a host root the policy does not list; no file.
    let true_ = ["run", "--gpus", "1", "--", "true"];
    refused(
        &sudo(&h, &other, &p, &true_),
        "no rule of the policy names user",
    );
    refused(
        &sudo(&host(4), &u, &p, &true_),
        "not in the policy's host_roots",
    );
    let missing = PolicyFile {
        _dir: tempfile::tempdir().unwrap(),
        path: PathBuf::from("/nonexistent/gpuslice/policy.toml"),
    };
    refused(&sudo(&h, &u, &missing, &true_), "no policy file");
    // Root itself is not bound by the policy (the test can fail: the same
    // refused request passes for root).
    let out = gpuslice(
        &h,
        &["run", "--gpus", "0", "--isolation", "env", "--", "true"],
    )
    .env("GPUSLICE_POLICY", &p.path)
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", printed(&out));
    assert_eq!(left_behind(&before, leftovers(&h)), Vec::<String>::new());
}

#[test]
fn a_sudo_caller_cannot_choose_the_shim_root_preloads() {
    let _beside = common::beside_others();
    let _ledgers = default_ledger_dir();
    let (h, u, p) = bound_caller(2, "");
    // Any file will do: gpuslice only checks that it is one (an empty one
    // here, told apart from the real shim by its size).
    let fake_shim = tempfile::NamedTempFile::new().unwrap();
    // The slice preloads what is at its fixed place, through its own
    // /etc/ld.so.preload: which file is bound there?
    let args = [
        "run",
        "--gpus",
        "1",
        "--memory",
        "1GiB",
        "--",
        "sh",
        "-c",
        "cat /etc/ld.so.preload; test -s /run/gpuslice/slice/libgpuslice.so && echo real-shim || echo empty-shim",
    ];
    let mut as_user = sudo_cmd(&h, &u, &p, &args);
    let out = as_user
        .env("GPUSLICE_SHIM", fake_shim.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", printed(&out));
    assert!(
        stdout(&out).contains("/run/gpuslice/slice/libgpuslice.so")
            && stdout(&out).contains("real-shim"),
        "the real shim: {}",
        printed(&out)
    );
    // Root may (the control: the assertion above can fail).
    let out = gpuslice(&h, &args)
        .env("GPUSLICE_SHIM", fake_shim.path())
        .output()
        .unwrap();
    assert!(stdout(&out).contains("empty-shim"), "{}", printed(&out));
}

#[test]
fn bad_policy_files_are_refused_naming_the_field() {
    let _beside = common::beside_others();
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
        refused(
            &sudo(&h, &u, &policy(body), &["run", "--gpus", "0", "--", "true"]),
            want,
        );
    }
}

#[test]
fn a_non_root_caller_cannot_point_gpuslice_at_its_own_policy() {
    let _beside = common::beside_others();
    let (h, u, p) = bound_caller(1, "allow_root = true\nallow_privileged = true\n");
    let root_h = h.root().display().to_string();
    let as_root = ["run", "--gpus", "0", "--user", "root", "--", "id", "-u"];
    let dir_mode = |mode| {
        std::fs::set_permissions(
            p.path.parent().unwrap(),
            std::fs::Permissions::from_mode(mode),
        )
        .unwrap()
    };
    // Under sudo: a file the user owns, or one in a directory others may write.
    std::os::unix::fs::chown(&p.path, Some(u.uid), None).unwrap();
    refused(
        &sudo(&h, &u, &p, &as_root),
        &format!("owned by uid {}", u.uid),
    );
    std::os::unix::fs::chown(&p.path, Some(0), None).unwrap();
    dir_mode(0o777);
    refused(&sudo(&h, &u, &p, &as_root), "world-writable");
    // The same file, made root's alone: honoured (so the refusals above are
    // the ownership checks, not something else).
    dir_mode(0o700);
    assert_eq!(stdout(&sudo(&h, &u, &p, &as_root)), "0\n");

    // A setuid-root install run by the user: GPUSLICE_POLICY is ignored
    // (only /etc/gpuslice/policy.toml counts), whoever owns the file.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("gpuslice");
    std::fs::copy(GPUSLICE, &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let as_user = |args: &[&str]| {
        Command::new("setpriv")
            .arg(format!("--reuid={}", u.uid))
            .arg(format!("--regid={}", u.gid))
            .arg("--init-groups")
            .arg(&exe)
            .args(["--host-root", &root_h])
            .args(args)
            .envs(h.env())
            .env("GPUSLICE_POLICY", &p.path)
            .env_remove("SUDO_UID")
            .output()
            .expect("setpriv (util-linux)")
    };
    let out = as_user(&as_root);
    let t = printed(&out);
    assert_eq!(out.status.code(), Some(125), "{t}");
    assert!(t.contains("/etc/gpuslice/policy.toml"), "{t}");
    assert!(!t.contains(&p.path.display().to_string()), "{t}");
    assert!(!stdout(&out).contains('0'), "{t}");
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
    let out = as_user(&["cdi", "generate", "--output", spec.to_str().unwrap()]);
    assert!(!spec.exists(), "written as root: {}", printed(&out));
    assert!(
        printed(&out).contains("ermission denied"),
        "{}",
        printed(&out)
    );
}

#[test]
fn gpu_node_aliases_are_hidden_by_device_number() {
    let _beside = common::beside_others();
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
        assert!(out.status.success(), "{}", printed(&out));
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
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        want,
        "{}",
        printed(&out)
    );
    // With nothing hidden (--isolation cgroup: no private /dev) the aliases
    // are there: the assertions above can fail.
    assert!(run(&["--isolation", "cgroup"]).contains("gpu-alias0: shown"));
}

#[test]
fn host_root_symlinks_out_of_the_root_are_refused_and_nothing_is_read() {
    let _beside = common::beside_others();
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
    let out = root_run(
        &h,
        &[
            "run", "--gpus", "1", "--user", "nobody", "--", "sh", "-c", &cat,
        ],
    );
    assert!(
        printed(&out).contains("ModifyDeviceFiles: 0"),
        "{}",
        printed(&out)
    );

    std::fs::remove_file(&params).unwrap();
    std::os::unix::fs::symlink(&secret, &params).unwrap();
    for user in [&["--user", "nobody"][..], &[]] {
        let mut a = vec!["run", "--gpus", "1"];
        a.extend_from_slice(user);
        a.extend(["--", "sh", "-c", &cat]);
        let out = gpuslice(&h, &a).output().unwrap();
        let t = printed(&out);
        assert_eq!(out.status.code(), Some(125), "{user:?}: {t}");
        assert!(
            t.contains("params") && t.contains("symbolic link"),
            "{user:?}: {t}"
        );
        assert!(!t.contains("TOPSECRET"), "{user:?}: {t}");
    }
    std::fs::remove_file(&params).unwrap();
    std::fs::write(&params, "ModifyDeviceFiles: 1\n").unwrap();

    // A masked GPU directory, and the root's /dev, linking out of the
    // root: refused, and no mount lands where they point.
    let bus0 = std::fs::read_dir(h.root().join("proc/driver/nvidia/gpus"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .min()
        .unwrap();
    for (i, path) in [bus0, h.root().join("dev")].iter().enumerate() {
        let moved = secret_dir.path().join(format!("moved{i}"));
        std::fs::rename(path, &moved).unwrap();
        std::os::unix::fs::symlink(&moved, path).unwrap();
        let out = root_run(&h, &["run", "--gpus", "1", "--", "true"]);
        std::fs::remove_file(path).unwrap();
        std::fs::rename(&moved, path).unwrap();
        assert_eq!(out.status.code(), Some(125), "{}", printed(&out));
        assert!(printed(&out).contains("symbolic link"), "{}", printed(&out));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&secret_dir.path().display().to_string()));
}

/// A CDI spec (root's) for `example.com/test=d`: GPU `gpu`'s node and a
/// limits record capping it at `memory`, with the built shim.
fn capped_spec(h: &FakeHost, dir: &Path, gpu: usize, memory: &str) {
    use gpuslice_ledger::limits::{DeviceLimits, MemorySize, Mode, SliceLimits};
    std::fs::create_dir_all(dir).unwrap();
    let record = dir.join("record");
    let limits = SliceLimits {
        slice_id: "d".into(),
        mode: Mode::Cap,
        devices: vec![DeviceLimits {
            uuid: h.gpus()[gpu].uuid.clone(),
            memory: Some(memory.parse::<MemorySize>().unwrap()),
            compute: Some("50".parse().unwrap()),
        }],
    };
    std::fs::write(&record, limits.render()).unwrap();
    let shim = gpuslice_testkit::shim_so();
    let spec = serde_json::json!({
        "cdiVersion": "0.6.0",
        "kind": "example.com/test",
        "devices": [{"name": "d", "containerEdits": {
            "deviceNodes": [{"path": format!("/dev/nvidia{gpu}"), "hostPath": h.path(format!("dev/nvidia{gpu}"))}],
            "mounts": [
                {"hostPath": shim, "containerPath": "/usr/local/gpuslice/libgpuslice.so", "options": ["ro", "bind"]},
                {"hostPath": record, "containerPath": "/run/gpuslice/slice/limits", "options": ["ro", "bind"]},
            ],
        }}],
    });
    std::fs::write(dir.join("test.json"), spec.to_string()).unwrap();
}

/// A CDI device's record stands for --memory/--compute: a bound caller
/// gets the GPUs and caps the policy allows, no more.
#[test]
fn the_policy_holds_for_cdi_devices() {
    let _beside = common::beside_others();
    let _ledgers = default_ledger_dir();
    let (h, u, p) = bound_caller(4, "max_memory = \"1GiB\"\nmax_compute = 50\n");
    let specs = tempfile::tempdir().unwrap();
    let ledgers = tempfile::tempdir().unwrap();
    let run = |memory: &str| {
        capped_spec(&h, specs.path(), 1, memory);
        let mut c = sudo_cmd(
            &h,
            &u,
            &p,
            &[
                "run",
                "--cdi-spec-dir",
                specs.path().to_str().unwrap(),
                "--cdi-device",
                "example.com/test=d",
                "--",
                "true",
            ],
        );
        c.env("GPUSLICE_LEDGER_DIR", ledgers.path())
            .env("GPUSLICE_BOARD_DIR", ledgers.path().join("boards"))
            .output()
            .unwrap()
    };
    let out = run("512MiB");
    assert!(out.status.success(), "{}", printed(&out));
    refused(&run("2GiB"), "max_memory");
}

#[test]
fn the_policy_can_give_every_bound_caller_a_read_only_root() {
    let _beside = common::beside_others();
    // `read_only_root` in the policy: a sudo caller's root command cannot
    // change the host's root (what later tenants run), only what
    // `writable` lists.
    let h = host(2);
    let u = TestUser::new();
    let root_h = h.root().display().to_string();
    let with = |extra: &str| {
        policy(&format!(
            "host_roots = [{root_h:?}]\n{extra}[[rule]]\nusers = [{:?}]\ngpus = [\"all\"]\nallow_root = true\n",
            u.name
        ))
    };
    let script = "for p in /usr/local/.gpuslice-pol-$$ /tmp/.pol-$$ /var/tmp/.pol-$$; do \
                  (: > $p) 2>/dev/null && echo \"$p\" && rm -f $p; done | sed 's/-[0-9]*$//'";
    let args = [
        "run", "--gpus", "1", "--user", "root", "--", "sh", "-c", script,
    ];
    let p = with("read_only_root = true\nwritable = [\"/tmp\"]\n");
    let out = sudo(&h, &u, &p, &args);
    assert_eq!(stdout(&out), "/tmp/.pol\n", "{}", printed(&out));
    let p = with("");
    let out = sudo(&h, &u, &p, &args);
    assert_eq!(
        stdout(&out),
        "/usr/local/.gpuslice-pol\n/tmp/.pol\n/var/tmp/.pol\n",
        "{}",
        printed(&out)
    );
}
