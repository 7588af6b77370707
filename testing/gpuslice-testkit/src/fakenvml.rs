//! The fake NVML loaded into a test process, shared by the tests of one
//! binary (each crate's integration tests are one binary, their tests
//! threads of one process).
//!
//! NVML is per process, the fake one as the real one: it reads its host
//! from `FAKEGPU_ROOT` at `nvmlInit`, and every later init in the process
//! gets that view until the last handle shuts it down. Two tests of one
//! binary that load it on different fake hosts would each see the other's
//! GPUs. So a test that loads it in-process (discovery with `nvml_lib`, the
//! plugins' health watchers, `nvml-wrapper`) first holds [`serve`] on its
//! host for as long as anything it started may call NVML: tests of the same
//! host run side by side, a test of another host waits until they are done.
//! `FAKEGPU_ROOT` is set only while a test holds it, and only here.
//!
//! Child processes are given their fake host's environment explicitly
//! (`fakegpu::FakeHost::env`), never through this process's.

use fakegpu::FakeHost;
use gpuslice_core::discover::DiscoverOptions;
use gpuslice_core::{HostRoot, Inventory};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// The variable the fake driver (and `gpuslice_core::discover`'s NVML gate)
/// reads the host root from.
pub const FAKEGPU_ROOT: &str = "FAKEGPU_ROOT";

/// The host the in-process fake NVML serves now, and how many tests hold it.
struct Serving {
    root: Option<PathBuf>,
    holders: usize,
}

static SERVING: Mutex<Serving> = Mutex::new(Serving {
    root: None,
    holders: 0,
});
static RELEASED: Condvar = Condvar::new();

fn serving() -> MutexGuard<'static, Serving> {
    // Nothing panics while holding it: a poisoned lock's state is sound.
    SERVING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Held while a test's in-process NVML describes its fake host; dropping
/// the last holder of a host unsets `FAKEGPU_ROOT`. Declare it before the
/// plugins and drivers the test starts, so that they stop first.
#[must_use = "the fake NVML serves the host only while this is held"]
pub struct Serve {
    _private: (),
}

/// Makes the in-process fake NVML describe the fake host at `root`, waiting
/// while tests of another host hold it. A test holds at most one at a time
/// (a second host in one test: drop the first guard before taking it).
pub fn serve(root: &Path) -> Serve {
    let mut s = serving();
    while s.holders > 0 && s.root.as_deref() != Some(root) {
        s = RELEASED.wait(s).unwrap_or_else(PoisonError::into_inner);
    }
    if s.root.as_deref() != Some(root) {
        // Edition 2021: safe to call. In-process readers of the variable
        // all hold a `Serve` (none holds one now); child processes get
        // their host's environment explicitly.
        std::env::set_var(FAKEGPU_ROOT, root);
        s.root = Some(root.to_path_buf());
    }
    s.holders += 1;
    Serve { _private: () }
}

/// What discovery finds on the fake host `h`, NVML included (its fake
/// NVML, loaded here, serving `h` meanwhile).
pub fn discover(h: &FakeHost) -> Inventory {
    let _nvml = serve(h.root());
    let opts = DiscoverOptions {
        nvml_lib: Some(h.nvml_lib()),
        ..DiscoverOptions::default()
    };
    gpuslice_core::discover::discover(&HostRoot::new(h.root()), &opts)
        .unwrap_or_else(|e| panic!("discovery on the fake host {}: {e}", h.root().display()))
}

impl Drop for Serve {
    fn drop(&mut self) {
        let mut s = serving();
        s.holders -= 1;
        if s.holders == 0 {
            std::env::remove_var(FAKEGPU_ROOT);
            s.root = None;
            RELEASED.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn root_now() -> Option<PathBuf> {
        std::env::var_os(FAKEGPU_ROOT).map(PathBuf::from)
    }

    #[test]
    fn tests_of_one_host_share_it_and_another_host_waits_for_them() {
        let a = Path::new("/fake/a");
        let first = serve(a);
        let second = serve(a);
        assert_eq!(root_now().as_deref(), Some(a));

        let b_served = Arc::new(AtomicBool::new(false));
        let waiter = {
            let b_served = b_served.clone();
            std::thread::spawn(move || {
                let b = Path::new("/fake/b");
                let guard = serve(b);
                // While b is held nobody else may see another root.
                assert_eq!(root_now().as_deref(), Some(b));
                b_served.store(true, Ordering::SeqCst);
                drop(guard);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!b_served.load(Ordering::SeqCst), "b waits while a is held");
        drop(first);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !b_served.load(Ordering::SeqCst),
            "b waits for every holder of a"
        );
        assert_eq!(root_now().as_deref(), Some(a));
        drop(second);
        waiter.join().unwrap();
        assert!(b_served.load(Ordering::SeqCst));
        assert_eq!(root_now(), None, "unset once nobody holds a host");
    }
}
