//! `gpuslice`: the launcher-side commands; the others run in
//! `gpuslice-full` (see the library's documentation for why).

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match gpuslice_cli::parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // Set up before knowing whether this binary carries the command: a
    // few microseconds, and gpuslice-full sets up its own.
    gpuslice_cli::init_logging(&cli);
    match gpuslice_cli::run_lean(&cli) {
        Some(result) => gpuslice_cli::finish(&cli, result),
        None => gpuslice_cli::exec_full(),
    }
}
