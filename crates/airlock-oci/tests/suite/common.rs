//! Building test layers and images by hand, hostile ones included.

use std::io::Write;
use std::path::{Path, PathBuf};

use airlock_oci::image::{self, ConfigSpec, LayerRef};
use airlock_oci::unpack::Compression;
use airlock_oci::{Digest, ImageRecord, ImageStore, OciError};

/// A tar built entry by entry, with raw names (so `..` and absolute paths can be written).
pub struct TarBuilder {
    out: Vec<u8>,
}

impl TarBuilder {
    pub fn new() -> Self {
        Self { out: Vec::new() }
    }

    fn header(
        name: &str,
        kind: tar::EntryType,
        mode: u32,
        size: u64,
        link: Option<&str>,
    ) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        {
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name.as_bytes());
            if let Some(link) = link {
                gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
            }
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(0);
        h.set_cksum();
        h
    }

    pub fn file(mut self, name: &str, mode: u32, data: &[u8]) -> Self {
        let h = Self::header(name, tar::EntryType::Regular, mode, data.len() as u64, None);
        self.out.extend_from_slice(h.as_bytes());
        self.out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.out.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    pub fn dir(mut self, name: &str, mode: u32) -> Self {
        let h = Self::header(name, tar::EntryType::Directory, mode, 0, None);
        self.out.extend_from_slice(h.as_bytes());
        self
    }

    pub fn symlink(mut self, name: &str, target: &str) -> Self {
        let h = Self::header(name, tar::EntryType::Symlink, 0o777, 0, Some(target));
        self.out.extend_from_slice(h.as_bytes());
        self
    }

    pub fn hardlink(mut self, name: &str, target: &str) -> Self {
        let h = Self::header(name, tar::EntryType::Link, 0o644, 0, Some(target));
        self.out.extend_from_slice(h.as_bytes());
        self
    }

    pub fn special(mut self, name: &str, kind: tar::EntryType) -> Self {
        let h = Self::header(name, kind, 0o666, 0, None);
        self.out.extend_from_slice(h.as_bytes());
        self
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.out.extend(std::iter::repeat_n(0u8, 1024));
        self.out
    }
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// Puts layers (uncompressed tars, gzipped here) and their config and manifest in the
/// store's blobs; returns the manifest digest. `diff_ids` may be overridden to lie.
pub fn stage_image(store: &ImageStore, tars: &[Vec<u8>], lie_diff_id: bool) -> Digest {
    let mut layers = Vec::new();
    for tar in tars {
        let blob = gzip(tar);
        let digest = store.add_blob_bytes(&blob).unwrap();
        let diff_id = if lie_diff_id {
            Digest::of_bytes(b"a lie")
        } else {
            Digest::of_bytes(tar)
        };
        layers.push(LayerRef {
            digest,
            diff_id,
            media_type: Compression::Gzip.oci_media_type().to_owned(),
            size: blob.len() as u64,
        });
    }
    let config = image::render_config(&ConfigSpec {
        created: None,
        user: "65534:65534".into(),
        env: vec![],
        working_dir: "/".into(),
        labels: vec![],
        diff_ids: layers.iter().map(|l| l.diff_id.clone()).collect(),
        history: vec![],
    });
    let config_digest = store.add_blob_bytes(&config).unwrap();
    let manifest = image::render_manifest((&config_digest, config.len() as u64), &layers);
    store.add_blob_bytes(&manifest).unwrap()
}

pub fn make_image(store: &ImageStore, tars: &[Vec<u8>]) -> Result<ImageRecord, OciError> {
    let manifest = stage_image(store, tars, false);
    store.commit(&manifest, &["airlock-oci-test/t:1".to_owned()], "test")
}

/// A test area: `base/store` (the store) and `base/outside` (must stay empty).
pub struct Area {
    pub dir: tempfile::TempDir,
}

impl Area {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("outside")).unwrap();
        Self { dir }
    }

    pub fn store(&self) -> ImageStore {
        ImageStore::open(&self.dir.path().join("store")).unwrap()
    }

    pub fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }

    /// Every path under `base` that is not under the store.
    pub fn written_outside_store(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        walk(self.dir.path(), &mut |p| {
            if !p.starts_with(self.dir.path().join("store")) && p != self.outside() {
                out.push(p.to_owned());
            }
        });
        out
    }

    /// Nothing is left in the store's cache or staging area, and no record exists.
    pub fn assert_nothing_kept(&self) {
        let store = self.store();
        assert!(
            store.list().unwrap().is_empty(),
            "a refused image got a record"
        );
        for sub in ["rootfs", "tmp"] {
            let left: Vec<_> = std::fs::read_dir(self.dir.path().join("store").join(sub))
                .unwrap()
                .collect();
            assert!(left.is_empty(), "left in store/{sub}: {left:?}");
        }
        assert!(
            self.written_outside_store().is_empty(),
            "{:?}",
            self.written_outside_store()
        );
    }
}

pub fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        f(&p);
        if e.file_type().unwrap().is_dir() {
            walk(&p, f);
        }
    }
}

/// `AIRLOCK_REQUIRE_ALL=1` turns a missing requirement into a failure.
pub fn skip_or_fail(reason: &str) {
    if std::env::var("AIRLOCK_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!("required but missing: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}

/// The airlock binary: `$AIRLOCK_BIN`, else next to the test binary's deps directory.
pub fn airlock_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("AIRLOCK_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("airlock")
}

pub use airlock_core::error::chain;
