//! [`FakeHost`] and its builder.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

// The layout gpuslice reads to tell a simulated host (its marker, the
// installed driver, the shared engine) is the product's contract,
// gpuslice_core::simulation: this crate writes it.
use gpuslice_core::simulation::{DRIVER_DIR, ENGINE_FILE, MARKER_FILE, STATE_DIR};

use crate::kernel::{self, Kernel, KernelGpu, KernelMig};
use crate::trace::{self, TraceRecord};
use crate::tree;

/// Most GPUs a host can have (bus ids `0x18 + 0x10 * i` must fit a byte).
pub const MAX_GPUS: u32 = 14;

/// A fake GPU host under a root directory: device nodes, procfs, sysfs and
/// the kernel truth the fake driver reads. A temporary root is removed when
/// the host is dropped (see [`FakeHost::keep`]).
#[derive(Debug)]
pub struct FakeHost {
    root: PathBuf,
    kernel: Kernel,
    tmp: Option<TempDir>,
}

/// Configures a [`FakeHost`]; see [`FakeHost::builder`].
#[derive(Debug, Clone)]
pub struct FakeHostBuilder {
    gpus: u32,
    modify_device_files: bool,
    migs: BTreeMap<u32, u32>,
    degraded: BTreeSet<u32>,
    init_ms_per_gpu: u64,
    ctx_ms: u64,
    ctx_bytes: u64,
    module_bytes: u64,
    root: Option<PathBuf>,
    persistence_mode: bool,
    driver_libs: Option<String>,
    driver_version: Option<String>,
}

impl Default for FakeHostBuilder {
    fn default() -> Self {
        FakeHostBuilder {
            gpus: 1,
            modify_device_files: true,
            migs: BTreeMap::new(),
            degraded: BTreeSet::new(),
            init_ms_per_gpu: 0,
            ctx_ms: 0,
            ctx_bytes: 0,
            module_bytes: 0,
            root: None,
            persistence_mode: true,
            driver_libs: None,
            driver_version: None,
        }
    }
}

/// Builder methods that set a field of the same name to the value given.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $ty) -> Self {
                self.$name = value;
                self
            }
        )*
    };
}

impl FakeHostBuilder {
    setters! {
        /// Number of GPUs (default 1, at most [`MAX_GPUS`]).
        gpus: u32;
        /// `ModifyDeviceFiles` in `proc/driver/nvidia/params` (default true, as
        /// on a stock driver).
        modify_device_files: bool;
        /// Persistence mode of every GPU as the fake NVML reports it (default on).
        persistence_mode: bool;
        /// Simulated `cuInit` cost per reachable GPU.
        init_ms_per_gpu: u64;
        /// Simulated cost of a process's first context.
        ctx_ms: u64;
        /// Device memory each context holds (default 0).
        ctx_bytes: u64;
        /// Device memory each loaded module or library holds (default 0).
        module_bytes: u64;
    }

    /// Enables MIG on GPU `gpu_index` with `instances` 1g.18gb instances
    /// (GPU instances 1..=n, one compute instance each).
    pub fn mig(mut self, gpu_index: u32, instances: u32) -> Self {
        self.migs.insert(gpu_index, instances);
        self
    }

    /// Gives GPU `gpu_index` a degraded PCIe link (Gen4 x8 of Gen5 x16).
    pub fn degraded_link(mut self, gpu_index: u32) -> Self {
        self.degraded.insert(gpu_index);
        self
    }

    /// Writes the user-space driver libraries a real install has, as small
    /// placeholder files named for `version`:
    /// `usr/lib/<arch>-linux-gnu/lib{cuda,nvidia-ml}.so.<version>` and the
    /// `.so.1` links to them (what `gpuslice doctor` compares with the kernel
    /// driver). Not written by default; the fake driver itself lives in
    /// [`FakeHost::driver_lib_dir`].
    pub fn driver_libs(mut self, version: impl Into<String>) -> Self {
        self.driver_libs = Some(version.into());
        self
    }

    /// The kernel driver's version the host poses as (default
    /// [`kernel::DRIVER_VERSION`], an R580): `615.…` or later gives the fake
    /// driver the per-cgroup memory partitions of NVIDIA R615+
    /// (`nvmlDeviceSetMemoryLimits_v1`).
    pub fn driver_version(mut self, version: impl Into<String>) -> Self {
        self.driver_version = Some(version.into());
        self
    }

    /// Builds at `dir` (created if needed, kept on drop) instead of a
    /// temporary directory.
    pub fn root(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root = Some(dir.into());
        self
    }

    pub fn build(self) -> io::Result<FakeHost> {
        self.validate()?;
        let (root, tmp) = match &self.root {
            Some(dir) => {
                fs::create_dir_all(dir)?;
                (fs::canonicalize(dir)?, None)
            }
            None => {
                let tmp = tempfile::Builder::new().prefix("fakegpu-").tempdir()?;
                // TempDir is 0700; let unprivileged children reach the tree.
                fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755))?;
                (tmp.path().to_path_buf(), Some(tmp))
            }
        };
        let kernel = self.kernel();
        let degraded = self.degraded.clone();
        tree::write_dev(&root, &kernel)?;
        tree::write_proc(&root, &kernel, self.modify_device_files)?;
        tree::write_sys(&root, &kernel, |minor| match degraded.contains(&minor) {
            true => tree::DEGRADED_LINK,
            false => tree::FULL_LINK,
        })?;
        if let Some(version) = &self.driver_libs {
            tree::write_driver_libs(&root, version)?;
        }
        let json = serde_json::to_string_pretty(&kernel).map_err(io::Error::other)?;
        tree::write(&root.join(MARKER_FILE), &json)?;
        // Where each process publishes its device memory (fakegpu-driver's
        // memory.rs), made here: a process of any user, the first on this
        // host included, must be able to publish, as with the real driver.
        let usage = root.join(STATE_DIR).join("usage");
        fs::create_dir_all(&usage)?;
        fs::set_permissions(&usage, fs::Permissions::from_mode(0o1777))?;
        Ok(FakeHost { root, kernel, tmp })
    }

    fn validate(&self) -> io::Result<()> {
        let bad = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        if self.gpus > MAX_GPUS {
            return bad(format!(
                "fakegpu: at most {MAX_GPUS} GPUs, not {}",
                self.gpus
            ));
        }
        for (&gpu, &n) in &self.migs {
            if gpu >= self.gpus || n > kernel::MAX_MIG_INSTANCES {
                return bad(format!(
                    "fakegpu: bad mig({gpu}, {n}) for {} GPUs",
                    self.gpus
                ));
            }
        }
        if let Some(&gpu) = self.degraded.iter().find(|&&g| g >= self.gpus) {
            return bad(format!(
                "fakegpu: degraded_link({gpu}) for {} GPUs",
                self.gpus
            ));
        }
        Ok(())
    }

    /// The kernel truth this configuration describes.
    fn kernel(&self) -> Kernel {
        let n = self.gpus;
        let bus_ids: Vec<String> = (0..n).map(kernel::gpu_bus_id).collect();
        // nvidia-caps minors 1 and 2 are config and monitor; MIG access
        // capabilities are numbered from 3 on, GPU by GPU, gi then ci.
        let mut next_cap = 3;
        let gpus = (0..n)
            .map(|i| {
                let instances = self.migs.get(&i).copied();
                let migs = (1..=instances.unwrap_or(0))
                    .map(|gi| {
                        let mig = KernelMig {
                            gi,
                            ci: 0,
                            uuid: kernel::mig_uuid(i, gi),
                            profile: kernel::MIG_PROFILE.to_string(),
                            memory_bytes: kernel::MIG_MEMORY_BYTES,
                            gi_minor: next_cap,
                            ci_minor: next_cap + 1,
                        };
                        next_cap += 2;
                        mig
                    })
                    .collect();
                KernelGpu {
                    minor: i,
                    uuid: kernel::gpu_uuid(i),
                    pci_bus_id: bus_ids[i as usize].clone(),
                    name: kernel::GPU_NAME.to_string(),
                    memory_bytes: kernel::GPU_MEMORY_BYTES,
                    numa_node: kernel::numa_node(i, n),
                    nvlink_peers: bus_ids
                        .iter()
                        .filter(|b| **b != bus_ids[i as usize])
                        .cloned()
                        .collect(),
                    mig_enabled: instances.is_some(),
                    migs,
                    persistence_mode: self.persistence_mode,
                }
            })
            .collect();
        Kernel {
            driver_version: self
                .driver_version
                .clone()
                .unwrap_or_else(|| kernel::DRIVER_VERSION.to_string()),
            cuda_version: kernel::CUDA_VERSION,
            gpus,
            init_ms_per_gpu: self.init_ms_per_gpu,
            ctx_ms: self.ctx_ms,
            ctx_bytes: self.ctx_bytes,
            module_bytes: self.module_bytes,
        }
    }
}

impl FakeHost {
    pub fn builder() -> FakeHostBuilder {
        FakeHostBuilder::default()
    }

    /// A builder whose host lives at `dir` and is kept after drop.
    pub fn at(dir: impl Into<PathBuf>) -> FakeHostBuilder {
        FakeHostBuilder::default().root(dir)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `root` joined with a relative path such as `dev/nvidia0`.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.root.join(rel)
    }

    /// The kernel truth (what kernel.json says).
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    pub fn gpus(&self) -> &[KernelGpu] {
        &self.kernel.gpus
    }

    /// `<root>/dev/nvidia<minor>`.
    pub fn node_path(&self, minor: u32) -> PathBuf {
        self.path(tree::gpu_node_rel(minor))
    }

    /// Whether `dev/nvidia<minor>` exists (as anything, even a dangling link).
    pub fn node_exists(&self, minor: u32) -> bool {
        self.node_path(minor).symlink_metadata().is_ok()
    }

    /// Removes `dev/nvidia<minor>` (as a private `/dev` would hide it).
    pub fn remove_node(&self, minor: u32) -> io::Result<()> {
        fs::remove_file(self.node_path(minor))
    }

    /// (Re-)creates `dev/nvidia<minor>` as 195:minor, mode 0666.
    pub fn create_node(&self, minor: u32) -> io::Result<()> {
        tree::mknod_char(&self.node_path(minor), tree::NVIDIA_MAJOR, minor, 0o666)
    }

    /// Hot-unplugs GPU `minor`, as the kernel does when a GPU leaves:
    /// its `proc/driver/nvidia/gpus/<bus>` directory and `dev/nvidia<minor>`
    /// node go, and the fake driver (kernel.json) no longer has it.
    /// [`FakeHost::gpus`] still lists it (for [`FakeHost::plug_gpu`]).
    pub fn unplug_gpu(&self, minor: u32) -> io::Result<()> {
        let gpu = self.kernel_gpu(minor)?;
        let mut left = self.kernel.clone();
        left.gpus.retain(|g| g.minor != minor);
        self.write_kernel(&left)?;
        fs::remove_dir_all(self.path(tree::gpu_proc_rel(gpu)))?;
        self.remove_node(minor)
    }

    /// Plugs GPU `minor` back in after [`FakeHost::unplug_gpu`].
    pub fn plug_gpu(&self, minor: u32) -> io::Result<()> {
        let gpu = self.kernel_gpu(minor)?;
        self.create_node(minor)?;
        tree::write_gpu_proc(&self.root, gpu)?;
        let mut now = self.kernel.clone();
        let present = |g: &KernelGpu| g.minor == minor || self.path(tree::gpu_proc_rel(g)).is_dir();
        now.gpus.retain(present);
        self.write_kernel(&now)
    }

    fn kernel_gpu(&self, minor: u32) -> io::Result<&KernelGpu> {
        self.kernel
            .gpus
            .iter()
            .find(|g| g.minor == minor)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("fakegpu: no GPU of minor {minor} on this host"),
                )
            })
    }

    /// Replaces kernel.json atomically: a fake NVML starting meanwhile
    /// reads the old or the new one, never half of one.
    fn write_kernel(&self, kernel: &Kernel) -> io::Result<()> {
        let json = serde_json::to_string_pretty(kernel).map_err(io::Error::other)?;
        let tmp = self.path(format!("{MARKER_FILE}.tmp"));
        tree::write(&tmp, &json)?;
        fs::rename(tmp, self.path(MARKER_FILE))
    }

    /// Rewrites `proc/driver/nvidia/params` with `ModifyDeviceFiles: 0|1`.
    pub fn set_modify_device_files(&self, on: bool) -> io::Result<()> {
        tree::write(
            &self.path("proc/driver/nvidia/params"),
            &tree::params_text(on),
        )
    }

    /// `<root>/.fakegpu/lib`, holding `libcuda.so.1`, `libcuda.so`,
    /// `libnvidia-ml.so.1` and `libnvidia-ml.so`, all links to the built
    /// fake driver. Panics when the driver is not built (see
    /// [`crate::driver_so_path`]).
    pub fn driver_lib_dir(&self) -> PathBuf {
        let so = crate::driver_so_path();
        let dir = self.path(DRIVER_DIR);
        for name in [
            "libcuda.so.1",
            "libcuda.so",
            "libnvidia-ml.so.1",
            "libnvidia-ml.so",
        ] {
            if let Err(e) = tree::relink(&so, &dir.join(name)) {
                panic!(
                    "fakegpu: cannot link {} into {}: {e}",
                    so.display(),
                    dir.display()
                );
            }
        }
        dir
    }

    /// Installs the fake driver in the host, for a person's CUDA programs
    /// (`gpuslice-fakehost --driver`): a copy of the built driver `so` in
    /// [`DRIVER_DIR`] under the names of the real libraries, and the
    /// shared engine file, so that gpuslice (`gpuslice_core::simulation`)
    /// finds both.
    /// Returns the driver's directory.
    pub fn install_driver(&self, so: &Path) -> io::Result<PathBuf> {
        let dir = self.path(DRIVER_DIR);
        fs::create_dir_all(&dir)?;
        let copy = dir.join(crate::DRIVER_SO);
        fs::copy(so, &copy)?;
        for name in [
            "libcuda.so.1",
            "libcuda.so",
            "libnvidia-ml.so.1",
            "libnvidia-ml.so",
        ] {
            tree::relink(Path::new(crate::DRIVER_SO), &dir.join(name))?;
        }
        // Every slice's processes, of any user, queue their work on it.
        let engine = self.path(ENGINE_FILE);
        fs::File::create(&engine)?;
        fs::set_permissions(&engine, fs::Permissions::from_mode(0o666))?;
        Ok(dir)
    }

    /// `<root>/.fakegpu/lib/libnvidia-ml.so.1` (for `gpuslice_cuda_load::open_nvml`).
    pub fn nvml_lib(&self) -> PathBuf {
        self.driver_lib_dir().join("libnvidia-ml.so.1")
    }

    /// The file [`FakeHost::env`] points `FAKEGPU_TRACE` at.
    pub fn trace_path(&self) -> PathBuf {
        self.path(STATE_DIR).join("trace.jsonl")
    }

    /// Every `cuInit` record written so far under this host's env.
    pub fn trace(&self) -> io::Result<Vec<TraceRecord>> {
        trace::read_trace(&self.trace_path())
    }

    /// Injects an XID on GPU `gpu_index` (position in [`FakeHost::gpus`]):
    /// the fake NVML delivers it as a critical-XID event to every event set
    /// open with that GPU registered (one line `<uuid> <xid>` appended to
    /// `.fakegpu/xid`).
    pub fn inject_xid(&self, gpu_index: usize, xid: u64) -> io::Result<()> {
        inject_xid_below(&self.root, &self.gpus()[gpu_index].uuid, xid)
    }

    /// The environment a process needs to run against this host's fake
    /// driver: `FAKEGPU_ROOT`, `FAKEGPU_TRACE`, and `LD_LIBRARY_PATH` with
    /// the driver directory first.
    pub fn env(&self) -> Vec<(String, String)> {
        let lib_dir = self.driver_lib_dir().display().to_string();
        let ld_path = match std::env::var("LD_LIBRARY_PATH") {
            Ok(old) if !old.is_empty() => format!("{lib_dir}:{old}"),
            _ => lib_dir,
        };
        vec![
            ("FAKEGPU_ROOT".into(), self.root.display().to_string()),
            (
                "FAKEGPU_TRACE".into(),
                self.trace_path().display().to_string(),
            ),
            ("LD_LIBRARY_PATH".into(), ld_path),
        ]
    }

    /// A command with [`FakeHost::env`] applied.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.envs(self.env());
        cmd
    }

    /// Keeps the tree on disk after drop; returns its root.
    pub fn keep(mut self) -> PathBuf {
        if let Some(tmp) = self.tmp.take() {
            // Dropping the TempDir would delete it: persist instead.
            let _ = tmp.keep();
        }
        self.root.clone()
    }
}

/// [`FakeHost::inject_xid`] for the fake host at `root` (one made by
/// another process, e.g. `gpuslice-fakehost`), by the GPU's UUID.
pub fn inject_xid_below(root: &Path, uuid: &str, xid: u64) -> io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join(STATE_DIR).join("xid"))?;
    writeln!(f, "{uuid} {xid}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test's host passes its own environment: `run` adds none to it.
    /// Once its driver and engine are installed (`gpuslice-fakehost
    /// --driver`), gpuslice reads the layout as simulated with its driver
    /// and points the slice's programs at it, the driver first.
    #[test]
    fn an_installed_driver_is_where_gpuslice_looks_for_it() {
        use gpuslice_core::simulation::{driver_env, is_simulated};
        let h = FakeHost::builder().gpus(1).build().unwrap();
        assert!(is_simulated(h.root()));
        let old = OsStr::new("/opt/lib");
        assert!(driver_env(h.root(), Some(old)).is_none());
        let so = h.path("built-driver.so");
        fs::write(&so, "a driver").unwrap();
        h.install_driver(&so).unwrap();
        let env = driver_env(h.root(), Some(old)).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get("FAKEGPU_ROOT"), h.root().as_os_str());
        assert_eq!(
            get("LD_LIBRARY_PATH"),
            OsStr::new(&format!("{}:/opt/lib", h.path(DRIVER_DIR).display()))
        );
        assert_eq!(get("FAKEGPU_ENGINE"), h.path(ENGINE_FILE).as_os_str());
        assert_eq!(
            fs::read_to_string(h.path(DRIVER_DIR).join("libcuda.so.1")).unwrap(),
            "a driver"
        );
        // Not a fake host (no kernel truth): nothing, whatever else is there.
        fs::remove_file(h.path(MARKER_FILE)).unwrap();
        assert!(!is_simulated(h.root()));
        assert!(driver_env(h.root(), None).is_none());
    }
}
