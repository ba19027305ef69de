//! Nothing of a job survives it, whatever happens to it or to airlock: files, processes,
//! containers, job directories (kube: Pods; airlock keeps no directory on the host).

use std::path::{Path, PathBuf};

use pretty_assertions::assert_eq;

use super::common::{
    Kind, Target, airlock_containers, eventually, host_pids_with, kube_api, kube_pods,
    kube_pods_of, marker,
};

/// Where a job's directory is on the host, per backend (kube has none).
fn runtime_dir(kind: Kind) -> &'static Path {
    if kind.is_container() {
        Path::new("/run/airlock-docker")
    } else {
        Path::new("/run/airlock")
    }
}

/// The job id of the running Pod whose source carries `tag` (in its annotation).
fn kube_running_job_with(tag: &str) -> Option<String> {
    kube_pods().into_iter().find_map(|pod| {
        let source = pod["metadata"]["annotations"]["airlock.dev/in-0"].as_str()?;
        let running = pod["status"]["phase"] == "Running";
        (running && source.contains(tag))
            .then(|| {
                pod["metadata"]["labels"]["airlock.job"]
                    .as_str()
                    .map(str::to_owned)
            })
            .flatten()
    })
}

fn job_dir_with(kind: Kind, tag: &str) -> Option<PathBuf> {
    let runtime = runtime_dir(kind);
    let by_source = std::fs::read_dir(runtime)
        .ok()?
        .flatten()
        .find_map(|entry| {
            let source =
                std::fs::read_to_string(entry.path().join("work/.airlock-main.py")).ok()?;
            source.contains(tag).then(|| entry.path())
        });
    // A native job's /work is a tmpfs mounted nowhere on the host (docs/native.md).
    by_source.or_else(|| airlock_testkit::job_dir_of(runtime, &host_pids_with(tag)))
}

/// Starts a long job carrying `tag` and waits until it runs (its directory exists, and
/// for containers its container too). Returns the job's directory name: its job id, or
/// for a warm sandbox the sandbox's own name (it was started before the job had an id).
fn start_long_job(t: &Target, tag: &str, policy: &Path) -> (std::process::Child, String) {
    let source = format!("import time\n# {tag}\nprint('started', flush=True)\ntime.sleep(1000)");
    let child = t
        .cmd()
        .args(["run", "--json"])
        .args(t.backend_args(&["-c", &source]))
        .arg("--policy")
        .arg(policy)
        .args(["-c", &source, "--", tag])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut job = String::new();
    let started = eventually(30, || {
        if t.kind.base() == Kind::Kube {
            let Some(id) = kube_running_job_with(tag) else {
                return false;
            };
            job = id;
            return !airlock_containers(t.kind, Some(&job)).is_empty();
        }
        let Some(dir) = job_dir_with(t.kind, tag) else {
            return false;
        };
        job = dir.file_name().unwrap().to_string_lossy().into_owned();
        if t.kind.is_container() {
            !airlock_containers(t.kind, Some(&job)).is_empty()
        } else {
            host_pids_with(tag).len() >= 2
        }
    });
    assert!(started, "the job never started");
    // Give the program a moment past the container's creation.
    std::thread::sleep(std::time::Duration::from_millis(500));
    (child, job)
}

fn assert_nothing_left(t: &Target, tag: &str, job: &str) {
    assert!(
        eventually(10, || host_pids_with(tag).is_empty()),
        "job processes survived: {:?}",
        host_pids_with(tag)
    );
    if t.kind.base() == Kind::Kube {
        // airlock returns once the Pod is gone from the API, which the kubelet allows only
        // after it has stopped and removed the container.
        assert_eq!(
            kube_pods_of(job),
            Vec::<serde_json::Value>::new(),
            "pod of job {job} left behind"
        );
    } else {
        assert!(
            !runtime_dir(t.kind).join(job).exists(),
            "job directory {job} left behind"
        );
        // By content too: a warm sandbox's directory is named for the sandbox, not the job.
        assert_eq!(
            job_dir_with(t.kind, tag),
            None,
            "the job's directory left behind"
        );
    }
    if t.kind.is_native() {
        assert!(
            !airlock_testkit::cgroup_dir_names().contains(job),
            "the cgroup of job {job} left behind"
        );
    }
    if t.kind.is_container() {
        assert_eq!(
            airlock_containers(t.kind, Some(job)),
            Vec::<String>::new(),
            "container of job {job} left behind"
        );
    }
}

/// airlock gets `signal` while a job runs: it kills the job, removes everything, prints an
/// error observation naming the signal and writes the audit line.
fn interrupted_airlock_kills_the_job_cleans_up_and_audits(
    t: &Target,
    signal: rustix::process::Signal,
    name: &str,
) {
    let tag = marker(&name.to_lowercase());
    let (child, job) = start_long_job(t, &tag, &t.policy_with("timeout = \"60s\"", "", ""));
    rustix::process::kill_process(rustix::process::Pid::from_child(&child), signal).unwrap();
    let run = super::common::json_run(child.wait_with_output().unwrap());
    assert_eq!(run.obs["outcome"], "error", "{:#}", run.obs);
    let message = run.obs["error"]["message"].as_str().unwrap();
    assert!(message.contains(name), "{message}");
    assert_eq!(run.code, 125);
    if t.kind.is_warm() {
        assert!(job.starts_with("warm-"), "{job}");
    } else {
        assert_eq!(run.obs["job_id"], job.as_str());
    }
    // Right when airlock has exited: its own shutdown path removed everything.
    assert_eq!(
        host_pids_with(&tag),
        Vec::<u32>::new(),
        "job processes survived"
    );
    assert_nothing_left(t, &tag, &job);
    let audit = t.audit_lines();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0]["job_id"], run.obs["job_id"]);
}

conformance! {
    fn files_written_by_one_job_are_absent_in_the_next(t: &Target) {
        let policy = t.policy_with("", "workdir = \"rw\"", "");
        let write = "for p in ['/tmp/mark', '/dev/shm/mark', '/work/mark']:\n    open(p, 'w').write('x')\nprint('written')";
        let run = t.run_with(&policy, &["-c", write]);
        assert_eq!(run.obs["stdout"], "written\n", "{:#}", run.obs);
        let check = "import os\nprint([p for p in ['/tmp/mark', '/dev/shm/mark', '/work/mark'] if os.path.exists(p)])";
        let run = t.run_with(&policy, &["-c", check]);
        assert_eq!(run.obs["stdout"], "[]\n", "{:#}", run.obs);
    }

    fn a_timed_out_job_leaves_nothing(t: &Target) {
        let tag = marker("timeout");
        let source = format!("import time\n# {tag}\ntime.sleep(1000)");
        let run = t.run(&["--timeout", "1s", "-c", &source, "--", &tag]);
        assert_eq!(run.obs["outcome"], "timeout", "{:#}", run.obs);
        assert_nothing_left(t, &tag, run.obs["job_id"].as_str().unwrap());
    }

    fn sigterm_kills_the_job_cleans_up_and_audits(t: &Target) {
        interrupted_airlock_kills_the_job_cleans_up_and_audits(t, rustix::process::Signal::TERM, "SIGTERM");
    }

    fn sigint_kills_the_job_cleans_up_and_audits(t: &Target) {
        // Ctrl-C at a terminal.
        interrupted_airlock_kills_the_job_cleans_up_and_audits(t, rustix::process::Signal::INT, "SIGINT");
    }

    fn a_killed_airlock_is_swept_by_the_next_run(t: &Target) {
        let tag = marker("sigkill");
        if t.kind.base() == Kind::Kube {
            return killed_airlock_leaves_its_pod_to_the_kubelet_deadline(t, &tag);
        }
        let (mut child, job) = start_long_job(t, &tag, &t.policy_with("timeout = \"60s\"", "", ""));
        child.kill().unwrap();
        child.wait().unwrap();
        // The next airlock run removes what the dead one left (or a test running in
        // parallel already did).
        let run = t.run(&["-c", "pass"]);
        assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
        assert_nothing_left(t, &tag, &job);
    }

}

/// Start failures exist only where a runtime starts a container (the native backend has no
/// runtime; it finds a missing interpreter before it creates anything: `bad_input` tests
/// that).
mod start {
    use pretty_assertions::assert_eq;

    use super::super::common::{Kind, Target, marker};
    use super::{a_pod_whose_image_is_missing_fails_and_is_removed, assert_nothing_left};

    fn assert_start_failed_and_nothing_left(t: &Target, policy: &std::path::Path) {
        let tag = marker("nostart");
        let source = format!("# {tag}\nprint('never')");
        let run = t.run_with(policy, &["-c", &source]);
        assert_eq!(run.obs["outcome"], "error", "{:#}", run.obs);
        assert_eq!(run.obs["error"]["kind"], "internal", "{:#}", run.obs);
        let message = run.obs["error"]["message"].as_str().unwrap();
        // Podman runs the OCI runtime when airlock attaches to the created container,
        // Docker when it starts it.
        let step = if t.kind.base() == Kind::Podman {
            "attach to container"
        } else {
            "start container"
        };
        assert!(message.contains(step), "{message}");
        assert_nothing_left(t, &tag, run.obs["job_id"].as_str().unwrap());
    }

    conformance_on! {
        [docker: Docker, gvisor: Gvisor, podman: Podman, kube: Kube,
         warm_docker: WarmDocker, warm_gvisor: WarmGvisor, warm_podman: WarmPodman]
        fn a_container_that_fails_to_start_is_removed(t: &Target) {
            if t.kind.base() == Kind::Kube {
                return a_pod_whose_image_is_missing_fails_and_is_removed(t);
            }
            // A runtime that fails when the container starts, registered by
            // scripts/ci/docker.sh: /bin/false with dockerd, runsc asked for a platform that
            // does not exist for gvisor; for podman, whose Docker-compatible API ignores the
            // runtime a request names, a second service with /bin/false as its default.
            let policy = match t.kind.base() {
                Kind::Gvisor => t.policy_with("", "", "gvisor_runtime = \"airlock-broken-runsc\""),
                Kind::Podman => {
                    let broken = std::env::var("AIRLOCK_PODMAN_BROKEN_SOCKET").unwrap_or_default();
                    airlock_testkit::require!(
                        !broken.is_empty() && std::path::Path::new(&broken).exists(),
                        "AIRLOCK_PODMAN_BROKEN_SOCKET names no socket (scripts/ci/docker.sh starts a Podman service with a failing default runtime)"
                    );
                    t.policy_on_podman_socket(std::path::Path::new(&broken), "")
                }
                _ => t.policy_with("", "", "runtime = \"airlock-broken\""),
            };
            assert_start_failed_and_nothing_left(t, &policy);
        }
    }
}

/// kube's form of "swept by the next run": another airlock (a second `serve` replica) may
/// own any running Pod, so the next run never deletes one; a Pod whose airlock died is
/// ended by the kubelet at its `activeDeadlineSeconds` (timeout + `start_timeout` + 30 s),
/// and its object deleted by the janitor a minute after that (docs/kube.md). The janitor's
/// rule is unit-tested; this waits for the kubelet's end of it.
fn killed_airlock_leaves_its_pod_to_the_kubelet_deadline(t: &Target, tag: &str) {
    // The shortest backstop: a 3 s job, 5 s to start, so the kubelet ends it 38 s after
    // its start.
    let policy = t.kube_policy_with("timeout = \"3s\"", "start_timeout = \"5s\"\n");
    let (mut child, job) = start_long_job(t, tag, &policy);
    child.kill().unwrap();
    child.wait().unwrap();
    let run = t.run(&["-c", "pass"]);
    assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
    let pods = kube_pods_of(&job);
    assert_eq!(
        pods.len(),
        1,
        "the next run touched the orphan pod: {pods:#?}"
    );
    let deadline = pods[0]["spec"]["activeDeadlineSeconds"].as_u64().unwrap();
    assert_eq!(deadline, 3 + 5 + 30, "{:#}", pods[0]);
    // Killed at the deadline, counted from the Pod's start (a few seconds ago).
    let ended = eventually(deadline + 10, || {
        kube_pods_of(&job)
            .first()
            .is_some_and(|p| p["status"]["phase"] == "Failed")
    });
    assert!(
        ended,
        "the kubelet never ended the orphan pod: {:#?}",
        kube_pods_of(&job)
    );
    let pod = kube_pods_of(&job).remove(0);
    assert_eq!(pod["status"]["reason"], "DeadlineExceeded", "{pod:#}");
    assert_eq!(
        host_pids_with(tag),
        Vec::<u32>::new(),
        "job processes survived"
    );
    assert_eq!(airlock_containers(t.kind, Some(&job)), Vec::<String>::new());
    // What the janitor would do a minute later; the Pod object would outlive this test.
    let name = pod["metadata"]["name"].as_str().unwrap();
    kube_api(
        "DELETE",
        &format!(
            "/api/v1/namespaces/{}/pods/{name}",
            super::common::KUBE_NAMESPACE
        ),
    );
    assert_eq!(kube_pods_of(&job), Vec::<serde_json::Value>::new());
}

/// kube's form of a container that fails to start: the node cannot get the image (the
/// kubelet reports `ErrImagePull`). The job is an error naming the reason, and its Pod is
/// deleted (no container was ever created).
fn a_pod_whose_image_is_missing_fails_and_is_removed(t: &Target) {
    let missing = format!("airlock-kube-absent:1@sha256:{}", "e".repeat(64));
    let policy = t.path().join("missing-image.toml");
    std::fs::write(
        &policy,
        format!(
            "version = \"test-1\"\n[filesystem]\nrootfs = \"image:{missing}\"\n{}",
            t.kube_section()
        ),
    )
    .unwrap();
    let tag = marker("nostart");
    let source = format!("# {tag}\nprint('never')");
    let run = t.run_with(&policy, &["-c", &source]);
    assert_eq!(run.obs["outcome"], "error", "{:#}", run.obs);
    assert_eq!(run.obs["error"]["kind"], "internal", "{:#}", run.obs);
    let message = run.obs["error"]["message"].as_str().unwrap();
    assert!(message.contains("ErrImagePull"), "{message}");
    assert_nothing_left(t, &tag, run.obs["job_id"].as_str().unwrap());
}
