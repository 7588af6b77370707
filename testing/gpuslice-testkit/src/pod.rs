//! A pod's process that runs without the shim: what a pod spec
//! that covers `/etc/ld.so.preload` (a `hostPath` volume of `/dev/null`)
//! or a process that unshares a mount namespace gets, as the plugins' tests
//! stage it on the fake host without a container runtime.
//!
//! The "container" is a shell in a mount namespace of its own (`unshare
//! -m`) and a cgroup of its own, with the slice's limits record bound at
//! the slice's fixed place as the device plugin's Allocate or a claim's CDI
//! spec binds it. No shim is preloaded. Its GPU process is the shim's test
//! client, allocating and holding on the slice's GPU; with
//! [`Hide::Records`] it first unshares a user and mount namespace (`unshare
//! -Urm`, no capability needed) and covers the slice's directory, so that
//! its own root shows nothing of the slice: only its container (the shell,
//! in the same cgroup) still does.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

/// What the GPU process hides of its slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hide {
    /// Nothing (the shim is simply not preloaded, as under a covered
    /// preload file).
    Nothing,
    /// Also the slice's records, from a mount namespace of its own.
    Records,
}

/// The container: killed, and its cgroup removed, on drop.
pub struct PodProcess {
    child: Child,
    cgroup: PathBuf,
    lines: Receiver<String>,
}

impl PodProcess {
    /// Starts a container whose GPU process allocates `bytes` on GPU
    /// `uuid` of fake host `host` and holds them; `record` is the slice's
    /// limits record on the host. Returns once the allocation answered
    /// (`held <rc>`).
    pub fn start(
        host: &fakegpu::FakeHost,
        record: &Path,
        uuid: &str,
        bytes: u64,
        hide: Hide,
    ) -> (PodProcess, String) {
        let cgroup = container_cgroup();
        let client = crate::shim_client();
        let hold = format!("{} hold {bytes}", client.display());
        let gpu_process = match hide {
            Hide::Nothing => hold,
            Hide::Records => format!(
                "unshare -Urm sh -c 'mount -t tmpfs none /run/gpuslice/slice && exec {hold}'"
            ),
        };
        let script = format!(
            "set -e; echo $$ > {procs}; mount -t tmpfs none /run; \
             mkdir -p /run/gpuslice/slice; touch /run/gpuslice/slice/limits; \
             mount --bind {record} /run/gpuslice/slice/limits; set +e; \
             {gpu_process} & wait $!; echo \"rc $?\"",
            procs = cgroup.join("cgroup.procs").display(),
            record = record.display(),
        );
        let mut child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .envs(host.env())
            .env("CUDA_VISIBLE_DEVICES", uuid)
            .env_remove("LD_PRELOAD")
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux)");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let first = lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the pod's process said nothing"));
        (
            PodProcess {
                child,
                cgroup,
                lines,
            },
            first,
        )
    }

    /// The container's next line within `wait` (`rc <code>` once its GPU
    /// process ended); None if none came.
    pub fn next_line(&self, wait: Duration) -> Option<String> {
        self.lines.recv_timeout(wait).ok()
    }

    /// A container started with [`PodProcess::start`] whose GPU process
    /// got its memory from the driver and is then killed (SIGKILL) within
    /// `within`; panics, naming `what`, otherwise.
    pub fn start_and_expect_kill(
        host: &fakegpu::FakeHost,
        record: &Path,
        uuid: &str,
        bytes: u64,
        hide: Hide,
        within: Duration,
    ) {
        let (pod, held) = PodProcess::start(host, record, uuid, bytes, hide);
        assert_eq!(held, "held 0", "{hide:?}: the driver gave it all");
        let started = std::time::Instant::now();
        let end = pod.next_line(within + Duration::from_secs(2));
        assert_eq!(end.as_deref(), Some("rc 137"), "{hide:?}: killed");
        assert!(
            started.elapsed() < within,
            "{hide:?}: killed only after {:?}",
            started.elapsed()
        );
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        // Everything in the container's cgroup, then the cgroup.
        let procs = std::fs::read_to_string(self.cgroup.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|p| p.parse::<i32>().ok()) {
            // SAFETY: kill takes a pid and a signal.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for _ in 0..100 {
            if std::fs::remove_dir(&self.cgroup).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A fresh cgroup for a container: in the cgroup v2 hierarchy where it is
/// the only one, else in v1's `pids` hierarchy (a cgroup path of its own is
/// all the test needs of it).
fn container_cgroup() -> PathBuf {
    let base = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        PathBuf::from("/sys/fs/cgroup")
    } else {
        PathBuf::from("/sys/fs/cgroup/pids")
    };
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = base.join(format!("gpuslice-test-pod-{}-{n}", std::process::id()));
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}
