//! What a pod the claim is reserved for may do on the node that the
//! claim's caps cannot hold against, from its spec (read at Prepare):
//! - `privileged` containers reach every GPU's node, unmount the shim's
//!   preload and pass any cap;
//! - `CAP_SYS_ADMIN` (or `ALL`) added: the same through mounts;
//! - `hostPID`: the host's processes, so other slices' ledgers through
//!   `/proc/<pid>/root`;
//! - `hostIPC`: the host's shared memory and semaphores;
//! - `hostNetwork`: the node's loopback services (the host-pid resolver's
//!   and the plugins' sockets are files, but an exporter or a kubelet
//!   port on localhost is reachable), so it is flagged with the rest.
//!
//! Kubernetes allows all of these; a cluster that wants the caps to hold
//! forbids them for GPU pods (docs/security.md). The plugin says so: a
//! warning in its log, an `Enforced=False` condition in the claim's status,
//! the slice marked in `gpuslice slices` and the exporter, and with
//! `--refuse-unenforceable` it refuses to prepare the claim.

use k8s_openapi::api::core::v1::{Container, Pod};

/// Why `pod` could escape its claim's caps; empty when nothing is seen.
pub fn unenforceable(pod: &Pod) -> Vec<String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let mut why = Vec::new();
    if spec.host_pid == Some(true) {
        why.push(format!("pod {name}: hostPID"));
    }
    if spec.host_ipc == Some(true) {
        why.push(format!("pod {name}: hostIPC"));
    }
    if spec.host_network == Some(true) {
        why.push(format!("pod {name}: hostNetwork"));
    }
    let containers: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    for c in containers {
        let Some(sc) = &c.security_context else {
            continue;
        };
        if sc.privileged == Some(true) {
            why.push(format!("container {}: privileged", c.name));
        }
        let added = sc.capabilities.as_ref().and_then(|k| k.add.as_ref());
        if added
            .into_iter()
            .flatten()
            .any(|a| matches!(a.trim_start_matches("CAP_"), "SYS_ADMIN" | "ALL"))
        {
            why.push(format!("container {}: CAP_SYS_ADMIN added", c.name));
        }
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn privileged_host_namespaces_and_sys_admin_are_seen() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "hostPID": true,
                "hostNetwork": true,
                "containers": [
                    {"name": "a", "securityContext": {"privileged": true}},
                    {"name": "b", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
                    {"name": "c", "securityContext": {"privileged": false}},
                ],
            },
        }))
        .unwrap();
        assert_eq!(
            unenforceable(&pod),
            [
                "pod p: hostPID",
                "pod p: hostNetwork",
                "container a: privileged",
                "container b: CAP_SYS_ADMIN added"
            ]
        );
        let plain: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "q"}, "spec": {"containers": [{"name": "a"}]},
        }))
        .unwrap();
        assert!(unenforceable(&plain).is_empty());
    }
}
