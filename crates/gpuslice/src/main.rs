//! `gpuslice`: the launcher-side commands; the others run in
//! `gpuslice-full` (see the library's documentation for why).
//!
//! Entered from the C runtime, not through Rust's `fn main`: this binary
//! is on the path of every launch, and std's start-up (finding the main
//! thread's stack guard by reading `/proc/self/maps`, an alternate signal
//! stack, ignoring SIGPIPE) is skipped: `gpuslice --version` went from
//! 2.09 to 1.77 ms on the CI-like machine, side by side. Without it a stack overflow is a plain SIGSEGV and
//! a closed stdout ends `list` or `slices` with SIGPIPE, as for C tools
//! (`run` ignores SIGPIPE itself: it must live to clean up).
// (The test harness brings its own `main`.)
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
use std::ffi::{c_char, c_int};

#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    gpuslice_isolate::marks::init();
    gpuslice_isolate::marks::mark("main");
    if cfg!(target_feature = "crt-static") {
        gpuslice::set_linked_statically();
    }
    let cli = gpuslice::parse_lean();
    gpuslice_isolate::marks::mark("parsed");
    if let Err(e) = gpuslice::shed_setuid(cli.as_ref()) {
        eprintln!("gpuslice: giving up the setuid privilege: {e}");
        std::process::exit(1);
    }
    let code = match cli {
        Some(cli) => {
            // Set up before knowing whether this binary carries the
            // launch: a few microseconds, and gpuslice-full sets up its own.
            gpuslice::init_logging(&cli.global);
            match gpuslice::run_lean(&cli) {
                Some(result) => gpuslice::finish(&cli, result),
                None => gpuslice::exec_full(),
            }
        }
        None => gpuslice::exec_full(),
    };
    gpuslice_isolate::marks::mark("exit");
    // std::process::exit flushes stdout, as returning from `fn main` would.
    std::process::exit(code.into())
}
