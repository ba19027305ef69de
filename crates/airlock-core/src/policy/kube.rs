//! `[kube]`: the Kubernetes backend, and the Kubernetes name rules its values obey.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{RootfsSpec, is_sha256_digest};
use crate::units::{ByteSize, duration_serde};

/// Settings of the Kubernetes backend (`--backend kube`): where the API server is, the
/// namespace job Pods run in, and what each Pod is scheduled with. The job never sees any of
/// this; the credentials stay with airlock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubePolicy {
    /// A kubeconfig file. Empty: `$KUBECONFIG`, else `~/.kube/config`, else the in-cluster
    /// service account (airlock running in a Pod).
    pub kubeconfig: PathBuf,
    /// The kubeconfig context; empty: its current context.
    pub context: String,
    /// The namespace job Pods run in (prepared once by `airlock kube install`).
    pub namespace: String,
    /// The RuntimeClass of job Pods, e.g. `gvisor` or `kata`; empty: the nodes' default
    /// runtime.
    pub runtime_class: String,
    /// The job image, `REF@sha256:…`. Empty: the `[filesystem] rootfs` image.
    pub image: String,
    /// The service account job Pods run as (no token is mounted).
    pub service_account: String,
    /// Labels a node must have to run job Pods.
    pub node_selector: BTreeMap<String, String>,
    /// Taints job Pods tolerate (for a node pool reserved for them).
    pub tolerations: Vec<KubeToleration>,
    /// Ephemeral storage requested and limited per job Pod (the container's logs and
    /// writable layer count against it; the kubelet evicts a Pod above it).
    pub ephemeral_storage: ByteSize,
    /// Most job Pods at once in the namespace: the ResourceQuota `airlock kube install`
    /// creates.
    pub max_pods: u32,
    /// The seccomp profile of job Pods: `RuntimeDefault`, or `Localhost:<path>` for a
    /// profile installed on every node (below the kubelet's seccomp directory), e.g.
    /// airlock's own policy rendered by `airlock kube seccomp-profile`.
    pub seccomp_profile: String,
    /// How output is read: `merged` (stdout and stderr interleaved by the Pod log API,
    /// returned as stdout; needs `allow_degraded = ["merged_logs"]`) or `split` (the log
    /// API's `stream=Stdout|Stderr`, which needs the `PodLogsQuerySplitStreams` feature
    /// gate; a cluster that ignores it fails the job rather than mixing the streams).
    pub log_streams: KubeLogStreams,
    /// Longest time from the Pod's creation to its program's start (scheduling, image,
    /// volumes).
    #[serde(with = "duration_serde")]
    pub start_timeout: Duration,
    /// Controls a Pod can give only in a weaker form, accepted by this policy. Empty by
    /// default: the backend refuses jobs and says which are missing. See
    /// [`KubeDegraded`]; each accepted one is listed in every observation.
    pub allow_degraded: Vec<KubeDegraded>,
}

/// A control the Kubernetes backend can give only in a weaker form than DESIGN §1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KubeDegraded {
    /// S4: `/tmp` is a size-limited `emptyDir` (tmpfs); Kubernetes has no mount options
    /// for it, so it is not `noexec`.
    TmpExec,
    /// S6: a Pod spec has no pids limit; the node's kubelet `podPidsLimit` applies, not
    /// the job's own.
    Pids,
    /// S3: the Pod has a network namespace with an interface; egress is denied by the
    /// namespace's NetworkPolicy, which only a policy-enforcing CNI applies.
    NetworkPolicy,
    /// S5: with `seccomp_profile = "RuntimeDefault"` the runtime's default filter applies,
    /// not airlock's (which also denies ptrace, io_uring, userfaultfd, ...).
    Seccomp,
    /// S7: with `log_streams = "merged"`, stderr arrives interleaved in stdout.
    MergedLogs,
}

/// How the Kubernetes backend reads a job's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KubeLogStreams {
    /// One interleaved stream, reported as stdout.
    #[default]
    Merged,
    /// Two streams (`stream=Stdout`, `stream=Stderr`).
    Split,
}

impl KubeDegraded {
    /// The wire name, as in the policy.
    pub const fn as_str(self) -> &'static str {
        match self {
            KubeDegraded::TmpExec => "tmp_exec",
            KubeDegraded::Pids => "pids",
            KubeDegraded::NetworkPolicy => "network_policy",
            KubeDegraded::Seccomp => "seccomp",
            KubeDegraded::MergedLogs => "merged_logs",
        }
    }
}

/// A toleration of job Pods, as in a Pod spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeToleration {
    /// The taint key; empty with `operator = "Exists"` tolerates every taint.
    #[serde(default)]
    pub key: String,
    /// `Equal` or `Exists`.
    #[serde(default = "default_toleration_operator")]
    pub operator: String,
    /// The taint value (`Equal` only).
    #[serde(default)]
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule`, `NoExecute`, or empty for all.
    #[serde(default)]
    pub effect: String,
}

fn default_toleration_operator() -> String {
    "Equal".to_owned()
}

impl KubePolicy {
    /// The seccomp profile value of the default runtime's filter.
    pub const SECCOMP_RUNTIME_DEFAULT: &'static str = "RuntimeDefault";
    /// The prefix of a node-local profile.
    pub const SECCOMP_LOCALHOST_PREFIX: &'static str = "Localhost:";
    /// Most job Pods a policy may allow at once.
    pub const MAX_PODS_MAX: u32 = 10_000;
    /// Least ephemeral storage per Pod.
    pub const EPHEMERAL_STORAGE_MIN_BYTES: u64 = 1024 * 1024;
    /// Longest start timeout.
    pub const START_TIMEOUT_MAX: Duration = Duration::from_secs(3600);

    /// The image a job runs: `[kube] image`, else the `[filesystem] rootfs` image, as
    /// (reference, digest).
    pub fn image_ref<'a>(&'a self, rootfs: &'a RootfsSpec) -> Option<(String, String)> {
        if let Some((reference, digest)) = self.image.rsplit_once('@') {
            return Some((reference.to_owned(), digest.to_owned()));
        }
        match rootfs {
            RootfsSpec::Image { reference, digest } => Some((reference.clone(), digest.clone())),
            RootfsSpec::Host | RootfsSpec::HostFull | RootfsSpec::Dir(_) => None,
        }
    }

    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if !is_dns_label(&self.namespace) {
            return Err((
                "namespace",
                format!("{:?} is not a namespace name (a DNS label)", self.namespace),
            ));
        }
        if !self.runtime_class.is_empty() && !is_dns_subdomain(&self.runtime_class) {
            return Err((
                "runtime_class",
                format!("{:?} is not a RuntimeClass name", self.runtime_class),
            ));
        }
        if !is_dns_subdomain(&self.service_account) {
            return Err((
                "service_account",
                format!("{:?} is not a service account name", self.service_account),
            ));
        }
        if !self.image.is_empty() {
            match self.image.rsplit_once('@') {
                Some((reference, digest))
                    if !reference.is_empty()
                        && is_sha256_digest(digest)
                        && !reference
                            .bytes()
                            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) => {}
                _ => {
                    return Err((
                        "image",
                        format!("{:?} must be pinned as REF@sha256:<64 hex>", self.image),
                    ));
                }
            }
        }
        if self.kubeconfig.as_os_str().as_encoded_bytes().contains(&0) {
            return Err(("kubeconfig", "contains a NUL byte".to_owned()));
        }
        if self.context.chars().any(char::is_control) {
            return Err(("context", "contains a control character".to_owned()));
        }
        for (key, value) in &self.node_selector {
            if !is_label_key(key) {
                return Err(("node_selector", format!("{key:?} is not a label key")));
            }
            if !is_label_value(value) {
                return Err((
                    "node_selector",
                    format!("{value:?} (of {key:?}) is not a label value"),
                ));
            }
        }
        for (i, t) in self.tolerations.iter().enumerate() {
            t.check()
                .map_err(|reason| ("tolerations", format!("tolerations[{i}]: {reason}")))?;
        }
        if self.ephemeral_storage.as_u64() < Self::EPHEMERAL_STORAGE_MIN_BYTES {
            return Err((
                "ephemeral_storage",
                format!(
                    "{} is below {}",
                    self.ephemeral_storage,
                    ByteSize::bytes(Self::EPHEMERAL_STORAGE_MIN_BYTES)
                ),
            ));
        }
        if self.max_pods == 0 || self.max_pods > Self::MAX_PODS_MAX {
            return Err((
                "max_pods",
                format!("must be between 1 and {}", Self::MAX_PODS_MAX),
            ));
        }
        if self.seccomp_profile != Self::SECCOMP_RUNTIME_DEFAULT {
            let valid = self
                .seccomp_profile
                .strip_prefix(Self::SECCOMP_LOCALHOST_PREFIX)
                .is_some_and(|path| {
                    !path.is_empty()
                        && !path.starts_with('/')
                        && !path.split('/').any(|s| s.is_empty() || s == "..")
                        && !path.chars().any(char::is_control)
                });
            if !valid {
                return Err((
                    "seccomp_profile",
                    format!(
                        "{:?} must be \"RuntimeDefault\" or \"Localhost:<relative path>\"",
                        self.seccomp_profile
                    ),
                ));
            }
        }
        if self.start_timeout.is_zero() || self.start_timeout > Self::START_TIMEOUT_MAX {
            return Err((
                "start_timeout",
                format!(
                    "must be between 1s and {}",
                    crate::units::format_duration(Self::START_TIMEOUT_MAX)
                ),
            ));
        }
        Ok(())
    }
}

impl KubeToleration {
    fn check(&self) -> Result<(), String> {
        match self.operator.as_str() {
            "Exists" => {
                if !self.value.is_empty() {
                    return Err("operator Exists takes no value".to_owned());
                }
            }
            "Equal" => {
                if self.key.is_empty() {
                    return Err("operator Equal needs a key".to_owned());
                }
                if !is_label_value(&self.value) {
                    return Err(format!("{:?} is not a taint value", self.value));
                }
            }
            other => return Err(format!("operator {other:?} is not Equal or Exists")),
        }
        if !self.key.is_empty() && !is_label_key(&self.key) {
            return Err(format!("{:?} is not a taint key", self.key));
        }
        if !["", "NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&self.effect.as_str()) {
            return Err(format!(
                "effect {:?} is not NoSchedule, PreferNoSchedule or NoExecute",
                self.effect
            ));
        }
        Ok(())
    }
}

impl Default for KubePolicy {
    fn default() -> Self {
        Self {
            kubeconfig: PathBuf::new(),
            context: String::new(),
            namespace: "airlock-jobs".to_owned(),
            runtime_class: String::new(),
            image: String::new(),
            service_account: "airlock-job".to_owned(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            ephemeral_storage: ByteSize::mib(256),
            max_pods: 16,
            seccomp_profile: Self::SECCOMP_RUNTIME_DEFAULT.to_owned(),
            log_streams: KubeLogStreams::Merged,
            start_timeout: Duration::from_secs(60),
            allow_degraded: Vec::new(),
        }
    }
}

/// A DNS label (RFC 1123): 1-63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

/// A DNS subdomain (RFC 1123): dot-separated DNS labels, at most 253 characters.
pub fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253 && text.split('.').all(is_dns_label)
}

/// A Kubernetes label value: empty, or 1-63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
pub fn is_label_value(text: &str) -> bool {
    text.is_empty()
        || (text.len() <= 63
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && text.starts_with(|c: char| c.is_ascii_alphanumeric())
            && text.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// A Kubernetes label key: an optional DNS-subdomain prefix and `/`, then a name (a
/// non-empty label value).
pub fn is_label_key(text: &str) -> bool {
    let (prefix, name) = match text.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, text),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && is_label_value(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use pretty_assertions::assert_eq;

    #[test]
    fn kube_section_takes_defaults_and_overrides() {
        let p = Policy::builtin();
        assert_eq!(p.kube.namespace, "airlock-jobs");
        assert_eq!(p.kube.service_account, "airlock-job");
        assert_eq!(p.kube.seccomp_profile, "RuntimeDefault");
        assert_eq!(p.kube.runtime_class, "");
        assert!(
            p.kube.allow_degraded.is_empty(),
            "nothing weaker by default"
        );
        let digest = format!("sha256:{}", "c".repeat(64));
        let text = format!(
            "version = \"t\"\n[kube]\nnamespace = \"sandbox\"\nruntime_class = \"gvisor\"\n\
             image = \"registry.example/py:3@{digest}\"\nnode_selector = {{ \"airlock.dev/pool\" = \"jobs\" }}\n\
             tolerations = [{{ key = \"airlock.dev/jobs\", value = \"true\", effect = \"NoSchedule\" }}, {{ operator = \"Exists\" }}]\n\
             seccomp_profile = \"Localhost:profiles/airlock.json\"\n\
             allow_degraded = [\"tmp_exec\", \"pids\", \"network_policy\"]\n"
        );
        let p = Policy::from_toml(&text, "t").unwrap();
        assert_eq!(p.kube.namespace, "sandbox");
        assert_eq!(p.kube.runtime_class, "gvisor");
        assert_eq!(p.kube.tolerations[0].operator, "Equal");
        assert_eq!(p.kube.tolerations[1].key, "");
        assert_eq!(
            p.kube.allow_degraded,
            vec![
                KubeDegraded::TmpExec,
                KubeDegraded::Pids,
                KubeDegraded::NetworkPolicy
            ]
        );
        assert_eq!(
            p.kube.image_ref(&RootfsSpec::Host),
            Some(("registry.example/py:3".to_owned(), digest.clone()))
        );
        let again = Policy::from_toml(&p.to_toml(), "t").unwrap();
        assert_eq!(again, p);
        // Without [kube] image, the rootfs image is the job's.
        let rootfs = RootfsSpec::Image {
            reference: "py".into(),
            digest: digest.clone(),
        };
        assert_eq!(
            Policy::builtin().kube.image_ref(&rootfs),
            Some(("py".to_owned(), digest))
        );
        assert_eq!(Policy::builtin().kube.image_ref(&RootfsSpec::Host), None);
    }

    #[test]
    fn kubernetes_names() {
        assert!(is_dns_label("airlock-jobs"));
        assert!(!is_dns_label("-x") && !is_dns_label("A") && !is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("node.k8s.io"));
        assert!(is_label_key("kubernetes.io/os") && is_label_key("pool"));
        assert!(!is_label_key("/x") && !is_label_key("a/b/c") && !is_label_key(""));
        assert!(is_label_value("") && is_label_value("v1.2_x"));
        assert!(!is_label_value("x-") && !is_label_value("a b"));
    }
}
