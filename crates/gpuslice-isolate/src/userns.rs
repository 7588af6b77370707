//! The rootless path: a user namespace in which the caller is root, so it
//! may build the private /dev and the params overlay (layers 1, 2) as
//! bubblewrap does.

use std::fs;
use std::io;

/// Map our own uid and gid to themselves in the new user namespace.
pub fn map_self() -> io::Result<()> {
    let uid = nix::unistd::geteuid();
    let gid = nix::unistd::getegid();
    // An unprivileged process must give up setgroups before writing gid_map.
    fs::write("/proc/self/setgroups", "deny")?;
    fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))
}
