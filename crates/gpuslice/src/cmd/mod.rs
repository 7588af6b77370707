//! One module per subcommand.

pub mod bench;
pub mod bench_init;
pub mod bench_launch;
pub mod cdi;
pub mod device_plugin;
pub mod doctor;
pub mod dra;
pub mod exporter;
pub mod fakehost;
pub mod labels;
pub mod list;
pub mod run;
pub mod slices;
pub mod tenant;
