//! `[native]`: settings of the native backend.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::LanguageSpec;
use crate::units::duration_serde;

/// Settings of the native backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NativePolicy {
    /// Where job cgroups are created: `"auto"` or a path relative to the cgroup mount.
    pub cgroup_parent: CgroupParent,
    /// When airlock runs as root, in-sandbox ids 0..65535 map to host ids starting here,
    /// so the job's uid 65534 is an unused host uid, never a real account or root.
    pub host_uid_base: u32,
    /// Weaker shapes this policy accepts when the host cannot give the full one. Empty by
    /// default: a missing control refuses the job. `"cgroup"` accepts rlimits (address
    /// space, process count, CPU time) in place of cgroup limits, for unprivileged use
    /// without a delegated cgroup; `"swap"` accepts an uncapped swap on a host with swap
    /// enabled and no swap accounting; observations and audit lines then list what is
    /// degraded.
    pub allow_degraded: Vec<DegradedControl>,
    /// Sandboxes `airlock serve` and `airlock mcp` keep started ahead of time for
    /// `warm_language` jobs, each fully isolated and used for one job only. 0 (the default)
    /// starts every sandbox on demand.
    pub warm_pool: u32,
    /// The language warm sandboxes are started for; its interpreter must be Python.
    pub warm_language: String,
    /// How long a warm sandbox may wait for its job; older ones are torn down and replaced,
    /// so no sandbox outlives this however quiet the server is.
    #[serde(with = "duration_serde")]
    pub warm_idle: Duration,
    /// Python modules each warm sandbox's interpreter imports while it waits for its job
    /// (`["numpy", "pandas"]`), so that the job's own `import` finds them loaded. In the
    /// sandbox itself, before any job is there: nothing is shared between jobs. A module
    /// that cannot be imported is skipped (the job's import then fails as it would), and
    /// what importing prints is discarded. Their memory counts against the job's limit.
    pub warm_preload: Vec<String>,
    /// Whether the warm pool forks its sandboxes from a zygote: one trusted interpreter per
    /// template, started in a sandbox of its own, that imports `warm_preload` once and then
    /// only forks, each child building its own namespaces, cgroup, mounts and filters before
    /// it waits for its job (docs/speed.md). On by default (it has no effect without a warm
    /// pool); `false` starts every warm sandbox from scratch. Root mode only (a rootless
    /// airlock starts them from scratch). Results and the security shape are the same
    /// either way; the latency, the memory a waiting sandbox costs and the differences
    /// docs/speed.md lists are not.
    pub zygote: bool,
    /// Most sandboxes one zygote forks before it is replaced by a fresh one. A zygote's
    /// children share its address layout (heap, libc, stack, so very likely the stack
    /// canary) and the interpreter's string hash secret (docs/speed.md); this bounds how
    /// many jobs share them, as `warm_idle` bounds for how long. 1 gives every job its own
    /// (a zygote start per job, the speed of starting from scratch).
    pub zygote_forks: u32,
}

/// A dotted Python module name of ASCII identifiers (`numpy`, `os.path`): what a warm
/// sandbox's bootstrap may be told to import, written into its program as a literal.
fn is_module_name(name: &str) -> bool {
    name.len() <= 200
        && name.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// A control a policy may accept in a weaker form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DegradedControl {
    /// rlimits instead of cgroup limits for memory, CPU and processes.
    Cgroup,
    /// A memory limit without a swap limit, on a host that has swap enabled but no swap
    /// accounting (v1 without `memory.memsw.*`, v2 without `memory.swap.max`): a job may
    /// then page out beyond its memory limit.
    Swap,
}

impl NativePolicy {
    /// How many ids are mapped (in-sandbox 0..=65535).
    pub const MAPPED_IDS: u32 = 65_536;
    /// The lowest allowed base: below it lie real accounts and subuid ranges.
    pub const HOST_UID_BASE_MIN: u32 = 1_000_000;
    /// The largest warm pool (each warm sandbox holds an interpreter's memory).
    pub const WARM_POOL_MAX: u32 = super::warm::WARM_POOL_MAX;
    /// The shortest idle lifetime: below it the pool would spend its time restarting.
    pub const WARM_IDLE_MIN: Duration = super::warm::WARM_IDLE_MIN;
    /// The longest idle lifetime.
    pub const WARM_IDLE_MAX: Duration = super::warm::WARM_IDLE_MAX;
    /// The most modules `warm_preload` may name.
    pub const WARM_PRELOAD_MAX: usize = 32;
    /// Largest `zygote_forks`.
    pub const ZYGOTE_FORKS_MAX: u32 = 100_000;

    /// Checks the settings; `languages` is the policy's table, which the warm language must
    /// be in. Returns the field name and reason.
    pub(super) fn check(
        &self,
        languages: &BTreeMap<String, LanguageSpec>,
    ) -> Result<(), (&'static str, String)> {
        if let CgroupParent::Path(path) = &self.cgroup_parent
            && (path.is_absolute() || path.components().any(|c| c.as_os_str() == ".."))
        {
            return Err((
                "cgroup_parent",
                "must be \"auto\" or a relative path below the cgroup mount, without ..".to_owned(),
            ));
        }
        if self.host_uid_base < Self::HOST_UID_BASE_MIN
            || self.host_uid_base > u32::MAX - Self::MAPPED_IDS
        {
            return Err((
                "host_uid_base",
                format!(
                    "must be between {} and {}",
                    Self::HOST_UID_BASE_MIN,
                    u32::MAX - Self::MAPPED_IDS
                ),
            ));
        }
        super::warm::check_warm(
            &[("warm_pool", self.warm_pool)],
            self.warm_idle,
            &self.warm_language,
            languages,
        )?;
        if !(1..=Self::ZYGOTE_FORKS_MAX).contains(&self.zygote_forks) {
            return Err((
                "zygote_forks",
                format!("must be between 1 and {}", Self::ZYGOTE_FORKS_MAX),
            ));
        }
        if self.warm_preload.len() > Self::WARM_PRELOAD_MAX {
            return Err((
                "warm_preload",
                format!("at most {} modules", Self::WARM_PRELOAD_MAX),
            ));
        }
        if let Some(bad) = self.warm_preload.iter().find(|m| !is_module_name(m)) {
            return Err((
                "warm_preload",
                format!(
                    "{bad:?} is not a Python module name (dotted identifiers, e.g. \"numpy\" or \"os.path\")"
                ),
            ));
        }
        Ok(())
    }
}

impl Default for NativePolicy {
    fn default() -> Self {
        Self {
            cgroup_parent: CgroupParent::Auto,
            host_uid_base: 1_879_048_192,
            allow_degraded: Vec::new(),
            warm_pool: 0,
            warm_language: "python".to_owned(),
            warm_idle: Duration::from_secs(600),
            warm_preload: Vec::new(),
            zygote: true,
            zygote_forks: 64,
        }
    }
}

/// Where job cgroups live.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CgroupParent {
    /// Below airlock's own cgroup.
    #[default]
    Auto,
    /// A path relative to the cgroup mount root.
    Path(PathBuf),
}

impl Serialize for CgroupParent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            CgroupParent::Auto => serializer.serialize_str("auto"),
            CgroupParent::Path(p) => serializer.serialize_str(&p.to_string_lossy()),
        }
    }
}

impl<'de> Deserialize<'de> for CgroupParent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(if text == "auto" {
            CgroupParent::Auto
        } else {
            CgroupParent::Path(PathBuf::from(text))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_preload_takes_module_names_only() {
        let languages = BTreeMap::new();
        let mut native = NativePolicy {
            warm_preload: vec!["numpy".into(), "os.path".into(), "_private".into()],
            ..NativePolicy::default()
        };
        assert!(native.check(&languages).is_ok());
        for bad in [
            "",
            "a b",
            "os..path",
            "1st",
            "x\"]; import os; [\"",
            "é",
            ".x",
        ] {
            native.warm_preload = vec![bad.into()];
            let (field, _) = native.check(&languages).expect_err(bad);
            assert_eq!(field, "warm_preload", "{bad}");
        }
        native.warm_preload = vec!["m".into(); NativePolicy::WARM_PRELOAD_MAX + 1];
        assert!(native.check(&languages).is_err());
    }
}
