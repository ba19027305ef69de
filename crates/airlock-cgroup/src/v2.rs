//! cgroup v2: one directory per job under a parent whose ancestors enable memory, pids and
//! cpu for their children.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::hierarchy::{UnifiedMount, V2_CONTROLLERS};
use crate::manager::{GroupDir, HierarchyKey, relative_parent};
use crate::{CPU_PERIOD_US, CgroupError, Hierarchy, JobLimits, JobStats, ParentSpec, fs};

/// The swap limit; absent without swap accounting.
pub(crate) const SWAP_MAX: &str = "memory.swap.max";
/// Where [`ParentSpec::Auto`] moves this process inside its own delegated cgroup.
pub(crate) const SUPERVISOR_DIR: &str = "supervisor";
/// The parent of the job groups inside this process's own delegated cgroup.
pub(crate) const JOBS_DIR: &str = "jobs";
/// The parent of the job groups when this process runs in the root cgroup.
pub(crate) const ROOT_PARENT_DIR: &str = "airlock";
/// `errno` for "the cgroup has processes of its own" when enabling controllers.
const EBUSY: i32 = 16;

/// What [`crate::CgroupManager::new`] will do on a v2 host.
#[derive(Debug, Clone)]
pub(crate) struct V2Plan {
    /// The parent of the job groups.
    pub parent: GroupDir,
    /// Where this process moves itself first (Auto in a delegated cgroup).
    pub move_self_to: Option<PathBuf>,
    /// This process's id.
    pub pid: u32,
}

/// Resolves the parent directory without changing anything.
pub(crate) fn plan_parent(
    h: &Hierarchy,
    spec: &ParentSpec,
    pid: u32,
) -> Result<V2Plan, CgroupError> {
    let Some(u) = h.unified.as_ref() else {
        return Err(CgroupError::MissingController {
            controller: "memory",
            reason: "no cgroup2 filesystem is mounted".to_owned(),
        });
    };
    let (dir, move_self_to) = match spec {
        ParentSpec::Path(p) => (u.mount_point.join(relative_parent(p)?), None),
        ParentSpec::Auto => auto_parent(u, pid)?,
    };
    let parent = GroupDir::new(
        &u.mount_point,
        &u.root,
        dir,
        HierarchyKey::Unified,
        V2_CONTROLLERS.to_vec(),
    );
    Ok(V2Plan {
        parent,
        move_self_to,
        pid,
    })
}

fn auto_parent(u: &UnifiedMount, pid: u32) -> Result<(PathBuf, Option<PathBuf>), CgroupError> {
    let own = u.own_dir().ok_or_else(|| CgroupError::OwnCgroupUnknown {
        hierarchy: "unified".to_owned(),
    })?;
    // The real root has no `cgroup.type`; a cgroup namespace root (a container) has one and
    // is bound by the no-internal-processes rule like any other cgroup.
    if own == u.mount_point && !own.join("cgroup.type").exists() {
        return Ok((own.join(ROOT_PARENT_DIR), None));
    }
    // Already split by an earlier manager in this process.
    if own.file_name().is_some_and(|n| n == SUPERVISOR_DIR)
        && let Some(base) = own.parent()
    {
        return Ok((base.join(JOBS_DIR), None));
    }
    let pids = fs::read_pids(&own.join("cgroup.procs"))?;
    if pids.len() == 1 && u32::try_from(pids[0]).is_ok_and(|p| p == pid) {
        return Ok((own.join(JOBS_DIR), Some(own.join(SUPERVISOR_DIR))));
    }
    Err(CgroupError::AutoParent {
        own,
        reason: format!(
            "{} processes share this process's cgroup, and cgroup v2 lets a cgroup enable \
             controllers for child groups only when it has no processes of its own; run airlock \
             alone in a delegated cgroup (e.g. `systemd-run --scope -p Delegate=yes airlock ...`) \
             or set an explicit parent cgroup",
            pids.len()
        ),
    })
}

/// Carries out a plan: step 1 moves this process out of its own cgroup if needed, step 2
/// creates each level from the mount root down to the parent and enables the controllers
/// for its children where they are not enabled yet.
pub(crate) fn apply_plan(plan: &V2Plan, created: &mut Vec<PathBuf>) -> Result<(), CgroupError> {
    if let Some(supervisor) = &plan.move_self_to {
        // Not recorded in `created`: it holds this process for the rest of its life.
        std::fs::create_dir_all(supervisor).map_err(|source| CgroupError::CreateDir {
            path: supervisor.clone(),
            source,
        })?;
        fs::write(&supervisor.join("cgroup.procs"), &plan.pid.to_string())?;
        tracing::info!(supervisor = %supervisor.display(), "moved airlock into its own leaf cgroup");
    }
    fs::create_dir_chain(
        &plan.parent.mount_point,
        &plan.parent.dir,
        created,
        enable_controllers,
    )
}

/// Writes `+memory +pids +cpu` (only those missing) to `dir/cgroup.subtree_control`.
fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = fs::read_optional(&control)?.unwrap_or_default();
    let missing: Vec<&'static str> = V2_CONTROLLERS
        .into_iter()
        .filter(|c| {
            !enabled
                .split_whitespace()
                .any(|e| e.trim_start_matches('+') == *c)
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let available = fs::read_optional(&dir.join("cgroup.controllers"))?;
    // A fake tree may lack cgroup.controllers; the real one always has it.
    if let Some(available) = available
        && let Some(c) = missing
            .iter()
            .find(|c| !available.split_whitespace().any(|a| a == **c))
    {
        return Err(CgroupError::MissingController {
            controller: c,
            reason: format!(
                "not available in {}: its parent must enable (delegate) it",
                dir.display()
            ),
        });
    }
    let value = missing
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    match fs::write(&control, &value) {
        Err(CgroupError::WriteFile { source, .. }) if source.raw_os_error() == Some(EBUSY) => {
            Err(CgroupError::InternalProcesses {
                path: control,
                controllers: value,
            })
        }
        // An ancestor this process does not own (rootless, or a delegation without these
        // controllers): say which controllers are not delegated rather than only EACCES.
        Err(CgroupError::WriteFile { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            Err(CgroupError::MissingController {
                controller: missing.first().copied().unwrap_or("memory"),
                reason: format!(
                    "{} {}",
                    control.display(),
                    not_delegated_reason(&missing.join(", "))
                ),
            })
        }
        other => other,
    }
}

/// Why job groups cannot get `controllers`, said of a `cgroup.subtree_control` that lacks
/// them and may not be written.
pub(crate) fn not_delegated_reason(controllers: &str) -> String {
    format!(
        "does not enable {controllers} for its children and this process may not enable it: \
         delegate the cgroup with memory, pids and cpu (systemd: Delegate=yes) or choose a \
         parent where they are enabled"
    )
}

/// `memory.max`, `memory.swap.max` = 0 when swap is accounted, `cpu.max`, `pids.max`.
pub(crate) fn write_limits(
    dir: &Path,
    limits: &JobLimits,
    swap_max: bool,
) -> Result<(), CgroupError> {
    fs::write(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
    if swap_max {
        fs::write(&dir.join(SWAP_MAX), "0")?;
    }
    fs::write(
        &dir.join("cpu.max"),
        &format!("{} {CPU_PERIOD_US}", limits.cpu_quota_us()),
    )?;
    fs::write(&dir.join("pids.max"), &limits.pids_max.to_string())
}

/// `cpu.weight` (the default 100, or the minimum 1) and, where the kernel has it (5.15+),
/// `cpu.idle`, which schedules the whole group as `SCHED_IDLE`: it runs only on a CPU that
/// nothing else of normal priority wants.
pub(crate) fn write_cpu_priority(
    dir: &Path,
    priority: crate::CpuPriority,
) -> Result<(), CgroupError> {
    let (weight, idle) = match priority {
        crate::CpuPriority::Normal => ("100", "0"),
        crate::CpuPriority::Background => ("1", "1"),
    };
    let idle_file = dir.join("cpu.idle");
    // Leaving idle first, entering it last: a group between the two states is never
    // both idle and weighted as normal.
    if priority == crate::CpuPriority::Normal && idle_file.exists() {
        fs::write(&idle_file, idle)?;
    }
    fs::write(&dir.join("cpu.weight"), weight)?;
    if priority == crate::CpuPriority::Background && idle_file.exists() {
        fs::write(&idle_file, idle)?;
    }
    Ok(())
}

/// `memory.peak` (Linux 5.19+), `oom_kill` of `memory.events`, `usage_usec` of `cpu.stat`.
pub(crate) fn read_stats(dir: &Path) -> Result<JobStats, CgroupError> {
    let path = dir.join("memory.peak");
    let peak_memory_bytes = match fs::read_optional(&path)? {
        Some(text) => Some(fs::parse_u64(&path, &text)?),
        None => None,
    };
    let path = dir.join("memory.events");
    let text = fs::read(&path)?;
    let oom_kills = fs::keyed_u64(&path, &text, "oom_kill")?.unwrap_or(0);
    let path = dir.join("cpu.stat");
    let cpu_time = match fs::read_optional(&path)? {
        Some(text) => fs::keyed_u64(&path, &text, "usage_usec")?.map(Duration::from_micros),
        None => None,
    };
    Ok(JobStats {
        peak_memory_bytes,
        oom_kills,
        cpu_time,
    })
}

/// Whether the kernel command line turns socket memory accounting off
/// (`cgroup.memory=nosocket`, possibly among other comma-separated options); v2 otherwise
/// charges a group's socket buffers to its `memory.current`.
pub(crate) fn socket_accounting_disabled(cmdline: &str) -> bool {
    cmdline
        .split_whitespace()
        .filter_map(|arg| arg.strip_prefix("cgroup.memory="))
        .any(|options| options.split(',').any(|o| o == "nosocket"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn nosocket_on_the_command_line_turns_socket_accounting_off() {
        assert!(!super::socket_accounting_disabled(
            "BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro quiet"
        ));
        assert!(super::socket_accounting_disabled(
            "root=/dev/vda1 cgroup.memory=nokmem,nosocket quiet"
        ));
        assert!(super::socket_accounting_disabled("cgroup.memory=nosocket"));
        assert!(!super::socket_accounting_disabled("cgroup.memory=nokmem"));
        assert!(!super::socket_accounting_disabled(
            "xcgroup.memory=nosocket"
        ));
    }

    use super::*;
    use crate::{CgroupManager, CgroupVersion, JobCgroup};
    use pretty_assertions::assert_eq;
    use std::fs as stdfs;

    fn io(source: std::io::Error) -> CgroupError {
        CgroupError::ReadFile {
            path: PathBuf::from("test setup"),
            source,
        }
    }

    fn read(p: &Path) -> String {
        stdfs::read_to_string(p).unwrap_or_else(|e| format!("<{}: {e}>", p.display()))
    }

    fn put(p: &Path, content: &str) -> Result<(), CgroupError> {
        if let Some(dir) = p.parent() {
            stdfs::create_dir_all(dir).map_err(io)?;
        }
        stdfs::write(p, content).map_err(io)
    }

    /// A pure v2 host mounted at `root`, this process at `own`.
    fn fake_v2(root: &Path, own: &str) -> Result<Hierarchy, CgroupError> {
        let mountinfo = format!(
            "26 22 0:23 / {} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
            root.display()
        );
        put(
            &root.join("cgroup.controllers"),
            "cpuset cpu io memory hugetlb pids rdma\n",
        )?;
        let h = Hierarchy::from_proc_files(&mountinfo, &format!("0::{own}\n"))?;
        Ok(h.with_unified_controllers("cpuset cpu io memory hugetlb pids rdma\n"))
    }

    const LIMITS: JobLimits = JobLimits {
        memory_bytes: 256 << 20,
        cpu_millis: 500,
        pids_max: 64,
    };

    #[test]
    fn auto_in_root_cgroup_uses_airlock_and_enables_controllers() -> Result<(), CgroupError> {
        let tmp = tempfile::tempdir().map_err(io)?;
        let root = tmp.path();
        let h = fake_v2(root, "/")?;
        assert_eq!(h.version(), CgroupVersion::V2);
        put(&root.join("cgroup.subtree_control"), "")?;
        put(&root.join("airlock/memory.swap.max"), "max\n")?;
        let m = CgroupManager::new(h, ParentSpec::Auto)?;
        assert_eq!(m.parent_paths(), vec![root.join("airlock")]);
        assert!(m.swap_accounting());
        assert_eq!(
            read(&root.join("cgroup.subtree_control")),
            "+memory +pids +cpu"
        );
        assert_eq!(
            read(&root.join("airlock/cgroup.subtree_control")),
            "+memory +pids +cpu"
        );

        let job = m.create_job("job_7", &LIMITS)?;
        let dir = root.join("airlock/job_7");
        assert_eq!(read(&dir.join("memory.max")), "268435456");
        assert_eq!(read(&dir.join("memory.swap.max")), "0");
        assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
        assert_eq!(read(&dir.join("pids.max")), "64");
        // Without cpu.idle (before 5.15) only the weight says it; with it, both.
        job.set_cpu_priority(crate::CpuPriority::Background)?;
        assert_eq!(read(&dir.join("cpu.weight")), "1");
        assert!(!dir.join("cpu.idle").exists());
        put(&dir.join("cpu.idle"), "0")?;
        job.set_cpu_priority(crate::CpuPriority::Background)?;
        assert_eq!(read(&dir.join("cpu.idle")), "1");
        job.set_cpu_priority(crate::CpuPriority::Normal)?;
        assert_eq!(read(&dir.join("cpu.weight")), "100");
        assert_eq!(read(&dir.join("cpu.idle")), "0");
        assert_eq!(job.procs_files(), vec![dir.join("cgroup.procs")]);
        assert_eq!(job.join_files(), vec![dir.join("cgroup.procs")]);
        assert_eq!(job.dirs()[0].hierarchy_path, "/airlock/job_7");
        assert_eq!(m.job_groups()?, vec!["job_7".to_owned()]);
        std::mem::forget(job);
        Ok(())
    }

    #[test]
    fn auto_alone_in_delegated_cgroup_splits_into_supervisor_and_jobs() -> Result<(), CgroupError> {
        let tmp = tempfile::tempdir().map_err(io)?;
        let root = tmp.path();
        let own = root.join("system.slice/run-r1.scope");
        let h = fake_v2(root, "/system.slice/run-r1.scope")?;
        // systemd already enabled the controllers above the delegated scope (kernel format).
        put(&root.join("cgroup.subtree_control"), "cpu memory pids\n")?;
        put(
            &root.join("system.slice/cgroup.subtree_control"),
            "cpu io memory pids\n",
        )?;
        put(&own.join("cgroup.controllers"), "cpu io memory pids\n")?;
        put(
            &own.join("cgroup.procs"),
            &format!("{}\n", std::process::id()),
        )?;
        let m = CgroupManager::new(h, ParentSpec::Auto)?;
        assert_eq!(m.parent_paths(), vec![own.join("jobs")]);
        assert!(!m.swap_accounting());
        assert_eq!(
            read(&own.join("supervisor/cgroup.procs")),
            std::process::id().to_string()
        );
        // Untouched where already enabled; written in the scope and in jobs.
        assert_eq!(
            read(&root.join("cgroup.subtree_control")),
            "cpu memory pids\n"
        );
        assert_eq!(
            read(&own.join("cgroup.subtree_control")),
            "+memory +pids +cpu"
        );
        assert_eq!(
            read(&own.join("jobs/cgroup.subtree_control")),
            "+memory +pids +cpu"
        );
        let job = m.create_job("a", &LIMITS)?;
        assert!(!own.join("jobs/a/memory.swap.max").exists());
        std::mem::forget(job);

        // A second manager in the same process finds the split already made.
        let h = fake_v2(root, "/system.slice/run-r1.scope/supervisor")?;
        let m = CgroupManager::new(h, ParentSpec::Auto)?;
        assert_eq!(m.parent_paths(), vec![own.join("jobs")]);
        Ok(())
    }

    #[test]
    fn auto_sharing_its_cgroup_explains_the_fix() -> Result<(), CgroupError> {
        let tmp = tempfile::tempdir().map_err(io)?;
        let root = tmp.path();
        let own = root.join("user.slice/session-2.scope");
        let h = fake_v2(root, "/user.slice/session-2.scope")?;
        put(
            &own.join("cgroup.procs"),
            &format!("1234\n{}\n", std::process::id()),
        )?;
        let err = CgroupManager::new(h, ParentSpec::Auto)
            .err()
            .map(|e| e.to_string());
        let msg = err.unwrap_or_default();
        assert!(msg.contains("2 processes share"), "{msg}");
        assert!(msg.contains("systemd-run --scope -p Delegate=yes"), "{msg}");
        assert!(!own.join("supervisor").exists());
        assert!(!own.join("jobs").exists());
        Ok(())
    }

    #[test]
    fn container_namespace_root_is_not_the_real_root() -> Result<(), CgroupError> {
        let tmp = tempfile::tempdir().map_err(io)?;
        let root = tmp.path();
        let h = fake_v2(root, "/")?;
        put(&root.join("cgroup.type"), "domain\n")?;
        put(
            &root.join("cgroup.procs"),
            &format!("1\n{}\n", std::process::id()),
        )?;
        assert!(matches!(
            CgroupManager::new(h, ParentSpec::Auto),
            Err(CgroupError::AutoParent { .. })
        ));
        Ok(())
    }

    #[test]
    fn explicit_parent_needs_delegated_controllers() -> Result<(), CgroupError> {
        let tmp = tempfile::tempdir().map_err(io)?;
        let root = tmp.path();
        let h = fake_v2(root, "/")?;
        put(&root.join("cgroup.subtree_control"), "memory pids cpu\n")?;
        put(&root.join("sandbox/cgroup.controllers"), "memory pids\n")?;
        let err = CgroupManager::new(h, ParentSpec::Path("sandbox/jobs".into()));
        assert!(matches!(
            err,
            Err(CgroupError::MissingController {
                controller: "cpu",
                ..
            })
        ));
        let h = fake_v2(root, "/")?;
        let err = CgroupManager::new(h, ParentSpec::Path("../etc".into()));
        assert!(matches!(err, Err(CgroupError::InvalidParent { .. })));
        Ok(())
    }

    #[test]
    fn stats_parse_and_missing_files_are_none() -> Result<(), CgroupError> {
        let tmp = tempfile::tempdir().map_err(io)?;
        let dir = tmp.path();
        put(
            &dir.join("memory.events"),
            "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n",
        )?;
        assert_eq!(
            read_stats(dir)?,
            JobStats {
                peak_memory_bytes: None,
                oom_kills: 1,
                cpu_time: None
            }
        );
        put(&dir.join("memory.peak"), "67100672\n")?;
        put(
            &dir.join("cpu.stat"),
            "usage_usec 250000\nuser_usec 200000\nsystem_usec 50000\nnr_periods 3\n",
        )?;
        assert_eq!(
            read_stats(dir)?,
            JobStats {
                peak_memory_bytes: Some(67_100_672),
                oom_kills: 1,
                cpu_time: Some(Duration::from_millis(250))
            }
        );
        stdfs::remove_file(dir.join("memory.events")).map_err(io)?;
        assert!(matches!(read_stats(dir), Err(CgroupError::ReadFile { .. })));
        Ok(())
    }

    fn fake_job(root: &Path) -> Result<(CgroupManager, JobCgroup), CgroupError> {
        let m = CgroupManager::new(fake_v2(root, "/")?, ParentSpec::Auto)?;
        let job = m.create_job("k", &LIMITS)?;
        Ok((m, job))
    }

    #[test]
    fn kill_uses_cgroup_kill_when_present() -> Result<(), CgroupError> {
        let tmp = tempfile::tempdir().map_err(io)?;
        let (_m, job) = fake_job(tmp.path())?;
        let dir = tmp.path().join("airlock/k");
        put(&dir.join("cgroup.kill"), "")?;
        put(&dir.join("cgroup.procs"), "")?;
        job.kill_all()?;
        assert_eq!(read(&dir.join("cgroup.kill")), "1");
        assert!(job.wait_empty(Duration::from_millis(50))?);
        std::mem::forget(job);
        Ok(())
    }

    #[test]
    fn sweep_never_signals_a_pid_outside_the_group() -> Result<(), CgroupError> {
        let tmp = tempfile::tempdir().map_err(io)?;
        let (_m, job) = fake_job(tmp.path())?;
        let dir = tmp.path().join("airlock/k");
        // No cgroup.kill: the sweep runs. The fake group lists this test process, whose
        // /proc/self/cgroup does not name the fake group: it must survive, and the sweep
        // must give up after its bound.
        put(
            &dir.join("cgroup.procs"),
            &format!("{}\n", std::process::id()),
        )?;
        let err = job.kill_all();
        assert!(
            matches!(err, Err(CgroupError::KillIncomplete { remaining: 1, .. })),
            "{err:?}"
        );
        assert!(!job.wait_empty(Duration::from_millis(20))?);
        put(&dir.join("cgroup.procs"), "")?;
        job.kill_all()?;
        assert!(job.wait_empty(Duration::from_millis(20))?);
        std::mem::forget(job);
        Ok(())
    }
}
