//! The plugin's two sockets: the DRA service (v1 and v1beta1 on one
//! socket, `<plugins dir>/<driver>/dra.sock`, with the devices' health
//! service beside it) and the registration
//! service the kubelet's plugin watcher finds in its registry directory
//! (`<registry dir>/<driver>-reg.sock`). The registration socket is
//! created last, once the DRA socket answers, because its appearance is
//! what makes the kubelet dial us.

use crate::api::registration::registration_server::{Registration, RegistrationServer};
use crate::api::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::driver::{ClaimRef, Driver};
use crate::feed::NodeFeed;
use crate::{PLUGIN_TYPE, SUPPORTED_VERSIONS};
use gpuslice_k8s::grpc_wire::{WireConn, WireError};
use gpuslice_k8s::plugin::server::spawn_unix_server;
use prost::Message;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use thiserror::Error;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

#[derive(Debug, Error)]
pub enum ServeError {
    #[error("cannot listen on {0}: {1}")]
    Listen(PathBuf, std::io::Error),
    #[error("cannot create {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("{0}: another plugin serves this socket (a second gpuslice dra, or another driver of this name); stop it first")]
    Taken(PathBuf),
}

/// Where the sockets go.
#[derive(Debug, Clone)]
pub struct Sockets {
    /// The kubelet's plugins directory (`/var/lib/kubelet/plugins`).
    pub plugins_dir: PathBuf,
    /// The kubelet's plugin registry (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
}

impl Sockets {
    pub fn dra(&self, driver: &str) -> PathBuf {
        self.plugins_dir.join(driver).join("dra.sock")
    }
    pub fn registration(&self, driver: &str) -> PathBuf {
        self.registry_dir.join(format!("{driver}-reg.sock"))
    }
}

/// The registration service's methods, as the kubelet calls them.
pub const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
pub const NOTIFY_REGISTRATION_STATUS: &str =
    "/pluginregistration.Registration/NotifyRegistrationStatus";

/// GetInfo on `conn` as the kubelet's plugin watcher calls it.
pub fn get_info_on(conn: &mut WireConn) -> Result<PluginInfo, WireError> {
    let raw = conn.call(GET_INFO, &InfoRequest {}.encode_to_vec())?;
    PluginInfo::decode(raw.as_slice()).map_err(|e| WireError::Malformed(e.to_string()))
}

/// GetInfo on the registration socket `socket`, with `authority` on the
/// wire (`grpc_wire::grpc_go_authority` for what the kubelet sends).
pub fn get_info(
    socket: &Path,
    authority: &str,
    timeout: std::time::Duration,
) -> Result<PluginInfo, WireError> {
    get_info_on(&mut WireConn::connect(socket, authority, timeout)?)
}

/// What the kubelet told us about our registration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrationState {
    pub registered: bool,
    pub error: String,
}

struct Reg {
    name: String,
    endpoint: PathBuf,
    status: Arc<Mutex<RegistrationState>>,
}

#[tonic::async_trait]
impl Registration for Reg {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: self.name.clone(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let r = req.into_inner();
        if r.plugin_registered {
            tracing::info!("registered with the kubelet");
        } else {
            tracing::error!("the kubelet refused the registration: {}", r.error);
        }
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = RegistrationState {
            registered: r.plugin_registered,
            error: r.error,
        };
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The DRA service of one API version: the generated types of that
/// version around the version-free [`Driver`]. The versions' messages are
/// field for field the same, so one body serves both.
macro_rules! dra_service {
    ($ver:ident) => {
        pub mod $ver {
            use super::*;
            use crate::api::$ver as api;
            use api::dra_plugin_server::DraPlugin;

            pub struct Service(pub Arc<Driver>);

            fn refs(claims: Vec<api::Claim>) -> Vec<ClaimRef> {
                claims
                    .into_iter()
                    .map(|c| ClaimRef {
                        namespace: c.namespace,
                        name: c.name,
                        uid: c.uid,
                    })
                    .collect()
            }

            #[tonic::async_trait]
            impl DraPlugin for Service {
                async fn node_prepare_resources(
                    &self,
                    req: Request<api::NodePrepareResourcesRequest>,
                ) -> Result<Response<api::NodePrepareResourcesResponse>, Status> {
                    let out = self.0.prepare(&refs(req.into_inner().claims)).await;
                    let claims = out
                        .into_iter()
                        .map(|(uid, r)| {
                            let resp = match r {
                                Ok(devs) => api::NodePrepareResourceResponse {
                                    devices: devs
                                        .into_iter()
                                        .map(|d| api::Device {
                                            request_names: vec![d.request],
                                            pool_name: d.pool,
                                            device_name: d.device,
                                            cdi_device_ids: vec![d.cdi_device_id],
                                        })
                                        .collect(),
                                    error: String::new(),
                                },
                                Err(e) => api::NodePrepareResourceResponse {
                                    devices: vec![],
                                    error: crate::one_line(&e),
                                },
                            };
                            (uid, resp)
                        })
                        .collect();
                    Ok(Response::new(api::NodePrepareResourcesResponse { claims }))
                }

                async fn node_unprepare_resources(
                    &self,
                    req: Request<api::NodeUnprepareResourcesRequest>,
                ) -> Result<Response<api::NodeUnprepareResourcesResponse>, Status> {
                    let out = self.0.unprepare(&refs(req.into_inner().claims)).await;
                    let claims = out
                        .into_iter()
                        .map(|(uid, r)| {
                            let error = r.err().map(|e| crate::one_line(&e)).unwrap_or_default();
                            (uid, api::NodeUnprepareResourceResponse { error })
                        })
                        .collect();
                    Ok(Response::new(api::NodeUnprepareResourcesResponse {
                        claims,
                    }))
                }
            }

            pub fn server(d: Arc<Driver>) -> api::dra_plugin_server::DraPluginServer<Service> {
                api::dra_plugin_server::DraPluginServer::new(Service(d))
            }
        }
    };
}

dra_service!(v1);
dra_service!(v1beta1);

/// The served sockets; dropping it stops both servers and removes them.
pub struct Served {
    pub dra_socket: PathBuf,
    pub registration_socket: PathBuf,
    pub registration: Arc<Mutex<RegistrationState>>,
    stops: Vec<oneshot::Sender<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        for s in self.stops.drain(..) {
            let _ = s.send(());
        }
        // The registration socket first: the kubelet stops dialing us.
        let _ = std::fs::remove_file(&self.registration_socket);
        let _ = std::fs::remove_file(&self.dra_socket);
    }
}

fn listen(path: &Path) -> Result<tokio::net::UnixListener, ServeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| ServeError::Dir(dir.into(), e))?;
    }
    // A socket left by a previous run (we were killed): replace it.
    let _ = std::fs::remove_file(path);
    tokio::net::UnixListener::bind(path).map_err(|e| ServeError::Listen(path.into(), e))
}

/// Serves the registration service of the plugin `name`, whose DRA socket
/// is `endpoint`, at `socket`; sending on (or dropping) the returned
/// sender stops it. The kubelet's answers land in the returned state.
pub fn serve_registration(
    name: String,
    endpoint: &Path,
    socket: &Path,
) -> Result<(oneshot::Sender<()>, Arc<Mutex<RegistrationState>>), ServeError> {
    let reg = listen(socket)?;
    let status = Arc::new(Mutex::new(RegistrationState::default()));
    let svc = Reg {
        name,
        endpoint: endpoint.to_path_buf(),
        status: status.clone(),
    };
    let router = tonic::transport::Server::builder().add_service(RegistrationServer::new(svc));
    let (stop_reg, _) = spawn_unix_server(router, reg, "registration server".into());
    Ok((stop_reg, status))
}

/// Serves the driver (both API versions) and its devices' health (every
/// version of the health service: the kubelet retries a missing one every
/// few seconds, forever) on the DRA socket, then the registration socket.
pub fn serve(
    driver: Arc<Driver>,
    sockets: &Sockets,
    health: NodeFeed,
) -> Result<Served, ServeError> {
    let name = driver.driver_name().to_string();
    let dra_socket = sockets.dra(&name);
    let registration_socket = sockets.registration(&name);
    // One a live plugin answers on is not ours to take (before either is
    // touched).
    for s in [&dra_socket, &registration_socket] {
        if std::os::unix::net::UnixStream::connect(s).is_ok() {
            return Err(ServeError::Taken(s.clone()));
        }
    }
    let dra = listen(&dra_socket)?;
    let router = tonic::transport::Server::builder()
        .add_service(v1::server(driver.clone()))
        .add_service(v1beta1::server(driver))
        .add_service(crate::health::v1alpha1::server(health.clone()))
        .add_service(crate::health::v1beta1::server(health.clone()))
        .add_service(crate::health::v1::server(health));
    let (stop_dra, _) = spawn_unix_server(router, dra, "DRA server".into());
    let (stop_reg, status) = serve_registration(name, &dra_socket, &registration_socket)?;
    Ok(Served {
        dra_socket,
        registration_socket,
        registration: status,
        stops: vec![stop_dra, stop_reg],
    })
}
