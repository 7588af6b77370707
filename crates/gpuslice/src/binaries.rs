//! The two binaries built from this library: `gpuslice` (the start-up
//! path) and `gpuslice-full` (every command), installed side by side.

/// The binary `gpuslice` hands the commands it does not carry to.
pub const FULL_BINARY: &str = "gpuslice-full";

/// The `gpuslice` binary (the one whose `run` users call): this one, or,
/// in `gpuslice-full`, its sibling. Benchmarks and self-tests time and run
/// that one.
pub(crate) fn gpuslice_exe() -> std::io::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(match exe.file_name() {
        Some(n) if n == FULL_BINARY => exe.with_file_name("gpuslice"),
        _ => exe,
    })
}

/// Replaces this process with `gpuslice-full` from the same directory,
/// with the same arguments; returns only on failure.
pub fn exec_full() -> u8 {
    use std::os::unix::process::CommandExt;
    let full = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(FULL_BINARY)));
    let Some(full) = full.filter(|p| p.is_file()) else {
        eprintln!(
            "gpuslice: this command is carried by {FULL_BINARY}, which is not installed next to \
             gpuslice (install both binaries into one directory)"
        );
        return 1;
    };
    let mut args = std::env::args_os();
    // The caller's argv[0]: clap names the program by it in usage lines.
    let arg0 = args.next().unwrap_or_else(|| "gpuslice".into());
    let err = std::process::Command::new(&full)
        .arg0(arg0)
        .args(args)
        .exec();
    eprintln!("gpuslice: cannot run {}: {err}", full.display());
    1
}
