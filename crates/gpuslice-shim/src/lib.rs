//! `libgpuslice.so`: enforces a slice's GPU memory cap and compute share
//! inside every process of the slice, loaded with `LD_PRELOAD` (see
//! docs/shim.md and docs/compute-share.md; the share is in [`compute`]).
//!
//! - Interposes the CUDA driver API's allocation, free and memory-info
//!   entry points, for programs that link libcuda, that `dlopen` it and
//!   `dlsym` or `dlvsym` symbols ([`loader`]), and runtimes that take entry points
//!   from `cuGetProcAddress(_v2)` ([`families`]); plus NVML's memory
//!   queries ([`nvml`]).
//! - Charges every allocation to the slice's ledger
//!   ([`gpuslice_ledger`]) by compare-and-swap *before* the driver call;
//!   over the cap the call fails with `CUDA_ERROR_OUT_OF_MEMORY`.
//! - Configuration (read once, in the library constructor):
//!   `GPUSLICE_MEMORY_LIMIT` / `GPUSLICE_MEMORY_LIMIT_<i>`,
//!   `GPUSLICE_LEDGER`, `GPUSLICE_SLICE`, `GPUSLICE_CONTEXT_BYTES`,
//!   `GPUSLICE_COMPUTE_LIMIT`, `GPUSLICE_COMPUTE_MODE` (`cap` or
//!   `guaranteed`, see [`borrow`]), `GPUSLICE_BOARD_DIR`, `GPUSLICE_LOG`. With no cap, `dlsym` and
//!   `cuGetProcAddress` hand back the driver's own functions (with no
//!   compute share, the driver's own launch functions).
//!
//! No panic crosses the C boundary: every entry point runs under
//! `catch_unwind`.
//!
//! Modules are layered downward, with no import loop (docs/architecture.md,
//! "The shim's layers"; `tests/layering.rs` checks it), bottom to top:
//! [`cuda`], [`config`], [`sys`] → [`real`], [`table`], [`measure`],
//! [`stats`] → [`driver`] (driver facts, clocks) → [`borrow`] → [`state`]
//! (configuration, ledger slot, `Target`) → [`compute`], [`pools`],
//! [`nvml`], [`init`] → [`resident`] (driver-held memory and the charging
//! paths that settle on a refusal) → [`hooks`] → [`families`] (name
//! tables, exported symbols, `cuGetProcAddress`) → [`loader`] (our
//! `dlsym`, `dlvsym`, `dlopen`, `dlmopen`). [`dl`] (the C library's own
//! loader functions, read from its symbol table) is beside [`sys`].

// A cdylib with no Rust API: its documentation is for maintainers and
// points into the private modules on purpose.
#![allow(rustdoc::private_intra_doc_links)]

mod borrow;
mod compute;
mod config;
mod cuda;
mod dl;
mod driver;
mod families;
mod hooks;
mod init;
mod loader;
mod measure;
mod nvml;
mod pools;
mod real;
mod resident;
mod state;
mod stats;
mod sys;
mod table;
mod turns;

extern "C" fn constructor() {
    real::guard((), || {
        sys::resolve_real_loader();
        resident::forget_charges_in_forked_children();
        if state::init().log {
            stats::enable();
        }
    });
}

extern "C" fn destructor() {
    real::guard((), || {
        stats::report(families::ALL);
        state::detach_at_exit();
    });
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = constructor;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = destructor;
