//! FakeApiServer: a TEST DOUBLE of the few kube-apiserver endpoints the
//! driver uses, over real HTTP on 127.0.0.1. It is not an API server.
//!
//! What it does as the real one does: claims live at
//! `GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}`;
//! every write gives the object a new `metadata.resourceVersion` (one
//! counter for the whole store, as etcd's revision); a missing object is a
//! 404 with a `Status` body (reason `NotFound`). Claims are fed to it as
//! kube-scheduler writes them: `status.allocation.devices.results` with
//! `consumedCapacity` and `shareID`.
//!
//! Not modelled yet: watch, bookmarks, re-lists, ResourceSlice writes and
//! their conflicts (the driver does not make those calls yet).

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Store {
    claims: Mutex<BTreeMap<(String, String), Value>>,
    revision: AtomicU64,
    gets: AtomicU64,
}

pub struct FakeApiServer {
    pub url: String,
    store: Arc<Store>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeApiServer {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let store = Arc::new(Store::default());
        let s = store.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(&s, req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(conn), svc)
                        .await;
                });
            }
        });
        FakeApiServer { url, store, task }
    }

    /// Creates or replaces a claim (as the scheduler's status update
    /// does); returns its new resourceVersion.
    pub fn put_claim(&self, mut claim: Value) -> String {
        let rv = (self.store.revision.fetch_add(1, Ordering::SeqCst) + 1).to_string();
        claim["metadata"]["resourceVersion"] = json!(rv);
        let key = (
            claim["metadata"]["namespace"].as_str().unwrap().to_string(),
            claim["metadata"]["name"].as_str().unwrap().to_string(),
        );
        self.store.claims.lock().unwrap().insert(key, claim);
        rv
    }

    pub fn delete_claim(&self, namespace: &str, name: &str) {
        self.store
            .claims
            .lock()
            .unwrap()
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// GET requests answered so far.
    pub fn gets(&self) -> u64 {
        self.store.gets.load(Ordering::SeqCst)
    }
}

fn handle(s: &Store, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if req.method() != hyper::Method::GET {
        return status(405, "MethodNotAllowed", &format!("{} {path}", req.method()));
    }
    s.gets.fetch_add(1, Ordering::SeqCst);
    match parts.as_slice() {
        ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name] => {
            match s
                .claims
                .lock()
                .unwrap()
                .get(&(ns.to_string(), name.to_string()))
            {
                Some(c) => Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(c.to_string())))
                    .unwrap(),
                None => status(
                    404,
                    "NotFound",
                    &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                ),
            }
        }
        _ => status(
            404,
            "NotFound",
            &format!("the server could not find {path}"),
        ),
    }
}

/// A `metav1.Status` failure, as the API server answers errors.
fn status(code: u16, reason: &str, message: &str) -> Response<Full<Bytes>> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A claim as kube-scheduler leaves it for a shared device: the request
/// in spec, the result with consumedCapacity and shareID in status.
pub fn shared_claim(
    ns: &str,
    name: &str,
    uid: &str,
    pool: &str,
    gpu: u32,
    memory: &str,
    compute: &str,
) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": ns, "name": name, "uid": uid},
        "spec": {"devices": {"requests": [{
            "name": "gpu",
            "exactly": {
                "deviceClassName": "gpu-shared.gpuslice.io",
                "capacity": {"requests": {"memory": memory, "compute": compute}},
            },
        }]}},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu",
            "driver": "gpu.gpuslice.io",
            "pool": pool,
            "device": format!("gpu-{gpu}-shared"),
            "shareID": format!("{uid}-share"),
            "consumedCapacity": {"memory": memory, "compute": compute},
        }]}}},
    })
}

/// A claim allocated one whole device (`gpu-<i>` or `gpu-<i>-mig-<m>`).
pub fn device_claim(ns: &str, name: &str, uid: &str, pool: &str, device: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": ns, "name": name, "uid": uid},
        "spec": {"devices": {"requests": [{
            "name": "gpu",
            "exactly": {"deviceClassName": "gpu.gpuslice.io"},
        }]}},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.gpuslice.io", "pool": pool, "device": device,
        }]}}},
    })
}
