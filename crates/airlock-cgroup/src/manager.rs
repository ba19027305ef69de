//! The version-independent surface: the parent of the job groups and one group per job.

use std::io;
use std::path::{Component, Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use crate::hierarchy::{V1_CONTROLLERS, V2_CONTROLLERS};
use crate::{
    CgroupError, CgroupVersion, DROP_WAIT_MS, Hierarchy, JobLimits, JobStats, MAX_JOB_NAME_CHARS,
    ParentSpec, REMOVE_WAIT_MS, WAIT_POLL_INTERVAL_MS, fs, kill, v1, v2,
};

/// Which hierarchy a directory is in, to find its line in `/proc/<pid>/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HierarchyKey {
    /// A v1 hierarchy, named by one controller it carries.
    V1(&'static str),
    /// The unified hierarchy (the `0::` line).
    Unified,
}

/// A cgroup directory together with what identifies it to the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupDir {
    /// The mount point of its hierarchy.
    pub mount_point: PathBuf,
    /// The directory on the mounted cgroupfs.
    pub dir: PathBuf,
    /// The path `/proc/<pid>/cgroup` shows for members of this group.
    pub hierarchy_path: String,
    /// Which hierarchy.
    pub key: HierarchyKey,
    /// The needed controllers this directory serves.
    pub controllers: Vec<&'static str>,
}

impl GroupDir {
    /// The group `dir` on a mount of hierarchy path `mount_root` at `mount_point`.
    pub(crate) fn new(
        mount_point: &Path,
        mount_root: &str,
        dir: PathBuf,
        key: HierarchyKey,
        controllers: Vec<&'static str>,
    ) -> Self {
        let rel = dir
            .strip_prefix(mount_point)
            .map(|r| r.to_string_lossy().into_owned())
            .unwrap_or_default();
        let hierarchy_path = match (mount_root.trim_end_matches('/'), rel.as_str()) {
            ("", "") => "/".to_owned(),
            (root, "") => root.to_owned(),
            (root, rel) => format!("{root}/{rel}"),
        };
        Self {
            mount_point: mount_point.to_path_buf(),
            dir,
            hierarchy_path,
            key,
            controllers,
        }
    }

    fn child(&self, name: &str) -> Self {
        Self {
            mount_point: self.mount_point.clone(),
            dir: self.dir.join(name),
            hierarchy_path: format!("{}/{name}", self.hierarchy_path.trim_end_matches('/')),
            key: self.key.clone(),
            controllers: self.controllers.clone(),
        }
    }

    pub(crate) fn serves(&self, controller: &str) -> bool {
        self.controllers.contains(&controller)
    }

    fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    fn join_file(&self) -> PathBuf {
        match self.key {
            HierarchyKey::V1(_) => self.dir.join("tasks"),
            HierarchyKey::Unified => self.procs_file(),
        }
    }
}

/// Turns a [`ParentSpec::Path`] into a plain relative path (no `..`, not empty).
pub(crate) fn relative_parent(path: &Path) -> Result<PathBuf, CgroupError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(CgroupError::InvalidParent {
                    path: path.to_path_buf(),
                    reason: "must not contain `..`",
                });
            }
        }
    }
    if out.as_os_str().is_empty() {
        return Err(CgroupError::InvalidParent {
            path: path.to_path_buf(),
            reason: "must name a directory below the mount root",
        });
    }
    Ok(out)
}

/// Checks a job group name: `[A-Za-z0-9_-]`, 1 to [`MAX_JOB_NAME_CHARS`] characters.
pub(crate) fn validate_name(name: &str) -> Result<(), CgroupError> {
    let reason = if name.is_empty() {
        Some("must not be empty")
    } else if name.len() > MAX_JOB_NAME_CHARS {
        Some("longer than 64 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        Some("only A-Z, a-z, 0-9, `_` and `-` are allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(CgroupError::InvalidName {
            name: fs::shorten(name),
            reason,
        }),
        None => Ok(()),
    }
}

/// The prepared parent of the job groups: one directory per v1 hierarchy used, or one v2
/// directory with memory, pids and cpu enabled for its children.
#[derive(Debug)]
pub struct CgroupManager {
    version: CgroupVersion,
    parents: Vec<GroupDir>,
    created: Vec<PathBuf>,
    swap_accounting: bool,
    tcp_accounting: bool,
}

impl CgroupManager {
    /// Resolves the parent, creates it (`mkdir -p`) and, on v2, enables the controllers from
    /// the mount root down (and moves this process into `<own>/supervisor` for
    /// [`ParentSpec::Auto`] in a delegated cgroup). Fails when a needed controller is missing.
    pub fn new(h: Hierarchy, parent: ParentSpec) -> Result<Self, CgroupError> {
        require_controllers(&h)?;
        let version = h.version();
        let mut created = Vec::new();
        let parents = match version {
            CgroupVersion::V1 => {
                let parents = v1::plan_parents(&h, &parent)?;
                for p in &parents {
                    fs::create_dir_chain(&p.mount_point, &p.dir, &mut created, |_| Ok(()))?;
                }
                parents
            }
            CgroupVersion::V2 => {
                let plan = v2::plan_parent(&h, &parent, std::process::id())?;
                v2::apply_plan(&plan, &mut created)?;
                vec![plan.parent]
            }
        };
        let swap_accounting = match version {
            CgroupVersion::V1 => parents
                .iter()
                .any(|p| p.serves("memory") && p.dir.join(v1::MEMSW_LIMIT).exists()),
            CgroupVersion::V2 => parents.iter().any(|p| p.dir.join(v2::SWAP_MAX).exists()),
        };
        let tcp_accounting = match version {
            CgroupVersion::V1 => parents
                .iter()
                .any(|p| p.serves("memory") && p.dir.join(v1::TCP_LIMIT).exists()),
            CgroupVersion::V2 => !v2::socket_accounting_disabled(
                &std::fs::read_to_string("/proc/cmdline").unwrap_or_default(),
            ),
        };
        if !swap_accounting {
            tracing::warn!(
                version = ?version,
                "no swap accounting: jobs get swappiness 0 (v1) but swap use is not capped"
            );
        }
        Ok(Self {
            version,
            parents,
            created,
            swap_accounting,
            tcp_accounting,
        })
    }

    /// The interface the job groups use.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The parent directories of the job groups (one per v1 hierarchy used; one on v2).
    pub fn parent_paths(&self) -> Vec<PathBuf> {
        self.parents.iter().map(|p| p.dir.clone()).collect()
    }

    /// Whether swap can be capped at zero (`memory.memsw.*` on v1, `memory.swap.max` on v2).
    pub fn swap_accounting(&self) -> bool {
        self.swap_accounting
    }

    /// Whether the job's TCP socket buffers count against its memory limit: on v1 through
    /// `memory.kmem.tcp.limit_in_bytes`, set to the memory limit; on v2 socket memory is part
    /// of `memory.current` unless the kernel was booted with `cgroup.memory=nosocket`.
    pub fn tcp_accounting(&self) -> bool {
        self.tcp_accounting
    }

    /// Creates the group `name` under every parent and writes the limits. On error, whatever
    /// was created is removed again.
    pub fn create_job(&self, name: &str, limits: &JobLimits) -> Result<JobCgroup, CgroupError> {
        validate_name(name)?;
        limits.validate()?;
        let mut job = JobCgroup {
            name: name.to_owned(),
            version: self.version,
            dirs: Vec::with_capacity(self.parents.len()),
            removed: false,
        };
        for parent in &self.parents {
            let dir = parent.child(name);
            match std::fs::create_dir(&dir.dir) {
                Ok(()) => job.dirs.push(dir),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(CgroupError::AlreadyExists { path: dir.dir });
                }
                Err(source) => {
                    return Err(CgroupError::CreateDir {
                        path: dir.dir,
                        source,
                    });
                }
            }
        }
        match self.version {
            CgroupVersion::V1 => {
                v1::write_limits(&job.dirs, limits, self.swap_accounting, self.tcp_accounting)?
            }
            CgroupVersion::V2 => {
                for dir in &job.dirs {
                    v2::write_limits(&dir.dir, limits, self.swap_accounting)?;
                }
            }
        }
        tracing::debug!(job = name, "created job cgroup");
        Ok(job)
    }

    /// The directories of the group `name` that exist, one per parent at most.
    fn existing_dirs(&self, name: &str) -> Result<Vec<GroupDir>, CgroupError> {
        validate_name(name)?;
        Ok(self
            .parents
            .iter()
            .map(|parent| parent.child(name))
            .filter(|dir| dir.dir.is_dir())
            .collect())
    }

    /// Kills and removes the group `name` left behind by a job whose supervisor died. The
    /// caller decides the job is stale (airlock-native holds a lock per live job); groups
    /// missing under some parents are skipped.
    pub fn remove_stale_job(&self, name: &str) -> Result<(), CgroupError> {
        let dirs = self.existing_dirs(name)?;
        if dirs.is_empty() {
            return Ok(());
        }
        let job = JobCgroup {
            name: name.to_owned(),
            version: self.version,
            dirs,
            removed: false,
        };
        tracing::info!(job = name, "removing the cgroup of a stale job");
        job.remove()
    }

    /// Removes the group `name`, found under the parent(s) with no job of this supervisor
    /// behind it, only if it cannot be another supervisor's: no process in it and created at
    /// least `min_age` ago. Two airlocks with different runtime directories may share one
    /// cgroup parent, and a live job's group holds its processes from a moment after it is
    /// made until its removal, so such a group is never killed. Returns whether it was
    /// removed (or gone already).
    pub fn remove_orphaned_group(
        &self,
        name: &str,
        min_age: Duration,
    ) -> Result<bool, CgroupError> {
        let dirs = self.existing_dirs(name)?;
        for dir in &dirs {
            let young = std::fs::metadata(&dir.dir)
                .and_then(|m| m.modified())
                .map(|at| at.elapsed().map_or(true, |age| age < min_age))
                .unwrap_or(true);
            if young || crate::kill::count_members(std::slice::from_ref(dir))? > 0 {
                return Ok(false);
            }
        }
        for dir in &dirs {
            match std::fs::remove_dir(&dir.dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                // A process joined (or a child group was made) since it was read: in use.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {
                    return Ok(false);
                }
                Err(source) => {
                    return Err(CgroupError::RemoveDir {
                        path: dir.dir.clone(),
                        source,
                    });
                }
            }
        }
        tracing::info!(job = name, "removed an empty orphaned job cgroup");
        Ok(true)
    }

    /// Names of the child groups under the parent(s), sorted: after every job is removed this
    /// is empty.
    pub fn job_groups(&self) -> Result<Vec<String>, CgroupError> {
        let mut names = Vec::new();
        for parent in &self.parents {
            let entries =
                std::fs::read_dir(&parent.dir).map_err(|source| CgroupError::ReadDir {
                    path: parent.dir.clone(),
                    source,
                })?;
            for entry in entries {
                let entry = entry.map_err(|source| CgroupError::ReadDir {
                    path: parent.dir.clone(),
                    source,
                })?;
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    names.push(entry.file_name().to_string_lossy().into_owned());
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Removes the parent directories this manager created (innermost first), for tests and
    /// uninstall. Fails with [`CgroupError::RemoveDir`] while job groups remain.
    pub fn remove_created_parents(&self) -> Result<(), CgroupError> {
        for dir in self.created.iter().rev() {
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(CgroupError::RemoveDir {
                        path: dir.clone(),
                        source,
                    });
                }
            }
        }
        Ok(())
    }
}

/// One job's group: a directory per v1 hierarchy used, or one v2 directory. Dropping it
/// without [`JobCgroup::remove`] kills and removes it on a best-effort basis.
#[derive(Debug)]
pub struct JobCgroup {
    name: String,
    version: CgroupVersion,
    dirs: Vec<GroupDir>,
    removed: bool,
}

impl JobCgroup {
    /// The job group name.
    pub fn name(&self) -> &str {
        &self.name
    }

    #[cfg(test)]
    pub(crate) fn dirs(&self) -> &[GroupDir] {
        &self.dirs
    }

    /// The group's directories.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.dir.clone()).collect()
    }

    /// The `cgroup.procs` file of every hierarchy of the group: the processes in it.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(GroupDir::procs_file).collect()
    }

    /// The files through which a single-threaded process joins the group by writing `0` to
    /// each (the sandbox helper does, before it unshares): each v1 hierarchy's `tasks`, or
    /// v2's `cgroup.procs`.
    ///
    /// Why `tasks` on v1: writing a pid to `cgroup.procs` moves a whole thread group under
    /// the kernel's global `cgroup_threadgroup_rwsem` taken for writing, which first waits
    /// for an RCU grace period (about 10 ms on an idle host, the largest single cost of a
    /// cold job); writing `0` to `tasks` moves only the calling thread, which the kernel does
    /// without that lock (`cgroup_procs_write_start`, since Linux 5.5; older kernels take it
    /// either way). For a process with one thread the two moves are the same, so only a
    /// single-threaded process may use these files. v2 has no such file for a domain group;
    /// there the helper is created inside its group instead (`clone3(CLONE_INTO_CGROUP)`).
    pub fn join_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(GroupDir::join_file).collect()
    }

    /// Kills every process in the group: `cgroup.kill` on v2 when the kernel has it (5.14+),
    /// otherwise a bounded sweep that SIGKILLs, through a pidfd, only processes whose
    /// `/proc/<pid>/cgroup` still names this group.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        if self.write_cgroup_kill()? {
            return Ok(());
        }
        kill::sweep(&self.dirs)
    }

    /// Sends SIGKILL to every process in the group once (`cgroup.kill` on v2 where the
    /// kernel has it, otherwise each listed process verified as in [`JobCgroup::kill_all`])
    /// and returns without waiting for any of them to leave. For a group whose job
    /// processes are known to be gone already, where only the sandbox's own plumbing may
    /// still be exiting: the wait for the group to empty is then the removal's
    /// ([`JobCgroup::remove`]), off the job's path.
    pub fn kill_now(&self) -> Result<(), CgroupError> {
        if self.write_cgroup_kill()? {
            return Ok(());
        }
        kill::signal_once(&self.dirs).map(|_| ())
    }

    /// Writes v2's `cgroup.kill` of every directory, where the kernel has it (5.14+);
    /// `false` when it has not (v1, older v2), and nothing was written.
    fn write_cgroup_kill(&self) -> Result<bool, CgroupError> {
        if self.version != CgroupVersion::V2 {
            return Ok(false);
        }
        let kill_files: Vec<PathBuf> = self
            .dirs
            .iter()
            .map(|d| d.dir.join("cgroup.kill"))
            .filter(|f| f.exists())
            .collect();
        if kill_files.len() != self.dirs.len() {
            return Ok(false);
        }
        for f in &kill_files {
            fs::write(f, "1")?;
        }
        Ok(true)
    }

    /// Waits until no process is left in the group; `false` when `timeout` passed first.
    pub fn wait_empty(&self, timeout: Duration) -> Result<bool, CgroupError> {
        let start = Instant::now();
        let mut attempt = 0;
        loop {
            if kill::count_members(&self.dirs)? == 0 {
                return Ok(true);
            }
            if start.elapsed() >= timeout {
                return Ok(false);
            }
            thread::sleep(crate::backoff(attempt, WAIT_POLL_INTERVAL_MS));
            attempt += 1;
        }
    }

    /// How the group's processes compete for the CPU with other groups of airlock: normal,
    /// or in the background (a warm sandbox starting or waiting for its job, which must
    /// never slow a job that runs). Independent of the CPU quota, which still holds.
    pub fn set_cpu_priority(&self, priority: crate::CpuPriority) -> Result<(), CgroupError> {
        match self.version {
            CgroupVersion::V1 => v1::write_cpu_priority(&self.dirs, priority),
            CgroupVersion::V2 => match self.dirs.first() {
                Some(d) => v2::write_cpu_priority(&d.dir, priority),
                None => Ok(()),
            },
        }
    }

    /// Reads peak memory, OOM kills and CPU time.
    pub fn stats(&self) -> Result<JobStats, CgroupError> {
        match self.version {
            CgroupVersion::V1 => v1::read_stats(&self.dirs),
            CgroupVersion::V2 => match self.dirs.first() {
                Some(d) => v2::read_stats(&d.dir),
                None => Ok(JobStats::default()),
            },
        }
    }

    /// Kills everything in the group, waits up to [`REMOVE_WAIT_MS`] for it to empty, and
    /// removes every directory. An error names the directory that stays.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.removed = true;
        self.teardown(Duration::from_millis(REMOVE_WAIT_MS))
    }

    fn teardown(&mut self, wait: Duration) -> Result<(), CgroupError> {
        let mut first_error = self.kill_all().err();
        if let Err(e) = self.wait_empty(wait) {
            first_error.get_or_insert(e);
        }
        let mut kept = Vec::new();
        for d in self.dirs.drain(..) {
            match std::fs::remove_dir(&d.dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    first_error.get_or_insert(CgroupError::RemoveDir {
                        path: d.dir.clone(),
                        source,
                    });
                    kept.push(d);
                }
            }
        }
        self.dirs = kept;
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for JobCgroup {
    fn drop(&mut self) {
        if self.removed || self.dirs.is_empty() {
            return;
        }
        if let Err(error) = self.teardown(Duration::from_millis(DROP_WAIT_MS)) {
            tracing::warn!(job = %self.name, %error, "job cgroup left behind");
        }
    }
}

/// Checks that the hierarchy has every controller the version needs.
pub(crate) fn require_controllers(h: &Hierarchy) -> Result<(), CgroupError> {
    match h.version() {
        CgroupVersion::V1 => {
            for c in V1_CONTROLLERS {
                if h.v1_mount(c).is_none() {
                    return Err(CgroupError::MissingController {
                        controller: c,
                        reason: format!("no cgroup v1 hierarchy with {c} is mounted"),
                    });
                }
            }
        }
        CgroupVersion::V2 => {
            let available = h.unified.as_ref().map(|u| u.controllers.clone());
            for c in V2_CONTROLLERS {
                if !available.as_ref().is_some_and(|a| a.iter().any(|x| x == c)) {
                    return Err(CgroupError::MissingController {
                        controller: c,
                        reason: "not in the cgroup v2 root's cgroup.controllers".to_owned(),
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn job_names_are_validated() {
        for ok in ["a", "job-1", "JOB_2", &"x".repeat(64)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a b",
            "jöb",
            "a\n",
            &"x".repeat(65),
            "cgroup.procs",
        ] {
            assert!(
                matches!(validate_name(bad), Err(CgroupError::InvalidName { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn limits_are_validated() {
        let ok = JobLimits {
            memory_bytes: 1 << 20,
            cpu_millis: 10,
            pids_max: 1,
        };
        assert!(ok.validate().is_ok());
        assert_eq!(ok.cpu_quota_us(), 1000);
        for bad in [
            JobLimits {
                memory_bytes: 0,
                ..ok
            },
            JobLimits {
                cpu_millis: 9,
                ..ok
            },
            JobLimits { pids_max: 0, ..ok },
        ] {
            assert!(matches!(
                bad.validate(),
                Err(CgroupError::InvalidLimit { .. })
            ));
        }
    }

    #[test]
    fn parent_paths_are_plain_relative() -> Result<(), CgroupError> {
        assert_eq!(relative_parent(Path::new("/a/b"))?, PathBuf::from("a/b"));
        assert_eq!(relative_parent(Path::new("a/./b"))?, PathBuf::from("a/b"));
        assert!(relative_parent(Path::new("a/../b")).is_err());
        assert!(relative_parent(Path::new("/")).is_err());
        Ok(())
    }

    #[test]
    fn hierarchy_paths_follow_the_mount_root() {
        let d = GroupDir::new(
            Path::new("/m"),
            "/docker/abc",
            PathBuf::from("/m/airlock"),
            HierarchyKey::Unified,
            vec![],
        );
        assert_eq!(d.hierarchy_path, "/docker/abc/airlock");
        assert_eq!(d.child("j").hierarchy_path, "/docker/abc/airlock/j");
        let root = GroupDir::new(
            Path::new("/m"),
            "/",
            PathBuf::from("/m"),
            HierarchyKey::Unified,
            vec![],
        );
        assert_eq!(root.hierarchy_path, "/");
        assert_eq!(root.child("j").hierarchy_path, "/j");
    }
}
