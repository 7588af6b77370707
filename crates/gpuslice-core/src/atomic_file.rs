//! Replacing a file so that a reader (a container runtime reading a CDI
//! spec, node-feature-discovery reading labels, a plugin restarting on its
//! checkpoint) sees the old content or the new, never a part, even across
//! a crash: the content goes to a temporary file in the same directory
//! (so the rename never crosses a filesystem), is synced to disk, gets its
//! mode, and is renamed over the target. The ONE such writer of the
//! product crates; the ledger crate, which depends on nothing, keeps its
//! own (see `gpuslice_ledger::limits`).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Why a file could not be replaced: the step, the path it was on, and
/// the system's error.
#[derive(Debug, thiserror::Error)]
#[error("cannot {step} {}: {source}", path.display())]
pub struct AtomicWriteError {
    /// What was being done (`create`, `write a temporary file in`, …).
    pub step: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Writes `data` to `path` with permissions `mode`: a temporary file
/// `.<name>.<random>.tmp` beside it (a dot name: readers that list the
/// directory, like NFD, skip it), synced, then renamed into place. Creates
/// the directory when missing. On failure the temporary file is removed
/// and the old `path`, if any, is left as it was.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), AtomicWriteError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let at = |step: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| AtomicWriteError { step, path, source }
    };
    std::fs::create_dir_all(dir).map_err(at("create", dir))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.as_deref().unwrap_or("file")))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(at("create a temporary file in", dir))?;
    let step = "write a temporary file in";
    tmp.write_all(data).map_err(at(step, dir))?;
    tmp.as_file().sync_all().map_err(at(step, dir))?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))
        .map_err(at(step, dir))?;
    tmp.persist(path)
        .map_err(|e| at("rename into", path)(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn replaces_with_the_mode_given_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/file");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o644).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o644);
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("file")]);
    }

    #[test]
    fn a_failed_write_names_the_path_and_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should go: the rename fails.
        let p = dir.path().join("taken");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("inside"), b"kept").unwrap();
        let e = write_atomic(&p, b"new", 0o644).unwrap_err();
        assert!(e.to_string().contains("rename into"), "{e}");
        assert!(e.to_string().contains(&p.display().to_string()), "{e}");
        assert_eq!(std::fs::read(p.join("inside")).unwrap(), b"kept");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "the temporary file is removed");
    }
}
