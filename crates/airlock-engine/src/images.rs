//! Images in the container daemons: loading an airlock-built image into Docker or Podman
//! (`airlock image load`), so that the CLI never talks to a backend itself.

use airlock_core::{BackendError, BackendKind, ErrorKind};
use airlock_docker::Flavor;

use crate::LoadedPolicy;

/// Loads an image archive into the daemon of backend `kind` (docker, podman or gvisor) and
/// checks that the daemon holds `tag` as `expected_id`.
pub async fn load_into(
    kind: BackendKind,
    loaded: &LoadedPolicy,
    archive: Vec<u8>,
    tag: &str,
    expected_id: &str,
) -> Result<(), BackendError> {
    let Some(flavor) = Flavor::of(kind) else {
        return Err(BackendError::new(
            ErrorKind::InvalidInput,
            format!("the {kind} backend has no image store to load into; use docker or podman"),
        ));
    };
    airlock_docker::image::load_archive(&loaded.policy, flavor, archive, tag, expected_id)
        .await
        .map_err(BackendError::from)
}
