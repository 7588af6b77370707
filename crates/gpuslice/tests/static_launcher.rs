//! The `gpuslice` launcher as `scripts/install.sh` links it: statically
//! (no loader work at each job's start). It carries root's own
//! launches and hands to `gpuslice-full` what a static glibc cannot do —
//! look users and groups up (NSS modules) or load NVML (MIG UUIDs) —
//! instead of crashing in it. `scripts/test.sh` builds the pair into
//! `GPUSLICE_STATIC_LAUNCHER_DIR`.

use crate::common;
use fakegpu::FakeHost;
use gpuslice_testkit::precondition;
use std::path::PathBuf;
use std::process::{Command, Output};

const DIR_ENV: &str = "GPUSLICE_STATIC_LAUNCHER_DIR";

/// The static launcher (beside its gpuslice-full), if this host has one.
fn launcher(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os(DIR_ENV).map(PathBuf::from);
    let unmet = match &dir {
        None => Some(format!("{DIR_ENV} is not set (scripts/test.sh builds it)")),
        Some(d) if !d.join("gpuslice").is_file() => Some(format!("no gpuslice in {}", d.display())),
        Some(_) if !nix::unistd::geteuid().is_root() => Some("needs root".to_string()),
        Some(_) => None,
    };
    precondition(test, unmet).then(|| dir.unwrap().join("gpuslice"))
}

/// Whether the ELF file has a program interpreter (PT_INTERP): a
/// dynamically linked program has one, a static-pie one none.
fn has_interpreter(path: &std::path::Path) -> bool {
    let elf = std::fs::read(path).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF", "{}", path.display());
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let at = phoff + i * size;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == 3 // PT_INTERP
    })
}

/// `gpuslice --host-root H ARGS` with launch marks on.
fn launch(exe: &std::path::Path, h: &FakeHost, args: &[&str]) -> (Output, String, String) {
    let cache = tempfile::tempdir().unwrap();
    let out = h
        .command(exe)
        .arg("--host-root")
        .arg(h.root())
        .args(args)
        .env("GPUSLICE_CACHE_DIR", cache.path())
        .env("GPUSLICE_LAUNCH_MARKS", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    (out, stdout, stderr)
}

/// The steps the launcher marked (the static one marks; gpuslice-full,
/// exec'd in its place, does not).
fn marked(stderr: &str, step: &str) -> bool {
    stderr
        .lines()
        .any(|l| l.starts_with(&format!("gpuslice-mark {step} ")))
}

#[test]
fn the_installed_launcher_is_static_and_carries_a_root_launch_itself() {
    let _beside = common::beside_others();
    let Some(exe) = launcher("the_installed_launcher_is_static_and_carries_a_root_launch_itself")
    else {
        return;
    };
    assert!(
        !has_interpreter(&exe),
        "{} is dynamically linked",
        exe.display()
    );
    assert!(has_interpreter(&exe.with_file_name("gpuslice-full")));
    let h = FakeHost::builder().gpus(4).build().unwrap();
    let dev = h.root().join("dev");
    let (out, stdout, stderr) = launch(
        &exe,
        &h,
        &["run", "--gpus", "1", "--", "ls", dev.to_str().unwrap()],
    );
    assert!(out.status.success(), "{stderr}");
    let gpus: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("nvidia") && l[6..].parse::<u32>().is_ok())
        .collect();
    assert_eq!(gpus, ["nvidia1"], "{stdout}");
    assert!(
        marked(&stderr, "forked"),
        "launched by the static binary: {stderr}"
    );
}

#[test]
fn a_user_switch_is_handed_to_gpuslice_full_not_crashed_in() {
    let _beside = common::beside_others();
    let Some(exe) = launcher("a_user_switch_is_handed_to_gpuslice_full_not_crashed_in") else {
        return;
    };
    let h = FakeHost::builder().gpus(2).build().unwrap();
    // A group by name: getgrnam, which a static glibc answers by loading
    // an NSS module (it crashed with SIGSEGV).
    let (out, stdout, stderr) = launch(
        &exe,
        &h,
        &[
            "run",
            "--gpus",
            "0",
            "--user",
            "daemon:users",
            "--",
            "id",
            "-u",
        ],
    );
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.trim(), "1", "{stderr}");
    assert!(
        marked(&stderr, "parsed") && !marked(&stderr, "discovered"),
        "{stderr}"
    );

    // Without gpuslice-full beside it: a clear error, nothing run.
    let alone = tempfile::tempdir().unwrap();
    let copy = alone.path().join("gpuslice");
    std::fs::copy(&exe, &copy).unwrap();
    let (out, _, stderr) = launch(
        &copy,
        &h,
        &["run", "--gpus", "0", "--user", "nobody", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("gpuslice-full, which is not installed"),
        "{stderr}"
    );
}

#[test]
fn mig_devices_are_handed_to_gpuslice_full_for_nvml() {
    let _beside = common::beside_others();
    let Some(exe) = launcher("mig_devices_are_handed_to_gpuslice_full_for_nvml") else {
        return;
    };
    let h = FakeHost::builder().gpus(2).mig(1, 2).build().unwrap();
    let (out, _, stderr) = launch(&exe, &h, &["run", "--gpus", "0", "--", "true"]);
    assert!(out.status.success(), "{stderr}");
    // Discovery saw the MIG tree, stopped before creating anything, and
    // gpuslice-full (which marks nothing) launched instead.
    assert!(
        marked(&stderr, "discovered") || marked(&stderr, "parsed"),
        "{stderr}"
    );
    assert!(!marked(&stderr, "forked"), "{stderr}");
}

#[test]
fn other_commands_help_and_usage_errors_answer_as_gpuslice() {
    let _beside = common::beside_others();
    let Some(exe) = launcher("other_commands_help_and_usage_errors_answer_as_gpuslice") else {
        return;
    };
    let h = FakeHost::builder().gpus(1).build().unwrap();
    let (out, stdout, _) = launch(&exe, &h, &["--help"]);
    assert!(out.status.success());
    assert!(
        stdout.contains("Usage: gpuslice [OPTIONS] <COMMAND>"),
        "{stdout}"
    );
    assert!(stdout.contains("device-plugin"), "{stdout}");
    let (out, _, stderr) = launch(&exe, &h, &["run", "--gpus", "0", "--bogus", "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("'--bogus'"), "{stderr}");
    let c = Command::new(&exe)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(c.status.success() && String::from_utf8_lossy(&c.stdout).contains("--gpus"));
}
