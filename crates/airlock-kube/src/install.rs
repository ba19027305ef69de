//! What `airlock kube install` puts in a cluster once per namespace, as pure data: the
//! Pod Security `restricted` labels, a deny-all NetworkPolicy, a ResourceQuota and
//! LimitRange sized from the policy, the job Pods' service account (no token), and the
//! narrow Role airlock itself needs (plus a ClusterRole limited by name to the namespace
//! and the RuntimeClass, for `airlock doctor`). The same objects, rendered, are the golden
//! manifests in `deploy/namespace/`.

use std::collections::BTreeMap;

use airlock_core::Policy;
use k8s_openapi::api::core::v1::{
    LimitRange, LimitRangeItem, LimitRangeSpec, Namespace, ResourceQuota, ResourceQuotaSpec,
    ServiceAccount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

/// The oldest Kubernetes minor version airlock supports (k8s-openapi's `v1_33` types; the
/// manifests are validated against it in CI).
pub const OLDEST_KUBERNETES: &str = "1.33";
/// The Pod Security Standards profile of the job namespace.
pub const POD_SECURITY_LEVEL: &str = "restricted";
/// The name of the deny-all NetworkPolicy.
pub const NETWORK_POLICY: &str = "airlock-deny-all";
/// The name of the ResourceQuota and the LimitRange.
pub const QUOTA: &str = "airlock-jobs";
/// The name of airlock's Role and RoleBinding in the job namespace.
pub const ROLE: &str = "airlock";
/// The label telling objects airlock installed.
pub const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";
/// The default identity airlock runs as in the cluster (`deploy/serve`).
pub const DEFAULT_SUBJECT: (&str, &str) = ("airlock-system", "airlock");

/// Who airlock is, for the RoleBinding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A service account (airlock serving in the cluster): namespace, name.
    ServiceAccount(String, String),
    /// A user name from a kubeconfig (airlock run outside the cluster).
    User(String),
}

/// Everything [`objects`] needs.
#[derive(Debug, Clone)]
pub struct InstallPlan {
    /// The job namespace.
    pub namespace: String,
    /// The job Pods' service account.
    pub service_account: String,
    /// The RuntimeClass job Pods use, if any.
    pub runtime_class: String,
    /// Most job Pods at once.
    pub max_pods: u32,
    /// CPU per Pod, in thousandths.
    pub cpu_millis: u64,
    /// Memory per Pod, bytes.
    pub memory_bytes: u64,
    /// Ephemeral storage per Pod, bytes.
    pub ephemeral_bytes: u64,
    /// Who airlock is.
    pub identity: Identity,
}

impl InstallPlan {
    /// The plan for a policy's `[kube]` section and ceilings.
    pub fn from_policy(policy: &Policy, identity: Identity) -> Self {
        Self {
            namespace: policy.kube.namespace.clone(),
            service_account: policy.kube.service_account.clone(),
            runtime_class: policy.kube.runtime_class.clone(),
            max_pods: policy.kube.max_pods,
            cpu_millis: u64::from(policy.limits.cpus.millis()),
            memory_bytes: policy.limits.memory.as_u64(),
            ephemeral_bytes: policy.kube.ephemeral_storage.as_u64(),
            identity,
        }
    }

    fn meta(&self, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(self.namespace.clone()),
            labels: Some(BTreeMap::from([(
                LABEL_PART_OF.to_owned(),
                "airlock".to_owned(),
            )])),
            ..Default::default()
        }
    }

    fn per_pod(&self) -> BTreeMap<String, Quantity> {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(format!("{}m", self.cpu_millis))),
            ("memory".to_owned(), Quantity(self.memory_bytes.to_string())),
            (
                "ephemeral-storage".to_owned(),
                Quantity(self.ephemeral_bytes.to_string()),
            ),
        ])
    }

    /// The namespace, labelled for Pod Security `restricted` (enforced, audited, warned).
    pub fn namespace(&self) -> Namespace {
        let version = format!("v{OLDEST_KUBERNETES}");
        let mut labels = BTreeMap::from([(LABEL_PART_OF.to_owned(), "airlock".to_owned())]);
        for mode in ["enforce", "audit", "warn"] {
            labels.insert(
                format!("pod-security.kubernetes.io/{mode}"),
                POD_SECURITY_LEVEL.to_owned(),
            );
            labels.insert(
                format!("pod-security.kubernetes.io/{mode}-version"),
                version.clone(),
            );
        }
        Namespace {
            metadata: ObjectMeta {
                name: Some(self.namespace.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Denies all ingress and egress of every Pod in the namespace.
    pub fn network_policy(&self) -> NetworkPolicy {
        NetworkPolicy {
            metadata: self.meta(NETWORK_POLICY),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(LabelSelector::default()),
                policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
                // Empty lists, not absent ones: under server-side apply install then owns
                // them, so a rule someone else added is taken away by the next install.
                ingress: Some(Vec::new()),
                egress: Some(Vec::new()),
            }),
        }
    }

    /// At most `max_pods` job Pods, and their resources.
    pub fn resource_quota(&self) -> ResourceQuota {
        let pods = u64::from(self.max_pods);
        let mut hard = BTreeMap::from([("pods".to_owned(), Quantity(pods.to_string()))]);
        for (what, per_pod) in self.per_pod() {
            let total = match what.as_str() {
                "cpu" => Quantity(format!("{}m", self.cpu_millis.saturating_mul(pods))),
                "memory" => Quantity(self.memory_bytes.saturating_mul(pods).to_string()),
                _ => Quantity(self.ephemeral_bytes.saturating_mul(pods).to_string()),
            };
            let _ = per_pod;
            hard.insert(format!("requests.{what}"), total.clone());
            hard.insert(format!("limits.{what}"), total);
        }
        ResourceQuota {
            metadata: self.meta(QUOTA),
            spec: Some(ResourceQuotaSpec {
                hard: Some(hard),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// No container above the policy's ceilings; a container without resources gets them.
    pub fn limit_range(&self) -> LimitRange {
        let per_pod = self.per_pod();
        LimitRange {
            metadata: self.meta(QUOTA),
            spec: Some(LimitRangeSpec {
                limits: vec![
                    LimitRangeItem {
                        type_: "Container".to_owned(),
                        max: Some(per_pod.clone()),
                        default: Some(per_pod.clone()),
                        default_request: Some(per_pod.clone()),
                        ..Default::default()
                    },
                    LimitRangeItem {
                        type_: "Pod".to_owned(),
                        max: Some(per_pod),
                        ..Default::default()
                    },
                ],
            }),
        }
    }

    /// The job Pods' account: no token is ever mounted.
    pub fn job_service_account(&self) -> ServiceAccount {
        ServiceAccount {
            metadata: self.meta(&self.service_account),
            automount_service_account_token: Some(false),
            ..Default::default()
        }
    }

    /// What airlock itself may do in the job namespace: run and remove Pods, read their
    /// logs, and read the objects `airlock doctor` checks. Nothing else.
    pub fn role(&self) -> Role {
        let rule = |groups: &[&str], resources: &[&str], verbs: &[&str]| PolicyRule {
            api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
            resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
            verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        };
        Role {
            metadata: self.meta(ROLE),
            rules: Some(vec![
                rule(
                    &[""],
                    &["pods"],
                    &["create", "delete", "get", "list", "watch"],
                ),
                rule(&[""], &["pods/log"], &["get"]),
                rule(&[""], &["resourcequotas", "limitranges"], &["get", "list"]),
                rule(
                    &["networking.k8s.io"],
                    &["networkpolicies"],
                    &["get", "list"],
                ),
                // The job Pods' account, by name only, so doctor can check it mounts no
                // token.
                PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["serviceaccounts".to_owned()]),
                    resource_names: Some(vec![self.service_account.clone()]),
                    verbs: vec!["get".to_owned()],
                    ..Default::default()
                },
            ]),
        }
    }

    fn subject(&self) -> Subject {
        match &self.identity {
            Identity::ServiceAccount(namespace, name) => Subject {
                kind: "ServiceAccount".to_owned(),
                name: name.clone(),
                namespace: Some(namespace.clone()),
                api_group: Some(String::new()),
            },
            Identity::User(name) => Subject {
                kind: "User".to_owned(),
                name: name.clone(),
                namespace: None,
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
            },
        }
    }

    /// Binds [`InstallPlan::role`] to airlock's identity.
    pub fn role_binding(&self) -> RoleBinding {
        RoleBinding {
            metadata: self.meta(ROLE),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".to_owned(),
                kind: "Role".to_owned(),
                name: ROLE.to_owned(),
            },
            subjects: Some(vec![self.subject()]),
        }
    }

    /// The cluster-scoped name of the doctor's ClusterRole and binding.
    pub fn doctor_role_name(&self) -> String {
        format!("airlock-doctor-{}", self.namespace)
    }

    /// Lets airlock read its job namespace and RuntimeClass (cluster-scoped objects), each
    /// by name only, for `airlock doctor`.
    pub fn doctor_cluster_role(&self) -> ClusterRole {
        let mut rules = vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["namespaces".to_owned()]),
            resource_names: Some(vec![self.namespace.clone()]),
            verbs: vec!["get".to_owned()],
            ..Default::default()
        }];
        if !self.runtime_class.is_empty() {
            rules.push(PolicyRule {
                api_groups: Some(vec!["node.k8s.io".to_owned()]),
                resources: Some(vec!["runtimeclasses".to_owned()]),
                resource_names: Some(vec![self.runtime_class.clone()]),
                verbs: vec!["get".to_owned()],
                ..Default::default()
            });
        }
        ClusterRole {
            metadata: ObjectMeta {
                name: Some(self.doctor_role_name()),
                labels: Some(BTreeMap::from([(
                    LABEL_PART_OF.to_owned(),
                    "airlock".to_owned(),
                )])),
                ..Default::default()
            },
            rules: Some(rules),
            aggregation_rule: None,
        }
    }

    /// Binds [`InstallPlan::doctor_cluster_role`] to airlock's identity.
    pub fn doctor_cluster_role_binding(&self) -> ClusterRoleBinding {
        ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(self.doctor_role_name()),
                labels: Some(BTreeMap::from([(
                    LABEL_PART_OF.to_owned(),
                    "airlock".to_owned(),
                )])),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".to_owned(),
                kind: "ClusterRole".to_owned(),
                name: self.doctor_role_name(),
            },
            subjects: Some(vec![self.subject()]),
        }
    }
}

/// Every object, in the order they are applied, as JSON with `apiVersion` and `kind`.
pub fn objects(plan: &InstallPlan) -> Result<Vec<serde_json::Value>, serde_json::Error> {
    use k8s_openapi::Resource;
    fn typed<K: Resource + serde::Serialize>(
        object: &K,
    ) -> Result<serde_json::Value, serde_json::Error> {
        let mut value = serde_json::to_value(object)?;
        if let Some(map) = value.as_object_mut() {
            // Serialize already writes them for k8s-openapi types; make the order explicit.
            map.insert("apiVersion".to_owned(), K::API_VERSION.into());
            map.insert("kind".to_owned(), K::KIND.into());
        }
        Ok(value)
    }
    Ok(vec![
        typed(&plan.namespace())?,
        typed(&plan.network_policy())?,
        typed(&plan.resource_quota())?,
        typed(&plan.limit_range())?,
        typed(&plan.job_service_account())?,
        typed(&plan.role())?,
        typed(&plan.role_binding())?,
        typed(&plan.doctor_cluster_role())?,
        typed(&plan.doctor_cluster_role_binding())?,
    ])
}

/// The field manager airlock's server-side applies use.
pub const FIELD_MANAGER: &str = "airlock";

async fn apply_one<K>(api: kube::Api<K>, object: &K) -> Result<String, crate::KubeError>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let what = format!("{} {name}", K::kind(&()));
    let params = kube::api::PatchParams::apply(FIELD_MANAGER).force();
    let patch = kube::api::Patch::Apply(object);
    crate::backend::retry_throttled(|| api.patch(&name, &params, &patch))
        .await
        .map_err(|source| crate::KubeError::Api {
            operation: "apply",
            object: what.clone(),
            source,
        })?;
    Ok(what)
}

/// Applies every object of the plan with server-side apply (idempotent: a second run
/// changes nothing); returns what was applied, in order.
pub async fn apply(
    client: &kube::Client,
    plan: &InstallPlan,
) -> Result<Vec<String>, crate::KubeError> {
    use kube::Api;
    let ns = plan.namespace.as_str();
    Ok(vec![
        apply_one(Api::<Namespace>::all(client.clone()), &plan.namespace()).await?,
        apply_one(
            Api::<NetworkPolicy>::namespaced(client.clone(), ns),
            &plan.network_policy(),
        )
        .await?,
        apply_one(
            Api::<ResourceQuota>::namespaced(client.clone(), ns),
            &plan.resource_quota(),
        )
        .await?,
        apply_one(
            Api::<LimitRange>::namespaced(client.clone(), ns),
            &plan.limit_range(),
        )
        .await?,
        apply_one(
            Api::<ServiceAccount>::namespaced(client.clone(), ns),
            &plan.job_service_account(),
        )
        .await?,
        apply_one(Api::<Role>::namespaced(client.clone(), ns), &plan.role()).await?,
        apply_one(
            Api::<RoleBinding>::namespaced(client.clone(), ns),
            &plan.role_binding(),
        )
        .await?,
        apply_one(
            Api::<ClusterRole>::all(client.clone()),
            &plan.doctor_cluster_role(),
        )
        .await?,
        apply_one(
            Api::<ClusterRoleBinding>::all(client.clone()),
            &plan.doctor_cluster_role_binding(),
        )
        .await?,
    ])
}
