//! The API server calls the driver makes, behind [`ClaimSource`] and
//! [`SliceApi`] so the driver is tested against a local test double
//! (`gpuslice_testkit::fakeapi`): claims are read with GET; ResourceSlices
//! are listed, watched (bookmarks, 410 Gone) and written.
//!
//! [`KubeApi`] implements them with a kube-rs [`kube::Client`] (rustls,
//! no OpenSSL). [`ApiTarget`] says where it connects and as whom:
//! - by default [`kube::Config::infer`]: a kubeconfig (`$KUBECONFIG`,
//!   `~/.kube/config`) if there is one, else the pod's service account
//!   (`KUBERNETES_SERVICE_HOST`/`_PORT`, the token and CA under
//!   `/var/run/secrets/kubernetes.io/serviceaccount/`, both re-read as
//!   they rotate): TLS verified against the cluster CA, the driver's own
//!   RBAC rights;
//! - `--api-server URL` (`https://…` verified against the system roots, or
//!   `http://…` for a test double) and `--token-file` instead (the token
//!   is re-read as it rotates).

use crate::one_line;
use futures_util::TryStreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchParams};
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ApiError {
    #[error("resourceclaim {0}/{1} not found")]
    NotFound(String, String),
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url}: {why}")]
    Transport { url: String, why: String },
    #[error("{url}: bad object: {why}")]
    Decode { url: String, why: String },
    #[error("API server URL {0:?}: expected http(s)://HOST[:PORT] (e.g. https://10.96.0.1:443, or http://127.0.0.1:PORT for a test double)")]
    Url(String),
    #[error("API server URL {0:?}: a bearer token goes over plain HTTP only to a loopback address (a local test double); use https://")]
    PlainHttpToken(String),
    #[error("--token-file {0}: {1} (expected a file holding a bearer token)")]
    Token(PathBuf, String),
    /// No `--api-server`, and neither a kubeconfig nor the in-cluster
    /// service account is there.
    #[error("node {0:?} is not known to the API server: --node-name (NODE_NAME) must be this node's name as `kubectl get nodes` lists it (the pod's spec.nodeName)")]
    NoNode(String),
    #[error("finding the API server: no kubeconfig ($KUBECONFIG, ~/.kube/config) and no in-cluster service account (KUBERNETES_SERVICE_HOST, /var/run/secrets/kubernetes.io/serviceaccount/): {0}")]
    Config(String),
}

/// The claim calls the driver makes.
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync {
    /// `GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}`.
    async fn get_claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ApiError>;
    /// `GET /api/v1/namespaces/{ns}/pods/{name}`: a pod the claim is
    /// reserved for, to see what it may do on the node.
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ApiError>;
    /// Makes `devices` this driver's entries of the claim's
    /// `status.devices`: a server-side apply of the status subresource
    /// (`PATCH …/resourceclaims/{name}/status`, field manager `driver`),
    /// which keeps other drivers' entries and drops ours not given (an
    /// empty list removes them all).
    async fn set_device_status(
        &self,
        namespace: &str,
        name: &str,
        driver: &str,
        devices: Vec<AllocatedDeviceStatus>,
    ) -> Result<(), ApiError>;
    /// Posts a Warning Event about a claim
    /// (`POST /apis/events.k8s.io/v1/namespaces/{ns}/events`), what
    /// `kubectl describe resourceclaim` and `kubectl get events` show.
    async fn warn(&self, event: &ClaimWarning) -> Result<(), ApiError>;
}

/// A Warning Event about a claim: from `reporter` (the driver's name) on
/// `node`, `reason` (CamelCase, at most 128 bytes) for `action` and a
/// `note` (cut to the API's 1 KiB).
#[derive(Debug, Clone)]
pub struct ClaimWarning {
    pub namespace: String,
    pub claim: String,
    pub uid: String,
    pub reporter: String,
    pub node: String,
    pub action: &'static str,
    pub reason: &'static str,
    pub note: String,
}

impl ClaimWarning {
    /// The events.k8s.io/v1 Event, as the API server validates it at
    /// create: a name of its own (`<claim>.<hex nanoseconds>`, as
    /// client-go names them), eventTime set, the reporting controller a
    /// qualified name, none of the legacy fields.
    pub fn event(&self) -> k8s_openapi::api::events::v1::Event {
        use k8s_openapi::api::core::v1::ObjectReference;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut note = self.note.clone();
        if note.len() > EVENT_NOTE_MAX {
            let mut cut = EVENT_NOTE_MAX - 3;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        k8s_openapi::api::events::v1::Event {
            metadata: ObjectMeta {
                name: Some(format!("{}.{:x}", self.claim, now.as_nanosecond())),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some("Warning".into()),
            reason: Some(self.reason.into()),
            action: Some(self.action.into()),
            note: Some(note),
            reporting_controller: Some(format!("{}/kubelet-plugin", self.reporter)),
            reporting_instance: Some(
                format!("{}/kubelet-plugin-{}", self.reporter, self.node)
                    .chars()
                    .take(128)
                    .collect(),
            ),
            regarding: Some(ObjectReference {
                api_version: Some("resource.k8s.io/v1".into()),
                kind: Some("ResourceClaim".into()),
                name: Some(self.claim.clone()),
                namespace: Some(self.namespace.clone()),
                uid: Some(self.uid.clone()),
                ..ObjectReference::default()
            }),
            ..Default::default()
        }
    }
}

/// The API server's limit on an Event's note (`NoteLengthLimit`).
const EVENT_NOTE_MAX: usize = 1024;

/// Where the API server is and which credentials the driver shows it
/// (see the module docs), checked before anything connects.
#[derive(Debug, Clone, Default)]
pub struct ApiTarget {
    api_server: Option<http::Uri>,
    token_file: Option<PathBuf>,
}

impl ApiTarget {
    /// `api_server` None: [`kube::Config::infer`]. A bad URL or an
    /// unreadable or empty token file is an error here.
    pub fn new(api_server: Option<&str>, token_file: Option<&Path>) -> Result<Self, ApiError> {
        let api_server = api_server.map(parse_url).transpose()?;
        if let Some(f) = token_file {
            let token = std::fs::read_to_string(f)
                .map_err(|e| ApiError::Token(f.to_path_buf(), e.to_string()))?;
            if token.trim().is_empty() {
                return Err(ApiError::Token(f.to_path_buf(), "empty".into()));
            }
            // kube-rs sends (and, as it rotates, re-reads) the file as it
            // is, where client-go trims it: a newline would make every
            // request fail.
            if token.trim() != token {
                return Err(ApiError::Token(
                    f.to_path_buf(),
                    "the token has whitespace around it (a trailing newline? write it with printf %s)".into(),
                ));
            }
        }
        if let (Some(url), Some(_)) = (&api_server, token_file) {
            if url.scheme_str() == Some("http") && !is_loopback(url) {
                return Err(ApiError::PlainHttpToken(url.to_string()));
            }
        }
        Ok(ApiTarget {
            api_server,
            token_file: token_file.map(Path::to_path_buf),
        })
    }

    /// The client. Must run on the tokio runtime that will use it (the
    /// client's request queue is a task there).
    pub async fn connect(&self) -> Result<KubeApi, ApiError> {
        let config = match &self.api_server {
            Some(url) => kube::Config::new(url.clone()),
            None => kube::Config::infer()
                .await
                .map_err(|e| ApiError::Config(one_line(&e)))?,
        };
        self.client(config)
    }

    /// The client of `config` with the `--token-file` (re-read as it
    /// rotates) in place of its credentials.
    fn client(&self, mut config: kube::Config) -> Result<KubeApi, ApiError> {
        if let Some(f) = &self.token_file {
            config.auth_info = kube::config::AuthInfo {
                token_file: Some(f.display().to_string()),
                ..Default::default()
            };
        }
        KubeApi::with_config(config)
    }
}

/// `http(s)://HOST[:PORT]`, an optional path prefix (a proxy's), no query.
fn parse_url(s: &str) -> Result<http::Uri, ApiError> {
    let bad = || ApiError::Url(s.into());
    let uri: http::Uri = s.parse().map_err(|_| bad())?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    let host_ok = uri.host().is_some_and(|h| !h.is_empty());
    let no_userinfo = uri.authority().is_some_and(|a| !a.as_str().contains('@'));
    if !scheme_ok || !host_ok || !no_userinfo || uri.query().is_some() {
        return Err(bad());
    }
    Ok(uri)
}

/// Whether the URL's host is `localhost` or a loopback address.
fn is_loopback(url: &http::Uri) -> bool {
    let host = url.host().unwrap_or_default();
    let ip = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || ip
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
}

/// `resource.k8s.io/v1` through kube-rs (see the module docs).
#[derive(Clone)]
pub struct KubeApi {
    client: kube::Client,
    /// The cluster URL, for error messages.
    base: String,
    timeout: Duration,
    /// The Node that owns the slices written ([`KubeApi::own_slices_by`]).
    owner: std::sync::OnceLock<OwnerReference>,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApi").field("base", &self.base).finish()
    }
}

impl KubeApi {
    /// A client of the API server at `url` (`--api-server`), with the
    /// bearer token in `token_file`. Must run inside a tokio runtime.
    pub fn new(url: &str, token_file: Option<&Path>) -> Result<Self, ApiError> {
        let target = ApiTarget::new(Some(url), token_file)?;
        let url = target.api_server.clone().ok_or(ApiError::Url(url.into()))?;
        target.client(kube::Config::new(url))
    }

    fn with_config(config: kube::Config) -> Result<Self, ApiError> {
        let base = config.cluster_url.to_string().trim_end_matches('/').into();
        let client = kube::Client::try_from(config).map_err(|e| ApiError::Transport {
            url: String::new(),
            why: format!("building the API client: {}", one_line(&e)),
        })?;
        Ok(KubeApi {
            client,
            base,
            timeout: Duration::from_secs(10),
            owner: std::sync::OnceLock::new(),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Reads `node`'s Node object and makes it the owner of every slice
    /// written from now on. A node the API server does not have is an
    /// error ([`ApiError::NoNode`]): the plugin was given a wrong name.
    pub async fn own_slices_by(&self, node: &str) -> Result<(), ApiError> {
        let path = format!("/api/v1/nodes/{node}");
        let api: Api<Node> = Api::all(self.client.clone());
        let n = match self.call(&path, api.get(node)).await {
            Err(ApiError::Status { status: 404, .. }) => return Err(ApiError::NoNode(node.into())),
            r => r?,
        };
        let uid = n.metadata.uid.unwrap_or_default();
        let _ = self.owner.set(node_owner(node, &uid));
        Ok(())
    }

    fn slices(&self) -> Api<ResourceSlice> {
        Api::all(self.client.clone())
    }

    /// Runs a call bounded by the timeout; kube's errors as ours.
    async fn call<T>(
        &self,
        path: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(ApiError::Transport {
                url: self.url(path),
                why: format!("no answer in {:?}", self.timeout),
            }),
            Ok(r) => r.map_err(|e| self.error(path, e)),
        }
    }

    fn error(&self, path: &str, e: kube::Error) -> ApiError {
        let url = self.url(path);
        match e {
            kube::Error::Api(s) => ApiError::Status {
                url,
                status: s.code,
                body: s.message.chars().take(200).collect(),
            },
            kube::Error::SerdeError(e) => ApiError::Decode {
                url,
                why: e.to_string(),
            },
            e => ApiError::Transport {
                url,
                why: one_line(&e),
            },
        }
    }

    async fn write_slice(
        &self,
        path: &str,
        s: &ResourceSlice,
        create: bool,
    ) -> Result<ResourceSlice, SliceWriteError> {
        let name = s.metadata.name.clone().unwrap_or_default();
        let pp = PostParams::default();
        let api = self.slices();
        let r = if create {
            self.call(path, api.create(&pp, s)).await
        } else {
            self.call(path, api.replace(&name, &pp, s)).await
        };
        r.map_err(|e| match e {
            ApiError::Status {
                status: 409, body, ..
            } => SliceWriteError::Conflict(name, body),
            e => e.into(),
        })
    }
}

/// The path of a claim: namespace and name must be DNS names (no `/`).
pub fn claim_path(namespace: &str, name: &str) -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
}

#[tonic::async_trait]
impl ClaimSource for KubeApi {
    async fn get_claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ApiError> {
        let path = claim_path(namespace, name);
        let valid = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        if !valid(namespace) || !valid(name) {
            return Err(ApiError::Decode {
                url: self.url(&path),
                why: "namespace and name must be DNS names".into(),
            });
        }
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        match self.call(&path, api.get(name)).await {
            Err(ApiError::Status { status: 404, .. }) => {
                Err(ApiError::NotFound(namespace.into(), name.into()))
            }
            r => r,
        }
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ApiError> {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        self.call(&path, api.get(name)).await
    }

    async fn set_device_status(
        &self,
        namespace: &str,
        name: &str,
        driver: &str,
        devices: Vec<AllocatedDeviceStatus>,
    ) -> Result<(), ApiError> {
        let path = format!("{}/status", claim_path(namespace, name));
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"devices": devices},
        });
        let pp = PatchParams::apply(driver).force();
        match self
            .call(&path, api.patch_status(name, &pp, &Patch::Apply(&patch)))
            .await
        {
            Err(ApiError::Status { status: 404, .. }) => {
                Err(ApiError::NotFound(namespace.into(), name.into()))
            }
            r => r.map(|_| ()),
        }
    }

    async fn warn(&self, event: &ClaimWarning) -> Result<(), ApiError> {
        let path = format!(
            "/apis/events.k8s.io/v1/namespaces/{}/events",
            event.namespace
        );
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &event.namespace);
        self.call(&path, api.create(&PostParams::default(), &event.event()))
            .await
            .map(|_| ())
    }
}

/// What a ResourceSlice write can meet besides success.
#[derive(Debug, Error)]
pub enum SliceWriteError {
    /// 409: the object changed since it was read (a stale
    /// `resourceVersion`), or a create met one of that name.
    #[error("resourceslice {0}: conflict: {1}")]
    Conflict(String, String),
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// A list of ResourceSlices and the resourceVersion it was read at (where
/// a watch takes up).
#[derive(Debug, Clone, Default)]
pub struct SliceList {
    pub items: Vec<ResourceSlice>,
    pub resource_version: String,
}

/// One event of a ResourceSlice watch.
#[derive(Debug, Clone)]
pub enum WatchEvent {
    /// ADDED, MODIFIED or DELETED: the object as it is (or was).
    Changed(Box<ResourceSlice>),
    /// BOOKMARK: nothing of ours changed up to this resourceVersion.
    Bookmark(String),
}

impl WatchEvent {
    /// The resourceVersion the watch has reached with this event.
    pub fn resource_version(&self) -> Option<&str> {
        match self {
            WatchEvent::Changed(s) => s.metadata.resource_version.as_deref(),
            WatchEvent::Bookmark(rv) => Some(rv),
        }
    }
}

/// How a watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEnd {
    /// The server closed it (its timeout): watch again from the last
    /// resourceVersion seen.
    Closed,
    /// 410 Gone: that resourceVersion is compacted away; list again.
    Gone,
}

/// The ResourceSlice calls of the publisher (cluster-scoped objects).
#[tonic::async_trait]
pub trait SliceApi: Send + Sync {
    /// `GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=<node>,spec.driver=<driver>`.
    async fn list_slices(&self, node: &str, driver: &str) -> Result<SliceList, ApiError>;
    /// The same with `watch=true&allowWatchBookmarks=true&resourceVersion=<rv>`:
    /// calls `on_event` for each event until the server ends the watch.
    async fn watch_slices(
        &self,
        node: &str,
        driver: &str,
        resource_version: &str,
        on_event: &mut (dyn FnMut(WatchEvent) + Send),
    ) -> Result<WatchEnd, ApiError>;
    /// `POST /apis/resource.k8s.io/v1/resourceslices`.
    async fn create_slice(&self, s: &ResourceSlice) -> Result<ResourceSlice, SliceWriteError>;
    /// `PUT /apis/resource.k8s.io/v1/resourceslices/{name}`, conditional on
    /// the object's `metadata.resourceVersion`.
    async fn update_slice(&self, s: &ResourceSlice) -> Result<ResourceSlice, SliceWriteError>;
    /// `DELETE /apis/resource.k8s.io/v1/resourceslices/{name}` (gone already is fine).
    async fn delete_slice(&self, name: &str) -> Result<(), ApiError>;
    /// The owner of the slices written (the node's Node object, so that
    /// they go with it, as the upstream kubelet-plugin helper sets it).
    fn owner(&self) -> Option<OwnerReference> {
        None
    }
}

/// The owner reference of `node`'s ResourceSlices: its Node object.
pub fn node_owner(node: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// How long the server is asked to keep a watch open; the watch is given
/// up when nothing (not even a bookmark) came for [`WATCH_IDLE`].
const WATCH_SECONDS: u32 = 290;
const WATCH_IDLE: Duration = Duration::from_secs(330);

/// The collection path of ResourceSlices.
pub const SLICES_PATH: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// The field selector of this node's slices of this driver.
fn slice_selector(node: &str, driver: &str) -> String {
    format!("spec.nodeName={node},spec.driver={driver}")
}

#[tonic::async_trait]
impl SliceApi for KubeApi {
    async fn list_slices(&self, node: &str, driver: &str) -> Result<SliceList, ApiError> {
        let lp = ListParams::default().fields(&slice_selector(node, driver));
        let list = self.call(SLICES_PATH, self.slices().list(&lp)).await?;
        Ok(SliceList {
            items: list.items,
            resource_version: list.metadata.resource_version.unwrap_or_default(),
        })
    }

    async fn watch_slices(
        &self,
        node: &str,
        driver: &str,
        resource_version: &str,
        on_event: &mut (dyn FnMut(WatchEvent) + Send),
    ) -> Result<WatchEnd, ApiError> {
        let wp = WatchParams::default()
            .fields(&slice_selector(node, driver))
            .timeout(WATCH_SECONDS);
        debug_assert!(wp.bookmarks);
        let api = self.slices();
        let stream = match self
            .call(SLICES_PATH, api.watch(&wp, resource_version))
            .await
        {
            Ok(s) => s,
            Err(ApiError::Status { status: 410, .. }) => return Ok(WatchEnd::Gone),
            Err(e) => return Err(e),
        };
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::time::timeout(WATCH_IDLE, stream.try_next())
                .await
                .map_err(|_| ApiError::Transport {
                    url: self.url(SLICES_PATH),
                    why: format!("watch: nothing for {WATCH_IDLE:?}"),
                })?
                .map_err(|e| self.error(SLICES_PATH, e))?;
            use kube::api::WatchEvent as Ev;
            match next {
                None => return Ok(WatchEnd::Closed),
                Some(Ev::Added(s) | Ev::Modified(s) | Ev::Deleted(s)) => {
                    on_event(WatchEvent::Changed(Box::new(s)))
                }
                Some(Ev::Bookmark(b)) => {
                    on_event(WatchEvent::Bookmark(b.metadata.resource_version))
                }
                Some(Ev::Error(s)) if s.code == 410 => return Ok(WatchEnd::Gone),
                Some(Ev::Error(s)) => {
                    return Err(ApiError::Status {
                        url: self.url(SLICES_PATH),
                        status: s.code,
                        body: format!("watch error: {}", s.message),
                    })
                }
            }
        }
    }

    async fn create_slice(&self, s: &ResourceSlice) -> Result<ResourceSlice, SliceWriteError> {
        self.write_slice(SLICES_PATH, s, true).await
    }

    async fn update_slice(&self, s: &ResourceSlice) -> Result<ResourceSlice, SliceWriteError> {
        let name = s.metadata.name.as_deref().unwrap_or_default();
        self.write_slice(&format!("{SLICES_PATH}/{name}"), s, false)
            .await
    }

    async fn delete_slice(&self, name: &str) -> Result<(), ApiError> {
        let path = format!("{SLICES_PATH}/{name}");
        let dp = DeleteParams::default();
        match self.call(&path, self.slices().delete(name, &dp)).await {
            Ok(_) | Err(ApiError::Status { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn owner(&self) -> Option<OwnerReference> {
        self.owner.get().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_server_urls_are_http_or_https_with_a_host() {
        for good in [
            "https://10.96.0.1:443",
            "https://kubernetes.default.svc",
            "http://127.0.0.1:8080/",
            "https://[fd00::1]:6443",
            "https://rancher.example/k8s/clusters/c-1",
        ] {
            assert!(parse_url(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "127.0.0.1:8001",
            "ftp://host",
            "https://",
            "http:///x",
            "https://user:pw@host",
            "https://host?x=1",
            "https://ho st",
        ] {
            let e = parse_url(bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{bad:?}")) && e.contains("http(s)://HOST"),
                "{e}"
            );
            assert!(!e.contains('\n'));
        }
    }

    #[test]
    fn a_token_goes_over_plain_http_only_to_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t").unwrap();
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost:1",
            "http://[::1]:2",
            "https://10.0.0.1",
        ] {
            ApiTarget::new(Some(ok), Some(&token)).unwrap();
        }
        for leak in [
            "http://10.0.0.1:8080",
            "http://kubernetes.default.svc",
            "http://127.0.0.1.evil.example",
        ] {
            let e = ApiTarget::new(Some(leak), Some(&token)).unwrap_err();
            assert!(matches!(e, ApiError::PlainHttpToken(_)), "{leak}: {e:?}");
            assert!(e.to_string().contains("use https://"), "{e}");
            // Without a token there is nothing to leak.
            ApiTarget::new(Some(leak), None).unwrap();
        }
    }

    #[test]
    fn a_token_file_must_hold_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let e = ApiTarget::new(None, Some(&empty)).unwrap_err().to_string();
        assert!(e.contains("empty") && e.contains("--token-file"), "{e}");
        let missing = dir.path().join("missing");
        let e = ApiTarget::new(None, Some(&missing))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing") && e.contains("No such file"), "{e}");
        let newline = dir.path().join("newline");
        std::fs::write(&newline, "token\n").unwrap();
        let e = ApiTarget::new(None, Some(&newline))
            .unwrap_err()
            .to_string();
        assert!(e.contains("trailing newline"), "{e}");
        std::fs::write(&newline, "token").unwrap();
        ApiTarget::new(None, Some(&newline)).unwrap();
    }
}
