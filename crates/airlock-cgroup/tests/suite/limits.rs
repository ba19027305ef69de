//! Limits land in the real cgroupfs files; the report agrees with the host.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use airlock_cgroup::{CgroupManager, CgroupVersion, Hierarchy, JobLimits, ParentSpec, Presence};
use anyhow::{Context, Result, bail, ensure};
use pretty_assertions::assert_eq;

use super::common::{
    SMALL, members, place, read_job_file, real_parent, require_real_cgroups, spawn_sleep,
};

#[test]
fn limits_are_written_to_the_real_cgroupfs() -> Result<()> {
    let Some(p) = real_parent("limits")? else {
        return Ok(());
    };
    let m = &p.manager;
    let limits = JobLimits {
        memory_bytes: 64 << 20,
        cpu_millis: 500,
        pids_max: 8,
    };
    let job = m.create_job("limits", &limits)?;
    match m.version() {
        CgroupVersion::V1 => {
            assert_eq!(
                read_job_file(m, &job, "memory", "memory.limit_in_bytes")?,
                "67108864"
            );
            if m.swap_accounting() {
                assert_eq!(
                    read_job_file(m, &job, "memory", "memory.memsw.limit_in_bytes")?,
                    "67108864"
                );
            } else {
                assert_eq!(read_job_file(m, &job, "memory", "memory.swappiness")?, "0");
            }
            // TCP buffers are counted apart on v1, and only with a limit set (issue 19).
            assert!(m.tcp_accounting(), "this kernel has memory.kmem.tcp.*");
            assert_eq!(
                read_job_file(m, &job, "memory", "memory.kmem.tcp.limit_in_bytes")?,
                "67108864"
            );
            assert_eq!(
                read_job_file(m, &job, "cpu", "cpu.cfs_period_us")?,
                "100000"
            );
            assert_eq!(read_job_file(m, &job, "cpu", "cpu.cfs_quota_us")?, "50000");
            assert_eq!(read_job_file(m, &job, "pids", "pids.max")?, "8");
        }
        CgroupVersion::V2 => {
            // The controllers are enabled for the job group (not only in its parent).
            let enabled = read_job_file(m, &job, "", "cgroup.controllers")?;
            for c in ["memory", "pids", "cpu"] {
                assert!(enabled.split(' ').any(|e| e == c), "{c} not in {enabled:?}");
            }
            assert_eq!(read_job_file(m, &job, "", "memory.max")?, "67108864");
            if m.swap_accounting() {
                assert_eq!(read_job_file(m, &job, "", "memory.swap.max")?, "0");
            }
            assert_eq!(read_job_file(m, &job, "", "cpu.max")?, "50000 100000");
            assert_eq!(read_job_file(m, &job, "", "pids.max")?, "8");
        }
    }
    let paths = job.paths();
    assert!(paths.iter().all(|p| p.is_dir()));
    assert_eq!(m.job_groups()?, vec!["limits".to_owned()]);
    job.remove()?;
    assert!(paths.iter().all(|p| !p.exists()), "{paths:?}");
    assert_eq!(m.job_groups()?, Vec::<String>::new());
    Ok(())
}

#[test]
fn the_report_of_this_host_is_ready() -> Result<()> {
    if !require_real_cgroups("report") {
        return Ok(());
    }
    let h = Hierarchy::detect()?;
    let r = h.report();
    eprintln!("{r}");
    assert_eq!(r.version, h.version());
    assert!(r.ready(), "{r}");
    Ok(())
}

#[test]
fn the_report_agrees_with_the_manager_on_swap_accounting() -> Result<()> {
    let Some(p) = real_parent("swapreport")? else {
        return Ok(());
    };
    let m = &p.manager;
    let h = Hierarchy::detect()?;
    if m.version() == CgroupVersion::V1 {
        let r = h.report();
        let present = r.swap_accounting.presence == Presence::Present;
        assert_eq!(present, m.swap_accounting(), "{r}");
        let tcp = r.tcp_accounting.presence == Presence::Present;
        assert_eq!(tcp, m.tcp_accounting(), "{r}");
        return Ok(());
    }
    // v2: a process whose own cgroup does not have the memory controller enabled (its
    // parent's subtree_control lacks memory) sees no memory.* files there. The report must
    // look elsewhere rather than conclude that the kernel lacks swap accounting.
    let parent = m.parent_paths().into_iter().next().context("no parent")?;
    let with_memory = parent.join("with-memory");
    let no_memory = with_memory.join("no-memory");
    let _cleanup = RemoveDirsOnDrop(vec![with_memory.clone(), no_memory.clone()]);
    std::fs::create_dir(&with_memory)?;
    std::fs::create_dir(&no_memory)?;
    let kernel_has_swap_accounting = with_memory.join("memory.swap.max").exists();
    assert_eq!(kernel_has_swap_accounting, m.swap_accounting());
    assert!(!no_memory.join("memory.max").exists());
    let mount = Path::new("/sys/fs/cgroup");
    let own = no_memory.strip_prefix(mount)?.display().to_string();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let controllers = std::fs::read_to_string(mount.join("cgroup.controllers"))?;
    let h = Hierarchy::from_proc_files(&mountinfo, &format!("0::/{own}\n"))?
        .with_unified_controllers(&controllers);
    let r = h.report_for(&ParentSpec::Path(format!("{own}/jobs").into()));
    eprintln!("{r}");
    if kernel_has_swap_accounting {
        assert_ne!(r.swap_accounting.presence, Presence::Missing, "{r}");
    }
    if with_memory.join("memory.peak").exists() {
        assert_ne!(r.memory_peak.presence, Presence::Missing, "{r}");
    }
    Ok(())
}

/// Removes empty cgroup directories (innermost last in the list) when dropped, also when
/// the test fails.
struct RemoveDirsOnDrop(Vec<PathBuf>);

impl Drop for RemoveDirsOnDrop {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            if dir.exists() && !remove_cgroup_dir(dir) {
                eprintln!("cleanup: cannot remove {}", dir.display());
            }
        }
    }
}

/// Set in the child process of the v2 case: the cgroup it moves itself into, alone, before
/// it asks for the Auto parent.
const AUTO_CHILD_ENV: &str = "AIRLOCK_CGROUP_TEST_AUTO_CHILD";
/// This test's name, for running it again in a child process.
const AUTO_TEST: &str = "suite::limits::auto_parent_stays_inside_this_process_cgroup";

#[test]
fn auto_parent_stays_inside_this_process_cgroup() -> Result<()> {
    if let Some(dir) = std::env::var_os(AUTO_CHILD_ENV) {
        return auto_v2_child(Path::new(&dir));
    }
    if !require_real_cgroups("auto parent") {
        return Ok(());
    }
    let h = Hierarchy::detect()?;
    match h.version() {
        CgroupVersion::V1 => auto_v1(h),
        CgroupVersion::V2 => auto_v2(h),
    }
}

/// v1: `airlock` under this process's own memory cgroup.
fn auto_v1(h: Hierarchy) -> Result<()> {
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let own_memory = own
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_owned()))
        .unwrap_or_default();
    let m = CgroupManager::new(h, ParentSpec::Auto)?;
    let memory_parent = m
        .parent_paths()
        .into_iter()
        .find(|p| p.starts_with("/sys/fs/cgroup/memory"));
    let expected = Path::new("/sys/fs/cgroup/memory")
        .join(own_memory.trim_start_matches('/'))
        .join("airlock");
    assert_eq!(memory_parent, Some(expected));
    let name = format!("auto-{}", std::process::id());
    let job = m.create_job(&name, &SMALL)?;
    job.remove()?;
    assert!(!m.job_groups()?.contains(&name));
    // Another airlock on this host may use the same parent: leaving it is fine.
    if let Err(e) = m.remove_created_parents() {
        eprintln!("note: auto parent kept: {e}");
    }
    Ok(())
}

/// This process's cgroup in the unified hierarchy (the `0::` line).
fn own_unified_cgroup() -> Result<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup")?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
        .context("no 0:: line in /proc/self/cgroup")
}

/// v2: both shapes of [`ParentSpec::Auto`]. In the root cgroup (a host without systemd,
/// this VM) the parent is `/airlock`. Alone in a delegated cgroup (what `systemd-run
/// --scope -p Delegate=yes` gives) the manager moves its process into `<own>/supervisor`
/// and puts the jobs in `<own>/jobs`: that moves the calling process, so it runs in a child
/// process placed alone in a fresh cgroup.
fn auto_v2(h: Hierarchy) -> Result<()> {
    let mount = PathBuf::from("/sys/fs/cgroup");
    if own_unified_cgroup()? == "/" {
        let r = h.report();
        assert_eq!(r.parent.paths, vec![mount.join("airlock")], "{r}");
        let m = CgroupManager::new(h, ParentSpec::Auto)?;
        assert_eq!(m.parent_paths(), vec![mount.join("airlock")]);
        let name = format!("auto-{}", std::process::id());
        let job = m.create_job(&name, &SMALL)?;
        job.remove()?;
        assert!(!m.job_groups()?.contains(&name));
        if let Err(e) = m.remove_created_parents() {
            eprintln!("note: auto parent kept: {e}");
        }
        assert_eq!(
            own_unified_cgroup()?,
            "/",
            "Auto moved a root-cgroup process"
        );
    } else {
        eprintln!(
            "note: this process is not in the root cgroup; only the delegated case is exercised"
        );
    }

    // The delegated case: `<test parent>/delegated` stands for the systemd scope.
    let Some(p) = real_parent("auto")? else {
        return Ok(());
    };
    let delegated = p
        .manager
        .parent_paths()
        .into_iter()
        .next()
        .context("no parent")?
        .join("delegated");
    std::fs::create_dir(&delegated)?;
    let out = Command::new(std::env::current_exe()?)
        .args(["--exact", AUTO_TEST, "--nocapture", "--test-threads=1"])
        .env(AUTO_CHILD_ENV, &delegated)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("child:\n{stdout}{stderr}");
    // The child has exited, so its supervisor leaf is empty; remove what it left.
    let mut kept = Vec::new();
    for d in [
        delegated.join("jobs"),
        delegated.join("supervisor"),
        delegated.clone(),
    ] {
        if d.exists() && !remove_cgroup_dir(&d) {
            kept.push(d);
        }
    }
    assert!(out.status.success(), "the child failed: {:?}", out.status);
    assert!(stdout.contains("1 passed"), "the child ran no test");
    assert_eq!(kept, Vec::<PathBuf>::new(), "cgroups left behind");
    Ok(())
}

/// `rmdir` of an empty cgroup, retried for a moment while its last process is released.
fn remove_cgroup_dir(dir: &Path) -> bool {
    for _ in 0..100 {
        if std::fs::remove_dir(dir).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The child of [`auto_v2`]: alone in `delegated`, asks for the Auto parent twice.
fn auto_v2_child(delegated: &Path) -> Result<()> {
    let mount = Path::new("/sys/fs/cgroup");
    std::fs::write(delegated.join("cgroup.procs"), "0")?;
    let rel = delegated
        .strip_prefix(mount)?
        .to_string_lossy()
        .into_owned();
    assert_eq!(own_unified_cgroup()?, format!("/{rel}"));

    let h = Hierarchy::detect()?;
    let r = h.report();
    assert_eq!(r.parent.paths, vec![delegated.join("jobs")], "{r}");
    let m = CgroupManager::new(h, ParentSpec::Auto)?;
    assert_eq!(m.parent_paths(), vec![delegated.join("jobs")]);
    // This process now sits alone in the supervisor leaf.
    assert_eq!(own_unified_cgroup()?, format!("/{rel}/supervisor"));
    let procs = std::fs::read_to_string(delegated.join("supervisor/cgroup.procs"))?;
    assert_eq!(procs.trim(), std::process::id().to_string());
    ensure!(
        std::fs::read_to_string(delegated.join("cgroup.procs"))?
            .trim()
            .is_empty(),
        "the delegated cgroup still has processes of its own"
    );

    // A job under <own>/jobs gets every limit, and its process is killed with it.
    let job = m.create_job("auto-child", &SMALL)?;
    let dir = delegated.join("jobs/auto-child");
    assert_eq!(job.paths(), vec![dir.clone()]);
    let memory_max = std::fs::read_to_string(dir.join("memory.max"))?;
    assert_eq!(memory_max.trim(), SMALL.memory_bytes.to_string());
    let pids_max = std::fs::read_to_string(dir.join("pids.max"))?;
    assert_eq!(pids_max.trim(), SMALL.pids_max.to_string());
    let mut child = spawn_sleep()?;
    place(&job, child.pid())?;
    assert_eq!(members(&job)?, vec![child.pid()]);

    // A second manager in the same process finds the split already made.
    let again = CgroupManager::new(Hierarchy::detect()?, ParentSpec::Auto)?;
    assert_eq!(again.parent_paths(), vec![delegated.join("jobs")]);
    assert_eq!(again.job_groups()?, vec!["auto-child".to_owned()]);

    job.remove()?;
    if child.wait_timeout(Duration::from_secs(5))?.is_none() {
        bail!("the job's process survived remove");
    }
    assert!(!dir.exists());
    m.remove_created_parents()?;
    assert!(!delegated.join("jobs").exists());
    Ok(())
}

/// Set in the unprivileged child of the delegation test: the delegated cgroups to use.
const DELEGATION_CHILD_ENV: &str = "AIRLOCK_CGROUP_TEST_DELEGATION_CHILD";
/// That test's name, for running it again in a child process.
const DELEGATION_TEST: &str =
    "suite::limits::an_unprivileged_user_gets_only_the_delegated_controllers";
/// The unprivileged user and group the child runs as.
const UNPRIVILEGED_ID: u32 = 1000;

/// Rootless on v2: a user owns a delegated cgroup (as systemd gives `user@.service`), and
/// the report and the manager see what was delegated, not what the kernel has at the root.
#[test]
fn an_unprivileged_user_gets_only_the_delegated_controllers() -> Result<()> {
    if let Some(dirs) = std::env::var_os(DELEGATION_CHILD_ENV) {
        let dirs = PathBuf::from(dirs);
        return delegation_child(&dirs.join("full"), &dirs.join("no-cpu/user"));
    }
    let Some(p) = real_parent("delegation")? else {
        return Ok(());
    };
    if p.manager.version() == CgroupVersion::V1 {
        // Nothing to delegate: airlock uses v1 hierarchies as root only.
        return Ok(());
    }
    let base = p
        .manager
        .parent_paths()
        .into_iter()
        .next()
        .context("no parent")?;
    // full: under the test parent, which enables memory, pids and cpu for its children.
    // no-cpu/user: under a slice that enables only memory and pids.
    let full = base.join("full");
    let slice = base.join("no-cpu");
    let user = slice.join("user");
    let _cleanup = RemoveDirsOnDrop(vec![full.clone(), slice.clone(), user.clone()]);
    std::fs::create_dir(&full)?;
    std::fs::create_dir(&slice)?;
    std::fs::write(slice.join("cgroup.subtree_control"), "+memory +pids")?;
    std::fs::create_dir(&user)?;
    for dir in [&full, &user] {
        for file in [
            "",
            "cgroup.procs",
            "cgroup.threads",
            "cgroup.subtree_control",
        ] {
            let owner = Some(UNPRIVILEGED_ID);
            std::os::unix::fs::chown(dir.join(file), owner, owner)?;
        }
    }
    let out = Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            DELEGATION_TEST,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DELEGATION_CHILD_ENV, &base)
        .uid(UNPRIVILEGED_ID)
        .gid(UNPRIVILEGED_ID)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("child:\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
    for dir in [full.join("jobs"), user.join("jobs")] {
        if dir.exists() && !remove_cgroup_dir(&dir) {
            bail!("{} left behind", dir.display());
        }
    }
    assert!(out.status.success(), "the child failed: {:?}", out.status);
    assert!(stdout.contains("1 passed"), "the child ran no test");
    Ok(())
}

/// The child of the delegation test, as an unprivileged user.
fn delegation_child(full: &Path, no_cpu: &Path) -> Result<()> {
    ensure!(
        !rustix::process::geteuid().is_root(),
        "the child runs as root"
    );
    let mount = Path::new("/sys/fs/cgroup");
    let spec = |dir: &Path| -> Result<ParentSpec> {
        Ok(ParentSpec::Path(
            dir.join("jobs").strip_prefix(mount)?.to_path_buf(),
        ))
    };

    // Everything delegated: the report is ready and the user creates job groups with limits.
    let h = Hierarchy::detect()?;
    let r = h.report_for(&spec(full)?);
    assert!(r.ready(), "{r}");
    let m = CgroupManager::new(h, spec(full)?)?;
    let job = m.create_job("rootless", &SMALL)?;
    let dir = full.join("jobs/rootless");
    let memory_max = std::fs::read_to_string(dir.join("memory.max"))?;
    assert_eq!(memory_max.trim(), SMALL.memory_bytes.to_string());
    let cpu_max = std::fs::read_to_string(dir.join("cpu.max"))?;
    assert_eq!(cpu_max.trim(), "50000 100000");
    job.remove()?;
    m.remove_created_parents()?;

    // cpu not delegated: the report names the subtree_control that lacks it, and the
    // manager refuses with the controller, not a bare permission error.
    let h = Hierarchy::detect()?;
    let r = h.report_for(&spec(no_cpu)?);
    eprintln!("{r}");
    assert!(!r.ready(), "{r}");
    let missing: Vec<(&str, Option<PathBuf>)> = r
        .controllers
        .iter()
        .filter(|c| c.presence != Presence::Present)
        .map(|c| (c.name, c.location.clone()))
        .collect();
    let slice_control = no_cpu
        .parent()
        .context("no slice")?
        .join("cgroup.subtree_control");
    assert_eq!(missing, vec![("cpu", Some(slice_control))]);
    match CgroupManager::new(h, spec(no_cpu)?) {
        Err(airlock_cgroup::CgroupError::MissingController {
            controller: "cpu",
            reason,
        }) => assert!(reason.contains("delegate"), "{reason}"),
        other => bail!("expected cpu to be missing, got {other:?}"),
    }
    Ok(())
}
