//! A session's host-side `/work`: a tmpfs whose size is the session's cap (the filesystem
//! itself enforces it, during a job as between them), bound at `/work` in each sandbox of
//! the session, and the host's own reads and writes in it.
//!
//! Everything in a workspace was, or may have been, written by a job, so the host treats
//! it as hostile: a file is read through `openat2` relative to the workspace's root
//! descriptor (beneath it, no symbolic or magic link followed, no other mount crossed),
//! other paths are walked from the root one segment at a time with `O_NOFOLLOW`, only
//! regular files are read (`O_NONBLOCK` and `fstat`, so a FIFO or a device cannot hang the
//! host), reads are capped (a file that grows while read included), and a name is replaced
//! by unlinking it, never by writing through what sits there.
//!
//! Hard links are allowed: a workspace is a tmpfs of its own, and `link(2)` cannot cross
//! filesystems, so a second name can only ever point at a file of the same workspace (one
//! the session's code made, or the host wrote for it), never at a host file; a read never
//! leaves the workspace's own mount. Names are handed back raw: whoever shows them to a
//! client escapes and redacts them (`airlock_core::observation::shown_workspace_name`), and
//! file content leaves through `release_workspace_file`, the same scan as `/out`.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use airlock_core::ErrorKind;
use airlock_core::job::check_relative_path;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::error::HostError;

/// The suffix of a workspace's lock file, beside its mount point.
const LOCK_SUFFIX: &str = ".lock";

/// A workspace without a lock younger than this may still be being created.
const UNLOCKED_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the workspaces under `root` whose server is gone (their lock can be taken, or
/// they have none and are older than a minute): unmounted, with everything in them.
/// Returns their names.
pub fn sweep_stale(root: &Path) -> std::io::Result<Vec<String>> {
    let mut swept = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.starts_with('.') || name.ends_with(LOCK_SUFFIX) {
            continue;
        }
        let path = root.join(&name);
        let lock_path = root.join(format!("{name}{LOCK_SUFFIX}"));
        let stale = match rustix::fs::open(
            &lock_path,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(lock) => {
                rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                    .is_ok()
            }
            Err(Errno::NOENT) => std::fs::symlink_metadata(&path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > UNLOCKED_GRACE)),
            Err(_) => false,
        };
        if !stale {
            continue;
        }
        match rustix::mount::unmount(&path, rustix::mount::UnmountFlags::DETACH) {
            Ok(()) | Err(Errno::INVAL) => {}
            Err(e) => return Err(e.into()),
        }
        // Not mounted any more: only an empty mount point is left (a plain directory
        // with content is not ours to delete).
        if std::fs::remove_dir(&path).is_ok() {
            let _ = std::fs::remove_file(&lock_path);
            swept.push(name);
        }
    }
    Ok(swept)
}

/// Deepest directory level walked when listing.
pub const WORKSPACE_MAX_DEPTH: usize = 8;

/// One regular file of a workspace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkspaceEntry {
    /// Path relative to `/work`.
    pub path: String,
    /// Size.
    pub bytes: u64,
}

/// What kind of entry a path of a workspace is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceEntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (never followed by the host).
    Symlink,
    /// Anything else (a fifo, a socket).
    Other,
}

/// One entry of a workspace, as [`Workspace::stat`] and [`Workspace::list_dir`] see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkspaceStat {
    /// Path relative to `/work` (`""` for `/work` itself).
    pub path: String,
    /// What it is.
    pub kind: WorkspaceEntryKind,
    /// Size in bytes.
    pub bytes: u64,
    /// Permission bits.
    pub mode: u32,
    /// Last modification, seconds since the epoch.
    pub modified_s: i64,
    /// A link's target as written (never resolved).
    pub link_target: Option<String>,
}

/// A mounted session workspace. Unmounted and removed by [`Workspace::destroy`] or on drop.
///
/// Beside the mount point, `<name>.lock` is held (flock) for the workspace's life: one
/// whose lock can be taken belongs to a server that died, and [`sweep_stale`] removes it.
/// The lock lives outside the tmpfs, where no job can reach it.
#[derive(Debug)]
pub struct Workspace {
    path: PathBuf,
    lock_path: PathBuf,
    mounted: bool,
    _lock: OwnedFd,
}

impl Workspace {
    /// Creates `<root>/<name>` and mounts a tmpfs of `max_bytes` and `max_files` inodes on
    /// it, `nosuid,nodev`. Needs the privilege to mount (root): a workspace without its cap
    /// is refused rather than made.
    pub fn create(
        root: &Path,
        name: &str,
        max_bytes: u64,
        max_files: u32,
    ) -> Result<Self, HostError> {
        let path = root.join(name);
        let lock_path = root.join(format!("{name}{LOCK_SUFFIX}"));
        let err = |op: &'static str| {
            let path = path.clone();
            move |source: std::io::Error| HostError::Workspace { op, path, source }
        };
        if name.contains('/') || name.starts_with('.') || name.ends_with(LOCK_SUFFIX) {
            return Err(err("name")(std::io::Error::from(
                std::io::ErrorKind::InvalidInput,
            )));
        }
        let lock = rustix::fs::open(
            &lock_path,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| err("create the lock")(e.into()))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| err("lock")(e.into()))?;
        let cleanup = |lock_path: &Path| {
            let _ = std::fs::remove_file(lock_path);
        };
        if let Err(e) = std::fs::create_dir(&path) {
            cleanup(&lock_path);
            return Err(err("create")(e));
        }
        let options = format!(
            "size={max_bytes},nr_inodes={},mode=0700",
            max_files.saturating_add(1)
        );
        let data =
            std::ffi::CString::new(options).map_err(|e| err("mount")(std::io::Error::other(e)))?;
        if let Err(e) = rustix::mount::mount(
            "airlock-session",
            &path,
            "tmpfs",
            rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
            data.as_c_str(),
        ) {
            let _ = std::fs::remove_dir(&path);
            cleanup(&lock_path);
            return Err(err("mount a size-capped tmpfs (needs root)")(e.into()));
        }
        Ok(Self {
            path,
            lock_path,
            mounted: true,
            _lock: lock,
        })
    }

    /// The mount point (what a session's jobs carry as their workspace).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Unmounts the tmpfs (everything in it goes with it) and removes the mount point.
    pub fn destroy(mut self) -> Result<(), HostError> {
        self.unmount()
    }

    fn unmount(&mut self) -> Result<(), HostError> {
        if !self.mounted {
            return Ok(());
        }
        self.mounted = false;
        let path = self.path.clone();
        let err = |op: &'static str| {
            let path = path.clone();
            move |source: std::io::Error| HostError::Workspace { op, path, source }
        };
        // Lazily: a descriptor the host still holds must not keep the tmpfs reachable by
        // path, and the memory is freed when the last one closes.
        rustix::mount::unmount(&self.path, rustix::mount::UnmountFlags::DETACH)
            .map_err(|e| err("unmount")(e.into()))?;
        std::fs::remove_dir(&self.path).map_err(err("remove"))?;
        std::fs::remove_file(&self.lock_path).map_err(err("remove the lock"))
    }

    fn root(&self) -> Result<OwnedFd, HostError> {
        open_root(&self.path)
    }

    /// Writes `content` at `rel`, creating the directories on the way; what sits at the
    /// name (a file, a link) is unlinked first. The file appears whole: it is written under
    /// a temporary name and renamed, so a job polling for it (the session kernel waiting for
    /// its next call) never reads it half written. A full workspace is `invalid_input`.
    pub fn write_file(&self, rel: &str, content: &[u8]) -> Result<(), HostError> {
        write_file_at(&self.root()?, rel, content, Mode::from_raw_mode(0o644))
    }

    /// Reads the regular file at `rel`, at most `cap` bytes (a larger file is refused).
    pub fn read_file(&self, rel: &str, cap: u64) -> Result<Vec<u8>, HostError> {
        read_file_at(&self.root()?, rel, cap)
    }

    /// The regular file at `rel`, opened for reading without following a link on the way
    /// (`O_NOFOLLOW`, `O_NONBLOCK`: a FIFO or a link the job put there is not opened);
    /// `None` when it is missing or not a regular file. For a file the job is still
    /// writing, read as it grows (a kernel call's output, streamed).
    pub fn open_file(&self, rel: &str) -> Result<Option<std::fs::File>, HostError> {
        let root = self.root()?;
        let (dir, name) = walk_to_parent(&root, rel, false)?;
        let Some(dir) = dir else { return Ok(None) };
        let fd = match rustix::fs::openat(
            &dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::LOOP) => return Ok(None),
            Err(e) => return Err(file_error(rel, format!("open: {e}"), ErrorKind::Internal)),
        };
        let st = rustix::fs::fstat(&fd)
            .map_err(|e| file_error(rel, format!("stat: {e}"), ErrorKind::Internal))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Ok(None);
        }
        Ok(Some(std::fs::File::from(fd)))
    }

    /// Removes the file (or link) at `rel`; absent is fine.
    pub fn remove_file(&self, rel: &str) -> Result<(), HostError> {
        let root = self.root()?;
        let (dir, name) = walk_to_parent(&root, rel, false)?;
        let Some(dir) = dir else { return Ok(()) };
        match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(file_error(rel, format!("remove: {e}"), ErrorKind::Internal)),
        }
    }

    /// The directory at `rel`, opened without following a link on the way; `None` when
    /// it is missing (or not a plain directory).
    pub fn open_dir(&self, rel: &str) -> Result<Option<OwnedFd>, HostError> {
        let root = self.root()?;
        let (dir, name) = walk_to_parent(&root, rel, false)?;
        let Some(dir) = dir else { return Ok(None) };
        match open_dir_at(&dir, name) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => Ok(None),
            Err(e) => Err(file_error(rel, format!("open: {e}"), ErrorKind::Internal)),
        }
    }

    /// Removes the directory at `rel` and what it holds, never following a link (a link
    /// is removed, not its target); absent is fine. Entries deeper than the walk's depth
    /// bound stay, and so does their directory: the workspace's own end removes them.
    pub fn remove_dir_all(&self, rel: &str) -> Result<(), HostError> {
        let root = self.root()?;
        let (dir, name) = walk_to_parent(&root, rel, false)?;
        let Some(dir) = dir else { return Ok(()) };
        remove_tree_at(&dir, name, 0);
        Ok(())
    }

    /// What is at `rel` (`""` is `/work` itself), never following a link: a link is
    /// reported as one. `None` when nothing is there.
    pub fn stat(&self, rel: &str) -> Result<Option<WorkspaceStat>, HostError> {
        let root = self.root()?;
        if rel.is_empty() {
            return stat_at(&root, ".", "").map(Some);
        }
        let (dir, name) = walk_to_parent(&root, rel, false)?;
        let Some(dir) = dir else { return Ok(None) };
        match stat_at(&dir, name, rel) {
            Ok(stat) => Ok(Some(stat)),
            Err(HostError::WorkspaceMissing { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The entries of the directory at `rel` (`""` is `/work`), in name order, and those of
    /// its subdirectories down to `depth` levels (1: the directory's own), at most
    /// `max_entries`; links are listed, never followed. `None` when `rel` is not a plain
    /// directory.
    pub fn list_dir(
        &self,
        rel: &str,
        depth: usize,
        max_entries: usize,
    ) -> Result<Option<Vec<WorkspaceStat>>, HostError> {
        let dir = if rel.is_empty() {
            self.root()?
        } else {
            match self.open_dir(rel)? {
                Some(dir) => dir,
                None => return Ok(None),
            }
        };
        let mut out = Vec::new();
        list_entries(
            &dir,
            rel,
            depth.clamp(1, WORKSPACE_MAX_DEPTH),
            max_entries,
            &mut out,
        );
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(Some(out))
    }

    /// Makes the directory `rel` and the missing ones on the way; `false` when it was
    /// there already.
    pub fn make_dir(&self, rel: &str) -> Result<bool, HostError> {
        let root = self.root()?;
        let (dir, name) = walk_to_parent(&root, rel, true)?;
        let Some(dir) = dir else {
            return Err(HostError::WorkspaceMissing {
                path: rel.to_owned(),
            });
        };
        match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => match open_dir_at(&dir, name) {
                Ok(_) => Ok(false),
                Err(_) => Err(file_error(
                    rel,
                    "something that is not a directory is there",
                    ErrorKind::InvalidInput,
                )),
            },
            Err(Errno::NOSPC | Errno::DQUOT) => Err(file_error(
                rel,
                "the session's /work is full",
                ErrorKind::InvalidInput,
            )),
            Err(e) => Err(file_error(rel, format!("mkdir: {e}"), ErrorKind::Internal)),
        }
    }

    /// Makes a FIFO at `rel` (mode 0600, what was at the name removed first, directories
    /// on the way made) and returns it opened for reading and writing, non-blocking: the
    /// host's end of a wake-up channel to the session's kernel. Opened here, once, through
    /// the directory it was made in, so no later look-up of the name (which the job can
    /// replace) is ever followed; writing to it never blocks the host, whatever the job
    /// does with its end.
    pub fn make_fifo(&self, rel: &str) -> Result<OwnedFd, HostError> {
        let root = self.root()?;
        let (dir, name) = walk_to_parent(&root, rel, true)?;
        let Some(dir) = dir else {
            return Err(HostError::WorkspaceMissing {
                path: rel.to_owned(),
            });
        };
        let fail =
            |what: &str, e: Errno| file_error(rel, format!("{what}: {e}"), ErrorKind::Internal);
        match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(fail("remove", e)),
        }
        rustix::fs::mknodat(&dir, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)
            .map_err(|e| fail("mkfifo", e))?;
        let fd = rustix::fs::openat(
            &dir,
            name,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| fail("open", e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| fail("stat", e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Fifo {
            return Err(file_error(
                rel,
                "not the FIFO just made",
                ErrorKind::Internal,
            ));
        }
        Ok(fd)
    }

    /// Renames `from` to `to` (directories on the way to `to` are made); what `from` is
    /// (a file, a directory, a link) moves as it is, never followed.
    pub fn rename(&self, from: &str, to: &str) -> Result<(), HostError> {
        let root = self.root()?;
        let (from_dir, from_name) = walk_to_parent(&root, from, false)?;
        let Some(from_dir) = from_dir else {
            return Err(HostError::WorkspaceMissing {
                path: from.to_owned(),
            });
        };
        let (to_dir, to_name) = walk_to_parent(&root, to, true)?;
        let Some(to_dir) = to_dir else {
            return Err(HostError::WorkspaceMissing {
                path: to.to_owned(),
            });
        };
        match rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name) {
            Ok(()) => Ok(()),
            Err(Errno::NOENT) => Err(HostError::WorkspaceMissing {
                path: from.to_owned(),
            }),
            Err(e) => Err(file_error(
                from,
                format!("rename to {to:?}: {e}"),
                ErrorKind::InvalidInput,
            )),
        }
    }

    /// The regular files, in path order, at most `max_entries` entries looked at.
    pub fn list(&self, max_entries: usize) -> Result<Vec<WorkspaceEntry>, HostError> {
        let root = self.root()?;
        let mut out = Vec::new();
        let mut seen = 0usize;
        list_dir(&root, "", 0, max_entries, &mut seen, &mut out);
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if let Err(e) = self.unmount() {
            tracing::warn!(error = %e, "cannot remove a session workspace");
        }
    }
}

fn file_error(rel: &str, reason: impl Into<String>, kind: ErrorKind) -> HostError {
    HostError::WorkspaceFile {
        path: rel.to_owned(),
        reason: reason.into(),
        kind,
    }
}

/// Opens a workspace's root (the host's own path: the last component must not be a link).
pub fn open_root(path: &Path) -> Result<OwnedFd, HostError> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| HostError::Workspace {
        op: "open",
        path: path.to_owned(),
        source: e.into(),
    })
}

fn open_dir_at(dir: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Walks to the directory holding `rel`'s last segment. With `create`, missing
/// directories are made; without, a missing one gives `None`.
fn walk_to_parent<'a>(
    root: &OwnedFd,
    rel: &'a str,
    create: bool,
) -> Result<(Option<OwnedFd>, &'a str), HostError> {
    check_relative_path(rel).map_err(|r| file_error(rel, r, ErrorKind::InvalidInput))?;
    let (parents, name) = match rel.rsplit_once('/') {
        Some((parents, name)) => (Some(parents), name),
        None => (None, rel),
    };
    let mut dir = rustix::io::dup(root)
        .map_err(|e| file_error(rel, format!("dup: {e}"), ErrorKind::Internal))?;
    for segment in parents.into_iter().flat_map(|p| p.split('/')) {
        dir = match open_dir_at(&dir, segment) {
            Ok(next) => next,
            Err(Errno::NOENT) if create => {
                match rustix::fs::mkdirat(&dir, segment, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(Errno::NOSPC | Errno::DQUOT) => {
                        return Err(file_error(
                            rel,
                            "the session's /work is full",
                            ErrorKind::InvalidInput,
                        ));
                    }
                    Err(e) => {
                        return Err(file_error(
                            rel,
                            format!("mkdir {segment:?}: {e}"),
                            ErrorKind::Internal,
                        ));
                    }
                }
                open_dir_at(&dir, segment).map_err(|e| {
                    file_error(
                        rel,
                        format!("{segment:?} is not a directory ({e})"),
                        ErrorKind::InvalidInput,
                    )
                })?
            }
            Err(Errno::NOENT) => return Ok((None, name)),
            Err(e) => {
                return Err(file_error(
                    rel,
                    format!("{segment:?} is not a plain directory ({e})"),
                    ErrorKind::InvalidInput,
                ));
            }
        };
    }
    Ok((Some(dir), name))
}

/// Writes a file below `root` (see [`Workspace::write_file`]).
pub fn write_file_at(
    root: &OwnedFd,
    rel: &str,
    content: &[u8],
    mode: Mode,
) -> Result<(), HostError> {
    let (dir, name) = walk_to_parent(root, rel, true)?;
    let Some(dir) = dir else {
        return Err(file_error(rel, "directory vanished", ErrorKind::Internal));
    };
    match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(Errno::ISDIR | Errno::PERM) => {
            return Err(file_error(rel, "is a directory", ErrorKind::InvalidInput));
        }
        Err(e) => {
            return Err(file_error(
                rel,
                format!("replace: {e}"),
                ErrorKind::Internal,
            ));
        }
    }
    let full = |e: std::io::Error| {
        if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
            file_error(rel, "the session's /work is full", ErrorKind::InvalidInput)
        } else {
            file_error(rel, format!("write: {e}"), ErrorKind::Internal)
        }
    };
    let (fd, temp) = create_temporary(&dir, mode).map_err(|e| full(e.into()))?;
    let mut file = std::fs::File::from(fd);
    if let Err(e) = file.write_all(content) {
        let _ = rustix::fs::unlinkat(&dir, &temp, AtFlags::empty());
        return Err(full(e));
    }
    drop(file);
    // Whatever the job put at the name meanwhile is replaced; a directory stays and fails.
    if let Err(e) = rustix::fs::renameat(&dir, &temp, &dir, name) {
        let _ = rustix::fs::unlinkat(&dir, &temp, AtFlags::empty());
        return Err(match e {
            Errno::ISDIR | Errno::NOTEMPTY => {
                file_error(rel, "is a directory", ErrorKind::InvalidInput)
            }
            e => file_error(rel, format!("rename into place: {e}"), ErrorKind::Internal),
        });
    }
    Ok(())
}

/// Prefix of the names files are written under before they are renamed into place.
const TEMPORARY_PREFIX: &str = ".airlock-write-";

/// Creates a new, empty file in `dir` under a name of its own (never one that existed: a
/// job may have made links there), returning it and its name.
fn create_temporary(dir: &OwnedFd, mode: Mode) -> Result<(OwnedFd, String), Errno> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut attempt = 0;
    loop {
        let name = format!(
            "{TEMPORARY_PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        match rustix::fs::openat(
            dir,
            name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            mode,
        ) {
            Ok(fd) => return Ok((fd, name)),
            Err(Errno::EXIST) if attempt < 16 => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Opens `rel` below `root` for reading as the kernel resolves it with `openat2`: beneath
/// the root (no `..` out, no absolute link), no symbolic link followed anywhere on the way
/// (a link swapped in for a directory or the file between a check and the open is `ELOOP`,
/// not followed), no magic link (`/proc/…/fd`), and no crossing into another mount
/// (`EXDEV`). Non-blocking, so a FIFO or a device never hangs the host; the caller checks
/// the type with `fstat`. On a kernel without `openat2` (before 5.6) it falls back to the
/// walk one segment at a time with `O_NOFOLLOW`, which holds the same properties but the
/// mount one. The outer error is a bad path; the inner one, what the open said.
fn open_beneath(root: &OwnedFd, rel: &str) -> Result<Result<OwnedFd, Errno>, HostError> {
    use rustix::fs::ResolveFlags;
    check_relative_path(rel).map_err(|r| file_error(rel, r, ErrorKind::InvalidInput))?;
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let resolve = ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV;
    let mut attempt = 0;
    loop {
        match rustix::fs::openat2(root, rel, flags, Mode::empty(), resolve) {
            // A rename anywhere on the host during the lookup makes the kernel refuse to
            // vouch for it; a retry is safe (the job can stall reads, never redirect them).
            Err(Errno::AGAIN) if attempt < 16 => attempt += 1,
            // No openat2 (an old kernel, or a seccomp filter that refuses it): the walk.
            Err(Errno::NOSYS | Errno::PERM) => break,
            other => return Ok(other),
        }
    }
    let (dir, name) = walk_to_parent(root, rel, false)?;
    let Some(dir) = dir else {
        return Ok(Err(Errno::NOENT));
    };
    Ok(rustix::fs::openat(&dir, name, flags, Mode::empty()))
}

/// Reads a regular file below `root`, at most `cap` bytes.
pub fn read_file_at(root: &OwnedFd, rel: &str, cap: u64) -> Result<Vec<u8>, HostError> {
    let missing = || HostError::WorkspaceMissing {
        path: rel.to_owned(),
    };
    let fd = match open_beneath(root, rel)? {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => return Err(missing()),
        Err(Errno::XDEV) => {
            return Err(file_error(
                rel,
                "outside the workspace's own filesystem",
                ErrorKind::InvalidInput,
            ));
        }
        Err(e) => {
            return Err(file_error(
                rel,
                format!("open: {e}"),
                ErrorKind::InvalidInput,
            ));
        }
    };
    let st = rustix::fs::fstat(&fd)
        .map_err(|e| file_error(rel, format!("stat: {e}"), ErrorKind::Internal))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(missing());
    }
    if st.st_size as u64 > cap {
        return Err(file_error(
            rel,
            format!("{} bytes, more than the cap of {cap}", st.st_size),
            ErrorKind::InvalidInput,
        ));
    }
    let mut content = Vec::new();
    // One byte past the cap: a file that grew after the stat is still caught.
    std::fs::File::from(fd)
        .take(cap.saturating_add(1))
        .read_to_end(&mut content)
        .map_err(|e| file_error(rel, format!("read: {e}"), ErrorKind::Internal))?;
    if content.len() as u64 > cap {
        return Err(file_error(
            rel,
            format!("more than the cap of {cap} bytes"),
            ErrorKind::InvalidInput,
        ));
    }
    Ok(content)
}

/// Removes `name` below `parent`: a directory with its content (to the depth bound),
/// anything else unlinked. Best effort: what cannot be removed stays for the workspace's
/// unmount.
fn remove_tree_at(parent: &OwnedFd, name: &str, depth: usize) {
    if rustix::fs::unlinkat(parent, name, AtFlags::empty()).is_ok() {
        return;
    }
    if depth >= WORKSPACE_MAX_DEPTH {
        return;
    }
    let Ok(dir) = open_dir_at(parent, name) else {
        return;
    };
    let Ok(dup) = rustix::io::dup(&dir) else {
        return;
    };
    let Ok(entries) = rustix::fs::Dir::new(dup) else {
        return;
    };
    let names: Vec<std::ffi::CString> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    for child in names {
        if let Ok(child) = child.to_str() {
            remove_tree_at(&dir, child, depth + 1);
        } else {
            let _ = rustix::fs::unlinkat(&dir, child.as_c_str(), AtFlags::empty());
        }
    }
    let _ = rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR);
}

fn list_dir(
    dir: &OwnedFd,
    prefix: &str,
    depth: usize,
    max_entries: usize,
    seen: &mut usize,
    out: &mut Vec<WorkspaceEntry>,
) {
    let Ok(dup) = rustix::io::dup(dir) else {
        return;
    };
    let Ok(entries) = rustix::fs::Dir::new(dup) else {
        return;
    };
    for entry in entries {
        let Ok(entry) = entry else { return };
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        *seen += 1;
        if *seen > max_entries {
            return;
        }
        let path = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        };
        let Ok(st) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => out.push(WorkspaceEntry {
                path,
                bytes: st.st_size as u64,
            }),
            FileType::Directory if depth + 1 < WORKSPACE_MAX_DEPTH => {
                if let Ok(sub) = open_dir_at(dir, name) {
                    list_dir(&sub, &path, depth + 1, max_entries, seen, out);
                }
            }
            _ => {}
        }
    }
}

/// Hands a workspace to the job's host uid and gid: the root and everything below it,
/// never following a link. Called before a job of the session starts, while none runs.
pub fn chown_workspace(path: &Path, uid: u32, gid: u32) -> Result<(), HostError> {
    let root = open_root(path)?;
    let err = |source: std::io::Error| HostError::Workspace {
        op: "hand to the job's uid",
        path: path.to_owned(),
        source,
    };
    chown_tree_at(&root, uid, gid).map_err(|e| err(e.into()))
}

/// Hands the directory `root` and everything below it to `uid` and `gid`, never following
/// a link.
pub fn chown_tree_at(root: &OwnedFd, uid: u32, gid: u32) -> Result<(), Errno> {
    let owner = (
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    );
    rustix::fs::fchown(root, owner.0, owner.1)?;
    chown_below(root, owner, 0)
}

fn chown_below(
    dir: &OwnedFd,
    owner: (Option<rustix::fs::Uid>, Option<rustix::fs::Gid>),
    depth: usize,
) -> Result<(), Errno> {
    let entries = rustix::fs::Dir::new(rustix::io::dup(dir)?)?;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        rustix::fs::chownat(dir, name, owner.0, owner.1, AtFlags::SYMLINK_NOFOLLOW)?;
        if depth < WORKSPACE_MAX_DEPTH * 4
            && let Ok(sub) = rustix::fs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
        {
            chown_below(&sub, owner, depth + 1)?;
        }
    }
    Ok(())
}

/// The [`WorkspaceStat`] of `name` below `dir`, reported as `rel`.
fn stat_at(dir: &OwnedFd, name: &str, rel: &str) -> Result<WorkspaceStat, HostError> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => {
            return Err(HostError::WorkspaceMissing {
                path: rel.to_owned(),
            });
        }
        Err(e) => return Err(file_error(rel, format!("stat: {e}"), ErrorKind::Internal)),
    };
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => WorkspaceEntryKind::File,
        FileType::Directory => WorkspaceEntryKind::Directory,
        FileType::Symlink => WorkspaceEntryKind::Symlink,
        _ => WorkspaceEntryKind::Other,
    };
    let link_target = (kind == WorkspaceEntryKind::Symlink)
        .then(|| rustix::fs::readlinkat(dir, name, Vec::new()).ok())
        .flatten()
        .map(|t| t.to_string_lossy().into_owned());
    Ok(WorkspaceStat {
        path: rel.to_owned(),
        kind,
        bytes: st.st_size as u64,
        mode: st.st_mode & 0o7777,
        modified_s: st.st_mtime,
        link_target,
    })
}

fn list_entries(
    dir: &OwnedFd,
    prefix: &str,
    depth: usize,
    max_entries: usize,
    out: &mut Vec<WorkspaceStat>,
) {
    let Ok(dup) = rustix::io::dup(dir) else {
        return;
    };
    let Ok(entries) = rustix::fs::Dir::new(dup) else {
        return;
    };
    for entry in entries {
        let Ok(entry) = entry else { return };
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        if out.len() >= max_entries {
            return;
        }
        let path = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        };
        let Ok(stat) = stat_at(dir, name, &path) else {
            continue;
        };
        let is_dir = stat.kind == WorkspaceEntryKind::Directory;
        out.push(stat);
        if is_dir
            && depth > 1
            && let Ok(sub) = open_dir_at(dir, name)
        {
            list_entries(&sub, &path, depth - 1, max_entries, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn stat_list_make_dir_and_rename_stay_inside_and_never_follow_links() {
        // A tmpfs mount: root only (the CI runs as root).
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: mounting a workspace needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::create(tmp.path(), "ws", 1 << 20, 64).unwrap();
        assert!(ws.make_dir("a/b").unwrap());
        assert!(!ws.make_dir("a/b").unwrap());
        ws.write_file("a/f.bin", &[0, 255, 10]).unwrap();
        std::os::unix::fs::symlink("/etc", ws.path().join("a/out")).unwrap();
        let root = ws.stat("").unwrap().unwrap();
        assert_eq!(root.kind, WorkspaceEntryKind::Directory);
        let file = ws.stat("a/f.bin").unwrap().unwrap();
        assert_eq!((file.kind, file.bytes), (WorkspaceEntryKind::File, 3));
        let link = ws.stat("a/out").unwrap().unwrap();
        assert_eq!(link.kind, WorkspaceEntryKind::Symlink);
        assert_eq!(link.link_target.as_deref(), Some("/etc"));
        assert!(ws.stat("a/missing").unwrap().is_none());
        // Through the link is nowhere: the walk never follows it.
        assert!(ws.stat("a/out/passwd").is_err() || ws.stat("a/out/passwd").unwrap().is_none());
        assert!(ws.list_dir("a/out", 1, 10).unwrap().is_none());
        let listed: Vec<String> = ws
            .list_dir("", 2, 10)
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(listed, ["a", "a/b", "a/f.bin", "a/out"]);
        ws.rename("a/f.bin", "c/g.bin").unwrap();
        assert_eq!(ws.read_file("c/g.bin", 10).unwrap(), [0, 255, 10]);
        assert!(ws.rename("../x", "y").is_err());
        assert!(ws.make_dir("/etc/x").is_err());
        ws.destroy().unwrap();
    }

    /// The kernel's wake-up FIFO: what the job left at the name (a link to a host file
    /// here) is removed, never followed; the host's end never blocks, full or not.
    #[test]
    fn a_fifo_is_made_over_a_link_and_its_host_end_never_blocks() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: mounting a workspace needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, b"host file").unwrap();
        let ws = Workspace::create(tmp.path(), "ws", 1 << 20, 64).unwrap();
        ws.make_dir("ctl").unwrap();
        std::os::unix::fs::symlink(&outside, ws.path().join("ctl/wake")).unwrap();
        let fifo = ws.make_fifo("ctl/wake").unwrap();
        let st = rustix::fs::lstat(ws.path().join("ctl/wake")).unwrap();
        assert_eq!(FileType::from_raw_mode(st.st_mode), FileType::Fifo);
        assert_eq!(st.st_mode & 0o777, 0o600);
        // Nobody reads: the pipe fills and the next write says so at once.
        let chunk = [b'!'; 4096];
        let mut written = 0usize;
        loop {
            match rustix::io::write(&fifo, &chunk) {
                Ok(n) => written += n,
                Err(e) => {
                    assert_eq!(e, Errno::AGAIN);
                    break;
                }
            }
            assert!(written < 64 << 20, "a FIFO that never fills");
        }
        assert!(written >= 4096);
        assert_eq!(std::fs::read(&outside).unwrap(), b"host file");
        // Made again, it is a new FIFO, empty.
        let again = ws.make_fifo("ctl/wake").unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(rustix::io::read(&again, &mut buf), Err(Errno::AGAIN));
    }

    #[test]
    fn a_write_replaces_files_and_links_refuses_directories_and_leaves_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let root = open_root(tmp.path()).unwrap();
        let mode = Mode::from_raw_mode(0o644);
        write_file_at(&root, "a/b.txt", b"first", mode).unwrap();
        write_file_at(&root, "a/b.txt", b"second", mode).unwrap();
        assert_eq!(
            std::fs::read(tmp.path().join("a/b.txt")).unwrap(),
            b"second"
        );
        // A link at the name is replaced, never followed.
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, b"untouched").unwrap();
        std::os::unix::fs::symlink(&outside, tmp.path().join("a/link")).unwrap();
        write_file_at(&root, "a/link", b"mine", mode).unwrap();
        assert_eq!(std::fs::read(&outside).unwrap(), b"untouched");
        assert_eq!(std::fs::read(tmp.path().join("a/link")).unwrap(), b"mine");
        std::fs::create_dir(tmp.path().join("a/dir")).unwrap();
        let err = write_file_at(&root, "a/dir", b"x", mode).unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
        assert_eq!(names(&tmp.path().join("a")), ["b.txt", "dir", "link"]);
    }

    fn write(path: &Path, content: &[u8]) {
        std::fs::write(path, content).unwrap();
    }

    /// A job swaps a link in for a directory on the path, and for the file itself, as
    /// fast as it can while the host reads: the host never reads what the link points at.
    #[test]
    fn a_link_swapped_in_while_the_host_reads_is_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("work");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(work.join("d")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        write(&outside.join("f"), b"HOST SECRET");
        write(&work.join("d/f"), b"job's own");
        write(&work.join("g"), b"job's own");
        let root = open_root(&work).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let racer = {
            let (work, outside, stop) = (work.clone(), outside.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut swaps = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // The directory becomes a link to the host's, then a directory again.
                    let _ = std::fs::rename(work.join("d"), work.join("d.real"));
                    let _ = std::os::unix::fs::symlink(&outside, work.join("d"));
                    let _ = std::fs::remove_file(work.join("d"));
                    let _ = std::fs::rename(work.join("d.real"), work.join("d"));
                    // The file becomes a link to the host's file, then a file again.
                    let _ = std::fs::rename(work.join("g"), work.join("g.real"));
                    let _ = std::os::unix::fs::symlink(outside.join("f"), work.join("g"));
                    let _ = std::fs::remove_file(work.join("g"));
                    let _ = std::fs::rename(work.join("g.real"), work.join("g"));
                    swaps += 1;
                }
                swaps
            })
        };
        let (mut read, mut refused) = (0u32, 0u32);
        // At least 20,000 reads, and on until both outcomes happened (the racer's thread
        // may get no CPU at first on a busy machine); the bound only stops a racer that
        // never runs.
        let mut i = 0u32;
        while i < 20_000 || read == 0 || refused == 0 {
            assert!(
                i < 2_000_000,
                "the race never happened: {read} read, {refused} refused"
            );
            i += 1;
            let rel = if i.is_multiple_of(2) { "d/f" } else { "g" };
            match read_file_at(&root, rel, 1024) {
                Ok(content) => {
                    assert_eq!(content, b"job's own", "read through a link");
                    read += 1;
                }
                Err(_) => refused += 1,
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let swaps = racer.join().unwrap();
        // Both outcomes happened: the race was real, and the host still read files.
        assert!(
            swaps > 0 && read > 0 && refused > 0,
            "{swaps} {read} {refused}"
        );
    }

    #[test]
    fn a_fifo_or_a_device_is_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let root = open_root(tmp.path()).unwrap();
        rustix::fs::mknodat(&root, "fifo", FileType::Fifo, Mode::from_raw_mode(0o666), 0).unwrap();
        // A FIFO with no writer blocks a plain open forever; here it is "no such file".
        let err = read_file_at(&root, "fifo", 1024).unwrap_err();
        assert!(matches!(err, HostError::WorkspaceMissing { .. }), "{err}");
        if rustix::process::geteuid().is_root() {
            // /dev/zero would never end a read; a job on a nodev tmpfs cannot make one,
            // and the host would not read one if it could.
            rustix::fs::mknodat(
                &root,
                "zero",
                FileType::CharacterDevice,
                Mode::from_raw_mode(0o666),
                rustix::fs::makedev(1, 5),
            )
            .unwrap();
            let err = read_file_at(&root, "zero", 1024).unwrap_err();
            assert!(matches!(err, HostError::WorkspaceMissing { .. }), "{err}");
        } else {
            eprintln!("the device case skipped: mknod of a device needs root");
        }
    }

    /// A file a job keeps appending to while the host reads: the read ends at the cap
    /// (refused), never reading on without bound.
    #[test]
    fn a_file_growing_while_read_is_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let root = open_root(tmp.path()).unwrap();
        let path = tmp.path().join("grows");
        write(&path, b"");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut file = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap();
                let chunk = [b'a'; 4096];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    file.write_all(&chunk).unwrap();
                    // Kept at a size that fits a test machine's tmp.
                    if file.metadata().unwrap().len() > 64 << 20 {
                        file.set_len(0).unwrap();
                    }
                }
            })
        };
        let cap = 64 * 1024;
        let mut over = 0;
        let mut reads = 0u32;
        // At least 2,000 reads, and on until the file outgrew the cap under one (the
        // writer may get no CPU at first on a busy machine).
        while reads < 2_000 || over == 0 {
            assert!(
                reads < 2_000_000,
                "the file never outgrew the cap while read"
            );
            reads += 1;
            match read_file_at(&root, "grows", cap) {
                Ok(content) => assert!(content.len() as u64 <= cap, "{}", content.len()),
                Err(e) => {
                    assert!(e.to_string().contains("cap"), "{e}");
                    over += 1;
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
    }

    /// Another filesystem mounted inside a workspace (which a job cannot do, but the
    /// read does not rely on it) is not read through; a hard link inside is.
    #[test]
    fn a_read_stays_on_the_workspaces_own_mount_and_hard_links_inside_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        let root = open_root(tmp.path()).unwrap();
        write(&tmp.path().join("own"), b"own");
        std::fs::hard_link(tmp.path().join("own"), tmp.path().join("second")).unwrap();
        assert_eq!(read_file_at(&root, "second", 16).unwrap(), b"own");
        if !rustix::process::geteuid().is_root() {
            eprintln!("the mount case skipped: mounting needs root");
            return;
        }
        let host = tempfile::tempdir().unwrap();
        write(&host.path().join("f"), b"HOST SECRET");
        let inside = tmp.path().join("mnt");
        std::fs::create_dir(&inside).unwrap();
        rustix::mount::mount_bind(host.path(), &inside).unwrap();
        let result = read_file_at(&root, "mnt/f", 64);
        rustix::mount::unmount(&inside, rustix::mount::UnmountFlags::DETACH).unwrap();
        let err = result.unwrap_err();
        assert!(err.to_string().contains("filesystem"), "{err}");
    }

    #[test]
    fn a_reader_never_sees_a_file_half_written() {
        // The session kernel polls for its next call's order file and reads it as soon as
        // it exists: a file seen before its content was written killed the kernel.
        let tmp = tempfile::tempdir().unwrap();
        let root = open_root(tmp.path()).unwrap();
        let content = vec![b'x'; 256 * 1024];
        let path = tmp.path().join("order");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let reader = {
            let (path, stop, seen, len) = (path.clone(), stop.clone(), seen.clone(), content.len());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match std::fs::read(&path) {
                        Ok(bytes) => {
                            assert_eq!(bytes.len(), len, "read a file half written");
                            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
                    }
                }
            })
        };
        // Writes go on until the reader has read the file a number of times (on a busy
        // machine its thread may get no CPU for the first hundreds of writes), at least
        // 300 of them; the bound only stops a reader that never runs.
        let mut writes = 0u32;
        while writes < 300 || seen.load(std::sync::atomic::Ordering::Relaxed) < 50 {
            write_file_at(&root, "order", &content, Mode::from_raw_mode(0o644)).unwrap();
            writes += 1;
            assert!(writes < 1_000_000, "the reader never read the file");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        reader.join().unwrap();
    }
}
