//! `airlock doctor --backend kube`: what the cluster gives, checked with read-only requests
//! (and SelfSubjectAccessReviews, which change nothing): the API server answers, the
//! namespace enforces Pod Security `restricted`, the deny-all NetworkPolicy, quota and
//! limits exist, the RuntimeClass exists, the job service account mounts no token, and
//! airlock's own identity may do exactly what a job needs.

use airlock_core::Policy;
use airlock_core::doctor::{Check, Status};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};

use crate::error::status_code;
use crate::host_checks::{check_degraded, weaker_controls};
use crate::install::POD_SECURITY_LEVEL;

fn check(control: &str, status: Status, detail: impl Into<String>, fix: Option<&str>) -> Check {
    Check {
        control: format!("kube: {control}"),
        status,
        detail: detail.into(),
        fix: fix.map(str::to_owned),
    }
}

/// The verbs airlock needs on resources of the job namespace: (verb, resource, subresource).
pub const REQUIRED_ACCESS: &[(&str, &str, &str)] = &[
    ("create", "pods", ""),
    ("delete", "pods", ""),
    ("get", "pods", ""),
    ("list", "pods", ""),
    ("watch", "pods", ""),
    ("get", "pods", "log"),
];

const INSTALL_FIX: &str =
    "run `airlock kube install` (or kubectl apply -f deploy/namespace/) as a cluster admin";

/// Connects to the cluster `policy`'s `[kube]` section names and checks it (the checks of
/// `airlock doctor --backend kube`); a configuration that reaches no cluster is one missing
/// check.
pub async fn diagnose(policy: &Policy) -> Vec<Check> {
    match crate::launch::connect(&policy.kube).await {
        Ok(client) => doctor(policy, &client).await,
        Err(e) => vec![check(
            "configuration",
            Status::Missing,
            airlock_core::error::chain_without_repeats(&e),
            Some("set [kube] kubeconfig, or $KUBECONFIG, or run airlock in a Pod"),
        )],
    }
}

/// Checks the cluster `client` reaches against `policy`.
pub async fn doctor(policy: &Policy, client: &Client) -> Vec<Check> {
    let kube = &policy.kube;
    let ns = kube.namespace.as_str();
    let mut checks = Vec::new();
    match client.apiserver_version().await {
        Ok(info) => checks.push(check(
            "API server",
            Status::Ok,
            format!(
                "Kubernetes {}.{} ({})",
                info.major, info.minor, info.git_version
            ),
            None,
        )),
        Err(e) => {
            checks.push(check(
                "API server",
                Status::Missing,
                format!("not reachable: {e}"),
                Some("check [kube] kubeconfig/context, $KUBECONFIG, or the in-cluster service account"),
            ));
            return checks;
        }
    }

    match Api::<Namespace>::all(client.clone()).get_opt(ns).await {
        Ok(Some(namespace)) => {
            let labels = namespace.metadata.labels.unwrap_or_default();
            let enforce = labels
                .get("pod-security.kubernetes.io/enforce")
                .map(String::as_str);
            if enforce == Some(POD_SECURITY_LEVEL) {
                checks.push(check(
                    "namespace",
                    Status::Ok,
                    format!("{ns} enforces Pod Security {POD_SECURITY_LEVEL}"),
                    None,
                ));
            } else {
                checks.push(check("namespace", Status::Missing, format!("{ns} has pod-security.kubernetes.io/enforce={enforce:?}, not {POD_SECURITY_LEVEL}"), Some(INSTALL_FIX)));
            }
        }
        Ok(None) => checks.push(check(
            "namespace",
            Status::Missing,
            format!("{ns} does not exist"),
            Some(INSTALL_FIX),
        )),
        Err(e) if status_code(&e) == Some(403) => checks.push(check(
            "namespace",
            Status::Warning,
            format!("{ns}: not allowed to read it, so its Pod Security labels are unverified"),
            Some(INSTALL_FIX),
        )),
        Err(e) => checks.push(check(
            "namespace",
            Status::Missing,
            format!("{ns}: {e}"),
            None,
        )),
    }

    match Api::<NetworkPolicy>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => {
            let deny_all = list.items.iter().find(|p| {
                p.spec.as_ref().is_some_and(|s| {
                    let all_pods = s.pod_selector.as_ref().is_none_or(|sel| {
                        sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
                            && sel.match_expressions.as_ref().is_none_or(|m| m.is_empty())
                    });
                    let types = s.policy_types.clone().unwrap_or_default();
                    all_pods
                        && types.iter().any(|t| t == "Egress")
                        && types.iter().any(|t| t == "Ingress")
                        && s.egress.as_ref().is_none_or(|r| r.is_empty())
                        && s.ingress.as_ref().is_none_or(|r| r.is_empty())
                })
            });
            match deny_all {
                Some(p) => checks.push(check("network policy", Status::Ok, format!("{} denies all ingress and egress (enforced only by a NetworkPolicy-enforcing CNI, which doctor cannot see)", p.metadata.name.clone().unwrap_or_default()), None)),
                None => checks.push(check("network policy", Status::Missing, format!("no deny-all NetworkPolicy in {ns}"), Some(INSTALL_FIX))),
            }
        }
        Err(e) => checks.push(check(
            "network policy",
            Status::Missing,
            format!("cannot list NetworkPolicies in {ns}: {e}"),
            Some(INSTALL_FIX),
        )),
    }

    let quota = Api::<ResourceQuota>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await;
    let ranges = Api::<LimitRange>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await;
    match (quota, ranges) {
        (Ok(q), Ok(r)) if !q.items.is_empty() && !r.items.is_empty() => checks.push(check(
            "quota",
            Status::Ok,
            format!(
                "{} ResourceQuota, {} LimitRange",
                q.items.len(),
                r.items.len()
            ),
            None,
        )),
        (Ok(_), Ok(_)) => checks.push(check(
            "quota",
            Status::Warning,
            format!(
                "{ns} has no ResourceQuota or no LimitRange: job Pods are not capped in number"
            ),
            Some(INSTALL_FIX),
        )),
        (Err(e), _) | (_, Err(e)) => checks.push(check(
            "quota",
            Status::Warning,
            format!("cannot read: {e}"),
            Some(INSTALL_FIX),
        )),
    }

    match Api::<ServiceAccount>::namespaced(client.clone(), ns).get_opt(&kube.service_account).await {
        Ok(Some(sa)) if sa.automount_service_account_token == Some(false) => checks.push(check("service account", Status::Ok, format!("{} mounts no token", kube.service_account), None)),
        Ok(Some(_)) => checks.push(check("service account", Status::Warning, format!("{} may mount a token (job Pods set automountServiceAccountToken: false themselves)", kube.service_account), Some(INSTALL_FIX))),
        Ok(None) => checks.push(check("service account", Status::Missing, format!("{} does not exist in {ns}: job Pods cannot be admitted", kube.service_account), Some(INSTALL_FIX))),
        // A namespace installed before airlock's Role granted reading it (install.rs).
        Err(e) if status_code(&e) == Some(403) => checks.push(check(
            "service account",
            Status::Warning,
            format!("not allowed to read {} in {ns}, so whether it mounts a token is unverified (job Pods set automountServiceAccountToken: false themselves)", kube.service_account),
            Some(&format!("run doctor as a cluster admin, or let airlock get serviceaccounts/{} in {ns}", kube.service_account)),
        )),
        Err(e) => checks.push(check("service account", Status::Warning, format!("cannot read {}: {e}", kube.service_account), None)),
    }

    if kube.runtime_class.is_empty() {
        checks.push(check("runtime class", Status::Warning, "none: job Pods use the nodes' default runtime (set [kube] runtime_class = \"gvisor\" for a sandboxed kernel)", None));
    } else {
        match Api::<RuntimeClass>::all(client.clone()).get_opt(&kube.runtime_class).await {
            Ok(Some(rc)) => checks.push(check("runtime class", Status::Ok, format!("{} (handler {})", kube.runtime_class, rc.handler), None)),
            Ok(None) => checks.push(check("runtime class", Status::Missing, format!("RuntimeClass {} does not exist", kube.runtime_class), Some("install the runtime (gVisor: runsc with containerd's shim) and its RuntimeClass"))),
            Err(e) if status_code(&e) == Some(403) => checks.push(check("runtime class", Status::Warning, format!("not allowed to read RuntimeClass {}", kube.runtime_class), Some(INSTALL_FIX))),
            Err(e) => checks.push(check("runtime class", Status::Missing, e.to_string(), None)),
        }
    }

    let reviews = Api::<SelfSubjectAccessReview>::all(client.clone());
    let mut denied = Vec::new();
    let mut failed = None;
    for (verb, resource, subresource) in REQUIRED_ACCESS {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(ns.to_owned()),
                    verb: Some((*verb).to_owned()),
                    resource: Some((*resource).to_owned()),
                    subresource: (!subresource.is_empty()).then(|| (*subresource).to_owned()),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            },
            ..Default::default()
        };
        match reviews.create(&PostParams::default(), &review).await {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => denied.push(if subresource.is_empty() {
                format!("{verb} {resource}")
            } else {
                format!("{verb} {resource}/{subresource}")
            }),
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
    }
    match (failed, denied.is_empty()) {
        (Some(e), _) => checks.push(check(
            "RBAC",
            Status::Missing,
            format!("SelfSubjectAccessReview failed: {e}"),
            None,
        )),
        (None, true) => checks.push(check(
            "RBAC",
            Status::Ok,
            format!("may create, watch, read logs of and delete Pods in {ns}"),
            None,
        )),
        (None, false) => checks.push(check(
            "RBAC",
            Status::Missing,
            format!("not allowed in {ns}: {}", denied.join(", ")),
            Some(INSTALL_FIX),
        )),
    }

    match kube.image_ref(&policy.filesystem.rootfs) {
        Some((reference, digest)) => checks.push(check(
            "image",
            Status::Ok,
            format!("{reference}@{digest} (pulled by the kubelet by digest)"),
            None,
        )),
        None => checks.push(check(
            "image",
            Status::Missing,
            "no image pinned by digest",
            Some("set [kube] image = \"REF@sha256:…\""),
        )),
    }

    let accepted = check_degraded(kube).is_ok();
    for (control, why) in weaker_controls(kube) {
        let ok = kube.allow_degraded.contains(&control);
        checks.push(check(
            &format!("weaker: {}", control.as_str()),
            if ok { Status::Warning } else { Status::Missing },
            format!("{why}{}", if ok { " (accepted by the policy)" } else { "" }),
            (!ok).then_some(
                "accept it in [kube] allow_degraded, or use a backend that gives the full shape",
            ),
        ));
    }
    if !accepted {
        tracing::debug!("the policy does not accept every weaker control of the kube backend");
    }
    checks
}
