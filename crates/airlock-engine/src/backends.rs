//! Opening a backend by kind: the one place that knows every backend.

use std::sync::Arc;

use airlock_core::{Backend, BackendError, BackendKind};
use airlock_docker::Flavor;

use crate::LoadedPolicy;

/// How a backend is opened.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Keep the policy's `[native] warm_pool` sandboxes started ahead of jobs (for a
    /// long-running server; a single `airlock run` would only waste them). Needs a tokio
    /// runtime.
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
            let template = match options.warm_template {
                Some(request) => request.resolve(&loaded.policy).map_err(|e| {
                    BackendError::new(
                        airlock_core::ErrorKind::PolicyDenied,
                        format!("the warm sandbox's job is refused by the policy: {e}"),
                    )
                })?,
                None => warm_template(&loaded.policy)?,
            };
            let config = airlock_native::PoolConfig {
                size: size as usize,
                idle_max: loaded.policy.native.warm_idle,
                preload: loaded.policy.native.warm_preload.clone(),
                zygote: loaded.policy.native.zygote,
                // One job: one sandbox, and no replacement after it.
                starts_max: single_job.then_some(1),
            };
            let pool = airlock_native::PooledNative::start(Arc::new(backend), template, config)
                .map_err(BackendError::from)?;
            tracing::info!(size, language = %loaded.policy.native.warm_language,
                zygote = loaded.policy.native.zygote, "keeping warm sandboxes started");
            Ok(Arc::new(pool))
        }
        BackendKind::Docker => airlock_docker::backend::open(&loaded.policy, Flavor::Docker),
        BackendKind::Podman => airlock_docker::backend::open(&loaded.policy, Flavor::Podman),
        BackendKind::Gvisor => airlock_docker::backend::open(&loaded.policy, Flavor::Gvisor),
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

/// The job warm sandboxes are built for: an empty program in the pool's language with
/// every default of the policy.
fn warm_template(policy: &airlock_core::Policy) -> Result<airlock_core::JobSpec, BackendError> {
    airlock_core::JobRequest {
        language: policy.native.warm_language.clone(),
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
