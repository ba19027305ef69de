//! cgroup v1: one directory per hierarchy (memory, cpu, cpuacct, pids; co-mounted
//! hierarchies such as `cpu,cpuacct` share one directory).

use std::path::PathBuf;
use std::time::Duration;

use crate::hierarchy::V1_CONTROLLERS;
use crate::manager::{GroupDir, HierarchyKey, relative_parent};
use crate::{CPU_PERIOD_US, CgroupError, Hierarchy, JobLimits, JobStats, ParentSpec, fs};

/// The memory+swap limit; present only with swap accounting.
pub(crate) const MEMSW_LIMIT: &str = "memory.memsw.limit_in_bytes";

/// The limit on the group's TCP socket buffers. On v1 socket memory is not part of
/// `memory.usage_in_bytes` and is charged to the group at all only once this limit is set:
/// without it a job's loopback connections pin buffers bounded only by the host-wide
/// `net.ipv4.tcp_mem`.
pub(crate) const TCP_LIMIT: &str = "memory.kmem.tcp.limit_in_bytes";

/// The parent directory in each distinct hierarchy that carries a needed controller.
pub(crate) fn plan_parents(h: &Hierarchy, spec: &ParentSpec) -> Result<Vec<GroupDir>, CgroupError> {
    let mut parents: Vec<GroupDir> = Vec::new();
    for controller in V1_CONTROLLERS {
        let Some(mount) = h.v1_mount(controller) else {
            return Err(CgroupError::MissingController {
                controller,
                reason: format!("no cgroup v1 hierarchy with {controller} is mounted"),
            });
        };
        if let Some(p) = parents
            .iter_mut()
            .find(|p| p.mount_point == mount.mount_point)
        {
            p.controllers.push(controller);
            continue;
        }
        let dir: PathBuf = match spec {
            ParentSpec::Auto => mount
                .own_dir()
                .ok_or_else(|| CgroupError::OwnCgroupUnknown {
                    hierarchy: controller.to_owned(),
                })?
                .join("airlock"),
            ParentSpec::Path(p) => mount.mount_point.join(relative_parent(p)?),
        };
        parents.push(GroupDir::new(
            &mount.mount_point,
            &mount.root,
            dir,
            HierarchyKey::V1(controller),
            vec![controller],
        ));
    }
    Ok(parents)
}

/// Writes the limits. The memory+swap limit goes after the memory limit (the kernel requires
/// memsw >= memory at every step); without swap accounting, swappiness 0 is the best v1 has.
/// TCP buffers get the memory limit as a limit of their own (v1 counts them apart), before
/// any process joins, so every socket of the job is charged.
pub(crate) fn write_limits(
    dirs: &[GroupDir],
    limits: &JobLimits,
    memsw: bool,
    tcp: bool,
) -> Result<(), CgroupError> {
    for d in dirs {
        if d.serves("memory") {
            let bytes = limits.memory_bytes.to_string();
            fs::write(&d.dir.join("memory.limit_in_bytes"), &bytes)?;
            if memsw {
                fs::write(&d.dir.join(MEMSW_LIMIT), &bytes)?;
            } else {
                fs::write(&d.dir.join("memory.swappiness"), "0")?;
            }
            if tcp {
                fs::write(&d.dir.join(TCP_LIMIT), &bytes)?;
            }
        }
        if d.serves("cpu") {
            fs::write(&d.dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
            fs::write(
                &d.dir.join("cpu.cfs_quota_us"),
                &limits.cpu_quota_us().to_string(),
            )?;
        }
        if d.serves("pids") {
            fs::write(&d.dir.join("pids.max"), &limits.pids_max.to_string())?;
        }
    }
    Ok(())
}

/// `cpu.shares` of a group: the kernel's default for a normal one, its minimum for one that
/// should run only when its siblings leave the CPU idle.
pub(crate) fn write_cpu_priority(
    dirs: &[GroupDir],
    priority: crate::CpuPriority,
) -> Result<(), CgroupError> {
    for d in dirs.iter().filter(|d| d.serves("cpu")) {
        write_cpu_shares(&d.dir, priority)?;
    }
    Ok(())
}

/// `cpu.shares` of one group directory of the `cpu` hierarchy.
pub(crate) fn write_cpu_shares(
    dir: &std::path::Path,
    priority: crate::CpuPriority,
) -> Result<(), CgroupError> {
    let shares = match priority {
        crate::CpuPriority::Normal => "1024",
        crate::CpuPriority::Background => "2",
    };
    fs::write(&dir.join("cpu.shares"), shares)
}

/// `memory.max_usage_in_bytes`, `oom_kill` of `memory.oom_control`, `cpuacct.usage` (ns).
pub(crate) fn read_stats(dirs: &[GroupDir]) -> Result<JobStats, CgroupError> {
    let mut stats = JobStats::default();
    for d in dirs {
        if d.serves("memory") {
            let path = d.dir.join("memory.max_usage_in_bytes");
            if let Some(text) = fs::read_optional(&path)? {
                stats.peak_memory_bytes = Some(fs::parse_u64(&path, &text)?);
            }
            let path = d.dir.join("memory.oom_control");
            let text = fs::read(&path)?;
            stats.oom_kills = fs::keyed_u64(&path, &text, "oom_kill")?.unwrap_or(0);
        }
        if d.serves("cpuacct") {
            let path = d.dir.join("cpuacct.usage");
            if let Some(text) = fs::read_optional(&path)? {
                stats.cpu_time = Some(Duration::from_nanos(fs::parse_u64(&path, &text)?));
            }
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hierarchy::tests::{V1_HOST_CGROUP, V1_HOST_MOUNTINFO};
    use crate::{CgroupManager, CgroupVersion};
    use pretty_assertions::assert_eq;
    use std::fs as stdfs;
    use std::path::Path;

    /// The mountinfo of this machine, re-rooted at `root`, with `cpu,cpuacct` co-mounted.
    fn fake_v1(root: &Path) -> Result<Hierarchy, CgroupError> {
        let r = root.display();
        let mountinfo = format!(
            "32 31 0:29 / {r}/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
             35 31 0:32 / {r}/memory rw - cgroup cgroup rw,memory\n\
             39 31 0:36 / {r}/pids rw - cgroup cgroup rw,pids\n\
             40 31 0:37 / {r}/systemd rw - cgroup cgroup rw,name=systemd\n\
             41 31 0:38 / {r}/unified rw - cgroup2 cgroup2 rw\n"
        );
        let cgroup = "9:name=systemd:/\n8:pids:/\n4:memory:/svc/airlockd\n1:cpu,cpuacct:/\n0::/\n";
        for m in ["cpu,cpuacct", "memory/svc/airlockd", "pids"] {
            stdfs::create_dir_all(root.join(m)).map_err(io)?;
        }
        Hierarchy::from_proc_files(&mountinfo, cgroup)
    }

    fn io(source: std::io::Error) -> CgroupError {
        CgroupError::ReadFile {
            path: PathBuf::from("test setup"),
            source,
        }
    }

    fn read(p: PathBuf) -> String {
        stdfs::read_to_string(&p).unwrap_or_else(|e| format!("<{}: {e}>", p.display()))
    }

    #[test]
    fn auto_parent_is_own_cgroup_per_hierarchy_and_limits_are_exact() -> Result<(), CgroupError> {
        let tmp = tempfile::tempdir().map_err(io)?;
        let root = tmp.path();
        let h = fake_v1(root)?;
        // Swap accounting present in the memory parent.
        stdfs::create_dir_all(root.join("memory/svc/airlockd/airlock")).map_err(io)?;
        stdfs::write(
            root.join("memory/svc/airlockd/airlock").join(MEMSW_LIMIT),
            "",
        )
        .map_err(io)?;
        stdfs::write(root.join("memory/svc/airlockd/airlock").join(TCP_LIMIT), "").map_err(io)?;
        let m = CgroupManager::new(h, ParentSpec::Auto)?;
        assert_eq!(m.version(), CgroupVersion::V1);
        assert!(m.swap_accounting());
        assert!(m.tcp_accounting());
        assert_eq!(
            m.parent_paths(),
            vec![
                root.join("memory/svc/airlockd/airlock"),
                root.join("cpu,cpuacct/airlock"),
                root.join("pids/airlock"),
            ]
        );
        let limits = JobLimits {
            memory_bytes: 256 << 20,
            cpu_millis: 500,
            pids_max: 64,
        };
        let job = m.create_job("job-1", &limits)?;
        let mem = root.join("memory/svc/airlockd/airlock/job-1");
        let cpu = root.join("cpu,cpuacct/airlock/job-1");
        let pids = root.join("pids/airlock/job-1");
        assert_eq!(read(mem.join("memory.limit_in_bytes")), "268435456");
        assert_eq!(read(mem.join(MEMSW_LIMIT)), "268435456");
        assert_eq!(read(mem.join(TCP_LIMIT)), "268435456");
        assert!(!mem.join("memory.swappiness").exists());
        assert_eq!(read(cpu.join("cpu.cfs_period_us")), "100000");
        assert_eq!(read(cpu.join("cpu.cfs_quota_us")), "50000");
        assert_eq!(read(pids.join("pids.max")), "64");
        job.set_cpu_priority(crate::CpuPriority::Background)?;
        assert_eq!(read(cpu.join("cpu.shares")), "2");
        assert!(!mem.join("cpu.shares").exists());
        job.set_cpu_priority(crate::CpuPriority::Normal)?;
        assert_eq!(read(cpu.join("cpu.shares")), "1024");
        assert_eq!(
            job.procs_files(),
            vec![
                mem.join("cgroup.procs"),
                cpu.join("cgroup.procs"),
                pids.join("cgroup.procs"),
            ]
        );
        // The helper joins through `tasks` (one thread, no global lock).
        assert_eq!(
            job.join_files(),
            vec![mem.join("tasks"), cpu.join("tasks"), pids.join("tasks")]
        );
        assert_eq!(m.job_groups()?, vec!["job-1".to_owned()]);
        // What /proc/<pid>/cgroup shows for members, per hierarchy.
        let shown: Vec<_> = job
            .dirs()
            .iter()
            .map(|d| d.hierarchy_path.as_str())
            .collect();
        assert_eq!(
            shown,
            [
                "/svc/airlockd/airlock/job-1",
                "/airlock/job-1",
                "/airlock/job-1"
            ]
        );
        std::mem::forget(job); // a fake tree cannot be rmdir'ed; the tempdir goes instead
        Ok(())
    }

    #[test]
    fn without_memsw_swappiness_is_zero_and_explicit_parent_is_created() -> Result<(), CgroupError>
    {
        let tmp = tempfile::tempdir().map_err(io)?;
        let root = tmp.path();
        let m = CgroupManager::new(fake_v1(root)?, ParentSpec::Path("/sandbox/airlock".into()))?;
        assert!(!m.swap_accounting());
        // A kernel without TCP accounting in the memory controller: the manager says so
        // (the backend refuses such a host) and writes no TCP limit.
        assert!(!m.tcp_accounting());
        assert!(root.join("pids/sandbox/airlock").is_dir());
        let limits = JobLimits {
            memory_bytes: 64 << 20,
            cpu_millis: 1500,
            pids_max: 8,
        };
        let job = m.create_job("j", &limits)?;
        let mem = root.join("memory/sandbox/airlock/j");
        assert_eq!(read(mem.join("memory.limit_in_bytes")), "67108864");
        assert_eq!(read(mem.join("memory.swappiness")), "0");
        assert!(!mem.join(MEMSW_LIMIT).exists());
        assert!(!mem.join(TCP_LIMIT).exists());
        assert_eq!(
            read(root.join("cpu,cpuacct/sandbox/airlock/j/cpu.cfs_quota_us")),
            "150000"
        );
        // The same name twice is refused: two jobs never share a group.
        assert!(matches!(
            m.create_job("j", &limits),
            Err(CgroupError::AlreadyExists { .. })
        ));
        std::mem::forget(job);
        Ok(())
    }

    #[test]
    fn stats_parse_and_missing_files_are_none() -> Result<(), CgroupError> {
        let tmp = tempfile::tempdir().map_err(io)?;
        let root = tmp.path();
        let mem = root.join("memory");
        let cpu = root.join("cpuacct");
        stdfs::create_dir_all(&mem).map_err(io)?;
        stdfs::create_dir_all(&cpu).map_err(io)?;
        let dirs = vec![
            GroupDir::new(
                &mem,
                "/",
                mem.clone(),
                HierarchyKey::V1("memory"),
                vec!["memory"],
            ),
            GroupDir::new(
                &cpu,
                "/",
                cpu.clone(),
                HierarchyKey::V1("cpuacct"),
                vec!["cpu", "cpuacct"],
            ),
        ];
        stdfs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\n",
        )
        .map_err(io)?;
        assert_eq!(
            read_stats(&dirs)?,
            JobStats {
                peak_memory_bytes: None,
                oom_kills: 0,
                cpu_time: None
            }
        );
        stdfs::write(mem.join("memory.max_usage_in_bytes"), "67108864\n").map_err(io)?;
        stdfs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        )
        .map_err(io)?;
        stdfs::write(cpu.join("cpuacct.usage"), "1500000000\n").map_err(io)?;
        assert_eq!(
            read_stats(&dirs)?,
            JobStats {
                peak_memory_bytes: Some(64 << 20),
                oom_kills: 3,
                cpu_time: Some(Duration::from_millis(1500))
            }
        );
        stdfs::write(cpu.join("cpuacct.usage"), "lots\n").map_err(io)?;
        assert!(matches!(read_stats(&dirs), Err(CgroupError::Parse { .. })));
        Ok(())
    }

    #[test]
    fn missing_controller_fails_closed() -> Result<(), CgroupError> {
        // This machine without its pids mount.
        let mountinfo: String = V1_HOST_MOUNTINFO
            .lines()
            .filter(|l| !l.contains("rw,pids"))
            .map(|l| format!("{l}\n"))
            .collect();
        let h = Hierarchy::from_proc_files(&mountinfo, V1_HOST_CGROUP)?;
        let err = CgroupManager::new(h, ParentSpec::Auto);
        assert!(matches!(
            err,
            Err(CgroupError::MissingController {
                controller: "pids",
                ..
            })
        ));
        Ok(())
    }
}
