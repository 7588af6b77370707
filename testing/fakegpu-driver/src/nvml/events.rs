//! NVML events, minimally: an event set that delivers critical-XID events
//! injected by tests. A line `<gpu-uuid> <xid>` appended to
//! `$FAKEGPU_ROOT/.fakegpu/xid` is delivered once to every event set that
//! was created before it was written and has that GPU registered for
//! `nvmlEventTypeXidCriticalError`.

use std::ffi::{c_uint, c_ulonglong};
use std::io::{Read, Seek, SeekFrom};
use std::time::{Duration, Instant};

use super::{
    guard, handle, out, rc, resolve, view, NvmlDevice, NvmlEventData, NvmlEventSet, NvmlReturn,
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_TIMEOUT, NVML_ERROR_UNKNOWN,
    NVML_EVENT_TYPE_XID_CRITICAL_ERROR, NVML_SUCCESS,
};
use crate::host::Host;

/// Path of the injection file below the host root.
pub const XID_FILE: &str = ".fakegpu/xid";

struct EventSet {
    /// (view GPU index, event mask)
    registered: Vec<(usize, c_ulonglong)>,
    /// Bytes of the injection file already consumed.
    offset: u64,
    /// A partial line carried over.
    pending: String,
}

fn xid_len(host: &Host) -> u64 {
    std::fs::metadata(host.path(XID_FILE)).map_or(0, |m| m.len())
}

/// # Safety
/// `set` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut NvmlEventSet) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        if let Err(e) = view() {
            return e;
        }
        let es = Box::new(EventSet {
            registered: Vec::new(),
            offset: xid_len(&Host::from_env()),
            pending: String::new(),
        });
        let p = Box::into_raw(es) as NvmlEventSet;
        // SAFETY: caller contract.
        match unsafe { out(set, p) } {
            Ok(()) => NVML_SUCCESS,
            Err(e) => {
                // SAFETY: just made by Box::into_raw.
                drop(unsafe { Box::from_raw(p as *mut EventSet) });
                e
            }
        }
    })
}

/// # Safety
/// `set` must come from `nvmlEventSetCreate` and not be freed.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: NvmlDevice,
    event_types: c_ulonglong,
    set: NvmlEventSet,
) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        if set.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let t = match resolve(device) {
            Ok(t) => t,
            Err(e) => return e,
        };
        // SAFETY: caller contract: a live set.
        let es = unsafe { &mut *(set as *mut EventSet) };
        es.registered.push((t.gpu, event_types));
        NVML_SUCCESS
    })
}

/// # Safety
/// `types` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: NvmlDevice,
    types: *mut c_ulonglong,
) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        rc(resolve(device).and_then(|_| {
            // SAFETY: caller contract.
            unsafe { out(types, NVML_EVENT_TYPE_XID_CRITICAL_ERROR) }
        }))
    })
}

/// # Safety
/// `set` must come from `nvmlEventSetCreate`; `data` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: NvmlEventSet,
    data: *mut NvmlEventData,
    timeout_ms: c_uint,
) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        if set.is_null() || data.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let v = match view() {
            Ok(v) => v,
            Err(e) => return e,
        };
        // SAFETY: caller contract: a live set, used by one thread at a time.
        let es = unsafe { &mut *(set as *mut EventSet) };
        let host = Host::from_env();
        let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
        loop {
            if let Some(ev) = next_event(es, &host, &v) {
                // SAFETY: checked non-null; caller contract.
                return rc(unsafe { out(data, ev) });
            }
            if Instant::now() >= deadline {
                return NVML_ERROR_TIMEOUT;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

fn next_event(es: &mut EventSet, host: &Host, v: &super::View) -> Option<NvmlEventData> {
    let mut f = std::fs::File::open(host.path(XID_FILE)).ok()?;
    f.seek(SeekFrom::Start(es.offset)).ok()?;
    let mut buf = String::new();
    let n = f.read_to_string(&mut buf).ok()?;
    es.offset += n as u64;
    es.pending.push_str(&buf);
    while let Some(nl) = es.pending.find('\n') {
        let line: String = es.pending.drain(..=nl).collect();
        let mut it = line.split_whitespace();
        let (Some(uuid), Some(xid)) = (it.next(), it.next().and_then(|x| x.parse().ok())) else {
            continue;
        };
        let Some(gpu) = v.gpus.iter().position(|g| g.info.uuid == uuid) else {
            continue;
        };
        if es
            .registered
            .iter()
            .any(|(g, mask)| *g == gpu && mask & NVML_EVENT_TYPE_XID_CRITICAL_ERROR != 0)
        {
            return Some(NvmlEventData {
                device: handle(gpu, None),
                event_type: NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
                event_data: xid,
                gpu_instance_id: 0xFFFF_FFFF,
                compute_instance_id: 0xFFFF_FFFF,
            });
        }
    }
    None
}

/// # Safety
/// `set` must come from `nvmlEventSetCreate` and not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: NvmlEventSet) -> NvmlReturn {
    guard(NVML_ERROR_UNKNOWN, || {
        if set.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: caller contract: made by nvmlEventSetCreate, freed once.
        drop(unsafe { Box::from_raw(set as *mut EventSet) });
        NVML_SUCCESS
    })
}
