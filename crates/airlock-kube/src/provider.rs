//! The Kubernetes backend as a [`Provider`]: a Pod per job, its cluster checks, and what it
//! can do (no host directory, no image store: images are the cluster's).

use std::sync::Arc;

use airlock_core::doctor::Check;
use airlock_core::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, OpenOptions, Policy, Provider,
};

/// The Kubernetes backend's provider.
#[derive(Debug, Clone, Copy, Default)]
pub struct KubeProvider;

/// What the Kubernetes backend can do.
pub const CAPABILITIES: Capabilities = Capabilities {
    backend: BackendKind::Kube,
    network_proxy: false,
    out_dir: false,
    image_rootfs: true,
    host_workdir: false,
    kernel_sessions: false,
    image_store: false,
};

impl Provider for KubeProvider {
    fn kind(&self) -> BackendKind {
        BackendKind::Kube
    }

    fn capabilities(&self, _policy: &Policy) -> Capabilities {
        CAPABILITIES
    }

    /// Pods are not kept warm: `options` asks for nothing this backend does.
    fn open(
        &self,
        policy: &Policy,
        _options: OpenOptions,
    ) -> Result<Arc<dyn Backend>, BackendError> {
        crate::backend::open(policy)
    }

    fn host_checks<'a>(&'a self, policy: &'a Policy) -> BoxFuture<'a, Vec<Check>> {
        Box::pin(crate::doctor::diagnose(policy))
    }
}
