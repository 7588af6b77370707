#![forbid(unsafe_code)]

pub mod enforcer;
pub mod grpc_wire;
pub mod labels;
pub mod plugin;
pub mod slicedir;
