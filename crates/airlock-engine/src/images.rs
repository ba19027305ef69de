//! Images in the container daemons: loading an airlock-built image into Docker or Podman
//! (`airlock image load`), so that the CLI never talks to a backend itself.

use airlock_core::{BackendError, BackendKind};

use crate::LoadedPolicy;

/// Loads an image archive into the image store of backend `kind` (docker, podman or
/// gvisor: their daemon's) and checks that it holds `tag` as `expected_id`.
pub async fn load_into(
    kind: BackendKind,
    loaded: &LoadedPolicy,
    archive: Vec<u8>,
    tag: &str,
    expected_id: &str,
) -> Result<(), BackendError> {
    crate::backends::provider(kind)
        .load_image(&loaded.policy, archive, tag, expected_id)
        .await
}
