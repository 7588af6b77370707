//! The kernel driver, and the user-space libraries that must match it: a
//! `libcuda.so.1` of another version than the loaded module is what makes
//! CUDA fail with "unknown error" or "driver/library version mismatch".
//!
//! The libraries are found as the dynamic loader would find them: through
//! `ldconfig -p` when the host root is `/`, and by looking in the loader's
//! directories (`etc/ld.so.conf.d/*.conf`, then the standard ones) below
//! the host root. The driver packages name the real file after the driver
//! version (`libcuda.so.580.159.04`, with `libcuda.so.1` a link to it), so
//! the version is read from the name the `.so.1` link resolves to.

use crate::{list, looks_like_version, Check, Context};
use gpuslice_core::HostRoot;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn checks(ctx: &Context) -> Vec<Check> {
    let mut out = vec![loaded(ctx)];
    for lib in [LIBCUDA, LIBNVML] {
        out.push(library(ctx, lib));
    }
    out.push(partitions(ctx));
    out
}

/// The driver's per-cgroup memory partitions (NVIDIA R615+,
/// `nvmlDeviceSetMemoryLimits_v1`): the layer `run --memory` sets on the
/// slice's cgroup where it exists (docs/security.md, "Root's enforcer").
/// Available needs an R615+ driver whose NVML answers, cgroup v2, and a
/// GPU not in MIG mode; the backend is the kernel's `dmem` controller
/// (Linux 6.14+) where the cgroup root offers it, else the driver's own
/// accounting (`misc`). Not available is no fault (a skip): the shim and
/// root's enforcer hold the caps then.
fn partitions(ctx: &Context) -> Check {
    const NAME: &str = "driver.memory-partitions";
    let fix = "caps are held by the shim and root's enforcer; the driver's own partitions need NVIDIA R615 or later, cgroup v2, and GPUs not in MIG mode";
    let Some(version) = ctx.driver_version() else {
        return Check::skip(NAME, "no NVIDIA driver", fix);
    };
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 615 {
        return Check::skip(
            NAME,
            format!("not available: driver {version} is older than R615, which added per-cgroup memory partitions"),
            fix,
        );
    }
    let cgroup2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(Path::new)
        .find(|p| p.join("cgroup.controllers").exists());
    let Some(cgroup2) = cgroup2 else {
        return Check::skip(
            NAME,
            format!("not available: driver {version} has them, but this host has no cgroup v2"),
            fix,
        );
    };
    let gpus: Vec<&gpuslice_core::Gpu> = ctx
        .gpus()
        .iter()
        .filter(|g| g.mig_enabled != Some(true))
        .collect();
    let Some(gpu) = gpus.first() else {
        return Check::skip(
            NAME,
            "not available: every GPU is in MIG mode (partitions do not apply to MIG)",
            fix,
        );
    };
    let answered = gpuslice_cuda_load::partitions::Partitions::open()
        .and_then(|p| p.available(&gpu.uuid, cgroup2));
    if let Err(e) = answered {
        return Check::skip(NAME, format!("not available: {e}"), fix);
    }
    let backend = match fs::read_to_string(cgroup2.join("cgroup.controllers")) {
        Ok(c) if c.split_whitespace().any(|x| x == "dmem") => {
            "dmem (the kernel's cgroup controller)"
        }
        _ => "misc (the driver's own per-cgroup accounting)",
    };
    let mig = ctx.gpus().len() - gpus.len();
    Check::pass(
        NAME,
        format!(
            "available: driver {version}, cgroup v2 at {}, backend {backend}{}; `run --memory` sets the hard limit on each slice's cgroup",
            cgroup2.display(),
            if mig > 0 { format!("; not on the {mig} GPU(s) in MIG mode") } else { String::new() }
        ),
    )
}

pub const LIBCUDA: &str = "libcuda.so";
pub const LIBNVML: &str = "libnvidia-ml.so";

fn loaded(ctx: &Context) -> Check {
    const NAME: &str = "driver.loaded";
    let inv = match &ctx.inv {
        Ok(inv) => inv,
        Err(e) => {
            return Check::fail(
                NAME,
                e.to_string(),
                "load the driver (modprobe nvidia; install the NVIDIA driver package if it is \
                 missing); in a container, mount the host at /host and pass --host-root /host",
            )
        }
    };
    let text = fs::read_to_string(ctx.root.nvidia_proc().join("version")).unwrap_or_default();
    let flavour = if text.contains("Open Kernel Module") {
        " (open kernel module)"
    } else if text.contains("Kernel Module") {
        " (proprietary kernel module)"
    } else {
        ""
    };
    let n = inv.gpus.len();
    match (&inv.driver_version, n) {
        (None, _) => Check::warn(
            NAME,
            format!(
                "the driver is loaded but {} names no version",
                ctx.root.nvidia_proc().join("version").display()
            ),
            "check that /proc/driver/nvidia/version is readable (dmesg | grep NVRM)",
        ),
        (Some(v), 0) => Check::fail(
            NAME,
            format!("nvidia {v}{flavour} is loaded but drives no GPU"),
            "check `lspci -d 10de:` and `dmesg | grep NVRM` for GPUs the driver refused \
             (unsupported, excluded, or fallen off the bus)",
        ),
        (Some(v), n) => Check::pass(
            NAME,
            format!(
                "nvidia {v}{flavour}, {n} GPU{}",
                if n == 1 { "" } else { "s" }
            ),
        ),
    }
}

/// One copy of a library the loader may pick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibFile {
    /// The `<lib>.1` path as found.
    pub link: PathBuf,
    /// What it resolves to (below the host root).
    pub target: PathBuf,
    /// The driver version in the target's name, when it has one.
    pub version: Option<String>,
}

fn library(ctx: &Context, lib: &str) -> Check {
    let name = format!("driver.{}", lib.trim_end_matches(".so"));
    let soname = format!("{lib}.1");
    let kernel = ctx.driver_version();
    let found = find_library(&ctx.root, lib);
    let install = |v: Option<&str>| {
        format!(
            "install the driver's user-space libraries{} (Ubuntu: apt install \
             libnvidia-compute-<branch>; or the .run installer), then run ldconfig",
            v.map(|v| format!(" of version {v}")).unwrap_or_default()
        )
    };
    if lib == LIBNVML {
        if let Some(e) = ctx
            .inv
            .as_ref()
            .ok()
            .and_then(|i| i.nvml_error.as_deref())
            .filter(|e| e.to_ascii_lowercase().contains("mismatch"))
        {
            return Check::fail(&name, e, install(kernel));
        }
    }
    let Some(first) = found.first() else {
        return Check::fail(
            &name,
            format!(
                "{soname} not found ({}: {})",
                if ctx.root.is_system_root() {
                    "loader cache and library directories"
                } else {
                    "library directories"
                },
                list(
                    &lib_dirs(&ctx.root)
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>(),
                    4
                )
            ),
            install(kernel),
        );
    };
    let shown = |f: &LibFile| format!("{} → {}", f.link.display(), f.target.display());
    let Some(version) = &first.version else {
        return Check::warn(
            &name,
            format!("{}: no driver version in the file name", shown(first)),
            "reinstall the driver's user-space libraries so that the file names carry \
             the version (libcuda.so.<version>)",
        );
    };
    let Some(kernel) = kernel else {
        return Check::warn(
            &name,
            format!(
                "{} ({version}); the kernel driver's version is unknown",
                shown(first)
            ),
            "load the nvidia kernel module (modprobe nvidia)",
        );
    };
    if version != kernel {
        let fix = if newer(version, kernel) {
            format!(
                "the libraries were upgraded to {version} but the {kernel} module is still \
                 loaded: reboot, or unload and reload the nvidia modules"
            )
        } else {
            install(Some(kernel))
        };
        return Check::fail(
            &name,
            format!(
                "{} is {version} but the kernel module is {kernel}: CUDA fails with \
                 \"unknown error\" / NVML with \"driver/library version mismatch\"",
                shown(first)
            ),
            fix,
        );
    }
    let others: Vec<String> = found[1..]
        .iter()
        .filter(|f| f.version.as_deref() != Some(kernel))
        .map(|f| {
            format!(
                "{} ({})",
                shown(f),
                f.version.as_deref().unwrap_or("no version")
            )
        })
        .collect();
    if !others.is_empty() {
        return Check::warn(
            &name,
            format!(
                "{} matches {kernel}, but other copies may shadow it: {}",
                shown(first),
                list(&others, 3)
            ),
            "remove the stale copies (or their ld.so.conf.d entries) and run ldconfig",
        );
    }
    Check::pass(
        &name,
        format!("{} matches the kernel module ({kernel})", shown(first)),
    )
}

/// Whether dotted version `a` is greater than `b`.
fn newer(a: &str, b: &str) -> bool {
    let parse = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(a) > parse(b)
}

/// Every `<lib>.1` the loader may find, in the loader's order (the cache
/// first when the host root is `/`), without duplicates.
pub fn find_library(root: &HostRoot, lib: &str) -> Vec<LibFile> {
    let soname = format!("{lib}.1");
    let mut links: Vec<PathBuf> = Vec::new();
    if root.is_system_root() {
        if let Some(text) = ldconfig_p() {
            links.extend(parse_ldconfig(&text, &soname, ldconfig_arch()));
        }
    }
    for dir in lib_dirs(root) {
        let p = dir.join(&soname);
        if p.symlink_metadata().is_ok() {
            links.push(p);
        }
    }
    let mut out: Vec<LibFile> = Vec::new();
    for link in links {
        let target = resolve_under(root, &link);
        let real = fs::canonicalize(&target).unwrap_or(target.clone());
        if out
            .iter()
            .any(|f| fs::canonicalize(&f.target).unwrap_or(f.target.clone()) == real)
        {
            continue;
        }
        let version = target
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(lib))
            .and_then(|v| v.strip_prefix('.'))
            .filter(|v| looks_like_version(v))
            .map(str::to_string);
        out.push(LibFile {
            link,
            target,
            version,
        });
    }
    out
}

/// Follows symlinks of the final component, keeping absolute targets below
/// the host root (a host mounted at /host has links to /usr/lib/…).
fn resolve_under(root: &HostRoot, path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    for _ in 0..16 {
        let Ok(t) = fs::read_link(&p) else { break };
        p = if t.is_absolute() {
            root.join(&t)
        } else {
            p.parent().unwrap_or(Path::new("/")).join(t)
        };
    }
    p
}

/// The loader's directories below the host root: those of
/// `etc/ld.so.conf` and `etc/ld.so.conf.d/*.conf` (not following
/// `include` beyond that directory), then the standard ones, then where
/// the GPU operator's driver container puts them.
pub fn lib_dirs(root: &HostRoot) -> Vec<PathBuf> {
    let arch = format!("{}-linux-gnu", std::env::consts::ARCH);
    let mut confs = vec![root.join("etc/ld.so.conf")];
    let mut d: Vec<PathBuf> = fs::read_dir(root.join("etc/ld.so.conf.d"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                .collect()
        })
        .unwrap_or_default();
    d.sort();
    confs.extend(d);
    let mut dirs: Vec<String> = Vec::new();
    for conf in confs {
        let text = fs::read_to_string(&conf).unwrap_or_default();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() || line.starts_with("include") {
                continue;
            }
            dirs.push(line.to_string());
        }
    }
    for std_dir in [
        format!("/lib/{arch}"),
        format!("/usr/lib/{arch}"),
        "/lib64".into(),
        "/usr/lib64".into(),
        "/lib".into(),
        "/usr/lib".into(),
        "/usr/local/nvidia/lib64".into(),
        format!("/run/nvidia/driver/usr/lib/{arch}"),
        "/run/nvidia/driver/usr/lib64".into(),
    ] {
        dirs.push(std_dir);
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let p = root.join(&d);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

fn ldconfig_p() -> Option<String> {
    for exe in ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"] {
        if let Ok(out) = Command::new(exe).arg("-p").output() {
            if out.status.success() {
                return Some(String::from_utf8_lossy(&out.stdout).into_owned());
            }
        }
    }
    None
}

/// How `ldconfig -p` tags libraries of this process's architecture.
fn ldconfig_arch() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Some("x86-64"),
        "aarch64" => Some("AArch64"),
        "powerpc64" => Some("64bit"),
        _ => None,
    }
}

/// Paths of `soname` in `ldconfig -p` output
/// (`\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1`),
/// only those of architecture `arch` when given.
pub fn parse_ldconfig(text: &str, soname: &str, arch: Option<&str>) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            let (left, path) = l.split_once(" => ")?;
            let mut parts = left.trim().splitn(2, ' ');
            let name = parts.next()?;
            let tags = parts.next().unwrap_or("");
            let arch_ok = match arch {
                Some(a) => tags.split([',', '(', ')']).any(|t| t == a),
                None => true,
            };
            (name == soname && arch_ok).then(|| PathBuf::from(path.trim()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_testkit::temphost::TempHost;
    use std::os::unix::fs::symlink;

    #[test]
    fn ldconfig_lines() {
        let text = "1234 libs found in cache `/etc/ld.so.cache'\n\
            \tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1\n\
            \tlibcuda.so.1 (libc6) => /lib/i386-linux-gnu/libcuda.so.1\n\
            \tlibcuda.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so\n\
            \tlibcudart.so.12 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudart.so.12\n";
        assert_eq!(
            parse_ldconfig(text, "libcuda.so.1", Some("x86-64")),
            [PathBuf::from("/lib/x86_64-linux-gnu/libcuda.so.1")]
        );
        assert_eq!(parse_ldconfig(text, "libcuda.so.1", None).len(), 2);
        assert!(parse_ldconfig(text, "libnvidia-ml.so.1", None).is_empty());
    }

    #[test]
    fn finds_versions_below_the_root_and_in_ld_so_conf() {
        let h = TempHost::new();
        let root = h.root();
        let arch = std::env::consts::ARCH;
        let lib = h.write(
            &format!("usr/lib/{arch}-linux-gnu/libcuda.so.580.159.04"),
            "x",
        );
        // An absolute link must resolve below the root, not on this system.
        let abs = format!("/usr/lib/{arch}-linux-gnu/libcuda.so.580.159.04");
        symlink(&abs, lib.with_file_name("libcuda.so.1")).unwrap();
        // merged /usr: lib -> usr/lib finds the same file once.
        symlink("usr/lib", h.path().join("lib")).unwrap();
        let opt_lib = h.write("opt/nv/libcuda.so.575.57.08", "x");
        symlink(
            "libcuda.so.575.57.08",
            opt_lib.with_file_name("libcuda.so.1"),
        )
        .unwrap();
        h.write("etc/ld.so.conf.d/zz-nv.conf", "# comment\n/opt/nv\n");

        let found = find_library(&root, LIBCUDA);
        let versions: Vec<_> = found.iter().map(|f| f.version.clone()).collect();
        assert_eq!(
            versions,
            [
                Some("575.57.08".to_string()),
                Some("580.159.04".to_string())
            ],
            "{found:?}"
        );
        assert!(found[1].target.starts_with(h.path()), "{found:?}");
        assert!(find_library(&root, LIBNVML).is_empty());
    }

    #[test]
    fn version_order() {
        assert!(newer("580.159.04", "575.57.08"));
        assert!(!newer("570.86.15", "580.65.06"));
        assert!(newer("580.159.10", "580.159.04"));
    }
}
