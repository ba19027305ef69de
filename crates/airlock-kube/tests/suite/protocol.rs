//! The backend's conversation with the API server, against kube-rs's `tower-test` mock:
//! create, watch to each terminal state, the log with `limitBytes`, delete; and the answers
//! 409, 403, 404, 410 and 429. Every scenario also counts the writes: at most two per job.

use std::time::Duration;

use airlock_core::policy::KubeLogStreams;
use airlock_core::{ErrorKind, JobSpec, LimitHit, Outcome, Policy, RunReport, Termination};
use airlock_kube::{KubeBackend, KubeError};
use http::{Request, Response};
use k8s_openapi::api::core::v1::Pod;
use kube::client::Body;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tower_test::mock;

use super::common::{DIGEST, policy, python};

type Handle = mock::Handle<Request<Body>, Response<Body>>;
type Send = mock::SendResponse<Response<Body>>;

/// The API server's side of one job.
struct Server {
    handle: Handle,
    ns: String,
    name: String,
    writes: Vec<String>,
}

fn respond(send: Send, code: u16, body: Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message})
}

fn events(events: &[(&str, Value)]) -> Body {
    let mut text = Vec::new();
    for (kind, object) in events {
        text.extend(serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap());
        text.push(b'\n');
    }
    Body::from(text)
}

fn query(request: &Request<Body>) -> Vec<(String, String)> {
    request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.replace("%3D", "="))
        })
        .collect()
}

impl Server {
    fn path(&self, suffix: &str) -> String {
        format!("/api/v1/namespaces/{}/pods{suffix}", self.ns)
    }

    async fn next(&mut self) -> (Request<Body>, Send) {
        let (request, send) =
            tokio::time::timeout(Duration::from_secs(10), self.handle.next_request())
                .await
                .expect("the backend made no request in 10 s")
                .expect("the client is gone");
        if request.method() != http::Method::GET {
            self.writes
                .push(format!("{} {}", request.method(), request.uri().path()));
        }
        (request, send)
    }

    async fn expect(&mut self, method: &str, suffix: &str) -> (Request<Body>, Send) {
        let (request, send) = self.next().await;
        assert_eq!(
            (request.method().as_str(), request.uri().path()),
            (method, self.path(suffix).as_str()),
            "{}",
            request.uri()
        );
        (request, send)
    }

    /// Answers the create with the Pod it was sent, version 1.
    async fn create(&mut self) -> Value {
        let (request, send) = self.expect("POST", "").await;
        let body = request.into_body().collect_bytes().await.unwrap();
        let mut pod: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(pod["metadata"]["name"], self.name.as_str());
        pod["metadata"]["resourceVersion"] = "1".into();
        pod["metadata"]["uid"] = "u-1".into();
        respond(send, 201, pod.clone());
        pod
    }

    async fn watch(&mut self, from: &str) -> Send {
        let (request, send) = self.expect("GET", "").await;
        let q = query(&request);
        assert!(q.contains(&("watch".into(), "true".into())), "{q:?}");
        assert!(
            q.contains(&("resourceVersion".into(), from.into())),
            "{q:?}"
        );
        assert!(
            q.contains(&(
                "fieldSelector".into(),
                format!("metadata.name={}", self.name)
            )),
            "{q:?}"
        );
        send
    }

    async fn log(&mut self) -> (Vec<(String, String)>, Send) {
        let (request, send) = self.expect("GET", &format!("/{}/log", self.name)).await;
        (query(&request), send)
    }

    async fn delete(&mut self) -> Send {
        let (request, send) = self.expect("DELETE", &format!("/{}", self.name)).await;
        let body = request.into_body().collect_bytes().await.unwrap();
        let options: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(options["gracePeriodSeconds"], 1);
        send
    }

    async fn deleted_at_once(&mut self) {
        let send = self.delete().await;
        respond(
            send,
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}),
        );
    }

    /// Nothing more is asked (no third write, no stray read).
    async fn done(mut self) -> Vec<String> {
        if let Ok(Some((request, _))) =
            tokio::time::timeout(Duration::from_millis(200), self.handle.next_request()).await
        {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
        self.writes
    }
}

fn with_state(
    pod: &Value,
    version: &str,
    phase: &str,
    state: Value,
    pod_reason: Option<&str>,
) -> Value {
    let mut pod = pod.clone();
    pod["metadata"]["resourceVersion"] = version.into();
    pod["status"] = json!({"phase": phase,
        "containerStatuses": [{"name": "job", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": state}]});
    if let Some(reason) = pod_reason {
        pod["status"]["reason"] = reason.into();
    }
    pod
}

fn running(pod: &Value, version: &str) -> Value {
    with_state(
        pod,
        version,
        "Running",
        json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
        None,
    )
}

fn exited(pod: &Value, version: &str, code: i32, reason: &str) -> Value {
    let phase = if code == 0 { "Succeeded" } else { "Failed" };
    with_state(
        pod,
        version,
        phase,
        json!({"terminated": {"exitCode": code, "reason": reason}}),
        None,
    )
}

fn log_body(send: Send, bytes: &[u8]) {
    send.send_response(
        Response::builder()
            .status(200)
            .body(Body::from(bytes.to_vec()))
            .unwrap(),
    );
}

/// Starts `job` on a backend talking to the mock; returns the server side.
fn start(
    policy: &Policy,
    job: &JobSpec,
) -> (
    Server,
    tokio::task::JoinHandle<Result<RunReport, KubeError>>,
) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let backend = KubeBackend::with_client(policy, client);
    let job2 = job.clone();
    let task = tokio::spawn(async move { backend.run_job(&job2, None).await });
    let server = Server {
        handle,
        ns: policy.kube.namespace.clone(),
        name: format!("airlock-{}", job.id),
        writes: Vec::new(),
    };
    (server, task)
}

async fn finish(
    server: Server,
    task: tokio::task::JoinHandle<Result<RunReport, KubeError>>,
) -> (Result<RunReport, KubeError>, Vec<String>) {
    let result = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("run_job hangs")
        .unwrap();
    let writes = server.done().await;
    assert!(writes.len() <= 2, "more than two writes: {writes:?}");
    (result, writes)
}

/// Create, watch to the end, read the log, delete: the common path, for each ending.
async fn run_to(
    ending: impl Fn(&Value) -> Value,
    log: &[u8],
) -> (RunReport, Vec<String>, Vec<(String, String)>) {
    let policy = policy();
    let job = python(&policy, "print(sum(range(10)))");
    let (mut server, task) = start(&policy, &job);
    let pod = server.create().await;
    let watch = server.watch("1").await;
    watch.send_response(
        Response::builder()
            .body(events(&[
                ("MODIFIED", running(&pod, "2")),
                ("MODIFIED", ending(&pod)),
            ]))
            .unwrap(),
    );
    let (q, send) = server.log().await;
    log_body(send, log);
    server.deleted_at_once().await;
    let (result, writes) = finish(server, task).await;
    (result.unwrap(), writes, q)
}

#[tokio::test]
async fn an_exited_job_costs_one_create_and_one_delete() {
    let (report, writes, q) = run_to(|p| exited(p, "3", 0, "Completed"), b"45\n").await;
    assert_eq!(report.termination, Termination::Exited(0));
    assert_eq!(report.outcome(), Outcome::Exited);
    assert_eq!(report.stdout.total_bytes, 3);
    assert_eq!(report.image_digest.as_deref(), Some(DIGEST));
    assert_eq!(report.degraded.len(), 5, "{:?}", report.degraded);
    assert_eq!(writes.len(), 2);
    assert!(
        writes[0].starts_with("POST") && writes[1].starts_with("DELETE"),
        "{writes:?}"
    );
    // The log is followed, for the job's container, bounded by limitBytes.
    assert!(q.contains(&("follow".into(), "true".into())), "{q:?}");
    assert!(q.contains(&("container".into(), "job".into())), "{q:?}");
    let limit: u64 = q
        .iter()
        .find(|(k, _)| k == "limitBytes")
        .unwrap()
        .1
        .parse()
        .unwrap();
    assert!(
        limit > 64 << 20 && limit < (64 << 20) + 1024,
        "limitBytes {limit}"
    );
    assert!(
        !q.iter().any(|(k, _)| k == "stream"),
        "merged mode sends no stream="
    );
}

#[tokio::test]
async fn exit_codes_oom_and_the_deadline_map_to_outcomes() {
    let (report, _, _) = run_to(|p| exited(p, "3", 3, "Error"), b"").await;
    assert_eq!(
        (report.termination, report.outcome()),
        (Termination::Exited(3), Outcome::Exited)
    );
    let (report, _, _) = run_to(|p| exited(p, "3", 137, "OOMKilled"), b"").await;
    assert_eq!(report.outcome(), Outcome::Oom);
    assert_eq!(report.oom_kills, 1);
    let (report, _, _) = run_to(
        |p| {
            with_state(
                p,
                "3",
                "Failed",
                json!({"terminated": {"exitCode": 137, "reason": "Error"}}),
                Some("DeadlineExceeded"),
            )
        },
        b"",
    )
    .await;
    assert_eq!(report.outcome(), Outcome::Timeout);
    assert_eq!(report.limit_hit, Some(LimitHit::Timeout));
    let (report, _, _) = run_to(|p| exited(p, "3", 143, "Error"), b"").await;
    assert_eq!(
        (report.termination, report.outcome()),
        (Termination::Signaled(15), Outcome::Killed)
    );
}

#[tokio::test]
async fn wall_time_ends_the_job_by_deleting_its_pod() {
    let mut policy = policy();
    policy.limits.timeout = Duration::from_millis(300);
    let job = python(&policy, "while True: pass");
    let (mut server, task) = start(&policy, &job);
    let pod = server.create().await;
    let watch = server.watch("1").await;
    watch.send_response(
        Response::builder()
            .body(events(&[("MODIFIED", running(&pod, "2"))]))
            .unwrap(),
    );
    let (_, log) = server.log().await;
    log_body(log, b"");
    // The first watch ended (server timeout); the next one never answers before the clock.
    let pending = server.watch("2").await;
    let started = std::time::Instant::now();
    let delete = server.delete().await;
    assert!(started.elapsed() < Duration::from_secs(2));
    // Graceful deletion: the Pod lingers until the kubelet stopped it; airlock waits.
    let mut lingering = running(&pod, "4");
    lingering["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:10Z".into();
    respond(delete, 200, lingering.clone());
    drop(pending);
    let gone = server.watch("4").await;
    gone.send_response(
        Response::builder()
            .body(events(&[("DELETED", lingering)]))
            .unwrap(),
    );
    let (result, writes) = finish(server, task).await;
    let report = result.unwrap();
    assert_eq!(report.outcome(), Outcome::Timeout);
    assert_eq!(report.termination, Termination::Signaled(9));
    assert!(
        report.duration >= Duration::from_millis(300) && report.duration < Duration::from_secs(2),
        "{:?}",
        report.duration
    );
    assert_eq!(writes.len(), 2);
}

#[tokio::test]
async fn an_output_flood_is_cut_at_the_limit() {
    let mut policy = policy();
    policy.limits.flood = airlock_core::ByteSize::bytes(20_000);
    let job = python(&policy, "while True: print('x')");
    let (mut server, task) = start(&policy, &job);
    let pod = server.create().await;
    let watch = server.watch("1").await;
    watch.send_response(
        Response::builder()
            .body(events(&[("MODIFIED", running(&pod, "2"))]))
            .unwrap(),
    );
    let (q, log) = server.log().await;
    let limit: usize = q
        .iter()
        .find(|(k, _)| k == "limitBytes")
        .unwrap()
        .1
        .parse()
        .unwrap();
    assert!(limit > 20_000 && limit < 21_000, "{limit}");
    log_body(log, &vec![b'x'; limit]);
    // The flood is decided before (or while) the re-watch is asked.
    let (request, send) = server.next().await;
    if request.method() == http::Method::GET {
        drop(send);
        server.deleted_at_once().await;
    } else {
        assert_eq!(request.method(), http::Method::DELETE);
        respond(
            send,
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}),
        );
    }
    let (result, _) = finish(server, task).await;
    let report = result.unwrap();
    assert_eq!(report.outcome(), Outcome::OutputLimit);
    assert!(report.stdout.total_bytes > 20_000);
    assert!(report.stdout.truncated);
}

#[tokio::test]
async fn split_streams_come_back_apart_and_a_mixing_cluster_fails_closed() {
    let mut policy = policy();
    policy.kube.log_streams = KubeLogStreams::Split;
    let job = python(&policy, "1");
    let (mut server, task) = start(&policy, &job);
    let pod = server.create().await;
    let watch = server.watch("1").await;
    watch.send_response(
        Response::builder()
            .body(events(&[
                ("MODIFIED", running(&pod, "2")),
                ("MODIFIED", exited(&pod, "3", 3, "Error")),
            ]))
            .unwrap(),
    );
    let (q, out) = server.log().await;
    assert!(q.contains(&("stream".into(), "Stdout".into())), "{q:?}");
    log_body(out, format!("airlock-stdout:{}\n1,2\n", job.id).as_bytes());
    let (q, err) = server.log().await;
    assert!(q.contains(&("stream".into(), "Stderr".into())), "{q:?}");
    log_body(err, format!("airlock-stderr:{}\noops\n", job.id).as_bytes());
    server.deleted_at_once().await;
    let report = finish(server, task).await.0.unwrap();
    assert_eq!(report.stdout.total_bytes, 4);
    assert_eq!(report.stderr.total_bytes, 5);
    assert_eq!(report.termination, Termination::Exited(3));

    // The same against a cluster that ignores stream= (both logs are the merged one).
    let job = python(&policy, "1");
    let (mut server, task) = start(&policy, &job);
    let pod = server.create().await;
    let watch = server.watch("1").await;
    watch.send_response(
        Response::builder()
            .body(events(&[
                ("MODIFIED", running(&pod, "2")),
                ("MODIFIED", exited(&pod, "3", 0, "Completed")),
            ]))
            .unwrap(),
    );
    let merged = format!(
        "airlock-stdout:{id}\nairlock-stderr:{id}\nout\n",
        id = job.id
    );
    let (_, out) = server.log().await;
    log_body(out, merged.as_bytes());
    let (_, err) = server.log().await;
    log_body(err, merged.as_bytes());
    server.deleted_at_once().await;
    let err = finish(server, task).await.0.unwrap_err();
    assert!(matches!(err, KubeError::SplitStreamsUnsupported), "{err}");
}

#[tokio::test]
async fn throttled_requests_are_retried() {
    let policy = policy();
    let job = python(&policy, "1");
    let (mut server, task) = start(&policy, &job);
    let (_, send) = server.expect("POST", "").await;
    respond(send, 429, status(429, "TooManyRequests", "slow down"));
    let pod = server.create().await;
    let watch = server.watch("1").await;
    respond(watch, 429, status(429, "TooManyRequests", "slow down"));
    let watch = server.watch("1").await;
    watch.send_response(
        Response::builder()
            .body(events(&[
                ("MODIFIED", running(&pod, "2")),
                ("MODIFIED", exited(&pod, "3", 0, "Completed")),
            ]))
            .unwrap(),
    );
    let (_, log) = server.log().await;
    log_body(log, b"ok\n");
    let send = server.delete().await;
    respond(send, 429, status(429, "TooManyRequests", "slow down"));
    server.deleted_at_once().await;
    let (result, writes) = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .map(|r| (r.unwrap(), ()))
        .map(|(r, _)| (r, server.writes.clone()))
        .unwrap();
    assert_eq!(result.unwrap().outcome(), Outcome::Exited);
    // Refused writes are not writes: two of each were answered 429 first.
    assert_eq!(writes.iter().filter(|w| w.starts_with("POST")).count(), 2);
}

#[tokio::test]
async fn a_create_throttled_every_time_fails_as_unavailable() {
    let policy = policy();
    let job = python(&policy, "1");
    let (mut server, task) = start(&policy, &job);
    for _ in 0..airlock_kube::backend::THROTTLE_RETRIES {
        let (_, send) = server.expect("POST", "").await;
        respond(send, 429, status(429, "TooManyRequests", "slow down"));
    }
    let result = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .unwrap()
        .unwrap();
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BackendUnavailable, "{err}");
}

#[tokio::test]
async fn refused_creates_end_the_job_without_a_delete() {
    for (code, reason, message, kind) in [
        (
            403,
            "Forbidden",
            "pods \"airlock-x\" is forbidden: violates PodSecurity \"restricted:v1.33\"",
            ErrorKind::BackendUnavailable,
        ),
        (
            404,
            "NotFound",
            "namespaces \"airlock-jobs\" not found",
            ErrorKind::BackendUnavailable,
        ),
        (
            409,
            "AlreadyExists",
            "pods \"airlock-x\" already exists",
            ErrorKind::Internal,
        ),
    ] {
        let policy = policy();
        let job = python(&policy, "1");
        let (mut server, task) = start(&policy, &job);
        let (_, send) = server.expect("POST", "").await;
        respond(send, code, status(code, reason, message));
        let (result, writes) = finish(server, task).await;
        let err = result.unwrap_err();
        assert_eq!(err.kind(), kind, "{code}: {err}");
        let backend_error = airlock_core::BackendError::from(err);
        assert!(
            backend_error.message.contains(message),
            "{}",
            backend_error.message
        );
        assert_eq!(writes.len(), 1, "a Pod that is not ours is never deleted");
    }
}

#[tokio::test]
async fn a_gone_watch_version_is_read_again() {
    let policy = policy();
    let job = python(&policy, "1");
    let (mut server, task) = start(&policy, &job);
    let pod = server.create().await;
    // 410 as a watch event...
    let watch = server.watch("1").await;
    watch.send_response(
        Response::builder()
            .body(events(&[(
                "ERROR",
                status(410, "Expired", "too old resource version: 1 (7)"),
            )]))
            .unwrap(),
    );
    let (_, send) = server.expect("GET", &format!("/{}", server.name)).await;
    respond(send, 200, running(&pod, "7"));
    let (_, log) = server.log().await;
    log_body(log, b"");
    // ...and as the answer to the watch request.
    let (_, send) = server.expect("GET", "").await;
    respond(send, 410, status(410, "Expired", "too old"));
    let (_, send) = server.expect("GET", &format!("/{}", server.name)).await;
    respond(send, 200, exited(&pod, "9", 0, "Completed"));
    server.deleted_at_once().await;
    let (result, writes) = finish(server, task).await;
    assert_eq!(result.unwrap().outcome(), Outcome::Exited);
    assert_eq!(writes.len(), 2);
}

#[tokio::test]
async fn a_pod_already_gone_at_delete_is_fine_and_a_vanished_pod_is_an_error() {
    let policy = policy();
    let job = python(&policy, "1");
    let (mut server, task) = start(&policy, &job);
    let pod = server.create().await;
    let watch = server.watch("1").await;
    watch.send_response(
        Response::builder()
            .body(events(&[
                ("MODIFIED", running(&pod, "2")),
                ("MODIFIED", exited(&pod, "3", 0, "Completed")),
            ]))
            .unwrap(),
    );
    let (_, log) = server.log().await;
    log_body(log, b"");
    let send = server.delete().await;
    respond(send, 404, status(404, "NotFound", "gone"));
    assert_eq!(
        finish(server, task).await.0.unwrap().outcome(),
        Outcome::Exited
    );

    let job = python(&policy, "1");
    let (mut server, task) = start(&policy, &job);
    let pod = server.create().await;
    let watch = server.watch("1").await;
    watch.send_response(
        Response::builder()
            .body(events(&[("DELETED", pod.clone())]))
            .unwrap(),
    );
    server.deleted_at_once().await;
    let err = finish(server, task).await.0.unwrap_err();
    assert!(matches!(err, KubeError::Vanished { .. }), "{err}");
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_fails_and_the_pod_is_deleted() {
    let policy = policy();
    let job = python(&policy, "1");
    let (mut server, task) = start(&policy, &job);
    let pod = server.create().await;
    let watch = server.watch("1").await;
    let waiting = with_state(
        &pod,
        "2",
        "Pending",
        json!({"waiting": {"reason": "ErrImagePull", "message": "manifest unknown"}}),
        None,
    );
    watch.send_response(
        Response::builder()
            .body(events(&[("MODIFIED", waiting)]))
            .unwrap(),
    );
    server.deleted_at_once().await;
    let (result, writes) = finish(server, task).await;
    let err = result.unwrap_err();
    assert!(
        err.to_string().contains("ErrImagePull") && err.to_string().contains("manifest unknown"),
        "{err}"
    );
    assert_eq!(writes.len(), 2);
}

#[tokio::test]
async fn the_created_pod_is_the_manifest() {
    let policy = policy();
    let job = python(&policy, "print(1)");
    let expected = KubeBackend::new(&policy).manifest(&job).unwrap();
    let (mut server, task) = start(&policy, &job);
    let (request, send) = server.expect("POST", "").await;
    let body = request.into_body().collect_bytes().await.unwrap();
    let sent: Pod = serde_json::from_slice(&body).unwrap();
    assert_eq!(sent, expected);
    respond(send, 403, status(403, "Forbidden", "quota"));
    let _ = finish(server, task).await;
}
