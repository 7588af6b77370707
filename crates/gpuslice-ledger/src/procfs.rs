//! Process identity from procfs: start time, state, name, pid namespace.

use std::os::unix::fs::MetadataExt;

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `Z`, ...
    pub state: char,
    /// Field 20: the number of threads.
    pub num_threads: u32,
    /// Field 22: start time in clock ticks after boot.
    pub start_time: u64,
    /// Field 2, without the parentheses.
    pub comm: String,
}

/// Sends SIGKILL to `pid` if `still_ours(pid)` holds once a pidfd pins
/// the process: a pid reused between the caller's reading and the kill is
/// either a process the pidfd does not name (the check then sees the new
/// one, not in the slice) or gone. Returns whether the signal was sent.
pub fn kill_if(pid: u32, still_ours: impl Fn(u32) -> bool) -> bool {
    // SAFETY: pidfd_open takes a pid and flags; returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return false;
    }
    let fd = fd as libc::c_int;
    let sent = still_ours(pid)
        // SAFETY: a pidfd we own; no siginfo; no flags.
        && unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        } == 0;
    // SAFETY: closes the fd opened above, owned by nobody else.
    unsafe { libc::close(fd) };
    sent
}

/// A file's identity: (device, inode).
pub type FileId = (u64, u64);

/// The identity of the file at `rel` (relative) in the root directory of
/// process `pid`, as that process would resolve it: through
/// `/proc/<pid>/root` with every component resolved inside that root
/// (`RESOLVE_IN_ROOT`) and no symbolic link followed at all
/// (`RESOLVE_NO_SYMLINKS`; a link a tenant planted there could otherwise
/// resolve in the reader's root, naming a file of the host). None when it
/// is not there or not reachable.
pub fn file_in_root(pid: u32, rel: &str) -> Option<FileId> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let root = std::fs::File::open(format!("/proc/{pid}/root")).ok()?;
    let rel = std::ffi::CString::new(rel).ok()?;
    // SAFETY: open_how is plain data; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: openat2 with a directory fd we own, a NUL-terminated path
    // and a valid open_how of the size passed; returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor that nothing else owns.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
    let md = file.metadata().ok()?;
    md.is_file().then_some((md.dev(), md.ino()))
}

/// The identity of the file at `path`, not following a link at the end.
pub fn file_id(path: &std::path::Path) -> Option<FileId> {
    let md = std::fs::symlink_metadata(path).ok()?;
    md.is_file().then_some((md.dev(), md.ino()))
}

/// Parses the text of `/proc/<pid>/stat`. The name may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let mut rest = text.get(close + 1..)?.split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    // Fields 4..=19 are 16 more; field 20 is the 17th after the state.
    let num_threads = rest.nth(16)?.parse().ok()?;
    // Field 21 is next; field 22 the one after it.
    let start_time = rest.nth(1)?.parse().ok()?;
    Some(ProcStat {
        state,
        num_threads,
        start_time,
        comm,
    })
}

/// The pids `/proc` lists (the processes of the pid namespace it was
/// mounted for); none when it cannot be read.
pub fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
}

/// Each process of [`pids`] with the text of its `/proc/<pid>/cgroup`
/// (a process that went meanwhile is left out).
pub fn cgroups() -> impl Iterator<Item = (u32, String)> {
    pids().filter_map(|pid| {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        Some((pid, cgroup))
    })
}

/// `/proc/<pid>/stat` of `pid`, parsed; None when it cannot be read or
/// parsed.
pub fn stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&read_stat(pid).ok()?)
}

/// `/proc/self/stat`, parsed: this process as the `/proc` mounted here
/// shows it, whatever pid namespace that `/proc` belongs to.
pub fn own_stat() -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// The text of `/proc/<pid>/stat`, for a caller that tells a process that
/// is gone (`NotFound`) from one it may not read.
pub fn read_stat(pid: u32) -> std::io::Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
}

/// Inode of `/proc/self/ns/pid`: identifies our pid namespace. 0 when
/// unknown (no procfs), which then matches any other unknown.
pub fn own_pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// Inode of the initial PID namespace (`PROC_PID_INIT_INO`): a process in
/// it sees every process of the machine in its `/proc`.
pub(crate) const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// `CAP_SYS_ADMIN`'s bit in `/proc/<pid>/status`'s `CapEff`.
const CAP_SYS_ADMIN: u32 = 21;

/// What lets process `pid` past any cap of its slice, as the kernel shows
/// it (not as a pod spec claims it): `CAP_SYS_ADMIN` in its effective set
/// in the host's user namespace (a privileged container, or one given
/// SYS_ADMIN: it mounts over the host's devices and other slices' files),
/// and, when the reader is
/// in the host's PID namespace (a plugin with `hostPID`), the host's PID
/// namespace (other slices' ledgers through `/proc/<pid>/root`), IPC
/// namespace or network namespace (the node's loopback services). Empty
/// for a process that is gone.
pub fn escape_routes(pid: u32) -> Vec<&'static str> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let ns = |pid: &str, kind: &str| {
        std::fs::metadata(format!("/proc/{pid}/ns/{kind}")).map(|m| m.ino())
    };
    let pid = pid.to_string();
    // CAP_SYS_ADMIN of a user namespace of its own (`unshare -Ur`, which
    // any process may do where seccomp allows it) rules only its own
    // mounts: what it uncovers there leaves it unshimmed, which the
    // enforcer judges. Only the host's user namespace's is an escape.
    let host_user = match (ns(&pid, "user"), ns("2", "user")) {
        (Ok(a), Ok(b)) => a == b,
        _ => true, // cannot tell: counted
    };
    if cap_eff & (1 << CAP_SYS_ADMIN) != 0 && host_user {
        out.push("CAP_SYS_ADMIN");
    }
    if own_pid_namespace() == INITIAL_PID_NAMESPACE {
        // The host's namespaces are kthreadd's (pid 2, always in the
        // initial ones; pid 1's may be unreadable under a sandboxing init).
        for (kind, route) in [
            ("pid", "hostPID"),
            ("ipc", "hostIPC"),
            ("net", "hostNetwork"),
        ] {
            match (ns(&pid, kind), ns("2", kind)) {
                (Ok(a), Ok(b)) if a == b => out.push(route),
                _ => {}
            }
        }
    }
    out
}

/// The processes of other (descendant) PID namespaces as this one sees
/// them. A slice's processes record their pid as their own PID namespace
/// numbers it (`gpuslice run` gives each slice one, with its own `/proc`,
/// where `NSpid` shows only that number); from outside, `/proc/<pid>/ns/pid`
/// and the last field of `NSpid` map it back to ours.
#[derive(Debug, Default)]
pub struct ForeignPids {
    /// (namespace inode, pid in it) → (pid here, start time).
    found: std::collections::HashMap<(u64, u32), (u32, u64)>,
    /// Namespaces with at least one process seen.
    seen: std::collections::HashSet<u64>,
    /// Whether we see every process (we are in the initial namespace), so
    /// a namespace without any is gone rather than out of sight.
    complete: bool,
}

impl ForeignPids {
    /// One pass over `/proc`, keeping the processes of `namespaces` only.
    pub fn scan(namespaces: &std::collections::HashSet<u64>) -> Self {
        let mut out = ForeignPids {
            complete: own_pid_namespace() == INITIAL_PID_NAMESPACE,
            ..Self::default()
        };
        let Ok(dir) = std::fs::read_dir("/proc") else {
            out.complete = false;
            return out;
        };
        out.add(
            namespaces,
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()),
        );
        out
    }

    /// [`ForeignPids::scan`] of the processes `pids` only (no `/proc` walk):
    /// a process of the namespaces that is not among them is not found.
    pub fn scan_among(namespaces: &std::collections::HashSet<u64>, pids: &[u32]) -> Self {
        let mut out = ForeignPids::default();
        out.add(namespaces, pids.iter().copied());
        out
    }

    fn add(
        &mut self,
        namespaces: &std::collections::HashSet<u64>,
        pids: impl Iterator<Item = u32>,
    ) {
        let out = self;
        for pid in pids {
            let Ok(ns) = std::fs::metadata(format!("/proc/{pid}/ns/pid")) else {
                continue;
            };
            if !namespaces.contains(&ns.ino()) {
                continue;
            }
            out.seen.insert(ns.ino());
            let inner = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| innermost_pid(&s));
            if let (Some(inner), Some(st)) = (inner, stat(pid)) {
                if st.state != 'Z' && st.state != 'X' {
                    out.found.insert((ns.ino(), inner), (pid, st.start_time));
                }
            }
        }
    }

    /// Our pid for the process recorded as `pid` in namespace `ns`, started
    /// at `start_time`; None when it is not (or no longer) there.
    pub fn resolve(&self, ns: u64, pid: u32, start_time: u64) -> Option<u32> {
        self.found
            .get(&(ns, pid))
            .filter(|(_, start)| *start == start_time)
            .map(|(here, _)| *here)
    }

    /// Liveness of that process; None when it cannot be told from here
    /// (its namespace is out of our sight).
    pub fn liveness(&self, ns: u64, pid: u32, start_time: u64) -> Option<Liveness> {
        if self.resolve(ns, pid, start_time).is_some() {
            Some(Liveness::Alive)
        } else if self.seen.contains(&ns) || self.complete {
            Some(Liveness::Dead)
        } else {
            None
        }
    }
}

/// The fields of `NSpid:` in a status text: the process's pid in the
/// reader's namespace first, in its own last; none if one is not a number.
fn nspids(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|f| f.split_whitespace().map(|p| p.parse().ok()).collect())
        .unwrap_or_default()
}

/// The last field of `NSpid:` in a status text: the pid in the process's
/// own namespace.
pub fn innermost_pid(status: &str) -> Option<u32> {
    nspids(status).last().copied()
}

/// Whether a status text is of the init of a pid namespace below the
/// reader's (pid 1 there, another pid here) whose parent is `parent`.
pub fn is_child_namespace_init(status: &str, parent: u32) -> bool {
    let ns = nspids(status);
    parent_pid(status) == Some(parent) && ns.len() > 1 && ns.last() == Some(&1)
}

/// `PPid:` in a status text: the parent's pid in the reader's namespace.
pub fn parent_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
}

/// Liveness of a process recorded as (pid, start time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    /// Gone, a zombie, or the pid now names a younger process.
    Dead,
}

pub fn liveness(pid: u32, start_time: u64) -> Liveness {
    match stat(pid) {
        Some(s) if s.start_time == start_time && s.state != 'Z' && s.state != 'X' => {
            Liveness::Alive
        }
        Some(_) => Liveness::Dead,
        // No stat: gone, unless procfs is unreadable for it (hidepid) while
        // the pid exists — then assume alive rather than steal its bytes.
        None if crate::map::pid_exists(pid) && !procfs_readable_for(pid) => Liveness::Alive,
        None => Liveness::Dead,
    }
}

fn procfs_readable_for(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file in a process's root is found as that process resolves it;
    /// a symbolic link anywhere on the way is not followed (a tenant's link
    /// would otherwise name a file in the reader's root).
    #[test]
    fn a_file_in_a_process_s_root_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("limits");
        std::fs::write(&file, "x").unwrap();
        std::os::unix::fs::symlink(&file, dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("dirlink")).unwrap();
        let me = std::process::id();
        let rel = |name: &str| {
            dir.path()
                .join(name)
                .strip_prefix("/")
                .unwrap()
                .display()
                .to_string()
        };
        assert_eq!(file_in_root(me, &rel("limits")), file_id(&file));
        assert!(file_id(&file).is_some());
        assert_eq!(file_in_root(me, &rel("link")), None);
        assert_eq!(file_in_root(me, &rel("dirlink/limits")), None);
        assert_eq!(file_in_root(me, &rel("missing")), None);
    }

    /// A sleeping process's stat line with the name `comm` and `threads`
    /// threads parses back to them.
    fn parses_sleeper(comm: &str, threads: u32) {
        let text = format!(
            "4242 ({comm}) S 1 4242 4242 0 -1 4194560 300 0 0 0 \
             5 2 0 0 20 0 {threads} 0 987654 12345678 100 18446744073709551615"
        );
        let s = parse_stat(&text).unwrap();
        assert_eq!(s.comm, comm);
        assert_eq!(s.state, 'S');
        assert_eq!(s.num_threads, threads);
        assert_eq!(s.start_time, 987654);
    }

    #[test]
    fn parses_names_with_spaces_and_parens() {
        parses_sleeper("my (odd) name", 1);
    }

    /// A name may hold `) (` and look like fields: a process that names
    /// itself so must not pass for a zombie, nor shift the start time.
    #[test]
    fn a_name_with_close_open_parens_does_not_shift_the_fields() {
        parses_sleeper("a) (b) Z 1 (c", 7);
        assert_eq!(parse_stat("4242 (a) (b"), None);
    }

    #[test]
    fn nspid_gives_the_innermost_pid_and_tells_a_child_namespace_s_init() {
        assert_eq!(innermost_pid("Name:\tx\nNSpid:\t4242\t2\n"), Some(2));
        assert_eq!(innermost_pid("NSpid:\t7\n"), Some(7));
        assert_eq!(innermost_pid("Name:\tx\n"), None);
        assert_eq!(innermost_pid("NSpid:\t4242\tx\n"), None);
        let init = "PPid:\t40\nNSpid:\t41\t1\n";
        assert!(is_child_namespace_init(init, 40));
        assert!(!is_child_namespace_init(init, 39), "another parent's");
        assert!(
            !is_child_namespace_init("PPid:\t40\nNSpid:\t1\n", 40),
            "the reader's own init"
        );
        assert!(
            !is_child_namespace_init("PPid:\t40\nNSpid:\t41\t2\n", 40),
            "not pid 1"
        );
    }

    #[test]
    fn a_process_in_a_child_pid_namespace_resolves_to_its_host_pid() {
        // SAFETY: geteuid cannot fail and touches no memory.
        if unsafe { libc::geteuid() } != 0 && std::env::var_os("CI").is_none() {
            return; // unshare -p needs root; CI runs as root
        }
        let mut child = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", "sleep", "30"])
            .spawn()
            .expect("unshare (util-linux)");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        // The sleep is pid 1 of the new namespace; find its host pid.
        let (host, ns) = loop {
            let found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                let ppid_is_unshare = status
                    .lines()
                    .any(|l| l == format!("PPid:\t{}", child.id()));
                let ns = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino();
                (ppid_is_unshare && innermost_pid(&status) == Some(1)).then_some((pid, ns))
            });
            if let Some(f) = found {
                break f;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no sleep in a new pid namespace"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let start = stat(host).unwrap().start_time;
        let pids = ForeignPids::scan(&[ns].into());
        assert_eq!(pids.resolve(ns, 1, start), Some(host));
        assert_eq!(pids.liveness(ns, 1, start), Some(Liveness::Alive));
        assert_eq!(pids.liveness(ns, 1, start + 1), Some(Liveness::Dead));
        assert_eq!(pids.liveness(ns, 2, start), Some(Liveness::Dead));
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn own_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = std::process::id();
        let s = stat(me).expect("own stat");
        assert_eq!(liveness(me, s.start_time), Liveness::Alive);
        assert_eq!(liveness(me, s.start_time + 1), Liveness::Dead);
        assert_eq!(liveness(u32::MAX - 7, 1), Liveness::Dead);
    }
}
