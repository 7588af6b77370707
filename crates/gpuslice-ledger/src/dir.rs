//! The directory of ledgers: where it is, making it, and listing it
//! without trusting what others planted there.

use crate::error::{io_err, Result};
use crate::layout::{FILE_SIZE, FILE_SIZE_V1};
use crate::limits;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where `run` puts slice ledgers (`<dir>/<slice-id>.ledger`).
pub const DEFAULT_DIR: &str = "/run/gpuslice/slices";
/// Environment variable naming the directory of ledgers (tests, non-root).
pub const DIR_ENV: &str = "GPUSLICE_LEDGER_DIR";

/// `$GPUSLICE_LEDGER_DIR`, else [`DEFAULT_DIR`].
pub fn ledger_dir() -> PathBuf {
    env_dir_or(DIR_ENV, DEFAULT_DIR)
}

/// The directory the environment variable `env` names, else `default`
/// (an empty value counts as unset).
pub(crate) fn env_dir_or(env: &str, default: &str) -> PathBuf {
    std::env::var_os(env)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// Creates `dir` (and parents) world-writable with the sticky bit, like
/// `/tmp`, so unprivileged processes of a slice may create their ledger.
pub fn ensure_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o1777)
        .create(dir)
        .map_err(io_err(dir))?;
    // The umask may have narrowed the mode.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o1777)).map_err(io_err(dir))
}

/// Ledgers in `dir`, sorted: the usage ledgers of slices with a limits
/// record (`<dir>/<id>/usage`, see [`limits`]) and plain ledger files
/// (`<dir>/*.ledger`, regular files of a ledger's size); none when it is
/// missing. What else is there is [`DirScan::junk`].
pub fn list_dir(dir: &Path) -> Vec<PathBuf> {
    scan_dir(dir).ledgers
}

/// What the ledger directory (1777: any local user may add to it) holds.
#[derive(Debug, Default)]
pub struct DirScan {
    /// As [`list_dir`].
    pub ledgers: Vec<PathBuf>,
    /// Everything else but root's own directories (a slice's records being
    /// made or removed, the boards when kept there): `*.ledger` files of
    /// another size (300 empty ones planted by `nobody` made
    /// `gpuslice slices` print 300 error lines), links, FIFOs, sockets,
    /// other names. Sorted by path.
    pub junk: Vec<Junk>,
}

/// An entry of the ledger directory that is not a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Junk {
    pub path: PathBuf,
    /// Its owner (`u32::MAX` when it went before it could be looked at).
    pub uid: u32,
}

/// One pass over `dir`: each entry's type from the listing, one `lstat`
/// for a `*.ledger` file (its size), a directory (its owner, its `usage`)
/// or junk (its owner); nothing is opened and no link followed.
pub fn scan_dir(dir: &Path) -> DirScan {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = fs::read_dir(dir) else {
        return DirScan::default();
    };
    let mut scan = DirScan::default();
    let owner = |p: &Path| fs::symlink_metadata(p).map_or(u32::MAX, |m| m.uid());
    for e in entries.flatten() {
        let Ok(kind) = e.file_type() else { continue };
        let p = e.path();
        if kind.is_file() && p.extension().is_some_and(|x| x == "ledger") {
            match fs::symlink_metadata(&p) {
                Ok(m) if m.is_file() && [FILE_SIZE, FILE_SIZE_V1].contains(&(m.len() as usize)) => {
                    scan.ledgers.push(p)
                }
                Ok(m) => scan.junk.push(Junk {
                    path: p,
                    uid: m.uid(),
                }),
                Err(_) => {} // gone
            }
            continue;
        }
        if kind.is_dir() {
            let usage = p.join(limits::USAGE_FILE);
            if fs::symlink_metadata(&usage).is_ok_and(|m| m.is_file()) {
                scan.ledgers.push(usage);
                continue;
            }
            let uid = owner(&p);
            if uid != 0 {
                scan.junk.push(Junk { path: p, uid });
            }
            continue;
        }
        let uid = owner(&p);
        scan.junk.push(Junk { path: p, uid });
    }
    scan.ledgers.sort();
    scan.junk.sort_by(|a, b| a.path.cmp(&b.path));
    scan
}
