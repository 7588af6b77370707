//! `gpuslice`: the launcher-side commands; the others run in
//! `gpuslice-full` (see the library's documentation for why).

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match gpuslice::parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if !gpuslice::is_lean(&cli) {
        return gpuslice::exec_full();
    }
    gpuslice::init_logging(&cli);
    match gpuslice::run_lean(&cli) {
        Some(result) => gpuslice::finish(&cli, result),
        None => gpuslice::exec_full(),
    }
}
