//! The spec's parts as the `container-device-interface` crate's types.
//! Its `Device`, `DeviceNode`, `Mount` and `Hook` keep their fields to the
//! crate, so they are made from their serialized form here, the one place
//! that knows it; `ContainerEdits` is built directly.

use crate::spec::versioned_spec;
use crate::Result;
use container_device_interface::specs::config::{
    ContainerEdits, Device, DeviceNode, Hook, Mount, Spec,
};
use serde_json::json;
use std::path::Path;

/// A device's (or the spec's common) edits.
pub type Edits = ContainerEdits;

/// A value of the crate's types from its serialized form, which the
/// callers here build with the types' own field names and kinds.
fn typed<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("a CDI spec part of the schema's shape")
}

/// A character device node: `/dev/<rel>` in the container, `host` on the
/// host, read-write.
pub fn char_node(rel: &str, host: String, major: u32, minor: u32) -> DeviceNode {
    typed(json!({
        "path": format!("/dev/{rel}"),
        "hostPath": host,
        "type": "c",
        "major": major,
        "minor": minor,
        "permissions": "rw",
    }))
}

/// A bind mount of `host` at `container` with `options` (which say `bind`).
pub fn bind(host: String, container: impl Into<String>, options: &[&str]) -> Mount {
    typed(json!({
        "hostPath": host,
        "containerPath": container.into(),
        "options": options,
    }))
}

/// A tmpfs at `container` with `options`.
pub fn tmpfs(container: &str, options: &[&str]) -> Mount {
    typed(json!({
        "hostPath": "tmpfs",
        "containerPath": container,
        "type": "tmpfs",
        "options": options,
    }))
}

/// An OCI hook the runtime runs at `stage` (`createRuntime`, …): `path`
/// with `args` (argv, `args[0]` included), for at most 10 seconds.
pub fn hook(stage: &str, path: String, args: Vec<String>) -> Hook {
    typed(json!({ "hookName": stage, "path": path, "args": args, "timeout": 10 }))
}

/// A `gpuslice cdi hook <kind> <action…>` hook run at `stage`: `gpuslice`
/// is the binary's host path, `host_root` a simulated host's root (None:
/// `/`), named because the hooks run on the host.
pub(crate) fn gpuslice_hook(
    gpuslice: &str,
    stage: &str,
    kind: &str,
    action: &[&str],
    host_root: Option<&Path>,
) -> Hook {
    let mut args: Vec<String> = ["gpuslice", "cdi", "hook", kind]
        .iter()
        .chain(action)
        .map(|a| a.to_string())
        .collect();
    if let Some(root) = host_root {
        args.extend(["--host-root".to_string(), root.display().to_string()]);
    }
    hook(stage, gpuslice.to_string(), args)
}

/// A device of the spec.
pub fn device(name: &str, edits: ContainerEdits) -> Device {
    typed(json!({ "name": name, "containerEdits": edits }))
}

/// Device nodes only.
pub fn nodes(nodes: Vec<DeviceNode>) -> ContainerEdits {
    // Built field by field: the crate keeps some fields to itself.
    let mut e = ContainerEdits::default();
    e.device_nodes = Some(nodes);
    e
}

/// The spec of `kind` holding `devices` and the `common` edits: the
/// oldest version that has every field used, validated.
pub fn spec(kind: &str, devices: Vec<Device>, common: Option<ContainerEdits>) -> Result<Spec> {
    let mut value = json!({
        "cdiVersion": container_device_interface::specs::config::CURRENT_VERSION,
        "kind": kind,
        "devices": devices,
    });
    if let Some(common) = common {
        value["containerEdits"] = json!(common);
    }
    versioned_spec(value)
}
