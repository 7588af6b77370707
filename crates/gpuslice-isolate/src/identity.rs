//! Who the slice's command runs as: `run --user USER[:GROUP]`, or the
//! invoking user when gpuslice runs through sudo.
//!
//! Names are resolved in the launcher, before the fork, through the C
//! library's user and group database (NSS: files, LDAP, sssd…): the child
//! must not load NSS modules between fork and exec. The child only calls
//! [`switch`], three system calls.

use nix::unistd::{Gid, Group, Uid, User};
use std::ffi::CString;
use thiserror::Error;

/// A resolved user: what the child becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (from the group database for a named user; none
    /// for a bare numeric id the database does not know).
    pub groups: Vec<u32>,
    /// The user's name and home, when the database knows the uid: the
    /// child gets `USER`, `LOGNAME` and `HOME` from them, as `sudo -u` does.
    pub name: Option<String>,
    pub home: Option<String>,
}

#[derive(Debug, Error)]
pub enum IdentityError {
    #[error("--user {spec:?}: no such user (give a name from the user database or a numeric uid)")]
    NoUser { spec: String },
    #[error(
        "--user {spec:?}: no such group (give a name from the group database or a numeric gid)"
    )]
    NoGroup { spec: String },
    #[error("--user {spec:?}: malformed, expected USER or USER:GROUP (names or numeric ids)")]
    Malformed { spec: String },
    #[error("looking up {what}: {source}")]
    Lookup { what: String, source: nix::Error },
    #[error("{what}: {source}")]
    Switch {
        what: &'static str,
        source: nix::Error,
    },
}

impl Identity {
    /// `USER[:GROUP]`, each a name or a numeric id. A named (or known
    /// numeric) user brings its primary group and its supplementary groups
    /// from the group database; `:GROUP` replaces the primary group (the
    /// supplementary ones stay, as with `docker run --user`).
    pub fn parse(spec: &str) -> Result<Self, IdentityError> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        if user.is_empty() || group.is_some_and(str::is_empty) {
            return Err(IdentityError::Malformed { spec: spec.into() });
        }
        let mut id = match lookup_user(user)? {
            Some(u) => Self::from_user(&u)?,
            None => match user.parse::<u32>() {
                // An id the database does not know (a container's user):
                // its own gid, no supplementary groups.
                Ok(uid) => Self::bare(uid, uid),
                Err(_) => return Err(IdentityError::NoUser { spec: spec.into() }),
            },
        };
        if let Some(group) = group {
            id.gid = resolve_group(group)
                .ok_or_else(|| IdentityError::NoGroup { spec: spec.into() })??;
        }
        Ok(id)
    }

    /// The user with this uid (the sudo caller), with `gid` as primary
    /// group and the database's supplementary groups.
    pub fn of_uid(uid: u32, gid: u32) -> Result<Self, IdentityError> {
        let user = User::from_uid(Uid::from_raw(uid)).map_err(|source| IdentityError::Lookup {
            what: format!("uid {uid}"),
            source,
        })?;
        Ok(match user {
            Some(u) => Self {
                gid,
                ..Self::from_user(&u)?
            },
            None => Self::bare(uid, gid),
        })
    }

    fn from_user(u: &User) -> Result<Self, IdentityError> {
        let name = CString::new(u.name.as_bytes()).map_err(|_| IdentityError::Malformed {
            spec: u.name.clone(),
        })?;
        let groups = nix::unistd::getgrouplist(&name, u.gid)
            .map_err(|source| IdentityError::Lookup {
                what: format!("the groups of {}", u.name),
                source,
            })?
            .into_iter()
            .map(Gid::as_raw)
            .collect();
        Ok(Self {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
            groups,
            name: Some(u.name.clone()),
            home: u.dir.to_str().map(String::from),
        })
    }

    fn bare(uid: u32, gid: u32) -> Self {
        Self {
            uid,
            gid,
            groups: vec![],
            name: None,
            home: None,
        }
    }

    /// Root's uid or gid, given or taken by this identity.
    pub fn is_root(&self) -> bool {
        self.uid == 0 || self.gid == 0
    }

    /// `USER=`, `LOGNAME=`, `HOME=` for the child, as `sudo -u` sets them.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(name) = &self.name {
            env.push(("USER", name.clone()));
            env.push(("LOGNAME", name.clone()));
        }
        if let Some(home) = &self.home {
            env.push(("HOME", home.clone()));
        }
        env
    }
}

fn lookup_user(name: &str) -> Result<Option<User>, IdentityError> {
    let lookup = |r: nix::Result<Option<User>>| {
        r.map_err(|source| IdentityError::Lookup {
            what: format!("user {name:?}"),
            source,
        })
    };
    if let Some(u) = lookup(User::from_name(name))? {
        return Ok(Some(u));
    }
    match name.parse::<u32>() {
        Ok(uid) => lookup(User::from_uid(Uid::from_raw(uid))),
        Err(_) => Ok(None),
    }
}

/// A group name or numeric gid; a numeric gid need not be in the database.
fn resolve_group(spec: &str) -> Option<Result<u32, IdentityError>> {
    match Group::from_name(spec) {
        Ok(Some(g)) => Some(Ok(g.gid.as_raw())),
        Ok(None) => spec.parse::<u32>().ok().map(Ok),
        Err(source) => Some(Err(IdentityError::Lookup {
            what: format!("group {spec:?}"),
            source,
        })),
    }
}

/// Become `id`: supplementary groups, then the group, then the user (the
/// order matters: each needs the privilege the next one gives up). Runs in
/// the launcher's child, after the namespaces and mounts are made (they
/// need root) and before capabilities are dropped and seccomp is loaded
/// (which forbid these calls). A switch to a non-root uid clears the
/// permitted, effective and ambient capability sets (no keep-caps), so
/// nothing of root survives in the command.
pub fn switch(id: &Identity) -> Result<(), IdentityError> {
    let err = |what| move |source| IdentityError::Switch { what, source };
    let groups: Vec<Gid> = id.groups.iter().copied().map(Gid::from_raw).collect();
    nix::unistd::setgroups(&groups).map_err(err("setgroups"))?;
    let gid = Gid::from_raw(id.gid);
    nix::unistd::setresgid(gid, gid, gid).map_err(err("setresgid"))?;
    let uid = Uid::from_raw(id.uid);
    nix::unistd::setresuid(uid, uid, uid).map_err(err("setresuid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_resolve_with_groups() {
        let root = Identity::parse("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0), "{root:?}");
        assert_eq!(root.name.as_deref(), Some("root"));
        assert_eq!(Identity::parse("0").unwrap(), root, "uid 0 is root");
        let nobody = Identity::parse("65534").unwrap();
        assert_eq!(nobody.uid, 65534);
        // An id the database does not know: its own gid, no groups.
        let bare = Identity::parse("4242:4343").unwrap();
        assert_eq!((bare.uid, bare.gid, bare.groups.len()), (4242, 4343, 0));
        assert!(bare.name.is_none() && bare.env().is_empty());
        let with_group = Identity::parse("root:65534").unwrap();
        assert_eq!(with_group.gid, 65534);
        assert!(with_group.is_root());
    }

    #[test]
    fn unknown_or_malformed_specs_say_what_is_wrong() {
        for (spec, want) in [
            ("no-such-user-x", "no such user"),
            ("root:no-such-group-x", "no such group"),
            ("", "malformed"),
            ("root:", "malformed"),
            (":0", "malformed"),
        ] {
            let e = Identity::parse(spec).unwrap_err().to_string();
            assert!(e.contains(want), "{spec:?}: {e}");
        }
    }
}
