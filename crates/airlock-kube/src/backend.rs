//! The Kubernetes backend: the backend type, checking a job against what a Pod can give,
//! and the run of one job, which strings the phases each file holds (the same names in
//! every backend crate): `launch.rs` (the client, the Pod's manifest), `supervise.rs`
//! (watching the Pod start and end while following its log, then the report),
//! `teardown.rs` (deleting the Pod), `host_checks.rs` (the controls a Pod gives only in a
//! weaker form) and `sweep.rs` (the janitor). The Pod is created here (write 1) and
//! deleted through its guard (write 2).

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_core::policy::{KubePolicy, NetworkMode, Policy};
use airlock_core::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, JobSpec, OutputTap, RunReport,
    Teardown,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::{Client, Config};
use tokio::sync::OnceCell;

use crate::error::{KubeError, status_code};
use crate::pod;
use crate::teardown::PodGuard;

pub use crate::host_checks::check_degraded;
pub use crate::launch::{client_for, connect};
pub use crate::supervise::MarkerFilter;

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
/// How often the janitor runs while a backend lives.
pub const JANITOR_INTERVAL: Duration = Duration::from_secs(300);

/// The Kubernetes backend.
pub struct KubeBackend {
    pub(crate) kube: KubePolicy,
    /// A client given by the caller (tests: a mocked API server).
    pub(crate) given: Option<Client>,
    /// The configuration of the client, kept to build a fresh client when a Pod must be
    /// deleted from a thread of its own (an interrupted job).
    pub(crate) config: OnceCell<Option<Config>>,
    pub(crate) client: OnceCell<Client>,
    /// Whether the janitor is started when the backend connects.
    pub(crate) janitor: bool,
}

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend")
            .field("namespace", &self.kube.namespace)
            .finish_non_exhaustive()
    }
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
}

impl Backend for KubeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Kube
    }

    fn capabilities(&self) -> Capabilities {
        crate::provider::CAPABILITIES
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
