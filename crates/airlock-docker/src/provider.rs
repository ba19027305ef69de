//! The container backends (Docker, Podman, gVisor) as [`Provider`]s: how each opens (with
//! its warm containers when the policy keeps some), its doctor checks, its daemon's image
//! store and what it can do.

use std::sync::Arc;

use airlock_core::doctor::Check;
use airlock_core::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, OpenOptions, Policy, Provider,
};

use crate::Flavor;

/// One container backend's provider.
#[derive(Debug, Clone, Copy)]
pub struct ContainerProvider(pub Flavor);

/// Docker with runc.
pub const DOCKER: ContainerProvider = ContainerProvider(Flavor::Docker);
/// Podman.
pub const PODMAN: ContainerProvider = ContainerProvider(Flavor::Podman);
/// Docker with runsc.
pub const GVISOR: ContainerProvider = ContainerProvider(Flavor::Gvisor);

/// What a container backend can do here.
pub fn capabilities(flavor: Flavor) -> Capabilities {
    Capabilities {
        backend: flavor.kind(),
        // runsc is registered with --network=none: the job's proxy socket cannot be bound.
        network_proxy: flavor != Flavor::Gvisor,
        // /out is a host tmpfs the container binds, which needs root to mount.
        out_dir: rustix::process::geteuid().is_root(),
        image_rootfs: true,
        // A session's workspace is a host directory bound at /work; gVisor's gofer is not
        // trusted with a host directory a later call reads back.
        host_workdir: flavor != Flavor::Gvisor,
        // The kernel protocol relies on the native sandbox's process model.
        kernel_sessions: false,
        image_store: true,
    }
}

impl Provider for ContainerProvider {
    fn kind(&self) -> BackendKind {
        self.0.kind()
    }

    fn capabilities(&self, _policy: &Policy) -> Capabilities {
        capabilities(self.0)
    }

    fn open(
        &self,
        policy: &Policy,
        options: OpenOptions,
    ) -> Result<Arc<dyn Backend>, BackendError> {
        let kind = self.0.kind();
        let docker = &policy.docker;
        let Some((size, starts_max)) =
            airlock_core::warm::pool_size(docker.warm_pool_of(kind), &options)
        else {
            return crate::backend::open(policy, self.0);
        };
        let config =
            crate::DockerConfig::from_policy(policy, self.0).map_err(BackendError::from)?;
        let backend = crate::DockerBackend::new(config).map_err(BackendError::from)?;
        let template =
            airlock_core::warm::template_job(policy, options.warm_template, &docker.warm_language)?;
        let config = airlock_core::warm::WarmPoolConfig {
            size,
            idle_max: docker.warm_idle,
            starts_max,
        };
        let pool =
            crate::warm::start(Arc::new(backend), template, config).map_err(BackendError::from)?;
        tracing::info!(size, backend = %kind, language = %docker.warm_language,
            "keeping warm containers started");
        Ok(Arc::new(pool))
    }

    fn host_checks<'a>(&'a self, policy: &'a Policy) -> BoxFuture<'a, Vec<Check>> {
        Box::pin(crate::doctor::doctor(policy, self.0))
    }

    fn load_image<'a>(
        &'a self,
        policy: &'a Policy,
        archive: Vec<u8>,
        tag: &'a str,
        expected_id: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            crate::image::load_archive(policy, self.0, archive, tag, expected_id)
                .await
                .map_err(BackendError::from)
        })
    }
}
