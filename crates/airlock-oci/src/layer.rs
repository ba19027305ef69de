//! Writing a directory tree as one deterministic layer: entries in byte order, owner
//! root, a fixed mtime, hard links kept as links, gzip with no timestamp. The same tree
//! always gives the same bytes, so the same digests.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::digest::{Digest, HashingWriter};
use crate::error::OciError;
use crate::unpack::Compression;

/// A layer written to a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenLayer {
    /// The digest of the compressed blob.
    pub digest: Digest,
    /// The digest of the uncompressed tar.
    pub diff_id: Digest,
    /// The blob's size.
    pub size: u64,
    /// The blob's media type.
    pub media_type: &'static str,
    /// Entries written.
    pub entries: u64,
}

fn build_err(reason: String) -> OciError {
    OciError::Build {
        step: "write layer",
        reason,
    }
}

/// Writes `src` (its contents, not itself) as a gzip layer into `out`.
pub fn write_layer(src: &Path, out: File, mtime: u64) -> Result<WrittenLayer, OciError> {
    let io = |e: io::Error| build_err(format!("{}: {e}", src.display()));
    let file_hash = HashingWriter::new(BufWriter::new(out));
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(file_hash, flate2::Compression::default());
    let tar_hash = HashingWriter::new(gz);
    let mut builder = tar::Builder::new(tar_hash);
    let mut state = Walk {
        links: HashMap::new(),
        entries: 0,
        mtime,
    };
    state.walk(&mut builder, src, b"")?;
    let tar_hash = builder.into_inner().map_err(io)?;
    let (diff_id, _, gz) = tar_hash.finish();
    let file_hash = gz.finish().map_err(io)?;
    let (digest, size, mut buffered) = file_hash.finish();
    buffered.flush().map_err(io)?;
    let file = buffered.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    Ok(WrittenLayer {
        digest,
        diff_id,
        size,
        media_type: Compression::Gzip.oci_media_type(),
        entries: state.entries,
    })
}

struct Walk {
    links: HashMap<(u64, u64), Vec<u8>>,
    entries: u64,
    mtime: u64,
}

impl Walk {
    fn header(&self, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(self.mtime);
        h.set_size(size);
        h
    }

    fn walk<W: Write>(
        &mut self,
        builder: &mut tar::Builder<W>,
        dir: &Path,
        prefix: &[u8],
    ) -> Result<(), OciError> {
        let io = |p: &Path, e: io::Error| build_err(format!("{}: {e}", p.display()));
        let mut names: Vec<Vec<u8>> = fs::read_dir(dir)
            .map_err(|e| io(dir, e))?
            .map(|e| e.map(|e| e.file_name().as_bytes().to_vec()))
            .collect::<Result<_, _>>()
            .map_err(|e| io(dir, e))?;
        names.sort();
        for name in names {
            let path = dir.join(std::ffi::OsStr::from_bytes(&name));
            let rel = [prefix, &name].concat();
            let rel_str = String::from_utf8_lossy(&rel).into_owned();
            let meta = fs::symlink_metadata(&path).map_err(|e| io(&path, e))?;
            let ft = meta.file_type();
            let mode = meta.mode() & 0o7777;
            self.entries += 1;
            if ft.is_dir() {
                let mut h = self.header(tar::EntryType::Directory, mode & 0o1777, 0);
                builder
                    .append_data(&mut h, format!("{rel_str}/"), io::empty())
                    .map_err(|e| io(&path, e))?;
                let mut sub = rel.clone();
                sub.push(b'/');
                self.walk(builder, &path, &sub)?;
            } else if ft.is_symlink() {
                let target = fs::read_link(&path).map_err(|e| io(&path, e))?;
                let mut h = self.header(tar::EntryType::Symlink, 0o777, 0);
                builder
                    .append_link(&mut h, &rel_str, &target)
                    .map_err(|e| io(&path, e))?;
            } else if ft.is_file() {
                if mode & 0o6000 != 0 {
                    return Err(build_err(format!(
                        "{rel_str} is setuid/setgid (mode {mode:o}); strip it before writing"
                    )));
                }
                let key = (meta.dev(), meta.ino());
                if meta.nlink() > 1 {
                    if let Some(first) = self.links.get(&key) {
                        let mut h = self.header(tar::EntryType::Link, mode, 0);
                        let first = String::from_utf8_lossy(first).into_owned();
                        builder
                            .append_link(&mut h, &rel_str, &first)
                            .map_err(|e| io(&path, e))?;
                        continue;
                    }
                    self.links.insert(key, rel.clone());
                }
                let file = File::open(&path).map_err(|e| io(&path, e))?;
                let mut h = self.header(tar::EntryType::Regular, mode, meta.len());
                builder
                    .append_data(&mut h, &rel_str, file)
                    .map_err(|e| io(&path, e))?;
            } else if ft.is_socket() {
                // Sockets are runtime state, never image content.
                self.entries -= 1;
            } else {
                return Err(build_err(format!(
                    "{rel_str} is a device node or FIFO; an image has none"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_tree_gives_the_same_digests() {
        let src = tempfile::tempdir().unwrap();
        fs::create_dir_all(src.path().join("usr/bin")).unwrap();
        fs::write(src.path().join("usr/bin/tool"), b"#!/bin/sh\n").unwrap();
        fs::hard_link(
            src.path().join("usr/bin/tool"),
            src.path().join("usr/bin/tool2"),
        )
        .unwrap();
        std::os::unix::fs::symlink("usr/bin", src.path().join("bin")).unwrap();
        let out = tempfile::tempdir().unwrap();
        let a = write_layer(src.path(), File::create(out.path().join("a")).unwrap(), 0).unwrap();
        // Touch everything: mtimes must not matter.
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(src.path().join("usr/bin/tool"), b"#!/bin/sh\n").unwrap();
        let b = write_layer(src.path(), File::create(out.path().join("b")).unwrap(), 0).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            fs::read(out.path().join("a")).unwrap(),
            fs::read(out.path().join("b")).unwrap()
        );
        assert_eq!(a.entries, 5);
    }
}
