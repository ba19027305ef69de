//! Importing images: an OCI image layout (a directory, or a tar of one such as skopeo's
//! `oci-archive:`), or a `docker save` archive. Archives are first unpacked into the
//! store's staging area with the same checks as layers; every blob is checked against its
//! digest as it is copied in; the image is unpacked (diff_ids checked) before it gets a
//! record. Every file of the layout or archive is opened beneath its directory: a symlink
//! in it may lead elsewhere inside it (`docker save` links a repeated layer to its first
//! copy), never out of it.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use oci_spec::image::ImageIndex;
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use serde::Deserialize;

use crate::digest::{Digest, HashingReader};
use crate::error::OciError;
use crate::image::{self, LayerRef};
use crate::store::{ImageRecord, ImageStore, LAYER_BLOB_MAX_BYTES, with_tag};
use crate::unpack::{self, Compression, UnpackLimits, Unpacker, normalize_entry_path};

/// Largest archive accepted for import, uncompressed, in bytes.
pub const ARCHIVE_MAX_BYTES: u64 = 32 << 30;
/// Most entries in an archive to import.
pub const ARCHIVE_ENTRIES_MAX_COUNT: u64 = 100_000;

fn format_err(path: &Path, reason: impl Into<String>) -> OciError {
    OciError::ImportFormat {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Imports the image at `path` (a directory or an archive), naming it `name` (default:
/// the name the archive carries, if any).
pub fn import(
    store: &ImageStore,
    path: &Path,
    name: Option<&str>,
) -> Result<ImageRecord, OciError> {
    let source = format!("import {}", path.display());
    if path.is_dir() {
        return import_dir(store, path, name, &source);
    }
    let staging = tempfile::Builder::new()
        .prefix("import-")
        .tempdir_in(store.tmp_dir())
        .map_err(|e| OciError::store_io("create staging directory", store.tmp_dir(), e))?;
    let file = File::open(path).map_err(|e| OciError::store_io("open", path, e))?;
    let mut head = [0u8; 4];
    let mut reader = BufReader::new(file);
    let n = reader
        .get_mut()
        .read(&mut head)
        .map_err(|e| OciError::store_io("read", path, e))?;
    let file = File::open(path).map_err(|e| OciError::store_io("open", path, e))?;
    let limits = UnpackLimits {
        max_bytes: ARCHIVE_MAX_BYTES,
        max_entries: ARCHIVE_ENTRIES_MAX_COUNT,
    };
    let mut unpacker = Unpacker::new(staging.path(), limits)?;
    let what = path.display().to_string();
    let raw = BufReader::new(file);
    match Compression::sniff(&head[..n]) {
        Compression::None => {
            let r = HashingReader::new(raw, ARCHIVE_MAX_BYTES);
            unpacker.apply_layer(&what, r)?;
        }
        Compression::Gzip => {
            let r = HashingReader::new(flate2::read::GzDecoder::new(raw), ARCHIVE_MAX_BYTES);
            unpacker.apply_layer(&what, r)?;
        }
        Compression::Zstd => {
            let decoder = zstd::stream::read::Decoder::new(raw)
                .map_err(|e| OciError::store_io("read", path, e))?;
            let r = HashingReader::new(decoder, ARCHIVE_MAX_BYTES);
            unpacker.apply_layer(&what, r)?;
        }
    }
    unpacker.finish()?;
    let result = import_dir(store, staging.path(), name, &source);
    let _ = unpack::remove_tree(staging.path());
    result
}

/// Imports from a directory holding an OCI layout or an unpacked `docker save` archive.
pub fn import_dir(
    store: &ImageStore,
    dir: &Path,
    name: Option<&str>,
    source: &str,
) -> Result<ImageRecord, OciError> {
    if dir.join("index.json").is_file() && dir.join("oci-layout").is_file() {
        import_oci_layout(store, dir, name, source)
    } else if dir.join("manifest.json").is_file() {
        import_docker_save(store, dir, name, source)
    } else {
        Err(format_err(
            dir,
            "neither an OCI image layout (oci-layout, index.json) nor a docker save archive (manifest.json)",
        ))
    }
}

/// Opens `rel`, a path inside the directory being imported, for reading: resolved beneath
/// `dir` (`openat2` with `RESOLVE_BENEATH`), so a symlink that leads out of it (absolute,
/// or climbing above it) is refused rather than followed to a host file, and only a
/// regular file is read.
fn open_inside(dir: &Path, rel: &str) -> Result<File, OciError> {
    let parts = normalize_entry_path(rel.as_bytes())
        .map_err(|reason| format_err(dir, format!("{rel:?}: {reason}")))?;
    let rel_path: PathBuf = parts.iter().map(|p| OsStr::from_bytes(p)).collect();
    let path = dir.join(&rel_path);
    let dir_fd = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| OciError::store_io("open", dir, e.into()))?;
    // NONBLOCK: a FIFO opens at once (and is refused below) instead of hanging the import.
    let fd = rustix::fs::openat2(
        &dir_fd,
        &rel_path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| match e {
        Errno::XDEV => format_err(
            dir,
            format!("{rel:?} leads out of the directory (a symlink out of it?)"),
        ),
        Errno::NOSYS => OciError::store_io(
            "open (openat2: Linux 5.6 or later is needed to import images safely)",
            &path,
            e.into(),
        ),
        e => OciError::store_io("open", &path, e.into()),
    })?;
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| OciError::store_io("stat", &path, e))?;
    if !meta.is_file() {
        return Err(format_err(dir, format!("{rel:?} is not a regular file")));
    }
    Ok(file)
}

/// Reads a small JSON file (`index.json`, `manifest.json`, a config) of the directory.
fn read_small(dir: &Path, rel: &str) -> Result<Vec<u8>, OciError> {
    let path = dir.join(rel);
    let mut bytes = Vec::new();
    open_inside(dir, rel)?
        .take(image::JSON_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| OciError::store_io("read", &path, e))?;
    if bytes.len() as u64 > image::JSON_MAX_BYTES {
        return Err(OciError::Bound {
            what: path.display().to_string(),
            limit: format!("{} bytes", image::JSON_MAX_BYTES),
        });
    }
    Ok(bytes)
}

/// Copies a blob of an OCI layout into the store, checking digest and size.
fn copy_layout_blob(
    store: &ImageStore,
    dir: &Path,
    digest: &Digest,
    size: u64,
    limit: u64,
    what: &str,
) -> Result<(), OciError> {
    let file = open_inside(dir, &format!("blobs/sha256/{}", digest.hex()))?;
    store.add_blob(BufReader::new(file), Some((digest, size)), limit, what)?;
    Ok(())
}

fn import_oci_layout(
    store: &ImageStore,
    dir: &Path,
    name: Option<&str>,
    source: &str,
) -> Result<ImageRecord, OciError> {
    let index_path = dir.join("index.json");
    let index_bytes = read_small(dir, "index.json")?;
    let index: ImageIndex =
        serde_json::from_slice(&index_bytes).map_err(|source| OciError::ParseJson {
            what: index_path.display().to_string(),
            source,
        })?;
    let wanted = name.map(with_tag);
    let mut candidates = Vec::new();
    for m in index.manifests() {
        let annotations = m.annotations().clone().unwrap_or_default();
        let full = annotations.get(image::ANNOTATION_CONTAINERD_NAME).cloned();
        let tag = annotations.get(image::ANNOTATION_REF_NAME).cloned();
        let matches = match (&wanted, name) {
            (Some(w), Some(n)) => {
                full.as_deref() == Some(w.as_str())
                    || tag.as_deref() == Some(n)
                    || tag.as_deref().map(with_tag).as_deref() == Some(w.as_str())
            }
            _ => true,
        };
        if matches {
            candidates.push((
                Digest::parse(m.digest().as_ref())?,
                m.size(),
                m.media_type().to_string(),
                full.or(tag),
            ));
        }
    }
    candidates.dedup_by(|a, b| a.0 == b.0);
    // With a name the layout does not carry, a layout of one image is still that image.
    if candidates.is_empty() && name.is_some() && index.manifests().len() == 1 {
        let m = &index.manifests()[0];
        candidates.push((
            Digest::parse(m.digest().as_ref())?,
            m.size(),
            m.media_type().to_string(),
            None,
        ));
    }
    let (digest, size, media_type, carried_name) = match candidates.len() {
        0 => {
            return Err(format_err(
                dir,
                format!("no image {} in index.json", name.unwrap_or("at all")),
            ));
        }
        1 => candidates.remove(0),
        _ => {
            return Err(OciError::Ambiguous {
                query: dir.display().to_string(),
                candidates: format!(
                    "{} images; name one with --name ({})",
                    candidates.len(),
                    candidates
                        .iter()
                        .filter_map(|c| c.3.clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    };
    let _store_lock = store.lock_store(false)?;
    let (manifest, manifest_size) = if image::is_index(&media_type) {
        let bytes = read_small(dir, &format!("blobs/sha256/{}", digest.hex()))?;
        let actual = Digest::of_bytes(&bytes);
        if actual != digest {
            return Err(OciError::DigestMismatch {
                what: format!("index {digest} in {}", dir.display()),
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        let (d, s, _) = image::select_platform(&bytes, &format!("index {digest}"))?;
        (d, s)
    } else {
        (digest, size)
    };
    copy_layout_blob(
        store,
        dir,
        &manifest,
        manifest_size,
        image::JSON_MAX_BYTES,
        "manifest",
    )?;
    let manifest_bytes = store.read_blob(&manifest, image::JSON_MAX_BYTES)?;
    let (config, config_size, layers) =
        image::parse_manifest(&manifest_bytes, &format!("manifest {manifest}"))?;
    copy_layout_blob(
        store,
        dir,
        &config,
        config_size,
        image::JSON_MAX_BYTES,
        "config",
    )?;
    for (layer, layer_size, _) in &layers {
        copy_layout_blob(
            store,
            dir,
            layer,
            *layer_size,
            LAYER_BLOB_MAX_BYTES,
            "layer",
        )?;
    }
    drop(_store_lock);
    let names: Vec<String> = name
        .map(str::to_owned)
        .or(carried_name.filter(|n| crate::store::check_name(n).is_ok() && n.contains(':')))
        .into_iter()
        .collect();
    store.commit(&manifest, &names, source)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerSaveEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

fn import_docker_save(
    store: &ImageStore,
    dir: &Path,
    name: Option<&str>,
    source: &str,
) -> Result<ImageRecord, OciError> {
    let manifest_path = dir.join("manifest.json");
    let entries: Vec<DockerSaveEntry> = serde_json::from_slice(&read_small(dir, "manifest.json")?)
        .map_err(|source| OciError::ParseJson {
            what: manifest_path.display().to_string(),
            source,
        })?;
    let wanted = name.map(with_tag);
    let mut chosen: Vec<&DockerSaveEntry> = entries
        .iter()
        .filter(|e| match &wanted {
            Some(w) => e.repo_tags.iter().flatten().any(|t| t == w),
            None => true,
        })
        .collect();
    if chosen.is_empty() && entries.len() == 1 {
        chosen.push(&entries[0]);
    }
    let entry = match chosen.as_slice() {
        [one] => *one,
        [] => {
            return Err(format_err(
                dir,
                format!("no image {} in manifest.json", name.unwrap_or("at all")),
            ));
        }
        many => {
            return Err(OciError::Ambiguous {
                query: dir.display().to_string(),
                candidates: format!(
                    "{} images; name one with --name ({})",
                    many.len(),
                    many.iter()
                        .flat_map(|e| e.repo_tags.iter().flatten().cloned())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    };
    let config_bytes = read_small(dir, &entry.config)?;
    let _store_lock = store.lock_store(false)?;
    let config = store.add_blob_bytes(&config_bytes)?;
    let mut descriptors = Vec::new();
    for layer in &entry.layers {
        let mut file = BufReader::new(open_inside(dir, layer)?);
        let head = std::io::BufRead::fill_buf(&mut file)
            .map_err(|e| OciError::store_io("read layer", dir.join(layer), e))?;
        let compression = Compression::sniff(&head[..head.len().min(4)]);
        let (digest, size) = store.add_blob(file, None, LAYER_BLOB_MAX_BYTES, "layer")?;
        descriptors.push((digest, size, compression.oci_media_type().to_owned()));
    }
    // The config's diff_ids pair with the layers; parse_image checks the count, and the
    // unpack checks each digest.
    let parsed = image::parse_image(&config_bytes, &descriptors, &format!("image {config}"))?;
    let layers: Vec<LayerRef> = parsed.layers;
    let manifest_bytes = image::render_manifest((&config, config_bytes.len() as u64), &layers);
    let manifest = store.add_blob_bytes(&manifest_bytes)?;
    drop(_store_lock);
    let names: Vec<String> = match name {
        Some(n) => vec![n.to_owned()],
        None => entry
            .repo_tags
            .iter()
            .flatten()
            .filter(|t| crate::store::check_name(t).is_ok())
            .cloned()
            .collect(),
    };
    store.commit(&manifest, &names, source)
}
