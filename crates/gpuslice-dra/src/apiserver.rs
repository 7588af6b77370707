//! The API server calls the driver makes, behind [`ClaimSource`] so the
//! driver is tested against a local test double (tests/common/fakeapi.rs).
//!
//! [`HttpApi`] is the implementation for a real control plane, over plain
//! HTTP/1.1: it reaches an API server through `kubectl proxy` or another
//! authenticating proxy on the node (a bearer token is sent when given).
//! It does not speak TLS: in-cluster access with the service account's
//! CA and token (kube-rs) is not done yet (docs/dra.md).

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use k8s_openapi::api::resource::v1::ResourceClaim;
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

/// The calls the driver makes (later: ResourceSlice create/update/delete).
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
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| e.to_string())?;
        let (mut tx, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let mut req = hyper::Request::get(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::ACCEPT, "application/json");
        if let Some(t) = &self.token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
        let resp = tx.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
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
