//! `gpuslice-full`: every gpuslice command, including the daemons and the
//! benchmarks; `gpuslice` execs it for the commands it does not carry.

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match gpuslice_cli::parse() {
        Ok(cli) => cli,
        Err(code) => return ExitCode::from(code),
    };
    gpuslice_cli::init_logging(&cli);
    ExitCode::from(gpuslice_cli::finish(&cli, gpuslice_cli::run_full(&cli)))
}
