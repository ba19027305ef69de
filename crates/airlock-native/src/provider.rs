//! The native backend as a [`Provider`]: how it opens (with its warm pool and zygote when
//! the policy keeps one), its doctor checks and what it can do.

use std::sync::Arc;

use airlock_core::doctor::Check;
use airlock_core::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, OpenOptions, Policy, Provider,
};

/// The native backend's provider.
#[derive(Debug, Clone, Copy, Default)]
pub struct NativeProvider;

/// What the native backend can do: everything a session needs, no image store (an image is
/// a rootfs it unpacks, not a daemon's).
pub const CAPABILITIES: Capabilities = Capabilities {
    backend: BackendKind::Native,
    network_proxy: true,
    out_dir: true,
    image_rootfs: false,
    host_workdir: true,
    kernel_sessions: true,
    image_store: false,
};

impl Provider for NativeProvider {
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    fn capabilities(&self, _policy: &Policy) -> Capabilities {
        CAPABILITIES
    }

    fn open(
        &self,
        policy: &Policy,
        options: OpenOptions,
    ) -> Result<Arc<dyn Backend>, BackendError> {
        let helper = crate::backend::current_exe().map_err(BackendError::from)?;
        let config = crate::NativeConfig::from_policy(policy, helper);
        let backend = Arc::new(crate::NativeBackend::new(config).map_err(BackendError::from)?);
        if options.warm_pool && policy.filesystem.rootfs == airlock_core::policy::RootfsSpec::Host {
            backend.prepare_minimal_root_in_background();
        }
        let native = &policy.native;
        let Some((size, starts_max)) = airlock_core::warm::pool_size(native.warm_pool, &options)
        else {
            return Ok(backend);
        };
        let template =
            airlock_core::warm::template_job(policy, options.warm_template, &native.warm_language)?;
        let config = crate::PoolConfig {
            size,
            idle_max: native.warm_idle,
            preload: native.warm_preload.clone(),
            zygote: native.zygote,
            zygote_forks: native.zygote_forks,
            starts_max,
        };
        let pool = crate::pool::start(backend, template, config).map_err(BackendError::from)?;
        tracing::info!(size, language = %native.warm_language, zygote = native.zygote,
            "keeping warm sandboxes started");
        Ok(Arc::new(pool))
    }

    fn host_checks<'a>(&'a self, policy: &'a Policy) -> BoxFuture<'a, Vec<Check>> {
        Box::pin(async move { crate::doctor::diagnose(policy) })
    }
}
