//! Proof that a slice's limits are applied: per process of the slice,
//! whether it uses the GPU, has the shim (`libgpuslice*.so`) loaded and has joined the
//! slice's ledger. A GPU process of the slice without both is *not
//! enforced* (a static binary, a program with its own driver, one moved
//! into the slice's cgroup from outside) and is flagged by `gpuslice
//! slices` and the exporter (`gpuslice_slice_process_enforced`).
//!
//! The slice's processes are those whose cgroup path has a component
//! named like the slice (`run` puts them in `<cgroup root>/gpuslice/<id>`)
//! and those holding a live slot in its ledger. A process uses the GPU when
//! it maps a `libcuda.so*` or holds a descriptor on a `/dev/nvidia*` node.
//!
//! A `run` slice's own init is left out: pid 1 of the slice's pid
//! namespace, forked by the launcher (whose pid the slice's id starts
//! with, [`crate::limits::launcher_pid`]). It is the launcher's code, never
//! execs, and keeps the launcher's mappings, NVML's among them, which
//! would make it look like a GPU process of the tenant's. A tenant cannot
//! pass for it: nothing but the launcher forks a child of the launcher,
//! and pid 1 of the namespace is taken. A container's pid 1 is the
//! tenant's and is checked (its parent is the runtime's, not a launcher).

use std::fs;

use crate::{ProcessState, Snapshot};

/// What was found about one process of a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessCheck {
    pub pid: u32,
    pub comm: String,
    /// Maps the CUDA driver or holds an NVIDIA device node.
    pub gpu: bool,
    /// Maps `libgpuslice.so`.
    pub shim: bool,
    /// Holds a live slot of the slice's ledger.
    pub attached: bool,
}

impl ProcessCheck {
    /// The shim is loaded and holds this process to the slice's limits.
    pub fn enforced(&self) -> bool {
        self.shim && self.attached
    }

    /// A GPU process the shim does not hold.
    pub fn flagged(&self) -> bool {
        self.gpu && !self.enforced()
    }
}

/// The host's processes and their cgroup paths, read once per report.
pub struct ProcessTable {
    procs: Vec<(u32, String)>,
}

impl ProcessTable {
    pub fn scan() -> ProcessTable {
        ProcessTable {
            procs: crate::procfs::cgroups().collect(),
        }
    }

    /// The processes of slice `slice_id` (by cgroup, or attached to its
    /// ledger `snap`), checked.
    pub fn check(&self, slice_id: &str, snap: &Snapshot) -> Vec<ProcessCheck> {
        let attached: Vec<u32> = snap
            .processes
            .iter()
            .filter(|p| p.state == ProcessState::Live)
            .map(|p| p.pid)
            .collect();
        let mut pids: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, cg)| in_cgroup_named(cg, slice_id))
            .map(|(pid, _)| *pid)
            .chain(attached.iter().copied())
            .collect();
        pids.sort_unstable();
        pids.dedup();
        let launcher = crate::limits::launcher_pid(slice_id);
        pids.retain(|pid| !launcher.is_some_and(|l| is_init_forked_by(*pid, l)));
        pids.into_iter()
            .filter_map(|pid| {
                let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
                let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                Some(ProcessCheck {
                    pid,
                    comm: comm.trim().to_string(),
                    gpu: maps_library(&maps, "libcuda.so") || holds_nvidia_node(pid),
                    // Installed as libgpuslice.so; libgpuslice_shim.so in a build tree.
                    shim: maps_library(&maps, "libgpuslice"),
                    attached: attached.contains(&pid),
                })
            })
            .collect()
    }
}

/// Whether a `/proc/<pid>/cgroup` text puts the process in a cgroup one
/// of whose path components is `name`.
pub(crate) fn in_cgroup_named(cgroup: &str, name: &str) -> bool {
    cgroup.lines().any(|l| {
        l.rsplit(':')
            .next()
            .is_some_and(|path| path.split('/').any(|c| c == name))
    })
}

/// Whether `maps` maps a file whose name starts with `lib`.
pub(crate) fn maps_library(maps: &str, lib: &str) -> bool {
    maps.lines().any(|l| {
        l.rsplit('/')
            .next()
            .is_some_and(|file| file.starts_with(lib))
    })
}

/// Whether `pid` is the init of a pid namespace below ours whose parent
/// is `launcher`.
fn is_init_forked_by(pid: u32, launcher: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .is_ok_and(|s| crate::procfs::is_child_namespace_init(&s, launcher))
}

fn holds_nvidia_node(pid: u32) -> bool {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .any(|t| t.to_str().is_some_and(|t| t.starts_with("/dev/nvidia")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroups_and_libraries_are_matched_by_whole_names() {
        let v2 = "0::/gpuslice/123-abc\n";
        let v1 = "12:devices:/gpuslice/123-abc\n11:memory:/user.slice\n";
        assert!(in_cgroup_named(v2, "123-abc"));
        assert!(in_cgroup_named(v1, "123-abc"));
        assert!(!in_cgroup_named(v2, "123-ab"));
        assert!(!in_cgroup_named("0::/\n", "123-abc"));
        let maps = "7f00-7f01 r-xp 0 08:01 5 /usr/lib/x86_64-linux-gnu/libcuda.so.580.1\n\
                    7f02-7f03 r-xp 0 08:01 6 /run/gpuslice/slice/libgpuslice.so\n";
        assert!(maps_library(maps, "libcuda.so"));
        assert!(maps_library(maps, "libgpuslice.so"));
        assert!(!maps_library(maps, "libnvidia-ml.so"));
    }

    /// `unshare --pid --fork` stands for `run`'s launcher: the parent of
    /// pid 1 of a new pid namespace (`sh`, the slice's init), which forks
    /// the command (`sleep`). Both map a `libcuda.so.1`, the init as `run`'s
    /// maps what the launcher loaded.
    #[test]
    fn a_run_slice_s_own_init_is_left_out_and_its_command_is_flagged() {
        // SAFETY: geteuid cannot fail and touches no memory.
        if unsafe { libc::geteuid() } != 0 && std::env::var_os("CI").is_none() {
            return; // unshare -p needs root; CI runs as root
        }
        let dir = tempfile::tempdir().unwrap();
        let libcuda = dir.path().join("libcuda.so.1");
        fs::copy(a_loaded_library("libgcc_s.so"), &libcuda).unwrap();
        let mut launcher = std::process::Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--kill-child",
                "sh",
                "-c",
                "sleep 30 & wait",
            ])
            .env("LD_PRELOAD", &libcuda)
            .spawn()
            .expect("unshare (util-linux)");
        let (init, command) = init_and_child_of(launcher.id());
        let ours = format!("{}-1a2b", launcher.id());
        let theirs = format!("{}-1a2b", std::process::id());
        for slice in [&ours, &theirs] {
            let table = ProcessTable {
                procs: [init, command]
                    .map(|pid| (pid, format!("0::/gpuslice/{slice}\n")))
                    .into(),
            };
            let ledger = crate::Ledger::create(&dir.path().join(slice), slice, &[]).unwrap();
            let found = table.check(slice, &ledger.snapshot());
            let pids: Vec<u32> = found.iter().map(|c| c.pid).collect();
            let flagged = |pid| found.iter().any(|c| c.pid == pid && c.flagged());
            assert!(flagged(command), "{slice}: the command: {found:?}");
            if slice == &ours {
                assert_eq!(pids, [command], "the launcher's init is left out");
            } else {
                assert!(
                    flagged(init),
                    "another parent's pid 1 is checked: {found:?}"
                );
            }
        }
        let _ = launcher.kill();
        let _ = launcher.wait();
    }

    /// A shared object this process maps, by file-name prefix.
    fn a_loaded_library(prefix: &str) -> std::path::PathBuf {
        let maps = fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.rsplit('/').next().is_some_and(|f| f.starts_with(prefix)))
            .unwrap_or_else(|| panic!("this test binary maps no {prefix}*"))
            .into()
    }

    /// The host pids of pid 1 of the namespace `parent` made, and of its
    /// child, once both run.
    fn init_and_child_of(parent: u32) -> (u32, u32) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let ppid_is = |pid: u32, parent: u32| {
                fs::read_to_string(format!("/proc/{pid}/status"))
                    .is_ok_and(|s| crate::procfs::parent_pid(&s) == Some(parent))
            };
            let init = crate::procfs::pids().find(|&p| is_init_forked_by(p, parent));
            let child = init.and_then(|i| crate::procfs::pids().find(|&p| ppid_is(p, i)));
            // The child maps the library once it runs `sleep`.
            let mapped = |pid: u32| {
                fs::read_to_string(format!("/proc/{pid}/maps"))
                    .is_ok_and(|m| maps_library(&m, "libcuda.so") && m.contains("sleep"))
            };
            if let (Some(i), Some(c)) = (init, child.filter(|&c| mapped(c))) {
                return (i, c);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no init and child of {parent}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn this_process_is_seen_by_its_slot() {
        let dir = tempfile::tempdir().unwrap();
        let l = crate::Ledger::create(&dir.path().join("s.ledger"), "s", &[]).unwrap();
        let slot = l.attach().unwrap();
        let found = ProcessTable::scan().check("no-such-cgroup", &l.snapshot());
        let me = found.iter().find(|p| p.pid == std::process::id()).unwrap();
        assert!(me.attached && !me.shim && !me.enforced());
        l.detach(slot);
    }
}
