//! Pulling an image by digest from a registry (`oci-client`). Only `REF@sha256:…` is
//! accepted, never a tag; the manifest's bytes, the config and every layer are checked
//! against their digests and sizes while they stream into the store, so a registry that
//! serves anything else is refused. An operator step: a job never pulls.

use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::digest::Digest;
use crate::error::OciError;
use crate::image;
use crate::store::{ImageRecord, ImageStore, LAYER_BLOB_MAX_BYTES};

/// How to reach the registry.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Plain HTTP instead of HTTPS (a registry on 127.0.0.1 without TLS).
    pub plain_http: bool,
    /// Basic-auth user and password, if the registry needs them.
    pub basic_auth: Option<(String, String)>,
}

const ACCEPTED_MANIFESTS: &[&str] = &[
    image::MEDIA_OCI_MANIFEST,
    image::MEDIA_DOCKER_MANIFEST,
    image::MEDIA_OCI_INDEX,
    image::MEDIA_DOCKER_LIST,
];

/// Pulls `reference` (`registry/repo@sha256:…`) into the store and records it under
/// `name`, if given. The digest may be of a manifest or of an index (the entry for linux
/// on this host's architecture is taken).
pub async fn pull(
    store: &ImageStore,
    reference: &str,
    name: Option<&str>,
    options: &PullOptions,
) -> Result<ImageRecord, OciError> {
    let bad_ref = |reason: &str| OciError::PullReference {
        reference: reference.to_owned(),
        reason: reason.to_owned(),
    };
    let pinned = reference
        .rsplit_once('@')
        .map(|(_, d)| d)
        .ok_or_else(|| bad_ref("pull by digest only: write REF@sha256:…"))?;
    let pinned = Digest::parse(pinned)?;
    let parsed: Reference = reference.parse().map_err(|e| bad_ref(&format!("{e}")))?;
    let client = Client::new(ClientConfig {
        protocol: if options.plain_http {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        platform_resolver: None,
        ..Default::default()
    });
    let auth = match &options.basic_auth {
        Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
        None => RegistryAuth::Anonymous,
    };
    let pull_err = |source: oci_client::errors::OciDistributionError| OciError::Pull {
        reference: reference.to_owned(),
        source: Box::new(source),
    };

    let (bytes, _) = client
        .pull_manifest_raw(&parsed, &auth, ACCEPTED_MANIFESTS)
        .await
        .map_err(pull_err)?;
    check_manifest_bytes(&bytes, &pinned, reference)?;
    let (manifest_digest, manifest_bytes) = if image::looks_like_index(&bytes) {
        let (digest, size, _) = image::select_platform(&bytes, &format!("index {pinned}"))?;
        let by_digest = parsed.clone_with_digest(digest.to_string());
        let (inner, _) = client
            .pull_manifest_raw(&by_digest, &auth, ACCEPTED_MANIFESTS)
            .await
            .map_err(pull_err)?;
        check_manifest_bytes(&inner, &digest, reference)?;
        if inner.len() as u64 != size {
            return Err(OciError::SizeMismatch {
                what: format!("manifest {digest}"),
                expected: size,
                actual: inner.len() as u64,
            });
        }
        (digest, inner)
    } else {
        (pinned.clone(), bytes)
    };
    let (config, config_size, layers) =
        image::parse_manifest(&manifest_bytes, &format!("manifest {manifest_digest}"))?;
    tracing::info!(%reference, layers = layers.len(), "pulling");

    let store_lock = store.lock_store(false)?;
    store.add_blob_bytes(&manifest_bytes)?;
    let mut blobs = vec![(
        config,
        config_size,
        image::MEDIA_OCI_CONFIG.to_owned(),
        image::JSON_MAX_BYTES,
    )];
    blobs.extend(
        layers
            .into_iter()
            .map(|(d, s, m)| (d, s, m, LAYER_BLOB_MAX_BYTES)),
    );
    for (digest, size, media_type, limit) in blobs {
        if store.blob_path(&digest).is_file() {
            continue;
        }
        let descriptor = OciDescriptor {
            media_type,
            digest: digest.to_string(),
            size: i64::try_from(size).unwrap_or(i64::MAX),
            ..Default::default()
        };
        let mut stream = client
            .pull_blob_stream(&parsed, &descriptor)
            .await
            .map_err(pull_err)?;
        let mut blob = store.begin_blob(
            Some((&digest, size)),
            limit,
            &format!("blob from {reference}"),
        )?;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|source| OciError::PullStream {
                reference: reference.to_owned(),
                digest: digest.to_string(),
                source,
            })?;
            blob.write_chunk(&chunk)?;
        }
        blob.finish()?;
    }
    drop(store_lock);
    let names: Vec<String> = name.map(str::to_owned).into_iter().collect();
    let source = format!("pull {reference}");
    let store = store.clone();
    tokio::task::spawn_blocking(move || store.commit(&manifest_digest, &names, &source))
        .await
        .map_err(|e| OciError::Build {
            step: "record pulled image",
            reason: e.to_string(),
        })?
}

fn check_manifest_bytes(bytes: &[u8], pinned: &Digest, reference: &str) -> Result<(), OciError> {
    if bytes.len() as u64 > image::JSON_MAX_BYTES {
        return Err(OciError::Bound {
            what: format!("manifest of {reference}"),
            limit: format!("{} bytes", image::JSON_MAX_BYTES),
        });
    }
    let actual = Digest::of_bytes(bytes);
    if &actual != pinned {
        return Err(OciError::DigestMismatch {
            what: format!("manifest of {reference} from the registry"),
            expected: pinned.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(())
}
