//! The per-job directory on the host: `<runtime>/<job id>/` with `root/` (the mount point
//! of the new root's tmpfs, inside the job's mount namespace only) and the job's `/work`:
//! a directory `work/` bound by path, or a tmpfs of its own mounted nowhere on the host
//! ([`WorkBacking`]). Removed after the job.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use airlock_core::JobSpec;
use airlock_core::policy::WorkdirMode;

use crate::error::HostError;
use crate::ids::IdMapping;

/// Where job directories live, checked to be owned by us and not writable by others.
#[derive(Debug, Clone)]
pub struct RuntimeDir {
    path: PathBuf,
}

impl RuntimeDir {
    /// The default: `/run/airlock` as root; otherwise `$XDG_RUNTIME_DIR/airlock`, else
    /// `<tmp>/airlock-<uid>`.
    pub fn default_path() -> PathBuf {
        let euid = rustix::process::geteuid();
        if euid.is_root() {
            return PathBuf::from("/run/airlock");
        }
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("airlock"),
            _ => std::env::temp_dir().join(format!("airlock-{}", euid.as_raw())),
        }
    }

    /// Opens (creating if needed) the runtime directory. Mode 0711: the sandbox init, an
    /// unprivileged uid when airlock is root, must traverse it to reach its own job dir.
    pub fn open(path: &Path) -> Result<Self, HostError> {
        let bad = |reason: String| HostError::RuntimeDir {
            path: path.to_owned(),
            reason,
        };
        match fs::DirBuilder::new().mode(0o711).create(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(bad(e.to_string())),
        }
        let meta = fs::symlink_metadata(path).map_err(|e| bad(e.to_string()))?;
        if !meta.is_dir() {
            return Err(bad("is not a directory (a symlink?)".into()));
        }
        if meta.uid() != rustix::process::geteuid().as_raw() {
            return Err(bad(format!(
                "is owned by uid {}, not by airlock",
                meta.uid()
            )));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(bad(format!(
                "is writable by others (mode {:o})",
                meta.mode() & 0o7777
            )));
        }
        Ok(Self {
            path: path.to_owned(),
        })
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the runtime directory's sweep lock, waiting for a sweep another airlock is
    /// doing to finish. Sweepers hold it while they decide what is stale and remove it:
    /// deciding takes each job's lock for a moment, so without it a sweeper probing at the
    /// same time as another would see the job as live and return before the other's
    /// removal is done, and its caller would find the leftovers still there. Blocks; call
    /// it off an async runtime's worker threads.
    pub fn lock_for_sweep(&self) -> io::Result<SweepLock> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.path.join(SWEEP_LOCK_FILE))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
        Ok(SweepLock { _file: file })
    }

    /// Job directories whose supervisor is gone: their lock can be taken, or they have no
    /// lock file and are older than [`UNLOCKED_GRACE`].
    pub fn stale_jobs(&self) -> io::Result<Vec<String>> {
        let mut stale = Vec::new();
        for name in self.job_dirs()? {
            let dir = self.path.join(&name);
            let lock = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(dir.join(LOCK_FILE));
            let is_stale = match lock {
                Ok(file) => {
                    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                        .is_ok()
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs::symlink_metadata(&dir)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > UNLOCKED_GRACE)),
                Err(_) => false,
            };
            if is_stale {
                stale.push(name);
            }
        }
        Ok(stale)
    }

    /// Removes a stale job's directory.
    pub fn remove_job_dir(&self, name: &str) -> io::Result<()> {
        if name.contains('/') || name == "." || name == ".." {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        fs::remove_dir_all(self.path.join(name))
    }

    /// Names of job directories present (for leak checks and stale cleanup).
    pub fn job_dirs(&self) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = fs::read_dir(&self.path)?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            // Job ids never start with a dot; the runtime directory's own files do.
            .filter(|name| !name.starts_with('.'))
            .collect();
        names.sort();
        Ok(names)
    }
}

/// The file in each job directory that the supervisor keeps locked for the job's life.
pub const LOCK_FILE: &str = "lock";

/// The runtime directory's sweep lock (see [`RuntimeDir::lock_for_sweep`]).
const SWEEP_LOCK_FILE: &str = ".sweep.lock";

/// Held while a sweep runs; released when dropped.
#[derive(Debug)]
pub struct SweepLock {
    _file: fs::File,
}

/// The job's CA bundle's file name in its job directory.
pub const TRUST_BUNDLE_FILE: &str = "trust-bundle.pem";

/// A job directory without a lock file younger than this may still be under construction.
pub const UNLOCKED_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// Where a job directory keeps the job's `/work`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkBacking {
    /// A directory `work/` of the job directory, bound at `/work` by its path: what a
    /// container engine binds, and what a session's workspace link replaces. The job's
    /// mount table shows that host path as the mount's root.
    Directory,
    /// A tmpfs of its own (`size_bytes` at most), created detached (`fsopen`, `fsmount`)
    /// and so mounted nowhere on the host: the host writes the job's files through its
    /// descriptor and the sandbox attaches it at `/work`, so the job's mount table shows
    /// the root of a filesystem of its own, no host path. It needs CAP_SYS_ADMIN on the
    /// host (root mode); where the kernel refuses it, the job directory falls back to
    /// [`WorkBacking::Directory`].
    DetachedTmpfs {
        /// The tmpfs's size cap.
        size_bytes: u64,
    },
}

/// One job's directory. Removed on drop.
#[derive(Debug)]
pub struct JobDir {
    path: PathBuf,
    removed: bool,
    /// The detached tmpfs of `/work` ([`WorkBacking::DetachedTmpfs`]), kept open: the
    /// host writes a warm sandbox's job into it after the sandbox has attached it.
    work_mount: Option<OwnedFd>,
    /// Held (flock) while the job lives: a directory whose lock can be taken belongs to a
    /// supervisor that died, and is swept by the next one.
    _lock: std::os::fd::OwnedFd,
}

impl JobDir {
    /// Creates the directory, writes the source and the input files into the job's
    /// `/work`. A session's job always has a [`WorkBacking::Directory`]: its `work` becomes
    /// a link to the session's workspace.
    pub fn create(
        runtime: &RuntimeDir,
        job: &JobSpec,
        ids: &IdMapping,
        backing: WorkBacking,
    ) -> Result<Self, HostError> {
        let backing = if job.workspace.is_some() {
            WorkBacking::Directory
        } else {
            backing
        };
        let dir = Self::create_empty(runtime, job.id.as_str(), ids, backing)?;
        dir.write_job(job, ids)?;
        Ok(dir)
    }

    /// Creates the directory `<runtime>/<name>` with an empty `/work` (a warm sandbox's,
    /// whose job comes later).
    pub fn create_empty(
        runtime: &RuntimeDir,
        name: &str,
        ids: &IdMapping,
        backing: WorkBacking,
    ) -> Result<Self, HostError> {
        let path = runtime.path().join(name);
        let create_err = |source: io::Error| HostError::CreateJobDir {
            path: path.clone(),
            source,
        };
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(create_err)?;
        // Locked under a temporary name, then renamed: a sweep by another airlock never
        // sees the lock file unlocked.
        let unlocked = path.join(".lock-new");
        let lock = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&unlocked)
            .map_err(create_err)?;
        let lock = std::os::fd::OwnedFd::from(lock);
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| create_err(e.into()))?;
        fs::rename(&unlocked, path.join(LOCK_FILE)).map_err(create_err)?;
        let mut dir = Self {
            path: path.clone(),
            removed: false,
            work_mount: None,
            _lock: lock,
        };
        // The sandbox init runs as the namespace's root, an unprivileged host uid: it
        // must own the job directory to reach `work/` and `root/` under mode 0700.
        if let Some(owner) = ids.sandbox_root_host_uid() {
            rustix::fs::chown(
                &path,
                Some(rustix::fs::Uid::from_raw(owner)),
                Some(rustix::fs::Gid::from_raw(owner)),
            )
            .map_err(|e| create_err(e.into()))?;
        }
        fs::DirBuilder::new()
            .mode(0o755)
            .create(path.join("root"))
            .map_err(create_err)?;
        if let WorkBacking::DetachedTmpfs { size_bytes } = backing {
            match detached_tmpfs(size_bytes) {
                Ok(mount) => dir.work_mount = Some(mount),
                Err(e) => tracing::debug!(
                    error = %e,
                    "no detached tmpfs for /work here; it is a directory bound by path"
                ),
            }
        }
        if dir.work_mount.is_none() {
            fs::DirBuilder::new()
                .mode(0o755)
                .create(path.join("work"))
                .map_err(create_err)?;
        }
        Ok(dir)
    }

    /// Writes the job's source and input files into `work/` (new files only, never through
    /// a link), and hands `work/` to the job's uid when the policy makes it writable.
    pub fn write_job(&self, job: &JobSpec, ids: &IdMapping) -> Result<(), HostError> {
        if let Some(workspace) = &job.workspace {
            return self.write_session_job(job, workspace, ids);
        }
        if let Some(mount) = &self.work_mount {
            return self.write_job_at(mount, job, ids);
        }
        let work = self.work();
        write_new_file(&work.join(&job.source_file), &job.source, false)?;
        for file in &job.files {
            let target = work.join(&file.path);
            if let Some(parent) = target.parent() {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(parent)
                    .map_err(|source| HostError::WriteInput {
                        path: parent.to_owned(),
                        source,
                    })?;
            }
            write_new_file(&target, &file.content, file.executable)?;
        }
        if job.filesystem.workdir == WorkdirMode::Rw {
            chown_tree(&work, ids.job_host_uid(), ids.job_host_gid()).map_err(|source| {
                HostError::WriteInput {
                    path: work.clone(),
                    source,
                }
            })?;
        }
        Ok(())
    }

    /// [`JobDir::write_job`] into the detached tmpfs of `/work`, through its descriptor.
    fn write_job_at(
        &self,
        mount: &OwnedFd,
        job: &JobSpec,
        ids: &IdMapping,
    ) -> Result<(), HostError> {
        let err = |source: io::Error| HostError::WriteInput {
            path: self.work(),
            source,
        };
        let root = rustix::fs::openat(
            mount,
            ".",
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| err(e.into()))?;
        let in_work = |rel: &str| self.work().join(rel);
        write_new_file_at(&root, Path::new(&job.source_file), &job.source, false).map_err(
            |source| HostError::WriteInput {
                path: in_work(&job.source_file),
                source,
            },
        )?;
        for file in &job.files {
            write_new_file_at(&root, Path::new(&file.path), &file.content, file.executable)
                .map_err(|source| HostError::WriteInput {
                    path: in_work(&file.path),
                    source,
                })?;
        }
        if job.filesystem.workdir == WorkdirMode::Rw {
            crate::workspace::chown_tree_at(&root, ids.job_host_uid(), ids.job_host_gid())
                .map_err(|e| err(e.into()))?;
        }
        Ok(())
    }

    /// A session's job: `work` becomes a link to the session's workspace (so the backend
    /// binds the workspace at `/work`, and what the job leaves there stays), the source
    /// and input files are written into the workspace replacing what sits at their names,
    /// and the workspace is handed to the job's uid. The link is the host's own, in a
    /// directory no job sees; the workspace is walked without following the job's links.
    fn write_session_job(
        &self,
        job: &JobSpec,
        workspace: &Path,
        ids: &IdMapping,
    ) -> Result<(), HostError> {
        let work = self.work();
        let link_err = |source: io::Error| HostError::WriteInput {
            path: work.clone(),
            source,
        };
        fs::remove_dir(&work).map_err(link_err)?;
        std::os::unix::fs::symlink(workspace, &work).map_err(link_err)?;
        let root = crate::workspace::open_root(workspace)?;
        let file_mode = |executable: bool| {
            rustix::fs::Mode::from_raw_mode(if executable { 0o755 } else { 0o644 })
        };
        crate::workspace::write_file_at(&root, &job.source_file, &job.source, file_mode(false))?;
        for file in &job.files {
            crate::workspace::write_file_at(
                &root,
                &file.path,
                &file.content,
                file_mode(file.executable),
            )?;
        }
        crate::workspace::chown_workspace(workspace, ids.job_host_uid(), ids.job_host_gid())?;
        // The session's /tmp, when it keeps one, is the job's as its /work is.
        if let Some(tmp) = &job.session_tmp {
            crate::workspace::chown_workspace(tmp, ids.job_host_uid(), ids.job_host_gid())?;
        }
        Ok(())
    }

    /// Writes the job's CA bundle (public certificates only) as `trust-bundle.pem` in the
    /// job directory, readable by all, and returns its path: the backend binds it over
    /// [`airlock_core::job::TRUST_BUNDLE_PATH`] in the sandbox. Removed with the directory.
    pub fn write_trust_bundle(&self, pem: &str) -> Result<PathBuf, HostError> {
        let path = self.path.join(TRUST_BUNDLE_FILE);
        let write_err = |source: io::Error| HostError::WriteInput {
            path: path.clone(),
            source,
        };
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(write_err)?;
        file.write_all(pem.as_bytes()).map_err(write_err)?;
        // The umask must not narrow it: the job's uid reads it.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).map_err(write_err)?;
        Ok(path)
    }

    /// The directory bound at `/work` when it is a [`WorkBacking::Directory`] (also the
    /// name errors about `/work` show).
    pub fn work(&self) -> PathBuf {
        self.path.join("work")
    }

    /// The detached tmpfs of `/work`, when the job directory has one
    /// ([`WorkBacking::DetachedTmpfs`]): the sandbox attaches it.
    pub fn work_mount(&self) -> Option<BorrowedFd<'_>> {
        self.work_mount.as_ref().map(AsFd::as_fd)
    }

    /// The mount point of the new root.
    pub fn root(&self) -> PathBuf {
        self.path.join("root")
    }

    /// Releases the lock and leaves the directory, as a supervisor killed mid-job does.
    #[cfg(test)]
    fn abandon(mut self) {
        self.removed = true;
    }

    /// Removes the directory and everything in it.
    pub fn remove(mut self) -> io::Result<()> {
        self.removed = true;
        fs::remove_dir_all(&self.path)
    }
}

impl Drop for JobDir {
    fn drop(&mut self) {
        if !self.removed
            && let Err(e) = fs::remove_dir_all(&self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove job directory");
        }
    }
}

/// A tmpfs mounted nowhere: `fsopen`, then `fsmount`, whose descriptor is the only way to
/// it until a sandbox attaches it.
fn detached_tmpfs(size_bytes: u64) -> io::Result<OwnedFd> {
    use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags};
    let context = rustix::mount::fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)?;
    rustix::mount::fsconfig_set_string(&context, "size", size_bytes.to_string().as_str())?;
    rustix::mount::fsconfig_set_string(&context, "mode", "0755")?;
    // What a job's mount table shows as its source (the new root is `airlock`).
    rustix::mount::fsconfig_set_string(&context, "source", "airlock-work")?;
    rustix::mount::fsconfig_create(&context)?;
    Ok(rustix::mount::fsmount(
        &context,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )?)
}

/// Writes a new file at `rel` below `root`, making its directories; never through a link,
/// never over an existing file (as [`write_new_file`]).
fn write_new_file_at(
    root: &OwnedFd,
    rel: &Path,
    content: &[u8],
    executable: bool,
) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    let components: Vec<&std::ffi::OsStr> = rel.iter().collect();
    let Some((name, parents)) = components.split_last() else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    let directory = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = rustix::io::dup(root)?;
    for part in parents {
        match rustix::fs::mkdirat(&dir, *part, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        dir = rustix::fs::openat(&dir, *part, directory, Mode::empty())?;
    }
    let file = rustix::fs::openat(
        &dir,
        *name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(if executable { 0o755 } else { 0o644 }),
    )?;
    fs::File::from(file).write_all(content)
}

fn write_new_file(path: &Path, content: &[u8], executable: bool) -> Result<(), HostError> {
    let write_err = |source: io::Error| HostError::WriteInput {
        path: path.to_owned(),
        source,
    };
    // create_new + O_NOFOLLOW: never write through a link, never overwrite.
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(if executable { 0o755 } else { 0o644 })
        .open(path)
        .map_err(write_err)?;
    file.write_all(content).map_err(write_err)?;
    Ok(())
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let owner = Some(rustix::fs::Uid::from_raw(uid));
    let group = Some(rustix::fs::Gid::from_raw(gid));
    rustix::fs::chownat(
        rustix::fs::CWD,
        path,
        owner,
        group,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    if fs::symlink_metadata(path)?.is_dir() {
        for entry in fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        airlock_core::JobRequest {
            language: "sh".into(),
            source: b"true".to_vec(),
            ..Default::default()
        }
        .resolve(&airlock_core::Policy::builtin())
        .unwrap()
    }

    #[test]
    fn a_live_job_is_never_stale_and_an_abandoned_one_is() {
        let tmp = tempfile::tempdir().unwrap();
        let runtime = RuntimeDir::open(&tmp.path().join("rt")).unwrap();
        let ids = IdMapping::Rootless {
            host_uid: rustix::process::geteuid().as_raw(),
            host_gid: rustix::process::getegid().as_raw(),
        };
        let live = JobDir::create(&runtime, &spec(), &ids, WorkBacking::Directory).unwrap();
        let dead_job = spec();
        let dead = JobDir::create(&runtime, &dead_job, &ids, WorkBacking::Directory).unwrap();
        assert_eq!(runtime.stale_jobs().unwrap(), Vec::<String>::new());
        // What a killed supervisor leaves: the directory, its lock released.
        dead.abandon();
        assert_eq!(runtime.stale_jobs().unwrap(), vec![dead_job.id.to_string()]);
        runtime.remove_job_dir(dead_job.id.as_str()).unwrap();
        assert_eq!(runtime.job_dirs().unwrap().len(), 1);
        drop(live);
        assert_eq!(runtime.job_dirs().unwrap(), Vec::<String>::new());
    }

    #[test]
    fn the_source_and_files_are_written_without_following_links() {
        let tmp = tempfile::tempdir().unwrap();
        let runtime = RuntimeDir::open(&tmp.path().join("rt")).unwrap();
        let ids = IdMapping::Rootless {
            host_uid: rustix::process::geteuid().as_raw(),
            host_gid: rustix::process::getegid().as_raw(),
        };
        let mut job = spec();
        job.files = vec![airlock_core::job::JobFile {
            path: "d/e/f.txt".into(),
            content: b"hi".to_vec(),
            executable: true,
        }];
        let dir = JobDir::create(&runtime, &job, &ids, WorkBacking::Directory).unwrap();
        let f = dir.work().join("d/e/f.txt");
        assert_eq!(fs::read(&f).unwrap(), b"hi");
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o777, 0o755);
        assert_eq!(
            fs::read(dir.work().join(".airlock-main.sh")).unwrap(),
            b"true"
        );
        let path = dir.work().parent().unwrap().to_owned();
        drop(dir);
        assert!(!path.exists());
    }
    /// A detached `/work` holds the job's files, reached only through its descriptor: the
    /// job directory has no `work/`, and nothing of it is in the host's mount table.
    #[test]
    fn a_detached_work_tmpfs_holds_the_files_and_is_mounted_nowhere() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: a detached tmpfs needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let runtime = RuntimeDir::open(&tmp.path().join("rt")).unwrap();
        let ids = IdMapping::Root {
            host_base: 1_000_000,
        };
        let mut job = spec();
        job.files = vec![airlock_core::job::JobFile {
            path: "d/e/f.txt".into(),
            content: b"hi".to_vec(),
            executable: true,
        }];
        let dir = JobDir::create(
            &runtime,
            &job,
            &ids,
            WorkBacking::DetachedTmpfs {
                size_bytes: 1 << 20,
            },
        )
        .unwrap();
        let mount = dir.work_mount().expect("root has a detached tmpfs");
        assert!(!dir.work().exists(), "no work/ directory beside it");
        let read = |rel: &str| {
            let fd = rustix::fs::openat(
                mount,
                rel,
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
            let meta = rustix::fs::fstat(&fd).unwrap();
            let mut content = Vec::new();
            io::Read::read_to_end(&mut fs::File::from(fd), &mut content).unwrap();
            (content, meta.st_mode & 0o777)
        };
        assert_eq!(read("d/e/f.txt"), (b"hi".to_vec(), 0o755));
        assert_eq!(read(".airlock-main.sh").0, b"true");
        let statfs = rustix::fs::fstatfs(mount).unwrap();
        assert_eq!(statfs.f_type, libc::TMPFS_MAGIC);
        // Nowhere in the host's mount table: no tmpfs of its source, nothing under the job
        // directory. (Not the whole table compared before and after: tests running beside
        // this one mount and unmount in the host's namespace.)
        let job_dir = dir.work().parent().unwrap().display().to_string();
        let host_table = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let shown: Vec<&str> = host_table
            .lines()
            .filter(|line| line.contains(" airlock-work ") || line.contains(&job_dir))
            .collect();
        assert_eq!(shown, Vec::<&str>::new(), "in the host's mount table");
        drop(dir);
        assert_eq!(runtime.job_dirs().unwrap(), Vec::<String>::new());
    }

    #[test]
    fn one_sweep_at_a_time_and_its_lock_is_not_a_job() {
        let tmp = tempfile::tempdir().unwrap();
        let runtime = RuntimeDir::open(&tmp.path().join("rt")).unwrap();
        let first = runtime.lock_for_sweep().unwrap();
        assert_eq!(runtime.job_dirs().unwrap(), Vec::<String>::new());
        let (tx, rx) = std::sync::mpsc::channel();
        let second = {
            let runtime = runtime.clone();
            std::thread::spawn(move || {
                let lock = runtime.lock_for_sweep().unwrap();
                tx.send(()).unwrap();
                drop(lock);
            })
        };
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "a second sweeper went ahead while the first held the lock"
        );
        drop(first);
        rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        second.join().unwrap();
    }
}
