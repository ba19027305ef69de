//! `airlock kube install` (`install::apply`) against the fake API server alone (no Docker):
//! every object arrives by a forced server-side apply of airlock's field manager with the
//! fields the code sends, a second install writes nothing, a changed policy changes exactly
//! the objects it sizes, and an install takes back what another manager changed.

use airlock_core::Policy;
use airlock_kube::KubeError;
use airlock_kube::install::{self, FIELD_MANAGER, Identity, InstallPlan, NETWORK_POLICY, QUOTA};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, Patch, PatchParams, PostParams};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::policy;
use super::fake::store::{self, KINDS};
use super::fake::{Clients, FakeCluster};

/// The bearer token of airlock's own identity on the fake API server.
pub const AIRLOCK_TOKEN: &str = "airlock-token";
/// airlock's user name there (the RoleBinding's subject).
pub const AIRLOCK_USER: &str = "airlock";
pub const NAMESPACE: &str = "airlock-jobs";

/// [`policy`] with Pods on the `gvisor` RuntimeClass.
pub fn gvisor_policy() -> Policy {
    let mut policy = policy();
    policy.kube.runtime_class = "gvisor".into();
    policy
}

pub fn plan(policy: &Policy) -> InstallPlan {
    InstallPlan::from_policy(policy, Identity::User(AIRLOCK_USER.into()))
}

/// A fake API server (no kubelet) whose admin created the policy's RuntimeClass, if it
/// names one, and ran `airlock kube install` for `airlock`; airlock's token is known.
pub async fn prepared(policy: &Policy) -> FakeCluster {
    let cluster = FakeCluster::api_only().await;
    cluster.state.add_user(AIRLOCK_TOKEN, AIRLOCK_USER);
    if !policy.kube.runtime_class.is_empty() {
        let class: RuntimeClass = serde_json::from_value(json!({
            "metadata": {"name": policy.kube.runtime_class}, "handler": "runsc"
        }))
        .unwrap();
        Api::<RuntimeClass>::all(cluster.client())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }
    install::apply(&cluster.client(), &plan(policy))
        .await
        .unwrap();
    cluster
}

/// Where the fake stores `object`: plural, namespace, name.
pub fn key_of(object: &Value) -> (String, String, String) {
    let kind = KINDS
        .iter()
        .find(|k| k.kind == object["kind"] && k.api_version() == object["apiVersion"])
        .unwrap_or_else(|| panic!("the fake API server does not store {}", object["kind"]));
    let meta = &object["metadata"];
    (
        kind.plural.to_owned(),
        meta["namespace"].as_str().unwrap_or_default().to_owned(),
        meta["name"].as_str().unwrap().to_owned(),
    )
}

fn url_of(object: &Value) -> String {
    let (plural, ns, name) = key_of(object);
    let prefix = match object["apiVersion"].as_str().unwrap() {
        "v1" => "/api/v1".to_owned(),
        group_version => format!("/apis/{group_version}"),
    };
    if ns.is_empty() {
        format!("{prefix}/{plural}/{name}")
    } else {
        format!("{prefix}/namespaces/{ns}/{plural}/{name}")
    }
}

fn stored(cluster: &FakeCluster, object: &Value) -> Value {
    let (plural, ns, name) = key_of(object);
    cluster
        .state
        .object_value(&plural, &ns, &name)
        .unwrap_or_else(|| panic!("{plural} {ns}/{name} is not in the API server"))
}

fn versions(cluster: &FakeCluster, plan: &InstallPlan) -> Vec<String> {
    install::objects(plan)
        .unwrap()
        .iter()
        .map(|o| {
            stored(cluster, o)["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn install_applies_every_object_with_the_fields_it_sends() {
    let policy = gvisor_policy();
    let plan = plan(&policy);
    let cluster = FakeCluster::api_only().await;
    let applied = install::apply(&cluster.client(), &plan).await.unwrap();
    let sent = install::objects(&plan).unwrap();
    assert_eq!(
        applied,
        sent.iter()
            .map(|o| format!(
                "{} {}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            ))
            .collect::<Vec<_>>()
    );

    // One request per object, in order: a forced server-side apply as airlock.
    let requests = cluster.state.requests();
    assert_eq!(requests.len(), sent.len(), "{requests:#?}");
    for (request, object) in requests.iter().zip(&sent) {
        assert_eq!(request.method, "PATCH");
        assert_eq!(request.path, url_of(object));
        assert_eq!(request.content_type, "application/apply-patch+yaml");
        assert_eq!(
            request.query.get("fieldManager").map(String::as_str),
            Some(FIELD_MANAGER)
        );
        assert_eq!(request.query.get("force").map(String::as_str), Some("true"));
    }

    // Every field sent is stored, and owned by airlock alone.
    for object in &sent {
        let on_server = stored(&cluster, object);
        for (path, value) in store::leaves(object) {
            assert_eq!(
                store::get(&on_server, &path),
                Some(&value),
                "{} of {}",
                path.join("."),
                url_of(object)
            );
        }
        assert_eq!(
            on_server["metadata"]["managedFields"],
            json!([{"manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": object["apiVersion"]}]),
        );
    }
    let writes = cluster.state.object_writes();
    assert_eq!(writes.len(), sent.len(), "{writes:?}");
    assert!(
        writes.iter().all(|w| w.starts_with("create ")),
        "{writes:?}"
    );

    // What the stored objects say.
    let state = &cluster.state;
    let namespace: Namespace = state.object("", NAMESPACE).unwrap();
    let labels = namespace.metadata.labels.unwrap();
    for mode in ["enforce", "audit", "warn"] {
        assert_eq!(
            labels[&format!("pod-security.kubernetes.io/{mode}")],
            "restricted"
        );
        assert_eq!(
            labels[&format!("pod-security.kubernetes.io/{mode}-version")],
            "v1.33"
        );
    }
    let deny: NetworkPolicy = state.object(NAMESPACE, NETWORK_POLICY).unwrap();
    let spec = deny.spec.unwrap();
    assert_eq!(spec.pod_selector, Some(Default::default()));
    assert_eq!(
        spec.policy_types,
        Some(vec!["Ingress".to_owned(), "Egress".to_owned()])
    );
    // Empty, not absent: install owns the rule lists, so a later install clears any rule
    // another manager added.
    assert_eq!((spec.ingress, spec.egress), (Some(vec![]), Some(vec![])));
    let quota: ResourceQuota = state.object(NAMESPACE, QUOTA).unwrap();
    let hard = quota.spec.unwrap().hard.unwrap();
    assert_eq!(hard["pods"], Quantity("16".into()));
    assert_eq!(hard["limits.cpu"], Quantity("8000m".into()));
    let account: ServiceAccount = state.object(NAMESPACE, "airlock-job").unwrap();
    assert_eq!(account.automount_service_account_token, Some(false));
    let binding: RoleBinding = state.object(NAMESPACE, "airlock").unwrap();
    let subjects = binding.subjects.unwrap();
    assert_eq!(
        (
            subjects.len(),
            subjects[0].kind.as_str(),
            subjects[0].name.as_str()
        ),
        (1, "User", AIRLOCK_USER)
    );
    let doctor: ClusterRole = state.object("", "airlock-doctor-airlock-jobs").unwrap();
    let names: Vec<Option<Vec<String>>> = doctor
        .rules
        .unwrap()
        .into_iter()
        .map(|r| r.resource_names)
        .collect();
    assert_eq!(
        names,
        vec![
            Some(vec![NAMESPACE.to_owned()]),
            Some(vec!["gvisor".to_owned()])
        ]
    );
    let doctor_binding: ClusterRoleBinding =
        state.object("", "airlock-doctor-airlock-jobs").unwrap();
    assert_eq!(doctor_binding.role_ref.name, "airlock-doctor-airlock-jobs");
}

#[tokio::test]
async fn a_second_install_writes_nothing() {
    let policy = gvisor_policy();
    let plan = plan(&policy);
    let cluster = prepared(&policy).await;
    let before = versions(&cluster, &plan);
    let writes = cluster.state.object_writes();
    let requests = cluster.state.requests().len();

    let applied = install::apply(&cluster.client(), &plan).await.unwrap();
    assert_eq!(applied.len(), 9);
    assert_eq!(
        versions(&cluster, &plan),
        before,
        "a no-op apply bumped a version"
    );
    assert_eq!(cluster.state.object_writes(), writes);
    // It did ask: nine applies more.
    let again = cluster.state.requests();
    assert_eq!(again.len(), requests + 9);
    assert!(again[requests..].iter().all(|r| r.method == "PATCH"));
}

#[tokio::test]
async fn a_changed_policy_changes_exactly_the_objects_it_sizes() {
    let policy = gvisor_policy();
    let cluster = prepared(&policy).await;
    let writes = cluster.state.object_writes().len();

    let mut smaller = policy.clone();
    smaller.kube.max_pods = 4;
    smaller.kube.runtime_class = String::new();
    install::apply(&cluster.client(), &plan(&smaller))
        .await
        .unwrap();
    assert_eq!(
        cluster.state.object_writes()[writes..],
        [
            "update resourcequotas airlock-jobs/airlock-jobs",
            "update clusterroles airlock-doctor-airlock-jobs"
        ]
    );
    let quota: ResourceQuota = cluster.state.object(NAMESPACE, QUOTA).unwrap();
    let hard = quota.spec.unwrap().hard.unwrap();
    assert_eq!(hard["pods"], Quantity("4".into()));
    assert_eq!(hard["requests.cpu"], Quantity("2000m".into()));
    // The RuntimeClass rule is gone with the runtime class.
    let doctor: ClusterRole = cluster
        .state
        .object("", "airlock-doctor-airlock-jobs")
        .unwrap();
    let rules = doctor.rules.unwrap();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(rules[0].resources, Some(vec!["namespaces".to_owned()]));
}

#[tokio::test]
async fn install_takes_back_what_another_manager_changed() {
    let policy = gvisor_policy();
    let cluster = prepared(&policy).await;
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let weaker = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}
    });
    // An operator's apply of a weaker label conflicts with airlock's field…
    let err = namespaces
        .patch(
            NAMESPACE,
            &PatchParams::apply("kubectl"),
            &Patch::Apply(&weaker),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = &err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 409, "{err}");
    assert!(
        status.message.contains(
            "conflict with \"airlock\": .metadata.labels.pod-security.kubernetes.io/enforce"
        ),
        "{err}"
    );
    // …unless forced; and `kubectl edit` lets egress out of the deny-all policy.
    namespaces
        .patch(
            NAMESPACE,
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(&weaker),
        )
        .await
        .unwrap();
    assert!(cluster.state.update_object(
        "kubectl-edit",
        "networkpolicies",
        NAMESPACE,
        NETWORK_POLICY,
        |np| {
            np["spec"]["policyTypes"] = json!(["Ingress"]);
            // …and adds a rule letting every Pod reach anywhere.
            np["spec"]["egress"] = json!([{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]);
        }
    ));
    let label = |cluster: &FakeCluster| {
        let ns: Namespace = cluster.state.object("", NAMESPACE).unwrap();
        ns.metadata.labels.unwrap()["pod-security.kubernetes.io/enforce"].clone()
    };
    let types = |cluster: &FakeCluster| {
        let np: NetworkPolicy = cluster.state.object(NAMESPACE, NETWORK_POLICY).unwrap();
        let spec = np.spec.unwrap();
        (
            spec.policy_types.unwrap(),
            spec.egress.map_or(0, |e| e.len()),
        )
    };
    assert_eq!(
        (label(&cluster), types(&cluster)),
        ("privileged".to_owned(), (vec!["Ingress".to_owned()], 1))
    );

    install::apply(&cluster.client(), &plan(&policy))
        .await
        .unwrap();
    assert_eq!(
        (label(&cluster), types(&cluster)),
        (
            "restricted".to_owned(),
            (vec!["Ingress".to_owned(), "Egress".to_owned()], 0)
        ),
        "a reinstall restores deny-all, the added egress rule included"
    );
}

#[tokio::test]
async fn install_without_the_rights_fails_at_the_first_object_and_writes_nothing() {
    let cluster = FakeCluster::api_only().await;
    cluster.state.add_user(AIRLOCK_TOKEN, AIRLOCK_USER);
    let err = install::apply(&cluster.client_as(AIRLOCK_TOKEN), &plan(&policy()))
        .await
        .unwrap_err();
    let KubeError::Api {
        operation,
        object,
        source,
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (*operation, object.as_str()),
        ("apply", "Namespace airlock-jobs")
    );
    assert_eq!(
        airlock_kube::error::status_code(source),
        Some(403),
        "{source}"
    );
    assert_eq!(err.kind(), airlock_core::ErrorKind::BackendUnavailable);
    assert_eq!(cluster.state.object_writes(), Vec::<String>::new());
}
