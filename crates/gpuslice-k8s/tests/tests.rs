//! The device plugin's and node labeller's integration tests, one binary:
//! each former test file is a module, and its tests are threads of this one
//! process. Tests that load the fake NVML in-process hold
//! gpuslice_testkit::fakenvml::serve on their host.

mod deploy_manifests;
mod device_plugin;
mod device_plugin_health;
mod labels;

gpuslice_testkit::every_test_file_is_a_module!();
