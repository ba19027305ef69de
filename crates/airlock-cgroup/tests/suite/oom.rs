//! A memory hog is OOM-killed at the limit, and the stats say so.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use airlock_cgroup::JobLimits;
use anyhow::{Context, Result};
use pretty_assertions::assert_eq;

use super::common::{PYTHON, place, real_parent, require_python, spawn_gated_shell};

const LIMIT_BYTES: u64 = 64 << 20;

#[test]
fn memory_hog_is_oom_killed_and_counted() -> Result<()> {
    if !require_python("oom") {
        return Ok(());
    }
    let Some(p) = real_parent("oom")? else {
        return Ok(());
    };
    let limits = JobLimits {
        memory_bytes: LIMIT_BYTES,
        cpu_millis: 1000,
        pids_max: 16,
    };
    let job = p.manager.create_job("hog", &limits)?;
    let mut sh = spawn_gated_shell(&format!(
        "read x; exec {PYTHON} -c 'b = bytearray(512 * 1024 * 1024); print(len(b))'"
    ))?;
    place(&job, sh.pid())?;
    sh.release()?;
    let status = sh
        .wait_timeout(Duration::from_secs(30))?
        .context("the hog was not killed within 30 s")?;
    assert_eq!(status.signal(), Some(9), "{status:?}");

    let stats = job.stats()?;
    eprintln!("{stats:?}");
    assert!(stats.oom_kills >= 1, "{stats:?}");
    let peak = stats.peak_memory_bytes.context("no peak memory")?;
    assert!(peak <= LIMIT_BYTES, "peak {peak} above the limit");
    assert!(
        peak >= LIMIT_BYTES * 9 / 10,
        "peak {peak} far below the limit"
    );
    assert!(
        stats.cpu_time.is_some_and(|t| t > Duration::ZERO),
        "{stats:?}"
    );
    job.remove()?;
    Ok(())
}
