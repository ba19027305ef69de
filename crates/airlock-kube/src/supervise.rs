//! A created Pod running its job: watching it start and end ([`PodWatch`]), following its
//! log streams (`LogSource`, the split-mode markers taken off by [`MarkerFilter`]) under
//! the supervision core, the Pod as the core's [`Sandbox`], then how it ended.

use std::time::Instant;

use airlock_core::policy::KubeLogStreams;
use airlock_core::supervise::{
    Chunk, JobOutput, Kill, OutputSource, Sandbox, Supervision, supervise,
};
use airlock_core::{JobSpec, LimitHit, OutputTap, RunReport, StreamKind, Termination};
use futures_util::io::{AsyncBufRead, AsyncReadExt};
use futures_util::stream::{BoxStream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, LogParams, WatchEvent, WatchParams};

use crate::backend::{DRAIN_TIMEOUT, KubeBackend, WATCH_TIMEOUT_SECS, retry_throttled};
use crate::error::{KubeError, status_code};
use crate::pod::{self, CONTAINER, STDERR_MARKER, STDOUT_MARKER};
use crate::status::{self, PodState};

/// Bytes read from a log stream at a time.
pub const LOG_CHUNK_BYTES: usize = 64 * 1024;
/// Longest first line that may be a split-stream marker.
pub const MARKER_LINE_MAX_BYTES: usize = 128;

impl KubeBackend {
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn follow(
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
            acquire: airlock_core::Acquire::Fresh,
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
