//! The NVML calls nvml-wrapper has no safe wrapper for, made through its
//! raw function table: the one place outside the loader where discovery,
//! doctor and the exporter reach NVML unsafely. A driver without one of
//! them gives `Err`, never a panic.

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
};
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{
    nvmlFieldValue_t, nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG as ULL,
};

/// `nvmlDeviceGetRemappedRows`: the GPU's row remapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// A remapping waits for a GPU reset.
    pub pending: bool,
    /// A remapping failed.
    pub failed: bool,
}

fn missing(e: &impl std::fmt::Display) -> NvmlError {
    NvmlError::FailedToLoadSymbol(e.to_string())
}

/// The row remapping of `dev`.
pub fn remapped_rows(dev: &Device) -> Result<RemappedRows, NvmlError> {
    let f = dev
        .nvml()
        .lib()
        .nvmlDeviceGetRemappedRows
        .as_ref()
        .map_err(missing)?;
    let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: the handle belongs to the live Nvml `dev` borrows; the call
    // writes four unsigned ints through valid local pointers.
    let rc = unsafe { f(dev.handle(), &mut corr, &mut unc, &mut pending, &mut failed) };
    nvml_try(rc)?;
    Ok(RemappedRows {
        correctable: corr,
        uncorrectable: unc,
        pending: pending != 0,
        failed: failed != 0,
    })
}

/// GPU and compute instance ids of a MIG device handle.
pub fn instance_ids(mig: &Device) -> Result<(u32, u32), NvmlError> {
    let lib = mig.nvml().lib();
    let gi_fn = lib.nvmlDeviceGetGpuInstanceId.as_ref().map_err(missing)?;
    let ci_fn = lib
        .nvmlDeviceGetComputeInstanceId
        .as_ref()
        .map_err(missing)?;
    let (mut gi, mut ci) = (0u32, 0u32);
    // SAFETY: the handle is a live MIG handle of this initialised Nvml (the
    // borrow keeps Nvml alive); each call writes one unsigned int.
    let (rg, rc) = unsafe {
        let h = mig.handle();
        (gi_fn(h, &mut gi), ci_fn(h, &mut ci))
    };
    nvml_try(rg)?;
    nvml_try(rc)?;
    Ok((gi, ci))
}

/// NVLink data sent and received over all links, cumulative KiB: field
/// values `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}` with scope
/// `UINT_MAX` (nvml-wrapper zeroes the scope: link 0 only). Each is None
/// when NVML has no value for it.
pub fn nvlink_throughput_kib(dev: &Device) -> Result<[Option<u64>; 2], NvmlError> {
    let f = dev
        .nvml()
        .lib()
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(missing)?;
    let ids = [
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    ];
    // SAFETY: nvmlFieldValue_t is plain data; all-zero is valid.
    let mut values: [nvmlFieldValue_t; 2] = unsafe { std::mem::zeroed() };
    for (v, id) in values.iter_mut().zip(ids) {
        v.fieldId = id;
        v.scopeId = u32::MAX;
    }
    // SAFETY: the handle is valid for the Nvml `dev` borrows; `values`
    // holds as many entries as passed.
    let rc = unsafe { f(dev.handle(), values.len() as i32, values.as_mut_ptr()) };
    nvml_try(rc)?;
    Ok(values.map(|v| {
        if v.nvmlReturn == 0 && v.valueType == ULL {
            // SAFETY: valueType says which union member is set.
            Some(unsafe { v.value.ullVal })
        } else {
            None
        }
    }))
}
