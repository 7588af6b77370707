//! The ledger's integration tests, one binary (see gpuslice_testkit::every_test_file_is_a_module):
//! processes that attach, allocate and die against one ledger.

mod processes;

gpuslice_testkit::every_test_file_is_a_module!();
