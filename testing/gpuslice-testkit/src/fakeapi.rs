//! FakeApiServer: a TEST DOUBLE of the few kube-apiserver endpoints the
//! DRA driver uses, over real HTTP on 127.0.0.1. It is not an API server.
//!
//! What it does as the real one does:
//! - events: `POST /apis/events.k8s.io/v1/namespaces/{ns}/events`, validated as the API server does;
//! - claims: `GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}`,
//!   fed to it as kube-scheduler writes them
//!   (`status.allocation.devices.results` with `consumedCapacity` and
//!   `shareID`);
//! - ResourceSlices (cluster-scoped): list with a `fieldSelector` on
//!   `spec.nodeName`, `spec.driver`, `spec.pool.name` (the fields the real
//!   server selects on; any other is a 400); create (POST: 409
//!   `AlreadyExists` for a taken name); update (PUT: 409 `Conflict` when
//!   `metadata.resourceVersion` is not the stored one; stricter than the
//!   real server, also when it is missing, so a blind write shows);
//!   delete;
//! - every write gives the object a new `metadata.resourceVersion` (one
//!   counter for the whole store, as etcd's revision); `metadata.generation`
//!   starts at 1 and grows when the spec changes; `metadata.uid` is set on
//!   create;
//! - a missing object is a 404 with a `Status` body (reason `NotFound`);
//! - authentication, when asked for ([`FakeApiServer::require_token`]):
//!   a request without `Authorization: Bearer <that token>` is a 401
//!   `Unauthorized` `Status`, as the real server answers an unknown or
//!   missing token; every request's `Authorization` header is recorded
//!   ([`FakeApiServer::authorizations`]);
//! - optionally, the `DRADeviceTaints` feature off: device taints are
//!   dropped from written slices ([`FakeApiServer::drop_device_taints`]).
//!
//! - ResourceSlice watches (`watch=true`, with the list's selectors):
//!   every change after the `resourceVersion` asked for, one JSON event a
//!   line; `BOOKMARK` events with the store's revision when
//!   `allowWatchBookmarks=true` (every 100 ms here, about a minute on the
//!   real server); a `resourceVersion` older than the compacted history is
//!   answered with an `ERROR` event of code 410 (`Expired`), as is an open
//!   watch whose history is compacted away ([`FakeApiServer::expire_watches`]);
//!   the server may end a watch at any time ([`FakeApiServer::close_watches`]).
//!
//! Not modelled: claim watches (the driver reads claims with GET only),
//! validation of the objects (tests validate them against the upstream
//! schemas).

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Bytes;
use hyper::body::Frame;
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

type Body = UnsyncBoxBody<Bytes, std::convert::Infallible>;

/// What open watches are told.
#[derive(Clone)]
enum Msg {
    /// A slice change: resourceVersion, event type, the object.
    Event(u64, &'static str, Value),
    /// Their history is compacted away: 410.
    Expire,
    /// The server ends them.
    Close,
}

/// The history of slice changes watches are served from.
struct Log {
    /// (resourceVersion, event type, object), oldest first, after `floor`.
    events: Vec<(u64, &'static str, Value)>,
    /// Changes up to here are compacted away.
    floor: u64,
    live: tokio::sync::broadcast::Sender<Msg>,
}

impl Default for Log {
    fn default() -> Self {
        Log {
            events: Vec::new(),
            floor: 0,
            live: tokio::sync::broadcast::channel(1024).0,
        }
    }
}

#[derive(Default)]
struct Store {
    claims: Mutex<BTreeMap<(String, String), Value>>,
    /// Node objects by name (`GET /api/v1/nodes/{name}`).
    nodes: Mutex<BTreeMap<String, Value>>,
    /// Pods by namespace and name (`GET /api/v1/namespaces/{ns}/pods/{name}`).
    pods: Mutex<BTreeMap<(String, String), Value>>,
    /// events.k8s.io/v1 Events created (`POST …/namespaces/{ns}/events`).
    events: Mutex<Vec<Value>>,
    /// Per claim and field manager, the `status.devices` keys (driver,
    /// pool, device, shareID) its last server-side apply owned.
    status_owners: Mutex<BTreeMap<(String, String, String), Vec<Value>>>,
    slices: Mutex<BTreeMap<String, Value>>,
    revision: AtomicU64,
    gets: AtomicU64,
    /// ResourceSlice writes answered 2xx (creates, updates, deletes).
    slice_writes: AtomicU64,
    /// PUTs still to be preceded by another writer's update.
    interfere: AtomicU64,
    /// Drop device taints on writes, as a server without the
    /// `DRADeviceTaints` feature does.
    drop_taints: std::sync::atomic::AtomicBool,
    log: Mutex<Log>,
    /// ResourceSlice lists answered.
    lists: AtomicU64,
    /// The resourceVersion each slice watch started from.
    watch_starts: Mutex<Vec<String>>,
    /// Between bookmarks (ms; 0 is the default, 100).
    bookmark_ms: AtomicU64,
    /// The bearer token every request must show (None: no check).
    token: Mutex<Option<String>>,
    /// Each request's `Authorization` header, in order.
    authorizations: Mutex<Vec<Option<String>>>,
}

impl Store {
    fn next_rv(&self) -> String {
        (self.revision.fetch_add(1, Ordering::SeqCst) + 1).to_string()
    }

    /// A slice change: `obj` gets the next resourceVersion, and the change
    /// goes into the history and to the open watches, under the log's
    /// lock (so a watch or a list sees every change up to its revision).
    fn commit(&self, kind: &'static str, obj: &mut Value) {
        let mut log = self.log.lock().unwrap();
        let rv = self.revision.fetch_add(1, Ordering::SeqCst) + 1;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        log.events.push((rv, kind, obj.clone()));
        let _ = log.live.send(Msg::Event(rv, kind, obj.clone()));
    }
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
                        async move { Ok::<_, std::convert::Infallible>(handle(s, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(conn), svc)
                        .await;
                });
            }
        });
        FakeApiServer { url, store, task }
    }

    /// Registers a Node (as the kubelet does when it joins); returns its uid.
    pub fn put_node(&self, name: &str) -> String {
        let uid = format!("node-uid-{name}");
        self.store.nodes.lock().unwrap().insert(
            name.into(),
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": uid, "resourceVersion": self.store.next_rv()},
            }),
        );
        uid
    }

    /// Creates or replaces a pod (only what the driver reads: its spec).
    pub fn put_pod(&self, namespace: &str, name: &str, spec: Value) {
        self.store.pods.lock().unwrap().insert(
            (namespace.into(), name.into()),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"namespace": namespace, "name": name, "uid": format!("pod-uid-{name}")},
                "spec": spec,
            }),
        );
    }

    /// A claim as it is now (its `status.devices` as drivers applied them).
    pub fn claim(&self, namespace: &str, name: &str) -> Option<Value> {
        self.store
            .claims
            .lock()
            .unwrap()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Creates or replaces a claim (as the scheduler's status update
    /// does); returns its new resourceVersion.
    pub fn put_claim(&self, mut claim: Value) -> String {
        let rv = self.store.next_rv();
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

    /// The events.k8s.io/v1 Events created so far, in order.
    pub fn events(&self) -> Vec<Value> {
        self.store.events.lock().unwrap().clone()
    }

    /// GET requests answered so far.
    pub fn gets(&self) -> u64 {
        self.store.gets.load(Ordering::SeqCst)
    }

    /// The stored ResourceSlices, by name.
    pub fn slices(&self) -> BTreeMap<String, Value> {
        self.store.slices.lock().unwrap().clone()
    }

    /// Successful ResourceSlice writes so far.
    pub fn slice_writes(&self) -> u64 {
        self.store.slice_writes.load(Ordering::SeqCst)
    }

    /// Another writer's change of a stored slice (an admin, another
    /// instance): `edit` runs on it, and it gets a new resourceVersion.
    pub fn touch_slice(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        let mut slices = self.store.slices.lock().unwrap();
        let obj = slices.get_mut(name).expect("no such slice");
        edit(obj);
        self.store.commit("MODIFIED", obj);
    }

    /// The next `n` ResourceSlice updates each meet another writer's
    /// update of the same object just before them (its resourceVersion
    /// moves on), as when two writers race.
    pub fn interfere_with_updates(&self, n: u64) {
        self.store.interfere.store(n, Ordering::SeqCst);
    }

    /// Behave as an API server without the `DRADeviceTaints` feature: the
    /// `taints` of ResourceSlice devices are dropped on create and update,
    /// silently (the real server's dropDisabledFields).
    pub fn drop_device_taints(&self, on: bool) {
        self.store.drop_taints.store(on, Ordering::SeqCst);
    }

    /// Removes a slice behind the driver's back.
    pub fn remove_slice(&self, name: &str) {
        let mut slices = self.store.slices.lock().unwrap();
        if let Some(mut obj) = slices.remove(name) {
            self.store.commit("DELETED", &mut obj);
        }
    }

    /// ResourceSlice lists answered so far.
    pub fn lists(&self) -> u64 {
        self.store.lists.load(Ordering::SeqCst)
    }

    /// The resourceVersion each ResourceSlice watch so far started from.
    pub fn watch_starts(&self) -> Vec<String> {
        self.store.watch_starts.lock().unwrap().clone()
    }

    /// The store's revision (the newest resourceVersion given out).
    pub fn revision(&self) -> u64 {
        self.store.revision.load(Ordering::SeqCst)
    }

    /// Compacts the history up to now, as etcd does: a watch from an
    /// older resourceVersion is answered 410 Gone.
    pub fn compact(&self) {
        let mut log = self.store.log.lock().unwrap();
        log.floor = self.store.revision.load(Ordering::SeqCst);
        log.events.clear();
    }

    /// Compacts the history and tells every open watch so (an `ERROR`
    /// event of code 410): their clients must list again.
    pub fn expire_watches(&self) {
        self.compact();
        let _ = self.store.log.lock().unwrap().live.send(Msg::Expire);
    }

    /// Bookmarks of watches started from now on come every `every`.
    pub fn set_bookmark_interval(&self, every: std::time::Duration) {
        let ms = every.as_millis().clamp(1, u64::MAX.into()) as u64;
        self.store.bookmark_ms.store(ms, Ordering::SeqCst);
    }

    /// From now on, a request without `Authorization: Bearer <token>` is
    /// answered 401 (None: no check, the default).
    pub fn require_token(&self, token: Option<&str>) {
        *self.store.token.lock().unwrap() = token.map(str::to_string);
    }

    /// Each request's `Authorization` header so far (None: it had none).
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.store.authorizations.lock().unwrap().clone()
    }

    /// Ends every open watch (as the server does at its timeout).
    pub fn close_watches(&self) {
        let _ = self.store.log.lock().unwrap().live.send(Msg::Close);
    }
}

async fn handle(s: Arc<Store>, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let method = req.method().clone();
    let auth = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    s.authorizations.lock().unwrap().push(auth.clone());
    if let Some(t) = s.token.lock().unwrap().as_deref() {
        if auth.as_deref() != Some(&format!("Bearer {t}")) {
            return status(401, "Unauthorized", "Unauthorized");
        }
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status(400, "BadRequest", &e.to_string()),
    };
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    use hyper::Method;
    match (method.clone(), parts.as_slice()) {
        (
            Method::GET,
            ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name],
        ) => {
            s.gets.fetch_add(1, Ordering::SeqCst);
            match s
                .claims
                .lock()
                .unwrap()
                .get(&(ns.to_string(), name.to_string()))
            {
                Some(c) => ok(200, c),
                None => status(
                    404,
                    "NotFound",
                    &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                ),
            }
        }
        (
            Method::PATCH,
            ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name, "status"],
        ) => apply_claim_status(&s, ns, name, &query, &content_type, &body),
        (Method::GET, ["api", "v1", "namespaces", ns, "pods", name]) => {
            match s
                .pods
                .lock()
                .unwrap()
                .get(&(ns.to_string(), name.to_string()))
            {
                Some(p) => ok(200, p),
                None => status(404, "NotFound", &format!("pods \"{name}\" not found")),
            }
        }
        (Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"]) => {
            create_event(&s, ns, &body)
        }
        (Method::GET, ["api", "v1", "nodes", name]) => match s.nodes.lock().unwrap().get(*name) {
            Some(n) => ok(200, n),
            None => status(404, "NotFound", &format!("nodes \"{name}\" not found")),
        },
        (Method::GET, ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
            s.gets.fetch_add(1, Ordering::SeqCst);
            if flag(&query, "watch") {
                watch_slices(s, &query)
            } else {
                list_slices(&s, &query)
            }
        }
        (Method::POST, ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
            write_slice(&s, None, &body)
        }
        (Method::PUT, ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            write_slice(&s, Some(name), &body)
        }
        (Method::DELETE, ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            let mut slices = s.slices.lock().unwrap();
            match slices.remove(*name) {
                Some(mut obj) => {
                    s.commit("DELETED", &mut obj);
                    s.slice_writes.fetch_add(1, Ordering::SeqCst);
                    ok(200, &obj)
                }
                None => status(
                    404,
                    "NotFound",
                    &format!("resourceslices.resource.k8s.io \"{name}\" not found"),
                ),
            }
        }
        _ => status(
            404,
            "NotFound",
            &format!("the server could not find {method} {path}"),
        ),
    }
}

/// A server-side apply of a claim's status, as the API server does it
/// for `status.devices` (a map list keyed by driver, pool, device and
/// shareID): the manager's entries become the applied ones (those it
/// applied before and leaves out are removed, other managers' stay). The
/// API server's checks: apply content type, a `fieldManager`, entries
/// that name an allocated device, complete conditions.
fn apply_claim_status(
    s: &Store,
    ns: &str,
    name: &str,
    query: &str,
    content_type: &str,
    body: &[u8],
) -> Response<Body> {
    if content_type != "application/apply-patch+yaml" {
        return status(
            415,
            "UnsupportedMediaType",
            &format!("the body of the request was in an unknown format: {content_type}"),
        );
    }
    let Some(manager) = param(query, "fieldManager").filter(|m| !m.is_empty()) else {
        return status(
            422,
            "Invalid",
            "PATCH, fieldManager: Required value: is required for apply patch",
        );
    };
    let applied: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return status(400, "BadRequest", &format!("not JSON: {e}")),
    };
    let mut claims = s.claims.lock().unwrap();
    let Some(claim) = claims.get_mut(&(ns.to_string(), name.to_string())) else {
        return status(
            404,
            "NotFound",
            &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
        );
    };
    let key = |d: &Value| {
        json!([
            d["driver"],
            d["pool"],
            d["device"],
            d.get("shareID").cloned().unwrap_or(Value::Null)
        ])
    };
    let allocated: Vec<Value> = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(key)
        .collect();
    let new: Vec<Value> = applied["status"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for d in &new {
        if !allocated.contains(&key(d)) {
            return status(
                422,
                "Invalid",
                &format!(
                    "status.devices: Invalid value: {}: must be an allocated device in the claim",
                    key(d)
                ),
            );
        }
        for c in d["conditions"].as_array().into_iter().flatten() {
            for f in ["type", "status", "reason", "lastTransitionTime"] {
                if c[f].as_str().is_none_or(str::is_empty) {
                    return status(
                        422,
                        "Invalid",
                        &format!("status.devices.conditions.{f}: Required value"),
                    );
                }
            }
        }
    }
    let owner = (ns.to_string(), name.to_string(), manager.to_string());
    let mut owners = s.status_owners.lock().unwrap();
    let before = owners.remove(&owner).unwrap_or_default();
    let mut devices: Vec<Value> = claim["status"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|d| !before.contains(&key(d)) && !new.iter().any(|n| key(n) == key(d)))
        .collect();
    devices.extend(new.iter().cloned());
    owners.insert(owner, new.iter().map(key).collect());
    if devices.is_empty() {
        if let Some(st) = claim["status"].as_object_mut() {
            st.remove("devices");
        }
    } else {
        claim["status"]["devices"] = Value::Array(devices);
    }
    claim["metadata"]["resourceVersion"] = json!(s.next_rv());
    ok(200, claim)
}

/// `POST /apis/events.k8s.io/v1/namespaces/{ns}/events`, validated as
/// the API server validates a create through events.k8s.io/v1
/// (`pkg/apis/core/validation/events.go`, `ValidateEventCreate`): the
/// namespace of the URL; a name; eventTime; type Normal or Warning; a
/// reportingController that is a qualified name; reportingInstance,
/// action and reason set and at most 128 bytes; a note of at most 1024;
/// none of the legacy fields. 422 Invalid lists what failed, 409 a name
/// taken.
fn create_event(s: &Store, ns: &str, body: &[u8]) -> Response<Body> {
    let mut ev: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return status(400, "BadRequest", &e.to_string()),
    };
    let name = ev["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if ev["metadata"]["namespace"]
        .as_str()
        .is_some_and(|n| n != ns)
    {
        return status(
            400,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request",
        );
    }
    let text = |k: &str| ev[k].as_str().unwrap_or_default().to_string();
    let mut errs: Vec<String> = Vec::new();
    if name.is_empty() {
        errs.push("metadata.name: Required value: name or generateName is required".into());
    }
    if ev["eventTime"].as_str().unwrap_or_default().is_empty() {
        errs.push("eventTime: Required value".into());
    }
    let ty = text("type");
    if ty != "Normal" && ty != "Warning" {
        errs.push(format!(
            "type: Invalid value: \"\": has invalid value: {ty}"
        ));
    }
    let controller = text("reportingController");
    if controller.is_empty() {
        errs.push("reportingController: Required value".into());
    } else if !qualified_name(&controller) {
        errs.push(format!("reportingController: Invalid value: {controller:?}: a qualified name must consist of alphanumeric characters, '-', '_' or '.', with an optional DNS subdomain prefix and '/'"));
    }
    for (k, limit) in [("reportingInstance", 128), ("action", 128), ("reason", 128)] {
        let v = text(k);
        if v.is_empty() {
            errs.push(format!("{k}: Required value"));
        } else if v.len() > limit {
            errs.push(format!(
                "{k}: Invalid value: \"\": can have at most {limit} characters"
            ));
        }
    }
    if text("note").len() > 1024 {
        errs.push("message: Invalid value: \"\": can have at most 1024 characters".into());
    }
    for legacy in [
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedCount",
    ] {
        if !ev[legacy].is_null() {
            errs.push(format!("{legacy}: Invalid value: \"\": needs to be unset"));
        }
    }
    if !errs.is_empty() {
        return status(
            422,
            "Invalid",
            &format!(
                "Event.events.k8s.io {name:?} is invalid: [{}]",
                errs.join(", ")
            ),
        );
    }
    let mut events = s.events.lock().unwrap();
    if events
        .iter()
        .any(|e| e["metadata"]["name"] == name.as_str() && e["metadata"]["namespace"] == ns)
    {
        return status(
            409,
            "AlreadyExists",
            &format!("events.events.k8s.io {name:?} already exists"),
        );
    }
    ev["metadata"]["namespace"] = json!(ns);
    ev["metadata"]["resourceVersion"] = json!(s.next_rv());
    ev["metadata"]["uid"] = json!(format!("event-uid-{}", events.len()));
    events.push(ev.clone());
    ok(201, &ev)
}

/// `IsQualifiedName`: `[prefix/]name`, name 1-63 of `[A-Za-z0-9_.-]`
/// starting and ending alphanumeric, prefix a DNS subdomain.
fn qualified_name(v: &str) -> bool {
    let (prefix, name) = match v.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, v),
    };
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let name_ok = (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && alnum(name.chars().next())
        && alnum(name.chars().last());
    let prefix_ok = prefix.is_none_or(|p| {
        (1..=253).contains(&p.len())
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    name_ok && prefix_ok
}

fn ok(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed_unsync())
        .unwrap()
}

/// A query parameter's value (not decoded).
fn param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// A boolean query parameter as the real server reads it (Go's
/// `strconv.ParseBool`: `watch=1` is a watch as much as `watch=true`).
fn flag(query: &str, key: &str) -> bool {
    matches!(
        param(query, key),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True")
    )
}

/// The terms of `fieldSelector=a=b,c=d` (URL-encoded) on the fields the
/// real server selects ResourceSlices by.
type Selector = Vec<(String, String)>;

/// A bad selector is the message of a 400.
fn selector(query: &str) -> Result<Selector, String> {
    let mut want: Selector = Vec::new();
    for kv in query.split('&').filter(|q| !q.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        if k != "fieldSelector" {
            continue;
        }
        let v = v
            .replace("%3D", "=")
            .replace("%3d", "=")
            .replace("%2C", ",")
            .replace("%2c", ",");
        for term in v.split(',') {
            let Some((f, x)) = term.split_once('=') else {
                return Err(format!("invalid field selector {term:?}"));
            };
            if !["spec.nodeName", "spec.driver", "spec.pool.name"].contains(&f) {
                return Err(format!("field label not supported: {f}"));
            }
            want.push((f.to_string(), x.to_string()));
        }
    }
    Ok(want)
}

fn selects(want: &Selector, o: &Value) -> bool {
    want.iter().all(|(f, x)| {
        let v = match f.as_str() {
            "spec.nodeName" => &o["spec"]["nodeName"],
            "spec.driver" => &o["spec"]["driver"],
            _ => &o["spec"]["pool"]["name"],
        };
        v.as_str().unwrap_or_default() == x
    })
}

fn list_slices(s: &Store, query: &str) -> Response<Body> {
    let want = match selector(query) {
        Ok(w) => w,
        Err(why) => return status(400, "BadRequest", &why),
    };
    s.lists.fetch_add(1, Ordering::SeqCst);
    let slices = s.slices.lock().unwrap();
    // No change commits meanwhile: the list is exactly the state at `rv`.
    let _log = s.log.lock().unwrap();
    let items: Vec<Value> = slices
        .values()
        .filter(|o| selects(&want, o))
        .cloned()
        .collect();
    let rv = s.revision.load(Ordering::SeqCst).to_string();
    ok(
        200,
        &json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSliceList",
            "metadata": {"resourceVersion": rv},
            "items": items,
        }),
    )
}

/// A watch of ResourceSlices: the changes after `resourceVersion` (none
/// given or 0: from now), then each as it happens, with bookmarks when
/// asked for; 410 when the history it needs is compacted away.
fn watch_slices(s: Arc<Store>, query: &str) -> Response<Body> {
    let want = match selector(query) {
        Ok(w) => w,
        Err(why) => return status(400, "BadRequest", &why),
    };
    let asked = param(query, "resourceVersion").unwrap_or_default();
    s.watch_starts.lock().unwrap().push(asked.to_string());
    let from: u64 = match asked {
        "" => 0,
        v => match v.parse() {
            Ok(n) => n,
            Err(_) => {
                return status(
                    400,
                    "BadRequest",
                    &format!("resourceVersion {v:?}: a number"),
                )
            }
        },
    };
    let bookmarks = flag(query, "allowWatchBookmarks");
    let every = match s.bookmark_ms.load(Ordering::SeqCst) {
        0 => 100,
        ms => ms,
    };
    let (backlog, mut live, expired) = {
        let log = s.log.lock().unwrap();
        let from = if from == 0 {
            s.revision.load(Ordering::SeqCst)
        } else {
            from
        };
        let backlog: Vec<Msg> = log
            .events
            .iter()
            .filter(|(rv, _, _)| *rv > from)
            .map(|(rv, k, o)| Msg::Event(*rv, k, o.clone()))
            .collect();
        (backlog, log.live.subscribe(), from < log.floor)
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(64);
    tokio::spawn(async move {
        let line = |v: Value| Ok(Frame::data(Bytes::from(format!("{v}\n"))));
        let gone = json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version", "reason": "Expired", "code": 410,
        }});
        if expired {
            let _ = tx.send(line(gone)).await;
            return;
        }
        let mut last = from;
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(every));
        let mut pending = backlog;
        loop {
            let mut bookmark = None;
            if pending.is_empty() {
                tokio::select! {
                    m = live.recv() => match m {
                        Ok(m) => pending.push(m),
                        Err(_) => return,
                    },
                    _ = tick.tick(), if bookmarks => {
                        // Under the log's lock nothing commits: every
                        // change up to `now` is in `live` already.
                        let _log = s.log.lock().unwrap();
                        let now = s.revision.load(Ordering::SeqCst);
                        while let Ok(m) = live.try_recv() {
                            pending.push(m);
                        }
                        bookmark = Some(now);
                    }
                }
            }
            for m in std::mem::take(&mut pending) {
                let out = match m {
                    Msg::Event(rv, kind, obj) if rv > last && selects(&want, &obj) => {
                        last = rv;
                        json!({"type": kind, "object": obj})
                    }
                    Msg::Event(..) => continue,
                    Msg::Expire => {
                        let _ = tx.send(line(gone)).await;
                        return;
                    }
                    Msg::Close => return,
                };
                if tx.send(line(out)).await.is_err() {
                    return;
                }
            }
            if let Some(now) = bookmark {
                let b = json!({"type": "BOOKMARK", "object": {
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"resourceVersion": now.to_string()},
                }});
                if tx.send(line(b)).await.is_err() {
                    return;
                }
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed_unsync())
        .unwrap()
}

/// POST (`name` None) or PUT of a ResourceSlice, with the real server's
/// optimistic concurrency and generation bookkeeping.
fn write_slice(s: &Store, name: Option<&str>, body: &[u8]) -> Response<Body> {
    let mut obj: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return status(400, "BadRequest", &format!("not JSON: {e}")),
    };
    if obj["kind"] != "ResourceSlice" || obj["apiVersion"] != "resource.k8s.io/v1" {
        return status(
            400,
            "BadRequest",
            &format!(
                "kind {} apiVersion {}: a resource.k8s.io/v1 ResourceSlice is required",
                obj["kind"], obj["apiVersion"]
            ),
        );
    }
    let Some(obj_name) = obj["metadata"]["name"].as_str().map(str::to_string) else {
        return status(422, "Invalid", "metadata.name: Required value");
    };
    if s.drop_taints.load(Ordering::SeqCst) {
        for d in obj["spec"]["devices"].as_array_mut().into_iter().flatten() {
            if let Some(d) = d.as_object_mut() {
                d.remove("taints");
            }
        }
    }
    let mut slices = s.slices.lock().unwrap();
    match name {
        None => {
            if slices.contains_key(&obj_name) {
                return status(
                    409,
                    "AlreadyExists",
                    &format!("resourceslices.resource.k8s.io \"{obj_name}\" already exists"),
                );
            }
            if obj["metadata"]["resourceVersion"].is_string() {
                return status(
                    400,
                    "BadRequest",
                    "resourceVersion should not be set on objects to be created",
                );
            }
            let n = s.revision.load(Ordering::SeqCst) + 1;
            let m = &mut obj["metadata"];
            m["generation"] = json!(1);
            m["uid"] = json!(format!("00000000-0000-4000-8000-{n:012}"));
            s.commit("ADDED", &mut obj);
            slices.insert(obj_name, obj.clone());
            s.slice_writes.fetch_add(1, Ordering::SeqCst);
            ok(201, &obj)
        }
        Some(path_name) => {
            if path_name != obj_name {
                return status(
                    400,
                    "BadRequest",
                    &format!("the name of the object ({obj_name}) does not match the name on the URL ({path_name})"),
                );
            }
            let race = s
                .interfere
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if race {
                if let Some(o) = slices.get_mut(&obj_name) {
                    s.commit("MODIFIED", o);
                }
            }
            let Some(old) = slices.get(&obj_name) else {
                return status(
                    404,
                    "NotFound",
                    &format!("resourceslices.resource.k8s.io \"{obj_name}\" not found"),
                );
            };
            if obj["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
                return status(
                    409,
                    "Conflict",
                    &format!("Operation cannot be fulfilled on resourceslices.resource.k8s.io \"{obj_name}\": the object has been modified; please apply your changes to the latest version and try again"),
                );
            }
            if obj["spec"]["driver"] != old["spec"]["driver"]
                || obj["spec"]["nodeName"] != old["spec"]["nodeName"]
                || obj["spec"]["pool"]["name"] != old["spec"]["pool"]["name"]
            {
                return status(
                    422,
                    "Invalid",
                    "spec.driver, spec.nodeName, spec.pool.name: field is immutable",
                );
            }
            let gen = old["metadata"]["generation"].as_i64().unwrap_or(1);
            let gen = if obj["spec"] == old["spec"] {
                gen
            } else {
                gen + 1
            };
            let uid = old["metadata"]["uid"].clone();
            let m = &mut obj["metadata"];
            m["generation"] = json!(gen);
            m["uid"] = uid;
            s.commit("MODIFIED", &mut obj);
            slices.insert(obj_name, obj.clone());
            s.slice_writes.fetch_add(1, Ordering::SeqCst);
            ok(200, &obj)
        }
    }
}

/// A `metav1.Status` failure, as the API server answers errors.
fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed_unsync())
        .unwrap()
}

/// A claim as kube-scheduler leaves it for a share of a GPU (the GPU's
/// one device, `gpu-<i>`, allows multiple allocations) whose request
/// named both capacities: the request in spec, the result with
/// consumedCapacity and shareID in status.
pub fn shared_claim(
    ns: &str,
    name: &str,
    uid: &str,
    pool: &str,
    gpu: u32,
    memory: &str,
    compute: &str,
) -> Value {
    claim_naming(
        ns,
        name,
        uid,
        pool,
        gpu,
        &["memory", "compute"],
        memory,
        compute,
    )
}

/// A claim of GPU `gpu`'s one device whose request named only the
/// capacities in `named` (of `memory` and `compute`), as kube-scheduler
/// leaves it: consumedCapacity holds what was named and, for the rest,
/// the published request policy's default (KEP-5075), which the caller
/// passes in `memory` and `compute`. Naming none, with the GPU's whole
/// memory, is the whole-GPU class.
#[allow(clippy::too_many_arguments)]
pub fn claim_naming(
    ns: &str,
    name: &str,
    uid: &str,
    pool: &str,
    gpu: u32,
    named: &[&str],
    memory: &str,
    compute: &str,
) -> Value {
    let consumed = json!({"memory": memory, "compute": compute});
    let requests: serde_json::Map<String, Value> = named
        .iter()
        .map(|n| (n.to_string(), consumed[n].clone()))
        .collect();
    let mut exactly = json!({"deviceClassName": "gpu-shared.gpuslice.io"});
    if !requests.is_empty() {
        exactly["capacity"] = json!({"requests": requests});
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": ns, "name": name, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu",
            "driver": "gpu.gpuslice.io",
            "pool": pool,
            "device": format!("gpu-{gpu}"),
            "shareID": format!("{uid}-share"),
            "consumedCapacity": consumed,
        }]}}},
    })
}

/// A claim allocated one device without consumedCapacity: a MIG device
/// (`gpu-<i>-mig-<m>`), or a whole GPU (`gpu-<i>`) where consumable
/// capacity is off (1.34/1.35 without `DRAConsumableCapacity`: the device
/// is then allocated exclusively).
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
