//! The DevicePlugin gRPC service of one resource, and registration with
//! the kubelet.

use super::health::Snapshot;
use super::preferred::preferred;
use super::resources::Plan;
use super::v1beta1 as api;
use super::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};

pub const API_VERSION: &str = "v1beta1";
pub const KUBELET_SOCKET: &str = "kubelet.sock";

#[derive(Clone)]
pub struct Service {
    pub plan: Arc<Plan>,
    pub res: usize,
    pub health: watch::Receiver<Snapshot>,
}

impl Service {
    fn resource(&self) -> &super::resources::Resource {
        &self.plan.resources[self.res]
    }

    fn list(&self, snap: &Snapshot) -> api::ListAndWatchResponse {
        api::ListAndWatchResponse {
            devices: self
                .resource()
                .devices(&|g| snap.unhealthy.contains_key(&g)),
        }
    }
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<api::ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut health = self.health.clone();
        let me = self.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let list = me.list(&health.borrow_and_update());
                // The full list on every change (and only on a change).
                if last.as_ref() != Some(&list) {
                    if tx.send(Ok(list.clone())).await.is_err() {
                        return; // the kubelet hung up
                    }
                    last = Some(list);
                }
                tokio::select! {
                    r = health.changed() => if r.is_err() { return },
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let mut out = api::PreferredAllocationResponse::default();
        for c in &req.get_ref().container_requests {
            let size = usize::try_from(c.allocation_size)
                .map_err(|_| Status::invalid_argument("allocation_size is negative"))?;
            let ids = preferred(
                &self.plan.inv,
                self.resource(),
                &c.available_device_i_ds,
                &c.must_include_device_i_ds,
                size,
                self.plan.cfg.sharing.spread,
            )
            .map_err(|e| Status::invalid_argument(e.0))?;
            out.container_responses
                .push(api::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(out))
    }

    async fn allocate(
        &self,
        req: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let mut out = api::AllocateResponse::default();
        for c in &req.get_ref().container_requests {
            let r = self
                .plan
                .allocate(self.resource(), &c.devices_ids)
                .map_err(|e| Status::invalid_argument(e.0))?;
            out.container_responses.push(r);
        }
        Ok(Response::new(out))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

pub fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// A served socket; dropping it stops the server and removes the socket.
pub struct Served {
    pub socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Served {
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        // A graceful stop waits for open streams (a ListAndWatch the old
        // kubelet never closed): give it a moment, then drop the server.
        if let Some(mut t) = self.task.take() {
            if tokio::time::timeout(Duration::from_millis(100), &mut t)
                .await
                .is_err()
            {
                t.abort();
            }
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

/// Binds `<dir>/<endpoint>` (replacing a stale socket) and serves `svc` there.
pub fn serve(dir: &Path, svc: Service) -> Result<Served> {
    let socket = dir.join(svc.resource().endpoint());
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket)
        .with_context(|| format!("cannot listen on {}", socket.display()))?;
    let name = svc.resource().name.clone();
    let router = tonic::transport::Server::builder().add_service(DevicePluginServer::new(svc));
    let (stop, task) = spawn_unix_server(router, listener, format!("{name}: server"));
    Ok(Served {
        socket,
        stop: Some(stop),
        task: Some(task),
    })
}

/// Serves `router` on `listener` in a task of its own until the returned
/// sender is sent on or dropped; an error that ends it is logged as
/// "`what` ended".
pub fn spawn_unix_server(
    router: tonic::transport::server::Router,
    listener: tokio::net::UnixListener,
    what: String,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let r = router
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = r {
            tracing::warn!("{what} ended: {e}");
        }
    });
    (stop, task)
}

/// A gRPC channel over a unix socket.
pub async fn dial(socket: &Path) -> Result<tonic::transport::Channel> {
    gpuslice_metrics::pods::dial_unix(socket, Some(Duration::from_secs(5)))
        .await
        .with_context(|| format!("connecting to {}", socket.display()))
}

/// Registers `resource_name` served at `endpoint` with the kubelet at `<dir>/kubelet.sock`.
pub async fn register(dir: &Path, endpoint: &str, resource_name: &str) -> Result<()> {
    let fut = async {
        let ch = dial(&dir.join(KUBELET_SOCKET)).await?;
        let mut client = api::registration_client::RegistrationClient::new(ch);
        client
            .register(api::RegisterRequest {
                version: API_VERSION.into(),
                endpoint: endpoint.into(),
                resource_name: resource_name.into(),
                options: Some(options()),
            })
            .await
            .with_context(|| format!("registering {resource_name}"))?;
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .context("registering: the kubelet did not answer in 10 s")?
}
