//! `airlock doctor --backend kube` (`doctor::doctor`) against the fake API server alone (no
//! Docker): a namespace `airlock kube install` prepared is ready, for its admin and for
//! airlock's own narrow identity; each piece taken away (the namespace or its Pod Security
//! label, the deny-all NetworkPolicy, quota, RuntimeClass, a verb of airlock's Role, the
//! whole RoleBinding) is named, with its fix; an unreachable API server ends the report.

use airlock_core::Policy;
use airlock_core::doctor::{Check, Status};
use airlock_kube::doctor::{REQUIRED_ACCESS, doctor};
use airlock_kube::install::{self, NETWORK_POLICY, QUOTA};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::fake::{Clients, FakeCluster};
use super::install::{AIRLOCK_TOKEN, AIRLOCK_USER, NAMESPACE, gvisor_policy, plan, prepared};

const INSTALL_FIX: &str =
    "run `airlock kube install` (or kubectl apply -f deploy/namespace/) as a cluster admin";

/// The check of `control` (without the `kube: ` prefix).
fn check<'a>(checks: &'a [Check], control: &str) -> &'a Check {
    let control = format!("kube: {control}");
    checks
        .iter()
        .find(|c| c.control == control)
        .unwrap_or_else(|| panic!("no check {control:?} in {checks:#?}"))
}

fn assert_check(checks: &[Check], control: &str, status: Status, detail: &str, fix: Option<&str>) {
    let c = check(checks, control);
    assert_eq!(
        (c.status, c.fix.as_deref()),
        (status, fix),
        "{control}: {}",
        c.detail
    );
    assert!(
        c.detail.contains(detail),
        "{control}: {:?} does not say {detail:?}",
        c.detail
    );
}

fn missing(checks: &[Check]) -> Vec<String> {
    checks
        .iter()
        .filter(|c| c.status == Status::Missing)
        .map(|c| format!("{}: {}", c.control, c.detail))
        .collect()
}

async fn as_admin(policy: &Policy, cluster: &FakeCluster) -> Vec<Check> {
    doctor(policy, &cluster.client()).await
}

async fn as_airlock(policy: &Policy, cluster: &FakeCluster) -> Vec<Check> {
    doctor(policy, &cluster.client_as(AIRLOCK_TOKEN)).await
}

#[tokio::test]
async fn a_prepared_namespace_is_ready() {
    let policy = gvisor_policy();
    let cluster = prepared(&policy).await;
    let checks = as_admin(&policy, &cluster).await;
    for (control, detail) in [
        ("API server", "Kubernetes 1.33 (v1.33.0-fake)"),
        ("namespace", "airlock-jobs enforces Pod Security restricted"),
        (
            "network policy",
            "airlock-deny-all denies all ingress and egress",
        ),
        ("quota", "1 ResourceQuota, 1 LimitRange"),
        ("service account", "airlock-job mounts no token"),
        ("runtime class", "gvisor (handler runsc)"),
        (
            "RBAC",
            "may create, watch, read logs of and delete Pods in airlock-jobs",
        ),
        ("image", "registry.example/airlock-python:3.11@sha256:"),
    ] {
        assert_check(&checks, control, Status::Ok, detail, None);
    }
    assert_eq!(missing(&checks), Vec::<String>::new());
    // The rest: the weaker controls the policy accepts.
    let weaker: Vec<&Check> = checks
        .iter()
        .filter(|c| c.control.starts_with("kube: weaker: "))
        .collect();
    assert_eq!(weaker.len(), 5, "{checks:#?}");
    assert!(weaker.iter().all(|c| c.status == Status::Warning));
    assert_eq!(checks.len(), 8 + 5, "{checks:#?}");
    // Reads and access reviews only.
    let writes: Vec<String> = cluster.state.requests()[10..]
        .iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        writes,
        vec![
            "POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews".to_owned();
            REQUIRED_ACCESS.len()
        ]
    );
}

/// airlock runs doctor as itself: the Role and the doctor's ClusterRole that install
/// binds to it let it read what doctor checks, except the job service account (the Role
/// grants no `get serviceaccounts`), which doctor then says it could not verify, and how to.
#[tokio::test]
async fn a_prepared_namespace_is_ready_for_airlocks_own_identity() {
    let policy = gvisor_policy();
    let cluster = prepared(&policy).await;
    let checks = as_airlock(&policy, &cluster).await;
    assert_eq!(missing(&checks), Vec::<String>::new());
    for control in [
        "API server",
        "namespace",
        "network policy",
        "quota",
        "runtime class",
        "RBAC",
        "image",
    ] {
        assert_check(&checks, control, Status::Ok, "", None);
    }
    // The Role install grants lets airlock read the job account (by name only).
    assert_check(
        &checks,
        "service account",
        Status::Ok,
        "airlock-job mounts no token",
        None,
    );
    let requests = cluster.state.requests();
    let mine: Vec<_> = requests.iter().filter(|r| r.user == AIRLOCK_USER).collect();
    assert!(mine.len() >= 8, "{requests:#?}");
}

#[tokio::test]
async fn before_install_each_missing_piece_is_named_with_its_fix() {
    let policy = gvisor_policy();
    let cluster = FakeCluster::api_only().await;
    let checks = as_admin(&policy, &cluster).await;
    assert_check(
        &checks,
        "namespace",
        Status::Missing,
        "airlock-jobs does not exist",
        Some(INSTALL_FIX),
    );
    assert_check(
        &checks,
        "network policy",
        Status::Missing,
        "no deny-all NetworkPolicy in airlock-jobs",
        Some(INSTALL_FIX),
    );
    assert_check(
        &checks,
        "quota",
        Status::Warning,
        "airlock-jobs has no ResourceQuota or no LimitRange",
        Some(INSTALL_FIX),
    );
    assert_check(
        &checks,
        "service account",
        Status::Missing,
        "airlock-job does not exist in airlock-jobs",
        Some(INSTALL_FIX),
    );
    assert_check(
        &checks,
        "runtime class",
        Status::Missing,
        "RuntimeClass gvisor does not exist",
        Some("install the runtime (gVisor: runsc with containerd's shim) and its RuntimeClass"),
    );
    // The admin may do anything.
    assert_check(&checks, "RBAC", Status::Ok, "", None);
}

#[tokio::test]
async fn before_install_airlocks_own_identity_is_denied_verb_by_verb() {
    let policy = gvisor_policy();
    let cluster = FakeCluster::api_only().await;
    cluster.state.add_user(AIRLOCK_TOKEN, AIRLOCK_USER);
    let checks = as_airlock(&policy, &cluster).await;
    assert_check(
        &checks,
        "RBAC",
        Status::Missing,
        "not allowed in airlock-jobs: create pods, delete pods, get pods, list pods, watch pods, get pods/log",
        Some(INSTALL_FIX),
    );
    assert_check(
        &checks,
        "namespace",
        Status::Warning,
        "not allowed to read it",
        Some(INSTALL_FIX),
    );
    assert_check(
        &checks,
        "network policy",
        Status::Missing,
        "cannot list NetworkPolicies in airlock-jobs",
        Some(INSTALL_FIX),
    );
    assert_check(
        &checks,
        "runtime class",
        Status::Warning,
        "not allowed to read RuntimeClass gvisor",
        Some(INSTALL_FIX),
    );
}

#[tokio::test]
async fn a_namespace_without_the_restricted_label_is_named() {
    let policy = gvisor_policy();
    let cluster = prepared(&policy).await;
    let label = "pod-security.kubernetes.io/enforce";
    assert!(
        cluster
            .state
            .update_object("kubectl-edit", "namespaces", "", NAMESPACE, |ns| {
                ns["metadata"]["labels"]
                    .as_object_mut()
                    .unwrap()
                    .remove(label);
            })
    );
    let checks = as_airlock(&policy, &cluster).await;
    assert_check(
        &checks,
        "namespace",
        Status::Missing,
        "airlock-jobs has pod-security.kubernetes.io/enforce=None, not restricted",
        Some(INSTALL_FIX),
    );
    cluster
        .state
        .update_object("kubectl-edit", "namespaces", "", NAMESPACE, |ns| {
            ns["metadata"]["labels"][label] = "baseline".into();
        });
    let checks = as_airlock(&policy, &cluster).await;
    assert_check(
        &checks,
        "namespace",
        Status::Missing,
        "enforce=Some(\"baseline\"), not restricted",
        Some(INSTALL_FIX),
    );
    // The fix fixes it.
    install::apply(&cluster.client(), &plan(&policy))
        .await
        .unwrap();
    let checks = as_airlock(&policy, &cluster).await;
    assert_check(&checks, "namespace", Status::Ok, "restricted", None);
}

#[tokio::test]
async fn a_missing_or_opened_network_policy_is_named() {
    let policy = gvisor_policy();
    let cluster = prepared(&policy).await;
    let state = &cluster.state;
    assert!(state.delete_object("networkpolicies", NAMESPACE, NETWORK_POLICY));
    // Another policy that is not deny-all does not count.
    let allow_dns = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "allow-dns", "namespace": NAMESPACE},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}
    });
    kube::Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(
        cluster.client(),
        NAMESPACE,
    )
    .create(
        &Default::default(),
        &serde_json::from_value(allow_dns).unwrap(),
    )
    .await
    .unwrap();
    let checks = as_airlock(&policy, &cluster).await;
    assert_check(
        &checks,
        "network policy",
        Status::Missing,
        "no deny-all NetworkPolicy in airlock-jobs",
        Some(INSTALL_FIX),
    );

    // Restored by install; then opened to all egress by an edit.
    install::apply(&cluster.client(), &plan(&policy))
        .await
        .unwrap();
    let checks = as_airlock(&policy, &cluster).await;
    assert_check(&checks, "network policy", Status::Ok, NETWORK_POLICY, None);
    state.update_object(
        "kubectl-edit",
        "networkpolicies",
        NAMESPACE,
        NETWORK_POLICY,
        |np| np["spec"]["egress"] = json!([{}]),
    );
    let checks = as_airlock(&policy, &cluster).await;
    assert_check(
        &checks,
        "network policy",
        Status::Missing,
        "no deny-all NetworkPolicy in airlock-jobs",
        Some(INSTALL_FIX),
    );
}

#[tokio::test]
async fn a_verb_missing_from_airlocks_role_is_named() {
    let policy = gvisor_policy();
    let cluster = prepared(&policy).await;
    // Someone trims the Role: no more reading Pod logs.
    assert!(
        cluster
            .state
            .update_object("kubectl-edit", "roles", NAMESPACE, "airlock", |role| {
                role["rules"]
                    .as_array_mut()
                    .unwrap()
                    .retain(|r| r["resources"] != json!(["pods/log"]));
            })
    );
    let checks = as_airlock(&policy, &cluster).await;
    assert_check(
        &checks,
        "RBAC",
        Status::Missing,
        "not allowed in airlock-jobs: get pods/log",
        Some(INSTALL_FIX),
    );
    let c = check(&checks, "RBAC");
    assert!(!c.detail.contains("create pods"), "{}", c.detail);

    // Without the RoleBinding nothing in the namespace is allowed.
    assert!(
        cluster
            .state
            .delete_object("rolebindings", NAMESPACE, "airlock")
    );
    let checks = as_airlock(&policy, &cluster).await;
    assert_check(
        &checks,
        "RBAC",
        Status::Missing,
        "not allowed in airlock-jobs: create pods, delete pods, get pods, list pods, watch pods, get pods/log",
        Some(INSTALL_FIX),
    );
    assert_check(
        &checks,
        "network policy",
        Status::Missing,
        "cannot list NetworkPolicies in airlock-jobs",
        Some(INSTALL_FIX),
    );
    assert_check(
        &checks,
        "quota",
        Status::Warning,
        "cannot read",
        Some(INSTALL_FIX),
    );
    // The doctor's ClusterRole still lets it read the namespace.
    assert_check(&checks, "namespace", Status::Ok, "", None);
}

#[tokio::test]
async fn a_missing_runtime_class_quota_or_token_setting_is_named() {
    let policy = gvisor_policy();
    let cluster = prepared(&policy).await;
    let state = &cluster.state;
    assert!(state.delete_object("runtimeclasses", "", "gvisor"));
    assert!(state.delete_object("limitranges", NAMESPACE, QUOTA));
    assert!(state.update_object(
        "kubectl-edit",
        "serviceaccounts",
        NAMESPACE,
        "airlock-job",
        |sa| {
            sa["automountServiceAccountToken"] = Value::Bool(true);
        }
    ));
    let checks = as_airlock(&policy, &cluster).await;
    assert_check(
        &checks,
        "runtime class",
        Status::Missing,
        "RuntimeClass gvisor does not exist",
        Some("install the runtime (gVisor: runsc with containerd's shim) and its RuntimeClass"),
    );
    assert_check(
        &checks,
        "quota",
        Status::Warning,
        "airlock-jobs has no ResourceQuota or no LimitRange",
        Some(INSTALL_FIX),
    );
    let checks = as_admin(&policy, &cluster).await;
    assert_check(
        &checks,
        "service account",
        Status::Warning,
        "airlock-job may mount a token",
        Some(INSTALL_FIX),
    );
    // No runtime class in the policy: a warning, nothing read.
    let mut plain = policy.clone();
    plain.kube.runtime_class = String::new();
    let checks = as_airlock(&plain, &cluster).await;
    assert_check(
        &checks,
        "runtime class",
        Status::Warning,
        "none: job Pods use the nodes' default runtime",
        None,
    );
}

#[tokio::test]
async fn an_unreachable_api_server_ends_the_report() {
    // A port nothing listens on any more.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    let client = airlock_kube::backend::client_for(config).unwrap();
    let checks = doctor(&gvisor_policy(), &client).await;
    assert_eq!(checks.len(), 1, "{checks:#?}");
    assert_check(
        &checks,
        "API server",
        Status::Missing,
        "not reachable",
        Some("check [kube] kubeconfig/context, $KUBECONFIG, or the in-cluster service account"),
    );
}
