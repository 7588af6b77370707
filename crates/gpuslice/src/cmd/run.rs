//! `gpuslice run`: a command that can reach only the selected GPUs.

use super::run_args::{CgroupVersion, IsolationArg, PidMode, RunArgs};
use super::tenant::Tenant;
use crate::global::Global;
use anyhow::{anyhow, bail, Context, Result};
use gpuslice_core::discover::cache::discover_cached;
use gpuslice_core::discover::DiscoverOptions;
use gpuslice_core::{DevicePolicy, HostRoot, Inventory, Selection};
use gpuslice_isolate::cgroup::{new_slice_id, CgroupDriver, Version};
use gpuslice_isolate::devfs::NodeMode;
use gpuslice_isolate::driver_proc::params_without_modify;
use gpuslice_isolate::launcher::{launch, launch_watched, ChildCommand, SandboxPlan, SignalGuard};
use gpuslice_isolate::marks::mark;
use gpuslice_isolate::privileges::Privileges;
use gpuslice_isolate::Isolation;
use gpuslice_ledger::limits::{device_env, SliceLimits, DEVICE_ENV};
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether this binary is linked statically, as `scripts/install.sh`
/// builds the `gpuslice` launcher: no loader work at each start
/// (bench/README.md). A static glibc cannot load the user and
/// group databases' modules (NSS) or NVML, so a static launcher carries
/// only what needs neither ([`carried_here`]) and hands the rest to
/// `gpuslice-full`. Set by `main` (this library is compiled without the
/// binary's `crt-static`, so it cannot tell by itself).
static STATIC: AtomicBool = AtomicBool::new(false);

/// Tells the library that this process is the statically linked launcher.
pub fn set_linked_statically() {
    STATIC.store(true, Ordering::Relaxed);
}

/// See [`STATIC`].
pub fn linked_statically() -> bool {
    STATIC.load(Ordering::Relaxed)
}

/// Whether this binary can carry the launch `args` asks for: any launch
/// when it is linked dynamically; when static, root running the command
/// as root (no `--user`, no sudo or setuid caller to look up, no policy
/// to match against group names) on GPUs that NVML need not name, without
/// limits (a capped slice's enforcer reads NVML).
pub fn carried_here(args: &RunArgs) -> bool {
    !linked_statically()
        || (args.user.is_none()
            // Root's enforcer reads the driver's accounting through NVML.
            && args.memory.is_none()
            && args.compute.is_none()
            && matches!(
                gpuslice_policy::Caller::detect(),
                Ok(gpuslice_policy::Caller::Root)
            )
            && !names_mig(args.selector()))
}

fn names_mig(selector: &str) -> bool {
    selector.to_ascii_lowercase().contains("mig-")
}

/// A static launcher found MIG devices, whose UUIDs only NVML knows: the
/// launch goes to `gpuslice-full` (nothing was created yet).
#[derive(Debug, thiserror::Error)]
#[error("MIG devices need NVML, which a statically linked gpuslice cannot load")]
pub struct NeedsFullBinary;

pub fn run(global: &Global, args: &RunArgs) -> Result<i32> {
    run_with(global, args, None)
}

/// [`run`], with the edits of `--cdi-device` resolved by `gpuslice-full`
/// (`super::cdi_run`): they select the GPUs, add binds and variables,
/// and may bring the slice's limits record and shim.
pub fn run_with(global: &Global, args: &RunArgs, cdi: Option<CdiEdits>) -> Result<i32> {
    // Before anything opens a descriptor that could fill a gap among them.
    gpuslice_isolate::fds::check_preserved(args.preserve_fds)?;
    // Before discovery, which may load NVML and with it threads.
    let signals = SignalGuard::block()?;
    let root = HostRoot::new(&global.host_root);
    let tenant = Tenant::resolve(&root, args)?;
    let started = std::time::Instant::now();
    let inv = discover_for_run(&root, args.selector())?;
    tracing::debug!(elapsed_us = started.elapsed().as_micros() as u64, sources = ?inv.sources, "discovered");
    mark("discovered");
    let sel = match &cdi {
        Some(c) => c.selection(&inv)?,
        None => Selection::parse(args.selector(), &inv)?,
    };
    let cdi_limits = match &cdi {
        Some(c) => c.limits(&inv, &sel)?,
        None => None,
    };
    tenant.enforce(&root, &inv, &sel, args, cdi_limits.as_ref())?;
    if args.privileged {
        eprintln!(
            "gpuslice: WARNING: --privileged: the command runs as full root (every capability, \
             no seccomp filter, no PID or cgroup namespace, writable /sys); it can undo the GPU \
             isolation and reach other slices. This is NOT a security boundary."
        );
    }
    let isolation = isolation(args.isolation);
    let rootless = !nix::unistd::geteuid().is_root();
    let mut plan = plan(&root, &inv, &sel, isolation, args, rootless)?;
    plan.identity = tenant.identity.clone();
    let slice_id = new_slice_id();
    tracing::info!(
        slice = slice_id,
        gpus = %sel.visible_devices(&inv),
        private_dev = plan.private_dev.is_some(),
        user_namespace = plan.user_namespace,
        params_overlay = plan.params_overlay.is_some(),
        masked = plan.masked_gpus.len(),
        cgroup = ?plan.cgroup,
        privileges = ?plan.privileges,
        pid_namespace = plan.pid_namespace,
        uid = plan.identity.as_ref().map(|i| i.uid),
        "isolation layers"
    );
    mark("planned");
    let mut env = child_env(&inv, &sel, &slice_id, args, &tenant, &global.host_root)?;
    // After child_env, which makes --cuda-cache's directory. A non-root
    // caller's command cannot write root's files anyway.
    if plan.privileges.confined() && !rootless {
        plan.read_only_root = tenant.read_only_root(args);
    }
    if let Some(c) = &cdi {
        plan.binds = c.binds.clone();
        apply_env(&mut env, &c.env)?;
    }
    let cmd = ChildCommand {
        argv: args
            .command
            .iter()
            .map(|a| cstring(a))
            .collect::<Result<_>>()?,
        env,
    };
    let limits = match cdi_limits {
        Some(l) => Some(l),
        None if args.memory.is_some() || args.compute.is_some() => {
            Some(super::slice_setup::limits_of(&inv, &sel, &slice_id, args)?)
        }
        None => None,
    };
    let Some(mut limits) = limits else {
        return Ok(launch(&signals, &plan, &slice_id, &cmd)?);
    };
    limits.slice_id = slice_id.clone();
    // Memory cap / compute share: the slice's records, written by root
    // and mounted at the slice's fixed place, with the shim preloaded.
    let mut cmd = cmd;
    let shim = cdi.as_ref().and_then(|c| c.shim.as_deref());
    let (records, mut files) = super::slice_setup::set_up(&limits, rootless, &mut cmd.env, shim)?;
    // A CDI device's own record is what the slice sees, as a runtime
    // would bind it (the launcher's copy, same content, is for `slices`).
    // Its directory (the spec's, with every claim's record) is masked
    // like the ledgers': root in the slice owns those files.
    if let (Some(f), Some(record)) = (files.as_mut(), cdi.as_ref().and_then(|c| c.record.clone())) {
        if let Some(dir) = record.parent() {
            f.masked.push(dir.to_path_buf());
        }
        f.limits = record;
    }
    plan.slice_files = files;
    // Root's enforcer and the driver's memory partitions, on
    // the launcher's thread; NVML is opened before the fork (the launcher
    // starts no thread once the PID namespace is pending).
    let result = if rootless {
        launch(&signals, &plan, &slice_id, &cmd)
    } else {
        let gpus: Vec<String> = inv.gpus.iter().map(|g| g.uuid.clone()).collect();
        let nvml = super::enforce::simulated_nvml(&global.host_root);
        let mut hooks = super::enforce::RunHooks::new(&limits, records.records(), gpus, nvml);
        launch_watched(&signals, &plan, &slice_id, &cmd, Some(&mut hooks))
    };
    drop(records);
    Ok(result?)
}

/// What a CDI device asks of the slice, resolved from its spec.
#[derive(Debug, Clone, Default)]
pub struct CdiEdits {
    /// The devices, as named on the command line (for messages).
    pub devices: Vec<String>,
    /// `(major, minor, path)` of every device node the edits name.
    pub nodes: Vec<(u32, u32, String)>,
    /// `KEY=VALUE`, in the order the runtime applies them.
    pub env: Vec<String>,
    pub binds: Vec<gpuslice_isolate::slicefs::Bind>,
    /// Host path of the root-written limits record bound at the slice's fixed place.
    pub record: Option<PathBuf>,
    /// Host path of the shim the spec mounts.
    pub shim: Option<PathBuf>,
}

impl CdiEdits {
    /// The GPUs and MIG devices whose nodes the edits name: each
    /// `/dev/nvidia<minor>` a GPU, unless the MIG access caps of some of
    /// its MIG devices are named too (then those MIG devices). Any other
    /// node is refused: `gpuslice run` exposes GPU nodes only.
    pub fn selection(&self, inv: &Inventory) -> Result<Selection> {
        use gpuslice_core::model::{
            DRM_MAJOR, NVIDIACTL_MINOR, NVIDIA_MAJOR, NVIDIA_MODESET_MINOR,
        };
        let who = self.devices.join(", ");
        let mut gpus = Vec::new();
        let mut caps = Vec::new();
        for (major, minor, path) in &self.nodes {
            let (major, minor) = (*major, *minor);
            if major == NVIDIA_MAJOR {
                if minor == NVIDIACTL_MINOR || minor == NVIDIA_MODESET_MINOR {
                    continue;
                }
                let gpu = inv.gpu_by_minor(minor).ok_or_else(|| {
                    anyhow!("CDI device {who}: {path} ({major}:{minor}) is no GPU of this host (gpuslice list shows them): regenerate the spec")
                })?;
                gpus.push(gpu.index);
            } else if Some(major) == inv.majors.nvidia_uvm || major == DRM_MAJOR {
                continue; // checked against the selection's policy below
            } else if Some(major) == inv.majors.nvidia_caps {
                caps.push(minor);
            } else {
                bail!("CDI device {who}: {path} ({major}:{minor}) is not an NVIDIA GPU node; gpuslice run exposes GPU nodes only (use a container runtime for other devices)");
            }
        }
        gpus.sort_unstable();
        gpus.dedup();
        if gpus.is_empty() {
            bail!("CDI device {who}: its edits name no GPU node (/dev/nvidia<N>); name a GPU's device");
        }
        let mut sel = Selection::default();
        for g in inv.gpus.iter().filter(|g| gpus.contains(&g.index)) {
            let migs: Vec<u32> = g
                .migs
                .iter()
                .filter(|m| {
                    m.gi_access_minor.is_some_and(|c| caps.contains(&c))
                        && m.ci_access_minor.is_some_and(|c| caps.contains(&c))
                })
                .map(|m| m.index)
                .collect();
            if migs.is_empty() {
                sel.gpus.push(g.index);
            } else {
                sel.migs.extend(migs.into_iter().map(|m| (g.index, m)));
            }
        }
        // The private /dev and the device cgroup allow the selection's
        // nodes: each node the spec names must be one of them.
        let policy = DevicePolicy::for_selection(inv, &sel);
        for (major, minor, path) in &self.nodes {
            if !policy.allows_char(*major, *minor) {
                bail!("CDI device {who}: {path} ({major}:{minor}) does not belong to the GPUs it selects; regenerate the spec");
            }
        }
        Ok(sel)
    }

    /// The limits record's caps, for the GPUs selected: each device it
    /// names must be one of them.
    fn limits(&self, inv: &Inventory, sel: &Selection) -> Result<Option<SliceLimits>> {
        let Some(record) = &self.record else {
            return Ok(None);
        };
        let who = self.devices.join(", ");
        if self.shim.is_none() {
            bail!(
                "CDI device {who}: it binds a limits record but no shim at {}; regenerate the spec",
                gpuslice_cdi::CONTAINER_SHIM
            );
        }
        let limits = gpuslice_ledger::limits::verify_and_read(record, false)
            .map_err(|e| anyhow!("CDI device {who}: its limits record: {e}"))?;
        let visible = sel.visible_devices(inv);
        for d in &limits.devices {
            if !visible.split(',').any(|u| u == d.uuid) {
                bail!(
                    "CDI device {who}: its limits record {} caps {}, which its device nodes do not select ({visible}); regenerate the spec",
                    record.display(),
                    d.uuid
                );
            }
        }
        Ok(Some(limits))
    }
}

/// Sets `KEY=VALUE`s over the command's environment, replacing a
/// variable of the same name (a runtime's order: the spec's last).
fn apply_env(env: &mut Vec<CString>, vars: &[String]) -> Result<()> {
    for kv in vars {
        let key = kv.split('=').next().unwrap_or_default();
        let prefix = format!("{key}=");
        env.retain(|e| !e.as_bytes().starts_with(prefix.as_bytes()));
        env.push(CString::new(kv.as_bytes()).map_err(|_| anyhow!("NUL byte in CDI env {kv:?}"))?);
    }
    Ok(())
}

/// NVML costs ~10 ms to initialise on a real GPU and the driver's procfs
/// files another ~8 ms to read (measured on the H200), more than the rest
/// of a launch; so discovery is cached (see `discover::cache`), and NVML,
/// needed only for MIG UUIDs, joins only when procfs shows MIG instances or
/// the selector names one.
fn discover_for_run(root: &HostRoot, selector: &str) -> Result<Inventory> {
    let procfs_only = DiscoverOptions {
        use_nvml: false,
        pci_details: false,
        ..DiscoverOptions::default()
    };
    let (inv, cached) = discover_cached(root, &procfs_only)?;
    tracing::debug!(cached, "inventory");
    let mig = names_mig(selector) || inv.gpus.iter().any(|g| !g.migs.is_empty());
    if !mig {
        return Ok(inv);
    }
    if linked_statically() {
        return Err(NeedsFullBinary.into());
    }
    let with_nvml = DiscoverOptions {
        use_nvml: true,
        ..procfs_only
    };
    Ok(discover_cached(root, &with_nvml)?.0)
}

fn isolation(arg: Option<IsolationArg>) -> Isolation {
    match arg.unwrap_or(IsolationArg::Full) {
        IsolationArg::Full => Isolation::Full,
        IsolationArg::Cgroup => Isolation::Cgroup,
        IsolationArg::Namespace => Isolation::Namespace,
        IsolationArg::Env => Isolation::Env,
    }
}

fn plan(
    root: &HostRoot,
    inv: &Inventory,
    sel: &Selection,
    isolation: Isolation,
    args: &RunArgs,
    rootless: bool,
) -> Result<SandboxPlan> {
    let policy = DevicePolicy::for_selection(inv, sel);
    // The mount-namespace layers hide nodes: when the selection leaves no
    // node of this host out (every GPU, no MIG left over), they would hide
    // nothing, and are left out. The device cgroup stays: it also refuses
    // GPU nodes that appear later. A confined command still gets a mount
    // namespace, for its /proc and a read-only /sys (SandboxPlan).
    let hides = !policy.denies_nothing_known();
    let isolation = if hides {
        isolation
    } else {
        isolation.without_namespace()
    };
    let params_overlay = if isolation.driver_proc() {
        // Read as root and shown to the slice: never through a link.
        match root.read_beneath("proc/driver/nvidia/params") {
            Ok(p) => Some(params_without_modify(&p)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(anyhow!("cannot read the driver's params: {e}")),
        }
    } else {
        None
    };
    let masked_gpus = if isolation.driver_proc() {
        let reached = |i: u32| sel.gpus.contains(&i) || sel.migs.iter().any(|(g, _)| *g == i);
        inv.gpus
            .iter()
            .filter(|g| !reached(g.index))
            .map(|g| g.pci_bus_id.clone())
            .collect()
    } else {
        vec![]
    };
    let cgroup = if isolation.cgroup() {
        cgroup_driver(args.cgroup, rootless)?
    } else {
        None
    };
    let privileges = match (args.privileged, args.strict) {
        (true, _) => Privileges::Privileged,
        (false, true) => Privileges::Strict,
        (false, false) => Privileges::Default,
    };
    let pid_namespace = privileges.confined() && args.pid == PidMode::Private;
    // What every slice loads, read-only in this one (root's launches: a
    // non-root caller's command owns none of it).
    let protected = if privileges.confined() && !rootless {
        gpuslice_isolate::loaded::prepare_host().map_err(|e| {
            anyhow!(
                "cannot create {}: {e}",
                gpuslice_isolate::slicefs::LD_SO_PRELOAD
            )
        })?;
        gpuslice_isolate::loaded::protected_paths(root.path(), &own_files())
    } else {
        vec![]
    };
    let user_namespace =
        rootless && (isolation.private_dev() || params_overlay.is_some() || privileges.confined());
    Ok(SandboxPlan {
        root: root.clone(),
        policy,
        private_dev: isolation.private_dev().then_some(if rootless {
            NodeMode::Bind
        } else {
            NodeMode::Whiteout
        }),
        user_namespace,
        params_overlay,
        masked_gpus,
        cgroup,
        privileges,
        // Unshared by the launcher, which needs root for it; a non-root
        // caller's command shares the host's (docs/security.md).
        pid_namespace: pid_namespace && !rootless,
        preserve_fds: args.preserve_fds,
        identity: None,
        slice_files: None,
        binds: Vec::new(),
        protected,
        read_only_root: None,
    })
}

/// gpuslice's own files every slice loads or runs: the binaries beside
/// this one, the shim there and `GPUSLICE_SHIM`'s.
fn own_files() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::env::current_exe()
        .map(|exe| {
            [
                "gpuslice",
                "gpuslice-full",
                crate::shim::FILE,
                crate::shim::BUILD_FILE,
            ]
            .iter()
            .map(|f| exe.with_file_name(f))
            .collect()
        })
        .unwrap_or_default();
    out.extend(crate::shim::find().ok());
    out
}

/// Root must get the device cgroup it asked for; a non-root caller gets it
/// only where a cgroup was delegated to it, and is told otherwise.
fn cgroup_driver(pref: Option<CgroupVersion>, rootless: bool) -> Result<Option<CgroupDriver>> {
    let pref = pref.map(|v| match v {
        CgroupVersion::V1 => Version::V1,
        CgroupVersion::V2 => Version::V2,
    });
    match CgroupDriver::detect(pref) {
        Ok(d) if !rootless || writable(&d) => Ok(Some(d)),
        Ok(_) => {
            tracing::warn!(
                "no writable cgroup delegated to this user: the device cgroup layer is off"
            );
            Ok(None)
        }
        Err(e) if rootless => {
            tracing::warn!("device cgroup layer is off: {e}");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether this (non-root) user may make slice cgroups there.
fn writable(d: &CgroupDriver) -> bool {
    let dir = if d.slices_dir().exists() {
        d.slices_dir()
    } else {
        d.root().to_path_buf()
    };
    nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

fn child_env(
    inv: &Inventory,
    sel: &Selection,
    slice_id: &str,
    args: &RunArgs,
    tenant: &Tenant,
    host_root: &Path,
) -> Result<Vec<CString>> {
    // The slice's device variables replace the caller's.
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| !DEVICE_ENV.iter().any(|s| OsStr::new(s) == k))
        .collect();
    let visible = sel.visible_devices(inv);
    for (k, v) in device_env(&visible, slice_id) {
        env.push((k.into(), v.into()));
    }
    // A simulated host with its fake driver installed (`gpuslice-fakehost
    // --driver`): the command's CUDA programs load that driver, as they
    // load the real one from the system's library path on a real host.
    // Not when the caller already names a fake host (the tests do).
    if !env.iter().any(|(k, _)| k == "FAKEGPU_ROOT") {
        let old_ld = env
            .iter()
            .find(|(k, _)| k == "LD_LIBRARY_PATH")
            .map(|(_, v)| v.clone());
        if let Some(sim) = gpuslice_core::simulation::driver_env(host_root, old_ld.as_deref()) {
            for (k, v) in sim {
                env.retain(|(name, _)| name != k);
                env.push((k.into(), v));
            }
        }
    }
    if let Some(id) = &tenant.identity {
        for (k, v) in id.env() {
            env.retain(|(name, _)| name != k);
            env.push((k.into(), v.into()));
        }
    }
    if let Some(dir) = &args.cuda_cache {
        if !tenant.runs_unprivileged() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create --cuda-cache {}", dir.display()))?;
        }
        env.retain(|(k, _)| k != "CUDA_CACHE_PATH" && k != "CUDA_CACHE_MAXSIZE");
        env.push(("CUDA_CACHE_PATH".into(), dir.into()));
        // The driver's maximum: a shared cache should not evict itself.
        env.push(("CUDA_CACHE_MAXSIZE".into(), "4294967296".into()));
    }
    env.into_iter()
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            cstring(&kv)
        })
        .collect()
}

fn cstring(s: &OsStr) -> Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| anyhow!("argument or variable contains a NUL byte: {s:?}"))
}
