//! Unpacking layer tars into a directory, safely: every path is resolved beneath the tree's
//! root without following any symlink (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`),
//! so nothing is ever written outside it, whatever the archive says.
//!
//! Refused, each with an error naming the entry: absolute paths and `..`; symlinks whose
//! target climbs above the root; hard links to something missing, a directory, or a path
//! that is absolute or has `..`; device nodes, FIFOs and sparse files; setuid and setgid
//! files; more bytes or entries than the bounds. Accepted with care: absolute symlink
//! targets (they resolve inside the image's root in the sandbox and are never followed on
//! the host); setgid on a directory is dropped (it grants nothing but group inheritance).
//! Ownership in the archive is ignored: the tree belongs to whoever unpacks it and is
//! mounted read-only. OCI whiteouts (`.wh.NAME`, `.wh..wh..opq`) remove what lower layers
//! made, never what the same layer made.
//!
//! A build's base ([`EntryPolicy::BuildBase`]) is unpacked with the same checks, except
//! that setuid/setgid bits are dropped and device nodes and FIFOs left out instead of
//! refused: the build strips them anyway, and stock images (Debian's `su`, `mount`, a
//! debootstrap tree's `/dev`) have them.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::digest::{BoundExceeded, is_bound_exceeded};
use crate::error::OciError;

/// Most bytes of uncompressed tar stream one image may unpack to, over all its layers.
pub const IMAGE_UNPACKED_MAX_BYTES: u64 = 16 << 30;
/// Most archive entries one image may hold, over all its layers.
pub const IMAGE_ENTRIES_MAX_COUNT: u64 = 1_000_000;
/// Longest entry path, in bytes.
pub const ENTRY_PATH_MAX_BYTES: usize = 4096;
/// Deepest entry path, in segments.
pub const ENTRY_PATH_MAX_DEPTH: usize = 128;
/// Longest symlink target, in bytes.
pub const SYMLINK_TARGET_MAX_BYTES: usize = 4096;

/// The prefix of a whiteout entry's name.
pub const WHITEOUT_PREFIX: &[u8] = b".wh.";
/// The name of an opaque-directory whiteout.
pub const WHITEOUT_OPAQUE: &[u8] = b".wh..wh..opq";

/// Bounds on what an image may unpack to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnpackLimits {
    /// Most bytes of uncompressed tar stream, over all layers.
    pub max_bytes: u64,
    /// Most entries, over all layers.
    pub max_entries: u64,
}

impl Default for UnpackLimits {
    fn default() -> Self {
        Self {
            max_bytes: IMAGE_UNPACKED_MAX_BYTES,
            max_entries: IMAGE_ENTRIES_MAX_COUNT,
        }
    }
}

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip.
    Gzip,
    /// zstd.
    Zstd,
}

impl Compression {
    /// The compression a layer media type names; `None` for a media type that is not a
    /// layer airlock can unpack.
    pub fn from_media_type(media_type: &str) -> Option<Self> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Some(Self::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Some(Self::Gzip),
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Some(Self::Zstd),
            _ => None,
        }
    }

    /// The compression the first bytes of a blob show.
    pub fn sniff(head: &[u8]) -> Self {
        if head.starts_with(&[0x1f, 0x8b]) {
            Self::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Self::Zstd
        } else {
            Self::None
        }
    }

    /// The OCI media type of a layer compressed this way.
    pub fn oci_media_type(self) -> &'static str {
        match self {
            Self::None => "application/vnd.oci.image.layer.v1.tar",
            Self::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
            Self::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
        }
    }
}

/// What the unpacker does with content a tree jobs run on must not have: setuid/setgid
/// files, device nodes, FIFOs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EntryPolicy {
    /// A tree jobs run on: such entries are refused.
    #[default]
    Run,
    /// A build's base, which the build strips anyway: setuid/setgid bits are dropped,
    /// device nodes and FIFOs left out, and the first such entry is noted
    /// ([`Unpacker::first_dropped`]).
    BuildBase,
}

/// Unpacks layers, in order, into one directory.
#[derive(Debug)]
pub struct Unpacker {
    root: OwnedFd,
    root_path: PathBuf,
    limits: UnpackLimits,
    policy: EntryPolicy,
    /// The first entry [`EntryPolicy::BuildBase`] dropped or changed, as the refusal
    /// [`EntryPolicy::Run`] would have given.
    first_dropped: Option<String>,
    bytes: u64,
    entries: u64,
    /// Final modes of directories, applied at the end (they stay 0700 while unpacking, so
    /// an unprivileged unpacker can fill a directory the archive makes read-only).
    dirs: BTreeMap<Vec<u8>, u32>,
}

/// A refused entry or a failed operation, before the layer's name is attached.
enum EntryError {
    Refused(String),
    /// Refused only in a tree jobs run on (see [`EntryPolicy`]).
    NotRunnable(String),
    Io(String, io::Error),
}

fn refused(reason: impl Into<String>) -> EntryError {
    EntryError::Refused(reason.into())
}

fn io_err(op: impl Into<String>) -> impl FnOnce(io::Error) -> EntryError {
    let op = op.into();
    move |e| EntryError::Io(op, e)
}

fn errno_io(op: impl Into<String>) -> impl FnOnce(Errno) -> EntryError {
    let op = op.into();
    move |e| EntryError::Io(op, io::Error::from(e))
}

fn os(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

fn join(components: &[Vec<u8>]) -> Vec<u8> {
    components.join(&b'/')
}

/// Splits an archive path into its segments: a leading `./` is fine; an absolute path, a
/// `..` segment, or a path too long or too deep is refused.
pub fn normalize_entry_path(raw: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if raw.len() > ENTRY_PATH_MAX_BYTES {
        return Err(format!("path longer than {ENTRY_PATH_MAX_BYTES} bytes"));
    }
    if raw.first() == Some(&b'/') {
        return Err("absolute path".to_owned());
    }
    let mut out = Vec::new();
    for segment in raw.split(|b| *b == b'/') {
        match segment {
            b"" | b"." => {}
            b".." => return Err("path with a .. segment".to_owned()),
            s if s.contains(&0) => return Err("path with a NUL byte".to_owned()),
            s => out.push(s.to_vec()),
        }
    }
    if out.len() > ENTRY_PATH_MAX_DEPTH {
        return Err(format!("path deeper than {ENTRY_PATH_MAX_DEPTH} segments"));
    }
    Ok(out)
}

/// Whether a symlink at `parent/…` with `target` stays inside the tree, resolving it
/// lexically (an absolute target from the image's root, as the sandbox sees it).
pub fn symlink_target_stays_inside(parent: &[Vec<u8>], target: &[u8]) -> bool {
    let mut at: Vec<&[u8]> = if target.first() == Some(&b'/') {
        Vec::new()
    } else {
        parent.iter().map(Vec::as_slice).collect()
    };
    for segment in target.split(|b| *b == b'/') {
        match segment {
            b"" | b"." => {}
            b".." => {
                if at.pop().is_none() {
                    return false;
                }
            }
            s => at.push(s),
        }
    }
    true
}

impl Unpacker {
    /// An unpacker into `root`, an existing empty directory.
    pub fn new(root: &Path, limits: UnpackLimits) -> Result<Self, OciError> {
        let fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| OciError::store_io("open", root, e.into()))?;
        Ok(Self {
            root: fd,
            root_path: root.to_owned(),
            limits,
            policy: EntryPolicy::Run,
            first_dropped: None,
            bytes: 0,
            entries: 0,
            dirs: BTreeMap::new(),
        })
    }

    /// The same unpacker with another [`EntryPolicy`].
    pub fn with_policy(mut self, policy: EntryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Under [`EntryPolicy::BuildBase`], the first entry dropped or changed (`layer L:
    /// entry E: reason`); `None` when the tree is as the layers say, fit to run.
    pub fn first_dropped(&self) -> Option<&str> {
        self.first_dropped.as_deref()
    }

    /// Bytes of tar stream read so far, over all layers.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes the next layer may still read.
    pub fn remaining_bytes(&self) -> u64 {
        self.limits.max_bytes.saturating_sub(self.bytes)
    }

    /// Applies one uncompressed layer tar read from `reader` (which the caller bounds to
    /// [`Unpacker::remaining_bytes`]); returns the reader, positioned after the archive's
    /// end marker. `bytes_read` tells how many bytes the reader passed.
    pub fn apply_layer<R: Read>(&mut self, layer: &str, reader: R) -> Result<R, OciError> {
        let mut archive = tar::Archive::new(reader);
        let mut created: HashSet<Vec<u8>> = HashSet::new();
        let entries = archive
            .entries()
            .map_err(|e| self.layer_io(layer, "read tar", e))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| self.layer_io(layer, "read tar entry", e))?;
            self.entries += 1;
            if self.entries > self.limits.max_entries {
                return Err(OciError::Bound {
                    what: format!("layer {layer}: archive entries"),
                    limit: format!("{} entries", self.limits.max_entries),
                });
            }
            let raw = entry.path_bytes().into_owned();
            let result = match self.apply_entry(layer, &mut entry, &raw, &mut created) {
                // Left out of a build's base.
                Err(EntryError::NotRunnable(reason)) if self.policy == EntryPolicy::BuildBase => {
                    self.note_dropped(layer, &raw, &reason);
                    Ok(())
                }
                other => other,
            };
            result.map_err(|e| match e {
                EntryError::Refused(reason) | EntryError::NotRunnable(reason) => {
                    OciError::UnpackEntry {
                        layer: layer.to_owned(),
                        entry: String::from_utf8_lossy(&raw).into_owned(),
                        reason,
                    }
                }
                EntryError::Io(op, source) => self.layer_io(
                    layer,
                    &format!("{op} {}", String::from_utf8_lossy(&raw)),
                    source,
                ),
            })?;
        }
        Ok(archive.into_inner())
    }

    fn note_dropped(&mut self, layer: &str, raw: &[u8], reason: &str) {
        if self.first_dropped.is_none() {
            self.first_dropped = Some(format!(
                "layer {layer}: entry {:?}: {reason}",
                String::from_utf8_lossy(raw)
            ));
        }
    }

    /// Records bytes read by the caller's bounded reader.
    pub fn add_bytes(&mut self, bytes: u64) {
        self.bytes = self.bytes.saturating_add(bytes);
    }

    fn layer_io(&self, layer: &str, op: &str, source: io::Error) -> OciError {
        if is_bound_exceeded(&source) {
            let limit = source
                .get_ref()
                .and_then(|e| e.downcast_ref::<BoundExceeded>())
                .map_or(self.limits.max_bytes, |b| b.limit_bytes);
            return OciError::Bound {
                what: format!("layer {layer}: uncompressed size"),
                limit: format!("{limit} bytes"),
            };
        }
        OciError::UnpackIo {
            layer: layer.to_owned(),
            op: op.to_owned(),
            source,
        }
    }

    fn apply_entry<R: Read>(
        &mut self,
        layer: &str,
        entry: &mut tar::Entry<'_, R>,
        raw: &[u8],
        created: &mut HashSet<Vec<u8>>,
    ) -> Result<(), EntryError> {
        let components = normalize_entry_path(raw).map_err(refused)?;
        let Some((name, parent)) = components.split_last() else {
            // The root itself (`./`): its mode is ours.
            return Ok(());
        };
        let path = join(&components);
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().map_err(io_err("read mode"))?;
        let mtime = header.mtime().unwrap_or(0);

        if name.starts_with(WHITEOUT_PREFIX) {
            return self.apply_whiteout(parent, name, created);
        }
        if !kind.is_dir() && mode & 0o6000 != 0 {
            let reason = format!(
                "setuid/setgid file (mode {:o}); airlock runs no setuid programs",
                mode & 0o7777
            );
            match self.policy {
                EntryPolicy::Run => return Err(EntryError::NotRunnable(reason)),
                // The file is written below with its permission bits only (mode & 0o777).
                EntryPolicy::BuildBase => self.note_dropped(layer, raw, &reason),
            }
        }
        let parent_fd = self.open_dir(parent, true)?;
        match kind {
            tar::EntryType::Directory => {
                if !self.keep_or_remove(&parent_fd, name, true)? {
                    rustix::fs::mkdirat(&parent_fd, os(name), Mode::from_raw_mode(0o700))
                        .map_err(errno_io("create directory"))?;
                }
                // setgid on a directory grants nothing; it is dropped with setuid.
                self.dirs.insert(path.clone(), mode & 0o1777);
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = header.size().map_err(io_err("read size"))?;
                if size > self.remaining_bytes() {
                    return Err(EntryError::Io(
                        "size".to_owned(),
                        io::Error::other(BoundExceeded {
                            limit_bytes: self.limits.max_bytes,
                        }),
                    ));
                }
                self.keep_or_remove(&parent_fd, name, false)?;
                let fd = rustix::fs::openat(
                    &parent_fd,
                    os(name),
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(errno_io("create file"))?;
                let mut file = File::from(fd);
                io::copy(entry, &mut file).map_err(io_err("write file"))?;
                rustix::fs::fchmod(&file, Mode::from_raw_mode(mode & 0o777))
                    .map_err(errno_io("chmod"))?;
                set_mtime_fd(&file, mtime).map_err(errno_io("set mtime"))?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| refused("symlink without a target"))?
                    .into_owned();
                if target.is_empty() || target.len() > SYMLINK_TARGET_MAX_BYTES {
                    return Err(refused(format!(
                        "symlink target empty or longer than {SYMLINK_TARGET_MAX_BYTES} bytes"
                    )));
                }
                if target.contains(&0) || !symlink_target_stays_inside(parent, &target) {
                    return Err(refused(format!(
                        "symlink to {:?} points out of the tree",
                        String::from_utf8_lossy(&target)
                    )));
                }
                self.keep_or_remove(&parent_fd, name, false)?;
                rustix::fs::symlinkat(os(&target), &parent_fd, os(name))
                    .map_err(errno_io("create symlink"))?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| refused("hard link without a target"))?
                    .into_owned();
                let target_components = normalize_entry_path(&target).map_err(|reason| {
                    refused(format!(
                        "hard link to {:?} points out of the tree ({reason})",
                        String::from_utf8_lossy(&target)
                    ))
                })?;
                let Some((target_name, target_parent)) = target_components.split_last() else {
                    return Err(refused("hard link to the root"));
                };
                let target_parent_fd = self.open_dir(target_parent, false)?;
                let stat = rustix::fs::statat(
                    &target_parent_fd,
                    os(target_name),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(|e| {
                    refused(format!(
                        "hard link to {:?}, which is not in the tree ({e})",
                        String::from_utf8_lossy(&target)
                    ))
                })?;
                let target_kind = rustix::fs::FileType::from_raw_mode(stat.st_mode);
                if !matches!(
                    target_kind,
                    rustix::fs::FileType::RegularFile | rustix::fs::FileType::Symlink
                ) {
                    return Err(refused(format!(
                        "hard link to {:?}, which is not a file",
                        String::from_utf8_lossy(&target)
                    )));
                }
                if target_components == components {
                    return Ok(());
                }
                self.keep_or_remove(&parent_fd, name, false)?;
                rustix::fs::linkat(
                    &target_parent_fd,
                    os(target_name),
                    &parent_fd,
                    os(name),
                    AtFlags::empty(),
                )
                .map_err(errno_io("create hard link"))?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(EntryError::NotRunnable(
                    "device node; images get their /dev from airlock".to_owned(),
                ));
            }
            tar::EntryType::Fifo => return Err(EntryError::NotRunnable("FIFO".to_owned())),
            tar::EntryType::GNUSparse => return Err(refused("sparse file")),
            tar::EntryType::XGlobalHeader
            | tar::EntryType::XHeader
            | tar::EntryType::GNULongName
            | tar::EntryType::GNULongLink => return Ok(()),
            other => {
                return Err(refused(format!("entry type {:?}", other.as_byte() as char)));
            }
        }
        created.insert(path);
        Ok(())
    }

    fn apply_whiteout(
        &mut self,
        parent: &[Vec<u8>],
        name: &[u8],
        created: &HashSet<Vec<u8>>,
    ) -> Result<(), EntryError> {
        let parent_fd = match self.open_dir(parent, false) {
            Ok(fd) => fd,
            // Whiting out inside a directory no lower layer has: nothing to remove.
            Err(EntryError::Io(_, e)) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let parent_path = join(parent);
        let child_path = |child: &[u8]| {
            if parent_path.is_empty() {
                child.to_vec()
            } else {
                [parent_path.as_slice(), b"/", child].concat()
            }
        };
        if name == WHITEOUT_OPAQUE {
            let dir_fd = rustix::fs::openat(
                &parent_fd,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(errno_io("open directory"))?;
            let mut children = Vec::new();
            for item in rustix::fs::Dir::read_from(&dir_fd).map_err(errno_io("read directory"))? {
                let item = item.map_err(errno_io("read directory"))?;
                let child = item.file_name().to_bytes();
                if child != b"." && child != b".." && !created.contains(&child_path(child)) {
                    children.push(child.to_vec());
                }
            }
            for child in children {
                remove_any(&parent_fd, &child).map_err(io_err("apply opaque whiteout"))?;
            }
            return Ok(());
        }
        let target = &name[WHITEOUT_PREFIX.len()..];
        if target.is_empty()
            || target == b"."
            || target == b".."
            || target.starts_with(WHITEOUT_PREFIX)
        {
            return Err(refused("malformed whiteout"));
        }
        if created.contains(&child_path(target)) {
            return Ok(());
        }
        match remove_any(&parent_fd, target) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(EntryError::Io("apply whiteout".to_owned(), e)),
        }
    }

    /// Removes whatever is at `parent/name`, unless it is a directory and `keep_dir`;
    /// returns whether a directory was kept.
    fn keep_or_remove(
        &self,
        parent: &OwnedFd,
        name: &[u8],
        keep_dir: bool,
    ) -> Result<bool, EntryError> {
        match rustix::fs::statat(parent, os(name), AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(EntryError::Io("stat".to_owned(), e.into())),
            Ok(stat) => {
                let is_dir = rustix::fs::FileType::from_raw_mode(stat.st_mode)
                    == rustix::fs::FileType::Directory;
                if is_dir && keep_dir {
                    return Ok(true);
                }
                remove_any(parent, name).map_err(io_err("replace"))?;
                Ok(false)
            }
        }
    }

    /// Opens the directory at `components` beneath the root, never following a symlink;
    /// with `create`, makes missing directories (mode 0755 in the end).
    fn open_dir(&mut self, components: &[Vec<u8>], create: bool) -> Result<OwnedFd, EntryError> {
        let path = join(components);
        match open_beneath(&self.root, &path) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) if create => {}
            Err(e) => return Err(beneath_error(e, &path)),
        }
        let mut fd = open_beneath(&self.root, b".").map_err(errno_io("open root"))?;
        for (i, segment) in components.iter().enumerate() {
            fd = match open_beneath(&fd, segment) {
                Ok(next) => next,
                Err(Errno::NOENT) => {
                    rustix::fs::mkdirat(&fd, os(segment), Mode::from_raw_mode(0o700))
                        .map_err(errno_io("create directory"))?;
                    self.dirs.entry(join(&components[..=i])).or_insert(0o755);
                    open_beneath(&fd, segment).map_err(|e| beneath_error(e, segment))?
                }
                Err(e) => return Err(beneath_error(e, &join(&components[..=i]))),
            };
        }
        Ok(fd)
    }

    /// Applies the directories' final modes; the tree is complete.
    pub fn finish(self) -> Result<(), OciError> {
        // Deepest first, so a parent made read-only does not stop its children's chmod.
        let mut dirs: Vec<(&Vec<u8>, &u32)> = self.dirs.iter().collect();
        dirs.sort_by_key(|(path, _)| {
            std::cmp::Reverse(path.iter().filter(|b| **b == b'/').count())
        });
        for (path, mode) in dirs {
            let fd = match rustix::fs::openat2(
                &self.root,
                os(path),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
                beneath_flags(),
            ) {
                Ok(fd) => fd,
                // Removed by a later layer's whiteout.
                Err(Errno::NOENT) => continue,
                Err(e) => {
                    return Err(OciError::store_io(
                        "open directory",
                        self.root_path.join(os(path)),
                        e.into(),
                    ));
                }
            };
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(*mode)).map_err(|e| {
                OciError::store_io("chmod", self.root_path.join(os(path)), e.into())
            })?;
        }
        rustix::fs::chmod(&self.root_path, Mode::from_raw_mode(0o755))
            .map_err(|e| OciError::store_io("chmod", &self.root_path, e.into()))?;
        Ok(())
    }
}

fn beneath_flags() -> ResolveFlags {
    ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV
}

fn open_beneath(dir: &OwnedFd, path: &[u8]) -> Result<OwnedFd, Errno> {
    let path: &[u8] = if path.is_empty() { b"." } else { path };
    rustix::fs::openat2(
        dir,
        os(path),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        beneath_flags(),
    )
}

fn beneath_error(e: Errno, path: &[u8]) -> EntryError {
    let path = String::from_utf8_lossy(path);
    match e {
        Errno::LOOP => refused(format!("{path:?} goes through a symlink")),
        Errno::XDEV => refused(format!("{path:?} leaves the tree")),
        Errno::NOTDIR => refused(format!("{path:?} is not a directory")),
        Errno::NOSYS => EntryError::Io(
            "openat2 (Linux 5.6 or later is needed to unpack images safely)".to_owned(),
            e.into(),
        ),
        e => EntryError::Io(format!("open {path}"), e.into()),
    }
}

fn set_mtime_fd(file: &File, mtime: u64) -> Result<(), Errno> {
    let when = rustix::fs::Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(0),
        tv_nsec: 0,
    };
    rustix::fs::futimens(
        file,
        &rustix::fs::Timestamps {
            last_access: when,
            last_modification: when,
        },
    )
}

/// Removes `parent/name`, recursively when it is a directory, never following a symlink.
pub fn remove_any(parent: &impl AsFd, name: &[u8]) -> io::Result<()> {
    let stat = rustix::fs::statat(parent, os(name), AtFlags::SYMLINK_NOFOLLOW)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Directory {
        rustix::fs::unlinkat(parent, os(name), AtFlags::empty())?;
        return Ok(());
    }
    let dir = rustix::fs::openat(
        parent,
        os(name),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // A read-only directory of a finished tree: make it ours to empty.
    let _ = rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700));
    let mut children = Vec::new();
    for item in rustix::fs::Dir::read_from(&dir)? {
        let item = item?;
        let child = item.file_name().to_bytes();
        if child != b"." && child != b".." {
            children.push(child.to_vec());
        }
    }
    for child in children {
        remove_any(&dir, &child)?;
    }
    rustix::fs::unlinkat(parent, os(name), AtFlags::REMOVEDIR)?;
    Ok(())
}

/// Removes a whole directory tree at `path` (not following symlinks inside it).
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::other(format!(
            "cannot remove {}",
            path.display()
        )));
    };
    let parent = rustix::fs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    match remove_any(&parent, name.as_bytes()) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_paths_normalize_or_are_refused() {
        assert_eq!(
            normalize_entry_path(b"./usr//bin/").unwrap(),
            vec![b"usr".to_vec(), b"bin".to_vec()]
        );
        assert!(normalize_entry_path(b"./").unwrap().is_empty());
        for bad in [&b"/etc/passwd"[..], b"../x", b"a/../../x", b"a/.."] {
            assert!(normalize_entry_path(bad).is_err(), "{bad:?}");
        }
        assert!(normalize_entry_path(&vec![b'a'; ENTRY_PATH_MAX_BYTES + 1]).is_err());
    }

    #[test]
    fn symlink_targets_are_judged_lexically() {
        let parent = vec![b"usr".to_vec(), b"bin".to_vec()];
        assert!(symlink_target_stays_inside(&parent, b"python3.11"));
        assert!(symlink_target_stays_inside(&parent, b"../lib/x"));
        assert!(symlink_target_stays_inside(&parent, b"../../etc/x"));
        assert!(symlink_target_stays_inside(&parent, b"/etc/alternatives/x"));
        assert!(!symlink_target_stays_inside(
            &parent,
            b"../../../etc/shadow"
        ));
        assert!(!symlink_target_stays_inside(&[], b"/../etc"));
    }

    #[test]
    fn media_types_and_magic() {
        assert_eq!(
            Compression::from_media_type("application/vnd.oci.image.layer.v1.tar+gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(Compression::from_media_type("application/json"), None);
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8]), Compression::Gzip);
        assert_eq!(Compression::sniff(b"usr/"), Compression::None);
    }
}
