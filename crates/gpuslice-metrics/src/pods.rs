//! Which containers hold which GPU: the kubelet PodResources API v1 `List`
//! over its unix socket. Device IDs are a GPU's UUID, or `<uuid>::<r>` for
//! replica `r` of a shared GPU; both map back to the GPU (MIG UUIDs map to
//! their parent GPU).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The generated client and server (the server is for tests).
pub mod v1 {
    tonic::include_proto!("v1");
}

/// Default socket path (below the host root).
pub const DEFAULT_SOCKET: &str = "var/lib/kubelet/pod-resources/kubelet.sock";

/// One device assigned to one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub resource: String,
    /// As the kubelet reports it (`GPU-…`, `GPU-…::3`, `MIG-…`).
    pub device_id: String,
    /// `device_id` without a replica suffix.
    pub uuid: String,
}

/// `GPU-x::3` → `GPU-x`; anything else unchanged.
pub fn device_uuid(id: &str) -> &str {
    match id.rsplit_once("::") {
        Some((uuid, r)) if !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()) => uuid,
        _ => id,
    }
}

/// Flattens a List response.
pub fn assignments(resp: &v1::ListPodResourcesResponse) -> Vec<Assignment> {
    let mut out = Vec::new();
    for pod in &resp.pod_resources {
        for c in &pod.containers {
            for d in &c.devices {
                for id in &d.device_ids {
                    out.push(Assignment {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: c.name.clone(),
                        resource: d.resource_name.clone(),
                        device_id: id.clone(),
                        uuid: device_uuid(id).to_string(),
                    });
                }
            }
        }
    }
    out
}

/// The kubelet's PodResources API could not be read.
#[derive(Debug, thiserror::Error)]
#[error("kubelet PodResources at {}", socket.display())]
pub struct PodsError {
    pub socket: PathBuf,
    #[source]
    pub cause: PodsCause,
}

/// What went wrong talking to the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum PodsCause {
    #[error("connecting")]
    Connect(#[source] tonic::transport::Error),
    #[error("List")]
    List(#[source] Box<tonic::Status>),
    #[error("timed out")]
    TimedOut(#[source] tokio::time::error::Elapsed),
}

/// A gRPC channel to the server on the unix socket `socket` (the
/// kubelet's, a device plugin's), connected within `connect_timeout` when
/// one is given.
pub async fn dial_unix(
    socket: &Path,
    connect_timeout: Option<Duration>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    // The URI is a placeholder: the connector dials the socket.
    let mut endpoint = tonic::transport::Endpoint::from_static("http://[::1]:0");
    if let Some(timeout) = connect_timeout {
        endpoint = endpoint.connect_timeout(timeout);
    }
    endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
}

/// Lists the node's pods' devices through `socket`, within `timeout`.
pub async fn list(socket: &Path, timeout: Duration) -> Result<Vec<Assignment>, PodsError> {
    let path: PathBuf = socket.to_path_buf();
    let fut = async move {
        let channel = dial_unix(&path, None).await.map_err(PodsCause::Connect)?;
        let mut client = v1::pod_resources_lister_client::PodResourcesListerClient::new(channel);
        let resp = client
            .list(v1::ListPodResourcesRequest {})
            .await
            .map_err(|status| PodsCause::List(Box::new(status)))?;
        Ok(assignments(resp.get_ref()))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(PodsCause::TimedOut)
        .and_then(|listed| listed)
        .map_err(|cause| PodsError {
            socket: socket.to_path_buf(),
            cause,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_ids_map_to_their_gpu() {
        assert_eq!(device_uuid("GPU-abc::3"), "GPU-abc");
        assert_eq!(device_uuid("GPU-abc"), "GPU-abc");
        assert_eq!(device_uuid("MIG-abc"), "MIG-abc");
        assert_eq!(device_uuid("GPU-abc::"), "GPU-abc::");
        assert_eq!(device_uuid("GPU-abc::x"), "GPU-abc::x");
    }

    #[test]
    fn flattens_a_list_response() {
        let resp = v1::ListPodResourcesResponse {
            pod_resources: vec![v1::PodResources {
                name: "p".into(),
                namespace: "ns".into(),
                containers: vec![v1::ContainerResources {
                    name: "c".into(),
                    devices: vec![v1::ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: vec!["GPU-a::1".into(), "GPU-b".into()],
                    }],
                }],
            }],
        };
        let a = assignments(&resp);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].uuid, "GPU-a");
        assert_eq!(a[0].device_id, "GPU-a::1");
        assert_eq!((a[1].namespace.as_str(), a[1].pod.as_str()), ("ns", "p"));
    }
}
