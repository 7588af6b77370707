//! Opening a file in a directory every user may write (the ledger
//! directory and the boards' are 1777): what a user planted there, a
//! symlink to a file root would then open and map, a FIFO, is refused
//! before anything opens it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A handle (`O_PATH`: nothing is opened) on `path` itself, never on
/// what a symlink there names, that is a regular file: a FIFO or a device
/// node is refused before anything opens it.
pub fn regular_file_handle(path: &Path) -> io::Result<File> {
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    if handle.metadata()?.is_file() {
        Ok(handle)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a symlink, FIFO or device is never opened)",
        ))
    }
}

/// The path that reopens the inode `handle` holds.
pub fn fd_path(handle: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()))
}

/// `path` opened read-only if it is a regular file ([`regular_file_handle`]).
pub fn open_read_only(path: &Path) -> io::Result<File> {
    File::open(fd_path(&regular_file_handle(path)?))
}

/// `path` opened read-write if it is a regular file, else created new
/// (`mode`, no link followed); `InvalidInput` when something else is there,
/// which is never opened.
pub fn open_or_create_rw(path: &Path, mode: u32) -> io::Result<File> {
    let reopen = |handle: File| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(fd_path(&handle))
    };
    match regular_file_handle(path) {
        Ok(handle) => reopen(handle),
        Err(e) if e.kind() == io::ErrorKind::NotFound => OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .or_else(|e| match e.kind() {
                // Another process made it first.
                io::ErrorKind::AlreadyExists => reopen(regular_file_handle(path)?),
                _ => Err(e),
            }),
        Err(e) => Err(e),
    }
}
