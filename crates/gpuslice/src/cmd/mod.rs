//! One module per subcommand.

pub mod bench_init;
pub mod bench_launch;
pub mod list;
pub mod run;
pub mod slices;
