//! The fake API server: Pods in one in-memory store with resource versions, a history of
//! watch events, and per-Pod logs the kubelet appends to.

use std::collections::{BTreeMap, HashMap};
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

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// One watch event.
#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    pub kind: &'static str,
    pub pod: Pod,
}

/// What the container wrote, in order, and whether it has ended.
#[derive(Debug, Default)]
pub struct Log {
    pub chunks: Vec<(bool, Vec<u8>)>, // (is stderr, bytes)
    pub started: bool,
    pub done: bool,
}

#[derive(Default)]
pub struct Inner {
    rv: u64,
    pub pods: BTreeMap<String, Pod>,
    history: Vec<Event>,
    pub logs: HashMap<String, Log>,
    /// Every write, in order: "POST pod", "DELETE pod" (the backend's budget).
    pub writes: Vec<String>,
}

pub struct State {
    /// This cluster's id, a label of every container its kubelet creates, so that one
    /// cluster's shutdown removes its own containers only (tests run several at once).
    pub instance: String,
    pub inner: Mutex<Inner>,
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

    pub fn set_log(&self, name: &str, change: impl FnOnce(&mut Log)) {
        let mut inner = self.inner.lock().unwrap();
        change(inner.logs.entry(name.to_owned()).or_default());
        drop(inner);
        self.tick.send_modify(|t| *t += 1);
    }

    pub fn writes(&self) -> Vec<String> {
        self.inner.lock().unwrap().writes.clone()
    }

    /// Every Pod this API server ever had, deleted ones included.
    #[allow(dead_code)] // by examples/fake_cluster.rs
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

    pub fn pod_names(&self) -> Vec<String> {
        self.inner.lock().unwrap().pods.keys().cloned().collect()
    }
}

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
        ("GET", ["api", "v1", "namespaces", _ns, "pods"])
            if q.get("watch").map(String::as_str) == Some("true") =>
        {
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
                    name.as_deref()
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
        ("GET", ["api", "v1", "namespaces", _ns, "pods"]) => {
            let selector = q.get("labelSelector").cloned().unwrap_or_default();
            let inner = state.inner.lock().unwrap();
            let items: Vec<&Pod> = inner
                .pods
                .values()
                .filter(|p| {
                    selector.split(',').filter(|s| !s.is_empty()).all(|s| {
                        let (k, v) = s.split_once('=').unwrap_or((s, ""));
                        p.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(k))
                            .is_some_and(|x| x == v)
                    })
                })
                .collect();
            full(
                200,
                &json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": inner.rv.to_string()}, "items": items}),
            )
        }
        ("GET", ["api", "v1", "namespaces", _ns, "pods", name]) => {
            match state.inner.lock().unwrap().pods.get(*name) {
                Some(pod) => full(200, &serde_json::to_value(pod).unwrap()),
                None => status(404, "NotFound", &format!("pods \"{name}\" not found")),
            }
        }
        ("DELETE", ["api", "v1", "namespaces", _ns, "pods", name]) => {
            let mut inner = state.inner.lock().unwrap();
            let Some(pod) = inner.pods.get(*name).cloned() else {
                return Ok(status(
                    404,
                    "NotFound",
                    &format!("pods \"{name}\" not found"),
                ));
            };
            inner.writes.push(format!("DELETE {name}"));
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let started = inner.logs.get(*name).is_some_and(|l| l.started);
            if phase == "Succeeded" || phase == "Failed" || !started {
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
        _ => status(
            404,
            "NotFound",
            &format!("the fake API server has no {} {}", method, req.uri().path()),
        ),
    })
}

/// The Pod's containers may be started (it was not deleted meanwhile).
pub fn is_deleted(state: &State, name: &str) -> bool {
    let inner = state.inner.lock().unwrap();
    inner
        .pods
        .get(name)
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}
