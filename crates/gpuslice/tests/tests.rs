//! The `gpuslice` CLI's integration tests, one binary: each former test
//! file is a module, and its tests are threads of this one process;
//! `common` holds what several of them share. Tests that load the fake NVML
//! in-process hold gpuslice_testkit::fakenvml::serve on their host; children
//! are given their fake host's environment explicitly.

mod bench_init;
mod boundary;
mod cdi_podman;
mod cdi_run;
mod cli;
mod common;
mod compute_share;
mod demo;
mod doctor;
mod dra_selftest;
mod escapes;
mod exporter;
mod labels;
mod memory_cap;
mod plugin_selftest;
mod run_isolation;
mod slice_integrity;
mod static_launcher;
mod top;
mod users_policy;

gpuslice_testkit::every_test_file_is_a_module!();
