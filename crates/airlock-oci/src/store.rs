//! The local content-addressed image store, and its read-only rootfs cache.
//!
//! ```text
//! STORE/oci-layout, index.json   an OCI image layout: skopeo, umoci and crane read it as is
//! STORE/blobs/sha256/HEX         every manifest, config and layer, checked on the way in
//! STORE/images/ID.json           one record per image, named by its image id
//! STORE/rootfs/ID/               the unpacked tree; present only when complete
//! STORE/locks/ID.lock            flock: one unpack per image, and rm waits for it
//! STORE/locks/store.lock         flock: shared while blobs come in, exclusive for gc
//! STORE/tmp/                     staging for imports and unpacks (same filesystem)
//! ```
//!
//! An image's id is the sha256 of its config: Docker's and Podman's image id, and the
//! digest airlock pins and reports.

use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::digest::{Digest, HashingReader, is_bound_exceeded};
use crate::error::OciError;
use crate::image::{self, LayerRef, ParsedImage};
use crate::unpack::{self, Compression, EntryPolicy, UnpackLimits, Unpacker};

/// Largest layer blob accepted, in bytes (compressed, as stored).
pub const LAYER_BLOB_MAX_BYTES: u64 = 16 << 30;
/// Longest image name.
pub const NAME_MAX_BYTES: usize = 255;
/// Most names one image may carry.
pub const NAMES_MAX_COUNT: usize = 64;
/// Longest record file read, in bytes.
pub const RECORD_MAX_BYTES: u64 = 1 << 20;
/// Longest time to wait for another process's unpack or removal of the same image.
pub const IMAGE_LOCK_WAIT: Duration = Duration::from_secs(600);
/// How often a blocked lock is retried.
const LOCK_POLL: Duration = Duration::from_millis(20);

/// One image in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRecord {
    /// The image id: the sha256 of its config (Docker's and Podman's image id too).
    pub id: Digest,
    /// The digest of its OCI manifest in this store (a registry's, for pulled images).
    pub manifest: Digest,
    /// The manifest's media type.
    pub manifest_media_type: String,
    /// The manifest's size.
    pub manifest_size: u64,
    /// The config's size.
    pub config_size: u64,
    /// Names, e.g. `airlock-python:3.11`. A name belongs to one image at a time.
    pub names: Vec<String>,
    /// The config's `created`, when it has one (RFC 3339).
    pub created: Option<String>,
    /// When the image entered this store (seconds since the epoch).
    pub added_unix_secs: u64,
    /// Where it came from: `build SPEC`, `import PATH`, `pull REF`.
    pub source: String,
    /// `linux/amd64`.
    pub platform: String,
    /// The config's user.
    pub user: Option<String>,
    /// The layers, lowest first.
    pub layers: Vec<LayerRef>,
    /// Why jobs refuse the image, when its layers have what no tree jobs run on may have
    /// (setuid/setgid files, device nodes, FIFOs: `layer L: entry E: reason`). Such an
    /// image has no unpacked tree; it serves as a build's base (`base = "image:…"`),
    /// which strips that content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_base_only: Option<String>,
}

impl ImageRecord {
    /// When the image was made: the config's `created`, else when it entered the store.
    pub fn made_unix_secs(&self) -> u64 {
        self.created
            .as_deref()
            .and_then(parse_rfc3339_secs)
            .unwrap_or(self.added_unix_secs)
    }

    /// How old the image is.
    pub fn age(&self, now: SystemTime) -> Duration {
        let now = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Duration::from_secs(now.saturating_sub(self.made_unix_secs()))
    }

    /// The sum of the layer blobs' sizes.
    pub fn layers_size(&self) -> u64 {
        self.layers.iter().map(|l| l.size).sum()
    }
}

/// Seconds since the epoch of an RFC 3339 time (`2024-05-01T12:00:00Z`, fractions and
/// offsets allowed).
pub fn parse_rfc3339_secs(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &text[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            sign * (rest.get(1..3)?.parse::<i64>().ok()? * 3600
                + rest.get(4..6)?.parse::<i64>().ok()? * 60)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + s - offset;
    u64::try_from(secs).ok()
}

/// Formats seconds since the epoch as RFC 3339 UTC.
pub fn format_rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Checks an image name: `[registry/]path[:tag]`, lower-case, no digest.
pub fn check_name(name: &str) -> Result<(), OciError> {
    let bad = |reason: &str| OciError::InvalidName {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    if name.is_empty() || name.len() > NAME_MAX_BYTES {
        return Err(bad("must be 1-255 characters"));
    }
    if name.contains('@') {
        return Err(bad(
            "a name carries no digest (airlock records the digest itself)",
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/:".contains(&b))
    {
        return Err(bad("use lower-case letters, digits and . _ - / :"));
    }
    if name.starts_with(['/', ':', '.', '-']) || name.ends_with(['/', ':']) || name.contains("//") {
        return Err(bad("malformed"));
    }
    Ok(())
}

/// `name:latest` when the name has no tag.
pub fn with_tag(name: &str) -> String {
    let last = name.rsplit('/').next().unwrap_or(name);
    if last.contains(':') {
        name.to_owned()
    } else {
        format!("{name}:latest")
    }
}

/// A blob being written: hashed and counted as it arrives, moved into the store only when
/// its digest and size are right.
#[derive(Debug)]
pub struct BlobWriter {
    blobs: PathBuf,
    tmp: tempfile::NamedTempFile,
    hasher: Sha256,
    bytes: u64,
    limit_bytes: u64,
    what: String,
    expected: Option<(Digest, u64)>,
}

impl BlobWriter {
    /// Appends bytes.
    pub fn write_chunk(&mut self, chunk: &[u8]) -> Result<(), OciError> {
        self.bytes += chunk.len() as u64;
        if self.bytes > self.limit_bytes {
            return Err(match &self.expected {
                Some((digest, size)) => OciError::SizeMismatch {
                    what: format!("{} {digest}", self.what),
                    expected: *size,
                    actual: self.bytes,
                },
                None => OciError::Bound {
                    what: self.what.clone(),
                    limit: format!("{} bytes", self.limit_bytes),
                },
            });
        }
        self.hasher.update(chunk);
        self.tmp
            .as_file_mut()
            .write_all(chunk)
            .map_err(|e| OciError::store_io("write blob", self.tmp.path(), e))
    }

    /// Checks the digest and size and moves the blob into the store.
    pub fn finish(self) -> Result<(Digest, u64), OciError> {
        let digest = Digest::parse(&format!("sha256:{}", hex::encode(self.hasher.finalize())))?;
        if let Some((want, want_size)) = &self.expected {
            if &digest != want {
                return Err(OciError::DigestMismatch {
                    what: self.what,
                    expected: want.to_string(),
                    actual: digest.to_string(),
                });
            }
            if self.bytes != *want_size {
                return Err(OciError::SizeMismatch {
                    what: format!("{} {want}", self.what),
                    expected: *want_size,
                    actual: self.bytes,
                });
            }
        }
        let dest = self.blobs.join(digest.hex());
        if !dest.exists() {
            let file = self.tmp.as_file();
            file.set_permissions(fs::Permissions::from_mode(0o644))
                .and_then(|()| file.sync_all())
                .map_err(|e| OciError::store_io("write blob", self.tmp.path(), e))?;
            self.tmp
                .persist(&dest)
                .map_err(|e| OciError::store_io("store blob", &dest, e.error))?;
        }
        Ok((digest, self.bytes))
    }
}

/// What an unpack into the cache gave.
enum Cached {
    /// The tree is in place; whether this call unpacked it.
    Ready(bool),
    /// Not in place: the layers have what jobs must not run (the first such entry).
    BuildBaseOnly(String),
}

/// A held lock; released on drop.
#[derive(Debug)]
pub struct LockGuard {
    _file: File,
}

/// The store.
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
    limits: UnpackLimits,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ImageStore {
    /// The store's default place under airlock's state directory.
    pub fn default_path(state_dir: &Path) -> PathBuf {
        state_dir.join("images")
    }

    /// Opens (creating if needed) the store at `root`.
    pub fn open(root: &Path) -> Result<Self, OciError> {
        // Searchable by all: the sandbox's init, which maps to an unprivileged host uid,
        // binds the unpacked trees from here.
        for dir in ["", "blobs", "blobs/sha256", "images", "rootfs", "locks"] {
            let path = root.join(dir);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&path)
                .map_err(|e| OciError::store_io("create directory", &path, e))?;
        }
        let tmp = root.join("tmp");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&tmp)
            .map_err(|e| OciError::store_io("create directory", &tmp, e))?;
        let layout = root.join("oci-layout");
        if !layout.exists() {
            write_atomic(&tmp, &layout, br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        }
        let index = root.join("index.json");
        if !index.exists() {
            write_atomic(&tmp, &index, &render_index(&[]))?;
        }
        Ok(Self {
            root: root.to_owned(),
            limits: UnpackLimits::default(),
        })
    }

    /// Opens the store only if it exists (never creates one): for the job path and doctor.
    pub fn open_existing(root: &Path) -> Result<Self, OciError> {
        if !root.join("oci-layout").is_file() {
            return Err(OciError::store_io(
                "open image store",
                root,
                io::Error::new(
                    io::ErrorKind::NotFound,
                    "no image store here (airlock image build, import or pull makes one)",
                ),
            ));
        }
        Ok(Self {
            root: root.to_owned(),
            limits: UnpackLimits::default(),
        })
    }

    /// The same store with other unpack bounds (tests use small ones).
    pub fn with_limits(mut self, limits: UnpackLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The staging directory (same filesystem as the store).
    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// Where a blob lives.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    /// Where an image's unpacked tree lives (present only when complete).
    pub fn rootfs_path(&self, id: &Digest) -> PathBuf {
        self.root.join("rootfs").join(id.hex())
    }

    fn record_path(&self, id: &Digest) -> PathBuf {
        self.root.join("images").join(format!("{}.json", id.hex()))
    }

    /// Takes a lock file's flock, waiting up to [`IMAGE_LOCK_WAIT`].
    fn lock(&self, name: &str, exclusive: bool) -> Result<LockGuard, OciError> {
        let path = self.root.join("locks").join(name);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| OciError::Lock {
                path: path.clone(),
                source,
            })?;
        let op = if exclusive {
            FlockOperation::NonBlockingLockExclusive
        } else {
            FlockOperation::NonBlockingLockShared
        };
        let deadline = std::time::Instant::now() + IMAGE_LOCK_WAIT;
        loop {
            match rustix::fs::flock(&file, op) {
                Ok(()) => return Ok(LockGuard { _file: file }),
                Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(LOCK_POLL);
                }
                Err(e) => {
                    return Err(OciError::Lock {
                        path,
                        source: e.into(),
                    });
                }
            }
        }
    }

    /// Shared while blobs come in; exclusive while records change or blobs are collected.
    pub fn lock_store(&self, exclusive: bool) -> Result<LockGuard, OciError> {
        self.lock("store.lock", exclusive)
    }

    fn lock_image(&self, id: &Digest) -> Result<LockGuard, OciError> {
        self.lock(&format!("{}.lock", id.hex()), true)
    }

    /// Starts a blob that arrives in pieces, checked against `expected` (digest and size)
    /// while it streams when known, and refused past `limit_bytes`. Hold
    /// [`ImageStore::lock_store`] (shared) until the blob is referenced by a record.
    pub fn begin_blob(
        &self,
        expected: Option<(&Digest, u64)>,
        limit_bytes: u64,
        what: &str,
    ) -> Result<BlobWriter, OciError> {
        if let Some((digest, size)) = expected
            && size > limit_bytes
        {
            return Err(OciError::Bound {
                what: format!("{what} {digest}"),
                limit: format!("{limit_bytes} bytes"),
            });
        }
        let tmp = tempfile::NamedTempFile::new_in(self.tmp_dir())
            .map_err(|e| OciError::store_io("create temporary file", self.tmp_dir(), e))?;
        Ok(BlobWriter {
            blobs: self.root.join("blobs/sha256"),
            tmp,
            hasher: Sha256::new(),
            bytes: 0,
            limit_bytes: expected.map_or(limit_bytes, |(_, size)| size),
            what: what.to_owned(),
            expected: expected.map(|(d, s)| (d.clone(), s)),
        })
    }

    /// Adds a blob from a reader (see [`ImageStore::begin_blob`]). Returns its digest and
    /// size.
    pub fn add_blob(
        &self,
        mut reader: impl Read,
        expected: Option<(&Digest, u64)>,
        limit_bytes: u64,
        what: &str,
    ) -> Result<(Digest, u64), OciError> {
        let mut blob = self.begin_blob(expected, limit_bytes, what)?;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(OciError::store_io("read blob source", what, e)),
            };
            blob.write_chunk(&buf[..n])?;
        }
        blob.finish()
    }

    /// Adds a blob held in memory.
    pub fn add_blob_bytes(&self, bytes: &[u8]) -> Result<Digest, OciError> {
        let digest = Digest::of_bytes(bytes);
        self.add_blob(
            bytes,
            Some((&digest, bytes.len() as u64)),
            bytes.len() as u64,
            "blob",
        )?;
        Ok(digest)
    }

    /// Reads a whole small blob (a manifest or config), checking its digest.
    pub fn read_blob(&self, digest: &Digest, limit_bytes: u64) -> Result<Vec<u8>, OciError> {
        let path = self.blob_path(digest);
        let file = File::open(&path).map_err(|e| OciError::store_io("open blob", &path, e))?;
        let mut bytes = Vec::new();
        file.take(limit_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| OciError::store_io("read blob", &path, e))?;
        if bytes.len() as u64 > limit_bytes {
            return Err(OciError::Bound {
                what: format!("blob {digest}"),
                limit: format!("{limit_bytes} bytes"),
            });
        }
        let actual = Digest::of_bytes(&bytes);
        if &actual != digest {
            return Err(OciError::DigestMismatch {
                what: format!("stored blob {}", path.display()),
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(bytes)
    }

    /// Every image, sorted by first name then id.
    pub fn list(&self) -> Result<Vec<ImageRecord>, OciError> {
        let dir = self.root.join("images");
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| OciError::store_io("read", &dir, e))? {
            let entry = entry.map_err(|e| OciError::store_io("read", &dir, e))?;
            let name = entry.file_name();
            let Some(hex) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            let Ok(id) = Digest::parse(&format!("sha256:{hex}")) else {
                continue;
            };
            if let Some(record) = self.record(&id)? {
                out.push(record);
            }
        }
        out.sort_by(|a, b| (a.names.first(), &a.id).cmp(&(b.names.first(), &b.id)));
        Ok(out)
    }

    /// The record of an image id, if the store has it.
    pub fn record(&self, id: &Digest) -> Result<Option<ImageRecord>, OciError> {
        let path = self.record_path(id);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(OciError::store_io("open record", &path, e)),
        };
        let mut text = Vec::new();
        file.take(RECORD_MAX_BYTES)
            .read_to_end(&mut text)
            .map_err(|e| OciError::store_io("read record", &path, e))?;
        let record: ImageRecord =
            serde_json::from_slice(&text).map_err(|source| OciError::ParseJson {
                what: path.display().to_string(),
                source,
            })?;
        Ok(Some(record))
    }

    /// Finds an image: `sha256:…` (its id or manifest digest), `NAME@sha256:…` (the
    /// digest decides; the name is not needed to match), or a name.
    pub fn resolve(&self, query: &str) -> Result<ImageRecord, OciError> {
        let not_found = || OciError::ImageNotFound {
            query: query.to_owned(),
            store: self.root.clone(),
        };
        let digest_part = query.rsplit_once('@').map_or(query, |(_, d)| d);
        if digest_part.starts_with("sha256:") {
            let digest = Digest::parse(digest_part)?;
            if let Some(record) = self.record(&digest)? {
                return Ok(record);
            }
            return self
                .list()?
                .into_iter()
                .find(|r| r.manifest == digest)
                .ok_or_else(not_found);
        }
        let tagged = with_tag(query);
        let matches: Vec<ImageRecord> = self
            .list()?
            .into_iter()
            .filter(|r| r.names.iter().any(|n| n == query || *n == tagged))
            .collect();
        match matches.len() {
            0 => Err(not_found()),
            1 => Ok(matches.into_iter().next().ok_or_else(not_found)?),
            _ => Err(OciError::Ambiguous {
                query: query.to_owned(),
                candidates: matches
                    .iter()
                    .map(|r| r.id.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Checks a manifest already in the store (with its config and layer blobs) and
    /// parses it.
    pub fn parse_stored(
        &self,
        manifest: &Digest,
        what: &str,
    ) -> Result<(Vec<u8>, ParsedImage), OciError> {
        let manifest_bytes = self.read_blob(manifest, image::JSON_MAX_BYTES)?;
        let (config, config_size, layers) = image::parse_manifest(&manifest_bytes, what)?;
        let config_bytes = self.read_blob(&config, image::JSON_MAX_BYTES)?;
        if config_bytes.len() as u64 != config_size {
            return Err(OciError::SizeMismatch {
                what: format!("{what} config"),
                expected: config_size,
                actual: config_bytes.len() as u64,
            });
        }
        let parsed = image::parse_image(&config_bytes, &layers, what)?;
        for layer in &parsed.layers {
            let path = self.blob_path(&layer.digest);
            let meta =
                fs::metadata(&path).map_err(|e| OciError::store_io("find layer blob", &path, e))?;
            if meta.len() != layer.size {
                return Err(OciError::SizeMismatch {
                    what: format!("{what} layer {}", layer.digest),
                    expected: layer.size,
                    actual: meta.len(),
                });
            }
        }
        Ok((manifest_bytes, parsed))
    }

    /// Records an image whose blobs are all in the store: unpacks it first (so a hostile
    /// or broken image never gets a record), then writes the record and gives it `names`
    /// (taken from any image that had them).
    pub fn commit(
        &self,
        manifest: &Digest,
        names: &[String],
        source: &str,
    ) -> Result<ImageRecord, OciError> {
        for name in names {
            check_name(name)?;
        }
        let (manifest_bytes, parsed) = self.parse_stored(manifest, &format!("image {manifest}"))?;
        let manifest_media_type = image::declared_media_type(&manifest_bytes)
            .unwrap_or_else(|| image::MEDIA_OCI_MANIFEST.to_owned());
        // Unpacked as a build's base would be: the layers' every other check and digest
        // hold, and an image that only jobs must refuse (a stock Debian image's setuid
        // `su`, a debootstrap tree's /dev) is recorded, without a tree, for builds.
        let build_base_only = match self.unpack_into_cache(
            &parsed.id,
            &parsed.layers,
            EntryPolicy::BuildBase,
        )? {
            Cached::Ready(_) => None,
            Cached::BuildBaseOnly(reason) => {
                tracing::info!(image = %parsed.id, %reason, "recorded for builds only: jobs refuse it");
                Some(reason)
            }
        };
        let _store = self.lock_store(true)?;
        let previous = self.record(&parsed.id)?;
        let mut all_names: Vec<String> = previous
            .as_ref()
            .map(|r| r.names.clone())
            .unwrap_or_default();
        for name in names {
            let name = with_tag(name);
            if !all_names.contains(&name) {
                all_names.push(name);
            }
        }
        all_names.truncate(NAMES_MAX_COUNT);
        let record = ImageRecord {
            id: parsed.id.clone(),
            manifest: manifest.clone(),
            manifest_media_type,
            manifest_size: manifest_bytes.len() as u64,
            config_size: parsed.config_size,
            names: all_names,
            created: parsed.created.clone(),
            added_unix_secs: previous
                .as_ref()
                .map_or_else(now_secs, |r| r.added_unix_secs),
            build_base_only,
            source: previous
                .as_ref()
                .map_or_else(|| source.to_owned(), |r| r.source.clone()),
            platform: parsed.platform.clone(),
            user: parsed.user.clone(),
            layers: parsed.layers.clone(),
        };
        // A name moves: it leaves whichever other image had it.
        for mut other in self.list()? {
            if other.id != record.id && other.names.iter().any(|n| record.names.contains(n)) {
                other.names.retain(|n| !record.names.contains(n));
                self.write_record(&other)?;
            }
        }
        self.write_record(&record)?;
        self.write_index()?;
        tracing::info!(image = %record.id, manifest = %record.manifest, names = ?record.names, "image recorded");
        Ok(record)
    }

    fn write_record(&self, record: &ImageRecord) -> Result<(), OciError> {
        let text = serde_json::to_vec_pretty(record).map_err(|source| OciError::ParseJson {
            what: "image record".to_owned(),
            source,
        })?;
        write_atomic(&self.tmp_dir(), &self.record_path(&record.id), &text)
    }

    fn write_index(&self) -> Result<(), OciError> {
        let records = self.list()?;
        write_atomic(
            &self.tmp_dir(),
            &self.root.join("index.json"),
            &render_index(&records),
        )
    }

    /// The unpacked, read-only tree of an image in the store, unpacking it first if
    /// needed. Returns the path and whether this call did the unpacking.
    pub fn rootfs(&self, id: &Digest) -> Result<(PathBuf, bool), OciError> {
        let dir = self.rootfs_path(id);
        if dir.is_dir() {
            return Ok((dir, false));
        }
        let record = self.record(id)?.ok_or_else(|| OciError::ImageNotFound {
            query: id.to_string(),
            store: self.root.clone(),
        })?;
        if let Some(reason) = record.build_base_only {
            return Err(OciError::BuildBaseOnly {
                image: id.to_string(),
                reason,
            });
        }
        let unpacked = self.ensure_rootfs(id, &record.layers)?;
        Ok((dir, unpacked))
    }

    /// Unpacks an image's layers into `rootfs/ID` unless it is there: under the image's
    /// lock, into a staging directory, renamed into place when complete. Returns whether
    /// this call unpacked. Content no tree jobs run on may have is refused.
    pub fn ensure_rootfs(&self, id: &Digest, layers: &[LayerRef]) -> Result<bool, OciError> {
        match self.unpack_into_cache(id, layers, EntryPolicy::Run)? {
            Cached::Ready(unpacked) => Ok(unpacked),
            // EntryPolicy::Run refuses rather than drops; never reached.
            Cached::BuildBaseOnly(reason) => Err(OciError::BuildBaseOnly {
                image: id.to_string(),
                reason,
            }),
        }
    }

    /// Unpacks a build's base into `dest` (created here, its parent must exist): every
    /// layer checked as for the cache, except that setuid/setgid bits are dropped and
    /// device nodes and FIFOs left out, which the build strips anyway. The cache is not
    /// touched, so an image recorded for builds only serves too.
    /// Returns the first entry dropped or changed, if any.
    pub fn unpack_build_base(
        &self,
        record: &ImageRecord,
        dest: &Path,
    ) -> Result<Option<String>, OciError> {
        // Shared: no rm collects the blobs while they are read.
        let _store = self.lock_store(false)?;
        fs::DirBuilder::new()
            .mode(0o755)
            .create(dest)
            .map_err(|e| OciError::store_io("create directory", dest, e))?;
        self.unpack_layers(dest, &record.layers, EntryPolicy::BuildBase)
    }

    /// The unpack behind [`ImageStore::ensure_rootfs`] and [`ImageStore::commit`]: under
    /// `policy`, a tree that would lack or change entries is not moved into the cache.
    fn unpack_into_cache(
        &self,
        id: &Digest,
        layers: &[LayerRef],
        policy: EntryPolicy,
    ) -> Result<Cached, OciError> {
        let dir = self.rootfs_path(id);
        if dir.is_dir() {
            return Ok(Cached::Ready(false));
        }
        let _lock = self.lock_image(id)?;
        if dir.is_dir() {
            // Another job or process unpacked it while this one waited.
            return Ok(Cached::Ready(false));
        }
        self.sweep_staging(id);
        let staging = tempfile::Builder::new()
            .prefix(&format!("unpack-{}-", id.hex()))
            .tempdir_in(self.tmp_dir())
            .map_err(|e| OciError::store_io("create staging directory", self.tmp_dir(), e))?;
        let tree = staging.path().join("rootfs");
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&tree)
            .map_err(|e| OciError::store_io("create directory", &tree, e))?;
        let started = std::time::Instant::now();
        match self.unpack_layers(&tree, layers, policy) {
            Ok(None) => {}
            Ok(Some(dropped)) => {
                let _ = unpack::remove_tree(&tree);
                return Ok(Cached::BuildBaseOnly(dropped));
            }
            Err(e) => {
                let _ = unpack::remove_tree(&tree);
                return Err(e);
            }
        }
        fs::rename(&tree, &dir)
            .map_err(|e| OciError::store_io("move unpacked tree into place", &dir, e))?;
        tracing::info!(image = %id, layers = layers.len(), elapsed_ms = started.elapsed().as_millis() as u64, "image unpacked");
        Ok(Cached::Ready(true))
    }

    /// Removes staging directories a crashed unpack of this image left (we hold its lock).
    fn sweep_staging(&self, id: &Digest) {
        let prefix = format!("unpack-{}-", id.hex());
        if let Ok(entries) = fs::read_dir(self.tmp_dir()) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = unpack::remove_tree(&entry.path());
                }
            }
        }
    }

    /// Unpacks `layers` into `tree`; returns the first entry `policy` dropped, if any.
    fn unpack_layers(
        &self,
        tree: &Path,
        layers: &[LayerRef],
        policy: EntryPolicy,
    ) -> Result<Option<String>, OciError> {
        let mut unpacker = Unpacker::new(tree, self.limits)?.with_policy(policy);
        for layer in layers {
            let name = layer.digest.to_string();
            let compression = Compression::from_media_type(&layer.media_type).ok_or_else(|| {
                OciError::Unsupported {
                    what: format!("layer {name}"),
                    reason: format!("media type {}", layer.media_type),
                }
            })?;
            let path = self.blob_path(&layer.digest);
            let file =
                File::open(&path).map_err(|e| OciError::store_io("open layer blob", &path, e))?;
            let raw = HashingReader::new(BufReader::new(file), layer.size);
            let remaining = unpacker.remaining_bytes();
            let io_fail = |op: &'static str| {
                let name = name.clone();
                move |e: io::Error| {
                    if is_bound_exceeded(&e) {
                        OciError::Bound {
                            what: format!("layer {name}: uncompressed size"),
                            limit: format!("{remaining} bytes"),
                        }
                    } else {
                        OciError::UnpackIo {
                            layer: name.clone(),
                            op: op.to_owned(),
                            source: e,
                        }
                    }
                }
            };
            let (diff_id, tar_bytes, raw) = match compression {
                Compression::None => {
                    let tar = HashingReader::new(raw, remaining);
                    let tar = unpacker.apply_layer(&name, tar)?;
                    tar.finish().map_err(io_fail("read to the end"))?
                }
                Compression::Gzip => {
                    let tar = HashingReader::new(flate2::read::GzDecoder::new(raw), remaining);
                    let tar = unpacker.apply_layer(&name, tar)?;
                    let (d, n, gz) = tar.finish().map_err(io_fail("decompress"))?;
                    (d, n, gz.into_inner())
                }
                Compression::Zstd => {
                    let decoder =
                        zstd::stream::read::Decoder::new(raw).map_err(io_fail("start zstd"))?;
                    let tar = HashingReader::new(decoder, remaining);
                    let tar = unpacker.apply_layer(&name, tar)?;
                    let (d, n, z) = tar.finish().map_err(io_fail("decompress"))?;
                    (d, n, z.finish().into_inner())
                }
            };
            unpacker.add_bytes(tar_bytes);
            let (blob_digest, blob_size, _) = raw.finish().map_err(io_fail("read blob"))?;
            if blob_digest != layer.digest || blob_size != layer.size {
                return Err(OciError::DigestMismatch {
                    what: format!("stored layer blob {}", path.display()),
                    expected: layer.digest.to_string(),
                    actual: blob_digest.to_string(),
                });
            }
            if diff_id != layer.diff_id {
                return Err(OciError::DigestMismatch {
                    what: format!("layer {name} uncompressed (the config's diff_id)"),
                    expected: layer.diff_id.to_string(),
                    actual: diff_id.to_string(),
                });
            }
        }
        let dropped = unpacker.first_dropped().map(str::to_owned);
        unpacker.finish()?;
        Ok(dropped)
    }

    /// Removes an image: its record, its unpacked tree, and every blob no other image
    /// uses. A job still running on the image loses its files; stop such jobs first.
    pub fn remove(&self, query: &str) -> Result<ImageRecord, OciError> {
        let _store = self.lock_store(true)?;
        let record = self.resolve(query)?;
        let _image = self.lock_image(&record.id)?;
        let path = self.record_path(&record.id);
        fs::remove_file(&path).map_err(|e| OciError::store_io("remove record", &path, e))?;
        let dir = self.rootfs_path(&record.id);
        if dir.exists() {
            // Out of the cache's name first, so no new job finds a half-removed tree.
            let trash =
                self.tmp_dir()
                    .join(format!("trash-{}-{}", record.id.hex(), std::process::id()));
            fs::rename(&dir, &trash).map_err(|e| OciError::store_io("move out", &dir, e))?;
            unpack::remove_tree(&trash).map_err(|e| OciError::store_io("remove", &trash, e))?;
        }
        self.collect_garbage()?;
        self.write_index()?;
        Ok(record)
    }

    /// Removes blobs no record references (hold the store lock exclusively).
    fn collect_garbage(&self) -> Result<u64, OciError> {
        let mut keep = std::collections::HashSet::new();
        for record in self.list()? {
            keep.insert(record.manifest.hex().to_owned());
            keep.insert(record.id.hex().to_owned());
            for layer in &record.layers {
                keep.insert(layer.digest.hex().to_owned());
            }
        }
        let dir = self.root.join("blobs/sha256");
        let mut removed = 0;
        for entry in fs::read_dir(&dir).map_err(|e| OciError::store_io("read", &dir, e))? {
            let entry = entry.map_err(|e| OciError::store_io("read", &dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !keep.contains(&name) {
                fs::remove_file(entry.path())
                    .map_err(|e| OciError::store_io("remove blob", entry.path(), e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// The store a policy names: `[images] store`, else `images` under the state directory.
pub fn store_dir(images: &airlock_core::policy::ImagesPolicy) -> PathBuf {
    if images.store.as_os_str().is_empty() {
        ImageStore::default_path(&airlock_host::state_dir())
    } else {
        images.store.clone()
    }
}

/// The read-only tree a job with `rootfs = "image:REF@DIGEST"` runs on: the image pinned
/// by `digest` (its id, or its manifest digest) in the store at `store_dir`, unpacked
/// first if the cache lacks it. Never pulls or imports: an image not in the store is an
/// error that says how to add it. `REF` is informational; the digest decides.
pub fn rootfs_for_job(
    store_dir: &Path,
    reference: &str,
    digest: &str,
) -> Result<PathBuf, OciError> {
    let digest = Digest::parse(digest)?;
    let store = ImageStore::open_existing(store_dir)?;
    let record = match store.record(&digest)? {
        Some(record) => record,
        None => store
            .list()?
            .into_iter()
            .find(|r| r.manifest == digest)
            .ok_or_else(|| OciError::ImageNotFound {
                query: format!(
                    "{reference}@{digest} (add it with airlock image build, import or pull)"
                ),
                store: store_dir.to_owned(),
            })?,
    };
    let (tree, unpacked) = store.rootfs(&record.id)?;
    if unpacked {
        tracing::info!(image = %record.id, "unpacked on first use");
    }
    Ok(tree)
}

/// Writes a file by writing a temporary one beside `tmp_dir` and renaming it into place.
pub fn write_atomic(tmp_dir: &Path, dest: &Path, bytes: &[u8]) -> Result<(), OciError> {
    let mut tmp = tempfile::NamedTempFile::new_in(tmp_dir)
        .map_err(|e| OciError::store_io("create temporary file", tmp_dir, e))?;
    tmp.write_all(bytes)
        .and_then(|()| {
            tmp.as_file()
                .set_permissions(fs::Permissions::from_mode(0o644))
        })
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| OciError::store_io("write", dest, e))?;
    tmp.persist(dest)
        .map_err(|e| OciError::store_io("rename into place", dest, e.error))?;
    Ok(())
}

/// The store's `index.json`: one entry per name (and one per unnamed image).
fn render_index(records: &[ImageRecord]) -> Vec<u8> {
    let mut manifests = Vec::new();
    for r in records {
        let entry = |name: Option<&str>| {
            let mut annotations = serde_json::Map::new();
            annotations.insert("io.airlock.image.id".into(), r.id.to_string().into());
            if let Some(name) = name {
                let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
                annotations.insert(image::ANNOTATION_REF_NAME.into(), tag.into());
                annotations.insert(image::ANNOTATION_CONTAINERD_NAME.into(), name.into());
            }
            serde_json::json!({
                "mediaType": r.manifest_media_type,
                "digest": r.manifest.as_str(),
                "size": r.manifest_size,
                "annotations": annotations,
            })
        };
        if r.names.is_empty() {
            manifests.push(entry(None));
        }
        for name in &r.names {
            manifests.push(entry(Some(name)));
        }
    }
    serde_json::to_vec_pretty(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": image::MEDIA_OCI_INDEX,
        "manifests": manifests,
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips() {
        assert_eq!(parse_rfc3339_secs("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_secs("2024-02-29T12:34:56.789Z"),
            Some(1_709_210_096)
        );
        assert_eq!(
            parse_rfc3339_secs("2024-02-29T14:34:56+02:00"),
            Some(1_709_210_096)
        );
        assert_eq!(format_rfc3339(1_709_210_096), "2024-02-29T12:34:56Z");
        assert_eq!(parse_rfc3339_secs("yesterday"), None);
    }

    #[test]
    fn names_are_checked_and_tagged() {
        assert!(check_name("airlock-python:3.11").is_ok());
        assert!(check_name("127.0.0.1:5000/airlock/python:ci").is_ok());
        for bad in ["", "Python", "a@sha256:00", "/x", "a//b", "x:"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert_eq!(with_tag("python"), "python:latest");
        assert_eq!(
            with_tag("127.0.0.1:5000/python"),
            "127.0.0.1:5000/python:latest"
        );
        assert_eq!(with_tag("python:3"), "python:3");
    }
}
