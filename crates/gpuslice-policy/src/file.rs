//! The admin policy file: its format, and the only way it is read.
//!
//! ```toml
//! # Host roots a policy-bound caller may name with --host-root ("/" if absent).
//! host_roots = ["/"]
//! # A read-only host root for every bound caller (run --read-only-root), and
//! # what stays writable ("/tmp", "/var/tmp", "/dev/shm" and the cwd if absent).
//! read_only_root = true
//! writable = ["/tmp", "/dev/shm", "/scratch"]
//!
//! [[rule]]
//! name = "ml-team"            # for messages; "rule[N]" if absent
//! users = ["alice", "1001"]   # names or numeric uids
//! groups = ["ml"]             # names or numeric gids (primary or supplementary)
//! gpus = ["0-3", "GPU-8f2e"]  # --gpus selectors; "all" for every GPU
//! max_memory = "20GiB"        # --memory must be given and at most this
//! max_compute = 50            # --compute must be given and at most this (percent)
//! allow_root = false          # --user root (uid or gid 0)
//! allow_privileged = false    # --privileged, --pid host, or an --isolation weaker than full
//! ```
//!
//! and, at the top, `unshimmed_gpu_process = "kill"` (default) or `"flag"`:
//! what root's enforcer does with a GPU process of a capped slice that the
//! shim does not hold; and `root_enforcer = "on"` (default) or `"off"`:
//! whether root's enforcer watches capped slices at all (`off` leaves their
//! memory to the shim and the driver's partitions alone: for measuring the
//! enforcer's cost, never for production). Both are read for root's own
//! runs and by the device and DRA plugins too, where the file exists.
//!
//! The file decides what root does for other users, so it is trusted only
//! when nobody but root can have written it: a regular file owned by root,
//! not group- or world-writable, in directories with the same property
//! (sticky ones such as /tmp aside). A policy-bound caller cannot name
//! another file: `GPUSLICE_POLICY` is honoured only where the real uid is
//! 0 (sudo, root), never in a setuid install, and the file it names must
//! pass the same checks.

use crate::caller::{Caller, Via};
use serde::{Deserialize, Deserializer};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use thiserror::Error;

pub const DEFAULT_PATH: &str = "/etc/gpuslice/policy.toml";
/// Names another policy file (tests; an admin's staging file).
pub const PATH_ENV: &str = "GPUSLICE_POLICY";

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default = "system_root_only")]
    pub host_roots: Vec<PathBuf>,
    /// Every bound caller's command gets a read-only host root (as with
    /// `run --read-only-root`).
    #[serde(default)]
    pub read_only_root: bool,
    /// What stays writable under a read-only root; absent: `/tmp`,
    /// `/var/tmp`, `/dev/shm` and the command's working directory.
    #[serde(default)]
    pub writable: Option<Vec<PathBuf>>,
    #[serde(default, rename = "rule")]
    pub rules: Vec<Rule>,
    /// What root's enforcer does with a GPU process of a capped slice that
    /// the shim does not hold (`gpuslice_ledger::enforcer`): `"kill"`
    /// (the default) or `"flag"`.
    #[serde(default)]
    pub unshimmed_gpu_process: UnshimmedAction,
    /// Whether root's enforcer runs: `"on"` (the default) or `"off"`.
    #[serde(default)]
    pub root_enforcer: RootEnforcer,
}

/// [`Policy::root_enforcer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RootEnforcer {
    #[default]
    On,
    Off,
}

/// [`Policy::unshimmed_gpu_process`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnshimmedAction {
    #[default]
    Kill,
    Flag,
}

impl UnshimmedAction {
    pub fn enforcer(self) -> gpuslice_ledger::enforcer::Unshimmed {
        match self {
            UnshimmedAction::Kill => gpuslice_ledger::enforcer::Unshimmed::Kill,
            UnshimmedAction::Flag => gpuslice_ledger::enforcer::Unshimmed::Flag,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub name: Option<String>,
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub gpus: Vec<String>,
    /// Bytes.
    #[serde(default, deserialize_with = "size")]
    pub max_memory: Option<u64>,
    /// Basis points (percent × 100), as the ledger counts shares.
    #[serde(default, deserialize_with = "percent")]
    pub max_compute: Option<u64>,
    #[serde(default)]
    pub allow_root: bool,
    #[serde(default)]
    pub allow_privileged: bool,
}

/// Why a policy file is not taken as root's alone.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Distrust {
    #[error("not an absolute path")]
    Relative,
    #[error("is a symbolic link")]
    Link,
    #[error("not a regular file")]
    NotRegular,
    #[error("{what} is owned by uid {uid}, not root")]
    NotRoot { what: String, uid: u32 },
    #[error("{what} is group- or world-writable (mode {mode:o})")]
    Writable { what: String, mode: u32 },
}

#[derive(Debug, Error)]
pub enum PolicyError {
    #[error("no policy file {}: only root may run slices through this gpuslice (the admin writes one, see docs/security.md)", path.display())]
    Missing { path: PathBuf },
    #[error("policy {}: {why}; it must be a regular file owned by root and not group- or world-writable, in root-owned directories", path.display())]
    Untrusted { path: PathBuf, why: Distrust },
    #[error("policy {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("policy {}: {field}: {message}", path.display())]
    Invalid {
        path: PathBuf,
        /// Where in the file, as `rule[1].max_memory` (`.` for the top).
        field: String,
        message: String,
    },
}

fn system_root_only() -> Vec<PathBuf> {
    vec![PathBuf::from("/")]
}

fn size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let text = String::deserialize(d)?;
    gpuslice_ledger::parse_size(&text)
        .filter(|&b| b > 0)
        .map(Some)
        .ok_or_else(|| serde::de::Error::custom(format!("{text:?} is not a size (e.g. \"20GiB\")")))
}

fn percent<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let v = f64::deserialize(d)?;
    if v > 0.0 && v <= 100.0 {
        Ok(Some(((v * 100.0).round() as u64).max(1)))
    } else {
        Err(serde::de::Error::custom(format!(
            "{v} is not a percentage in (0, 100]"
        )))
    }
}

impl Policy {
    /// Parses policy text; errors name the field (`rule[0].gpus`).
    pub fn parse(text: &str, path: &Path) -> Result<Self, PolicyError> {
        let invalid = |field: String, message: String| PolicyError::Invalid {
            path: path.to_path_buf(),
            field,
            message,
        };
        let de =
            toml::Deserializer::parse(text).map_err(|e| invalid(".".into(), located(&e, text)))?;
        let policy: Policy = serde_path_to_error::deserialize(de)
            .map_err(|e| invalid(e.path().to_string(), located(e.inner(), text)))?;
        for (i, rule) in policy.rules.iter().enumerate() {
            if rule.users.is_empty() && rule.groups.is_empty() {
                return Err(invalid(
                    format!("rule[{i}]"),
                    "names no users and no groups, so it applies to nobody".into(),
                ));
            }
        }
        Ok(policy)
    }

    /// Loads the policy that decides `caller`'s requests: [`DEFAULT_PATH`],
    /// or `$GPUSLICE_POLICY` where the real uid is root.
    pub fn load_for(caller: &Caller) -> Result<(Self, PathBuf), PolicyError> {
        let path = path_for(caller, std::env::var_os(PATH_ENV).map(PathBuf::from));
        Ok((Self::load(&path)?, path))
    }

    /// Reads `path` if it is trusted (see the module docs).
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = read_trusted(path)?;
        Self::parse(&text, path)
    }

    /// What root's enforcer does (None: the policy turns it off), with a
    /// GPU process of a capped slice that the shim does not hold among it:
    /// the policy file's choice (the file [`Policy::load_for`] reads for
    /// `caller`), the default where there is no file, and the default with
    /// the reason where it cannot be used.
    pub fn enforcer_for(
        caller: &Caller,
    ) -> (Option<gpuslice_ledger::enforcer::Unshimmed>, Option<String>) {
        let default = Some(UnshimmedAction::default().enforcer());
        match Self::load_for(caller) {
            Ok((p, _)) if p.root_enforcer == RootEnforcer::Off => (None, None),
            Ok((p, _)) => (Some(p.unshimmed_gpu_process.enforcer()), None),
            Err(PolicyError::Missing { .. }) => (default, None),
            Err(e) => (default, Some(e.to_string())),
        }
    }

    /// The rule's name for messages.
    pub fn rule_name(&self, i: usize) -> String {
        match &self.rules[i].name {
            Some(n) => format!("rule {n:?}"),
            None => format!("rule[{i}]"),
        }
    }
}

/// The policy file for `caller`: the override only where the real uid is
/// root; a setuid install's user chooses nothing.
fn path_for(caller: &Caller, env: Option<PathBuf>) -> PathBuf {
    let setuid = matches!(
        caller,
        Caller::User {
            via: Via::Setuid,
            ..
        }
    );
    match env.filter(|p| !p.as_os_str().is_empty()) {
        Some(p) if !setuid => p,
        _ => PathBuf::from(DEFAULT_PATH),
    }
}

/// The file's text, if root alone can have written it. The checks are on
/// the opened file (no symlink followed at the last step), so the file
/// checked is the file read.
pub fn read_trusted(path: &Path) -> Result<String, PolicyError> {
    let untrusted = |why: Distrust| PolicyError::Untrusted {
        path: path.to_path_buf(),
        why,
    };
    let io = |source: io::Error| PolicyError::Io {
        path: path.to_path_buf(),
        source,
    };
    if !path.is_absolute() {
        return Err(untrusted(Distrust::Relative));
    }
    let mut file = match File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(PolicyError::Missing {
                path: path.to_path_buf(),
            })
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(untrusted(Distrust::Link)),
        Err(e) => return Err(io(e)),
    };
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(untrusted(Distrust::NotRegular));
    }
    check_owner(&meta, "the file").map_err(untrusted)?;
    for dir in path.ancestors().skip(1) {
        let meta = std::fs::metadata(dir).map_err(io)?;
        check_owner(&meta, &dir.display().to_string()).map_err(untrusted)?;
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(io)?;
    Ok(text)
}

/// Owned by root and writable by nobody else; a directory with the sticky
/// bit (`/tmp`) may be world-writable, since others cannot replace root's
/// entries in it.
fn check_owner(meta: &std::fs::Metadata, what: &str) -> Result<(), Distrust> {
    if meta.uid() != 0 {
        return Err(Distrust::NotRoot {
            what: what.into(),
            uid: meta.uid(),
        });
    }
    let sticky_dir = meta.is_dir() && meta.mode() & libc::S_ISVTX != 0;
    if meta.mode() & 0o022 != 0 && !sticky_dir {
        return Err(Distrust::Writable {
            what: what.into(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

/// `line N: message`, on one line.
fn located(e: &toml::de::Error, text: &str) -> String {
    let message = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("line {line}: {message}")
        }
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn parse(text: &str) -> Result<Policy, PolicyError> {
        Policy::parse(text, Path::new("/p.toml"))
    }

    #[test]
    fn a_full_policy_parses() {
        let p = parse(
            r#"
            host_roots = ["/", "/host"]
            [[rule]]
            name = "ml"
            users = ["alice", "1001"]
            groups = ["ml"]
            gpus = ["0-1", "GPU-abc"]
            max_memory = "20GiB"
            max_compute = 12.5
            allow_root = true
            [[rule]]
            groups = ["students"]
            gpus = ["all"]
            "#,
        )
        .unwrap();
        assert_eq!(p.host_roots, [PathBuf::from("/"), PathBuf::from("/host")]);
        let r = &p.rules[0];
        assert_eq!(r.max_memory, Some(20 << 30));
        assert_eq!(r.max_compute, Some(1250));
        assert!(r.allow_root && !r.allow_privileged);
        assert_eq!(p.rule_name(0), "rule \"ml\"");
        assert_eq!(p.rule_name(1), "rule[1]");
        assert_eq!(p.rules[1].max_memory, None);
        // An empty file: no rules, so nobody is allowed anything.
        let empty = parse("").unwrap();
        assert!(empty.rules.is_empty() && empty.host_roots == [PathBuf::from("/")]);
    }

    #[test]
    fn root_s_enforcer_is_on_unless_the_file_turns_it_off() {
        assert_eq!(parse("").unwrap().root_enforcer, RootEnforcer::On);
        assert_eq!(
            parse("root_enforcer = \"off\"").unwrap().root_enforcer,
            RootEnforcer::Off
        );
        assert_eq!(
            parse("root_enforcer = \"on\"\nunshimmed_gpu_process = \"flag\"")
                .unwrap()
                .unshimmed_gpu_process,
            UnshimmedAction::Flag
        );
        assert!(parse("root_enforcer = \"maybe\"").is_err());
    }

    #[test]
    fn errors_name_the_field() {
        for (text, field, want) in [
            (
                "[[rule]]\nusers = [\"a\"]\nmax_mem = \"1G\"\n",
                "rule[0].max_mem",
                "line 3: unknown field `max_mem`",
            ),
            (
                "[[rule]]\nusers = [\"a\"]\n[[rule]]\nusers = [\"b\"]\nmax_memory = 5\n",
                "rule[1].max_memory",
                "expected a string",
            ),
            (
                "[[rule]]\nusers = [\"a\"]\nmax_memory = \"lots\"\n",
                "rule[0].max_memory",
                "not a size",
            ),
            (
                "[[rule]]\nusers = [\"a\"]\nmax_compute = 150\n",
                "rule[0].max_compute",
                "percentage",
            ),
            (
                "[[rule]]\nusers = \"a\"\n",
                "rule[0].users",
                "expected a sequence",
            ),
            (
                "[[rule]]\ngpus = [\"0\"]\n",
                "rule[0]",
                "no users and no groups",
            ),
            ("hosts = []\n", "hosts", "unknown field `hosts`"),
            ("[[rule]\n", ".", "line 1: unclosed array table"),
        ] {
            match parse(text) {
                Err(PolicyError::Invalid {
                    field: f, message, ..
                }) => {
                    assert_eq!(f, field, "{text:?}: {message}");
                    assert!(message.contains(want), "{text:?}: {message}");
                    assert!(!message.contains('\n'));
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn only_a_file_root_alone_can_write_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let set = |mode| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode));
        set(0o644).unwrap();
        let is_root = nix::unistd::geteuid().is_root();
        assert_eq!(Policy::load(&path).is_ok(), is_root, "root-owned 0644");
        if !is_root {
            return; // the rest needs files owned by root and by others
        }
        set(0o664).unwrap();
        assert!(matches!(
            Policy::load(&path),
            Err(PolicyError::Untrusted { .. })
        ));
        set(0o644).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        let e = Policy::load(&path).unwrap_err().to_string();
        assert!(e.contains("owned by uid 65534"), "{e}");
        std::os::unix::fs::chown(&path, Some(0), None).unwrap();
        // A directory others may write into: they could swap the file.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Policy::load(&path).unwrap_err().to_string();
        assert!(e.contains("world-writable"), "{e}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // A symlink to a trusted file is not followed.
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let e = Policy::load(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(matches!(
            Policy::load(&dir.path().join("none.toml")),
            Err(PolicyError::Missing { .. })
        ));
        assert!(Policy::load(&path).is_ok());
    }

    #[test]
    fn a_setuid_caller_cannot_choose_the_file() {
        let env = Some(PathBuf::from("/home/alice/p.toml"));
        let user = |via| Caller::User {
            uid: 1000,
            gid: 1000,
            via,
        };
        assert_eq!(
            path_for(&user(Via::Setuid), env.clone()),
            Path::new(DEFAULT_PATH)
        );
        assert_eq!(
            path_for(&user(Via::Sudo), env.clone()),
            env.clone().unwrap()
        );
        assert_eq!(path_for(&user(Via::Sudo), None), Path::new(DEFAULT_PATH));
    }
}
