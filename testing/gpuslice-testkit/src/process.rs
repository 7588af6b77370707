//! Children the tests start: killed and reaped when the test lets go of
//! them, and awaited until they say they are ready.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A child process killed and reaped when the test lets go of it, passed
/// or panicking.
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `cmd` with its stdout piped and returns once its first line is
/// `ready` (a holder's `held`, once it holds what it was told to); panics
/// with what it said instead. Its stdout stays open, so that it can go on
/// writing.
pub fn spawn_until(cmd: &mut Command, ready: &str) -> Child {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.trim() != ready {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{cmd:?} said {line:?} first, not {ready:?}");
    }
    child
}

/// The name libtest gives the test `name` defined in the module
/// `module_path` (`module_path!()` there): its path less the crate's
/// name, as `--exact` wants it.
pub fn test_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_crate, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}

/// This test binary, set to run the test `test` (see [`test_name`]) alone
/// in a child process: the child's environment is its own, so a test that
/// needs other environment variables (a library reads them in-process)
/// gives them to the child instead of setting them for every test of the
/// binary.
pub fn this_test_again(test: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    c
}

/// Runs `cmd`, this test binary running one test (as [`this_test_again`]
/// sets it up, maybe behind a wrapper), and panics, with its output, unless
/// that test ran and passed.
pub fn passed_again(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?}: {log}");
    assert!(log.contains("1 passed"), "{cmd:?} ran no test: {log}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_names_are_module_paths_less_the_crate() {
        assert_eq!(test_name("integration::client", "t"), "client::t");
        assert_eq!(test_name("integration::a::b", "t"), "a::b::t");
        assert_eq!(test_name("integration", "t"), "t");
    }

    #[test]
    fn a_child_that_does_not_say_ready_is_a_failure_naming_what_it_said() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo nope; sleep 5"]);
        let e =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| spawn_until(&mut c, "held")))
                .unwrap_err();
        let e = e.downcast_ref::<String>().unwrap();
        assert!(e.contains("\"nope\\n\"") && e.contains("\"held\""), "{e}");
        let mut c = Command::new("sh");
        c.args(["-c", "echo held; sleep 5"]);
        let _child = Kill(spawn_until(&mut c, "held"));
    }
}
