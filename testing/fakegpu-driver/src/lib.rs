//! A fake `libcuda.so.1` and `libnvidia-ml.so.1` in one shared object.
//!
//! It reads the tree a `fakegpu::FakeHost` builds under `$FAKEGPU_ROOT`
//! (default `/`): `.fakegpu/kernel.json` stands in for what the real driver
//! learns from the kernel through ioctls, `proc/driver/nvidia/params` for the
//! module parameters, and `dev/` for the device nodes. It behaves like the
//! real driver where gpuslice depends on it (see docs/architecture.md, "The fake GPU
//! host"): which GPUs `cuInit` can reach, when it re-creates a missing node,
//! what `CUDA_VISIBLE_DEVICES` selects, and per-device memory accounting.
//!
//! Environment:
//! - `FAKEGPU_ROOT`: host root (default `/`).
//! - `FAKEGPU_TRACE`: file to which `cuInit` appends one JSON line.
//! - `FAKEGPU_INIT_MS_PER_GPU`: overrides `init_ms_per_gpu` of kernel.json.
//! - `FAKEGPU_CTX_MS`: overrides `ctx_ms` of kernel.json.
//! - `FAKEGPU_KERNEL_NS`, `FAKEGPU_GRAPH_NS`: simulated time of a kernel
//!   launch without a duration parameter, and of a graph launch (see
//!   `cuda/launch.rs`).
//! - `CUDA_VISIBLE_DEVICES`: as with the real driver.
//!
//! Every exported function catches panics (see `ffi::guard`) so that none
//! unwinds into C.

mod cuda;
mod ffi;
mod host;
mod memory;
mod nvml;
mod partitions;
