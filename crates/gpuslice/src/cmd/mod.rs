//! One module per subcommand.

pub mod cdi;
pub mod cdi_run;
pub mod device_plugin;
pub mod doctor;
pub mod dra;
pub mod enforce;
pub mod exporter;
pub mod labels;
pub mod list;
pub mod run;
pub mod run_args;
pub mod slice_setup;
pub mod slices;
pub mod tenant;
pub mod top;
