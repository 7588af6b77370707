//! A test kubelet: the kubelet's side of the device-plugin protocol over
//! real unix sockets. It serves Registration on `<dir>/kubelet.sock`,
//! checks each request the way the kubelet's device manager does (API
//! version, extended resource name, endpoint socket present in the
//! directory), and dials plugins to drive ListAndWatch,
//! GetPreferredAllocation and Allocate. [`PodResources`] serves the
//! kubelet's PodResources API (v1 `List`) on its own socket, listing the
//! pods a test says hold devices. Used by the integration tests and by the
//! hidden `gpuslice device-plugin-selftest`.

use anyhow::{bail, Context, Result};
use gpuslice_k8s::plugin::config::valid_name_part;
use gpuslice_k8s::plugin::server::{dial, spawn_unix_server, API_VERSION, KUBELET_SOCKET};
use gpuslice_k8s::plugin::v1beta1 as api;
use gpuslice_k8s::plugin::v1beta1::device_plugin_client::DevicePluginClient;
use gpuslice_k8s::plugin::v1beta1::registration_server::{Registration, RegistrationServer};
use gpuslice_metrics::pods::v1 as podres;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

pub type Client = DevicePluginClient<tonic::transport::Channel>;

/// A registration the test kubelet accepted, and when.
#[derive(Debug, Clone)]
pub struct Registered {
    pub at: Instant,
    pub req: api::RegisterRequest,
}

struct Reg {
    dir: PathBuf,
    tx: mpsc::UnboundedSender<Registered>,
}

#[tonic::async_trait]
impl Registration for Reg {
    async fn register(
        &self,
        req: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let r = req.into_inner();
        if r.version != API_VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported API version {:?}",
                r.version
            )));
        }
        if !valid_extended_resource(&r.resource_name) {
            return Err(Status::invalid_argument(format!(
                "invalid resource name {:?}",
                r.resource_name
            )));
        }
        if r.endpoint.contains('/') || !self.dir.join(&r.endpoint).exists() {
            return Err(Status::invalid_argument(format!(
                "endpoint {:?} is not a socket in {}",
                r.endpoint,
                self.dir.display()
            )));
        }
        let _ = self.tx.send(Registered {
            at: Instant::now(),
            req: r,
        });
        Ok(Response::new(api::Empty {}))
    }
}

/// `<domain>/<name>`, domain not kubernetes.io, name a DNS-1123 subdomain-ish label.
pub fn valid_extended_resource(name: &str) -> bool {
    let Some((domain, rest)) = name.split_once('/') else {
        return false;
    };
    let ok = valid_name_part;
    ok(domain) && ok(rest) && !domain.ends_with("kubernetes.io")
}

pub struct TestKubelet {
    pub dir: PathBuf,
    rx: mpsc::UnboundedReceiver<Registered>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestKubelet {
    /// Serves Registration on `<dir>/kubelet.sock`. Like the kubelet at
    /// start, first removes every socket in `dir`.
    pub async fn start(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        for e in std::fs::read_dir(dir)?.flatten() {
            use std::os::unix::fs::FileTypeExt;
            if e.file_type().is_ok_and(|t| t.is_socket()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let sock = dir.join(KUBELET_SOCKET);
        let listener = tokio::net::UnixListener::bind(&sock)
            .with_context(|| format!("binding {}", sock.display()))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let reg = Reg {
            dir: dir.to_path_buf(),
            tx,
        };
        let router = tonic::transport::Server::builder().add_service(RegistrationServer::new(reg));
        let (stop, task) = spawn_unix_server(router, listener, "test kubelet".into());
        Ok(TestKubelet {
            dir: dir.to_path_buf(),
            rx,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The next accepted registration.
    pub async fn next_registration(&mut self, timeout: Duration) -> Result<Registered> {
        match tokio::time::timeout(timeout, self.rx.recv()).await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => bail!("test kubelet stopped"),
            Err(_) => bail!("no registration within {timeout:?}"),
        }
    }

    /// Registrations until every name in `names` has registered once.
    pub async fn registrations_of(
        &mut self,
        names: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Registered>> {
        let end = Instant::now() + timeout;
        let mut got: Vec<Registered> = Vec::new();
        while !names
            .iter()
            .all(|n| got.iter().any(|r| r.req.resource_name == *n))
        {
            let left = end.saturating_duration_since(Instant::now());
            got.push(self.next_registration(left).await.with_context(|| {
                format!(
                    "waiting for {names:?}; got {:?}",
                    got.iter().map(|r| &r.req.resource_name).collect::<Vec<_>>()
                )
            })?);
        }
        Ok(got)
    }

    /// A client of the plugin registered with `endpoint`.
    pub async fn dial(&self, endpoint: &str) -> Result<Client> {
        Ok(DevicePluginClient::new(
            dial(&self.dir.join(endpoint)).await?,
        ))
    }

    /// Stops serving and removes kubelet.sock (a kubelet going away).
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
        let _ = std::fs::remove_file(self.dir.join(KUBELET_SOCKET));
    }
}

/// The first list ListAndWatch sends, and the stream for more.
pub async fn first_list(
    client: &mut Client,
) -> Result<(
    Vec<api::Device>,
    tonic::Streaming<api::ListAndWatchResponse>,
)> {
    let mut stream = client.list_and_watch(api::Empty {}).await?.into_inner();
    let first = next_list(&mut stream, Duration::from_secs(5)).await?;
    Ok((first, stream))
}

pub async fn next_list(
    stream: &mut tonic::Streaming<api::ListAndWatchResponse>,
    timeout: Duration,
) -> Result<Vec<api::Device>> {
    match tokio::time::timeout(timeout, stream.message()).await {
        Ok(Ok(Some(m))) => Ok(m.devices),
        Ok(Ok(None)) => bail!("ListAndWatch ended"),
        Ok(Err(e)) => bail!("ListAndWatch: {e}"),
        Err(_) => bail!("no ListAndWatch update within {timeout:?}"),
    }
}

/// Allocate for one container.
pub async fn allocate_one(
    client: &mut Client,
    ids: &[String],
) -> std::result::Result<api::ContainerAllocateResponse, Status> {
    let r = client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            }],
        })
        .await?
        .into_inner();
    r.container_responses
        .into_iter()
        .next()
        .ok_or_else(|| Status::internal("no container response"))
}

/// GetPreferredAllocation for one container.
pub async fn preferred_one(
    client: &mut Client,
    available: &[String],
    must: &[String],
    size: i32,
) -> std::result::Result<Vec<String>, Status> {
    let r = client
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: must.to_vec(),
                allocation_size: size,
            }],
        })
        .await?
        .into_inner();
    Ok(r.container_responses
        .into_iter()
        .next()
        .map(|c| c.device_i_ds)
        .unwrap_or_default())
}

/// One container holding devices, as PodResources `List` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDevices {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub resource: String,
    pub device_ids: Vec<String>,
}

impl PodDevices {
    pub fn new(pod: &str, resource: &str, device_ids: &[String]) -> Self {
        PodDevices {
            namespace: "default".into(),
            pod: pod.into(),
            container: "main".into(),
            resource: resource.into(),
            device_ids: device_ids.to_vec(),
        }
    }
}

type Pods = Arc<Mutex<Vec<PodDevices>>>;

struct Lister(Pods);

#[tonic::async_trait]
impl podres::pod_resources_lister_server::PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<podres::ListPodResourcesRequest>,
    ) -> Result<Response<podres::ListPodResourcesResponse>, Status> {
        let pods = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let pod_resources = pods
            .into_iter()
            .map(|p| podres::PodResources {
                name: p.pod,
                namespace: p.namespace,
                containers: vec![podres::ContainerResources {
                    name: p.container,
                    devices: vec![podres::ContainerDevices {
                        resource_name: p.resource,
                        device_ids: p.device_ids,
                    }],
                }],
            })
            .collect();
        Ok(Response::new(podres::ListPodResourcesResponse {
            pod_resources,
        }))
    }
}

/// The kubelet's PodResources socket, listing what [`PodResources::set`] says.
pub struct PodResources {
    pub socket: PathBuf,
    pods: Pods,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl PodResources {
    pub async fn start(socket: &Path) -> Result<Self> {
        if let Some(d) = socket.parent() {
            std::fs::create_dir_all(d)?;
        }
        let _ = std::fs::remove_file(socket);
        let listener = tokio::net::UnixListener::bind(socket)
            .with_context(|| format!("binding {}", socket.display()))?;
        let pods: Pods = Arc::default();
        let svc = podres::pod_resources_lister_server::PodResourcesListerServer::new(Lister(
            pods.clone(),
        ));
        let router = tonic::transport::Server::builder().add_service(svc);
        let (stop, task) = spawn_unix_server(router, listener, "test PodResources".into());
        Ok(PodResources {
            socket: socket.to_path_buf(),
            pods,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The pods `List` answers with from now on.
    pub fn set(&self, pods: Vec<PodDevices>) {
        *self.pods.lock().unwrap_or_else(|p| p.into_inner()) = pods;
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
