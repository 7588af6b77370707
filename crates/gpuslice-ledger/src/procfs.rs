//! Process identity from procfs: start time, state, name, pid namespace.

use std::os::unix::fs::MetadataExt;

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `Z`, ...
    pub state: char,
    /// Field 22: start time in clock ticks after boot.
    pub start_time: u64,
    /// Field 2, without the parentheses.
    pub comm: String,
}

/// Parses the text of `/proc/<pid>/stat`. The name may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let mut rest = text.get(close + 1..)?.split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    // Fields 4..=21 are 18 more; field 22 is the 19th after the state.
    let start_time = rest.nth(18)?.parse().ok()?;
    Some(ProcStat {
        state,
        start_time,
        comm,
    })
}

pub fn stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Inode of `/proc/self/ns/pid`: identifies our pid namespace. 0 when
/// unknown (no procfs), which then matches any other unknown.
pub fn own_pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
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

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let text = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 300 0 0 0 \
                    5 2 0 0 20 0 1 0 987654 12345678 100 18446744073709551615";
        let s = parse_stat(text).unwrap();
        assert_eq!(s.comm, "my (odd) name");
        assert_eq!(s.state, 'S');
        assert_eq!(s.start_time, 987654);
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
