//! The DRA driver's integration tests, one binary: each former test file
//! is a module, and its tests are threads of this one process. Tests that
//! load the fake NVML in-process hold gpuslice_testkit::fakenvml::serve on
//! their host; nothing else sets the process's environment.

mod client;
mod common;
mod deploy;
mod dra;
mod hotplug;
mod hotplug_health;
mod podman;
mod publish;
mod publish_health;
mod watch;

gpuslice_testkit::every_test_file_is_a_module!();
