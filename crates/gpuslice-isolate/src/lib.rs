//! isolation (to be written)

pub mod bpf;
pub mod cgroup;
