//! `run` on behalf of someone: whom the command runs as (`--user`, the
//! sudo caller by default) and, for a caller that is not root, the admin
//! policy (see `gpuslice_policy`). The policy is decided before anything
//! is created, so a refusal leaves nothing behind.

use super::run_args::{IsolationArg, PidMode, RunArgs};
use anyhow::{anyhow, Result};
use gpuslice_core::{HostRoot, Inventory, Selection};
use gpuslice_isolate::identity::Identity;
use gpuslice_policy::{Caller, Member, Policy, Request, ROOT_ONLY_ENV};
use std::path::PathBuf;

/// Who asked, whom for, and the policy that decides it.
pub struct Tenant {
    pub caller: Caller,
    /// Who the command runs as; None: gpuslice's own ids.
    pub identity: Option<Identity>,
    policy: Option<(Policy, PathBuf)>,
}

impl Tenant {
    /// Before discovery (which reads the host root as root): finds the
    /// caller, drops the variables only root may set, resolves `--user`,
    /// and for a bound caller loads the policy and checks the host root.
    pub fn resolve(root: &HostRoot, args: &RunArgs) -> Result<Self> {
        let caller = Caller::detect()?;
        if caller.is_bound() {
            // gpuslice run is single-threaded here: nothing reads the
            // environment concurrently.
            for var in ROOT_ONLY_ENV {
                std::env::remove_var(var);
            }
        }
        let identity = match (&args.user, caller) {
            (Some(spec), _) => Some(Identity::parse(spec)?),
            (None, Caller::User { uid, gid, .. }) => Some(Identity::of_uid(uid, gid)?),
            (None, _) => None,
        };
        let policy = if caller.is_bound() {
            let (policy, path) = Policy::load_for(&caller)?;
            policy
                .check_host_root(root.path())
                .map_err(|r| anyhow!("refused by policy {}: {r}", path.display()))?;
            Some((policy, path))
        } else {
            None
        };
        Ok(Self {
            caller,
            identity,
            policy,
        })
    }

    /// Whether the command runs as someone other than root: then root does
    /// nothing on its behalf that it could not do itself (`--cuda-cache`
    /// is left for the command to create).
    pub fn runs_unprivileged(&self) -> bool {
        self.identity.as_ref().is_some_and(|i| i.uid != 0)
    }

    /// Under `--read-only-root`, or a policy's `read_only_root` for a bound
    /// caller: what stays writable (the policy's `writable`, else `/tmp`,
    /// `/var/tmp`, `/dev/shm`, the working directory and `--cuda-cache`),
    /// canonical, the missing ones left out. None: the root stays as it is.
    pub fn read_only_root(&self, args: &RunArgs) -> Option<Vec<PathBuf>> {
        let policy = self.policy.as_ref().map(|(p, _)| p);
        if !args.read_only_root && !policy.is_some_and(|p| p.read_only_root) {
            return None;
        }
        let listed = match policy.and_then(|p| p.writable.clone()) {
            Some(w) => w,
            None => ["/tmp", "/var/tmp", "/dev/shm"]
                .map(PathBuf::from)
                .into_iter()
                .chain(std::env::current_dir().ok())
                .chain(args.cuda_cache.clone())
                .collect(),
        };
        let mut out: Vec<PathBuf> = listed
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            // A writable `/` (a command started there) is no read-only root.
            .filter(|p| p.is_dir() && p.as_path() != std::path::Path::new("/"))
            .collect();
        out.sort();
        out.dedup();
        Some(out)
    }

    /// A bound caller's request against the policy; Ok for everyone else.
    /// `cdi`: the caps of a `--cdi-device`'s limits record, which stand for
    /// `--memory`/`--compute` (the largest over its devices).
    pub fn enforce(
        &self,
        root: &HostRoot,
        inv: &Inventory,
        sel: &Selection,
        args: &RunArgs,
        cdi: Option<&gpuslice_ledger::limits::SliceLimits>,
    ) -> Result<()> {
        let (Some((policy, path)), Caller::User { uid, gid, .. }) = (&self.policy, self.caller)
        else {
            return Ok(());
        };
        let request = Request {
            host_root: root.path(),
            selection: sel,
            memory: match cdi {
                Some(l) => l.devices.iter().filter_map(|d| d.memory.map(|m| m.0)).max(),
                None => args.memory.map(|m| m.0),
            },
            compute: match cdi {
                Some(l) => l
                    .devices
                    .iter()
                    .filter_map(|d| d.compute.map(|c| c.basis_points()))
                    .max(),
                None => args.compute.map(|c| c.basis_points()),
            },
            run_as: self.identity.as_ref().map_or((0, 0), |i| (i.uid, i.gid)),
            // Anything that gives up a layer of the boundary: --privileged,
            // the host's PID namespace, fewer isolation layers.
            privileged: args.privileged
                || args.pid == PidMode::Host
                || args.isolation.is_some_and(|i| i != IsolationArg::Full),
        };
        let rule = policy
            .check(&member(uid, gid)?, &request, inv)
            .map_err(|r| anyhow!("refused by policy {}: {r}", path.display()))?;
        tracing::info!(policy = %path.display(), %rule, uid, "allowed");
        Ok(())
    }
}

/// The caller as the policy's rules name it: user name, primary and
/// supplementary groups from the user and group databases.
fn member(uid: u32, gid: u32) -> Result<Member> {
    let user = Identity::of_uid(uid, gid)?;
    let mut gids = user.groups.clone();
    gids.push(gid);
    gids.sort_unstable();
    gids.dedup();
    let groups = gids
        .into_iter()
        .map(|g| {
            let name = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(g))
                .ok()
                .flatten()
                .map(|g| g.name);
            (g, name)
        })
        .collect();
    Ok(Member {
        uid,
        name: user.name,
        groups,
    })
}
