//! A test kubelet: the kubelet's side of DRA plugin registration and of
//! the DRA service, over the plugin's real unix sockets. It checks the
//! registration the way the kubelet's plugin manager and DRA handler do
//! (type `DRAPlugin`, the driver's name, an endpoint socket that exists, a
//! supported service version it knows), reports the status back, and
//! dials the endpoint with the client of the version it chose.

use gpuslice_dra::api::registration::registration_client::RegistrationClient;
use gpuslice_dra::api::registration::{InfoRequest, PluginInfo, RegistrationStatus};
use gpuslice_dra::api::{v1, v1beta1};
use gpuslice_k8s::plugin::server::dial;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

pub type V1 = v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>;
pub type V1beta1 = v1beta1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>;

pub struct Registered {
    pub info: PluginInfo,
    pub v1: V1,
    pub v1beta1: V1beta1,
}

/// Registers the plugin whose registration socket is `reg_socket`, as
/// the kubelet would on seeing it appear; panics on what the kubelet
/// would refuse (the refusal is reported to the plugin first).
pub async fn register(reg_socket: &Path, driver: &str) -> Registered {
    let mut reg = RegistrationClient::new(dial(reg_socket).await.unwrap());
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    let refusal = why_refused(&info, driver);
    reg.notify_registration_status(RegistrationStatus {
        plugin_registered: refusal.is_none(),
        error: refusal.clone().unwrap_or_default(),
    })
    .await
    .unwrap();
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
