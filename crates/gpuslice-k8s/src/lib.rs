pub mod cdi;
pub mod plugin;
