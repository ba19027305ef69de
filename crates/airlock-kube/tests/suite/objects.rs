//! Invariants of every generated object: the job Pod (for fixed jobs and, by property
//! tests, for any job a policy accepts), the Pod Security `restricted` profile, and the
//! namespace objects.

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_core::policy::{KubeLogStreams, WorkdirMode};
use airlock_core::{ByteSize, Cpus, InputFile, JobRequest, JobSpec, LimitsRequest, Policy};
use airlock_kube::pod::{self, PodPlan};
use airlock_kube::{KubeBackend, KubeError, pss};
use k8s_openapi::api::core::v1::Pod;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::common::{DIGEST, policy, pool_policy, python, with_inputs};

fn manifest(policy: &Policy, job: &JobSpec) -> Pod {
    KubeBackend::new(policy).manifest(job).unwrap()
}

/// Every invariant of DESIGN §1 that a Pod spec can state, for any job.
fn assert_invariants(policy: &Policy, job: &JobSpec, pod: &Pod) {
    let meta = &pod.metadata;
    assert_eq!(
        meta.name.as_deref(),
        Some(format!("airlock-{}", job.id).as_str())
    );
    assert_eq!(
        meta.namespace.as_deref(),
        Some(policy.kube.namespace.as_str())
    );
    let labels = meta.labels.as_ref().unwrap();
    assert_eq!(labels["airlock.managed"], "true");
    assert_eq!(labels["airlock.job"], job.id.as_str());
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    let deadline = spec.active_deadline_seconds.unwrap();
    assert!(
        deadline as f64 >= job.limits.timeout.as_secs_f64(),
        "deadline {deadline}"
    );
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.enable_service_links, Some(false));
    assert_eq!(spec.host_network, Some(false));
    assert_eq!(spec.host_pid, Some(false));
    assert_eq!(spec.host_ipc, Some(false));
    assert_eq!(spec.share_process_namespace, Some(false));
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some(policy.kube.service_account.as_str())
    );
    assert!(spec.init_containers.is_none() && spec.ephemeral_containers.is_none());
    assert_eq!(spec.containers.len(), 1, "exactly one container");
    let psc = spec.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        (psc.run_as_user, psc.run_as_group),
        (Some(65534), Some(65534))
    );
    let c = &spec.containers[0];
    assert!(
        c.image.as_ref().unwrap().ends_with(&format!("@{DIGEST}")),
        "by digest"
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(
        (sc.run_as_user, sc.run_as_group),
        (Some(65534), Some(65534))
    );
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop,
        Some(vec!["ALL".to_owned()])
    );
    assert_eq!(sc.capabilities.as_ref().unwrap().add, None);
    let seccomp = sc.seccomp_profile.as_ref().unwrap();
    assert!(["RuntimeDefault", "Localhost"].contains(&seccomp.type_.as_str()));
    assert!(c.ports.is_none(), "no ports");
    assert!(
        c.env.as_ref().unwrap().is_empty() && c.env_from.is_none(),
        "env only through env -i"
    );
    let resources = c.resources.as_ref().unwrap();
    assert_eq!(
        resources.requests, resources.limits,
        "requests equal limits"
    );
    let limits = resources.limits.as_ref().unwrap();
    assert_eq!(limits.len(), 3);
    assert_eq!(limits["cpu"].0, format!("{}m", job.limits.cpus.millis()));
    assert_eq!(limits["memory"].0, job.limits.memory.as_u64().to_string());
    assert_eq!(
        limits["ephemeral-storage"].0,
        policy.kube.ephemeral_storage.as_u64().to_string()
    );
    // Volumes: memory-backed emptyDirs and downward API projections only; no host path.
    let volumes = spec.volumes.as_ref().unwrap();
    for v in volumes {
        assert!(
            v.empty_dir.is_some() || v.downward_api.is_some(),
            "volume {} is neither",
            v.name
        );
        assert!(v.host_path.is_none());
        if let Some(dir) = &v.empty_dir {
            assert_eq!(dir.medium.as_deref(), Some("Memory"));
            assert_eq!(
                dir.size_limit.as_ref().unwrap().0,
                job.limits.tmp.as_u64().to_string()
            );
        }
    }
    let mounts: BTreeMap<&str, (&str, bool)> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            (
                m.mount_path.as_str(),
                (m.name.as_str(), m.read_only.unwrap_or(false)),
            )
        })
        .collect();
    assert_eq!(mounts["/tmp"], ("tmp", false));
    match job.filesystem.workdir {
        WorkdirMode::Ro => assert_eq!(mounts["/work"], ("inputs", true)),
        WorkdirMode::Rw => {
            assert_eq!(mounts["/work"], ("work", false));
            assert_eq!(mounts["/airlock/in"], ("inputs", true));
        }
    }
    for (path, (_, ro)) in &mounts {
        if *path != "/tmp" && *path != "/work" {
            assert!(ro, "{path} is writable");
        }
    }
    // Each input arrives byte for byte: annotation → downward API item.
    let annotations = meta.annotations.as_ref().unwrap();
    let inputs = volumes.iter().find(|v| v.name == "inputs").unwrap();
    let items = inputs
        .downward_api
        .as_ref()
        .unwrap()
        .items
        .as_ref()
        .unwrap();
    let mut expected = vec![(job.source_file.clone(), job.source.clone(), false)];
    expected.extend(
        job.files
            .iter()
            .map(|f| (f.path.clone(), f.content.clone(), f.executable)),
    );
    assert_eq!(items.len(), expected.len());
    for (item, (path, content, exec)) in items.iter().zip(&expected) {
        assert_eq!(&item.path, path);
        let field = &item.field_ref.as_ref().unwrap().field_path;
        let key = field
            .strip_prefix("metadata.annotations['")
            .unwrap()
            .strip_suffix("']")
            .unwrap();
        assert_eq!(annotations[key].as_bytes(), content.as_slice());
        assert_eq!(item.mode, Some(if *exec { 0o555 } else { 0o444 }));
    }
    match &job.stdin {
        Some(stdin) => assert_eq!(
            annotations["airlock.dev/stdin"].as_bytes(),
            stdin.as_slice()
        ),
        None => assert!(!annotations.contains_key("airlock.dev/stdin")),
    }
    let total: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(total <= 256 * 1024, "annotations {total} bytes");
    // The command: the wrapper, then exactly the job's environment and argv.
    let cmd = c.command.as_ref().unwrap();
    assert_eq!(&cmd[..2], ["/bin/sh", "-c"]);
    assert!(cmd[2].contains("exec /usr/bin/env -i \"$@\""), "{}", cmd[2]);
    assert_eq!(cmd[3], "airlock");
    let env: Vec<String> = job.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    assert_eq!(&cmd[4..4 + env.len()], env.as_slice());
    assert_eq!(&cmd[4 + env.len()..], job.argv.as_slice());
    // The Pod Security restricted profile holds.
    assert_eq!(pss::restricted_violations(pod), Vec::<String>::new());
    // It survives the API's JSON unchanged.
    let json = serde_json::to_string(pod).unwrap();
    let again: Pod = serde_json::from_str(&json).unwrap();
    assert_eq!(&again, pod);
}

#[test]
fn a_plain_job_gives_the_whole_shape() {
    let policy = policy();
    let job = python(&policy, "print(1)");
    let pod = manifest(&policy, &job);
    assert_invariants(&policy, &job, &pod);
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.active_deadline_seconds, Some(5 + 60 + 30));
    assert_eq!(spec.runtime_class_name, None);
    let c = &spec.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some(format!("registry.example/airlock-python:3.11@{DIGEST}").as_str())
    );
    assert!(c.command.as_ref().unwrap()[2].ends_with("< /dev/null\n"));
}

#[test]
fn inputs_stdin_and_a_pool_are_delivered() {
    let policy = pool_policy();
    let job = with_inputs(&policy);
    let pod = manifest(&policy, &job);
    assert_invariants(&policy, &job, &pod);
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
    assert_eq!(
        spec.node_selector.as_ref().unwrap()["airlock.dev/pool"],
        "jobs"
    );
    let t = &spec.tolerations.as_ref().unwrap()[0];
    assert_eq!(
        (t.key.as_deref(), t.effect.as_deref()),
        (Some("airlock.dev/jobs"), Some("NoSchedule"))
    );
    assert!(spec.containers[0].command.as_ref().unwrap()[2].ends_with("< /airlock/stdin/stdin\n"));
}

#[test]
fn writable_work_copies_the_inputs_in() {
    let mut policy = policy();
    policy.filesystem.workdir = WorkdirMode::Rw;
    let job = with_inputs(&policy);
    let pod = manifest(&policy, &job);
    assert_invariants(&policy, &job, &pod);
    let script = &pod.spec.as_ref().unwrap().containers[0]
        .command
        .as_ref()
        .unwrap()[2];
    assert!(
        script.contains(
            "mkdir -p '/work/in' && cp '/airlock/in/in/data.csv' '/work/in/data.csv' || exit 125"
        ),
        "{script}"
    );
}

#[test]
fn a_localhost_seccomp_profile_is_used() {
    let mut policy = policy();
    policy.kube.seccomp_profile = "Localhost:profiles/airlock.json".into();
    let job = python(&policy, "1");
    let pod = manifest(&policy, &job);
    assert_invariants(&policy, &job, &pod);
    let p = pod
        .spec
        .unwrap()
        .security_context
        .unwrap()
        .seccomp_profile
        .unwrap();
    assert_eq!(
        (p.type_.as_str(), p.localhost_profile.as_deref()),
        ("Localhost", Some("profiles/airlock.json"))
    );
}

#[test]
fn what_a_pod_cannot_carry_is_refused() {
    let policy = policy();
    let refuse = |req: JobRequest| {
        KubeBackend::new(&policy)
            .manifest(&req.resolve(&policy).unwrap())
            .unwrap_err()
    };
    let binary = refuse(JobRequest {
        language: "python".into(),
        source: b"1".to_vec(),
        files: vec![InputFile {
            path: "blob".into(),
            content: vec![0xff, 0xfe],
            executable: false,
        }],
        ..Default::default()
    });
    assert!(
        matches!(&binary, KubeError::Input { field, .. } if field == "files[0]"),
        "{binary}"
    );
    assert_eq!(binary.kind(), airlock_core::ErrorKind::InvalidInput);
    let reserved = refuse(JobRequest {
        language: "python".into(),
        source: b"1".to_vec(),
        files: vec![InputFile {
            path: "..data".into(),
            content: b"x".to_vec(),
            executable: false,
        }],
        ..Default::default()
    });
    assert!(reserved.to_string().contains("reserved"), "{reserved}");
    let big = refuse(JobRequest {
        language: "python".into(),
        source: "#".repeat(300 * 1024).into_bytes(),
        ..Default::default()
    });
    assert!(big.to_string().contains("annotations"), "{big}");
    // No image pinned anywhere: refused before anything is sent.
    let mut host = policy.clone();
    host.kube.image.clear();
    let err = KubeBackend::new(&host)
        .manifest(&python(&host, "1"))
        .unwrap_err();
    assert_eq!(err.kind(), airlock_core::ErrorKind::PolicyDenied);
}

#[test]
fn weaker_controls_need_the_policy() {
    let mut policy = Policy::builtin();
    let err = airlock_kube::backend::check_degraded(&policy.kube).unwrap_err();
    let text = err.to_string();
    for name in [
        "tmp_exec",
        "pids",
        "network_policy",
        "seccomp",
        "merged_logs",
    ] {
        assert!(text.contains(name), "{text}");
    }
    assert_eq!(err.kind(), airlock_core::ErrorKind::PolicyDenied);
    policy.kube.seccomp_profile = "Localhost:airlock.json".into();
    policy.kube.log_streams = KubeLogStreams::Split;
    let text = airlock_kube::backend::check_degraded(&policy.kube)
        .unwrap_err()
        .to_string();
    assert!(
        !text.contains("seccomp") && !text.contains("merged_logs"),
        "{text}"
    );
    let degraded = airlock_kube::backend::check_degraded(&super::common::policy().kube).unwrap();
    assert_eq!(degraded.len(), 5);
    assert!(degraded[0].starts_with("tmp_exec: "));
}

#[test]
fn the_restricted_check_catches_each_violation() {
    let policy = policy();
    let pod = manifest(&policy, &python(&policy, "1"));
    type Breaker = fn(&mut Pod);
    let cases: Vec<(&str, Breaker)> = vec![
        ("hostNetwork", |p| {
            p.spec.as_mut().unwrap().host_network = Some(true)
        }),
        ("hostPID", |p| {
            p.spec.as_mut().unwrap().host_pid = Some(true)
        }),
        ("privileged", |p| {
            p.spec.as_mut().unwrap().containers[0]
                .security_context
                .as_mut()
                .unwrap()
                .privileged = Some(true)
        }),
        ("allowPrivilegeEscalation", |p| {
            p.spec.as_mut().unwrap().containers[0]
                .security_context
                .as_mut()
                .unwrap()
                .allow_privilege_escalation = None
        }),
        ("runAsNonRoot", |p| {
            p.spec.as_mut().unwrap().containers[0]
                .security_context
                .as_mut()
                .unwrap()
                .run_as_non_root = Some(false)
        }),
        ("runAsUser is 0", |p| {
            p.spec.as_mut().unwrap().containers[0]
                .security_context
                .as_mut()
                .unwrap()
                .run_as_user = Some(0)
        }),
        ("Unconfined", |p| {
            p.spec.as_mut().unwrap().containers[0]
                .security_context
                .as_mut()
                .unwrap()
                .seccomp_profile
                .as_mut()
                .unwrap()
                .type_ = "Unconfined".into()
        }),
        ("drop lacks ALL", |p| {
            p.spec.as_mut().unwrap().containers[0]
                .security_context
                .as_mut()
                .unwrap()
                .capabilities = None
        }),
        ("adds capability SYS_ADMIN", |p| {
            p.spec.as_mut().unwrap().containers[0]
                .security_context
                .as_mut()
                .unwrap()
                .capabilities
                .as_mut()
                .unwrap()
                .add = Some(vec!["SYS_ADMIN".into()])
        }),
        ("hostPath", |p| {
            p.spec.as_mut().unwrap().volumes.as_mut().unwrap().push(
                k8s_openapi::api::core::v1::Volume {
                    name: "host".into(),
                    host_path: Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
                        path: "/".into(),
                        type_: None,
                    }),
                    ..Default::default()
                },
            )
        }),
        ("procMount Unmasked", |p| {
            p.spec.as_mut().unwrap().containers[0]
                .security_context
                .as_mut()
                .unwrap()
                .proc_mount = Some("Unmasked".into())
        }),
        ("sysctl kernel.msgmax", |p| {
            p.spec
                .as_mut()
                .unwrap()
                .security_context
                .as_mut()
                .unwrap()
                .sysctls = Some(vec![k8s_openapi::api::core::v1::Sysctl {
                name: "kernel.msgmax".into(),
                value: "1".into(),
            }])
        }),
    ];
    for (needle, break_it) in cases {
        let mut broken = pod.clone();
        break_it(&mut broken);
        let found = pss::restricted_violations(&broken).join("; ");
        assert!(found.contains(needle), "{needle}: {found:?}");
    }
}

#[test]
fn namespace_objects_are_what_the_issue_asks() {
    use airlock_kube::install::{Identity, InstallPlan, objects};
    let plan = InstallPlan::from_policy(
        &pool_policy(),
        Identity::ServiceAccount("airlock-system".into(), "airlock".into()),
    );
    let ns = plan.namespace();
    let labels = ns.metadata.labels.unwrap();
    for mode in ["enforce", "audit", "warn"] {
        assert_eq!(
            labels[&format!("pod-security.kubernetes.io/{mode}")],
            "restricted"
        );
    }
    let np = plan.network_policy().spec.unwrap();
    assert_eq!(np.pod_selector, Some(Default::default()), "every Pod");
    assert_eq!(
        np.policy_types,
        Some(vec!["Ingress".to_owned(), "Egress".to_owned()])
    );
    assert!(
        np.ingress == Some(vec![]) && np.egress == Some(vec![]),
        "no rule: deny all (empty lists, so install owns them under server-side apply)"
    );
    let hard = plan.resource_quota().spec.unwrap().hard.unwrap();
    assert_eq!(hard["pods"].0, "16");
    assert_eq!(hard["limits.cpu"].0, "8000m");
    assert_eq!(
        hard["requests.memory"].0,
        (16u64 * 256 * 1024 * 1024).to_string()
    );
    assert_eq!(
        plan.job_service_account().automount_service_account_token,
        Some(false)
    );
    // The Role: exactly Pods (create, delete, read), their logs, and read-only doctor objects.
    let rules = plan.role().rules.unwrap();
    let writes: Vec<String> = rules
        .iter()
        .flat_map(|r| r.verbs.iter().map(move |v| (r, v)))
        .filter(|(_, v)| !["get", "list", "watch"].contains(&v.as_str()))
        .map(|(r, v)| format!("{v} {}", r.resources.as_ref().unwrap().join(",")))
        .collect();
    assert_eq!(writes, vec!["create pods", "delete pods"]);
    let cluster = plan.doctor_cluster_role().rules.unwrap();
    assert!(
        cluster
            .iter()
            .all(|r| r.verbs == ["get"] && r.resource_names.as_ref().is_some_and(|n| n.len() == 1))
    );
    let all = objects(&plan).unwrap();
    let kinds: Vec<&str> = all.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "NetworkPolicy",
            "ResourceQuota",
            "LimitRange",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding"
        ]
    );
}

fn arb_request() -> impl Strategy<Value = (JobRequest, bool, bool, bool)> {
    let path = "[a-z][a-z0-9_.-]{0,12}(/[a-z][a-z0-9_-]{0,8}){0,2}";
    let files = proptest::collection::btree_map(path, ("\\PC{0,200}", any::<bool>()), 0..5);
    (
        "\\PC{1,400}",
        files,
        proptest::option::of("\\PC{0,100}"),
        proptest::collection::vec("\\PC{0,30}", 0..4),
        (1u64..=5000, 4u64..=256, 10u32..=500, 1u32..=64),
        (any::<bool>(), any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |(source, files, stdin, args, (ms, mib, cpu, pids), (rw, split, pool))| {
                let files = files
                    .into_iter()
                    .filter(|(p, _)| !p.starts_with(".airlock"))
                    .map(|(path, (content, executable))| InputFile {
                        path,
                        content: content.into_bytes(),
                        executable,
                    })
                    .collect::<Vec<_>>();
                let request = JobRequest {
                    language: "python".into(),
                    source: source.replace('\0', "").into_bytes(),
                    files,
                    stdin: stdin.map(String::into_bytes),
                    args: args.into_iter().map(|a| a.replace('\0', "")).collect(),
                    limits: LimitsRequest {
                        timeout: Some(Duration::from_millis(ms.max(10))),
                        memory: Some(ByteSize::mib(mib)),
                        cpus: Some(Cpus::from_millis(cpu)),
                        pids: Some(pids),
                    },
                    ..Default::default()
                };
                (request, rw, split, pool)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_accepted_job_gets_the_whole_shape((request, rw, split, pool) in arb_request()) {
        let mut policy = if pool { pool_policy() } else { policy() };
        if rw {
            policy.filesystem.workdir = WorkdirMode::Rw;
        }
        if split {
            policy.kube.log_streams = KubeLogStreams::Split;
        }
        // Requests the policy refuses (a file that is another's directory, ...) are not
        // the backend's to build.
        let Ok(job) = request.resolve(&policy) else { return Ok(()); };
        match KubeBackend::new(&policy).manifest(&job) {
            Ok(pod) => assert_invariants(&policy, &job, &pod),
            Err(e) => {
                // Only what annotations cannot hold is refused, and as invalid input.
                prop_assert_eq!(e.kind(), airlock_core::ErrorKind::InvalidInput, "{}", e);
            }
        }
    }

    #[test]
    fn shell_quoting_round_trips(text in "\\PC{0,40}") {
        let quoted = pod::shell_quote(&text);
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("printf '%s' {quoted}"))
            .output()
            .unwrap();
        prop_assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
    }
}

#[test]
fn the_image_is_pinned_even_when_the_reference_has_a_digest() {
    assert_eq!(pod::image("py@sha256:old", DIGEST), format!("py@{DIGEST}"));
    assert_eq!(
        pod::image("reg:5000/py:3", DIGEST),
        format!("reg:5000/py:3@{DIGEST}")
    );
    let policy = policy();
    let job = python(&policy, "1");
    let plan = PodPlan {
        kube: &policy.kube,
        image_reference: "x",
        image_digest: DIGEST,
    };
    assert!(pod::pod_manifest(&job, &plan).is_ok());
}
