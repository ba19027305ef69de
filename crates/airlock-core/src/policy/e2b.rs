//! `[e2b]`: the E2B-compatible API (`airlock serve` answers E2B's SDKs). An E2B sandbox is
//! an airlock session of the caller's tenant, so it is bounded by `[sessions]`; this
//! section names the templates a create may ask for.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::filesystem::RootfsSpec;
use crate::units::ByteSize;

/// One template a sandbox may be created from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct E2bTemplate {
    /// What the template is, shown to whoever lists them.
    #[serde(default)]
    pub description: String,
    /// Whether its sandboxes have the Python kernel the code interpreter's `/execute`
    /// runs on (`code-interpreter-v1`); without it `/execute` is refused.
    #[serde(default)]
    pub kernel: bool,
    /// The root filesystem of its sandboxes (commands and kernel), instead of the
    /// policy's `[filesystem] rootfs`: e.g. the `code-interpreter-v1` image
    /// (`"image:airlock-code-interpreter:v1@sha256:…"`, built by `airlock image build`
    /// from `images/code-interpreter-v1`). `None`: the policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<RootfsSpec>,
    /// The memory limit of its sandboxes, instead of the policy's `[limits] memory` (a
    /// kernel with pandas and matplotlib loaded wants about 1 GiB). The policy's author
    /// sets it, as they set `[limits]`: a create request cannot. `None`: the policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
}

impl E2bTemplate {
    /// Whether the template runs on other settings than its policy's (its own root or
    /// memory), so its sandboxes need an engine of their own.
    pub fn overrides_policy(&self) -> bool {
        self.rootfs.is_some() || self.memory.is_some()
    }
}

/// The E2B section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct E2bPolicy {
    /// Whether the E2B routes answer at all (off: every E2B route is 404 in E2B's shape).
    pub enabled: bool,
    /// The templates, by name: what `Sandbox.create(template=...)` may name.
    pub templates: BTreeMap<String, E2bTemplate>,
}

impl Default for E2bPolicy {
    fn default() -> Self {
        let mut templates = BTreeMap::new();
        templates.insert(
            "base".to_owned(),
            E2bTemplate {
                description: "commands and files over the session's /work, on the policy's root"
                    .to_owned(),
                kernel: false,
                rootfs: None,
                memory: None,
            },
        );
        templates.insert(
            "code-interpreter-v1".to_owned(),
            E2bTemplate {
                description: "base, plus a stateful Python kernel for run_code".to_owned(),
                kernel: true,
                rootfs: None,
                memory: None,
            },
        );
        Self {
            enabled: true,
            templates,
        }
    }
}

impl E2bPolicy {
    /// Longest template name.
    pub const NAME_MAX_BYTES: usize = 64;

    /// Checks the names; returns the field name and reason.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        use super::bounds::{MEMORY_MAX_BYTES, MEMORY_MIN_BYTES};
        for (name, template) in &self.templates {
            if let Some(memory) = template.memory
                && !(MEMORY_MIN_BYTES..=MEMORY_MAX_BYTES).contains(&memory.as_u64())
            {
                return Err((
                    "templates",
                    format!(
                        "{name:?}: memory must be between {} and {}",
                        ByteSize::bytes(MEMORY_MIN_BYTES),
                        ByteSize::bytes(MEMORY_MAX_BYTES)
                    ),
                ));
            }
            let valid = !name.is_empty()
                && name.len() <= Self::NAME_MAX_BYTES
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
            if !valid {
                return Err((
                    "templates",
                    format!(
                        "{name:?}: a template name is 1-{} characters of [A-Za-z0-9._:-]",
                        Self::NAME_MAX_BYTES
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The template names, comma-separated (for refusals that name them).
    pub fn names(&self) -> String {
        self.templates
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_has_base_and_code_interpreter() {
        let policy = E2bPolicy::default();
        assert_eq!(policy.names(), "base, code-interpreter-v1");
        assert!(policy.templates["code-interpreter-v1"].kernel);
        assert!(!policy.templates["base"].kernel);
        assert!(policy.check().is_ok());
    }

    #[test]
    fn bad_names_are_refused() {
        let mut policy = E2bPolicy::default();
        policy.templates.insert(
            "has space".to_owned(),
            E2bTemplate {
                description: String::new(),
                kernel: false,
                rootfs: None,
                memory: None,
            },
        );
        assert!(policy.check().is_err());
    }

    #[test]
    fn a_template_may_name_its_own_root_and_memory() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let text = format!(
            "version = \"t\"\n[e2b.templates.code-interpreter-v1]\nkernel = true\n\
             rootfs = \"image:airlock-code-interpreter:v1@{digest}\"\nmemory = \"1GiB\"\n"
        );
        let policy = crate::policy::Policy::from_toml(&text, "test").unwrap();
        let template = &policy.e2b.templates["code-interpreter-v1"];
        assert!(template.overrides_policy());
        let derived = policy
            .for_e2b_template("code-interpreter-v1", "test")
            .unwrap()
            .unwrap();
        assert_eq!(
            derived.filesystem.rootfs,
            RootfsSpec::Image {
                reference: "airlock-code-interpreter:v1".into(),
                digest
            }
        );
        assert_eq!(derived.limits.memory, ByteSize::mib(1024));
        // Everything else is the policy's own.
        assert_eq!(derived.limits.timeout, policy.limits.timeout);
        assert_eq!(derived.sessions, policy.sessions);
        // A template without either runs on the policy itself.
        assert_eq!(policy.for_e2b_template("base", "test").unwrap(), None);
        assert_eq!(policy.for_e2b_template("nope", "test").unwrap(), None);
        // A memory past the absolute bounds is refused with the policy.
        let huge = "version = \"t\"\n[e2b.templates.big]\nmemory = \"4TiB\"\n";
        let refused = crate::policy::Policy::from_toml(huge, "test").unwrap_err();
        assert!(refused.to_string().contains("\"big\": memory"), "{refused}");
        // An image root must be pinned by digest, as [filesystem] rootfs.
        let unpinned = "version = \"t\"\n[e2b.templates.x]\nrootfs = \"image:nodigest\"\n";
        let refused = crate::policy::Policy::from_toml(unpinned, "t").unwrap_err();
        assert!(format!("{refused:?}").contains("pinned"), "{refused:?}");
    }
}
