//! `kill_all` kills what is in the group and nothing else; `Drop` cleans up.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use pretty_assertions::assert_eq;

use super::common::{PYTHON, SMALL, members, place, real_parent, require_python, spawn_sleep};

/// How long the fork bomb may take to pass 16 processes.
const BOMB_GROW_TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn kill_all_kills_every_member_and_spares_outsiders() -> Result<()> {
    let Some(p) = real_parent("kill")? else {
        return Ok(());
    };
    let job = p.manager.create_job("kill", &SMALL)?;
    let mut inside = vec![spawn_sleep()?, spawn_sleep()?, spawn_sleep()?];
    let mut outsider = spawn_sleep()?;
    for c in &inside {
        place(&job, c.pid())?;
    }
    let mut listed = members(&job)?;
    listed.sort_unstable();
    let mut expected: Vec<u32> = inside.iter().map(|c| c.pid()).collect();
    expected.sort_unstable();
    assert_eq!(listed, expected);
    assert!(!job.wait_empty(Duration::from_millis(50))?);

    job.kill_all()?;
    for c in &mut inside {
        let status = c
            .wait_timeout(Duration::from_secs(5))?
            .context("member survived")?;
        assert_eq!(status.signal(), Some(9));
    }
    assert!(job.wait_empty(Duration::from_secs(2))?);
    assert_eq!(outsider.0.try_wait()?, None, "the outsider was killed");
    job.remove()?;
    outsider.0.kill()?;
    Ok(())
}

#[test]
fn dropping_a_job_kills_and_removes_it() -> Result<()> {
    let Some(p) = real_parent("drop")? else {
        return Ok(());
    };
    let job = p.manager.create_job("dropped", &SMALL)?;
    let mut child = spawn_sleep()?;
    place(&job, child.pid())?;
    let paths = job.paths();
    drop(job);
    let status = child
        .wait_timeout(Duration::from_secs(5))?
        .context("member survived drop")?;
    assert_eq!(status.signal(), Some(9));
    assert!(paths.iter().all(|p| !p.exists()), "{paths:?}");
    Ok(())
}

#[test]
fn kill_all_stops_a_fork_bomb() -> Result<()> {
    if !require_python("bomb") {
        return Ok(());
    }
    let Some(p) = real_parent("bomb")? else {
        return Ok(());
    };
    let limits = airlock_cgroup::JobLimits {
        memory_bytes: 256 << 20,
        cpu_millis: 500,
        pids_max: 32,
    };
    let job = p.manager.create_job("bomb", &limits)?;
    // Every process forks in a loop and ignores failures, so the group stays at pids.max
    // and new processes keep appearing while the sweep runs.
    let mut sh = super::common::spawn_gated_shell(&format!(
        "read x; exec {PYTHON} -c '\nimport os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n'"
    ))?;
    place(&job, sh.pid())?;
    sh.release()?;
    // Wait for the bomb to grow rather than for a fixed time: under emulation (the cgroup
    // v2 VM) the interpreter alone takes most of a second to start.
    let started = Instant::now();
    let mut population = members(&job)?.len();
    while population <= 16 && started.elapsed() < BOMB_GROW_TIMEOUT {
        std::thread::sleep(Duration::from_millis(20));
        population = members(&job)?.len();
    }
    assert!(
        population > 16,
        "the bomb did not grow within {BOMB_GROW_TIMEOUT:?}: {population} processes"
    );
    // Let it run at the limit for a moment, so the sweep meets processes that keep forking.
    std::thread::sleep(Duration::from_millis(100));
    job.kill_all()?;
    assert!(job.wait_empty(Duration::from_secs(2))?);
    sh.wait_timeout(Duration::from_secs(5))?
        .context("root shell survived")?;
    job.remove()?;
    Ok(())
}

/// A group no job of this supervisor explains may be another supervisor's live job (two
/// airlocks, two runtime directories, one cgroup parent): the orphan sweep removes it only
/// when it is empty and old, and never kills what is in it.
#[test]
fn an_orphaned_group_is_removed_only_when_empty_and_old() -> Result<()> {
    let Some(p) = real_parent("orphan")? else {
        return Ok(());
    };
    let job = p.manager.create_job("orphan", &SMALL)?;
    let mut member = spawn_sleep()?;
    place(&job, member.pid())?;
    let paths = job.paths();
    assert!(!p.manager.remove_orphaned_group("orphan", Duration::ZERO)?);
    assert_eq!(
        member.0.try_wait()?,
        None,
        "a member of another's job was killed"
    );
    assert!(paths.iter().all(|p| p.exists()), "{paths:?}");

    job.kill_all()?;
    member
        .wait_timeout(Duration::from_secs(5))?
        .context("member survived")?;
    assert!(job.wait_empty(Duration::from_secs(2))?);
    assert!(
        !p.manager
            .remove_orphaned_group("orphan", Duration::from_secs(3600))?
    );
    assert!(
        paths.iter().all(|p| p.exists()),
        "a new group was removed: {paths:?}"
    );

    assert!(p.manager.remove_orphaned_group("orphan", Duration::ZERO)?);
    assert!(paths.iter().all(|p| !p.exists()), "{paths:?}");
    drop(job);
    Ok(())
}
