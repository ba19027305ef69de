//! The `airlock` binary built with the kube feature (`$AIRLOCK_KUBE_BIN`) against the fake
//! API server alone (no Docker, no kubelet), through kubeconfig files: `airlock kube
//! install` applies the namespace objects, as the identity its flags name, and a second run
//! changes nothing; `airlock doctor --backend kube` (the CLI's wiring of the doctor) names
//! the missing pieces with their fixes and runs no job then, runs its live job with
//! airlock's own identity once the namespace is ready, and says how to configure a client
//! it cannot load. `#[ignore]`d in the workspace run, which has no such binary; run by
//! `scripts/ci/kube.sh` after it builds one (the live job succeeding, through a kubelet,
//! is `e2e::the_airlock_binary_installs_a_namespace_and_doctor_finds_it_ready`).

use std::path::{Path, PathBuf};
use std::process::Output;

use airlock_core::Policy;
use airlock_kube::install::{self, Identity, InstallPlan};
use pretty_assertions::assert_eq;
use serde_json::Value;

use super::common::DIGEST;
use super::fake::FakeCluster;
use super::fake::store;
use super::install::{AIRLOCK_TOKEN, AIRLOCK_USER, key_of};

const INSTALL_FIX: &str =
    "run `airlock kube install` (or kubectl apply -f deploy/namespace/) as a cluster admin";

fn bin() -> Option<PathBuf> {
    std::env::var_os("AIRLOCK_KUBE_BIN")
        .map(PathBuf::from)
        .filter(|b| b.is_file())
}

macro_rules! need_bin {
    () => {
        airlock_testkit::require!(
            bin().is_some(),
            "AIRLOCK_KUBE_BIN is not an airlock built with --features kube"
        );
    };
}

/// The fake API server, a kubeconfig for its admin and one for airlock's own identity.
pub struct Cli {
    pub cluster: FakeCluster,
    pub dir: tempfile::TempDir,
}

impl Cli {
    pub fn new(cluster: FakeCluster) -> Self {
        cluster.state.add_user(AIRLOCK_TOKEN, AIRLOCK_USER);
        let dir = tempfile::tempdir().unwrap();
        cluster.write_kubeconfig_as(&dir.path().join("admin.kubeconfig"), None);
        cluster.write_kubeconfig_as(&dir.path().join("airlock.kubeconfig"), Some(AIRLOCK_TOKEN));
        Self { cluster, dir }
    }

    /// A policy file whose `[kube]` section names `kubeconfig` (in the test's directory)
    /// and `image`, accepts every weaker control, and adds `extra`.
    pub fn policy(&self, kubeconfig: &str, image: &str, extra: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{kubeconfig}.policy.toml"));
        let text = format!(
            "version = \"kube-cli-test-1\"\n[kube]\nkubeconfig = {:?}\nimage = {image:?}\n\
             allow_degraded = [\"tmp_exec\", \"pids\", \"network_policy\", \"seccomp\", \"merged_logs\"]\n{extra}",
            self.dir.path().join(kubeconfig).display().to_string(),
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Runs `airlock ARGS` (state in the test's directory, no $KUBECONFIG).
    pub async fn run(&self, args: &[&str]) -> Output {
        let (bin, state) = (bin().unwrap(), self.dir.path().to_owned());
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(bin)
                .env("AIRLOCK_STATE_DIR", state)
                .env_remove("KUBECONFIG")
                .env_remove("AIRLOCK_LOG")
                .args(args)
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `airlock doctor --backend kube --json`: the exit code and the report.
pub async fn doctor(cli: &Cli, policy: &Path) -> (Option<i32>, Value) {
    let out = cli
        .run(&[
            "doctor",
            "--backend",
            "kube",
            "--json",
            "--policy",
            policy.to_str().unwrap(),
        ])
        .await;
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&out.stdout), text(&out.stderr)));
    (out.status.code(), report)
}

/// The check of `control` in a doctor report.
pub fn check<'a>(report: &'a Value, control: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["control"] == control)
        .unwrap_or_else(|| panic!("no check {control:?} in {report:#}"))
}

fn image() -> String {
    format!("registry.example/airlock-python:3.11@{DIGEST}")
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs AIRLOCK_KUBE_BIN (airlock built with --features kube): run by scripts/ci/kube.sh"]
async fn airlock_kube_install_applies_the_objects_and_a_second_run_changes_nothing() {
    need_bin!();
    let cli = Cli::new(FakeCluster::api_only().await);
    let policy = cli.policy("admin.kubeconfig", &image(), "runtime_class = \"gvisor\"\n");
    let install = |extra: &'static [&'static str]| {
        let policy = policy.to_str().unwrap().to_owned();
        let cli = &cli;
        async move {
            let mut args = vec!["kube", "install", "--policy", policy.as_str()];
            args.extend_from_slice(extra);
            cli.run(&args).await
        }
    };
    let out = install(&["--user", AIRLOCK_USER]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let parsed = Policy::from_toml(&std::fs::read_to_string(&policy).unwrap(), "policy").unwrap();
    let plan = InstallPlan::from_policy(&parsed, Identity::User(AIRLOCK_USER.into()));
    let objects = install::objects(&plan).unwrap();
    let mut expected: String = objects
        .iter()
        .map(|o| {
            format!(
                "applied {} {}\n",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    expected.push_str("namespace airlock-jobs is ready for airlock's job Pods\n");
    assert_eq!(text(&out.stdout), expected);
    // What the binary applied is what it prints with --print, field by field.
    let printed = install(&["--user", AIRLOCK_USER, "--print"]).await;
    assert_eq!(
        text(&printed.stdout),
        airlock_kube::yaml::to_yaml_stream(&objects)
    );
    for object in &objects {
        let (plural, ns, name) = key_of(object);
        let stored = cli.cluster.state.object_value(&plural, &ns, &name).unwrap();
        for (path, value) in store::leaves(object) {
            assert_eq!(
                store::get(&stored, &path),
                Some(&value),
                "{plural} {name}: {path:?}"
            );
        }
    }
    let writes = cli.cluster.state.object_writes();
    assert_eq!(writes.len(), objects.len(), "{writes:?}");

    // Again: the same report, nothing written.
    let out = install(&["--user", AIRLOCK_USER]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), expected);
    assert_eq!(cli.cluster.state.object_writes(), writes);

    // Without --user: the default identity, airlock serving in the cluster; only the
    // bindings change.
    let out = install(&[]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        cli.cluster.state.object_writes()[writes.len()..],
        [
            "update rolebindings airlock-jobs/airlock",
            "update clusterrolebindings airlock-doctor-airlock-jobs"
        ]
    );
    let binding: k8s_openapi::api::rbac::v1::RoleBinding =
        cli.cluster.state.object("airlock-jobs", "airlock").unwrap();
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.namespace.as_deref(),
            subject.name.as_str()
        ),
        ("ServiceAccount", Some("airlock-system"), "airlock")
    );
    let out = install(&["--service-account", "airlock"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--service-account must be NAMESPACE/NAME"));

    // As airlock itself, which may not: the object and the refusal, exit 1.
    let policy = cli.policy("airlock.kubeconfig", &image(), "");
    let out = cli
        .run(&["kube", "install", "--policy", policy.to_str().unwrap()])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("apply Namespace airlock-jobs"), "{stderr}");
    assert!(stderr.contains("forbidden"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs AIRLOCK_KUBE_BIN (airlock built with --features kube): run by scripts/ci/kube.sh"]
async fn airlock_doctor_backend_kube_names_the_missing_pieces_then_tries_a_job() {
    need_bin!();
    let cli = Cli::new(FakeCluster::api_only().await);
    // No kubelet here: the live job's Pod never starts; not waiting long for it.
    let policy = cli.policy("airlock.kubeconfig", &image(), "start_timeout = \"2s\"\n");

    // Before install: not ready, each piece with its fix, and no job tried.
    let (code, report) = doctor(&cli, &policy).await;
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(
        (&report["backend"], &report["ready"]),
        (&"kube".into(), &false.into())
    );
    let rbac = check(&report, "kube: RBAC");
    assert_eq!(rbac["status"], "missing", "{rbac}");
    assert_eq!(rbac["fix"], INSTALL_FIX);
    assert!(
        rbac["detail"]
            .as_str()
            .unwrap()
            .contains("create pods, delete pods, get pods, list pods, watch pods, get pods/log"),
        "{rbac}"
    );
    let policy_check = check(&report, "kube: network policy");
    assert_eq!(
        (&policy_check["status"], &policy_check["fix"]),
        (&"missing".into(), &INSTALL_FIX.into())
    );
    assert_eq!(check(&report, "kube: API server")["status"], "ok");
    assert!(
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["control"] != "sandbox end to end"),
        "{report:#}"
    );
    assert_eq!(
        cli.cluster.state.writes(),
        Vec::<String>::new(),
        "a Pod was created"
    );
    // The same as text: MISSING lines with their fixes.
    let out = cli
        .run(&[
            "doctor",
            "--backend",
            "kube",
            "--policy",
            policy.to_str().unwrap(),
        ])
        .await;
    let stdout = text(&out.stdout);
    assert!(stdout.contains("MISSING  kube: RBAC"), "{stdout}");
    assert!(stdout.contains(&format!("fix: {INSTALL_FIX}")), "{stdout}");
    assert!(stdout.contains("NOT READY"), "{stdout}");

    // After an admin's install: every kube check passes for airlock's own identity, so the
    // live job runs as it: its Pod is created and, never started, deleted.
    let admin = cli.policy("admin.kubeconfig", &image(), "");
    let out = cli
        .run(&[
            "kube",
            "install",
            "--user",
            AIRLOCK_USER,
            "--policy",
            admin.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let (code, report) = doctor(&cli, &policy).await;
    let missing: Vec<&Value> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "missing")
        .collect();
    assert_eq!(missing.len(), 1, "{report:#}");
    assert_eq!(missing[0]["control"], "sandbox end to end");
    assert!(
        missing[0]["detail"]
            .as_str()
            .unwrap()
            .contains("did not start within 2 s"),
        "{report:#}"
    );
    assert_eq!(code, Some(1));
    let writes = cli.cluster.state.writes();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert!(writes[0].starts_with("POST airlock-") && writes[1].starts_with("DELETE airlock-"));
    let by_airlock = cli
        .cluster
        .state
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/pods") && r.method == "POST")
        .all(|r| r.user == AIRLOCK_USER);
    assert!(by_airlock);
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs AIRLOCK_KUBE_BIN (airlock built with --features kube): run by scripts/ci/kube.sh"]
async fn airlock_doctor_backend_kube_without_a_kubeconfig_says_how_to_configure() {
    need_bin!();
    let cli = Cli::new(FakeCluster::api_only().await);
    let policy = cli.policy("absent.kubeconfig", &image(), "");
    let (code, report) = doctor(&cli, &policy).await;
    assert_eq!(code, Some(1), "{report:#}");
    // The cluster's checks stop at the missing configuration; the host's own (the audit
    // log every backend writes) follow them.
    let checks: Vec<&Value> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["control"] != "audit log")
        .collect();
    assert_eq!(checks.len(), 1, "{report:#}");
    assert_eq!(checks[0]["control"], "kube: configuration");
    assert_eq!(checks[0]["status"], "missing");
    assert_eq!(
        checks[0]["fix"],
        "set [kube] kubeconfig, or $KUBECONFIG, or run airlock in a Pod"
    );
    assert!(
        checks[0]["detail"]
            .as_str()
            .unwrap()
            .contains("absent.kubeconfig"),
        "{report:#}"
    );
    assert!(cli.cluster.state.requests().is_empty());
}
