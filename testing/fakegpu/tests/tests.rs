//! The fake GPU host's integration tests, one binary: the tree it builds,
//! the fake driver seen by a probe process, and the fake NVML loaded here
//! (behind gpuslice_testkit::fakenvml, as every in-process NVML user).

mod driver;
mod nvml;
mod tree;

gpuslice_testkit::every_test_file_is_a_module!();
