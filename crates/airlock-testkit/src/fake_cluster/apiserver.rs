//! The fake API server: Pods in one in-memory store with resource versions, a history of
//! watch events, and per-Pod logs the kubelet appends to; the namespace objects `airlock
//! kube install` applies and `airlock doctor` reads (`store.rs`: server-side apply,
//! RBAC); SelfSubjectAccessReviews; bearer tokens naming users whose every request is
//! authorized by the stored RBAC objects. A request without a token acts as the cluster's
//! admin (the end-to-end tests' client, and an admin's `airlock kube install`). Lists of
//! Pods take a label selector and pages (`limit`, `continue`); every request is recorded.

use std::collections::{BTreeMap, HashMap};

use super::store::{self, Attributes, Key, Kind, Stored, User};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

/// The body of every response.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// One watch event.
#[derive(Debug, Clone)]
pub struct Event {
    /// The resource version it made.
    pub rv: u64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    /// The Pod as it was then.
    pub pod: Pod,
}

/// What the container wrote, in order, and whether it has ended.
#[derive(Debug, Default)]
pub struct Log {
    /// What it wrote: (whether on stderr, the bytes).
    pub chunks: Vec<(bool, Vec<u8>)>,
    /// Whether the container has started (a log request before waits).
    pub started: bool,
    /// Whether it has ended (a following log request ends then).
    pub done: bool,
}

/// Everything the API server holds, behind [`State::inner`].
#[derive(Default)]
pub struct Inner {
    rv: u64,
    /// The Pods, by name.
    pub pods: BTreeMap<String, Pod>,
    history: Vec<Event>,
    /// Each Pod's log, by Pod name.
    pub logs: HashMap<String, Log>,
    /// Every write, in order: "POST pod", "DELETE pod" (the backend's budget).
    pub writes: Vec<String>,
    /// Every object other than Pods.
    pub objects: BTreeMap<Key, Stored>,
    /// Every write of those that changed something, in order: "create networkpolicies
    /// airlock-jobs/airlock-deny-all", "update …", "delete …".
    pub object_writes: Vec<String>,
    /// Bearer token → user.
    pub users: HashMap<String, User>,
    /// Every request, in order.
    pub requests: Vec<Recorded>,
    /// Pages of Pods cut before the label selector is applied, as etcd does: a page may
    /// hold fewer items than `limit`, none at all, and still have a `continue` token.
    pub sparse_pages: bool,
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// `GET`, `POST`, ….
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query's parameters.
    pub query: HashMap<String, String>,
    /// The `Content-Type` header; empty without one.
    pub content_type: String,
    /// The user of its token; empty for the admin (no token).
    pub user: String,
}

/// What a `continue` token of a Pod list starts with (the rest: the last name listed).
const CONTINUE_PREFIX: &str = "fake-after:";

/// The fake API server's state, shared by the server, the kubelet and the tests.
pub struct State {
    /// This cluster's id, a label of every container its kubelet creates, so that one
    /// cluster's shutdown removes its own containers only (tests run several at once).
    pub instance: String,
    /// Everything stored.
    pub inner: Mutex<Inner>,
    /// Every watch event as it happens (the kubelet runs each `ADDED` Pod).
    pub events: broadcast::Sender<Event>,
    /// Bumped on every log append.
    pub tick: watch::Sender<u64>,
}

fn full(code: u16, value: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(value).unwrap())).boxed_unsync())
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    full(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": if code < 300 { "Success" } else { "Failure" }, "code": code, "reason": reason, "message": message}),
    )
}

fn streaming(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(200)
        .body(StreamBody::new(stream).boxed_unsync())
        .unwrap()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

impl State {
    /// An empty cluster with an instance id of its own.
    pub fn new() -> Arc<Self> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static CLUSTERS: AtomicU64 = AtomicU64::new(0);
        Arc::new(Self {
            instance: format!(
                "{}-{}",
                std::process::id(),
                CLUSTERS.fetch_add(1, Ordering::Relaxed)
            ),
            inner: Mutex::new(Inner::default()),
            events: broadcast::channel(4096).0,
            tick: watch::channel(0).0,
        })
    }

    /// Stores a new version of a Pod and tells the watchers (kind: ADDED, MODIFIED, DELETED).
    pub fn emit(&self, inner: &mut Inner, kind: &'static str, mut pod: Pod) -> Pod {
        inner.rv += 1;
        pod.metadata.resource_version = Some(inner.rv.to_string());
        let name = pod.metadata.name.clone().unwrap_or_default();
        if kind == "DELETED" {
            inner.pods.remove(&name);
        } else {
            inner.pods.insert(name, pod.clone());
        }
        let event = Event {
            rv: inner.rv,
            kind,
            pod: pod.clone(),
        };
        inner.history.push(event.clone());
        let _ = self.events.send(event);
        pod
    }

    /// Changes a stored Pod (`None` when it is gone).
    pub fn update(&self, name: &str, change: impl FnOnce(&mut Pod)) -> Option<Pod> {
        let mut inner = self.inner.lock().unwrap();
        let mut pod = inner.pods.get(name)?.clone();
        change(&mut pod);
        Some(self.emit(&mut inner, "MODIFIED", pod))
    }

    /// Removes a Pod whose containers are gone (the kubelet's final delete).
    pub fn remove(&self, name: &str) {
        let mut inner = self.inner.lock().unwrap();
        if let Some(pod) = inner.pods.get(name).cloned() {
            self.emit(&mut inner, "DELETED", pod);
        }
        inner.logs.remove(name);
    }

    /// Appends what a Pod's container wrote to its log.
    pub fn append_log(&self, name: &str, stderr: bool, bytes: &[u8]) {
        let mut inner = self.inner.lock().unwrap();
        inner
            .logs
            .entry(name.to_owned())
            .or_default()
            .chunks
            .push((stderr, bytes.to_vec()));
        drop(inner);
        self.tick.send_modify(|t| *t += 1);
    }

    /// Changes a Pod's log (its `started` or `done`).
    pub fn set_log(&self, name: &str, change: impl FnOnce(&mut Log)) {
        let mut inner = self.inner.lock().unwrap();
        change(inner.logs.entry(name.to_owned()).or_default());
        drop(inner);
        self.tick.send_modify(|t| *t += 1);
    }

    /// Every write of a Pod so far ([`Inner::writes`]).
    pub fn writes(&self) -> Vec<String> {
        self.inner.lock().unwrap().writes.clone()
    }

    /// Every Pod this API server ever had, deleted ones included.
    pub fn pods_ever(&self) -> Vec<String> {
        let inner = self.inner.lock().unwrap();
        let mut names: Vec<String> = inner
            .history
            .iter()
            .filter_map(|e| e.pod.metadata.name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The Pods stored now.
    pub fn pod_names(&self) -> Vec<String> {
        self.inner.lock().unwrap().pods.keys().cloned().collect()
    }

    /// Stores a Pod as given (its creation time included), as if created long ago.
    pub fn insert_pod(&self, pod: Pod) {
        let mut inner = self.inner.lock().unwrap();
        self.emit(&mut inner, "ADDED", pod);
    }

    /// A bearer token for `name`, whose requests RBAC then authorizes.
    pub fn add_user(&self, token: &str, name: &str) {
        self.inner.lock().unwrap().users.insert(
            token.to_owned(),
            User {
                name: name.to_owned(),
                groups: vec!["system:authenticated".to_owned()],
            },
        );
    }

    /// Every request so far ([`Inner::requests`]).
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// Every write of an object other than a Pod so far ([`Inner::object_writes`]).
    pub fn object_writes(&self) -> Vec<String> {
        self.inner.lock().unwrap().object_writes.clone()
    }

    /// The stored object of kind `K` (`namespace` empty for a cluster-scoped one).
    pub fn object<K: k8s_openapi::Resource + serde::de::DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<K> {
        self.object_value(K::URL_PATH_SEGMENT, namespace, name)
            .map(|v| serde_json::from_value(v).unwrap())
    }

    /// The stored object of the kind named `plural`, as JSON ([`Self::object`]).
    pub fn object_value(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let inner = self.inner.lock().unwrap();
        inner
            .objects
            .get(&Key::new(plural, namespace, name))
            .map(|s| s.object.clone())
    }

    /// Changes a stored object as `manager` would with an update (not an apply), e.g. an
    /// operator's `kubectl edit`; false when there is no such object.
    pub fn update_object(
        &self,
        manager: &str,
        plural: &str,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let key = Key::new(plural, namespace, name);
        let Some(stored) = inner.objects.get(&key).cloned() else {
            return false;
        };
        let mut object = stored.object.clone();
        change(&mut object);
        let next = store::update(Some(&stored), manager, object);
        write_object(&mut inner, key, Some(&stored), next);
        true
    }

    /// Removes a stored object (and, for a namespace, everything in it).
    pub fn delete_object(&self, plural: &str, namespace: &str, name: &str) -> bool {
        let mut inner = self.inner.lock().unwrap();
        delete_object(&mut inner, &Key::new(plural, namespace, name))
    }
}

/// Stores `next` under a new resource version, unless it changes nothing (as the real
/// server skips a no-op write); returns the object as the server shows it.
fn write_object(inner: &mut Inner, key: Key, before: Option<&Stored>, mut next: Stored) -> Value {
    let api_version = next
        .object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    next.object["metadata"]["managedFields"] = next.managed_fields(&api_version);
    if before.is_some_and(|b| b.object == next.object) {
        return next.object;
    }
    inner.rv += 1;
    next.object["metadata"]["resourceVersion"] = inner.rv.to_string().into();
    let verb = if before.is_some() { "update" } else { "create" };
    inner
        .object_writes
        .push(format!("{verb} {}", describe(&key)));
    let object = next.object.clone();
    inner.objects.insert(key, next);
    object
}

fn delete_object(inner: &mut Inner, key: &Key) -> bool {
    if inner.objects.remove(key).is_none() {
        return false;
    }
    inner
        .object_writes
        .push(format!("delete {}", describe(key)));
    if key.plural == "namespaces" {
        inner.objects.retain(|k, _| k.namespace != key.name);
    }
    true
}

fn describe(key: &Key) -> String {
    if key.namespace.is_empty() {
        format!("{} {}", key.plural, key.name)
    } else {
        format!("{} {}/{}", key.plural, key.namespace, key.name)
    }
}

/// Serves the API on `listener` until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<State>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path: Vec<String> = req
        .uri()
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let q = query(&req);
    let method = req.method().clone();
    let segs: Vec<&str> = path.iter().map(String::as_str).collect();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let user = match authenticate(&state, &req) {
        Ok(user) => user,
        Err(message) => return Ok(status(401, "Unauthorized", message)),
    };
    {
        let mut inner = state.inner.lock().unwrap();
        inner.requests.push(Recorded {
            method: method.to_string(),
            path: req.uri().path().to_owned(),
            query: q.clone(),
            content_type: content_type.clone(),
            user: user.as_ref().map(|u| u.name.clone()).unwrap_or_default(),
        });
        if let (Some(user), Some(a)) = (&user, attributes(method.as_str(), &segs, &q))
            // Every user may ask what it may do.
            && a.resource != "selfsubjectaccessreviews"
            && !store::allowed(&inner.objects, user, &a)
        {
            return Ok(status(403, "Forbidden", &a.forbidden(user)));
        }
    }
    Ok(match (method.as_str(), segs.as_slice()) {
        ("GET", ["version"]) => full(
            200,
            &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "gitCommit": "", "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "", "platform": "linux/amd64"}),
        ),
        ("POST", ["api", "v1", "namespaces", ns, "pods"]) => {
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let Ok(mut pod) = serde_json::from_slice::<Pod>(&body) else {
                return Ok(status(400, "BadRequest", "not a Pod"));
            };
            let name = pod.metadata.name.clone().unwrap_or_default();
            let mut inner = state.inner.lock().unwrap();
            if inner.pods.contains_key(&name) {
                return Ok(status(
                    409,
                    "AlreadyExists",
                    &format!("pods \"{name}\" already exists"),
                ));
            }
            inner.writes.push(format!("POST {name}"));
            pod.metadata.namespace = Some((*ns).to_owned());
            pod.metadata.uid = Some(format!("uid-{name}"));
            pod.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
            pod.status = Some(serde_json::from_value(json!({"phase": "Pending"})).unwrap());
            let pod = state.emit(&mut inner, "ADDED", pod);
            full(201, &serde_json::to_value(&pod).unwrap())
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods"])
            if q.get("watch").map(String::as_str) == Some("true") =>
        {
            let ns = (*ns).to_owned();
            let name = q
                .get("fieldSelector")
                .and_then(|f| f.strip_prefix("metadata.name="))
                .map(str::to_owned);
            let from: u64 = q
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let timeout = q
                .get("timeoutSeconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(290u64);
            let (tx, rx) = mpsc::channel(64);
            let (backlog, mut live) = {
                let inner = state.inner.lock().unwrap();
                let backlog: Vec<Event> = inner
                    .history
                    .iter()
                    .filter(|e| e.rv > from)
                    .cloned()
                    .collect();
                (backlog, state.events.subscribe())
            };
            tokio::spawn(async move {
                let matches = |e: &Event| {
                    e.pod.metadata.namespace.as_deref() == Some(ns.as_str())
                        && name
                            .as_deref()
                            .is_none_or(|n| e.pod.metadata.name.as_deref() == Some(n))
                };
                let line = |e: &Event| {
                    let mut text =
                        serde_json::to_vec(&json!({"type": e.kind, "object": e.pod})).unwrap();
                    text.push(b'\n');
                    Bytes::from(text)
                };
                let mut last = from;
                for e in backlog.iter().filter(|e| matches(e)) {
                    last = e.rv;
                    if tx.send(line(e)).await.is_err() {
                        return;
                    }
                }
                let end = tokio::time::sleep(Duration::from_secs(timeout));
                tokio::pin!(end);
                loop {
                    tokio::select! {
                        event = live.recv() => match event {
                            Ok(e) if e.rv > last && matches(&e) => {
                                last = e.rv;
                                if tx.send(line(&e)).await.is_err() { return; }
                            }
                            Ok(_) => {}
                            Err(_) => return,
                        },
                        _ = &mut end => return,
                    }
                }
            });
            streaming(rx)
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods"]) => {
            let selector = q.get("labelSelector").cloned().unwrap_or_default();
            let limit: usize = q
                .get("limit")
                .and_then(|v| v.parse().ok())
                .filter(|l| *l > 0)
                .unwrap_or(usize::MAX);
            let after = match q.get("continue").filter(|c| !c.is_empty()) {
                None => None,
                Some(token) => match token.strip_prefix(CONTINUE_PREFIX) {
                    Some(name) => Some(name.to_owned()),
                    None => {
                        return Ok(status(400, "BadRequest", "continue key is not valid"));
                    }
                },
            };
            let inner = state.inner.lock().unwrap();
            let (mut items, mut scanned, mut last, mut more) = (Vec::new(), 0, None, false);
            for (name, pod) in inner.pods.iter().filter(|(name, pod)| {
                pod.metadata.namespace.as_deref() == Some(*ns)
                    && after.as_deref().is_none_or(|a| name.as_str() > a)
            }) {
                if items.len() >= limit || (inner.sparse_pages && scanned >= limit) {
                    more = true;
                    break;
                }
                scanned += 1;
                last = Some(name.clone());
                match store::selector_matches(&selector, pod.metadata.labels.as_ref()) {
                    Ok(true) => items.push(pod),
                    Ok(false) => {}
                    Err(e) => return Ok(status(400, "BadRequest", &e)),
                }
            }
            let mut metadata = json!({"resourceVersion": inner.rv.to_string()});
            if more && let Some(last) = last {
                metadata["continue"] = format!("{CONTINUE_PREFIX}{last}").into();
            }
            full(
                200,
                &json!({"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items}),
            )
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
            match state.inner.lock().unwrap().pods.get(*name) {
                Some(pod) if pod.metadata.namespace.as_deref() == Some(*ns) => {
                    full(200, &serde_json::to_value(pod).unwrap())
                }
                _ => status(404, "NotFound", &format!("pods \"{name}\" not found")),
            }
        }
        ("DELETE", ["api", "v1", "namespaces", ns, "pods", name]) => {
            let name = (*name).to_owned();
            let ns = (*ns).to_owned();
            let options: Value = req
                .into_body()
                .collect()
                .await
                .ok()
                .and_then(|b| serde_json::from_slice(&b.to_bytes()).ok())
                .unwrap_or_default();
            let name = name.as_str();
            let mut inner = state.inner.lock().unwrap();
            let Some(pod) = inner
                .pods
                .get(name)
                .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
                .cloned()
            else {
                return Ok(status(
                    404,
                    "NotFound",
                    &format!("pods \"{name}\" not found"),
                ));
            };
            inner.writes.push(format!("DELETE {name}"));
            // gracePeriodSeconds 0: removed from the API at once, as the real server does
            // (the kubelet kills the containers after).
            let now = options.get("gracePeriodSeconds").and_then(Value::as_i64) == Some(0);
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let started = inner.logs.get(name).is_some_and(|l| l.started);
            if now || phase == "Succeeded" || phase == "Failed" || !started {
                // Ended (or never started): gone at once, as the real API server does.
                // (A kubelet still creating it sees it gone and stops.)
                state.emit(&mut inner, "DELETED", pod);
                status(200, "", "")
            } else {
                let mut pod = pod;
                pod.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::now(),
                    ));
                pod.metadata.deletion_grace_period_seconds = Some(1);
                let pod = state.emit(&mut inner, "MODIFIED", pod);
                full(200, &serde_json::to_value(&pod).unwrap())
            }
        }
        ("GET", ["api", "v1", "namespaces", _ns, "pods", name, "log"]) => {
            let name = (*name).to_owned();
            let follow = q.get("follow").map(String::as_str) == Some("true");
            let limit: u64 = q
                .get("limitBytes")
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX);
            let want: Option<bool> = match q.get("stream").map(String::as_str) {
                Some("Stdout") => Some(false),
                Some("Stderr") => Some(true),
                _ => None,
            };
            {
                let inner = state.inner.lock().unwrap();
                if !inner.logs.get(&name).is_some_and(|l| l.started) {
                    return Ok(status(
                        400,
                        "BadRequest",
                        &format!(
                            "container \"job\" in pod \"{name}\" is waiting to start: ContainerCreating"
                        ),
                    ));
                }
            }
            let (tx, rx) = mpsc::channel(16);
            let state = state.clone();
            tokio::spawn(async move {
                let mut tick = state.tick.subscribe();
                let (mut chunk, mut sent) = (0usize, 0u64);
                loop {
                    let (pending, done) = {
                        let inner = state.inner.lock().unwrap();
                        let Some(log) = inner.logs.get(&name) else {
                            return;
                        };
                        let pending: Vec<Vec<u8>> = log.chunks[chunk..]
                            .iter()
                            .filter(|(err, _)| want.is_none_or(|w| w == *err))
                            .map(|(_, b)| b.clone())
                            .collect();
                        chunk = log.chunks.len();
                        (pending, log.done)
                    };
                    for bytes in pending {
                        let room = limit.saturating_sub(sent) as usize;
                        let part = &bytes[..bytes.len().min(room)];
                        sent += part.len() as u64;
                        if !part.is_empty() && tx.send(Bytes::copy_from_slice(part)).await.is_err()
                        {
                            return;
                        }
                        if sent >= limit {
                            return;
                        }
                    }
                    if done || !follow {
                        return;
                    }
                    if tick.changed().await.is_err() {
                        return;
                    }
                }
            });
            streaming(rx)
        }
        (
            "POST",
            [
                "apis",
                "authorization.k8s.io",
                "v1",
                "selfsubjectaccessreviews",
            ],
        ) => {
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let Ok(mut review) = serde_json::from_slice::<Value>(&body) else {
                return Ok(status(400, "BadRequest", "not a SelfSubjectAccessReview"));
            };
            let field = |f: &str| {
                review["spec"]["resourceAttributes"][f]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            };
            let asked = Attributes {
                verb: field("verb"),
                group: field("group"),
                resource: field("resource"),
                subresource: field("subresource"),
                namespace: field("namespace"),
                name: field("name"),
            };
            let allowed = match &user {
                None => true,
                Some(user) => store::allowed(&state.inner.lock().unwrap().objects, user, &asked),
            };
            review["status"] = json!({"allowed": allowed});
            full(201, &review)
        }
        (_, ["api", "v1", rest @ ..]) => {
            let body = req.into_body().collect().await.map(|b| b.to_bytes());
            objects_request(
                &state,
                method.as_str(),
                "",
                "v1",
                rest,
                &q,
                &content_type,
                &user,
                body.unwrap_or_default(),
            )
        }
        (_, ["apis", group, version, rest @ ..]) => {
            let (group, version) = ((*group).to_owned(), (*version).to_owned());
            let body = req.into_body().collect().await.map(|b| b.to_bytes());
            objects_request(
                &state,
                method.as_str(),
                &group,
                &version,
                rest,
                &q,
                &content_type,
                &user,
                body.unwrap_or_default(),
            )
        }
        _ => status(
            404,
            "NotFound",
            &format!("the fake API server has no {} {}", method, req.uri().path()),
        ),
    })
}

/// The user of the request's bearer token; `None` for no token (the admin); an error for
/// a token the server does not know.
fn authenticate(state: &State, req: &Request<Incoming>) -> Result<Option<User>, &'static str> {
    let Some(header) = req.headers().get("authorization") else {
        return Ok(None);
    };
    let token = header
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Bearer "))
        .unwrap_or_default();
    match state.inner.lock().unwrap().users.get(token) {
        Some(user) => Ok(Some(user.clone())),
        None => Err("Unauthorized"),
    }
}

/// What a request asks, as RBAC sees it; `None` for a path that names no resource
/// (`/version`), which everyone may read.
fn attributes(method: &str, segs: &[&str], q: &HashMap<String, String>) -> Option<Attributes> {
    let (group, rest) = match segs {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, resource, name, subresource) = match rest {
        ["namespaces"] => ("", "namespaces", "", ""),
        ["namespaces", name] => ("", "namespaces", *name, ""),
        ["namespaces", ns, resource] => (*ns, *resource, "", ""),
        ["namespaces", ns, resource, name] => (*ns, *resource, *name, ""),
        ["namespaces", ns, resource, name, sub] => (*ns, *resource, *name, *sub),
        [resource] => ("", *resource, "", ""),
        [resource, name] => ("", *resource, *name, ""),
        [resource, name, sub] => ("", *resource, *name, *sub),
        _ => return None,
    };
    let watch = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (method, name.is_empty()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "list",
        ("GET", false) => "get",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", true) => "deletecollection",
        ("DELETE", false) => "delete",
        (other, _) => {
            return Some(Attributes {
                verb: other.to_lowercase(),
                ..Default::default()
            });
        }
    };
    Some(Attributes {
        verb: verb.to_owned(),
        group: group.to_owned(),
        resource: resource.to_owned(),
        subresource: subresource.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

fn not_found(kind: &Kind, name: &str) -> Response<Body> {
    let resource = if kind.group.is_empty() {
        kind.plural.to_owned()
    } else {
        format!("{}.{}", kind.plural, kind.group)
    };
    status(404, "NotFound", &format!("{resource} {name:?} not found"))
}

/// GET, list, server-side apply (PATCH), create (POST) and DELETE of the kinds in
/// `store::KINDS`.
#[allow(clippy::too_many_arguments)]
fn objects_request(
    state: &State,
    method: &str,
    group: &str,
    version: &str,
    rest: &[&str],
    q: &HashMap<String, String>,
    content_type: &str,
    user: &Option<User>,
    body: Bytes,
) -> Response<Body> {
    let (plural, namespace, name) = match rest {
        ["namespaces"] => ("namespaces", "", None),
        ["namespaces", name] => ("namespaces", "", Some(*name)),
        ["namespaces", ns, plural] => (*plural, *ns, None),
        ["namespaces", ns, plural, name] => (*plural, *ns, Some(*name)),
        [plural] => (*plural, "", None),
        [plural, name] => (*plural, "", Some(*name)),
        _ => ("", "", None),
    };
    let Some(kind) = store::find(group, version, plural)
        .filter(|k| k.namespaced != namespace.is_empty() || (method == "GET" && name.is_none()))
    else {
        return status(
            404,
            "NotFound",
            &format!("the fake API server has no {method} {group}/{version} {rest:?}"),
        );
    };
    let mut inner = state.inner.lock().unwrap();
    let namespace_exists = |inner: &Inner| {
        inner
            .objects
            .contains_key(&Key::new("namespaces", "", namespace))
    };
    match (method, name) {
        ("GET", Some(name)) => match inner.objects.get(&Key::new(plural, namespace, name)) {
            Some(stored) => full(200, &stored.object),
            None => not_found(&kind, name),
        },
        ("GET", None) => {
            let selector = q.get("labelSelector").cloned().unwrap_or_default();
            let mut items = Vec::new();
            for (key, stored) in &inner.objects {
                if key.plural != plural || (!namespace.is_empty() && key.namespace != namespace) {
                    continue;
                }
                let labels: Option<BTreeMap<String, String>> =
                    serde_json::from_value(stored.object["metadata"]["labels"].clone()).ok();
                match store::selector_matches(&selector, labels.as_ref()) {
                    Ok(true) => items.push(stored.object.clone()),
                    Ok(false) => {}
                    Err(e) => return status(400, "BadRequest", &e),
                }
            }
            full(
                200,
                &json!({"kind": format!("{}List", kind.kind), "apiVersion": kind.api_version(), "metadata": {"resourceVersion": inner.rv.to_string()}, "items": items}),
            )
        }
        ("PATCH", Some(name)) => {
            if content_type != "application/apply-patch+yaml" {
                return status(
                    415,
                    "UnsupportedMediaType",
                    &format!(
                        "the fake API server supports server-side apply only, not {content_type:?}"
                    ),
                );
            }
            let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()) else {
                return status(
                    422,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                );
            };
            let force = q.get("force").map(String::as_str) == Some("true");
            let config = match checked_body(&kind, namespace, Some(name), &body) {
                Ok(config) => config,
                Err(message) => return status(400, "BadRequest", &message),
            };
            if kind.namespaced && !namespace_exists(&inner) {
                return status(
                    404,
                    "NotFound",
                    &format!("namespaces {namespace:?} not found"),
                );
            }
            let key = Key::new(plural, namespace, name);
            let before = inner.objects.get(&key).cloned();
            let base = before
                .clone()
                .unwrap_or_else(|| new_object(&kind, namespace, name));
            match store::apply(Some(&base), manager, &config, force) {
                Ok(next) => {
                    let object = write_object(&mut inner, key, before.as_ref(), next);
                    full(if before.is_some() { 200 } else { 201 }, &object)
                }
                Err(conflicts) => status(
                    409,
                    "Conflict",
                    &format!(
                        "Apply failed with {} conflict(s): {}",
                        conflicts.len(),
                        conflicts.join("; ")
                    ),
                ),
            }
        }
        ("POST", None) => {
            let config = match checked_body(&kind, namespace, None, &body) {
                Ok(config) => config,
                Err(message) => return status(400, "BadRequest", &message),
            };
            let Some(name) = config["metadata"]["name"].as_str().map(str::to_owned) else {
                return status(422, "Invalid", "metadata.name: Required value");
            };
            if kind.namespaced && !namespace_exists(&inner) {
                return status(
                    404,
                    "NotFound",
                    &format!("namespaces {namespace:?} not found"),
                );
            }
            let key = Key::new(plural, namespace, &name);
            if inner.objects.contains_key(&key) {
                return status(
                    409,
                    "AlreadyExists",
                    &format!("{plural} {name:?} already exists"),
                );
            }
            let mut object = new_object(&kind, namespace, &name).object;
            for (path, value) in store::leaves(&config) {
                set_path(&mut object, &path, value);
            }
            let manager = q
                .get("fieldManager")
                .cloned()
                .or_else(|| user.as_ref().map(|u| u.name.clone()))
                .unwrap_or_else(|| "admin".to_owned());
            let next = store::update(None, &manager, object);
            let object = write_object(&mut inner, key, None, next);
            full(201, &object)
        }
        ("DELETE", Some(name)) => {
            let key = Key::new(plural, namespace, name);
            let Some(stored) = inner.objects.get(&key).cloned() else {
                return not_found(&kind, name);
            };
            delete_object(&mut inner, &key);
            full(200, &stored.object)
        }
        _ => status(
            405,
            "MethodNotAllowed",
            &format!("{method} is not supported here"),
        ),
    }
}

fn set_path(object: &mut Value, path: &[String], value: Value) {
    let mut at = object;
    for k in path {
        if !at.is_object() {
            *at = json!({});
        }
        at = at
            .as_object_mut()
            .unwrap()
            .entry(k.clone())
            .or_insert(Value::Null);
    }
    *at = value;
}

/// A body naming the kind, name and namespace of the URL, as the real server requires (else
/// a 400's message).
fn checked_body(
    kind: &Kind,
    namespace: &str,
    name: Option<&str>,
    body: &[u8],
) -> Result<Value, String> {
    let Ok(config) = serde_json::from_slice::<Value>(body) else {
        return Err(
            "the fake API server reads JSON bodies only (the JSON subset of YAML)".to_owned(),
        );
    };
    if config["apiVersion"] != kind.api_version().as_str() || config["kind"] != kind.kind {
        return Err(format!(
            "the body is a {}/{}, not a {} {}",
            config["apiVersion"],
            config["kind"],
            kind.api_version(),
            kind.kind
        ));
    }
    if let Some(name) = name
        && config["metadata"]["name"].as_str() != Some(name)
    {
        return Err(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            config["metadata"]["name"]
        ));
    }
    if kind.namespaced
        && let Some(ns) = config["metadata"]["namespace"].as_str()
        && ns != namespace
    {
        return Err(
            "the namespace of the provided object does not match the namespace sent on the request"
                .to_owned(),
        );
    }
    Ok(config)
}

/// What the server gives a new object: identity, uid, creation time; a Namespace its
/// `kubernetes.io/metadata.name` label and phase.
fn new_object(kind: &Kind, namespace: &str, name: &str) -> Stored {
    let mut metadata = json!({
        "name": name,
        "uid": format!("uid-{}-{name}", kind.plural),
        "creationTimestamp": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ),
    });
    if kind.namespaced {
        metadata["namespace"] = namespace.into();
    }
    let mut object =
        json!({"apiVersion": kind.api_version(), "kind": kind.kind, "metadata": metadata});
    if kind.plural == "namespaces" {
        object["metadata"]["labels"] = json!({"kubernetes.io/metadata.name": name});
        object["status"] = json!({"phase": "Active"});
    }
    Stored {
        object,
        ..Default::default()
    }
}

/// The Pod's containers may be started (it was not deleted meanwhile).
pub fn is_deleted(state: &State, name: &str) -> bool {
    let inner = state.inner.lock().unwrap();
    inner
        .pods
        .get(name)
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}
