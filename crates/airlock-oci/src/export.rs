//! Writing an image from the store as one archive that is both an OCI image layout
//! (`oci-layout`, `index.json`, `blobs/sha256/…`: skopeo's `oci-archive:`, Podman) and a
//! `docker save` archive (`manifest.json` naming the same blobs: `docker load`, also
//! Docker 20.10). Entries are sorted with fixed metadata, so the same image always gives
//! the same archive.

use std::fs::File;
use std::io::{self, Write};

use serde_json::json;

use crate::digest::Digest;
use crate::error::OciError;
use crate::image;
use crate::store::{ImageRecord, ImageStore, with_tag};

/// Writes `record`'s image as an archive; `name` (or the image's first name) becomes its
/// tag in `manifest.json` and `index.json`.
pub fn write_archive(
    store: &ImageStore,
    record: &ImageRecord,
    name: Option<&str>,
    out: impl Write,
) -> Result<(), OciError> {
    let io_err = |e: io::Error| OciError::store_io("write image archive", store.root(), e);
    let name = name.map(with_tag).or_else(|| record.names.first().cloned());
    let mut blobs: Vec<&Digest> = vec![&record.manifest, &record.id];
    blobs.extend(record.layers.iter().map(|l| &l.digest));
    blobs.sort();
    blobs.dedup();

    let mut annotations = serde_json::Map::new();
    if let Some(name) = &name {
        let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
        annotations.insert(image::ANNOTATION_REF_NAME.into(), tag.into());
        annotations.insert(
            image::ANNOTATION_CONTAINERD_NAME.into(),
            name.clone().into(),
        );
    }
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": image::MEDIA_OCI_INDEX,
        "manifests": [{
            "mediaType": record.manifest_media_type,
            "digest": record.manifest.as_str(),
            "size": record.manifest_size,
            "annotations": annotations,
        }],
    }))
    .unwrap_or_default();
    let docker_manifest = serde_json::to_vec(&json!([{
        "Config": format!("blobs/sha256/{}", record.id.hex()),
        "RepoTags": name.iter().collect::<Vec<_>>(),
        "Layers": record.layers.iter().map(|l| format!("blobs/sha256/{}", l.digest.hex())).collect::<Vec<_>>(),
    }]))
    .unwrap_or_default();

    let mut builder = tar::Builder::new(out);
    let header = |kind: tar::EntryType, mode: u32, size: u64| {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(size);
        h
    };
    for dir in ["blobs/", "blobs/sha256/"] {
        builder
            .append_data(
                &mut header(tar::EntryType::Directory, 0o755, 0),
                dir,
                io::empty(),
            )
            .map_err(io_err)?;
    }
    for digest in blobs {
        let path = store.blob_path(digest);
        let file = File::open(&path).map_err(|e| OciError::store_io("open blob", &path, e))?;
        let size = file
            .metadata()
            .map_err(|e| OciError::store_io("stat blob", &path, e))?
            .len();
        builder
            .append_data(
                &mut header(tar::EntryType::Regular, 0o644, size),
                format!("blobs/sha256/{}", digest.hex()),
                file,
            )
            .map_err(io_err)?;
    }
    for (file_name, bytes) in [
        ("index.json", index.as_slice()),
        ("manifest.json", docker_manifest.as_slice()),
        (
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#.as_slice(),
        ),
    ] {
        builder
            .append_data(
                &mut header(tar::EntryType::Regular, 0o644, bytes.len() as u64),
                file_name,
                bytes,
            )
            .map_err(io_err)?;
    }
    let mut out = builder.into_inner().map_err(io_err)?;
    out.flush().map_err(io_err)?;
    Ok(())
}
