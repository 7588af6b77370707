//! Who may run slices through a root gpuslice: the admin policy file
//! (`/etc/gpuslice/policy.toml`, read below the host root) and a sudo rule
//! for gpuslice in `/etc/sudoers.d/`, if there is one.
//!
//! A sudo rule is read line by line for commands naming gpuslice; sudoers
//! has more syntax (aliases, includes) than this follows, so a rule this
//! does not understand is reported as found, not judged.

use crate::{Check, Context};
use gpuslice_core::{Selection, SelectorError};
use gpuslice_policy::file::DEFAULT_PATH;
use gpuslice_policy::{Policy, PolicyError};
use std::fs;
use std::path::PathBuf;

pub fn checks(ctx: &Context) -> Vec<Check> {
    let path = ctx.root.join(DEFAULT_PATH);
    let policy = Policy::load(&path);
    let sudo = sudo_rules(ctx);
    vec![policy_file(ctx, &path, &policy), sudo_rule(&sudo, &policy)]
}

fn policy_file(
    ctx: &Context,
    path: &std::path::Path,
    policy: &Result<Policy, PolicyError>,
) -> Check {
    const NAME: &str = "policy.file";
    match policy {
        Err(PolicyError::Missing { .. }) => Check::pass(
            NAME,
            format!(
                "no {}: only root may run slices; sudo and setuid callers are refused",
                path.display()
            ),
        ),
        Err(e @ (PolicyError::Untrusted { .. } | PolicyError::Io { .. })) => Check::fail(
            NAME,
            e.to_string(),
            format!("chown root:root {p} && chmod 644 {p} (and its directories 755, root's)", p = path.display()),
        ),
        Err(e @ PolicyError::Invalid { .. }) => Check::fail(
            NAME,
            e.to_string(),
            "fix the field named (see docs/security.md for the format); until then every non-root run is refused",
        ),
        Ok(p) => gpus_here(ctx, path, p),
    }
}

/// Each rule's `gpus` items against this host: a malformed one refuses
/// every request of its rule; one that matches nothing here grants nothing
/// (fine on a fleet, worth a look on one host).
fn gpus_here(ctx: &Context, path: &std::path::Path, p: &Policy) -> Check {
    const NAME: &str = "policy.file";
    let Ok(inv) = &ctx.inv else {
        return Check::pass(
            NAME,
            format!(
                "{}: {} rules (no GPUs to check them against)",
                path.display(),
                p.rules.len()
            ),
        );
    };
    let mut unknown = Vec::new();
    for (i, rule) in p.rules.iter().enumerate() {
        for item in &rule.gpus {
            match Selection::parse(item, inv) {
                Ok(_) => {}
                Err(SelectorError::NotFound { .. }) => {
                    unknown.push(format!("{} gpus {item:?}", p.rule_name(i)))
                }
                Err(e) => {
                    return Check::fail(
                        NAME,
                        format!("{}: {}: {e}", path.display(), p.rule_name(i)),
                        "give indices, ranges, UUIDs, PCI bus ids or all; that rule refuses everything meanwhile",
                    )
                }
            }
        }
    }
    if unknown.is_empty() {
        Check::pass(
            NAME,
            format!(
                "{}: {} rules, root-owned, valid",
                path.display(),
                p.rules.len()
            ),
        )
    } else {
        Check::warn(
            NAME,
            format!(
                "{}: no GPU of this host matches {}",
                path.display(),
                crate::list(&unknown, 3)
            ),
            "check the UUIDs with `gpuslice list` (an item for another host grants nothing here)",
        )
    }
}

/// A `gpuslice` command in a sudoers file: the line and what it allows.
struct SudoRule {
    file: PathBuf,
    line: String,
    /// The command has no arguments (or `*` right after the program):
    /// every subcommand, as root.
    any_args: bool,
    /// `SETENV:` or an `env_keep` naming GPUSLICE_ (the caller's variables
    /// reach the root gpuslice).
    setenv: bool,
}

fn sudo_rules(ctx: &Context) -> Vec<SudoRule> {
    let dir = ctx.root.join("etc/sudoers.d");
    let Ok(entries) = fs::read_dir(&dir) else {
        return vec![];
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    let mut rules = Vec::new();
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        let env_keep = text
            .lines()
            .any(|l| l.contains("env_keep") && l.contains("GPUSLICE"));
        for line in text.lines().map(str::trim) {
            if line.starts_with('#') || line.starts_with("Defaults") || !line.contains("gpuslice") {
                continue;
            }
            rules.push(SudoRule {
                any_args: line.split(',').any(any_args),
                setenv: env_keep || line.contains("SETENV:"),
                line: line.to_string(),
                file: file.clone(),
            });
        }
    }
    rules
}

/// One command of a sudoers line (`… = (root) NOPASSWD: /usr/bin/gpuslice run *`):
/// true when it names gpuslice with no arguments or with `*` first.
fn any_args(command: &str) -> bool {
    let command = command.rsplit(':').next().unwrap_or(command);
    let command = command.rsplit('=').next().unwrap_or(command);
    let mut words = command
        .split_whitespace()
        .skip_while(|w| w.starts_with('(') || w.ends_with(')'));
    let Some(program) = words.next() else {
        return false;
    };
    if !program
        .rsplit('/')
        .next()
        .unwrap_or(program)
        .starts_with("gpuslice")
    {
        return false;
    }
    matches!(words.next(), None | Some("*"))
}

fn sudo_rule(rules: &[SudoRule], policy: &Result<Policy, PolicyError>) -> Check {
    const NAME: &str = "policy.sudo";
    let Some(first) = rules.first() else {
        return Check::pass(NAME, "no sudo rule for gpuslice in /etc/sudoers.d");
    };
    let at = |r: &SudoRule| format!("{}: {:?}", r.file.display(), r.line);
    const RULE: &str = "%gpu ALL=(root) NOPASSWD: /usr/local/bin/gpuslice run *";
    if let Some(r) = rules.iter().find(|r| r.any_args) {
        let why = if policy.is_ok() {
            "every subcommand as root (cdi generate --output, device-plugin, exporter … are not decided by the policy)"
        } else {
            "arbitrary arguments as root, and there is no valid policy file"
        };
        return Check::warn(
            NAME,
            format!("{} allows {why}", at(r)),
            format!("allow only `run`: {RULE}"),
        );
    }
    if let Some(r) = rules.iter().find(|r| r.setenv) {
        return Check::warn(
            NAME,
            format!("{} lets callers set the environment of a root gpuslice (SETENV or env_keep GPUSLICE_*)", at(r)),
            format!("drop SETENV and the env_keep of GPUSLICE_*: {RULE}"),
        );
    }
    if policy.is_err() {
        return Check::warn(
            NAME,
            format!("{} lets users run gpuslice, but there is no valid policy: every run of theirs is refused", at(first)),
            "write /etc/gpuslice/policy.toml (see docs/security.md)",
        );
    }
    Check::pass(
        NAME,
        format!("{}: `run` only, decided by the policy", at(first)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sudo_commands_with_any_arguments() {
        assert!(any_args(
            "%gpu ALL=(root) NOPASSWD: /usr/local/bin/gpuslice"
        ));
        assert!(any_args("alice ALL = /usr/bin/gpuslice *"));
        assert!(any_args(" /usr/bin/gpuslice"));
        assert!(!any_args(
            "%gpu ALL=(root) NOPASSWD: /usr/local/bin/gpuslice run *"
        ));
        assert!(!any_args("%gpu ALL=(root) NOPASSWD: /usr/bin/true"));
    }
}
