//! Nothing of a job survives it, over many jobs: cgroups, mounts, directories. One job's
//! cleanup (timeout, SIGTERM, SIGINT, SIGKILL of airlock and the next run's sweep, files of
//! one job in the next) is checked on every backend in airlock-conformance.

use std::collections::BTreeSet;
use std::path::Path;

use pretty_assertions::assert_eq;

use super::common::TestEnv;
use crate::require_native;

/// Directory names below every cgroup mount (depth-limited).
fn cgroup_dir_names() -> BTreeSet<String> {
    fn walk(dir: &Path, depth: usize, out: &mut BTreeSet<String>) {
        if depth == 0 {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.insert(entry.file_name().to_string_lossy().into_owned());
                walk(&entry.path(), depth - 1, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(Path::new("/sys/fs/cgroup"), 8, &mut out);
    out
}

#[test]
fn two_hundred_jobs_leave_nothing_behind() {
    require_native!();
    let env = TestEnv::new();
    let mut ids = Vec::new();
    for i in 0..200 {
        // Every tenth job leaves a background process running when it exits.
        let source = if i % 10 == 0 {
            "sleep 100 &\necho $!"
        } else {
            "echo $$"
        };
        let run = env.run_json(&["-l", "sh", "-c", source]);
        assert_eq!(run.obs["ok"], true, "job {i}: {:#}", run.obs);
        ids.push(run.obs["job_id"].as_str().unwrap().to_owned());
    }
    // Every job process lived in the job's cgroup; a cgroup that is gone held nothing.
    let cgroups = cgroup_dir_names();
    let leaked: Vec<&String> = ids.iter().filter(|id| cgroups.contains(*id)).collect();
    assert_eq!(leaked, Vec::<&String>::new(), "cgroups left behind");
    // No job directory.
    let runtime = Path::new("/run/airlock");
    let leftovers: Vec<&String> = ids.iter().filter(|id| runtime.join(id).exists()).collect();
    assert_eq!(
        leftovers,
        Vec::<&String>::new(),
        "job directories left behind"
    );
    // No mount in the host's mount namespace refers to a job.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for id in &ids {
        assert!(
            !mountinfo.contains(id.as_str()),
            "mount of job {id} left behind"
        );
    }
    // No process is still in any of these jobs' cgroups or working directories.
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cgroup) = std::fs::read_to_string(entry.path().join("cgroup")) {
            for id in &ids {
                assert!(
                    !cgroup.contains(id.as_str()),
                    "process {:?} in job {id}",
                    entry.file_name()
                );
            }
        }
    }
    assert_eq!(env.audit_lines().len(), 200);
}
