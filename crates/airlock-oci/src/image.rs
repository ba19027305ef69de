//! Manifests, indexes and configs: parsed with `oci-spec` (OCI and Docker schema 2 share
//! their shape), written by airlock as compact JSON with a fixed key order, so the same
//! image always has the same bytes and digests.

use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest};
use serde_json::json;

use crate::digest::Digest;
use crate::error::OciError;
use crate::unpack::Compression;

/// The OCI image manifest media type.
pub const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The OCI image index media type.
pub const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// The OCI image config media type.
pub const MEDIA_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Docker's schema 2 manifest media type.
pub const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker's manifest list media type.
pub const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker's image config media type.
pub const MEDIA_DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// The annotation naming an image in an OCI layout's `index.json`.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The annotation containerd and Docker 25+ read for the full image name.
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";

/// Most layers an image may have.
pub const LAYERS_MAX_COUNT: usize = 256;
/// Largest manifest, index or config, in bytes.
pub const JSON_MAX_BYTES: u64 = 4 << 20;

/// A layer as a manifest lists it, with the uncompressed digest its config pins.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerRef {
    /// The blob's digest (compressed, as stored).
    pub digest: Digest,
    /// The digest of the uncompressed tar (the config's `diff_id`).
    pub diff_id: Digest,
    /// The blob's media type.
    pub media_type: String,
    /// The blob's size in bytes.
    pub size: u64,
}

/// What airlock needs of a manifest and its config.
#[derive(Debug, Clone)]
pub struct ParsedImage {
    /// The config's digest: the image id (Docker's and Podman's too).
    pub id: Digest,
    /// The config's size.
    pub config_size: u64,
    /// The layers, lowest first.
    pub layers: Vec<LayerRef>,
    /// The config's `created`, when it has one.
    pub created: Option<String>,
    /// `os/architecture` from the config.
    pub platform: String,
    /// The config's user.
    pub user: Option<String>,
}

/// Whether a media type (or the manifest's own `mediaType`) is an index.
pub fn is_index(media_type: &str) -> bool {
    media_type == MEDIA_OCI_INDEX || media_type == MEDIA_DOCKER_LIST
}

/// The media type a manifest's JSON says it is (`mediaType`), if any.
pub fn declared_media_type(bytes: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()?
        .get("mediaType")?
        .as_str()
        .map(str::to_owned)
}

/// Whether JSON bytes are an index (they have `manifests` and no `layers`).
pub fn looks_like_index(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .is_ok_and(|v| v.get("manifests").is_some() && v.get("layers").is_none())
}

/// This host's architecture in OCI terms.
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// Picks the manifest for linux on this host's architecture from an index.
pub fn select_platform(index_bytes: &[u8], what: &str) -> Result<(Digest, u64, String), OciError> {
    let index: ImageIndex =
        serde_json::from_slice(index_bytes).map_err(|source| OciError::ParseJson {
            what: what.to_owned(),
            source,
        })?;
    let arch = host_architecture();
    let mut offered = Vec::new();
    for m in index.manifests() {
        let platform = m
            .platform()
            .as_ref()
            .map(|p| (p.os().to_string(), p.architecture().to_string()));
        if let Some((os, a)) = &platform {
            offered.push(format!("{os}/{a}"));
            if os == "linux" && a == arch {
                return Ok((
                    Digest::parse(m.digest().as_ref())?,
                    m.size(),
                    m.media_type().to_string(),
                ));
            }
        }
    }
    Err(OciError::Unsupported {
        what: what.to_owned(),
        reason: format!(
            "no manifest for linux/{arch} (offered: {})",
            if offered.is_empty() {
                "none".to_owned()
            } else {
                offered.join(", ")
            }
        ),
    })
}

/// A blob as a manifest lists it: digest, size, media type.
pub type BlobRef = (Digest, u64, String);

/// Parses a manifest: the config's digest and size, and the layers.
pub fn parse_manifest(bytes: &[u8], what: &str) -> Result<(Digest, u64, Vec<BlobRef>), OciError> {
    let manifest: ImageManifest =
        serde_json::from_slice(bytes).map_err(|source| OciError::ParseJson {
            what: what.to_owned(),
            source,
        })?;
    let config = manifest.config();
    let config_type = config.media_type().to_string();
    if config_type != MEDIA_OCI_CONFIG && config_type != MEDIA_DOCKER_CONFIG {
        return Err(OciError::Unsupported {
            what: what.to_owned(),
            reason: format!("config media type {config_type} is not an image config"),
        });
    }
    if manifest.layers().len() > LAYERS_MAX_COUNT {
        return Err(OciError::Bound {
            what: format!("{what}: layers"),
            limit: format!("{LAYERS_MAX_COUNT} layers"),
        });
    }
    let layers = manifest
        .layers()
        .iter()
        .map(|l| {
            Ok((
                Digest::parse(l.digest().as_ref())?,
                l.size(),
                l.media_type().to_string(),
            ))
        })
        .collect::<Result<Vec<_>, OciError>>()?;
    Ok((
        Digest::parse(config.digest().as_ref())?,
        config.size(),
        layers,
    ))
}

/// Parses a config and joins it with the manifest's layers.
pub fn parse_image(
    config_bytes: &[u8],
    layers: &[(Digest, u64, String)],
    what: &str,
) -> Result<ParsedImage, OciError> {
    let config: ImageConfiguration =
        serde_json::from_slice(config_bytes).map_err(|source| OciError::ParseJson {
            what: format!("{what} config"),
            source,
        })?;
    let os = config.os().to_string();
    let arch = config.architecture().to_string();
    if os != "linux" {
        return Err(OciError::Unsupported {
            what: what.to_owned(),
            reason: format!("the image is for {os}, not linux"),
        });
    }
    if arch != host_architecture() {
        return Err(OciError::Unsupported {
            what: what.to_owned(),
            reason: format!(
                "the image is for {arch}, this host is {}",
                host_architecture()
            ),
        });
    }
    let diff_ids = config.rootfs().diff_ids();
    if diff_ids.len() != layers.len() {
        return Err(OciError::Unsupported {
            what: what.to_owned(),
            reason: format!(
                "the manifest has {} layers but the config {} diff_ids",
                layers.len(),
                diff_ids.len()
            ),
        });
    }
    let mut out = Vec::new();
    for ((digest, size, media_type), diff_id) in layers.iter().zip(diff_ids) {
        if Compression::from_media_type(media_type).is_none() {
            return Err(OciError::Unsupported {
                what: format!("{what} layer {digest}"),
                reason: format!("media type {media_type} is not a layer tar airlock can unpack"),
            });
        }
        out.push(LayerRef {
            digest: digest.clone(),
            diff_id: Digest::parse(diff_id)?,
            media_type: media_type.clone(),
            size: *size,
        });
    }
    Ok(ParsedImage {
        id: Digest::of_bytes(config_bytes),
        config_size: config_bytes.len() as u64,
        layers: out,
        created: config.created().clone(),
        platform: format!("{os}/{arch}"),
        user: config.config().as_ref().and_then(|c| c.user().clone()),
    })
}

/// What airlock's own image config says.
#[derive(Debug, Clone)]
pub struct ConfigSpec {
    /// `created`, RFC 3339; `None` leaves it out (the digest then does not depend on when
    /// the image was built).
    pub created: Option<String>,
    /// The user, e.g. `65534:65534`.
    pub user: String,
    /// The environment.
    pub env: Vec<String>,
    /// The working directory.
    pub working_dir: String,
    /// Labels.
    pub labels: Vec<(String, String)>,
    /// The layers' uncompressed digests, lowest first.
    pub diff_ids: Vec<Digest>,
    /// One history line per layer.
    pub history: Vec<String>,
}

/// Renders an image config, compact, keys in a fixed order.
pub fn render_config(spec: &ConfigSpec) -> Vec<u8> {
    let labels: serde_json::Map<String, serde_json::Value> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let mut value = json!({
        "architecture": host_architecture(),
        "os": "linux",
        "config": {
            "User": spec.user,
            "Env": spec.env,
            "WorkingDir": spec.working_dir,
            "Labels": labels,
        },
        "rootfs": {
            "type": "layers",
            "diff_ids": spec.diff_ids.iter().map(Digest::as_str).collect::<Vec<_>>(),
        },
        "history": spec.history.iter().map(|h| json!({"created_by": h})).collect::<Vec<_>>(),
    });
    if let (Some(created), Some(map)) = (&spec.created, value.as_object_mut()) {
        map.insert("created".to_owned(), json!(created));
    }
    serde_json::to_vec(&value).unwrap_or_default()
}

/// Renders an OCI manifest for a config and layers.
pub fn render_manifest(config: (&Digest, u64), layers: &[LayerRef]) -> Vec<u8> {
    let value = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_OCI_MANIFEST,
        "config": {
            "mediaType": MEDIA_OCI_CONFIG,
            "digest": config.0.as_str(),
            "size": config.1,
        },
        "layers": layers.iter().map(|l| json!({
            "mediaType": l.media_type,
            "digest": l.digest.as_str(),
            "size": l.size,
        })).collect::<Vec<_>>(),
    });
    serde_json::to_vec(&value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_config_and_manifest_parse_back() {
        let layer_digest = Digest::of_bytes(b"layer");
        let diff = Digest::of_bytes(b"tar");
        let config = render_config(&ConfigSpec {
            created: None,
            user: "65534:65534".into(),
            env: vec!["PATH=/usr/bin:/bin".into()],
            working_dir: "/work".into(),
            labels: vec![("a".into(), "b".into())],
            diff_ids: vec![diff.clone()],
            history: vec!["airlock image build".into()],
        });
        // The same inputs render the same bytes.
        assert_eq!(
            config,
            render_config(&ConfigSpec {
                created: None,
                user: "65534:65534".into(),
                env: vec!["PATH=/usr/bin:/bin".into()],
                working_dir: "/work".into(),
                labels: vec![("a".into(), "b".into())],
                diff_ids: vec![diff.clone()],
                history: vec!["airlock image build".into()],
            })
        );
        let layer = LayerRef {
            digest: layer_digest.clone(),
            diff_id: diff.clone(),
            media_type: Compression::Gzip.oci_media_type().into(),
            size: 5,
        };
        let id = Digest::of_bytes(&config);
        let manifest = render_manifest((&id, config.len() as u64), std::slice::from_ref(&layer));
        let (config_digest, size, layers) = parse_manifest(&manifest, "m").unwrap();
        assert_eq!(config_digest, id);
        assert_eq!(size, config.len() as u64);
        let parsed = parse_image(&config, &layers, "m").unwrap();
        assert_eq!(parsed.id, id);
        assert_eq!(parsed.layers, vec![layer]);
        assert_eq!(parsed.user.as_deref(), Some("65534:65534"));
        assert!(!looks_like_index(&manifest));
    }
}
