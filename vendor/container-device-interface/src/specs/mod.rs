pub mod config;
pub mod oci;
