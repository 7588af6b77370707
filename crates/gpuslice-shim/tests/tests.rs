//! The shim's integration tests, one binary: each former test file is a
//! module, and its tests are threads of this one process. Helpers they
//! share live in gpuslice-testkit.

use std::borrow::Cow;
use std::path::Path;
use std::process::Output;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde_json::Value;

mod compute;
mod fake_host;
mod layering;

gpuslice_testkit::every_test_file_is_a_module!();

/// The compute tests measure shares of GPU time that the fake GPU serves
/// from the CPU: beside another test's processes on a 2-core CI machine
/// they starve and miss their targets. So each runs alone, whatever
/// `--test-threads` says; the other tests that start processes hold
/// [`beside_others`] and run between them.
static CPU: RwLock<()> = RwLock::new(());

/// Held by a test that measures: no other test runs processes meanwhile.
fn alone() -> RwLockWriteGuard<'static, ()> {
    CPU.write().unwrap_or_else(PoisonError::into_inner)
}

/// Held by a test that runs processes: not while one measures.
fn beside_others() -> RwLockReadGuard<'static, ()> {
    CPU.read().unwrap_or_else(PoisonError::into_inner)
}

/// A shim test client's standard output, once it is known to have exited
/// successfully (else the failure, with what it printed).
fn succeeded(out: &Output) -> Cow<'_, str> {
    assert!(
        out.status.success(),
        "client failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
}

/// The file name of the `file` a client's `addr` reported: where the
/// function it looked up is defined.
fn defined_in(v: &Value) -> String {
    let file = v["file"].as_str().unwrap();
    Path::new(file)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}
