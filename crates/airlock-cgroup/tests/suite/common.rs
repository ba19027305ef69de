//! Shared set-up: a real manager under a parent unique to the test, children that are
//! always reaped, and placement by writing the pid into every `cgroup.procs`.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use airlock_cgroup::{CgroupManager, CgroupVersion, Hierarchy, JobCgroup, JobLimits, ParentSpec};
use anyhow::{Context, Result, bail};

/// A manager whose parent directories are removed when the test ends.
pub struct TestParent {
    pub manager: CgroupManager,
}

impl Drop for TestParent {
    fn drop(&mut self) {
        if let Err(e) = self.manager.remove_created_parents() {
            eprintln!("cleanup: {e:#}");
        }
    }
}

/// Reports that `test` cannot run here and returns `false`, so the caller returns early.
///
/// Under `AIRLOCK_REQUIRE_ALL=1` (set by `scripts/test.sh` and the cgroup v2 VM) it panics
/// instead: in CI a skipped test must never count as passed. The skip is also appended to
/// the file named by `AIRLOCK_SKIP_LOG`, as airlock-testkit's `require!` does.
pub fn skip(test: &str, reason: &str) -> bool {
    if std::env::var("AIRLOCK_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!("{test}: required but missing (AIRLOCK_REQUIRE_ALL=1): {reason}");
    }
    eprintln!("skipped: {test}: {reason}");
    if let Some(path) = std::env::var_os("AIRLOCK_SKIP_LOG")
        && let Ok(mut file) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
    {
        let _ = writeln!(file, "airlock-cgroup {test}: {reason}");
    }
    false
}

/// Whether the real tests can run here; when not, reports why through [`skip`].
pub fn require_real_cgroups(test: &str) -> bool {
    match skip_reason() {
        Some(reason) => skip(test, &reason),
        None => true,
    }
}

/// Whether `/usr/bin/python3` exists (the fork bomb and the memory hog are Python).
pub fn require_python(test: &str) -> bool {
    Path::new(PYTHON).exists() || skip(test, "/usr/bin/python3 is missing")
}

/// The interpreter of the fork bomb and the memory hog.
pub const PYTHON: &str = "/usr/bin/python3";

/// Why this host cannot run the real tests, if it cannot.
pub fn skip_reason() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("needs root to create cgroups".to_owned());
    }
    if !Path::new("/sys/fs/cgroup").is_dir() {
        return Some("no cgroup filesystem at /sys/fs/cgroup".to_owned());
    }
    match Hierarchy::detect() {
        Ok(h) => {
            let r = h.report();
            if r.controllers
                .iter()
                .any(|c| c.presence != airlock_cgroup::Presence::Present)
            {
                return Some(format!("cgroup controllers missing:\n{r}"));
            }
            None
        }
        Err(e) => Some(format!("no usable cgroup hierarchy: {e}")),
    }
}

/// A real manager under `airlock-test-<test>-<pid>` at each mount root, or `None` (after
/// reporting why through [`skip`]) when the host cannot run it.
pub fn real_parent(test: &str) -> Result<Option<TestParent>> {
    if !require_real_cgroups(test) {
        return Ok(None);
    }
    let h = Hierarchy::detect()?;
    let spec = ParentSpec::Path(format!("airlock-test-{test}-{}", std::process::id()).into());
    let manager = CgroupManager::new(h, spec).context("create test parent")?;
    Ok(Some(TestParent { manager }))
}

/// A child process that is killed and reaped when dropped, if still running.
pub struct Reaped(pub Child);

impl Reaped {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Waits up to `timeout` for the child to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait()? {
                return Ok(Some(status));
            }
            if start.elapsed() > timeout {
                return Ok(None);
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Writes a line to the child's stdin (the `read x` gate of the shell snippets).
    pub fn release(&mut self) -> Result<()> {
        let stdin = self.0.stdin.as_mut().context("child has no stdin")?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
        Ok(())
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// `sleep 30`.
pub fn spawn_sleep() -> Result<Reaped> {
    Ok(Reaped(Command::new("sleep").arg("30").spawn()?))
}

/// `sh -c SCRIPT` with piped stdin (the script starts with `read x` and waits for
/// [`Reaped::release`]), piped stdout and stderr.
pub fn spawn_gated_shell(script: &str) -> Result<Reaped> {
    Ok(Reaped(
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?,
    ))
}

/// Moves `pid` into the job's group in every hierarchy, as the sandbox helper does with `0`.
pub fn place(job: &JobCgroup, pid: u32) -> Result<()> {
    for f in job.procs_files() {
        std::fs::write(&f, pid.to_string()).with_context(|| format!("write {}", f.display()))?;
    }
    Ok(())
}

/// The pids listed in the job's first `cgroup.procs`.
pub fn members(job: &JobCgroup) -> Result<Vec<u32>> {
    let Some(f) = job.procs_files().into_iter().next() else {
        bail!("job has no cgroup.procs");
    };
    let text = std::fs::read_to_string(&f)?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Reads one cgroupfs file of the job, trimmed, from the directory serving `v1_dir_hint`
/// (v1: the directory whose path contains it; v2: the single directory).
pub fn read_job_file(
    m: &CgroupManager,
    job: &JobCgroup,
    v1_dir_hint: &str,
    file: &str,
) -> Result<String> {
    let dir = match m.version() {
        CgroupVersion::V2 => job.paths().into_iter().next(),
        CgroupVersion::V1 => job
            .paths()
            .into_iter()
            .find(|p| p.to_string_lossy().contains(v1_dir_hint)),
    }
    .context("no job directory")?;
    let path = dir.join(file);
    Ok(std::fs::read_to_string(&path)
        .with_context(|| format!("read {}", path.display()))?
        .trim()
        .to_owned())
}

pub const SMALL: JobLimits = JobLimits {
    memory_bytes: 64 << 20,
    cpu_millis: 500,
    pids_max: 16,
};
