//! One request against the policy: allowed by some rule naming the
//! caller, or refused with the reason of the first such rule.

use crate::file::{Policy, Rule};
use gpuslice_core::{Inventory, Selection, SelectorError};
use std::path::Path;
use thiserror::Error;

/// The caller as rules name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub uid: u32,
    pub name: Option<String>,
    /// Primary and supplementary groups: `(gid, name)`.
    pub groups: Vec<(u32, Option<String>)>,
}

/// What `gpuslice run` was asked to do.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub host_root: &'a Path,
    pub selection: &'a Selection,
    /// `--memory`, bytes per GPU.
    pub memory: Option<u64>,
    /// `--compute`, basis points.
    pub compute: Option<u64>,
    /// The uid and primary gid the command would run as.
    pub run_as: (u32, u32),
    /// `--privileged`, `--pid host`, or isolation weaker than the default.
    pub privileged: bool,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("--host-root {0}: not in the policy's host_roots")]
    HostRoot(String),
    #[error("--user {uid}:{gid}: a caller under the policy runs commands only as itself (uid {caller}, its own groups) or, where a rule allows, as root")]
    OtherUser { uid: u32, gid: u32, caller: u32 },
    #[error("no rule of the policy names user {0} or one of its groups")]
    NoRule(String),
    #[error("{rule} does not allow {what}{others}")]
    Rule {
        rule: String,
        what: String,
        /// Other rules that named the caller and refused too.
        others: String,
    },
}

impl Policy {
    /// Whether a bound caller may name this host root; checked before
    /// anything under it is read as root.
    pub fn check_host_root(&self, host_root: &Path) -> Result<(), Refusal> {
        if self.host_roots.iter().any(|r| r == host_root) {
            Ok(())
        } else {
            Err(Refusal::HostRoot(host_root.display().to_string()))
        }
    }

    /// Allowed: the name of the rule that allows it.
    pub fn check(&self, who: &Member, req: &Request, inv: &Inventory) -> Result<String, Refusal> {
        self.check_host_root(req.host_root)?;
        let (uid, gid) = req.run_as;
        let own_group = who.groups.iter().any(|(g, _)| *g == gid);
        if (uid != who.uid && uid != 0) || (gid != 0 && !own_group) {
            return Err(Refusal::OtherUser {
                uid,
                gid,
                caller: who.uid,
            });
        }
        let naming: Vec<usize> = (0..self.rules.len())
            .filter(|&i| names(&self.rules[i], who))
            .collect();
        let mut refusals = Vec::new();
        for &i in &naming {
            match refusal(&self.rules[i], req, inv) {
                None => return Ok(self.rule_name(i)),
                Some(what) => refusals.push((i, what)),
            }
        }
        let Some((first, what)) = refusals.first() else {
            return Err(Refusal::NoRule(describe(who)));
        };
        let others = match refusals.len() - 1 {
            0 => String::new(),
            n => format!(" (nor do {n} other rules naming this user)"),
        };
        Err(Refusal::Rule {
            rule: self.rule_name(*first),
            what: what.clone(),
            others,
        })
    }
}

fn describe(who: &Member) -> String {
    match &who.name {
        Some(n) => format!("{n} (uid {})", who.uid),
        None => format!("uid {}", who.uid),
    }
}

/// A rule names the caller by user name or uid, or by one of its groups'
/// names or gids.
fn names(rule: &Rule, who: &Member) -> bool {
    let is = |item: &str, id: u32, name: &Option<String>| {
        item == id.to_string() || name.as_deref() == Some(item)
    };
    rule.users.iter().any(|u| is(u, who.uid, &who.name))
        || rule
            .groups
            .iter()
            .any(|g| who.groups.iter().any(|(gid, name)| is(g, *gid, name)))
}

/// Why `rule` does not allow `req`; None when it does.
fn refusal(rule: &Rule, req: &Request, inv: &Inventory) -> Option<String> {
    if req.privileged && !rule.allow_privileged {
        return Some(
            "--privileged, --pid host or a weaker --isolation (allow_privileged = false)".into(),
        );
    }
    if (req.run_as.0 == 0 || req.run_as.1 == 0) && !rule.allow_root {
        return Some("running as root (allow_root = false)".into());
    }
    match granted(rule, inv) {
        Err(e) => return Some(format!("anything: its gpus list is invalid here: {e}")),
        Ok(g) => {
            let whole = req.selection.gpus.iter().find(|i| !g.gpus.contains(i));
            let mig = req
                .selection
                .migs
                .iter()
                .find(|m| !g.gpus.contains(&m.0) && !g.migs.contains(m));
            if let Some(i) = whole {
                return Some(format!("GPU {i} (gpus = {:?})", rule.gpus));
            }
            if let Some((gpu, mig)) = mig {
                return Some(format!("MIG device {gpu}:{mig} (gpus = {:?})", rule.gpus));
            }
        }
    }
    if let Some(max) = rule.max_memory {
        match req.memory {
            None => {
                return Some(format!(
                    "a run without --memory (max_memory = {max} bytes: add --memory at most that)"
                ))
            }
            Some(m) if m > max => {
                return Some(format!("--memory {m} bytes (max_memory = {max} bytes)"))
            }
            _ => {}
        }
    }
    if let Some(max) = rule.max_compute {
        let pct = |bp: u64| bp as f64 / 100.0;
        match req.compute {
            None => {
                return Some(format!(
                    "a run without --compute (max_compute = {}: add --compute at most that)",
                    pct(max)
                ))
            }
            Some(c) if c > max => {
                return Some(format!("--compute {} (max_compute = {})", pct(c), pct(max)))
            }
            _ => {}
        }
    }
    None
}

/// The GPUs and MIG devices a rule grants on this host. A selector that
/// matches nothing here (a GPU another host of the fleet has) grants
/// nothing; a malformed or ambiguous one is an error: fail closed.
fn granted(rule: &Rule, inv: &Inventory) -> Result<Selection, SelectorError> {
    let mut out = Selection::default();
    for item in &rule.gpus {
        match Selection::parse(item, inv) {
            Ok(s) => {
                out.gpus.extend(s.gpus);
                out.migs.extend(s.migs);
            }
            Err(SelectorError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_core::{Gpu, MigDevice};

    fn inv() -> Inventory {
        let gpu = |i: u32| Gpu {
            index: i,
            minor: i,
            uuid: format!("GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd"),
            ..Default::default()
        };
        let mut g0 = gpu(0);
        g0.migs = vec![MigDevice {
            index: 0,
            ..Default::default()
        }];
        Inventory {
            gpus: vec![g0, gpu(1), gpu(2), gpu(3)],
            ..Default::default()
        }
    }

    fn policy() -> Policy {
        Policy::parse(
            r#"
            [[rule]]
            name = "ml"
            groups = ["ml"]
            gpus = ["0-1", "GPU-00000003"]
            max_memory = "8GiB"
            [[rule]]
            name = "ops"
            users = ["bob"]
            gpus = ["all"]
            allow_root = true
            allow_privileged = true
            [[rule]]
            name = "elsewhere"
            users = ["carol"]
            gpus = ["GPU-ffff", "0:0"]
            max_compute = 25
            "#,
            Path::new("/p"),
        )
        .unwrap()
    }

    fn member(uid: u32, name: &str, groups: &[(u32, &str)]) -> Member {
        Member {
            uid,
            name: Some(name.into()),
            groups: groups
                .iter()
                .map(|(g, n)| (*g, Some(n.to_string())))
                .collect(),
        }
    }

    fn req<'a>(sel: &'a Selection, uid: u32) -> Request<'a> {
        Request {
            host_root: Path::new("/"),
            selection: sel,
            memory: None,
            compute: None,
            run_as: (uid, uid),
            privileged: false,
        }
    }

    #[test]
    fn selections_and_caps() {
        let (p, inv) = (policy(), inv());
        let alice = member(1000, "alice", &[(1000, "alice"), (50, "ml")]);
        let sel = Selection::gpus([1, 3]);
        let mut r = req(&sel, 1000);
        let e = p.check(&alice, &r, &inv).unwrap_err().to_string();
        assert_eq!(e, "rule \"ml\" does not allow a run without --memory (max_memory = 8589934592 bytes: add --memory at most that)");
        r.memory = Some(9 << 30);
        assert!(p
            .check(&alice, &r, &inv)
            .unwrap_err()
            .to_string()
            .contains("max_memory"));
        r.memory = Some(8 << 30);
        assert_eq!(p.check(&alice, &r, &inv), Ok("rule \"ml\"".into()));
        let two = Selection::gpus([2]);
        let r2 = Request {
            selection: &two,
            ..r.clone()
        };
        let e = p.check(&alice, &r2, &inv).unwrap_err().to_string();
        assert!(e.contains("GPU 2"), "{e}");
        // A MIG device of a granted GPU is granted.
        let mig = Selection {
            gpus: vec![],
            migs: vec![(0, 0)],
        };
        assert!(p
            .check(
                &alice,
                &Request {
                    selection: &mig,
                    ..r.clone()
                },
                &inv
            )
            .is_ok());
        // `none` needs no GPU.
        let none = Selection::default();
        assert!(p
            .check(
                &alice,
                &Request {
                    selection: &none,
                    ..r.clone()
                },
                &inv
            )
            .is_ok());
    }

    #[test]
    fn users_root_privileged_and_host_roots() {
        let (p, inv) = (policy(), inv());
        let alice = member(1000, "alice", &[(1000, "alice"), (50, "ml")]);
        let bob = member(1001, "bob", &[(1001, "bob")]);
        let sel = Selection::gpus([0]);
        let mut r = req(&sel, 1000);
        r.memory = Some(1 << 30);
        r.run_as = (0, 0);
        assert!(p
            .check(&alice, &r, &inv)
            .unwrap_err()
            .to_string()
            .contains("allow_root"));
        r.run_as = (1001, 1001);
        assert!(matches!(
            p.check(&alice, &r, &inv),
            Err(Refusal::OtherUser { .. })
        ));
        r.run_as = (1000, 50);
        assert!(
            p.check(&alice, &r, &inv).is_ok(),
            "its own supplementary group"
        );
        r.privileged = true;
        assert!(p
            .check(&alice, &r, &inv)
            .unwrap_err()
            .to_string()
            .contains("allow_privileged"));
        let mut rb = req(&sel, 0);
        rb.privileged = true;
        assert_eq!(p.check(&bob, &rb, &inv), Ok("rule \"ops\"".into()));
        let host = Path::new("/host");
        rb.host_root = host;
        assert!(matches!(
            p.check(&bob, &rb, &inv),
            Err(Refusal::HostRoot(_))
        ));
        let eve = member(1002, "eve", &[(1002, "eve")]);
        assert_eq!(
            p.check(&eve, &req(&sel, 1002), &inv)
                .unwrap_err()
                .to_string(),
            "no rule of the policy names user eve (uid 1002) or one of its groups"
        );
        // By numeric uid.
        let by_id = Policy::parse(
            "[[rule]]\nusers = [\"1002\"]\ngpus = [\"0\"]\n",
            Path::new("/p"),
        )
        .unwrap();
        assert!(by_id.check(&eve, &req(&sel, 1002), &inv).is_ok());
    }

    #[test]
    fn gpus_of_other_hosts_grant_nothing_and_caps_need_flags() {
        let (p, inv) = (policy(), inv());
        let carol = member(1003, "carol", &[(1003, "carol")]);
        let mig = Selection {
            gpus: vec![],
            migs: vec![(0, 0)],
        };
        let refusal = |r: &Request| p.check(&carol, r, &inv).unwrap_err().to_string();
        let mut r = req(&mig, 1003);
        assert!(refusal(&r).contains("--compute"));
        r.compute = Some(2600);
        assert!(refusal(&r).contains("max_compute = 25"));
        r.compute = Some(2500);
        assert!(p.check(&carol, &r, &inv).is_ok());
        let whole = Selection::gpus([0]);
        let e = refusal(&Request {
            selection: &whole,
            ..r
        });
        assert!(e.contains("GPU 0"), "{e}");
    }
}
