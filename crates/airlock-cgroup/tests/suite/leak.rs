//! Nothing is left behind after many jobs.

use std::time::Duration;

use anyhow::{Context, Result};
use pretty_assertions::assert_eq;

use super::common::{SMALL, place, real_parent, spawn_sleep};

const JOBS: usize = 200;

#[test]
fn two_hundred_jobs_leave_no_group_behind() -> Result<()> {
    let Some(p) = real_parent("leak")? else {
        return Ok(());
    };
    let m = &p.manager;
    for i in 0..JOBS {
        let job = m.create_job(&format!("leak-{i}"), &SMALL)?;
        // Every 20th job still holds a process when it is removed.
        if i % 20 == 0 {
            let mut child = spawn_sleep()?;
            place(&job, child.pid())?;
            job.remove()?;
            child
                .wait_timeout(Duration::from_secs(5))?
                .context("member survived remove")?;
        } else {
            job.remove()?;
        }
    }
    assert_eq!(m.job_groups()?, Vec::<String>::new());
    Ok(())
}
