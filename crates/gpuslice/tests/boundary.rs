//! The slice as a boundary, attacked. Each test makes one
//! attack from a root command in a slice on the fake GPU host with the
//! real kernel, asserts that it is refused by default, and shows that the
//! same attack gets through under `--privileged` (full root, today's
//! behaviour), so that the test fails if the defence goes. Needs root
//! (CI runs as root; see scripts/test.sh).
//!
//! Raw calls (ptrace, process_vm_readv, bpf) come from
//! tests/boundary/attack.py, which scripts/device_all.sh (PART boundary)
//! runs against the real driver too.

use crate::common;
use common::{printed, GPUSLICE};
use fakegpu::{FakeHost, FakeHostBuilder};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ATTACK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/boundary/attack.py");
const PRIVILEGED: &[&str] = &["--privileged"];
const HOST_PID: &[&str] = &["--pid", "host"];

/// The tests' fake host: 4 GPUs, ModifyDeviceFiles on.
fn fake_host() -> FakeHostBuilder {
    FakeHost::builder().gpus(4).modify_device_files(true)
}

/// `gpuslice --host-root <fake> run <flags> -- <argv>`.
fn launch(h: &FakeHost, flags: &[&str], argv: &[&str]) -> Command {
    let mut c = common::gpuslice_on(h);
    c.arg("run").args(flags).arg("--").args(argv);
    c
}

/// `gpuslice --host-root <fake> run --gpus 1 <flags> -- sh -c <script>`.
fn command(h: &FakeHost, flags: &[&str], script: &str) -> Command {
    launch(
        h,
        &[&["--gpus", "1"][..], flags].concat(),
        &["sh", "-c", script],
    )
}

/// What the script printed in a one-GPU slice with `flags` (stdout, then
/// stderr less --privileged's warning).
fn in_slice(h: &FakeHost, flags: &[&str], script: &str) -> String {
    common::printed_in_slice(&command(h, flags, script).output().expect("spawn gpuslice"))
}

/// Asserts what `script` prints in a one-GPU slice under each case's flags.
fn assert_prints(h: &FakeHost, script: &str, cases: &[(&[&str], &str)]) {
    for (flags, want) in cases {
        assert_eq!(in_slice(h, flags, script), *want, "{flags:?}");
    }
}

/// The host's python3.
fn python() -> &'static str {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("python3")
}

/// The attack helper's command line (one word out: ok or an errno name).
fn attack(args: &str) -> String {
    format!("{} {ATTACK} {args}", python())
}

fn root_of(h: &FakeHost) -> String {
    h.root().display().to_string()
}

/// Where a cgroup version is mounted on this host (hybrid: v2 under unified).
fn cgroup_mount(version: &str) -> &'static str {
    match version {
        "v1" => "/sys/fs/cgroup/devices",
        _ if Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists() => "/sys/fs/cgroup/unified",
        _ => "/sys/fs/cgroup",
    }
}

/// The device cgroup versions this host has: v1 where its devices
/// hierarchy is mounted (hybrid hosts like CI's), v2 everywhere.
fn versions() -> Vec<&'static str> {
    let v1 = Path::new("/sys/fs/cgroup/devices/cgroup.procs").exists();
    [("v1", v1), ("v2", true)]
        .into_iter()
        .filter_map(|(v, has)| has.then_some(v))
        .collect()
}

/// The path of `pid`'s cgroup in hierarchy `version`, from the host.
fn cgroup_of(pid: u32, version: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let want = if version == "v1" { ":devices:" } else { "0::" };
    text.lines()
        .find_map(|l| l.find(want).map(|i| l[i + want.len()..].to_string()))
        .unwrap_or_default()
}

/// A slice running `sleep` (another tenant), found from the host.
struct Victim {
    launcher: Child,
    /// Host pid of its `sleep`.
    pid: u32,
}

impl Victim {
    fn start(h: &FakeHost, flags: &[&str]) -> Victim {
        let mut c = launch(h, flags, &["sleep", "60"]);
        // Owned by the Victim at once: its Drop reaps the launcher even
        // when the start times out.
        let mut v = Victim {
            launcher: c.stderr(Stdio::null()).spawn().unwrap(),
            pid: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(pid) = descendant_named(v.launcher.id(), "sleep") {
                v.pid = pid;
                return v;
            }
            assert!(Instant::now() < deadline, "the victim slice did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
    }
}

/// A process named `comm` whose parent chain reaches `ancestor` (host view).
fn descendant_named(ancestor: u32, comm: &str) -> Option<u32> {
    let ppid = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .find(|&p| {
            let mut at = p;
            for _ in 0..8 {
                match ppid(at) {
                    Some(a) if a == ancestor => return true,
                    Some(a) if a > 1 => at = a,
                    _ => return false,
                }
            }
            false
        })
}

#[test]
fn a_slice_cannot_move_itself_out_of_its_cgroup() {
    let (_beside, h) = common::host_beside_others(fake_host());
    for v in versions() {
        let m = cgroup_mount(v);
        let script = format!(
            "echo $$ > {m}/cgroup.procs && echo moved-to-root; \
             echo $$ > {m}/gpuslice/cgroup.procs 2>/dev/null && echo moved-to-parent; \
             mkdir {m}/gpuslice/evil-$$ && echo made-sibling && rmdir {m}/gpuslice/evil-$$; \
             grep -c gpuslice /proc/self/cgroup"
        );
        let flags = ["--cgroup", v];
        let out = in_slice(&h, &flags, &script);
        assert!(
            out.contains("Read-only file system")
                && !out.contains("moved")
                && !out.contains("made"),
            "{v}: {out}"
        );
        let out = in_slice(&h, &[&flags[..], PRIVILEGED].concat(), &script);
        assert!(out.contains("moved-to-root"), "{v} --privileged: {out}");
    }
}

#[test]
fn a_slice_cannot_move_another_slices_process() {
    let (_beside, h) = common::host_beside_others(fake_host());
    for v in versions() {
        let victim = Victim::start(&h, &["--gpus", "0", "--cgroup", v]);
        let before = cgroup_of(victim.pid, v);
        assert!(before.contains("gpuslice/"), "{v}: {before}");
        let script = format!(
            "echo {} > {}/cgroup.procs && echo moved",
            victim.pid,
            cgroup_mount(v)
        );
        let flags = ["--cgroup", v];
        let out = in_slice(&h, &flags, &script);
        assert!(!out.contains("moved"), "{v}: {out}");
        assert_eq!(cgroup_of(victim.pid, v), before, "{v}: {out}");
        let out = in_slice(&h, &[&flags[..], PRIVILEGED].concat(), &script);
        assert!(out.contains("moved"), "{v} --privileged: {out}");
        assert!(!cgroup_of(victim.pid, v).contains("gpuslice/"), "{v}");
    }
}

/// `attack.py OP <pid>` from a slice against another slice's process:
/// what it says in the slice's own PID namespace (`own_pid_ns`), EPERM
/// where the victim is visible (`--pid host`), ok under `--privileged`.
fn attack_another_slice(op: &str, own_pid_ns: &str) {
    let (_beside, h) = common::host_beside_others(fake_host());
    let victim = Victim::start(&h, &["--gpus", "0"]);
    let script = attack(&format!("{op} {}", victim.pid));
    assert_prints(
        &h,
        &script,
        &[
            (&[], own_pid_ns),
            (HOST_PID, "EPERM\n"),
            (PRIVILEGED, "ok\n"),
        ],
    );
}

#[test]
fn a_slice_cannot_ptrace_another_slice() {
    // The seccomp filter answers before the kernel looks the pid up (which
    // names nothing in the slice's own PID namespace: see the /proc tests).
    attack_another_slice("ptrace", "EPERM\n");
}

#[test]
fn a_slice_cannot_read_another_slices_memory() {
    attack_another_slice("vmread", "ENOENT\n");
}

#[test]
fn a_slice_cannot_ptrace_its_launcher_or_init() {
    let (_beside, h) = common::host_beside_others(fake_host());
    // The parent: the slice's init by default, the launcher with --pid host.
    let script = attack("ptrace $PPID");
    assert_prints(
        &h,
        &script,
        &[
            (&[], "EPERM\n"),
            (HOST_PID, "EPERM\n"),
            (PRIVILEGED, "ok\n"),
        ],
    );
}

#[test]
fn proc_pid_root_of_other_slices_and_host_processes_is_not_there() {
    let (_beside, h) = common::host_beside_others(fake_host());
    let victim = Victim::start(&h, &["--gpus", "0"]);
    let hidden = format!("{}/dev/nvidia0", root_of(&h));
    let script = format!(
        "for p in {} {}; do [ -c /proc/$p/root{hidden} ] && echo reached || echo unreachable; done",
        victim.pid,
        std::process::id()
    );
    assert_prints(
        &h,
        &script,
        &[
            (&[], "unreachable\nunreachable\n"),
            (PRIVILEGED, "reached\nreached\n"),
        ],
    );
}

#[test]
fn setuid_to_a_host_users_uid_does_not_reach_its_proc_root() {
    let (_beside, h) = common::host_beside_others(fake_host());
    // A process of nobody's outside any slice, as on a shared server.
    let mut nobody = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sleep",
            "60",
        ])
        .spawn()
        .unwrap();
    let hidden = format!("{}/dev/nvidia0", root_of(&h));
    let script = format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups -- sh -c \
         '[ -c /proc/{}/root{hidden} ] && echo reached || echo unreachable'",
        nobody.id()
    );
    let default = in_slice(&h, &[], &script);
    let privileged = in_slice(&h, PRIVILEGED, &script);
    let _ = nobody.kill();
    let _ = nobody.wait();
    assert_eq!(default, "unreachable\n");
    assert_eq!(privileged, "reached\n");
}

#[test]
fn a_slice_cannot_detach_its_device_filter() {
    let (_beside, h) = common::host_beside_others(fake_host());
    let r = root_of(&h);
    let m = cgroup_mount("v2");
    let script = format!(
        "{}; mknod {r}/made-$$ c 195 0 2>/dev/null; \
         (exec 3<{r}/made-$$) 2>&1 | sed 's/.*: //'; rm -f {r}/made-$$",
        attack(&format!(
            "bpf-detach {m}$(sed -n 's/^0:://p' /proc/self/cgroup)"
        ))
    );
    let flags = ["--cgroup", "v2"];
    let out = in_slice(&h, &flags, &script);
    assert!(out.starts_with("EPERM\n"), "{out}");
    let out = in_slice(&h, &[&flags[..], PRIVILEGED].concat(), &script);
    // Detached: the node opens as far as a fake node can (ENXIO).
    assert_eq!(out, "ok\nNo such device or address\n");
}

#[test]
fn a_slice_cannot_unmount_or_remount_its_dev_and_params() {
    let (_beside, h) = common::host_beside_others(fake_host());
    let r = root_of(&h);
    let p = format!("{r}/proc/driver/nvidia/params");
    let script = format!(
        "while umount -l {r}/dev 2>/dev/null; do :; done; umount {p} 2>/dev/null; \
         mount -o remount,rw {p} 2>/dev/null; \
         ls {r}/dev | grep -c '^nvidia0$'; grep ModifyDeviceFiles {p}"
    );
    assert_prints(
        &h,
        &script,
        &[
            (&[], "0\nModifyDeviceFiles: 0\n"),
            (PRIVILEGED, "1\nModifyDeviceFiles: 1\n"),
        ],
    );
}

#[test]
fn a_slice_cannot_mount_a_new_devtmpfs_or_procfs() {
    let (_beside, h) = common::host_beside_others(fake_host());
    let script = "d=$(mktemp -d); \
         mount -t devtmpfs devtmpfs $d 2>/dev/null && echo devtmpfs && umount $d; \
         mount -t proc proc $d 2>/dev/null && echo procfs && umount $d; rmdir $d";
    assert_prints(&h, script, &[(&[], ""), (PRIVILEGED, "devtmpfs\nprocfs\n")]);
}

#[test]
fn a_slice_cannot_mknod() {
    let (_beside, h) = common::host_beside_others(fake_host());
    // Not a GPU node (the device cgroup refuses those even to full root,
    // tests/run_isolation.rs): the capability is what is tested here.
    let script = format!(
        "mknod {r}/m-$$ c 1 3 2>&1 | sed 's/.*: //'; [ -c {r}/m-$$ ] && echo made; rm -f {r}/m-$$",
        r = root_of(&h)
    );
    assert_prints(
        &h,
        &script,
        &[(&[], "Operation not permitted\n"), (PRIVILEGED, "made\n")],
    );
}

#[test]
fn a_slice_cannot_unshare_or_setns() {
    let (_beside, h) = common::host_beside_others(fake_host());
    let script = "unshare -m true 2>/dev/null && echo mount-ns; \
                  unshare -U true 2>/dev/null && echo user-ns; \
                  nsenter -t $PPID -m true 2>/dev/null && echo setns";
    assert_prints(
        &h,
        script,
        &[(&[], ""), (PRIVILEGED, "mount-ns\nuser-ns\nsetns\n")],
    );
}

#[test]
fn a_slice_cannot_write_the_hosts_sysctls() {
    let (_beside, h) = common::host_beside_others(fake_host());
    // Opened for writing only: no host sysctl is ever written, not even
    // with its own value.
    let script = open_for_writing("/proc/sys/kernel/hostname");
    assert_prints(
        &h,
        &script,
        &[(&[], "Read-only file system\n"), (PRIVILEGED, "opened\n")],
    );
}

/// A shell line that opens `path` for writing and closes it without
/// writing a byte (never write a host sysctl, not even one expected to
/// be refused): prints `opened`, else the error.
fn open_for_writing(path: &str) -> String {
    format!(
        "{} -c \"import os\ntry:\n os.close(os.open('{path}', os.O_WRONLY)); print('opened')\n\
         except OSError as e: print(e.strerror)\"",
        python()
    )
}

/// Default, `--strict`, and each of them with `--pid host`.
const MODES: [&[&str]; 4] = [
    &[],
    &["--strict"],
    &["--pid", "host"],
    &["--strict", "--pid", "host"],
];

#[test]
fn proc_sys_is_read_only_in_every_pid_mode() {
    // --pid host gave the host's /proc/sys back, writable, and
    // uid 0 without a capability set kernel.core_pattern (a pipe to a
    // root shell outside every namespace). Opened for writing only.
    let (_beside, h) = common::host_beside_others(fake_host());
    let script = format!(
        "{}; head -c1 /proc/interrupts 2>/dev/null | wc -c",
        open_for_writing("/proc/sys/kernel/core_pattern")
    );
    for mode in MODES {
        let out = in_slice(&h, mode, &script);
        // /proc/interrupts is masked (by /dev/null: reads empty).
        assert_eq!(out, "Read-only file system\n0\n", "{mode:?}");
    }
    let out = in_slice(&h, PRIVILEGED, &script);
    assert_eq!(out, "opened\n1\n", "--privileged");
}

/// A directory under /tmp with `fstype` mounted on it, unmounted on drop.
struct Mounted(tempfile::TempDir);

impl Mounted {
    fn new(fstype: &str) -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", fstype, fstype])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount -t {fstype}");
        Mounted(dir)
    }
    fn path(&self) -> String {
        self.0.path().display().to_string()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

#[test]
fn the_hosts_other_pseudo_filesystems_are_read_only_or_masked() {
    // A second procfs (a chroot's /proc), a second cgroup2 and a
    // bpffs mounted elsewhere on the host stayed writable in a slice.
    let (_beside, h) = common::host_beside_others(fake_host());
    let (p, c, b) = (
        Mounted::new("proc"),
        Mounted::new("cgroup2"),
        Mounted::new("bpf"),
    );
    let script = format!(
        "{}; ls {p}/ | grep -c '^[0-9]'; echo $$ > {c}/cgroup.procs && echo moved; \
         mkdir {b}/x-$$ 2>/dev/null && echo made && rmdir {b}/x-$$",
        open_for_writing(&format!("{}/sys/kernel/core_pattern", p.path())),
        p = p.path(),
        c = c.path(),
        b = b.path()
    );
    for mode in MODES {
        let out = in_slice(&h, mode, &script);
        // The procfs is masked: no host pid, no core_pattern.
        assert!(
            out.starts_with("No such file or directory\n0\n")
                && out.contains("Read-only file system")
                && !out.contains("moved")
                && !out.contains("made"),
            "{mode:?}: {out}"
        );
    }
    let out = in_slice(&h, PRIVILEGED, &script);
    assert!(
        out.starts_with("opened\n") && out.contains("moved\n") && out.contains("made\n"),
        "--privileged: {out}"
    );
}

#[test]
fn a_pseudo_filesystem_the_host_mounts_later_does_not_enter_a_slice() {
    // The slice's mount namespace is private: a slave of the host's would
    // receive a procfs mounted after the seal, unsealed.
    let (_beside, h) = common::host_beside_others(fake_host());
    let shared = Mounted::new("tmpfs");
    let d = shared.path();
    let ok = Command::new("mount")
        .args(["--make-shared", &d])
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount --make-shared");
    std::fs::create_dir(format!("{d}/p")).unwrap();
    let script = format!(
        "touch {d}/started; while [ ! -e {d}/go ]; do sleep 0.02; done; \
         ls {d}/p/ | grep -c '^[0-9]'"
    );
    for mode in [&[][..], HOST_PID] {
        let _ = std::fs::remove_file(format!("{d}/go"));
        let _ = std::fs::remove_file(format!("{d}/started"));
        let mut c = command(&h, mode, &script);
        let child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Path::new(&format!("{d}/started")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let ok = Command::new("mount")
            .args(["-t", "proc", "proc", &format!("{d}/p")])
            .status()
            .unwrap()
            .success();
        std::fs::write(format!("{d}/go"), b"").unwrap();
        let out = child.wait_with_output().unwrap();
        let _ = Command::new("umount").arg(format!("{d}/p")).status();
        assert!(ok, "mount -t proc");
        assert_eq!(printed(&out), "0\n", "{mode:?}");
    }
}

#[test]
fn a_slice_cannot_change_what_other_slices_load() {
    // Opens gpuslice-full for writing: no other test may be running it.
    let _alone = common::alone();
    // A --strict root command opened the installed shim for
    // writing; the driver libraries and the loader's configuration alike.
    // Each opened for writing only (never written), and a file made in
    // the fake driver's library directory (a name the loader would find).
    let h = fake_host().build().expect("build fake host");
    let lib_dir = h.driver_lib_dir().display().to_string();
    let exe = Path::new(GPUSLICE).parent().unwrap();
    let shim = ["libgpuslice.so", "libgpuslice_shim.so"]
        .iter()
        .map(|f| exe.join(f))
        .find(|p| p.is_file())
        .expect("the shim is built beside gpuslice");
    let files = [
        shim.display().to_string(),
        exe.join("gpuslice-full").display().to_string(),
        format!("{lib_dir}/libcuda.so.1"),
        "/etc/ld.so.cache".into(),
        "/etc/ld.so.preload".into(),
        "/etc/ld.so.conf".into(),
    ];
    let mut script: Vec<String> = files
        .iter()
        .filter(|f| Path::new(f).exists())
        .map(|f| open_for_writing(f))
        .collect();
    let n = script.len();
    script.push(format!(
        "ln -s /bin/true {lib_dir}/libnvidia-evil.so.1 2>/dev/null && echo made && rm {lib_dir}/libnvidia-evil.so.1"
    ));
    let script = script.join("; ");
    for mode in MODES {
        let out = in_slice(&h, mode, &script);
        assert_eq!(out, "Read-only file system\n".repeat(n), "{mode:?}");
    }
    let out = in_slice(&h, PRIVILEGED, &script);
    assert_eq!(
        out,
        format!("{}made\n", "opened\n".repeat(n)),
        "--privileged"
    );
}

#[test]
fn read_only_root_leaves_tmp_shm_and_the_working_directory_writable() {
    // --read-only-root: the host's root read-only in the slice (a root
    // tenant changes nothing a later one runs), a job's scratch writable.
    let (_beside, h) = common::host_beside_others(fake_host());
    let cwd = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let script = "for p in /usr/local/.gpuslice-ro-$$ /tmp/.ro-$$ /var/tmp/.ro-$$ /dev/shm/.ro-$$ ./.ro-$$; do \
                  (: > $p) 2>/dev/null && echo \"$p\" && rm -f $p; done | sed 's/-[0-9]*$//'";
    let writable = "/tmp/.ro\n/var/tmp/.ro\n/dev/shm/.ro\n./.ro\n";
    for mode in [
        &["--read-only-root"][..],
        &["--read-only-root", "--strict", "--pid", "host"],
        &["--read-only-root", "--memory", "1GiB"],
    ] {
        let out = command(&h, mode, script)
            .current_dir(cwd.path())
            .output()
            .unwrap();
        assert_eq!(printed(&out), writable, "{mode:?}");
    }
    // Without it, root in the slice writes the host's root.
    let out = command(&h, &[], script)
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("/usr/local/.gpuslice-ro\n{writable}")
    );
}

#[test]
fn junk_in_the_ledger_directory_is_summarized_in_one_line() {
    let _beside = common::beside_others();
    // 50,000 empty `*.ledger` files planted by nobody in the
    // ledger directory (1777) made `gpuslice slices` print 50,000 lines.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for i in 0..50_000 {
        let p = d.join(format!("junk-{i:05}.ledger"));
        std::fs::write(&p, b"").unwrap();
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    }
    std::os::unix::fs::symlink("/dev/null", d.join("link.ledger")).unwrap();
    std::fs::write(d.join("other.txt"), b"x").unwrap();
    let slices = |json: bool| {
        let mut c = Command::new(GPUSLICE);
        if json {
            c.arg("--json");
        }
        let out = c
            .arg("slices")
            .env("GPUSLICE_LEDGER_DIR", d)
            .env("LC_ALL", "C")
            .output()
            .unwrap();
        common::assert_success(&out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = slices(false);
    let junk: Vec<&str> = text.lines().filter(|l| l.contains("junk")).collect();
    assert_eq!(junk.len(), 1, "{text:.2000}");
    assert!(
        junk[0].contains("50002 entries that are not ledgers")
            && junk[0].contains("uid 65534: 50000")
            && junk[0].contains("uid 0: 2"),
        "{}",
        junk[0]
    );
    assert!(text.lines().count() < 10, "{text:.2000}");
    let v: serde_json::Value = serde_json::from_str(&slices(true)).unwrap();
    assert_eq!(v["slices"], serde_json::json!([]));
    assert_eq!(v["junk"]["count"], 50_002);
    assert_eq!(v["junk"]["entries"].as_array().unwrap().len(), 50_002);
    assert_eq!(
        v["junk"]["owners"][0],
        serde_json::json!({"uid": 65534, "entries": 50000})
    );
}

#[test]
fn a_gpus_board_cannot_be_squatted() {
    // A junk file planted by nobody as a GPU's board in the
    // sticky boards directory switched off taking turns on that GPU until
    // root removed it. Root now makes the board when a slice with a share
    // starts, replacing what it did not make, and in a slice the directory
    // is read-only (root there could remove the board and plant another).
    use std::os::unix::fs::MetadataExt;
    let (_beside, h) = common::host_beside_others(fake_host());
    let dir = tempfile::tempdir().unwrap();
    let (ledgers, boards) = (dir.path().join("slices"), dir.path().join("gpus"));
    gpuslice_ledger::ensure_dir(&boards).unwrap();
    let uuid = &h.gpus()[1].uuid;
    let board = gpuslice_ledger::board::board_path(&boards, uuid);
    std::fs::write(&board, b"squatted").unwrap();
    std::os::unix::fs::chown(&board, Some(65534), Some(65534)).unwrap();
    // And the root-only `shares` directory, made first by nobody: every
    // `run --compute` was refused ("not a root-owned directory").
    let shares = gpuslice_ledger::board::shares_dir(&boards);
    std::fs::create_dir(&shares).unwrap();
    std::os::unix::fs::chown(&shares, Some(65534), Some(65534)).unwrap();
    let b = board.display().to_string();
    let planted = boards.join("GPU-planted.board").display().to_string();
    let script = format!(
        "umount -l {} 2>/dev/null; {}; rm -f {b} 2>/dev/null && echo removed; \
         (: > {planted}) 2>/dev/null && echo planted",
        boards.display(),
        open_for_writing(&b)
    );
    let run = |flags: &[&str]| {
        let mut c = command(&h, &[&["--compute", "30"][..], flags].concat(), &script);
        c.env("GPUSLICE_LEDGER_DIR", &ledgers)
            .env("GPUSLICE_BOARD_DIR", &boards);
        let out = c.output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for mode in [&["--strict"][..], &[]] {
        let out = run(mode);
        // Its own board is writable, and nothing can be removed or planted.
        assert_eq!(out, "opened\n", "{mode:?}");
        let m = std::fs::symlink_metadata(&board).unwrap();
        assert_eq!(
            (m.uid(), m.len(), m.mode() & 0o777),
            (0, gpuslice_ledger::board::BOARD_SIZE as u64, 0o666),
            "{mode:?}: the squatted board was not replaced by root's"
        );
        assert!(gpuslice_ledger::board::Board::open_existing(&boards, uuid).is_some());
        assert_eq!(std::fs::symlink_metadata(&shares).unwrap().uid(), 0);
    }
    let out = run(PRIVILEGED);
    assert_eq!(out, "opened\nremoved\nplanted\n", "--privileged");
}

#[test]
fn descriptors_beyond_stdio_are_not_inherited() {
    let (_beside, h) = common::host_beside_others(fake_host());
    let r = root_of(&h);
    // The caller holds the host's /dev (with the hidden node) on fds 3–5.
    let run = |flags: &str| {
        let script = format!(
            "exec 3<{r}/dev 4<{r}/dev 5<{r}/dev; exec {GPUSLICE} --host-root {r} run --gpus 1 {flags} \
             -- sh -c 'ls /proc/self/fd/5/ 2>/dev/null | grep -c \"^nvidia0$\"'"
        );
        let out = Command::new("sh")
            .args(["-c", &script])
            .envs(h.env())
            .stderr(Stdio::null())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(run(""), "0\n");
    assert_eq!(run("--preserve-fds 3"), "1\n");
    assert_eq!(run("--privileged"), "1\n");
}

#[test]
fn preserve_fds_must_name_open_descriptors() {
    let (_beside, h) = common::host_beside_others(fake_host());
    let out = command(&h, &["--preserve-fds", "40"], "true")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--preserve-fds 40: descriptor"), "{err}");
}

#[test]
fn preserve_fds_past_the_descriptor_limit_is_refused() {
    let (_beside, h) = common::host_beside_others(fake_host());
    // 4294967295: 3 + N wrapped to 2, and the command lost its own stdio
    // (exit 0). 62 under `ulimit -n 64`: descriptors 3..65 cannot exist.
    for (n, limit) in [("4294967295", ""), ("62", "ulimit -n 64; ")] {
        let script = format!(
            "{limit}exec {GPUSLICE} --host-root {} run --gpus 1 --preserve-fds {n} -- echo ran",
            root_of(&h)
        );
        let out = Command::new("sh")
            .args(["-c", &script])
            .envs(h.env())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{n}: {err}");
        assert!(out.stdout.is_empty(), "{n}: ran");
        assert_eq!(err.trim_end().lines().count(), 1, "{n}: {err}");
        assert!(
            err.contains(&format!("--preserve-fds {n}: out of range; allowed 0..=")),
            "{n}: {err}"
        );
    }
}

/// SIGKILLs the processes whose command line is exactly `argv` (left by a
/// test), and says which they were.
fn kill_running(argv: &[&str]) -> Vec<u32> {
    let left = processes_running(argv);
    for pid in &left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    left
}

/// Host pids of processes whose command line is exactly `argv`.
fn processes_running(argv: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

#[test]
fn a_process_that_detaches_does_not_outlive_its_slice() {
    let (_beside, h) = common::host_beside_others(fake_host());
    // Out of the slice cgroup first, in whichever hierarchy holds it.
    let escape = "for f in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/unified/cgroup.procs \
                  /sys/fs/cgroup/devices/cgroup.procs; do echo $$ > $f; done 2>/dev/null; ";
    let cases = versions().into_iter().flat_map(|v| {
        [
            // The PID namespace's init takes it down with it.
            (v, &[][..], "", false),
            // No PID namespace: the launcher kills what is left in the
            // cgroup (v2: cgroup.kill; v1: each pid).
            (v, HOST_PID, "", false),
            (v, PRIVILEGED, "", false),
            // Only a process that left the slice's cgroup survives it, and
            // only --privileged can leave (a_slice_cannot_move_itself…).
            (v, PRIVILEGED, escape, true),
        ]
    });
    for (i, (v, flags, pre, survives)) in cases.enumerate() {
        let secs = format!("9876{i:02}");
        let script = format!("{pre}setsid sleep {secs} </dev/null >/dev/null 2>&1 & echo started");
        let out = in_slice(&h, &[&["--cgroup", v][..], flags].concat(), &script);
        assert!(out.starts_with("started\n"), "{v} {flags:?}: {out}");
        // Not unseen: the launcher says what it killed.
        if flags == HOST_PID {
            assert!(
                out.contains("killed 1 process(es) left in the slice"),
                "{v}: {out}"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
        let left = kill_running(&["sleep", &secs]);
        assert_eq!(!left.is_empty(), survives, "{v} {flags:?} {pre}: {left:?}");
    }
}

/// The capability and confinement lines of /proc/self/status in the slice.
fn status_of(h: &FakeHost, flags: &[&str]) -> String {
    let script =
        "grep -E '^(Uid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status";
    in_slice(h, flags, script)
}

#[test]
fn a_non_root_user_holds_no_capability_and_cannot_get_one_back() {
    let (_beside, h) = common::host_beside_others(fake_host());
    // The bounding set is cut before the switch (it takes CAP_SETPCAP,
    // which the switch loses): docker's set less MKNOD, NET_RAW and
    // NET_BIND_SERVICE by default, nothing under --strict.
    for (flags, bounding) in [
        (&["--user", "nobody"][..], "00000000a00401fb"),
        (&["--user", "nobody", "--strict"][..], "0000000000000000"),
    ] {
        let out = status_of(&h, flags);
        assert!(out.contains("Uid:\t65534"), "{flags:?}: {out}");
        for set in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
            assert!(
                out.contains(&format!("{set}:\t0000000000000000")),
                "{flags:?}: {out}"
            );
        }
        assert!(
            out.contains(&format!("CapBnd:\t{bounding}")),
            "{flags:?}: {out}"
        );
        assert!(
            out.contains("NoNewPrivs:\t1") && out.contains("Seccomp:\t2"),
            "{flags:?}: {out}"
        );
    }
    // Root by default keeps exactly the bounding set's capabilities.
    let out = status_of(&h, &[]);
    assert!(out.contains("CapEff:\t00000000a00401fb"), "{out}");
    // --privileged: a full bounding set (a setuid program would get it all
    // back), no no_new_privs, no filter.
    let out = status_of(&h, &["--user", "nobody", "--privileged"]);
    assert!(!out.contains("CapBnd:\t00000000a00401fb"), "{out}");
    assert!(
        out.contains("NoNewPrivs:\t0") && out.contains("Seccomp:\t0"),
        "{out}"
    );
}

#[test]
fn a_user_command_dies_with_its_killed_launcher() {
    // A change of credentials clears the parent-death signal: the child
    // sets it again after the user switch, else the command would run on,
    // unsupervised, once the launcher is SIGKILLed (--pid host: no PID
    // namespace takes it down).
    let (_beside, h) = common::host_beside_others(fake_host());
    for (i, flags) in [HOST_PID, &[]].into_iter().enumerate() {
        let secs = format!("98771{i}");
        let mut c = launch(
            &h,
            &[&["--gpus", "1", "--user", "nobody"][..], flags].concat(),
            &["sleep", &secs],
        );
        let mut launcher = c.stderr(Stdio::null()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while processes_running(&["sleep", &secs]).is_empty() {
            if Instant::now() > deadline {
                let _ = launcher.kill();
                let _ = launcher.wait();
                panic!("{flags:?}: the slice did not start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        launcher.kill().unwrap();
        launcher.wait().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let left = kill_running(&["sleep", &secs]);
        assert!(
            left.is_empty(),
            "{flags:?}: outlived its launcher: {left:?}"
        );
    }
}
