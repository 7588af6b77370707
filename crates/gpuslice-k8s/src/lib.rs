pub mod cdi;
