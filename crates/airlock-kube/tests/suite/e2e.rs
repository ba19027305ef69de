//! End to end through a fake cluster (`fake/`): the kube backend creates real Pods on a
//! fake API server, whose test kubelet runs each as a real container on this machine's
//! Docker daemon. Needs root, a Docker daemon and `$AIRLOCK_TEST_IMAGE` (REF@sha256:…, the
//! image `scripts/ci/docker.sh` builds), so the tests are `#[ignore]`d in the workspace run
//! and run by `scripts/ci/kube.sh` (`--run-ignored only`) once Docker is up; there a
//! missing requirement fails the test (`AIRLOCK_REQUIRE_ALL=1`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use airlock_core::policy::KubeLogStreams;
use airlock_core::{
    InputFile, JobRequest, JobSpec, LimitsRequest, Outcome, Policy, RunReport, Termination,
};
use airlock_kube::KubeBackend;
use bollard::query_parameters::ListContainersOptions;
use pretty_assertions::assert_eq;

use super::common::policy;
use super::fake::kubelet::LABEL_FAKE;
use super::fake::{Clients, FakeCluster};

fn socket() -> PathBuf {
    std::env::var_os("AIRLOCK_DOCKER_SOCKET")
        .map_or_else(|| PathBuf::from("/var/run/docker.sock"), PathBuf::from)
}

fn missing() -> Option<String> {
    if !airlock_testkit::require::is_root() {
        return Some("the fake kubelet writes volumes under /run and needs root".into());
    }
    if std::env::var("AIRLOCK_TEST_IMAGE").map_or(true, |v| v.is_empty()) {
        return Some("AIRLOCK_TEST_IMAGE is not set (scripts/ci/docker.sh builds one)".into());
    }
    if !socket().exists() {
        return Some(format!("no Docker daemon at {}", socket().display()));
    }
    None
}

struct Env {
    cluster: FakeCluster,
    policy: Policy,
}

impl Env {
    async fn new(streams: KubeLogStreams) -> Self {
        let mut policy = policy();
        policy.kube.image = std::env::var("AIRLOCK_TEST_IMAGE").unwrap();
        policy.kube.log_streams = streams;
        let cluster = FakeCluster::start(&socket()).await;
        Self { cluster, policy }
    }

    fn backend(&self) -> KubeBackend {
        KubeBackend::with_client(&self.policy, self.cluster.client())
    }

    fn job(&self, request: JobRequest) -> JobSpec {
        request.resolve(&self.policy).unwrap()
    }

    async fn run(&self, request: JobRequest) -> (JobSpec, RunReport) {
        let job = self.job(request);
        let report = self.backend().run_job(&job, None).await.unwrap();
        (job, report)
    }

    /// Nothing of `job` is left: no Pod in the API, no container, two writes.
    async fn assert_gone(&self, job: &JobSpec) {
        let name = format!("airlock-{}", job.id);
        assert!(
            !self.cluster.state.pod_names().contains(&name),
            "pod {name} left behind"
        );
        assert_eq!(
            containers(&job.id.to_string()).await,
            Vec::<String>::new(),
            "container left behind"
        );
        let writes: Vec<String> = self
            .cluster
            .state
            .writes()
            .into_iter()
            .filter(|w| w.ends_with(&name))
            .collect();
        assert_eq!(
            writes,
            vec![format!("POST {name}"), format!("DELETE {name}")]
        );
    }
}

fn source(language: &str, code: &str) -> JobRequest {
    JobRequest {
        language: language.into(),
        source: code.as_bytes().to_vec(),
        ..Default::default()
    }
}

async fn containers(job: &str) -> Vec<String> {
    let docker = super::fake::kubelet::connect(&socket()).unwrap();
    let filters = HashMap::from([(
        "label".to_owned(),
        vec![format!("{LABEL_FAKE}=true"), format!("airlock.job={job}")],
    )]);
    docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

fn text(report: &RunReport) -> (String, String) {
    let render = |c: &airlock_core::capture::CapturedOutput| c.render_redacted(&|t| (t, 0)).text;
    (render(&report.stdout), render(&report.stderr))
}

macro_rules! need_cluster {
    () => {
        let missing = missing();
        airlock_testkit::require!(missing.is_none(), missing.unwrap_or_default());
    };
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, Docker and AIRLOCK_TEST_IMAGE: run by scripts/ci/kube.sh"]
async fn hello_job_prints_45_with_two_writes() {
    need_cluster!();
    let env = Env::new(KubeLogStreams::Merged).await;
    let (job, report) = env.run(source("python", "print(sum(range(10)))")).await;
    assert_eq!(report.termination, Termination::Exited(0), "{report:?}");
    assert_eq!(text(&report).0, "45\n");
    assert_eq!(
        report.image_digest.as_deref(),
        env.policy.kube.image.rsplit_once('@').map(|(_, d)| d)
    );
    assert!(
        report.degraded.iter().any(|d| d.starts_with("merged_logs")),
        "{:?}",
        report.degraded
    );
    env.assert_gone(&job).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, Docker and AIRLOCK_TEST_IMAGE: run by scripts/ci/kube.sh"]
async fn split_streams_stdin_args_and_files_come_back() {
    need_cluster!();
    let env = Env::new(KubeLogStreams::Split).await;
    let mut request = source(
        "python",
        "import sys\nprint(open('/work/in/data.csv').read().splitlines()[1])\nprint(sys.stdin.read().strip())\nprint(sys.argv[1:])\nprint('oops', file=sys.stderr)\nsys.exit(3)",
    );
    request.files = vec![InputFile {
        path: "in/data.csv".into(),
        content: b"a,b\n1,2\n".to_vec(),
        executable: false,
    }];
    request.stdin = Some(b"from stdin\n".to_vec());
    request.args = vec!["x".into(), "y z".into()];
    let (job, report) = env.run(request).await;
    assert_eq!(
        text(&report),
        (
            "1,2\nfrom stdin\n['x', 'y z']\n".to_owned(),
            "oops\n".to_owned()
        ),
        "{report:?}"
    );
    assert_eq!(report.termination, Termination::Exited(3));
    env.assert_gone(&job).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, Docker and AIRLOCK_TEST_IMAGE: run by scripts/ci/kube.sh"]
async fn the_pod_shape_holds_inside_the_container() {
    need_cluster!();
    let env = Env::new(KubeLogStreams::Split).await;
    let script = "id -u; id -g\n\
                  grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status\n\
                  touch /rootfs-write 2>/dev/null && echo root-writable || echo root-read-only\n\
                  touch /work/x 2>/dev/null && echo work-writable || echo work-read-only\n\
                  echo t > /tmp/t && echo tmp-writable\n\
                  env | sort\n";
    let (job, report) = env.run(source("sh", script)).await;
    let (stdout, stderr) = text(&report);
    assert_eq!(
        report.termination,
        Termination::Exited(0),
        "{stdout}\n{stderr}"
    );
    let expected_env: String = job.env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    let expected = format!(
        "65534\n65534\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nNoNewPrivs:\t1\nroot-read-only\nwork-read-only\ntmp-writable\n{}",
        // `env` adds PWD when the shell exported it; the job's own environment is the rest.
        expected_env
    );
    let got: String = stdout
        .lines()
        .filter(|l| !l.starts_with("PWD="))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(got, expected, "stderr: {stderr}");
    env.assert_gone(&job).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, Docker and AIRLOCK_TEST_IMAGE: run by scripts/ci/kube.sh"]
async fn wall_time_kills_a_busy_loop_and_leaves_nothing() {
    need_cluster!();
    let env = Env::new(KubeLogStreams::Merged).await;
    let mut request = source("python", "while True: pass");
    request.limits = LimitsRequest {
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let started = Instant::now();
    let (job, report) = env.run(request).await;
    assert_eq!(report.outcome(), Outcome::Timeout, "{report:?}");
    assert!(
        report.duration >= Duration::from_secs(1) && report.duration < Duration::from_millis(1500),
        "{:?}",
        report.duration
    );
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "took {:?}",
        started.elapsed()
    );
    env.assert_gone(&job).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, Docker and AIRLOCK_TEST_IMAGE: run by scripts/ci/kube.sh"]
async fn allocating_a_gigabyte_ends_as_oom() {
    need_cluster!();
    let env = Env::new(KubeLogStreams::Merged).await;
    let (job, report) = env
        .run(source(
            "python",
            "b = bytearray(1 << 30)\nprint('allocated')",
        ))
        .await;
    assert_eq!(report.outcome(), Outcome::Oom, "{report:?}");
    assert_eq!(text(&report).0, "");
    env.assert_gone(&job).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, Docker and AIRLOCK_TEST_IMAGE: run by scripts/ci/kube.sh"]
async fn an_output_flood_is_killed_as_output_limit() {
    need_cluster!();
    let env = Env::new(KubeLogStreams::Merged).await;
    let (job, report) = env
        .run(source(
            "python",
            "import sys\nwhile True: sys.stdout.write('x' * 65536)",
        ))
        .await;
    assert_eq!(report.outcome(), Outcome::OutputLimit, "{report:?}");
    assert!(report.stdout.total_bytes >= 64 << 20);
    assert!(report.stdout.truncated);
    env.assert_gone(&job).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, Docker and AIRLOCK_TEST_IMAGE: run by scripts/ci/kube.sh"]
async fn an_interrupted_job_leaves_no_pod_and_no_container() {
    need_cluster!();
    let env = Env::new(KubeLogStreams::Merged).await;
    let job = env.job(source(
        "python",
        "import time\nprint('started', flush=True)\ntime.sleep(1000)",
    ));
    let backend = env.backend();
    let job2 = job.clone();
    let task = tokio::spawn(async move { backend.run_job(&job2, None).await });
    let id = job.id.to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    while containers(&id).await.is_empty() {
        assert!(Instant::now() < deadline, "the job never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Dropping the job's future (what the engine does on SIGTERM) deletes the Pod, and
    // returns once the kubelet has stopped it.
    task.abort();
    let _ = task.await;
    assert_eq!(
        containers(&id).await,
        Vec::<String>::new(),
        "container left behind"
    );
    assert!(
        env.cluster.state.pod_names().is_empty(),
        "{:?}",
        env.cluster.state.pod_names()
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, Docker and AIRLOCK_TEST_IMAGE: run by scripts/ci/kube.sh"]
async fn an_image_missing_on_the_node_fails_as_a_start_error() {
    need_cluster!();
    let mut env = Env::new(KubeLogStreams::Merged).await;
    env.policy.kube.image = format!("airlock-kube-absent:1@sha256:{}", "e".repeat(64));
    let job = env.job(source("python", "1"));
    let err = env.backend().run_job(&job, None).await.unwrap_err();
    assert!(err.to_string().contains("ErrImagePull"), "{err}");
    assert!(env.cluster.state.pod_names().is_empty());
}

/// The `airlock` binary built with the kube feature (`$AIRLOCK_KUBE_BIN`), run against the
/// fake cluster through a kubeconfig: the engine, the CLI, the policy's `[kube]` section and
/// the observation JSON, end to end.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, Docker, AIRLOCK_TEST_IMAGE and AIRLOCK_KUBE_BIN: run by scripts/ci/kube.sh"]
async fn the_airlock_binary_runs_jobs_through_the_fake_cluster() {
    need_cluster!();
    let bin = std::env::var_os("AIRLOCK_KUBE_BIN").map(PathBuf::from);
    airlock_testkit::require!(
        bin.as_ref().is_some_and(|b| b.is_file()),
        "AIRLOCK_KUBE_BIN is not an airlock built with --features kube"
    );
    let bin = bin.unwrap();
    let env = Env::new(KubeLogStreams::Merged).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    env.cluster.write_kubeconfig(&kubeconfig);
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "version = \"kube-test-1\"\n[kube]\nkubeconfig = {:?}\nimage = {:?}\n\
             allow_degraded = [\"tmp_exec\", \"pids\", \"network_policy\", \"seccomp\", \"merged_logs\"]\n",
            kubeconfig.display().to_string(),
            env.policy.kube.image
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let (bin, policy, state) = (bin.clone(), policy.clone(), dir.path().to_owned());
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        async move {
            tokio::task::spawn_blocking(move || {
                std::process::Command::new(bin)
                    .env("AIRLOCK_STATE_DIR", state)
                    .env_remove("KUBECONFIG")
                    .arg("run")
                    .arg("--json")
                    .arg("--backend")
                    .arg("kube")
                    .arg("--policy")
                    .arg(policy)
                    .args(args)
                    .output()
                    .unwrap()
            })
            .await
            .unwrap()
        }
    };
    let out = run(&["-c", "print(sum(range(10)))"]).await;
    let obs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(obs["ok"], true, "{obs:#}");
    assert_eq!(obs["stdout"], "45\n");
    assert_eq!(obs["backend"], "kube");
    assert_eq!(obs["policy_version"], "kube-test-1");
    assert_eq!(
        obs["image_digest"],
        env.policy.kube.image.rsplit_once('@').unwrap().1
    );
    assert_eq!(obs["degraded"].as_array().unwrap().len(), 5, "{obs:#}");
    assert_eq!(out.status.code(), Some(0));
    let out = run(&["--timeout", "1s", "-c", "while True: pass"]).await;
    let obs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(obs["outcome"], "timeout", "{obs:#}");
    assert_eq!(out.status.code(), Some(124));
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert_eq!(audit.lines().count(), 2, "{audit}");
    assert!(
        env.cluster.state.pod_names().is_empty(),
        "{:?}",
        env.cluster.state.pod_names()
    );
    assert_eq!(
        env.cluster.state.writes().len(),
        4,
        "{:?}",
        env.cluster.state.writes()
    );
}

/// `airlock kube install` by the cluster's admin, then `airlock doctor --backend kube` with
/// airlock's own identity, both through the binary: every check passes, and the live job
/// runs through the kubelet with the Role install granted.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, Docker, AIRLOCK_TEST_IMAGE and AIRLOCK_KUBE_BIN: run by scripts/ci/kube.sh"]
async fn the_airlock_binary_installs_a_namespace_and_doctor_finds_it_ready() {
    use super::cli::{Cli, check, doctor};
    need_cluster!();
    airlock_testkit::require!(
        std::env::var_os("AIRLOCK_KUBE_BIN").is_some_and(|b| PathBuf::from(b).is_file()),
        "AIRLOCK_KUBE_BIN is not an airlock built with --features kube"
    );
    let image = std::env::var("AIRLOCK_TEST_IMAGE").unwrap();
    let cli = Cli::new(FakeCluster::start(&socket()).await);
    let admin = cli.policy("admin.kubeconfig", &image, "");
    let out = cli
        .run(&[
            "kube",
            "install",
            "--user",
            super::install::AIRLOCK_USER,
            "--policy",
            admin.to_str().unwrap(),
        ])
        .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let policy = cli.policy("airlock.kubeconfig", &image, "");
    let (code, report) = doctor(&cli, &policy).await;
    assert_eq!(report["ready"], true, "{report:#}");
    assert_eq!(code, Some(0));
    let live = check(&report, "sandbox end to end");
    assert_eq!(live["status"], "ok", "{report:#}");
    assert!(
        live["detail"]
            .as_str()
            .unwrap()
            .contains("job ran in a full sandbox"),
        "{live}"
    );
    assert!(
        cli.cluster.state.pod_names().is_empty(),
        "{:?}",
        cli.cluster.state.pod_names()
    );
    let writes = cli.cluster.state.writes();
    assert_eq!(writes.len(), 2, "{writes:?}");
}
