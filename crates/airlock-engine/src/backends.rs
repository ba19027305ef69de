//! Opening a backend by kind: the one place that knows every backend.

use std::sync::Arc;

use airlock_core::{Backend, BackendError, BackendKind};
use airlock_docker::Flavor;

use crate::LoadedPolicy;

/// How a backend is opened.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Keep the policy's warm sandboxes (`[native] warm_pool`, `[docker] warm_pool`,
    /// `gvisor_warm_pool`, `podman_warm_pool`) started ahead of jobs (for a long-running
    /// server; a single `airlock run` would only waste them). Needs a tokio runtime.
    pub warm_pool: bool,
    /// Build the warm sandboxes for this job rather than for the policy's defaults in
    /// `warm_language`, and keep at least one (`airlock run --warm`, which puts a single
    /// job through the warm path for tests and diagnosis). Only with `warm_pool`.
    pub warm_template: Option<airlock_core::JobRequest>,
}

/// Opens the backend `kind` for a policy. An error is a [`BackendError`] (usually
/// `backend_unavailable`) that jobs then end with.
pub fn open(kind: BackendKind, loaded: &LoadedPolicy) -> Result<Arc<dyn Backend>, BackendError> {
    open_with(kind, loaded, OpenOptions::default())
}

/// Like [`open`], with options.
pub fn open_with(
    kind: BackendKind,
    loaded: &LoadedPolicy,
    options: OpenOptions,
) -> Result<Arc<dyn Backend>, BackendError> {
    match kind {
        BackendKind::Native => {
            let helper = airlock_native::backend::current_exe().map_err(BackendError::from)?;
            let config = airlock_native::NativeConfig::from_policy(&loaded.policy, helper);
            let backend = airlock_native::NativeBackend::new(config).map_err(BackendError::from)?;
            let mut size = loaded.policy.native.warm_pool;
            let single_job = options.warm_template.is_some();
            if single_job {
                size = size.max(1);
            }
            if !options.warm_pool || size == 0 {
                return Ok(Arc::new(backend));
            }
            let template = warm_template(
                &loaded.policy,
                options.warm_template,
                &loaded.policy.native.warm_language,
            )?;
            let config = airlock_native::PoolConfig {
                size: size as usize,
                idle_max: loaded.policy.native.warm_idle,
                preload: loaded.policy.native.warm_preload.clone(),
                zygote: loaded.policy.native.zygote,
                starts_max: starts_max(single_job),
            };
            let pool = airlock_native::pool::start(Arc::new(backend), template, config)
                .map_err(BackendError::from)?;
            tracing::info!(size, language = %loaded.policy.native.warm_language,
                zygote = loaded.policy.native.zygote, "keeping warm sandboxes started");
            Ok(Arc::new(pool))
        }
        BackendKind::Docker | BackendKind::Podman | BackendKind::Gvisor => {
            let flavor = Flavor::of(kind).ok_or_else(|| {
                BackendError::new(
                    airlock_core::ErrorKind::Internal,
                    format!("{kind} is no container backend"),
                )
            })?;
            let docker = &loaded.policy.docker;
            let mut size = docker.warm_pool_of(kind);
            let single_job = options.warm_template.is_some();
            if single_job {
                size = size.max(1);
            }
            if !options.warm_pool || size == 0 {
                return airlock_docker::backend::open(&loaded.policy, flavor);
            }
            let config = airlock_docker::DockerConfig::from_policy(&loaded.policy, flavor)
                .map_err(BackendError::from)?;
            let backend = airlock_docker::DockerBackend::new(config).map_err(BackendError::from)?;
            let template =
                warm_template(&loaded.policy, options.warm_template, &docker.warm_language)?;
            let config = airlock_core::warm::WarmPoolConfig {
                size: size as usize,
                idle_max: docker.warm_idle,
                starts_max: starts_max(single_job),
            };
            let pool = airlock_docker::warm::start(Arc::new(backend), template, config)
                .map_err(BackendError::from)?;
            tracing::info!(size, backend = %kind, language = %docker.warm_language,
                "keeping warm containers started");
            Ok(Arc::new(pool))
        }
        #[cfg(feature = "kube")]
        BackendKind::Kube => airlock_kube::open(&loaded.policy),
        #[cfg(not(feature = "kube"))]
        BackendKind::Kube => Err(BackendError::new(
            airlock_core::ErrorKind::BackendUnavailable,
            format!(
                "this airlock was built without the {kind} backend; rebuild with `--features kube`"
            ),
        )),
    }
}

/// The bound on a pool's starts: one job (`airlock run --warm`) gets one sandbox, and no
/// replacement after it.
fn starts_max(single_job: bool) -> Option<u64> {
    single_job.then_some(1)
}

/// The job warm sandboxes are built for: `request` (`airlock run --warm`'s job), else an
/// empty program in the pool's `language` with every default of the policy.
fn warm_template(
    policy: &airlock_core::Policy,
    request: Option<airlock_core::JobRequest>,
    language: &str,
) -> Result<airlock_core::JobSpec, BackendError> {
    if let Some(request) = request {
        return request.resolve(policy).map_err(|e| {
            BackendError::new(
                airlock_core::ErrorKind::PolicyDenied,
                format!("the warm sandbox's job is refused by the policy: {e}"),
            )
        });
    }
    airlock_core::JobRequest {
        language: language.to_owned(),
        ..Default::default()
    }
    .resolve(policy)
    .map_err(|e| {
        BackendError::new(
            airlock_core::ErrorKind::BackendUnavailable,
            format!("the warm pool's template job is refused by the policy: {e}"),
        )
    })
}
