//! Nothing of a job survives it: files, processes, cgroups, mounts, directories.

use std::collections::BTreeSet;
use std::path::Path;

use pretty_assertions::assert_eq;

use super::common::TestEnv;
use crate::require_native;

#[test]
fn files_written_by_one_job_are_absent_in_the_next() {
    require_native!();
    let env = TestEnv::new();
    let policy = env.policy("[filesystem]\nworkdir = \"rw\"");
    let policy = policy.to_str().unwrap();
    let write = "for p in ['/tmp/mark', '/dev/shm/mark', '/work/mark']:\n    open(p, 'w').write('x')\nprint('written')";
    let run = env.run_json(&["--policy", policy, "-c", write]);
    assert_eq!(run.obs["stdout"], "written\n", "{:#}", run.obs);
    let check = "import os\nprint([p for p in ['/tmp/mark', '/dev/shm/mark', '/work/mark'] if os.path.exists(p)])";
    let run = env.run_json(&["--policy", policy, "-c", check]);
    assert_eq!(run.obs["stdout"], "[]\n", "{:#}", run.obs);
}

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

/// Waits up to `secs` for `check` to hold.
fn eventually(secs: u64, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    check()
}

/// Starts a long job whose processes carry `tag`, and waits until it runs.
fn start_long_job(env: &TestEnv, tag: &str) -> std::process::Child {
    let source = format!("import time\n# {tag}\ntime.sleep(1000)");
    let child = env
        .cmd()
        .args(["run", "--json", "-c", &source, "--", tag])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The CLI carries the tag too; the job's own process makes a second one.
    assert!(
        eventually(10, || super::common::host_pids_with(tag).len() >= 2
            && job_dir_with(tag).is_some()),
        "the job never started"
    );
    child
}

fn job_dir_with(tag: &str) -> Option<std::path::PathBuf> {
    std::fs::read_dir("/run/airlock")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let source = std::fs::read_to_string(entry.path().join("work/main.py")).ok()?;
            source.contains(tag).then(|| entry.path())
        })
}

#[test]
fn sigterm_kills_the_job_cleans_up_and_audits() {
    require_native!();
    let env = TestEnv::new();
    let tag = super::common::marker("sigterm");
    let child = start_long_job(&env, &tag);
    let dir = job_dir_with(&tag).expect("the job's directory");
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let run = super::common::json_run(out);
    assert_eq!(run.obs["outcome"], "error", "{:#}", run.obs);
    let message = run.obs["error"]["message"].as_str().unwrap();
    assert!(message.contains("SIGTERM"), "{message}");
    assert_eq!(run.code, 125);
    assert_eq!(super::common::host_pids_with(&tag), Vec::<u32>::new());
    assert!(!dir.exists(), "{} left behind", dir.display());
    let audit = env.audit_lines();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0]["job_id"], run.obs["job_id"]);
}

#[test]
fn a_killed_supervisor_takes_its_job_along_and_the_next_run_sweeps_up() {
    require_native!();
    let env = TestEnv::new();
    let tag = super::common::marker("sigkill");
    let mut child = start_long_job(&env, &tag);
    let dir = job_dir_with(&tag).expect("the job's directory");
    let job_id = dir.file_name().unwrap().to_string_lossy().into_owned();
    child.kill().unwrap();
    child.wait().unwrap();
    // The helper dies with the supervisor, the sandbox's pid 1 with the helper, and every
    // job process with its pid 1.
    assert!(
        eventually(5, || super::common::host_pids_with(&tag).is_empty()),
        "job processes outlived their supervisor"
    );
    // Nobody removed the directory and cgroup; the next airlock run does (or one of the
    // tests running in parallel already did).
    let run = env.run_json(&["-c", "pass"]);
    assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
    assert!(
        !dir.exists(),
        "stale job directory {} not swept",
        dir.display()
    );
    assert!(
        !cgroup_dir_names().contains(&job_id),
        "stale cgroup {job_id} not swept"
    );
}
