//! The binaries installed side by side: `gpuslice` (the start-up path) and
//! `gpuslice-full` (every command), both built from this library; and
//! `gpuslice-bench` (package gpuslice-bench, under testing/), which carries
//! the benchmarks and self-tests that drive gpuslice with its test doubles.

use std::path::PathBuf;

/// The binary `gpuslice` hands the commands it does not carry to.
pub const FULL_BINARY: &str = "gpuslice-full";
/// The binary `gpuslice-full` hands `bench` and `device-plugin-selftest` to.
pub const BENCH_BINARY: &str = "gpuslice-bench";

/// Replaces this process with `gpuslice-full` from the same directory,
/// with the same arguments; returns only on failure.
pub fn exec_full() -> u8 {
    eprintln!(
        "gpuslice: {}",
        exec_sibling(FULL_BINARY, "install both binaries into one directory")
    );
    1
}

/// Replaces this process with `gpuslice-bench` from the same directory,
/// with the same arguments (it reads `gpuslice bench …` as written);
/// returns only on failure, with why.
pub fn exec_bench() -> anyhow::Error {
    anyhow::anyhow!(exec_sibling(
        BENCH_BINARY,
        "build it with `cargo build --release -p gpuslice-bench`; scripts/install.sh does not \
         install it"
    ))
}

/// Replaces this process with `binary` from this executable's directory,
/// with this process's arguments; returns only on failure: why, in one
/// line, with `install` saying how to get `binary` there.
fn exec_sibling(binary: &str, install: &str) -> String {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().ok();
    let sibling = exe
        .as_ref()
        .and_then(|exe| Some(exe.parent()?.join(binary)));
    let Some(sibling) = sibling.filter(|p| p.is_file()) else {
        let here = exe
            .as_ref()
            .and_then(|e| e.file_name())
            .map_or_else(|| "gpuslice".into(), |n| n.to_string_lossy());
        return format!(
            "this command is carried by {binary}, which is not installed next to {here} ({install})"
        );
    };
    let mut args = std::env::args_os();
    // The caller's argv[0]: clap names the program by it in usage lines.
    let arg0 = args.next().unwrap_or_else(|| "gpuslice".into());
    let err = std::process::Command::new(&sibling)
        .arg0(arg0)
        .args(args)
        .exec();
    format!("cannot run {}: {err}", sibling.display())
}

/// The `gpuslice` binary users call, beside the running one (`gpuslice-full`
/// or `gpuslice-bench`): the one the benchmarks time and the self-tests run.
pub fn gpuslice_exe() -> std::io::Result<PathBuf> {
    Ok(std::env::current_exe()?.with_file_name("gpuslice"))
}
