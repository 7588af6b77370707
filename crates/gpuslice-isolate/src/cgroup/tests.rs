use super::test_support::{self as ts, rule};
use super::*;
use crate::mountinfo::MOUNTINFO;
use gpuslice_core::DevicePolicy;
use gpuslice_ledger::limits::valid_slice_id;
use std::fs;

const HYBRID: &str = "\
25 1 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:24 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
27 26 0:25 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
28 26 0:26 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
31 26 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu,cpuacct
33 26 0:31 / /sys/fs/cgroup/devices rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,devices
";
const V2_ONLY: &str = "\
25 1 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
const V1_ONLY: &str = "\
26 25 0:24 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
33 26 0:31 / /sys/fs/cgroup/my\\040devices rw,nosuid master:3 - cgroup cgroup rw,devices,freezer
34 26 0:32 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
";

/// A `#[test]` per cgroup version, each under its own name, that runs
/// `body` with that version.
macro_rules! per_version {
    ($body:ident: $v1:ident, $v2:ident) => {
        #[test]
        fn $v1() {
            $body(Version::V1);
        }

        #[test]
        fn $v2() {
            $body(Version::V2);
        }
    };
}

fn v1(p: &str) -> CgroupDriver {
    CgroupDriver::V1 {
        devices_root: p.into(),
    }
}
fn v2(p: &str) -> CgroupDriver {
    CgroupDriver::V2 { root: p.into() }
}

#[test]
fn detect_prefers_v2_and_honours_an_explicit_version() {
    let d = |text, pref| CgroupDriver::from_mountinfo(text, pref);
    assert_eq!(d(HYBRID, None).unwrap(), v2("/sys/fs/cgroup/unified"));
    assert_eq!(
        d(HYBRID, Some(Version::V2)).unwrap(),
        v2("/sys/fs/cgroup/unified")
    );
    assert_eq!(
        d(HYBRID, Some(Version::V1)).unwrap(),
        v1("/sys/fs/cgroup/devices")
    );
    assert_eq!(d(V2_ONLY, None).unwrap(), v2("/sys/fs/cgroup"));
    assert_eq!(d(V1_ONLY, None).unwrap(), v1("/sys/fs/cgroup/my devices"));

    let e = d(V2_ONLY, Some(Version::V1)).unwrap_err().to_string();
    assert!(
        e.contains("v1") && e.contains("only cgroup2 at /sys/fs/cgroup"),
        "{e}"
    );
    let e = d(V1_ONLY, Some(Version::V2)).unwrap_err().to_string();
    assert!(
        e.contains("no cgroup2 mount") && e.contains("my devices"),
        "{e}"
    );
    let e = d("", None).unwrap_err().to_string();
    assert!(e.contains("no cgroup mounts"), "{e}");
    // A v1 hierarchy without the devices controller does not count.
    let no_devices = V1_ONLY.replace("rw,devices,freezer", "rw,freezer");
    assert!(d(&no_devices, None).is_err());
}

#[test]
fn detect_reads_this_host() {
    // Whatever this host has, detection must not fail to read it.
    match CgroupDriver::detect(None) {
        Ok(d) => assert!(d.root().is_dir(), "{d:?}"),
        Err(e) => assert!(matches!(e, CgroupError::Unavailable { .. }), "{e}"),
    }
}

#[test]
fn the_statfs_shortcut_agrees_with_the_mountinfo_scan() {
    let text = fs::read_to_string(MOUNTINFO).unwrap();
    for pref in [None, Some(Version::V1), Some(Version::V2)] {
        assert_eq!(
            CgroupDriver::detect(pref).ok(),
            CgroupDriver::from_mountinfo(&text, pref).ok(),
            "{pref:?}"
        );
    }
}

#[test]
fn versions_parse() {
    assert_eq!("v1".parse::<Version>().unwrap(), Version::V1);
    assert_eq!("2".parse::<Version>().unwrap(), Version::V2);
    assert!("v3".parse::<Version>().is_err());
    assert_eq!(Version::V2.to_string(), "v2");
}

#[test]
fn v1_rules_deny_listed_minors_and_whole_majors_without_allowed_minors() {
    let p = DevicePolicy {
        rules: vec![
            rule(195, &[0, 254, 255], &[3, 1, 2], true),
            rule(241, &[], &[12, 13], true),
            rule(242, &[5], &[5], true),
            rule(226, &[1], &[2, 130], false),
            rule(195, &[], &[1], false),
        ],
    };
    assert_eq!(
        v1_deny_rules(&p),
        [
            "c 195:1 rwm",
            "c 195:2 rwm",
            "c 195:3 rwm",
            "c 241:* rwm",
            "c 242:* rwm",
            "c 226:2 rwm",
            "c 226:130 rwm",
        ]
    );
    assert_eq!(v1_inexact_majors(&p), [195]);
}

/// Simulates the v1 list on the policy shapes of the BPF tests: it never
/// allows what the policy denies, except unlisted minors of the majors
/// `v1_inexact_majors` names, and never denies what the policy allows.
#[test]
fn v1_rules_agree_with_the_policy_except_where_documented() {
    for p in crate::bpf::tests::shapes() {
        let rules = v1_deny_rules(&p);
        let inexact = v1_inexact_majors(&p);
        for major in [1, 195, 226, 238, 241] {
            for minor in 0..=300 {
                let v1_denies = rules.contains(&format!("c {major}:* rwm"))
                    || rules.contains(&format!("c {major}:{minor} rwm"));
                let want = p.allows_char(major, minor);
                if want {
                    assert!(!v1_denies, "{major}:{minor} {p:?}");
                } else if !v1_denies {
                    let listed = p
                        .rules
                        .iter()
                        .any(|r| r.major == major && r.denied.contains(&minor));
                    assert!(!listed && inexact.contains(&major), "{major}:{minor} {p:?}");
                }
            }
        }
    }
}

#[test]
fn slice_ids_are_unique_and_valid() {
    let a = new_slice_id();
    let b = new_slice_id();
    assert_ne!(a, b);
    assert!(valid_slice_id(&a), "{a}");
    assert!(a.starts_with(&format!("{}-", std::process::id())));
    for bad in ["", "a/b", "..", ".x", "a b", "x\0"] {
        assert!(!valid_slice_id(bad), "{bad:?}");
    }
    // What the ledger's header could not store makes no cgroup either.
    let long = format!("{a}-{}", "x".repeat(MAX_SLICE_ID_LEN));
    assert!(!valid_slice_id(&long), "{long}");
}

fn deny_195_1() -> DevicePolicy {
    DevicePolicy {
        rules: vec![rule(195, &[0, 254, 255], &[1], true)],
    }
}

/// A failure while applying the policy removes the directory made: a
/// plain directory posing as a cgroup root fails the v1 rule write and
/// the v2 attach (or load, without root).
#[test]
fn failed_create_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_str().unwrap();
    for driver in [v1(root), v2(root)] {
        let id = ts::unique_id("fail");
        let err = SliceCgroup::create(&driver, &id, &deny_195_1()).unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::DeviceRule { .. }
                    | CgroupError::BpfAttach { .. }
                    | CgroupError::BpfLoad { .. }
            ),
            "{err}"
        );
        assert!(err.to_string().contains(&id), "{err}");
        assert!(!driver.slices_dir().join(&id).exists());
        assert!(driver.slices_dir().is_dir(), "the shared parent stays");
    }
    let err = SliceCgroup::create(&v1(root), "../x", &deny_195_1()).unwrap_err();
    assert!(matches!(err, CgroupError::InvalidSliceId { .. }), "{err}");
}

#[test]
fn unwritable_root_says_what_would_fix_it() {
    let driver = v2("/proc/self");
    let err = SliceCgroup::create(&driver, &ts::unique_id("ro"), &deny_195_1()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("cannot create /proc/self/gpuslice: ")
            && msg.contains("needs a writable cgroup"),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
}

/// As root, for each cgroup version this host has: the child in the
/// slice cgroup gets EPERM on the denied 195:1 and reaches 195:0 as it
/// does outside (ENXIO without an NVIDIA driver); `remove` leaves no
/// directory.
fn enforces(version: Version) {
    let test = format!("slice_cgroup_enforces_{version}");
    let Some(driver) = ts::driver_or_skip(&test, version) else {
        return;
    };
    let nodes = ts::NodeDir::new();
    let denied = nodes.mknod(195, 1);
    let allowed = nodes.mknod(195, 0);
    let baseline = ts::open_errno(&allowed);
    assert_ne!(baseline, libc::EPERM);
    assert_ne!(ts::open_errno(&denied), libc::EPERM);

    let id = ts::unique_id("enforce");
    let cg = SliceCgroup::create(&driver, &id, &deny_195_1()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cg.path(), driver.slices_dir().join(&id));
    assert_eq!(cg.version(), version);
    let procs = cg.open_procs().unwrap();
    assert_eq!(ts::in_child(&procs, &denied), libc::EPERM);
    assert_eq!(ts::in_child(&procs, &allowed), baseline);
    drop(procs);
    cg.remove().unwrap_or_else(|e| panic!("{e}"));

    // Several rules (several v1 lines), a whole denied major, and the
    // documented v1 gap: an unlisted minor of a deny_unlisted major.
    let policy = DevicePolicy {
        rules: vec![
            rule(195, &[0, 254, 255], &[1, 2], true),
            rule(241, &[], &[], true),
            rule(226, &[], &[7], false),
        ],
    };
    let cg = SliceCgroup::create(&driver, &ts::unique_id("enforce"), &policy)
        .unwrap_or_else(|e| panic!("{e}"));
    let procs = cg.open_procs().unwrap();
    let gap = if version == Version::V1 {
        None
    } else {
        Some(libc::EPERM)
    };
    for (major, minor, want) in [
        (195, 1, Some(libc::EPERM)),
        (195, 2, Some(libc::EPERM)),
        (241, 5, Some(libc::EPERM)),
        (226, 7, Some(libc::EPERM)),
        (195, 9, gap),
        (195, 0, None),
        (226, 8, None),
        (1, 3, None),
    ] {
        let node = nodes.mknod(major, minor);
        let outside = ts::open_errno(&node);
        assert_ne!(outside, libc::EPERM, "c {major}:{minor} outside");
        let got = ts::in_child(&procs, &node);
        assert_eq!(
            got,
            want.unwrap_or(outside),
            "c {major}:{minor} in {version}"
        );
    }
    drop(procs);

    // add_pid moves another process in.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    cg.add_pid(sleeper.id()).unwrap_or_else(|e| panic!("{e}"));
    let listed = fs::read_to_string(cg.procs_file()).unwrap();
    assert!(
        listed.lines().any(|l| l == sleeper.id().to_string()),
        "{listed}"
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();

    let path = cg.path().to_owned();
    cg.remove().unwrap_or_else(|e| panic!("{e}"));
    assert!(!path.exists());

    // Drop removes too.
    let cg = SliceCgroup::create(&driver, &ts::unique_id("drop"), &deny_195_1()).unwrap();
    let path = cg.path().to_owned();
    drop(cg);
    assert!(!path.exists());
}

per_version!(enforces: slice_cgroup_enforces_v1, slice_cgroup_enforces_v2);

/// As root, per version: an empty cgroup named after a dead pid goes;
/// one named after a live pid (ours) stays, and so does a non-empty
/// one named after a dead pid.
fn reaps(version: Version) {
    let test = format!("reap_stale_{version}");
    let Some(driver) = ts::driver_or_skip(&test, version) else {
        return;
    };
    let dead = ts::dead_pid();
    let policy = deny_195_1();
    let tag = ts::unique_id("reap").replace('-', "_");

    let stale = SliceCgroup::create(&driver, &format!("{dead}-{tag}"), &policy).unwrap();
    let stale_path = stale.path().to_owned();
    std::mem::forget(stale);
    let busy = SliceCgroup::create(&driver, &format!("{dead}-{tag}_busy"), &policy).unwrap();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    busy.add_pid(sleeper.id()).unwrap();
    let live = SliceCgroup::create(&driver, &ts::unique_id("reap_live"), &policy).unwrap();

    let reaped = reap_stale(&driver);
    // A concurrent reaper may have taken the stale one first.
    assert!(!stale_path.exists(), "{reaped:?}");
    assert!(!reaped.contains(&busy.path().to_owned()), "{reaped:?}");
    assert!(busy.path().is_dir() && live.path().is_dir());

    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    busy.remove().unwrap();
    live.remove().unwrap();
}

per_version!(reaps: reap_stale_v1, reap_stale_v2);

#[test]
fn launcher_liveness() {
    let me = std::process::id();
    assert!(launcher_alive(me, SystemTime::now()));
    // We started after the epoch: a cgroup that old was not ours.
    assert!(!launcher_alive(me, UNIX_EPOCH));
    assert!(!launcher_alive(ts::dead_pid(), SystemTime::now()));
}
