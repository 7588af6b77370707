//! cgroup v1: the `devices.deny` list, and what it cannot express (module
//! docs of [`super`]).

use super::CgroupError;
use gpuslice_core::DevicePolicy;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

/// The `devices.deny` lines (`c MAJOR:MINOR rwm`, or `c MAJOR:* rwm`) that
/// apply `policy` on cgroup v1, as far as v1 can (module docs).
pub fn v1_deny_rules(policy: &DevicePolicy) -> Vec<String> {
    let mut lines = Vec::new();
    for rule in &policy.rules {
        let none_allowed = !rule.allowed.iter().any(|m| !rule.denied.contains(m));
        if rule.deny_unlisted && none_allowed {
            lines.push(format!("c {}:* rwm", rule.major));
            continue;
        }
        let mut denied = rule.denied.clone();
        denied.sort_unstable();
        for minor in denied {
            lines.push(format!("c {}:{minor} rwm", rule.major));
        }
    }
    let mut seen = std::collections::HashSet::new();
    lines.retain(|l| seen.insert(l.clone()));
    lines
}

/// Majors whose unlisted minors [`v1_deny_rules`] leaves reachable although
/// the policy denies them (`deny_unlisted` rules with allowed minors).
pub fn v1_inexact_majors(policy: &DevicePolicy) -> Vec<u32> {
    let mut majors: Vec<u32> = policy
        .rules
        .iter()
        .filter(|r| r.deny_unlisted && r.allowed.iter().any(|m| !r.denied.contains(m)))
        .map(|r| r.major)
        .collect();
    majors.sort_unstable();
    majors.dedup();
    majors
}

/// Writes `policy`'s [`v1_deny_rules`] to the cgroup at `path`.
pub(super) fn apply(path: &Path, policy: &DevicePolicy) -> Result<(), CgroupError> {
    let deny = path.join("devices.deny");
    let inexact = v1_inexact_majors(policy);
    if !inexact.is_empty() {
        tracing::debug!(
            ?inexact,
            "cgroup v1 cannot deny the unlisted minors of these majors"
        );
    }
    let rules = v1_deny_rules(policy);
    if rules.is_empty() {
        return Ok(());
    }
    let err = |rule: &str, source| CgroupError::DeviceRule {
        path: deny.clone(),
        rule: rule.into(),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .open(&deny)
        .map_err(|e| err(&rules[0], e))?;
    // One rule per write(2): the kernel parses each write as one rule.
    for rule in &rules {
        file.write_all(rule.as_bytes()).map_err(|e| err(rule, e))?;
    }
    Ok(())
}
