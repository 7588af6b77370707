//! A real container runtime for the CDI tests: Debian's podman (with runc)
//! running a local image that holds busybox-static (no registry). Needs
//! root, podman, runc and busybox-static (scripts/test.sh installs them).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A local busybox image, removed (with `files`) on drop.
pub struct Image {
    pub name: String,
    pub files: Vec<PathBuf>,
}

impl Drop for Image {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        let _ = Command::new("podman")
            .args(["rmi", "-f", &self.name])
            .output();
    }
}

impl Image {
    /// Imports `localhost/<tag>:busybox` from a rootfs built in `dir`.
    pub fn busybox(dir: &Path, tag: &str) -> Image {
        let name = format!("localhost/{tag}:busybox");
        let busybox = ["/bin/busybox", "/usr/bin/busybox"]
            .into_iter()
            .find(|p| Path::new(p).is_file())
            .expect("busybox-static is not installed (scripts/test.sh installs it)");
        let rootfs = dir.join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::copy(busybox, rootfs.join("bin/busybox")).unwrap();
        for applet in ["sh", "ls", "env", "cat", "test"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
        }
        let tar = dir.join("rootfs.tar");
        let ok = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .unwrap();
        assert!(ok.success());
        let out = Command::new("podman")
            .arg("import")
            .arg(&tar)
            .arg(&name)
            .output()
            .expect("podman is not installed (scripts/test.sh installs it)");
        assert!(out.status.success(), "podman import: {out:?}");
        Image {
            name,
            files: Vec::new(),
        }
    }

    /// `podman run` as this kind of machine allows: runc (crun refuses the
    /// hybrid cgroup layout), no network, ulimits below the hard limits.
    pub fn command(&self, device: &str, script: &str) -> Command {
        let mut c = Command::new("timeout");
        c.args([
            "120",
            "podman",
            "--runtime",
            "runc",
            "run",
            "--rm",
            "--network",
            "none",
        ])
        .args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ])
        .args(["--device", device, &self.name, "sh", "-c", script]);
        c
    }

    /// [`Image::command`], run to its end.
    pub fn run(&self, device: &str, script: &str) -> Output {
        self.command(device, script).output().unwrap()
    }
}

/// The `nvidia*` names of an `ls /dev` listing, sorted.
pub fn nvidia_nodes(listing: &str) -> Vec<String> {
    let mut v: Vec<String> = listing
        .lines()
        .filter(|l| l.starts_with("nvidia"))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}
