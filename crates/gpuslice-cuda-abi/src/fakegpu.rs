//! The fake driver's own test hooks (fakegpu-driver exports them beside
//! the CUDA driver ABI it implements; the shim's test client reads them
//! to see what the simulated GPU did). Not part of any NVIDIA header.

use std::ffi::c_int;

/// `fakegpuBusyNs(dev)`: GPU time device `dev` has completed, in ns.
pub type BusyNs = unsafe extern "C" fn(dev: c_int) -> u64;
/// `fakegpuEventRecords()`: `cuEventRecord` calls the fake driver has seen.
pub type EventRecords = unsafe extern "C" fn() -> u64;
