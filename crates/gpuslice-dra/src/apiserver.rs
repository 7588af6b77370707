//! The API server calls the driver makes, behind [`ClaimSource`] and
//! [`SliceApi`] so the driver is tested against a local test double
//! (`gpuslice_testkit::fakeapi`): claims are read with GET; ResourceSlices
//! are listed, watched (one JSON event a line, bookmarks, 410 Gone) and
//! written.
//!
//! [`HttpApi`] is the implementation for a real control plane, over plain
//! HTTP/1.1: it reaches an API server through `kubectl proxy` or another
//! authenticating proxy on the node (a bearer token is sent when given).
//! It does not speak TLS: in-cluster access with the service account's
//! CA and token (kube-rs) is not done yet (docs/dra.md).

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
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
    #[error("{url}: not a ResourceClaim: {why}")]
    Decode { url: String, why: String },
    #[error("API server URL {0:?}: only http://HOST:PORT is supported (e.g. kubectl proxy's http://127.0.0.1:8001)")]
    Url(String),
}

/// The claim calls the driver makes.
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync {
    /// `GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}`.
    async fn get_claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ApiError>;
}

/// `resource.k8s.io/v1` over plain HTTP (see the module docs).
#[derive(Debug, Clone)]
pub struct HttpApi {
    authority: String,
    token: Option<String>,
    timeout: Duration,
}

impl HttpApi {
    /// `base`: `http://HOST:PORT`.
    pub fn new(base: &str, token: Option<String>) -> Result<Self, ApiError> {
        let authority = base
            .strip_prefix("http://")
            .map(|a| a.trim_end_matches('/'))
            .filter(|a| !a.is_empty() && !a.contains('/'))
            .ok_or_else(|| ApiError::Url(base.into()))?;
        Ok(HttpApi {
            authority: authority.into(),
            token,
            timeout: Duration::from_secs(10),
        })
    }

    async fn get(&self, path: &str) -> Result<(u16, Bytes), String> {
        self.send(hyper::Method::GET, path, None).await
    }

    async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), String> {
        let (status, body) = self.open(method, path, body).await?;
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, body))
    }

    /// Sends a request; the answer's status and its body, unread (a
    /// watch streams it).
    async fn open(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, hyper::body::Incoming), String> {
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| e.to_string())?;
        let (mut tx, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::ACCEPT, "application/json");
        if let Some(t) = &self.token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| e.to_string())?;
        let resp = tx.send_request(req).await.map_err(|e| e.to_string())?;
        Ok((resp.status().as_u16(), resp.into_body()))
    }
}

/// The path of a claim: namespace and name must be DNS names (no `/`).
pub fn claim_path(namespace: &str, name: &str) -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
}

#[tonic::async_trait]
impl ClaimSource for HttpApi {
    async fn get_claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ApiError> {
        let path = claim_path(namespace, name);
        let url = format!("http://{}{path}", self.authority);
        let valid = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        if !valid(namespace) || !valid(name) {
            return Err(ApiError::Decode {
                url,
                why: "namespace and name must be DNS names".into(),
            });
        }
        let (status, body) = tokio::time::timeout(self.timeout, self.get(&path))
            .await
            .map_err(|_| ApiError::Transport {
                url: url.clone(),
                why: format!("no answer in {:?}", self.timeout),
            })?
            .map_err(|why| ApiError::Transport {
                url: url.clone(),
                why,
            })?;
        match status {
            200 => serde_json::from_slice(&body).map_err(|e| ApiError::Decode {
                url,
                why: e.to_string(),
            }),
            404 => Err(ApiError::NotFound(namespace.into(), name.into())),
            s => Err(ApiError::Status {
                url,
                status: s,
                body: String::from_utf8_lossy(&body).chars().take(200).collect(),
            }),
        }
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
}

/// How long the server is asked to keep a watch open; the watch is given
/// up when nothing (not even a bookmark) came for [`WATCH_IDLE`].
const WATCH_SECONDS: u64 = 290;
const WATCH_IDLE: Duration = Duration::from_secs(330);

/// The collection path of ResourceSlices.
pub const SLICES_PATH: &str = "/apis/resource.k8s.io/v1/resourceslices";

impl HttpApi {
    async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), ApiError> {
        let url = format!("http://{}{path}", self.authority);
        tokio::time::timeout(self.timeout, self.send(method, path, body))
            .await
            .map_err(|_| ApiError::Transport {
                url: url.clone(),
                why: format!("no answer in {:?}", self.timeout),
            })?
            .map_err(|why| ApiError::Transport { url, why })
    }

    fn status_error(&self, path: &str, status: u16, body: &[u8]) -> ApiError {
        ApiError::Status {
            url: format!("http://{}{path}", self.authority),
            status,
            body: String::from_utf8_lossy(body).chars().take(200).collect(),
        }
    }

    async fn write_slice(
        &self,
        method: hyper::Method,
        path: &str,
        s: &ResourceSlice,
    ) -> Result<ResourceSlice, SliceWriteError> {
        let name = s.metadata.name.clone().unwrap_or_default();
        let body = serde_json::to_vec(s).map_err(|e| ApiError::Decode {
            url: path.into(),
            why: e.to_string(),
        })?;
        let (status, bytes) = self.call(method, path, Some(body)).await?;
        match status {
            200 | 201 => serde_json::from_slice(&bytes).map_err(|e| {
                SliceWriteError::Api(ApiError::Decode {
                    url: path.into(),
                    why: e.to_string(),
                })
            }),
            409 => Err(SliceWriteError::Conflict(name, status_message(&bytes))),
            st => Err(self.status_error(path, st, &bytes).into()),
        }
    }
}

#[tonic::async_trait]
impl SliceApi for HttpApi {
    async fn list_slices(&self, node: &str, driver: &str) -> Result<SliceList, ApiError> {
        let path = format!("{SLICES_PATH}?{}", slice_selector(node, driver));
        let (status, bytes) = self.call(hyper::Method::GET, &path, None).await?;
        if status != 200 {
            return Err(self.status_error(&path, status, &bytes));
        }
        let list: k8s_openapi::List<ResourceSlice> =
            serde_json::from_slice(&bytes).map_err(|e| ApiError::Decode {
                url: path.clone(),
                why: e.to_string(),
            })?;
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
        let path = format!(
            "{SLICES_PATH}?{}&watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}&resourceVersion={}",
            slice_selector(node, driver),
            query_escape(resource_version)
        );
        let url = format!("http://{}{path}", self.authority);
        let transport = |why: String| ApiError::Transport {
            url: url.clone(),
            why,
        };
        let (status, mut body) =
            tokio::time::timeout(self.timeout, self.open(hyper::Method::GET, &path, None))
                .await
                .map_err(|_| transport(format!("no answer in {:?}", self.timeout)))?
                .map_err(transport)?;
        match status {
            200 => {}
            410 => return Ok(WatchEnd::Gone),
            st => {
                let bytes = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                return Err(self.status_error(&path, st, &bytes));
            }
        }
        // One JSON object a line.
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let frame = match tokio::time::timeout(WATCH_IDLE, body.frame()).await {
                Err(_) => return Err(transport(format!("nothing for {WATCH_IDLE:?}"))),
                Ok(None) => return Ok(WatchEnd::Closed),
                Ok(Some(f)) => f.map_err(|e| transport(e.to_string()))?,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let ev = watch_event(&line).map_err(|why| ApiError::Decode {
                    url: url.clone(),
                    why,
                })?;
                match ev {
                    Some(ev) => on_event(ev),
                    None => return Ok(WatchEnd::Gone),
                }
            }
        }
    }

    async fn create_slice(&self, s: &ResourceSlice) -> Result<ResourceSlice, SliceWriteError> {
        self.write_slice(hyper::Method::POST, SLICES_PATH, s).await
    }

    async fn update_slice(&self, s: &ResourceSlice) -> Result<ResourceSlice, SliceWriteError> {
        let name = s.metadata.name.as_deref().unwrap_or_default();
        self.write_slice(hyper::Method::PUT, &format!("{SLICES_PATH}/{name}"), s)
            .await
    }

    async fn delete_slice(&self, name: &str) -> Result<(), ApiError> {
        let path = format!("{SLICES_PATH}/{name}");
        let (status, bytes) = self.call(hyper::Method::DELETE, &path, None).await?;
        match status {
            200 | 202 | 404 => Ok(()),
            st => Err(self.status_error(&path, st, &bytes)),
        }
    }
}

fn slice_selector(node: &str, driver: &str) -> String {
    format!(
        "fieldSelector=spec.nodeName%3D{}%2Cspec.driver%3D{}",
        query_escape(node),
        query_escape(driver)
    )
}

/// Percent-encodes all but the unreserved characters of a query value.
fn query_escape(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One line of a watch: an event, or None for an ERROR event of code 410
/// (the resourceVersion is too old: list again). Other ERROR events are
/// errors.
fn watch_event(line: &[u8]) -> Result<Option<WatchEvent>, String> {
    #[derive(serde::Deserialize)]
    struct Raw {
        #[serde(rename = "type")]
        kind: String,
        object: serde_json::Value,
    }
    let raw: Raw = serde_json::from_slice(line).map_err(|e| format!("a watch event: {e}"))?;
    match raw.kind.as_str() {
        "ADDED" | "MODIFIED" | "DELETED" => serde_json::from_value(raw.object)
            .map(|s| Some(WatchEvent::Changed(Box::new(s))))
            .map_err(|e| format!("a watch event's ResourceSlice: {e}")),
        "BOOKMARK" => Ok(Some(WatchEvent::Bookmark(
            raw.object["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ))),
        "ERROR" if raw.object["code"] == 410 => Ok(None),
        "ERROR" => Err(format!(
            "watch error: {}",
            raw.object["message"].as_str().unwrap_or_default()
        )),
        other => Err(format!("watch event of unknown type {other:?}")),
    }
}

/// The `message` of a `metav1.Status` body, else the body's start.
fn status_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(200).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_lines_are_events_bookmarks_or_gone() {
        let slice = br#"{"type":"MODIFIED","object":{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"s","resourceVersion":"12"},"spec":{"driver":"d","pool":{"name":"n","generation":1,"resourceSliceCount":1}}}}"#;
        let ev = watch_event(slice).unwrap().unwrap();
        assert!(matches!(ev, WatchEvent::Changed(_)));
        assert_eq!(ev.resource_version(), Some("12"));
        let b = br#"{"type":"BOOKMARK","object":{"kind":"ResourceSlice","apiVersion":"resource.k8s.io/v1","metadata":{"resourceVersion":"40"}}}"#;
        assert_eq!(
            watch_event(b).unwrap().unwrap().resource_version(),
            Some("40")
        );
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version: 3 (40)"}}"#;
        assert!(watch_event(gone).unwrap().is_none());
        let other =
            br#"{"type":"ERROR","object":{"kind":"Status","code":500,"message":"etcd down"}}"#;
        assert!(watch_event(other).unwrap_err().contains("etcd down"));
        assert!(watch_event(b"{not json").is_err());
        assert!(watch_event(br#"{"type":"SURPRISE","object":{}}"#).is_err());
    }

    #[test]
    fn selector_values_are_escaped() {
        assert_eq!(query_escape("node-a.example"), "node-a.example");
        assert_eq!(query_escape("a&b=c,d"), "a%26b%3Dc%2Cd");
    }
}
