//! `gpuslice-full`: every gpuslice command, including the daemons and the
//! benchmarks; `gpuslice` execs it for the commands it does not carry.

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match gpuslice::parse() {
        Ok(cli) => cli,
        Err(code) => return ExitCode::from(code),
    };
    gpuslice::init_logging(&cli);
    ExitCode::from(gpuslice::finish(&cli, gpuslice::run_full(&cli)))
}
