//! A test kubelet: the kubelet's side of DRA plugin registration and of
//! the DRA service, over the plugin's real unix sockets. It checks the
//! registration the way the kubelet's plugin manager and DRA handler do
//! (type `DRAPlugin`, the driver's name, an endpoint socket that exists, a
//! supported service version it knows), reports the status back, and
//! dials the endpoint with the client of the version it chose.
//!
//! On the wire it registers as the real kubelet does: its plugin watcher
//! is grpc-go dialled with the socket path and no authority option, which
//! sends the path percent-encoded as `:authority` (see
//! `gpuslice_k8s::grpc_wire`), GetInfo then NotifyRegistrationStatus on one
//! connection. The DRA service itself is dialled with `localhost`-like
//! authority, as the kubelet's DRA client does.

use gpuslice_dra::api::registration::{PluginInfo, RegistrationStatus};
use gpuslice_dra::api::{v1, v1beta1};
use gpuslice_dra::server::{get_info_on, NOTIFY_REGISTRATION_STATUS};
use gpuslice_k8s::grpc_wire::{grpc_go_authority, WireConn, WireError};
use gpuslice_k8s::plugin::server::dial;
use prost::Message;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub type V1 = v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>;
pub type V1beta1 = v1beta1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>;

pub struct Registered {
    pub info: PluginInfo,
    pub v1: V1,
    pub v1beta1: V1beta1,
}

/// Registers the plugin whose registration socket is `reg_socket`, as
/// the kubelet would on seeing it appear; panics on what the kubelet
/// would refuse (the refusal is reported to the plugin first) and when
/// the plugin cannot be registered at all (the kubelet's log then says
/// `RegisterPlugin error -- failed to get plugin info using RPC GetInfo`).
pub async fn register(reg_socket: &Path, driver: &str) -> Registered {
    let (info, refusal) = registration(reg_socket.to_path_buf(), driver.to_string())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {}, err: {e}",
                reg_socket.display()
            )
        });
    if let Some(why) = refusal {
        panic!("the kubelet would refuse this registration: {why}");
    }
    let ch = dial(Path::new(&info.endpoint)).await.unwrap();
    Registered {
        v1: V1::new(ch.clone()),
        v1beta1: V1beta1::new(ch),
        info,
    }
}

/// `Registered`'s `$method`: the kubelet's `$call` in API version `$v`
/// for the claims `(namespace, name, uid)`, answered.
macro_rules! dra_call {
    ($v:ident, $method:ident, $call:ident, $request:ident, $response:ident) => {
        impl Registered {
            pub async fn $method(
                &mut self,
                claims: &[(&str, &str, &str)],
            ) -> Result<$v::$response, tonic::Status> {
                let claims = claims
                    .iter()
                    .map(|(namespace, name, uid)| $v::Claim {
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                        uid: uid.to_string(),
                    })
                    .collect();
                let r = self.$v.$call($v::$request { claims }).await?;
                Ok(r.into_inner())
            }
        }
    };
}

dra_call! { v1, prepare, node_prepare_resources, NodePrepareResourcesRequest, NodePrepareResourcesResponse }
dra_call! { v1, unprepare, node_unprepare_resources, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse }
dra_call! { v1beta1, prepare_v1beta1, node_prepare_resources, NodePrepareResourcesRequest, NodePrepareResourcesResponse }
dra_call! { v1beta1, unprepare_v1beta1, node_unprepare_resources, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse }

/// GetInfo with grpc-go's authority, then the kubelet's verdict sent back
/// with NotifyRegistrationStatus on the same connection.
async fn registration(
    sock: PathBuf,
    driver: String,
) -> Result<(PluginInfo, Option<String>), WireError> {
    tokio::task::spawn_blocking(move || {
        let mut conn =
            WireConn::connect(&sock, &grpc_go_authority(&sock), Duration::from_secs(10))?;
        let info = get_info_on(&mut conn)?;
        let refusal = why_refused(&info, &driver);
        let status = RegistrationStatus {
            plugin_registered: refusal.is_none(),
            error: refusal.clone().unwrap_or_default(),
        };
        conn.call(NOTIFY_REGISTRATION_STATUS, &status.encode_to_vec())?;
        Ok((info, refusal))
    })
    .await
    .expect("the registration thread panicked")
}

fn why_refused(info: &PluginInfo, driver: &str) -> Option<String> {
    if info.r#type != "DRAPlugin" {
        return Some(format!("type {:?}, not DRAPlugin", info.r#type));
    }
    if info.name != driver {
        return Some(format!("name {:?}, expected {driver:?}", info.name));
    }
    let is_socket = std::fs::metadata(&info.endpoint)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false);
    if !is_socket {
        return Some(format!("endpoint {:?} is not a socket", info.endpoint));
    }
    let known = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];
    if !info
        .supported_versions
        .iter()
        .any(|v| known.contains(&v.as_str()))
    {
        return Some(format!("no known version in {:?}", info.supported_versions));
    }
    None
}
