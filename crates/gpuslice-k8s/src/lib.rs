pub mod cdi;
pub mod labels;
pub mod plugin;
