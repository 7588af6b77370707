//! XID error events from NVML, for the device plugin's health watcher and
//! the exporter's XID counters.

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::{EventSet, Nvml};

/// An event set watching critical XID errors on every GPU in `uuids` that
/// supports them (others are logged and skipped). Fails when NVML cannot
/// make a set, a GPU is unknown, or no GPU supports XID events.
pub fn watch_xid_events<'n>(nvml: &'n Nvml, uuids: &[String]) -> Result<EventSet<'n>, String> {
    let new_set = || {
        nvml.create_event_set()
            .map_err(|e| format!("NVML event set: {e}"))
    };
    let mut set = new_set()?;
    let mut registered = 0;
    for uuid in uuids {
        let dev = nvml
            .device_by_uuid(uuid.as_str())
            .map_err(|e| format!("NVML device {uuid}: {e}"))?;
        match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                registered += 1;
            }
            Err(e) => {
                // NVML releases the set when registration fails: start a new one.
                tracing::warn!("{uuid}: XID events not supported: {e}");
                set = new_set()?;
            }
        }
    }
    if registered == 0 && !uuids.is_empty() {
        return Err("no GPU supports XID events".into());
    }
    Ok(set)
}
