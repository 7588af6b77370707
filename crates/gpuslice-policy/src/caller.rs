//! Whose request a `gpuslice` process is serving.

use thiserror::Error;

/// How a non-root user reached a root `gpuslice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `sudo gpuslice …`: real uid 0, the user in `SUDO_UID`/`SUDO_GID`
    /// (sudo sets them itself; a user cannot choose them).
    Sudo,
    /// A setuid-root install: real uid is the user's, effective uid 0.
    Setuid,
}

/// Who is asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Root itself: trusted, no policy applies.
    Root,
    /// A user holding no privilege: gpuslice can do nothing for them they
    /// could not do themselves (the rootless path), so no policy applies.
    Unprivileged,
    /// A user served by a root gpuslice: the policy applies.
    User { uid: u32, gid: u32, via: Via },
}

/// Variables that point a root gpuslice at files it then trusts (the
/// inventory cache, the shim it preloads, the ledger and board
/// directories it writes): honoured from root only. For a policy-bound
/// caller they are removed before anything reads them (sudo's env_reset
/// drops them too, a setuid install passes everything through).
pub const ROOT_ONLY_ENV: &[&str] = &[
    "GPUSLICE_CACHE_DIR",
    "GPUSLICE_SHIM",
    "GPUSLICE_LEDGER_DIR",
    "GPUSLICE_BOARD_DIR",
];

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CallerError {
    #[error("{var}={value:?} is not a numeric id; refusing to guess who called sudo")]
    BadSudoVar { var: &'static str, value: String },
}

impl Caller {
    /// The caller of this process, from its real and effective ids and
    /// sudo's variables.
    pub fn detect() -> Result<Self, CallerError> {
        let uid = nix::unistd::getresuid().map_or_else(
            |_| (nix::unistd::getuid(), nix::unistd::geteuid()),
            |r| (r.real, r.effective),
        );
        let sudo = |v| std::env::var(v).ok();
        Self::from_ids(
            uid.0.as_raw(),
            nix::unistd::getgid().as_raw(),
            uid.1.as_raw(),
            sudo("SUDO_UID").as_deref(),
            sudo("SUDO_GID").as_deref(),
        )
    }

    /// [`Caller::detect`] with its inputs explicit.
    pub fn from_ids(
        ruid: u32,
        rgid: u32,
        euid: u32,
        sudo_uid: Option<&str>,
        sudo_gid: Option<&str>,
    ) -> Result<Self, CallerError> {
        if euid != 0 {
            return Ok(Self::Unprivileged);
        }
        if ruid != 0 {
            return Ok(Self::User {
                uid: ruid,
                gid: rgid,
                via: Via::Setuid,
            });
        }
        let Some(sudo_uid) = sudo_uid.filter(|v| !v.is_empty()) else {
            return Ok(Self::Root);
        };
        let id = |var: &'static str, value: &str| {
            value.parse::<u32>().map_err(|_| CallerError::BadSudoVar {
                var,
                value: value.to_string(),
            })
        };
        let uid = id("SUDO_UID", sudo_uid)?;
        if uid == 0 {
            return Ok(Self::Root); // root ran sudo
        }
        let gid = match sudo_gid.filter(|v| !v.is_empty()) {
            Some(g) => id("SUDO_GID", g)?,
            None => uid,
        };
        Ok(Self::User {
            uid,
            gid,
            via: Via::Sudo,
        })
    }

    /// Whether the admin policy decides this caller's requests.
    pub fn is_bound(&self) -> bool {
        matches!(self, Self::User { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_is_asking() {
        let user = |uid, gid, via| Caller::User { uid, gid, via };
        assert_eq!(Caller::from_ids(0, 0, 0, None, None), Ok(Caller::Root));
        assert_eq!(
            Caller::from_ids(0, 0, 0, Some("1000"), Some("1001")),
            Ok(user(1000, 1001, Via::Sudo))
        );
        assert_eq!(
            Caller::from_ids(0, 0, 0, Some("1000"), None),
            Ok(user(1000, 1000, Via::Sudo))
        );
        assert_eq!(
            Caller::from_ids(0, 0, 0, Some("0"), Some("0")),
            Ok(Caller::Root),
            "root through sudo is root"
        );
        // A setuid install: SUDO_* come from the user and are ignored.
        assert_eq!(
            Caller::from_ids(1000, 100, 0, Some("0"), None),
            Ok(user(1000, 100, Via::Setuid))
        );
        assert_eq!(
            Caller::from_ids(1000, 100, 1000, Some("0"), None),
            Ok(Caller::Unprivileged)
        );
        assert!(Caller::from_ids(0, 0, 0, Some("alice"), None).is_err());
        assert!(user(1, 1, Via::Sudo).is_bound() && !Caller::Root.is_bound());
    }
}
