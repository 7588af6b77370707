//! Helpers shared by the CLI's integration tests (each test binary
//! includes this module and uses a part of it).

/// The `gpuslice` binary under test.
pub const GPUSLICE: &str = env!("CARGO_BIN_EXE_gpuslice");

#[allow(dead_code)] // Only the memory-cap, compute-share and slice-integrity tests use it.
pub mod slice;
