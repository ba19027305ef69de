//! pids.max holds a shell that forks in a loop.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use airlock_cgroup::JobLimits;
use anyhow::{Context, Result};

use super::common::{members, place, real_parent, spawn_gated_shell};

#[test]
fn pids_max_stops_a_forking_shell() -> Result<()> {
    let Some(p) = real_parent("pids")? else {
        return Ok(());
    };
    let limits = JobLimits {
        memory_bytes: 64 << 20,
        cpu_millis: 500,
        pids_max: 8,
    };
    let job = p.manager.create_job("forks", &limits)?;
    // The sleeps do not hold the shell's pipes, so stdout ends when the shell does. dash
    // exits on the failed fork; a shell that carries on prints `done` and waits.
    let mut sh = spawn_gated_shell(
        "read x; i=0; while [ $i -lt 20 ]; do sleep 30 >/dev/null 2>&1 & i=$((i+1)); done; \
         echo done; wait",
    )?;
    place(&job, sh.pid())?;
    sh.release()?;
    let stdout = sh.0.stdout.take().context("stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let inside = members(&job)?.len();
    assert!(
        (7..=8).contains(&inside),
        "{inside} processes: pids.max = 8 holds the shell and 7 sleeps"
    );

    job.kill_all()?;
    let status = sh
        .wait_timeout(Duration::from_secs(5))?
        .context("shell survived")?;
    assert!(
        status.signal() == Some(9) || status.code().is_some_and(|c| c != 0),
        "{status:?}"
    );
    assert!(job.wait_empty(Duration::from_secs(2))?);
    let mut stderr = String::new();
    sh.0.stderr
        .take()
        .context("stderr")?
        .read_to_string(&mut stderr)?;
    assert!(
        stderr.contains("fork"),
        "no fork failure reported: {stderr:?}"
    );
    job.remove()?;
    Ok(())
}
