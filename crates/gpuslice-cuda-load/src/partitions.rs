//! The driver's per-cgroup GPU memory partitions (NVIDIA R615+,
//! `nvmlDeviceSetMemoryLimits_v1` / `nvmlDeviceGetMemoryLimits_v1`; issue
//! 25): a hard limit on a cgroup v2 directory that the driver enforces for
//! every process in it, whatever the process runs. Looked up in NVML by
//! name: older drivers have no such functions (or answer
//! `NVML_ERROR_FUNCTION_NOT_FOUND`), and then [`Partitions::open`] says so.

use std::ffi::CString;
use std::path::Path;

use gpuslice_cuda_abi::nvml::{
    pfn, NvmlDevice, NvmlGetMemoryLimitsV1, NvmlReturn, NvmlSetMemoryLimitsV1, LIBNVIDIA_ML,
    NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_FOUND, NVML_SUCCESS,
};

use crate::{Lib, LoadError};

/// Why the driver's partitions cannot be had or set.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{}", nvml_message(what, *rc))]
    Nvml { what: String, rc: NvmlReturn },
    #[error("bad UUID {0:?}")]
    BadUuid(String),
    #[error("NUL byte in a cgroup path")]
    NulInPath,
}

impl PartitionError {
    /// Whether the driver has no partitions at all (older than R615), as
    /// opposed to refusing this one.
    pub fn driver_lacks_partitions(&self) -> bool {
        matches!(
            self,
            PartitionError::Nvml {
                rc: NVML_ERROR_FUNCTION_NOT_FOUND,
                ..
            }
        )
    }
}

fn nvml_error(what: &str, rc: NvmlReturn) -> PartitionError {
    PartitionError::Nvml {
        what: what.to_string(),
        rc,
    }
}

/// NVML's partition calls.
pub struct Partitions {
    _lib: Lib,
    by_uuid: pfn::DeviceGetHandleByUuid,
    set: pfn::DeviceSetMemoryLimitsV1,
    get: pfn::DeviceGetMemoryLimitsV1,
}

/// A cgroup's limit on one GPU, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    pub soft: u64,
    pub hard: u64,
    pub current_used: u64,
}

fn nvml_message(what: &str, rc: NvmlReturn) -> String {
    match rc {
        NVML_ERROR_FUNCTION_NOT_FOUND => {
            format!("{what}: this driver has no memory partitions (NVIDIA R615 or later has)")
        }
        4 => format!("{what}: needs root (NVML_ERROR_NO_PERMISSION)"),
        3 => format!("{what}: not supported here (NVML_ERROR_NOT_SUPPORTED: MIG?)"),
        rc => format!("{what}: NVML error {rc}"),
    }
}

impl Partitions {
    /// NVML with its partition calls, initialised; an error says why there
    /// are none (no NVML, a driver older than R615).
    pub fn open() -> Result<Partitions, PartitionError> {
        Self::open_lib(None)
    }

    /// [`Partitions::open`] from the NVML library `lib` (None:
    /// `libnvidia-ml.so.1`, as the loader finds it).
    pub fn open_lib(lib: Option<&Path>) -> Result<Partitions, PartitionError> {
        let name = lib.map_or(LIBNVIDIA_ML.to_string(), |p| p.display().to_string());
        // SAFETY: NVML is a driver library (the contract of Lib::open).
        let lib = unsafe { Lib::open(&name) }?;
        // SAFETY: the prototypes of these names (cuda-abi, nvml.h).
        let (init, by_uuid, set, get) = unsafe {
            (
                *lib.sym::<pfn::Init>("nvmlInit_v2")?,
                *lib.sym::<pfn::DeviceGetHandleByUuid>("nvmlDeviceGetHandleByUUID")?,
                *lib.sym::<pfn::DeviceSetMemoryLimitsV1>("nvmlDeviceSetMemoryLimits_v1")
                    .map_err(|_| {
                        nvml_error(
                            "nvmlDeviceSetMemoryLimits_v1",
                            NVML_ERROR_FUNCTION_NOT_FOUND,
                        )
                    })?,
                *lib.sym::<pfn::DeviceGetMemoryLimitsV1>("nvmlDeviceGetMemoryLimits_v1")
                    .map_err(|_| {
                        nvml_error(
                            "nvmlDeviceGetMemoryLimits_v1",
                            NVML_ERROR_FUNCTION_NOT_FOUND,
                        )
                    })?,
            )
        };
        // SAFETY: nvmlInit_v2 takes nothing (reference counted).
        let rc = unsafe { init() };
        if rc != NVML_SUCCESS {
            return Err(nvml_error("nvmlInit_v2", rc));
        }
        let p = Partitions {
            _lib: lib,
            by_uuid,
            set,
            get,
        };
        Ok(p)
    }

    fn device(&self, uuid: &str) -> Result<NvmlDevice, PartitionError> {
        let u = CString::new(uuid).map_err(|_| PartitionError::BadUuid(uuid.to_string()))?;
        let mut dev: NvmlDevice = std::ptr::null_mut();
        // SAFETY: NUL-terminated UUID, valid out pointer.
        let rc = unsafe { (self.by_uuid)(u.as_ptr(), &mut dev) };
        if rc != NVML_SUCCESS {
            return Err(nvml_error(&format!("device {uuid}"), rc));
        }
        Ok(dev)
    }

    /// Whether this driver answers the calls (an R615+ driver; an older
    /// one's NVML may export them and answer FUNCTION_NOT_FOUND).
    pub fn available(&self, uuid: &str, cgroup_dir: &Path) -> Result<(), PartitionError> {
        self.get(uuid, cgroup_dir).map(|_| ())
    }

    /// Sets the limits of the cgroup directory `cgroup_dir` on GPU `uuid`.
    pub fn set(
        &self,
        uuid: &str,
        cgroup_dir: &Path,
        soft: u64,
        hard: u64,
    ) -> Result<(), PartitionError> {
        let dev = self.device(uuid)?;
        let ns = CString::new(cgroup_dir.as_os_str().as_encoded_bytes())
            .map_err(|_| PartitionError::NulInPath)?;
        let l = NvmlSetMemoryLimitsV1 {
            name_space: ns.as_ptr(),
            soft_limit: soft,
            hard_limit: hard,
        };
        // SAFETY: a handle of this NVML, a valid struct whose string lives
        // across the call.
        let rc = unsafe { (self.set)(dev, &l) };
        if rc != NVML_SUCCESS {
            return Err(nvml_error("nvmlDeviceSetMemoryLimits_v1", rc));
        }
        Ok(())
    }

    /// The limits of `cgroup_dir` on GPU `uuid`; None when it has none.
    pub fn get(
        &self,
        uuid: &str,
        cgroup_dir: &Path,
    ) -> Result<Option<MemoryLimit>, PartitionError> {
        let dev = self.device(uuid)?;
        let ns = CString::new(cgroup_dir.as_os_str().as_encoded_bytes())
            .map_err(|_| PartitionError::NulInPath)?;
        let mut l = NvmlGetMemoryLimitsV1 {
            name_space: ns.as_ptr(),
            soft_limit: 0,
            hard_limit: 0,
            current_used: 0,
        };
        // SAFETY: as in `set`; the struct is written by NVML.
        let rc = unsafe { (self.get)(dev, &mut l) };
        match rc {
            NVML_SUCCESS => Ok(Some(MemoryLimit {
                soft: l.soft_limit,
                hard: l.hard_limit,
                current_used: l.current_used,
            })),
            NVML_ERROR_NOT_FOUND => Ok(None),
            rc => Err(nvml_error("nvmlDeviceGetMemoryLimits_v1", rc)),
        }
    }

    /// Removes the limit of `cgroup_dir` on GPU `uuid` the way the driver
    /// asks before a cgroup is deleted: the soft limit zeroed first (under
    /// the kernel's dmem controller, a deleted cgroup's soft limit stays
    /// reserved on its ancestors), then the limit cleared.
    pub fn clear(&self, uuid: &str, cgroup_dir: &Path) -> Result<(), PartitionError> {
        if let Some(l) = self.get(uuid, cgroup_dir)? {
            if l.soft != 0 {
                self.set(uuid, cgroup_dir, 0, l.hard)?;
            }
            self.set(uuid, cgroup_dir, 0, 0)?;
        }
        Ok(())
    }
}
