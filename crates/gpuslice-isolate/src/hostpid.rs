//! The host-pid resolver: a unix socket the launcher serves from its poll
//! loop (it stays in the host's PID namespace), bound into the slice at a
//! fixed place (`gpuslice_ledger::limits::HOSTPID_FILE` in the slice
//! directory, see [`crate::slicefs`]).
//!
//! Drivers that report host pids whatever the caller's PID namespace
//! (docs/shim.md, "Which pid is ours") leave a process in the slice's PID
//! namespace no way to learn the number it is listed under. Each connection is answered with the
//! connecting process's pid as the kernel gives it to the launcher
//! (`SO_PEERCRED`: recorded at `connect`, translated into the reader's
//! namespace, the host's), 4 bytes little-endian, then closed. The client
//! is never read from and every call is non-blocking, so a tenant can
//! neither stall the launcher nor ask about another process: the kernel
//! names the connector. What a tenant can do with it is in
//! docs/security.md.

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Connections answered per wakeup of the launcher's loop: a flood cannot
/// keep it from the child's exit or a signal to relay.
pub const ANSWERS_PER_WAKEUP: usize = 64;

/// The listening socket; removed from the file system when dropped.
pub struct Resolver {
    listener: UnixListener,
    path: PathBuf,
}

impl Resolver {
    /// Listens at `path` (in the slice's root-only host directory):
    /// non-blocking, close-on-exec, connectable by any user of the slice
    /// (mode 0666: a `--user nobody` command resolves too; the directory
    /// above keeps everyone else out).
    pub fn bind(path: &Path) -> io::Result<Resolver> {
        let listener = UnixListener::bind(path)?;
        let r = Resolver {
            listener,
            path: path.to_path_buf(),
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        r.listener.set_nonblocking(true)?;
        Ok(r)
    }

    /// Answers up to [`ANSWERS_PER_WAKEUP`] pending connections; returns
    /// how many were answered.
    pub fn serve(&self) -> usize {
        let mut answered = 0;
        for _ in 0..ANSWERS_PER_WAKEUP {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if answer(&stream).is_ok() {
                        answered += 1;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // WouldBlock: none left; anything else (EMFILE, ...): try
                // again at the next wakeup rather than spin here.
                Err(_) => break,
            }
        }
        answered
    }

    /// Serves until poll fails (a thread of its own: the device plugin's).
    pub fn serve_forever(&self) -> io::Result<()> {
        loop {
            let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(nix::Error::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
            self.serve();
        }
    }
}

impl AsFd for Resolver {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The connector's pid in the caller's PID namespace (0 when it has none
/// there, e.g. a process of an ancestor namespace).
pub fn peer_pid(stream: &UnixStream) -> io::Result<u32> {
    // libc rather than rustix's `socket_peercred`: its pid is a non-zero
    // type, and the kernel gives 0 for an unmappable connector.
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a ucred.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u32::try_from(cred.pid).unwrap_or(0))
}

fn answer(stream: &UnixStream) -> io::Result<()> {
    stream.set_nonblocking(true)?;
    let pid = peer_pid(stream)?;
    // A fresh socket's send buffer is empty: 4 bytes always fit, and a
    // client that never reads costs nothing once it is closed.
    (&*stream).write_all(&pid.to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn answers_each_connector_with_its_own_pid_without_reading() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("hostpid");
        let r = Resolver::bind(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666);
        // Clients that never read, then one that does.
        let idle: Vec<_> = (0..100).map(|_| UnixStream::connect(&p).unwrap()).collect();
        let mut c = UnixStream::connect(&p).unwrap();
        let mut n = 0;
        while n < idle.len() + 1 {
            n += r.serve();
        }
        assert_eq!(r.serve(), 0, "nothing left");
        let mut b = [0u8; 4];
        c.read_exact(&mut b).unwrap();
        assert_eq!(u32::from_le_bytes(b), std::process::id());
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "closed after the answer");
        drop(r);
        assert!(!p.exists(), "removed when dropped");
    }
}
