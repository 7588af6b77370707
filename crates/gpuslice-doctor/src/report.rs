//! The summary and the human-readable table.

use crate::{Check, Report, Status};
use serde::Serialize;
use std::fmt::Write;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub pass: usize,
    pub warn: usize,
    pub fail: usize,
    pub skip: usize,
    /// 0 all passed or skipped, 1 warnings, 2 failures.
    pub exit_code: i32,
}

impl Summary {
    pub fn of(checks: &[Check]) -> Summary {
        let count = |s| checks.iter().filter(|c| c.status == s).count();
        let (pass, warn, fail, skip) = (
            count(Status::Pass),
            count(Status::Warn),
            count(Status::Fail),
            count(Status::Skip),
        );
        let exit_code = if fail > 0 {
            2
        } else if warn > 0 {
            1
        } else {
            0
        };
        Summary {
            pass,
            warn,
            fail,
            skip,
            exit_code,
        }
    }
}

fn paint(status: Status, color: bool) -> String {
    let word = format!("{:<4}", status.as_str());
    if !color {
        return word;
    }
    let code = match status {
        Status::Pass => "32",
        Status::Skip => "2",
        Status::Warn => "33",
        Status::Fail => "1;31",
    };
    format!("\x1b[{code}m{word}\x1b[0m")
}

/// The report as a table: status, check, detail, and the fix on the next
/// line of each check that has one. ANSI colour only when `color`.
pub fn render_table(report: &Report, color: bool) -> String {
    let width = report
        .checks
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut s = String::new();
    let _ = writeln!(s, "{:<4}  {:<width$}  DETAIL", "", "CHECK");
    for c in &report.checks {
        let _ = writeln!(
            s,
            "{}  {:<width$}  {}",
            paint(c.status, color),
            c.name,
            c.detail
        );
        if !c.fix.is_empty() && c.status != Status::Pass {
            let _ = writeln!(s, "{:<4}  {:<width$}  fix: {}", "", "", c.fix);
        }
    }
    let m = &report.summary;
    let _ = writeln!(
        s,
        "{} checks: {} pass, {} warn, {} fail, {} skip (exit {})",
        report.checks.len(),
        m.pass,
        m.warn,
        m.fail,
        m.skip,
        m.exit_code
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_core::HostRoot;

    #[test]
    fn exit_codes_and_table() {
        let pass = Check::pass("a.one", "fine");
        let skip = Check::skip("a.two", "not here", "install it");
        let warn = Check::warn("b.three", "meh", "tune it");
        let fail = Check::fail("b.four", "broken", "mend it");
        let r = |c: Vec<Check>| Report::new(&HostRoot::default(), c);
        assert_eq!(r(vec![pass.clone(), skip.clone()]).exit_code(), 0);
        assert_eq!(r(vec![pass.clone(), warn.clone()]).exit_code(), 1);
        let all = r(vec![pass, skip, warn, fail]);
        assert_eq!(all.exit_code(), 2);
        let t = render_table(&all, false);
        assert!(t.contains("fail  b.four   broken\n"), "{t}");
        assert!(t.contains("fix: mend it"), "{t}");
        assert!(t.contains("fix: install it"), "{t}");
        assert!(
            t.ends_with("4 checks: 1 pass, 1 warn, 1 fail, 1 skip (exit 2)\n"),
            "{t}"
        );
        assert!(!t.contains('\x1b'));
        assert!(render_table(&all, true).contains("\x1b[1;31mfail\x1b[0m"));
        let json = serde_json::to_value(&all).unwrap();
        assert_eq!(json["checks"][3]["status"], "fail");
        assert_eq!(json["summary"]["exit_code"], 2);
    }
}
