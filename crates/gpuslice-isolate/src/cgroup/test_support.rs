//! Helpers for the tests of this crate that need a real cgroup, device
//! nodes and a forked child.

use super::slice::rmdir_patiently;
use super::*;
use gpuslice_core::MajorRule;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;

/// A device rule for `major`.
pub(crate) fn rule(major: u32, allowed: &[u32], denied: &[u32], deny_unlisted: bool) -> MajorRule {
    MajorRule {
        major,
        allowed: allowed.to_vec(),
        denied: denied.to_vec(),
        deny_unlisted,
    }
}

/// The driver for `version`; when this host cannot give it, what
/// [`gpuslice_testkit::precondition`] says: a failure (always under CI),
/// or None with `GPUSLICE_TEST_SKIP=1`.
pub(crate) fn driver_or_skip(test: &str, version: Version) -> Option<CgroupDriver> {
    if !gpuslice_testkit::precondition(test, gpuslice_testkit::needs_root()) {
        return None;
    }
    match CgroupDriver::detect(Some(version)) {
        Ok(d) => Some(d),
        Err(e) => {
            gpuslice_testkit::precondition(test, Some(e.to_string()));
            None
        }
    }
}

/// The cgroup2 root, as [`driver_or_skip`] gives it.
pub(crate) fn v2_root_or_skip(test: &str) -> Option<PathBuf> {
    driver_or_skip(test, Version::V2).map(|d| d.root().to_owned())
}

/// A unique id owned by this test process: `<pid>-<tag>-<n>`.
pub(crate) fn unique_id(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{}-{tag}-{n}", std::process::id())
}

/// A bare cgroup `<root>/gpuslice/<pid>-<tag>-<n>`, removed on drop.
pub(crate) struct TestCgroup(PathBuf);

impl TestCgroup {
    pub(crate) fn new(root: &Path, tag: &str) -> Self {
        let parent = root.join(SLICES_DIR);
        if let Err(e) = fs::create_dir(&parent) {
            assert_eq!(
                e.kind(),
                io::ErrorKind::AlreadyExists,
                "{}",
                parent.display()
            );
        }
        let path = parent.join(unique_id(tag));
        fs::create_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Self(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Err(e) = rmdir_patiently(&self.0) {
            eprintln!("{e}");
        }
    }
}

/// A temporary directory on a filesystem that honours device nodes.
pub(crate) struct NodeDir(tempfile::TempDir);

impl NodeDir {
    pub(crate) fn new() -> Self {
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
        for base in [std::env::temp_dir(), target] {
            let Ok(dir) = tempfile::tempdir_in(&base) else {
                continue;
            };
            let d = NodeDir(dir);
            // /dev/null's numbers: a nodev mount gives EACCES.
            if open_errno(&d.mknod(1, 3)) == 0 {
                return d;
            }
        }
        panic!("no filesystem that allows device nodes for the test");
    }

    /// `mknod <dir>/c<major>_<minor> c major minor` (once).
    pub(crate) fn mknod(&self, major: u32, minor: u32) -> PathBuf {
        let path = self.0.path().join(format!("c{major}_{minor}"));
        if path.exists() {
            return path;
        }
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
        let rc = unsafe {
            libc::mknod(
                c.as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(major, minor),
            )
        };
        assert_eq!(
            rc,
            0,
            "mknod {}: {}",
            path.display(),
            io::Error::last_os_error()
        );
        path
    }
}

fn raw_open(c: &CString) -> i32 {
    // SAFETY: `c` is a valid NUL-terminated path; the fd, when one is
    // returned, is closed right away.
    unsafe {
        let fd = libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::close(fd);
            0
        } else {
            *libc::__errno_location()
        }
    }
}

/// errno of `open(path, O_RDONLY)` here, 0 when it succeeds.
pub(crate) fn open_errno(path: &Path) -> i32 {
    raw_open(&CString::new(path.as_os_str().as_bytes()).unwrap())
}

/// errno of `open(node, O_RDONLY)` in a child forked into the cgroup at
/// `cgroup_dir` (0 when it succeeds).
pub(crate) fn open_errno_in(cgroup_dir: &Path, node: &Path) -> i32 {
    let procs = OpenOptions::new()
        .write(true)
        .open(cgroup_dir.join("cgroup.procs"))
        .expect("open cgroup.procs");
    in_child(&procs, node)
}

/// Forks a child that enters the cgroup through `procs` (exit 200 if it
/// cannot) and opens `node`; returns the child's errno (0: opened).
pub(crate) fn in_child(procs: &File, node: &Path) -> i32 {
    let c = CString::new(node.as_os_str().as_bytes()).unwrap();
    // SAFETY: between fork and _exit the child only calls
    // async-signal-safe functions (write, open, close, _exit) on data
    // prepared before the fork, and never returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        let code = match enter_self(procs) {
            Ok(()) => raw_open(&c),
            Err(_) => 200,
        };
        // SAFETY: ends the forked child without running any Rust cleanup.
        unsafe { libc::_exit(code) };
    }
    wait_exit_code(pid)
}

pub(crate) fn wait_exit_code(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out pointer; `pid` is our child.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc == pid {
            break;
        }
        let e = io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::EINTR), "waitpid: {e}");
    }
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    libc::WEXITSTATUS(status)
}

/// The pid of a child that has exited and been reaped.
pub(crate) fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let pid = child.id();
    child.wait().unwrap();
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    pid
}
