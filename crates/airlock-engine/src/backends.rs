//! The backends' providers: the one place that knows every backend. Everything the engine,
//! doctor, images and sessions need to know of a backend, they ask its [`Provider`].

use std::sync::Arc;

pub use airlock_core::OpenOptions;
use airlock_core::{Backend, BackendError, BackendKind, Provider};

use crate::LoadedPolicy;

/// The provider of backend `kind`.
pub fn provider(kind: BackendKind) -> &'static dyn Provider {
    match kind {
        BackendKind::Native => &airlock_native::NativeProvider,
        BackendKind::Docker => &airlock_docker::provider::DOCKER,
        BackendKind::Podman => &airlock_docker::provider::PODMAN,
        BackendKind::Gvisor => &airlock_docker::provider::GVISOR,
        #[cfg(feature = "kube")]
        BackendKind::Kube => &airlock_kube::KubeProvider,
        #[cfg(not(feature = "kube"))]
        BackendKind::Kube => &not_built::NotBuilt(BackendKind::Kube),
    }
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
    provider(kind).open(&loaded.policy, options)
}

#[cfg(not(feature = "kube"))]
mod not_built {
    use std::sync::Arc;

    use airlock_core::doctor::Check;
    use airlock_core::{
        Backend, BackendError, BackendKind, BoxFuture, Capabilities, OpenOptions, Policy, Provider,
    };

    /// A backend this airlock was built without (the Kubernetes backend is a cargo feature).
    pub(super) struct NotBuilt(pub(super) BackendKind);

    impl NotBuilt {
        fn fix(&self) -> String {
            format!(
                "rebuild with `cargo build -p airlock-cli --features {}`",
                self.0
            )
        }
    }

    impl Provider for NotBuilt {
        fn kind(&self) -> BackendKind {
            self.0
        }

        fn capabilities(&self, _policy: &Policy) -> Capabilities {
            Capabilities::bare(self.0)
        }

        fn open(
            &self,
            _policy: &Policy,
            _options: OpenOptions,
        ) -> Result<Arc<dyn Backend>, BackendError> {
            Err(BackendError::new(
                airlock_core::ErrorKind::BackendUnavailable,
                format!(
                    "this airlock was built without the {} backend; {}",
                    self.0,
                    self.fix()
                ),
            ))
        }

        fn host_checks<'a>(&'a self, _policy: &'a Policy) -> BoxFuture<'a, Vec<Check>> {
            let check = Check::missing(
                self.0.as_str(),
                format!("this airlock was built without the {} backend", self.0),
                self.fix(),
            );
            Box::pin(async move { vec![check] })
        }
    }
}
