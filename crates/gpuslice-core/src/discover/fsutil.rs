//! File helpers shared by the procfs, sysfs and /dev readers.

use super::DiscoverError;
use crate::hostroot::HostRoot;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

/// Most symlinks followed while resolving one path (the kernel's limit), so
/// a link loop in a damaged or hand-made tree ends instead of spinning.
const MAX_LINK_HOPS: u32 = 40;

/// Reads a file the driver may or may not provide. Absent is `None`; any
/// other failure is an error naming the path, because a present but
/// unreadable procfs file means we would report a wrong picture silently.
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, DiscoverError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(DiscoverError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// [`read_optional`] for a driver file below the root, opened without
/// following any link ([`HostRoot::read_beneath`]): a linked `params` or
/// `information` is an error, never read through.
pub(crate) fn read_driver_file(
    root: &HostRoot,
    rel: &str,
) -> Result<Option<String>, DiscoverError> {
    match root.read_beneath(rel) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(DiscoverError::Read {
            path: root.join(rel),
            source,
        }),
    }
}

/// Reads a file whose absence or failure only costs detail (sysfs
/// attributes: some return EINVAL or EIO on devices that lack the feature).
pub(crate) fn read_lenient(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Resolves `host_path` (a path as the host sees it, like
/// `/sys/class/drm/card0/device`) to the path the host would reach, still
/// in host terms, following every symlink component by component.
///
/// The host root may be `/host` or a test tree, so an absolute link target
/// must restart at the host root, not at our `/`, and a relative target is
/// taken from the directory the link really lives in (sysfs class entries
/// are themselves links into `/sys/devices`, so lexical joining would go
/// wrong). Components that do not exist are kept as they are.
pub(crate) fn resolve(root: &HostRoot, host_path: &Path) -> PathBuf {
    let mut pending: Vec<OsString> = Vec::new();
    push_components(&mut pending, host_path);
    let mut done = PathBuf::from("/");
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            done.pop();
            continue;
        }
        let candidate = done.join(&part);
        match std::fs::read_link(root.join(&candidate)) {
            Ok(target) if hops < MAX_LINK_HOPS => {
                hops += 1;
                if target.is_absolute() {
                    done = PathBuf::from("/");
                }
                push_components(&mut pending, &target);
            }
            _ => done = candidate,
        }
    }
    done
}

/// Pushes the components of `p` onto a stack so that they pop in order;
/// `.` is dropped and `..` kept as a marker.
fn push_components(stack: &mut Vec<OsString>, p: &Path) {
    let parts: Vec<OsString> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    stack.extend(parts.into_iter().rev());
}

/// Names of the entries of a directory, sorted; empty when it cannot be read.
pub(crate) fn dir_names(path: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(path) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// `prefix<N>` → N, for names like `gi3`, `card1`, `renderD128`.
pub(crate) fn numbered(name: &str, prefix: &str) -> Option<u32> {
    let digits = name.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn resolve_follows_relative_and_absolute_links_inside_root() {
        let t = tempfile::tempdir().unwrap();
        let root = HostRoot::new(t.path());
        let dev = t.path().join("sys/devices/pci0000:17/0000:18:00.0");
        std::fs::create_dir_all(dev.join("drm/card1")).unwrap();
        std::fs::create_dir_all(t.path().join("sys/class/drm")).unwrap();
        // The class entry is a link into /sys/devices; `device` is relative
        // to where card1 really is.
        symlink(
            "../../devices/pci0000:17/0000:18:00.0/drm/card1",
            t.path().join("sys/class/drm/card1"),
        )
        .unwrap();
        symlink("../../../0000:18:00.0", dev.join("drm/card1/device")).unwrap();
        assert_eq!(
            resolve(&root, Path::new("/sys/class/drm/card1/device")),
            PathBuf::from("/sys/devices/pci0000:17/0000:18:00.0")
        );
        // An absolute target restarts at the host root, not at our `/`.
        symlink("/sys/devices/pci0000:17", t.path().join("sys/abs")).unwrap();
        assert_eq!(
            resolve(&root, Path::new("/sys/abs/0000:18:00.0")),
            PathBuf::from("/sys/devices/pci0000:17/0000:18:00.0")
        );
    }

    #[test]
    fn resolve_survives_loops_and_missing_parts() {
        let t = tempfile::tempdir().unwrap();
        let root = HostRoot::new(t.path());
        symlink("loop", t.path().join("loop")).unwrap();
        let _ = resolve(&root, Path::new("/loop/x")); // terminates
        assert_eq!(
            resolve(&root, Path::new("/nope/../a/./b")),
            PathBuf::from("/a/b")
        );
    }

    #[test]
    fn numbered_names() {
        assert_eq!(numbered("renderD128", "renderD"), Some(128));
        assert_eq!(numbered("card0", "card"), Some(0));
        assert_eq!(numbered("card0-DP-1", "card"), None);
        assert_eq!(numbered("card", "card"), None);
    }
}
