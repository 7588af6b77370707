//! Loading the CUDA driver and NVML at run time.
//!
//! - [`Lib`]: dlopen a driver library (`libcuda.so.1`, `libnvidia-ml.so.1`,
//!   or a path) and look up its entry points with the prototypes of
//!   `gpuslice_cuda_abi::cuda::pfn` and `gpuslice_cuda_abi::nvml::pfn`
//!   (the CUDA probe, `fakegpu-probe`). Errors are one line naming the
//!   library or the symbol.
//! - [`open_nvml`]: the one way gpuslice's discovery, doctor, metrics,
//!   device plugin and benchmarks open NVML (through nvml-wrapper);
//!   [`nvml_raw`]: the calls nvml-wrapper does not wrap.

use std::ffi::OsStr;
use std::path::Path;

use gpuslice_cuda_abi::nvml::LIBNVIDIA_ML;

pub mod nvml_raw;
pub mod partitions;
use libloading::Library;
pub use libloading::Symbol;
use nvml_wrapper::error::NvmlError;
pub use nvml_wrapper::Nvml;

/// A driver library or one of its entry points could not be had.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot load {name}: {source}")]
    Library {
        name: String,
        #[source]
        source: libloading::Error,
    },
    #[error("{symbol} not in {library}: {source}")]
    Symbol {
        symbol: String,
        library: String,
        #[source]
        source: libloading::Error,
    },
}

/// For the probe binaries, whose errors are lines of text.
impl From<LoadError> for String {
    fn from(e: LoadError) -> String {
        e.to_string()
    }
}

/// NVML could not list a device's processes.
#[derive(Debug, thiserror::Error)]
pub enum ProcessesError {
    #[error("NVML: device {uuid}: {source}")]
    Device {
        uuid: String,
        #[source]
        source: NvmlError,
    },
    #[error("NVML: running processes of {uuid}: {source}")]
    Processes {
        uuid: String,
        #[source]
        source: NvmlError,
    },
}

/// A loaded driver library.
pub struct Lib {
    name: String,
    lib: Library,
}

impl Lib {
    /// Loads `name` through the dynamic loader (a bare name searches
    /// `LD_LIBRARY_PATH` and the cache, so the fake or the real driver is
    /// picked as a program linked against it would pick it).
    ///
    /// # Safety
    /// Loading runs the library's initialisers: `name` must be a driver
    /// library (real or fake), not an arbitrary file.
    pub unsafe fn open(name: &str) -> Result<Lib, LoadError> {
        // SAFETY: the caller vouches for the library (see above).
        let lib = unsafe { Library::new(name) }.map_err(|source| LoadError::Library {
            name: name.to_string(),
            source,
        })?;
        Ok(Lib {
            name: name.to_string(),
            lib,
        })
    }

    /// The entry point `symbol`, typed `T`.
    ///
    /// # Safety
    /// `T` must be the symbol's prototype (one of the `pfn` aliases for it).
    pub unsafe fn sym<T>(&self, symbol: &str) -> Result<Symbol<'_, T>, LoadError> {
        // SAFETY: the caller guarantees T matches the symbol.
        unsafe { self.lib.get(symbol.as_bytes()) }.map_err(|source| LoadError::Symbol {
            symbol: symbol.to_string(),
            library: self.name.clone(),
            source,
        })
    }
}

/// Opens NVML from `lib` (None: `libnvidia-ml.so.1`, found by the dynamic
/// loader) and initialises it.
pub fn open_nvml(lib: Option<&Path>) -> Result<Nvml, NvmlError> {
    let lib = lib.map_or(OsStr::new(LIBNVIDIA_ML), Path::as_os_str);
    Nvml::builder().lib_path(lib).init()
}

/// Every process holding memory on each device of `uuids` (`GPU-…` or
/// `MIG-…`), as the driver's own per-process accounting reports it (NVML's
/// running compute processes: contexts included; pids as the reader's PID
/// namespace numbers them): `(uuid, pid, bytes)`. A process NVML reports
/// no figure for counts 0 bytes.
pub fn running_processes(
    nvml: &Nvml,
    uuids: &[String],
) -> Result<Vec<(String, u32, u64)>, ProcessesError> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let mut out = Vec::new();
    for uuid in uuids {
        let dev = nvml
            .device_by_uuid(uuid.as_str())
            .map_err(|source| ProcessesError::Device {
                uuid: uuid.clone(),
                source,
            })?;
        let procs =
            dev.running_compute_processes()
                .map_err(|source| ProcessesError::Processes {
                    uuid: uuid.clone(),
                    source,
                })?;
        for p in procs {
            let bytes = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => b,
                UsedGpuMemory::Unavailable => 0,
            };
            out.push((uuid.clone(), p.pid, bytes));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_named() {
        // SAFETY: nothing is loaded (the file does not exist).
        let err = unsafe { Lib::open("/nonexistent/libcuda.so.1") }
            .err()
            .expect("no library there")
            .to_string();
        assert!(
            err.starts_with("cannot load /nonexistent/libcuda.so.1"),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn missing_symbol_is_named() {
        // SAFETY: libc's initialisers already ran in this process.
        let lib = unsafe { Lib::open("libc.so.6") }.expect("libc");
        // SAFETY: never called.
        let err = unsafe { lib.sym::<gpuslice_cuda_abi::cuda::pfn::Init>("cuInit") }
            .expect_err("libc has no cuInit")
            .to_string();
        assert!(err.starts_with("cuInit not in libc.so.6"), "{err}");
        // SAFETY: getpid's prototype: pid_t (void).
        let getpid = unsafe { lib.sym::<unsafe extern "C" fn() -> i32>("getpid") }.unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { getpid() } as u32, std::process::id());
    }

    #[test]
    fn open_nvml_names_the_missing_library() {
        let err = open_nvml(Some(Path::new("/nonexistent/libnvidia-ml.so.1")))
            .expect_err("no NVML there");
        assert!(err.to_string().contains("/nonexistent"), "{err}");
    }
}
