//! Opening a backend by kind: the one place that knows every backend.

use std::sync::Arc;

use airlock_core::{Backend, BackendError, BackendKind};
use airlock_docker::Flavor;

use crate::LoadedPolicy;

/// Opens the backend `kind` for a policy. An error is a [`BackendError`] (usually
/// `backend_unavailable`) that jobs then end with.
pub fn open(kind: BackendKind, loaded: &LoadedPolicy) -> Result<Arc<dyn Backend>, BackendError> {
    match kind {
        BackendKind::Native => {
            let helper = airlock_native::backend::current_exe().map_err(BackendError::from)?;
            let config = airlock_native::NativeConfig::from_policy(&loaded.policy, helper);
            let backend = airlock_native::NativeBackend::new(config).map_err(BackendError::from)?;
            Ok(Arc::new(backend))
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
