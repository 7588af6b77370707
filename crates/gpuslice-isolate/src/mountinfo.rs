//! `/proc/self/mountinfo`, where the cgroup hierarchies are found. (The
//! private `/dev` does not read it: on a Kubernetes node it has hundreds
//! of lines, and a launch needs only the mounts below `/dev`.)

use std::path::PathBuf;

pub(crate) const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of mountinfo: where it is mounted, its own (per-mount) options,
/// the filesystem type and its superblock options.
pub(crate) struct Mount<'a> {
    pub mount_point: PathBuf,
    pub mount_opts: &'a str,
    pub fstype: &'a str,
    pub super_opts: &'a str,
}

/// The mounts of a mountinfo text, in its order (a parent before the
/// mounts below it); malformed lines are skipped.
pub(crate) fn mounts(text: &str) -> impl Iterator<Item = Mount<'_>> {
    text.lines().filter_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut left = left.split(' ').skip(4);
        let (mount_point, mount_opts) = (left.next()?, left.next()?);
        let mut right = right.split(' ');
        let (fstype, _source, super_opts) = (right.next()?, right.next()?, right.next()?);
        Some(Mount {
            mount_point: PathBuf::from(unescape(mount_point)),
            mount_opts,
            fstype,
            super_opts,
        })
    })
}

/// Undoes the octal escapes (`\040` for a space…) of a mountinfo field.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') << 6 | (d[1] - b'0') << 3 | (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
