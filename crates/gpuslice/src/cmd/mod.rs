//! One module per subcommand.

pub mod cdi;
pub mod cdi_run;
pub mod device_plugin;
pub mod doctor;
pub mod dra;
pub mod enforce;
pub mod exporter;
pub mod labels;
pub mod list;
pub mod run;
pub mod run_args;
pub mod slice_setup;
pub mod slices;
pub mod tenant;
pub mod top;

use serde_json::Value;

/// The strings of the JSON array `v`: none where `v` is not an array, and
/// any element that is not a string passed over (what these commands read
/// is written by other programs: CDI specs, snapshots).
fn json_strings(v: &Value) -> impl Iterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str)
}
