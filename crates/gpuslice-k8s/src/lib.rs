pub mod cdi;
pub mod enforcer;
pub mod grpc_wire;
pub mod labels;
pub mod plugin;
