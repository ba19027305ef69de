//! The policy file (DESIGN §4): versioned TOML, unknown keys rejected, every limit both the
//! default and the ceiling a request may not exceed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The built-in policy, equal to DESIGN §4. Also shipped as `policy/default.toml`.
pub const BUILTIN_POLICY_TOML: &str = include_str!("../../../../policy/default.toml");

/// Where the built-in policy says it came from in error messages.
pub const BUILTIN_ORIGIN: &str = "built-in";

pub mod bounds;

mod admission;
mod audit;
mod docker;
mod e2b;
mod env;
mod filesystem;
mod images;
mod kube;
mod languages;
mod limits;
mod mcp;
mod native;
mod network;
mod redaction;
mod sessions;
mod telemetry;
mod warm;

pub use admission::AdmissionPolicy;
pub use audit::AuditPolicy;
pub use docker::DockerPolicy;
pub use e2b::{E2bPolicy, E2bTemplate};
pub use env::{EnvPolicy, is_env_name};
pub use filesystem::{FilesystemPolicy, OutPolicy, RootfsSpec, WorkdirMode, is_sha256_digest};
pub use images::ImagesPolicy;
pub use kube::{
    KubeDegraded, KubeLogStreams, KubePolicy, KubeToleration, is_dns_label, is_dns_subdomain,
    is_label_key, is_label_value,
};
use languages::check_languages;
pub use languages::{LanguageSpec, builtin_languages};
pub use limits::Limits;
pub(crate) use limits::{check_cpus, check_memory, check_pids, check_timeout};
pub use mcp::McpPolicy;
pub use native::{CgroupParent, DegradedControl, NativePolicy};
pub use network::{
    HostPattern, NetworkMode, NetworkPolicy, PackagesPolicy, ProxyLimits, SecretSpec,
    SubstitutePlace, parse_cidr, parse_https_url,
};
pub use redaction::RedactionPolicy;
pub use sessions::{SessionMode, SessionsPolicy};
pub use telemetry::TelemetryPolicy;

/// A parsed, validated policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The policy version, reported in every observation and audit line.
    pub version: String,
    /// Defaults and ceilings.
    #[serde(default)]
    pub limits: Limits,
    /// Root filesystem and job directories.
    #[serde(default)]
    pub filesystem: FilesystemPolicy,
    /// Network mode and allowlist.
    #[serde(default)]
    pub network: NetworkPolicy,
    /// Redaction of secret-shaped output.
    #[serde(default)]
    pub redaction: RedactionPolicy,
    /// The languages jobs may use. When the table is present it is the complete set.
    #[serde(default = "builtin_languages")]
    pub languages: BTreeMap<String, LanguageSpec>,
    /// Environment variables a request may set.
    #[serde(default)]
    pub env: EnvPolicy,
    /// The audit log.
    #[serde(default)]
    pub audit: AuditPolicy,
    /// Settings of the native backend.
    #[serde(default)]
    pub native: NativePolicy,
    /// Settings of the Engine API backends (docker, podman, gvisor).
    #[serde(default)]
    pub docker: DockerPolicy,
    /// Settings of the Kubernetes backend.
    #[serde(default)]
    pub kube: KubePolicy,
    /// The image store and when images are due for a rebuild.
    #[serde(default)]
    pub images: ImagesPolicy,
    /// Sessions: state across calls, off unless enabled.
    #[serde(default)]
    pub sessions: SessionsPolicy,
    /// MCP tasks: when a long `run_code` call becomes a task, and how many are kept.
    #[serde(default)]
    pub mcp: McpPolicy,
    /// OpenTelemetry export, when the `OTEL_*` variables do not configure it.
    #[serde(default)]
    pub telemetry: TelemetryPolicy,
    /// The E2B-compatible API's templates (docs/e2b.md).
    #[serde(default)]
    pub e2b: E2bPolicy,
    /// Each tenant's share of `airlock serve`'s job slots and queue.
    #[serde(default)]
    pub admission: AdmissionPolicy,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            version: "default-1".to_owned(),
            limits: Limits::default(),
            filesystem: FilesystemPolicy::default(),
            network: NetworkPolicy::default(),
            redaction: RedactionPolicy::default(),
            languages: builtin_languages(),
            env: EnvPolicy::default(),
            audit: AuditPolicy::default(),
            native: NativePolicy::default(),
            docker: DockerPolicy::default(),
            kube: KubePolicy::default(),
            images: ImagesPolicy::default(),
            sessions: SessionsPolicy::default(),
            mcp: McpPolicy::default(),
            telemetry: TelemetryPolicy::default(),
            e2b: E2bPolicy::default(),
            admission: AdmissionPolicy::default(),
        }
    }
}

impl Policy {
    /// The built-in policy (DESIGN §4).
    pub fn builtin() -> Self {
        Self::default()
    }

    /// Parses and validates a policy from TOML. `origin` names the source in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, Error> {
        let policy: Policy = toml::from_str(text).map_err(|source| Error::ParsePolicy {
            origin: origin.to_owned(),
            source,
        })?;
        policy.validate(origin)?;
        Ok(policy)
    }

    /// Renders the policy as TOML (every key explicit).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render policy: {e}\n"))
    }

    /// Checks every value against the absolute bounds and for consistency, and so the
    /// policy each E2B template with its own root or memory derives from it.
    pub fn validate(&self, origin: &str) -> Result<(), Error> {
        self.validate_own(origin)?;
        for name in self.e2b.templates.keys() {
            self.for_e2b_template(name, origin)?;
        }
        Ok(())
    }

    fn validate_own(&self, origin: &str) -> Result<(), Error> {
        let bad = |field: &str, reason: String| Error::InvalidPolicy {
            origin: origin.to_owned(),
            field: field.to_owned(),
            reason,
        };
        if self.version.is_empty()
            || self.version.len() > bounds::VERSION_MAX_BYTES
            || !self
                .version
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b))
        {
            return Err(bad(
                "version",
                format!(
                    "must be 1-{} characters of [A-Za-z0-9._+-]",
                    bounds::VERSION_MAX_BYTES
                ),
            ));
        }
        self.limits
            .check()
            .map_err(|(field, reason)| bad(&format!("limits.{field}"), reason))?;
        self.filesystem
            .check()
            .map_err(|(field, reason)| bad(&format!("filesystem.{field}"), reason))?;
        check_languages(&self.languages).map_err(|(field, reason)| bad(&field, reason))?;
        self.env
            .check()
            .map_err(|(field, reason)| bad(&format!("env.{field}"), reason))?;
        self.network
            .check()
            .map_err(|(field, reason)| bad(&format!("network.{field}"), reason))?;
        self.audit
            .check()
            .map_err(|(field, reason)| bad(&format!("audit.{field}"), reason))?;
        self.native
            .check(&self.languages)
            .map_err(|(field, reason)| bad(&format!("native.{field}"), reason))?;
        self.docker
            .check(&self.languages)
            .map_err(|(field, reason)| bad(&format!("docker.{field}"), reason))?;
        self.kube
            .check()
            .map_err(|(field, reason)| bad(&format!("kube.{field}"), reason))?;
        self.images
            .check()
            .map_err(|(field, reason)| bad(&format!("images.{field}"), reason))?;
        self.sessions
            .check()
            .map_err(|(field, reason)| bad(&format!("sessions.{field}"), reason))?;
        self.mcp
            .check()
            .map_err(|(field, reason)| bad(&format!("mcp.{field}"), reason))?;
        self.telemetry
            .check()
            .map_err(|(field, reason)| bad(&format!("telemetry.{field}"), reason))?;
        self.e2b
            .check()
            .map_err(|(field, reason)| bad(&format!("e2b.{field}"), reason))?;
        self.admission
            .check()
            .map_err(|(field, reason)| bad(&format!("admission.{field}"), reason))?;
        Ok(())
    }

    /// The policy the sandboxes of E2B template `name` run under: this one with the
    /// template's own root and memory (`[e2b.templates.NAME] rootfs`, `memory`),
    /// validated as a whole. `Ok(None)`: the template has neither (its sandboxes run on
    /// this policy) or does not exist.
    pub fn for_e2b_template(&self, name: &str, origin: &str) -> Result<Option<Policy>, Error> {
        let Some(template) = self
            .e2b
            .templates
            .get(name)
            .filter(|t| t.overrides_policy())
        else {
            return Ok(None);
        };
        let mut derived = self.clone();
        if let Some(rootfs) = &template.rootfs {
            derived.filesystem.rootfs = rootfs.clone();
        }
        if let Some(memory) = template.memory {
            derived.limits.memory = memory;
        }
        derived
            .validate_own(&format!("{origin} [e2b.templates.{name}]"))
            .map(|()| Some(derived))
    }

    /// Looks up a language.
    pub fn language(&self, name: &str) -> Option<&LanguageSpec> {
        self.languages.get(name)
    }

    /// The language a request that names none runs as: `python` when the policy defines
    /// it (what a model writes unless told otherwise, and the CLI's default), else the
    /// first language in name order. [`Policy::check`] guarantees there is one.
    pub fn default_language(&self) -> &str {
        if self.languages.contains_key("python") {
            return "python";
        }
        self.languages
            .keys()
            .next()
            .map_or("python", String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::units::ByteSize;
    use pretty_assertions::assert_eq;

    #[test]
    fn shipped_default_policy_equals_the_built_in_one() {
        let parsed = Policy::from_toml(BUILTIN_POLICY_TOML, BUILTIN_ORIGIN).unwrap();
        assert_eq!(parsed, Policy::builtin());
    }

    #[test]
    fn built_in_policy_matches_design() {
        let p = Policy::builtin();
        assert_eq!(p.version, "default-1");
        assert_eq!(p.limits.timeout, Duration::from_secs(5));
        assert_eq!(p.limits.memory, ByteSize::mib(256));
        assert_eq!(p.limits.cpus.millis(), 500);
        assert_eq!(p.limits.pids, 64);
        assert_eq!(p.limits.tmp, ByteSize::mib(16));
        assert_eq!(p.limits.stdout.as_u64(), 8000);
        assert_eq!(p.limits.stderr.as_u64(), 2000);
        assert_eq!(p.limits.flood, ByteSize::mib(64));
        assert_eq!(p.filesystem.rootfs, RootfsSpec::Host);
        assert_eq!(p.filesystem.workdir, WorkdirMode::Ro);
        assert_eq!(p.network.mode, NetworkMode::None);
        assert_eq!(
            p.languages["python"].command,
            vec!["python3", "-B", "-E", "-s", "-u", "{file}"]
        );
    }

    #[test]
    fn the_default_language_is_python_when_defined_else_the_first() {
        assert_eq!(Policy::builtin().default_language(), "python");
        let p = Policy::from_toml(
            "version = \"v\"\n[languages.sh]\ncommand = [\"sh\", \"{file}\"]\nfile = \"m.sh\"\n[languages.bash]\ncommand = [\"bash\", \"{file}\"]\nfile = \"m.sh\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.default_language(), "bash");
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err =
            Policy::from_toml("version = \"x\"\n[limits]\ntimout = \"5s\"\n", "t").unwrap_err();
        assert!(err.to_string().contains("timout"), "{err}");
        let err = Policy::from_toml("version = \"x\"\ncolour = 1\n", "t").unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    #[test]
    fn version_is_required() {
        let err = Policy::from_toml("[limits]\ntimeout = \"5s\"\n", "t").unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
    }

    #[test]
    fn partial_sections_take_defaults() {
        let p =
            Policy::from_toml("version = \"v2\"\n[limits]\nmemory = \"128MiB\"\n", "t").unwrap();
        assert_eq!(p.limits.memory, ByteSize::mib(128));
        assert_eq!(p.limits.timeout, Duration::from_secs(5));
    }

    #[test]
    fn absurd_policy_values_are_refused() {
        for bad in [
            "[limits]\ntimeout = \"0s\"",
            "[limits]\nmemory = \"1KiB\"",
            "[limits]\npids = 0",
            "[limits]\ncpus = 0",
            "[limits]\nflood = \"1KiB\"",
            "[filesystem]\nrootfs = \"image:python:3\"",
            "[filesystem]\nrootfs = \"dir:relative\"",
            "[languages.x]\ncommand = [\"x\"]\nfile = \"x\"",
            "[languages.x]\ncommand = [\"x\", \"{file}\"]\nfile = \"../x\"",
            "[env]\nallow = [\"NOT-A-NAME\"]",
            "[native]\ncgroup_parent = \"/abs\"",
            "[native]\nhost_uid_base = 0",
            "[native]\nwarm_pool = 65",
            "[native]\nwarm_pool = 1\nwarm_language = \"node\"",
            "[native]\nwarm_pool = 1\nwarm_language = \"cobol\"",
            "[native]\nwarm_idle = \"0s\"",
            "[native]\nwarm_idle = \"90000s\"",
            "[docker]\ndocker_socket = \"relative.sock\"",
            "[docker]\npodman_socket = \"\"",
            "[docker]\nruntime = \"\"",
            "[docker]\ngvisor_runtime = \"runsc --platform=kvm\"",
            "[docker]\npodman_runtime = \"../crun\"",
            "[docker]\nsocket = \"/x\"",
            "[kube]\nnamespace = \"Jobs\"",
            "[kube]\nnamespace = \"\"",
            "[kube]\nruntime_class = \"g visor\"",
            "[kube]\nimage = \"python:3.12\"",
            "[kube]\nimage = \"python@sha256:abc\"",
            "[kube]\nservice_account = \"\"",
            "[kube]\nnode_selector = { \"bad key!\" = \"x\" }",
            "[kube]\nnode_selector = { pool = \"-x\" }",
            "[kube]\ntolerations = [{ key = \"k\", operator = \"Maybe\" }]",
            "[kube]\ntolerations = [{ operator = \"Equal\", value = \"v\" }]",
            "[kube]\ntolerations = [{ key = \"k\", operator = \"Exists\", value = \"v\" }]",
            "[kube]\ntolerations = [{ key = \"k\", effect = \"Sometimes\" }]",
            "[kube]\nephemeral_storage = \"1KiB\"",
            "[kube]\nmax_pods = 0",
            "[kube]\nseccomp_profile = \"Unconfined\"",
            "[kube]\nseccomp_profile = \"Localhost:/abs.json\"",
            "[kube]\nseccomp_profile = \"Localhost:../x.json\"",
            "[kube]\nstart_timeout = \"0s\"",
            "[kube]\nallow_degraded = [\"everything\"]",
            "[kube]\nlog_streams = \"both\"",
            "[kube]\napi = \"x\"",
        ] {
            let text = format!("version = \"t\"\n{bad}\n");
            assert!(Policy::from_toml(&text, "t").is_err(), "accepted: {bad}");
        }
    }

    #[test]
    fn policy_round_trips_through_toml() {
        let p = Policy::builtin();
        let again = Policy::from_toml(&p.to_toml(), "t").unwrap();
        assert_eq!(again, p);
    }
}
