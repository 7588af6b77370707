//! How a launch ends when the command never ran.

/// Exit code when gpuslice fails before the child runs (as `docker run`).
pub const EXIT_LAUNCH_FAILED: i32 = 125;
