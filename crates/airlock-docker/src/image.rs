//! Images by digest: before every job the local image under the policy's reference must be
//! the one the policy pins, by image id or by repository digest. Nothing is ever pulled.

use airlock_core::Policy;
use bollard::Docker;
use bollard::models::ImageInspect;

use crate::Flavor;
use crate::backend::DockerConfig;
use crate::error::DockerError;

/// The image a job may run: its id, which the container is created from (never the tag,
/// so what was checked is what runs), and the pinned digest reported in the observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedImage {
    /// The daemon's image id, `sha256:…`.
    pub id: String,
    /// The digest the policy pins.
    pub digest: String,
}

/// Whether an inspected image is the one pinned by `digest`: its id equals it, or one of
/// its repository digests (`repo@sha256:…`) ends with it.
pub fn matches(image: &ImageInspect, digest: &str) -> bool {
    image.id.as_deref() == Some(digest)
        || image
            .repo_digests
            .iter()
            .flatten()
            .any(|d| d.rsplit_once('@').is_some_and(|(_, d)| d == digest))
}

/// What the daemon has, for the error message: the id and every repository digest.
pub fn describe(image: &ImageInspect) -> String {
    let mut found = image
        .id
        .clone()
        .unwrap_or_else(|| "an image without id".into());
    let digests: Vec<&str> = image
        .repo_digests
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    if !digests.is_empty() {
        found.push_str(&format!(" (repo digests: {})", digests.join(", ")));
    }
    found
}

/// Checks that `reference` names the image pinned by `digest` in the daemon's store.
pub async fn check(
    docker: &Docker,
    backend: &'static str,
    reference: &str,
    digest: &str,
) -> Result<CheckedImage, DockerError> {
    let image = match docker.inspect_image(reference).await {
        Ok(image) => image,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => {
            return Err(DockerError::ImageMissing {
                backend,
                reference: reference.to_owned(),
                digest: digest.to_owned(),
            });
        }
        Err(source) => {
            return Err(DockerError::InspectImage {
                reference: reference.to_owned(),
                source,
            });
        }
    };
    if !matches(&image, digest) {
        return Err(DockerError::DigestMismatch {
            backend,
            reference: reference.to_owned(),
            pinned: digest.to_owned(),
            found: describe(&image),
        });
    }
    let id = image.id.ok_or_else(|| DockerError::InspectImage {
        reference: reference.to_owned(),
        source: bollard::errors::Error::DockerResponseServerError {
            status_code: 500,
            message: "the daemon reported no image id".to_owned(),
        },
    })?;
    Ok(CheckedImage {
        id,
        digest: digest.to_owned(),
    })
}

/// Loads an image archive (`docker save` layout) into the `flavor` daemon the policy names
/// (for Docker, `DOCKER_HOST` when the policy leaves `docker_socket` empty)
/// and checks that the daemon now holds `tag` as `expected_id` (`sha256:…`): Docker and
/// Podman name an image by the sha256 of its config, as airlock does, so anything else is
/// not the image that was built.
pub async fn load_archive(
    policy: &Policy,
    flavor: Flavor,
    archive: Vec<u8>,
    tag: &str,
    expected_id: &str,
) -> Result<(), DockerError> {
    let backend = flavor.as_str();
    let socket = DockerConfig::from_policy(policy, flavor)?.socket;
    let docker = crate::engine::connect(&socket).map_err(|source| DockerError::Connect {
        backend,
        socket: socket.clone(),
        source,
    })?;
    let mut stream = docker.import_image(
        bollard::query_parameters::ImportImageOptionsBuilder::default()
            .quiet(true)
            .build(),
        bollard::body_full(archive.into()),
        None,
    );
    while let Some(item) = crate::backend::next(&mut stream).await {
        item.map_err(|source| DockerError::LoadImage { backend, source })?;
    }
    let inspected =
        docker
            .inspect_image(tag)
            .await
            .map_err(|source| DockerError::InspectImage {
                reference: tag.to_owned(),
                source,
            })?;
    let found = inspected.id.unwrap_or_default();
    if found.trim_start_matches("sha256:") != expected_id.trim_start_matches("sha256:") {
        return Err(DockerError::LoadedImageMismatch {
            backend,
            tag: tag.to_owned(),
            found,
            expected: expected_id.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, repo_digests: &[&str]) -> ImageInspect {
        ImageInspect {
            id: Some(id.to_owned()),
            repo_digests: Some(repo_digests.iter().map(|s| (*s).to_owned()).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn id_or_repo_digest_matches() {
        let a = format!("sha256:{}", "a".repeat(64));
        let b = format!("sha256:{}", "b".repeat(64));
        assert!(matches(&image(&a, &[]), &a));
        assert!(matches(&image(&b, &[&format!("python@{a}")]), &a));
        assert!(!matches(&image(&b, &[&format!("python@{b}")]), &a));
        let text = describe(&image(&b, &[&format!("python@{b}")]));
        assert!(text.contains(&b) && text.contains("repo digests"), "{text}");
    }
}
