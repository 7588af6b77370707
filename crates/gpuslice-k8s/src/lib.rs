#![forbid(unsafe_code)]

pub mod cdi;
pub mod grpc_wire;
pub mod labels;
pub mod plugin;
pub mod slicedir;
