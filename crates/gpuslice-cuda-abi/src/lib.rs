//! The slice of the CUDA driver ABI (`cuda.h`, CUDA 12/13) and of NVML
//! (`nvml.h`) that gpuslice uses, declared once.
//!
//! The shim (which interposes the driver), the fake driver (which
//! implements it for the tests), the CUDA probe, `fakegpu-probe` and the
//! shim's test client all speak this ABI; declaring it in each of them let
//! values drift apart. Names follow the C headers; every value here is the
//! header's (the tests below pin the ones a typo would silently break).
//!
//! The crate has no dependencies, so the shim and the fake driver stay
//! lean; loading the libraries (dlopen, typed symbols, opening NVML) is
//! gpuslice-cuda-load's.

pub mod cuda;
pub mod fakegpu;
pub mod nvml;
