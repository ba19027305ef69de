//! The backend: checks what the job needs against what a Pod can give, creates the Pod
//! (write 1), watches it start, follows its log (bounded by `limitBytes`) while watching it
//! end, enforces wall time and the output flood, and deletes the Pod (write 2).

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_core::policy::{KubeDegraded, KubeLogStreams, KubePolicy, NetworkMode, Policy};
use airlock_core::supervise::{
    Chunk, JobOutput, Kill, OutputSource, Sandbox, Supervision, supervise,
};
use airlock_core::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, JobSpec, LimitHit, OutputTap,
    RunReport, StreamKind, Teardown, Termination,
};
use futures_util::io::{AsyncBufRead, AsyncReadExt};
use futures_util::stream::{BoxStream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, LogParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, Config};
use tokio::sync::OnceCell;

use crate::error::{KubeError, status_code};
use crate::pod::{self, CONTAINER, PodPlan, STDERR_MARKER, STDOUT_MARKER};
use crate::status::{self, PodState};

/// Attempts at a request the API server throttled (429) before the job fails.
pub const THROTTLE_RETRIES: u32 = 5;
/// The first wait after a 429; each further wait doubles.
pub const THROTTLE_FIRST_DELAY: Duration = Duration::from_millis(200);
/// How long one watch request may last before the server ends it and airlock re-watches.
pub const WATCH_TIMEOUT_SECS: u32 = 290;
/// Longest wait for the log streams to end once the container ended.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for the Pod to be gone after the delete (the kubelet stops a running
/// container first). Long, because returning earlier reports a job as ended while its
/// processes may still run: with no per-job pids limit (`pids`, degraded) a fork bomb
/// grows to the node's limit, and at 1024 processes thrashing at the memory limit it took
/// the runtime from 15 s to over a minute to kill on a 2-core CI machine.
pub const DELETE_WAIT: Duration = Duration::from_secs(60);
/// Grace period of the delete: the kubelet sends SIGTERM, then SIGKILL after this.
pub const DELETE_GRACE_SECS: u32 = 1;
/// Bytes read from a log stream at a time.
pub const LOG_CHUNK_BYTES: usize = 64 * 1024;
/// Longest first line that may be a split-stream marker.
pub const MARKER_LINE_MAX_BYTES: usize = 128;
/// How often the janitor runs while a backend lives.
pub const JANITOR_INTERVAL: Duration = Duration::from_secs(300);

/// The Kubernetes backend.
pub struct KubeBackend {
    kube: KubePolicy,
    /// A client given by the caller (tests: a mocked API server).
    given: Option<Client>,
    /// The configuration of the client, kept to build a fresh client when a Pod must be
    /// deleted from a thread of its own (an interrupted job).
    config: OnceCell<Option<Config>>,
    client: OnceCell<Client>,
    /// Whether the janitor is started when the backend connects.
    janitor: bool,
}

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend")
            .field("namespace", &self.kube.namespace)
            .finish_non_exhaustive()
    }
}

/// Loads the client configuration the policy names: its kubeconfig and context, else
/// `$KUBECONFIG` / `~/.kube/config`, else the in-cluster service account.
pub async fn load_config(kube: &KubePolicy) -> Result<Config, KubeError> {
    let options = kube::config::KubeConfigOptions {
        context: (!kube.context.is_empty()).then(|| kube.context.clone()),
        cluster: None,
        user: None,
    };
    let origin = kube.kubeconfig.display().to_string();
    let load = |source: Box<dyn std::error::Error + Send + Sync>| KubeError::LoadConfig {
        origin: origin.clone(),
        source,
    };
    if !kube.kubeconfig.as_os_str().is_empty() {
        let file =
            kube::config::Kubeconfig::read_from(&kube.kubeconfig).map_err(|e| load(Box::new(e)))?;
        return Config::from_custom_kubeconfig(file, &options)
            .await
            .map_err(|e| load(Box::new(e)));
    }
    if options.context.is_some() {
        return Config::from_kubeconfig(&options)
            .await
            .map_err(|e| load(Box::new(e)));
    }
    Config::infer().await.map_err(|e| load(Box::new(e)))
}

/// Chooses ring as the process's TLS crypto provider, once (kube-rs is built with ring;
/// when another crate of the binary brings aws-lc-rs too, rustls will not pick one itself
/// and building a client would panic). A provider installed earlier is kept.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client for `config` (see [`install_crypto_provider`]).
pub fn client_for(config: Config) -> Result<Client, KubeError> {
    install_crypto_provider();
    Client::try_from(config).map_err(KubeError::BuildClient)
}

/// A client for the cluster the policy names (see [`load_config`]).
pub async fn connect(kube: &KubePolicy) -> Result<Client, KubeError> {
    client_for(load_config(kube).await?)
}

/// The controls a Pod gives only in a weaker form under `kube`, each with why.
pub fn weaker_controls(kube: &KubePolicy) -> Vec<(KubeDegraded, &'static str)> {
    let mut weaker = vec![
        (
            KubeDegraded::TmpExec,
            "/tmp is a size-limited emptyDir, which Kubernetes cannot mount noexec",
        ),
        (
            KubeDegraded::Pids,
            "a Pod has no pids limit of its own; the node's kubelet podPidsLimit applies",
        ),
        (
            KubeDegraded::NetworkPolicy,
            "the Pod has a network interface; egress is denied by the namespace's NetworkPolicy, enforced by the cluster's CNI",
        ),
    ];
    if kube.seccomp_profile == KubePolicy::SECCOMP_RUNTIME_DEFAULT {
        weaker.push((
            KubeDegraded::Seccomp,
            "the runtime's default seccomp filter applies, not airlock's",
        ));
    }
    if kube.log_streams == KubeLogStreams::Merged {
        weaker.push((
            KubeDegraded::MergedLogs,
            "the Pod log API interleaves stderr into stdout",
        ));
    }
    weaker
}

/// Refuses `kube` unless the policy accepts every weaker control; returns the observation's
/// `degraded` entries.
pub fn check_degraded(kube: &KubePolicy) -> Result<Vec<String>, KubeError> {
    let weaker = weaker_controls(kube);
    let missing: Vec<&(KubeDegraded, &str)> = weaker
        .iter()
        .filter(|(control, _)| !kube.allow_degraded.contains(control))
        .collect();
    if !missing.is_empty() {
        return Err(KubeError::DegradedNotAccepted {
            missing: missing
                .iter()
                .map(|(c, why)| format!("{} ({why})", c.as_str()))
                .collect::<Vec<_>>()
                .join("; "),
            accept: missing
                .iter()
                .map(|(c, _)| format!("{:?}", c.as_str()))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(weaker
        .iter()
        .map(|(c, why)| format!("{}: {why}", c.as_str()))
        .collect())
}

/// Retries `op` while the API server answers 429, waiting longer each time.
pub async fn retry_throttled<T, F, Fut>(mut op: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut delay = THROTTLE_FIRST_DELAY;
    let mut attempt = 1;
    loop {
        match op().await {
            Err(e) if status_code(&e) == Some(429) && attempt < THROTTLE_RETRIES => {
                tracing::debug!(
                    attempt,
                    delay_ms = delay.as_millis() as u64,
                    "throttled by the API server"
                );
                tokio::time::sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
            other => return other,
        }
    }
}

impl KubeBackend {
    /// A backend for a policy. Nothing is asked of the cluster until the first job (the
    /// engine opens backends synchronously).
    pub fn new(policy: &Policy) -> Self {
        Self {
            kube: policy.kube.clone(),
            given: None,
            config: OnceCell::new(),
            client: OnceCell::new(),
            janitor: true,
        }
    }

    /// A backend that talks through `client` (a mocked or fake API server in tests), with
    /// no janitor.
    pub fn with_client(policy: &Policy, client: Client) -> Self {
        Self {
            kube: policy.kube.clone(),
            given: Some(client),
            config: OnceCell::const_new_with(None),
            client: OnceCell::new(),
            janitor: false,
        }
    }

    /// The `[kube]` settings.
    pub fn policy(&self) -> &KubePolicy {
        &self.kube
    }

    /// The client, connected once.
    pub async fn client(&self) -> Result<&Client, KubeError> {
        self.client
            .get_or_try_init(|| async {
                let client = match &self.given {
                    Some(client) => client.clone(),
                    None => {
                        let config = load_config(&self.kube).await?;
                        let _ = self.config.set(Some(config.clone()));
                        client_for(config)?
                    }
                };
                if self.janitor {
                    let api: Api<Pod> = Api::namespaced(client.clone(), &self.kube.namespace);
                    tokio::spawn(async move {
                        loop {
                            match crate::janitor::sweep(&api).await {
                                Ok(0) => {}
                                Ok(n) => {
                                    tracing::info!(removed = n, "janitor removed expired job Pods")
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "janitor cannot sweep job Pods")
                                }
                            }
                            tokio::time::sleep(JANITOR_INTERVAL).await;
                        }
                    });
                }
                Ok(client)
            })
            .await
    }

    fn check_supported(&self, job: &JobSpec) -> Result<(), KubeError> {
        if job.network == NetworkMode::Proxy {
            return Err(KubeError::FeatureUnavailable {
                feature: "network mode proxy",
                reason:
                    "the egress proxy is not wired into the kube backend; use network mode none"
                        .into(),
            });
        }
        if job.filesystem.out.enabled {
            return Err(KubeError::FeatureUnavailable {
                feature: "/out",
                reason:
                    "released files would need a third API call per job or a host path; not built"
                        .into(),
            });
        }
        Ok(())
    }

    /// The Pod `job` would run in (no I/O): what `run_job` creates.
    pub fn manifest(&self, job: &JobSpec) -> Result<Pod, KubeError> {
        let (reference, digest) =
            self.kube
                .image_ref(&job.filesystem.rootfs)
                .ok_or_else(|| KubeError::NotAnImage {
                    rootfs: job.filesystem.rootfs.to_string(),
                })?;
        let pod = pod::pod_manifest(
            job,
            &PodPlan {
                kube: &self.kube,
                image_reference: &reference,
                image_digest: &digest,
            },
        )?;
        let violations = crate::pss::restricted_violations(&pod);
        if !violations.is_empty() {
            return Err(KubeError::Restricted(violations.join("; ")));
        }
        Ok(pod)
    }

    /// Runs one job in a fresh Pod and deletes it.
    pub async fn run_job(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
    ) -> Result<RunReport, KubeError> {
        Teardown::removed(self.run_job_then_teardown(job, tap).await).await
    }

    /// Like [`KubeBackend::run_job`], but when the job's container ended by itself the
    /// Pod's deletion is left to the returned [`Teardown`] (see
    /// [`Backend::run_then_teardown`]). A job killed by a limit, or one that failed, is
    /// deleted before this returns: deleting its Pod is what stops it.
    pub async fn run_job_then_teardown(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
    ) -> Result<(RunReport, Teardown), KubeError> {
        let degraded = check_degraded(&self.kube)?;
        self.check_supported(job)?;
        let manifest = self.manifest(job)?;
        let digest = self
            .kube
            .image_ref(&job.filesystem.rootfs)
            .map(|(_, d)| d)
            .unwrap_or_default();
        let client = self.client().await?;
        let ns = self.kube.namespace.clone();
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let name = pod::pod_name(job);
        let object = format!("pod {ns}/{name}");

        let setup_started = Instant::now();
        // Write 1 of 2.
        let post = PostParams::default();
        let created = retry_throttled(|| api.create(&post, &manifest))
            .await
            .map_err(|source| KubeError::Api {
                operation: "create",
                object: object.clone(),
                source,
            })?;
        tracing::debug!(job_id = %job.id, pod = %name, "pod created");
        let guard = PodGuard::new(
            client.clone(),
            self.config.get().cloned().flatten(),
            &ns,
            &name,
        );
        let ran = self
            .follow(job, tap, client, &api, &created, setup_started, &object)
            .await;
        let job_id = job.id.clone();
        // Write 2 of 2, whatever happened.
        let delete = async move {
            if let Err(e) = guard.delete(&api).await {
                tracing::warn!(job_id = %job_id, error = %e, "job pod not removed; the janitor will");
            } else {
                tracing::debug!(job_id = %job_id, "pod deleted");
            }
        };
        let (mut report, ended_by_itself) = match ran {
            Ok(ran) => ran,
            Err(e) => {
                delete.await;
                return Err(e);
            }
        };
        report.image_digest = Some(digest);
        report.degraded = degraded;
        let teardown = if ended_by_itself {
            Teardown::new(delete)
        } else {
            // Killed by a limit: the Pod's deletion is what stops it, before the report.
            delete.await;
            Teardown::none()
        };
        Ok((report, teardown))
    }

    #[allow(clippy::too_many_arguments)]
    async fn follow(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
        client: &Client,
        api: &Api<Pod>,
        created: &Pod,
        setup_started: Instant,
        object: &str,
    ) -> Result<(RunReport, bool), KubeError> {
        let name = pod::pod_name(job);
        let mut watch = PodWatch::new(api, &name, created);
        let start_deadline =
            tokio::time::Instant::from_std(setup_started + self.kube.start_timeout);
        let mut last_state = String::from("created");
        // Phase 1: until the program runs (or already ended).
        let mut ended: Option<status::Ended> = None;
        loop {
            let event = tokio::select! {
                event = watch.next() => event?,
                _ = tokio::time::sleep_until(start_deadline) => {
                    return Err(KubeError::StartTimeout {
                        pod: object.to_owned(),
                        seconds: self.kube.start_timeout.as_secs(),
                        last_state,
                    });
                }
            };
            let Some(pod) = event else {
                return Err(KubeError::Vanished {
                    pod: object.to_owned(),
                });
            };
            match status::pod_state(&pod) {
                PodState::Waiting(reason) => {
                    if !reason.is_empty() {
                        last_state = reason;
                    }
                }
                PodState::Running => break,
                PodState::Ended(e) => {
                    ended = Some(e);
                    break;
                }
                PodState::Failed { reason, message } => {
                    return Err(KubeError::StartFailed {
                        pod: object.to_owned(),
                        reason,
                        message,
                    });
                }
            }
        }
        let started_at = Instant::now();
        let setup = started_at.saturating_duration_since(setup_started);
        tracing::debug!(job_id = %job.id, setup_ms = setup.as_millis() as u64, "job pod started");

        // Phase 2: follow the log while watching for the end.
        let flood = job.limits.flood.as_u64();
        let limit_bytes = i64::try_from(flood.saturating_add(MARKER_LINE_MAX_BYTES as u64 + 1))
            .unwrap_or(i64::MAX);
        let ns = &self.kube.namespace;
        let split = self.kube.log_streams == KubeLogStreams::Split;
        let mut streams: Vec<(StreamKind, LogChunks, MarkerFilter)> = Vec::new();
        let kinds: &[(StreamKind, Option<&str>)] = if split {
            &[
                (StreamKind::Stdout, Some("Stdout")),
                (StreamKind::Stderr, Some("Stderr")),
            ]
        } else {
            &[(StreamKind::Stdout, None)]
        };
        for (kind, param) in kinds {
            let reader = retry_throttled(|| open_log(client, ns, &name, *param, limit_bytes))
                .await
                .map_err(|source| KubeError::Api {
                    operation: "read the log of",
                    object: object.to_owned(),
                    source,
                })?;
            let filter = MarkerFilter::new(*kind, split.then(|| job.id.to_string()));
            streams.push((*kind, log_chunks(reader), filter));
        }
        let supervised = supervise(
            Supervision::of(job, started_at, DRAIN_TIMEOUT),
            PodSandbox {
                watch,
                ended,
                object,
            },
            LogSource {
                done: vec![false; streams.len()],
                streams,
                job_id: job.id.as_str(),
            },
            JobOutput::new(&job.limits, tap),
        )
        .await?;
        let limit_hit = supervised.limit_hit;
        let (termination, oom, deadline_hit) = match &supervised.exit {
            // airlock ends the job by deleting its Pod: the kubelet kills it.
            None => (Termination::Signaled(9), false, false),
            Some(e) => {
                if e.evicted {
                    tracing::warn!(job_id = %job.id, "the kubelet evicted the job pod (ephemeral storage or node pressure)");
                }
                (status::termination(e), e.oom, e.deadline)
            }
        };
        let limit_hit = limit_hit.or(deadline_hit.then_some(LimitHit::Timeout));
        // The container ended by itself (no limit, no kill by deleting the Pod), so
        // nothing of the job runs any more and the Pod's deletion can wait.
        let ended_by_itself = supervised.exit.is_some() && limit_hit.is_none();
        let report = RunReport {
            termination,
            limit_hit,
            oom_kills: u64::from(oom),
            stdout: supervised.stdout,
            stderr: supervised.stderr,
            duration: supervised.duration,
            setup,
            cpu_time: None,
            peak_memory_bytes: None,
            image_digest: None,
            degraded: Vec::new(),
            out_files: Vec::new(),
            out_rejected: Vec::new(),
            network: None,
        };
        Ok((report, ended_by_itself))
    }
}

/// A Pod as the supervision core sees it: it ends when its watch shows the job container
/// ended, and is killed by deleting it, which the caller does once supervision returns.
struct PodSandbox<'a> {
    watch: PodWatch<'a>,
    /// How it ended, when that was seen before supervision started.
    ended: Option<status::Ended>,
    object: &'a str,
}

impl Sandbox for PodSandbox<'_> {
    type Exit = status::Ended;
    type Error = KubeError;

    async fn wait(&mut self) -> Result<status::Ended, KubeError> {
        if let Some(ended) = self.ended.take() {
            return Ok(ended);
        }
        loop {
            match self.watch.next().await? {
                Some(pod) => match status::pod_state(&pod) {
                    PodState::Ended(e) => return Ok(e),
                    PodState::Failed { reason, message } => {
                        return Err(KubeError::StartFailed {
                            pod: self.object.to_owned(),
                            reason,
                            message,
                        });
                    }
                    PodState::Waiting(_) | PodState::Running => {}
                },
                None => {
                    return Err(KubeError::Vanished {
                        pod: self.object.to_owned(),
                    });
                }
            }
        }
    }

    fn kill(&mut self) -> Kill {
        // Deleting the Pod (the caller's write 2) kills it and ends its log streams.
        Kill::OnReturn
    }
}

/// The job container's log streams (one, or stdout and stderr apart) as the supervision
/// core reads them, the split-mode marker lines taken off.
struct LogSource<'a> {
    streams: Vec<(StreamKind, LogChunks, MarkerFilter)>,
    /// Which streams have ended.
    done: Vec<bool>,
    job_id: &'a str,
}

impl OutputSource<KubeError> for LogSource<'_> {
    async fn next_chunk(&mut self) -> Result<Option<Chunk>, KubeError> {
        loop {
            let open: Vec<_> = self
                .streams
                .iter_mut()
                .zip(&self.done)
                .enumerate()
                .filter(|(_, (_, done))| !**done)
                .map(|(i, ((_, chunks, _), _))| Box::pin(async move { (i, chunks.next().await) }))
                .collect();
            if open.is_empty() {
                return Ok(None);
            }
            let ((i, item), _, _) = futures_util::future::select_all(open).await;
            let (kind, _, filter) = &mut self.streams[i];
            let bytes = match item {
                Some(Ok(bytes)) => filter.push(&bytes)?,
                Some(Err(e)) => {
                    tracing::warn!(job_id = self.job_id, error = %e, "log stream failed");
                    self.done[i] = true;
                    continue;
                }
                None => {
                    self.done[i] = true;
                    filter.finish()?
                }
            };
            if !bytes.is_empty() {
                return Ok(Some((*kind, bytes)));
            }
        }
    }
}

/// A log stream as chunks of bytes.
pub type LogChunks = BoxStream<'static, std::io::Result<Vec<u8>>>;

fn log_chunks(reader: impl AsyncBufRead + Send + 'static) -> LogChunks {
    futures_util::stream::unfold(Some(Box::pin(reader)), |reader| async move {
        let mut reader = reader?;
        let mut buf = vec![0u8; LOG_CHUNK_BYTES];
        match reader.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(buf), Some(reader)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

/// The log request: follow the job container, at most `limit_bytes`, one stream
/// (`Stdout`/`Stderr`, split mode) or both interleaved.
pub fn log_request(
    ns: &str,
    name: &str,
    stream: Option<&str>,
    limit_bytes: i64,
) -> Result<http::Request<Vec<u8>>, kube::core::request::Error> {
    let params = LogParams {
        container: Some(CONTAINER.to_owned()),
        follow: true,
        limit_bytes: Some(limit_bytes),
        ..Default::default()
    };
    let mut request =
        kube::core::Request::new(format!("/api/v1/namespaces/{ns}/pods")).logs(name, &params)?;
    if let Some(stream) = stream {
        // kube-rs's LogParams has no `stream` (Kubernetes 1.32+, feature-gated).
        let uri = format!("{}&stream={stream}", request.uri());
        *request.uri_mut() = uri.parse().map_err(|e: http::uri::InvalidUri| {
            kube::core::request::Error::BuildRequest(e.into())
        })?;
    }
    Ok(request)
}

async fn open_log(
    client: &Client,
    ns: &str,
    name: &str,
    stream: Option<&str>,
    limit_bytes: i64,
) -> Result<impl AsyncBufRead + Send + 'static + use<>, kube::Error> {
    let request = log_request(ns, name, stream, limit_bytes).map_err(kube::Error::BuildRequest)?;
    client.request_stream(request).await
}

/// Strips the split-mode marker line from the start of a stream, and tells a cluster that
/// ignored `stream=` (both streams then start with the same line, so one of them starts
/// with the other's marker).
#[derive(Debug)]
pub struct MarkerFilter {
    own: Option<Vec<u8>>,
    other: Vec<u8>,
    head: Vec<u8>,
    passing: bool,
}

impl MarkerFilter {
    /// A filter for `kind`'s stream; `job_id` is `None` in merged mode (no markers).
    pub fn new(kind: StreamKind, job_id: Option<String>) -> Self {
        let (own, other) = match kind {
            StreamKind::Stdout => (STDOUT_MARKER, STDERR_MARKER),
            StreamKind::Stderr => (STDERR_MARKER, STDOUT_MARKER),
        };
        match job_id {
            Some(id) => Self {
                own: Some(format!("{own}{id}\n").into_bytes()),
                other: format!("{other}{id}\n").into_bytes(),
                head: Vec::new(),
                passing: false,
            },
            None => Self {
                own: None,
                other: Vec::new(),
                head: Vec::new(),
                passing: true,
            },
        }
    }

    /// The job's bytes in `chunk` (possibly none yet, while the first line is incomplete).
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>, KubeError> {
        if self.passing {
            return Ok(chunk.to_vec());
        }
        self.head.extend_from_slice(chunk);
        match self.head.iter().position(|b| *b == b'\n') {
            Some(end) => self.decide(end + 1),
            None if self.head.len() > MARKER_LINE_MAX_BYTES => {
                self.passing = true;
                Ok(std::mem::take(&mut self.head))
            }
            None => Ok(Vec::new()),
        }
    }

    fn decide(&mut self, line_end: usize) -> Result<Vec<u8>, KubeError> {
        self.passing = true;
        let head = std::mem::take(&mut self.head);
        let line = &head[..line_end];
        if Some(line) == self.own.as_deref() {
            return Ok(head[line_end..].to_vec());
        }
        if line == self.other.as_slice() {
            return Err(KubeError::SplitStreamsUnsupported);
        }
        // The wrapper failed before its marker: show what it said.
        Ok(head)
    }

    /// What is left when the stream ends.
    pub fn finish(&mut self) -> Result<Vec<u8>, KubeError> {
        if self.passing {
            return Ok(Vec::new());
        }
        self.passing = true;
        let head = std::mem::take(&mut self.head);
        let bare = |marker: &[u8]| marker.strip_suffix(b"\n").map(<[u8]>::to_vec);
        if Some(&head) == self.own.as_deref().and_then(bare).as_ref() {
            return Ok(Vec::new());
        }
        if Some(&head) == bare(&self.other).as_ref() {
            return Err(KubeError::SplitStreamsUnsupported);
        }
        Ok(head)
    }
}

/// One Pod, watched: every version of it from its creation on, re-watching when the server
/// ends a watch and re-reading it when the watch's version is too old (410).
pub struct PodWatch<'a> {
    api: &'a Api<Pod>,
    name: String,
    version: String,
    stream: Option<BoxStream<'a, Result<WatchEvent<Pod>, kube::Error>>>,
    first: Option<Pod>,
}

impl<'a> PodWatch<'a> {
    /// Watches `created` (the create call's answer, whose version the watch starts from).
    pub fn new(api: &'a Api<Pod>, name: &str, created: &Pod) -> Self {
        Self {
            api,
            name: name.to_owned(),
            version: created
                .metadata
                .resource_version
                .clone()
                .unwrap_or_else(|| "0".to_owned()),
            stream: None,
            first: Some(created.clone()),
        }
    }

    fn api_error(&self, operation: &'static str, source: kube::Error) -> KubeError {
        KubeError::Api {
            operation,
            object: format!(
                "pod {}/{}",
                self.api.resource_url().rsplit('/').nth(1).unwrap_or(""),
                self.name
            ),
            source,
        }
    }

    /// Re-reads the Pod after a 410; `None` when it is gone.
    async fn resync(&mut self) -> Result<Option<Pod>, KubeError> {
        self.stream = None;
        let pod = retry_throttled(|| self.api.get_opt(&self.name))
            .await
            .map_err(|e| self.api_error("read", e))?;
        if let Some(pod) = &pod
            && let Some(version) = &pod.metadata.resource_version
        {
            self.version = version.clone();
        }
        Ok(pod)
    }

    /// The Pod's next version; `None` when it was deleted.
    pub async fn next(&mut self) -> Result<Option<Pod>, KubeError> {
        if let Some(pod) = self.first.take() {
            return Ok(Some(pod));
        }
        loop {
            if self.stream.is_none() {
                let params = WatchParams::default()
                    .fields(&format!("metadata.name={}", self.name))
                    .timeout(WATCH_TIMEOUT_SECS);
                let version = self.version.clone();
                match retry_throttled(|| self.api.watch(&params, &version)).await {
                    Ok(stream) => self.stream = Some(stream.boxed()),
                    Err(e) if status_code(&e) == Some(410) => return self.resync().await,
                    Err(e) => return Err(self.api_error("watch", e)),
                }
            }
            let Some(stream) = self.stream.as_mut() else {
                continue;
            };
            match stream.next().await {
                // The server ended the watch (its timeout): watch again from here.
                None => self.stream = None,
                Some(Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod))) => {
                    if let Some(version) = &pod.metadata.resource_version {
                        self.version = version.clone();
                    }
                    return Ok(Some(pod));
                }
                Some(Ok(WatchEvent::Deleted(_))) => return Ok(None),
                Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                    self.version = bookmark.metadata.resource_version;
                }
                Some(Ok(WatchEvent::Error(status))) if status.code == 410 => {
                    return self.resync().await;
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    return Err(self.api_error("watch", kube::Error::Api(status)));
                }
                Some(Err(e)) if status_code(&e) == Some(410) => return self.resync().await,
                Some(Err(e)) => return Err(self.api_error("watch", e)),
            }
        }
    }
}

/// Deletes a job's Pod when the job's future is dropped before it did so itself (SIGINT,
/// SIGTERM, a server shutting down).
///
/// As for the Docker backend's container guard, the delete runs on a thread of its own with
/// a private runtime (and a fresh client when the configuration is known), and drop waits
/// for it up to [`DELETE_WAIT`].
pub struct PodGuard {
    client: Client,
    config: Option<Config>,
    namespace: String,
    name: Option<String>,
}

impl std::fmt::Debug for PodGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodGuard")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl PodGuard {
    /// A guard for the Pod `name`.
    pub fn new(client: Client, config: Option<Config>, namespace: &str, name: &str) -> Self {
        Self {
            client,
            config,
            namespace: namespace.to_owned(),
            name: Some(name.to_owned()),
        }
    }

    /// Deletes the Pod now, waits until it is gone, and disarms the guard.
    pub async fn delete(mut self, api: &Api<Pod>) -> Result<(), KubeError> {
        match self.name.take() {
            Some(name) => delete_pod(api, &name).await,
            None => Ok(()),
        }
    }
}

/// Deletes a Pod (a 404 is fine) and waits until it is gone: a running container is
/// stopped by the kubelet before the Pod object disappears, so when this returns nothing
/// of the job runs.
pub async fn delete_pod(api: &Api<Pod>, name: &str) -> Result<(), KubeError> {
    let object = || format!("pod {name}");
    let params = DeleteParams {
        grace_period_seconds: Some(DELETE_GRACE_SECS),
        ..Default::default()
    };
    let pending = match retry_throttled(|| api.delete(name, &params)).await {
        Ok(either) => either.left(),
        Err(e) if status_code(&e) == Some(404) => None,
        Err(source) => {
            return Err(KubeError::Api {
                operation: "delete",
                object: object(),
                source,
            });
        }
    };
    // Deleted at once (it had ended): done. Otherwise wait for the kubelet.
    let Some(pod) = pending else {
        return Ok(());
    };
    let mut watch = PodWatch::new(api, name, &pod);
    let _ = watch.next().await; // the version the delete returned
    let wait = async {
        loop {
            if watch.next().await?.is_none() {
                return Ok::<(), KubeError>(());
            }
        }
    };
    match tokio::time::timeout(DELETE_WAIT, wait).await {
        Ok(result) => result,
        Err(_) => Err(KubeError::DeleteTimeout {
            pod: object(),
            seconds: DELETE_WAIT.as_secs(),
        }),
    }
}

impl Drop for PodGuard {
    fn drop(&mut self) {
        let Some(name) = self.name.take() else {
            return;
        };
        tracing::info!(pod = %name, "job interrupted: deleting its pod");
        let client = self.client.clone();
        let config = self.config.clone();
        let namespace = self.namespace.clone();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("airlock-kube-delete".into())
            .spawn(move || {
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("runtime: {e}"))
                    .and_then(|runtime| {
                        runtime.block_on(async {
                            let client = match config {
                                Some(config) => client_for(config).map_err(|e| e.to_string())?,
                                None => client,
                            };
                            let api: Api<Pod> = Api::namespaced(client, &namespace);
                            delete_pod(&api, &name).await.map_err(|e| e.to_string())
                        })
                    });
                let _ = done_tx.send(result);
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the pod deletion thread");
            return;
        }
        match done_rx.recv_timeout(DELETE_WAIT + Duration::from_secs(5)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "cannot delete an interrupted job's pod"),
            Err(_) => tracing::error!("deleting an interrupted job's pod timed out"),
        }
    }
}

impl Backend for KubeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Kube
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: BackendKind::Kube,
            network_proxy: false,
            out_dir: false,
            image_rootfs: true,
        }
    }

    fn run_then_teardown<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), BackendError>> {
        Box::pin(async move {
            self.run_job_then_teardown(job, tap)
                .await
                .map_err(BackendError::from)
        })
    }
}

/// Opens the backend for a policy, as an `Arc<dyn Backend>`.
pub fn open(policy: &Policy) -> Result<Arc<dyn Backend>, BackendError> {
    Ok(Arc::new(KubeBackend::new(policy)))
}
