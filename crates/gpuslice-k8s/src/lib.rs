#![forbid(unsafe_code)]

pub mod cdi;
pub mod enforcer;
pub mod grpc_wire;
pub mod labels;
pub mod memory_hook;
pub mod plugin;
pub mod slicedir;
pub mod worker;
