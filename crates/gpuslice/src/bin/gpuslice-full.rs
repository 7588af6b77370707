//! `gpuslice-full`: every gpuslice command, including the daemons;
//! `gpuslice` execs it for the commands it does not carry, and it execs
//! `gpuslice-bench` for the benchmarks.

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match gpuslice::parse() {
        Ok(cli) => cli,
        Err(code) => return ExitCode::from(code),
    };
    gpuslice::init_logging(&cli.global);
    ExitCode::from(gpuslice::finish(&cli, gpuslice::run_full(&cli)))
}
