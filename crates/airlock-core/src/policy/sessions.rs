//! `[sessions]`: state across calls, off unless the policy turns it on. A session belongs
//! to one tenant, never outlives `ttl`, and is destroyed after `idle` without a call.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, duration_serde};

/// What a session keeps between calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionMode {
    /// Each call is a fresh sandbox; only the session's `/work` persists (files carry
    /// state, processes never do).
    #[default]
    Workspace,
    /// One long-lived sandbox holding a Python interpreter whose globals persist; the
    /// session's memory, CPU and process limits hold across all its calls.
    Kernel,
}

impl SessionMode {
    /// The name used in the policy and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionMode::Workspace => "workspace",
            SessionMode::Kernel => "kernel",
        }
    }
}

/// The sessions section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsPolicy {
    /// Whether tenants may open sessions at all.
    pub enabled: bool,
    /// Most sessions one tenant may hold open at once.
    pub max_per_tenant: u32,
    /// The longest a session lives, however busy.
    #[serde(with = "duration_serde")]
    pub ttl: Duration,
    /// A session without a call for this long is destroyed.
    #[serde(with = "duration_serde")]
    pub idle: Duration,
    /// What a session keeps between calls.
    pub mode: SessionMode,
    /// Size cap of the session's `/work` (a tmpfs of this size: the filesystem enforces it).
    pub workspace_bytes: ByteSize,
    /// Most files and directories in the session's `/work`.
    pub workspace_files: u32,
    /// In kernel mode, how long a call past its wall time has to stop after it is
    /// interrupted before the whole kernel is killed.
    #[serde(with = "duration_serde")]
    pub interrupt_grace: Duration,
}

impl Default for SessionsPolicy {
    fn default() -> Self {
        // On, bounded (issue 31: an E2B sandbox is a session, and the default policy has
        // them); kernel mode, so E2B's run_code has its kernel.
        Self {
            enabled: true,
            max_per_tenant: 4,
            ttl: Duration::from_secs(3600),
            idle: Duration::from_secs(600),
            mode: SessionMode::Kernel,
            workspace_bytes: ByteSize::mib(64),
            workspace_files: 1024,
            interrupt_grace: Duration::from_secs(2),
        }
    }
}

impl SessionsPolicy {
    /// Most sessions a policy may let one tenant hold.
    pub const MAX_PER_TENANT_MAX: u32 = 1024;
    /// Shortest session life (`ttl` and `idle`).
    pub const LIFE_MIN: Duration = Duration::from_secs(1);
    /// Longest session life.
    pub const TTL_MAX: Duration = Duration::from_secs(24 * 3600);
    /// Smallest session `/work`.
    pub const WORKSPACE_MIN_BYTES: u64 = 64 * 1024;
    /// Largest session `/work`.
    pub const WORKSPACE_MAX_BYTES: u64 = 4 << 30;
    /// Most files in a session `/work`.
    pub const WORKSPACE_FILES_MAX: u32 = 65_536;
    /// Longest interrupt grace.
    pub const GRACE_MAX: Duration = Duration::from_secs(60);

    /// Checks the bounds; returns the field name and reason.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if self.max_per_tenant == 0 || self.max_per_tenant > Self::MAX_PER_TENANT_MAX {
            return Err((
                "max_per_tenant",
                format!("must be between 1 and {}", Self::MAX_PER_TENANT_MAX),
            ));
        }
        let life = |d: Duration| (Self::LIFE_MIN..=Self::TTL_MAX).contains(&d);
        if !life(self.ttl) {
            return Err((
                "ttl",
                format!(
                    "must be between {}s and {}s",
                    Self::LIFE_MIN.as_secs(),
                    Self::TTL_MAX.as_secs()
                ),
            ));
        }
        if !life(self.idle) || self.idle > self.ttl {
            return Err((
                "idle",
                format!("must be between {}s and the ttl", Self::LIFE_MIN.as_secs()),
            ));
        }
        let bytes = self.workspace_bytes.as_u64();
        if !(Self::WORKSPACE_MIN_BYTES..=Self::WORKSPACE_MAX_BYTES).contains(&bytes) {
            return Err((
                "workspace_bytes",
                format!(
                    "must be between {} and {}",
                    ByteSize::bytes(Self::WORKSPACE_MIN_BYTES),
                    ByteSize::bytes(Self::WORKSPACE_MAX_BYTES)
                ),
            ));
        }
        if self.workspace_files == 0 || self.workspace_files > Self::WORKSPACE_FILES_MAX {
            return Err((
                "workspace_files",
                format!("must be between 1 and {}", Self::WORKSPACE_FILES_MAX),
            ));
        }
        if self.interrupt_grace.is_zero() || self.interrupt_grace > Self::GRACE_MAX {
            return Err((
                "interrupt_grace",
                format!("must be between 1ms and {}s", Self::GRACE_MAX.as_secs()),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    #[test]
    fn the_default_policy_has_bounded_kernel_sessions() {
        // Issue 31: an E2B sandbox is a session, so the default policy has them on,
        // bounded; kernel mode, so the code interpreter's run_code has its kernel.
        let p = Policy::builtin();
        assert!(p.sessions.enabled);
        assert_eq!(p.sessions.mode, SessionMode::Kernel);
        assert_eq!(p.sessions.max_per_tenant, 4);
        assert_eq!(p.sessions.ttl, Duration::from_secs(3600));
        assert_eq!(p.sessions.idle, Duration::from_secs(600));
        // A policy file without a [sessions] section has the same; one turns them off.
        let bare = Policy::from_toml("version = \"v\"\n", "t").unwrap();
        assert!(bare.sessions.enabled);
        let off = Policy::from_toml("version = \"v\"\n[sessions]\nenabled = false\n", "t").unwrap();
        assert!(!off.sessions.enabled);
    }

    #[test]
    fn a_sessions_section_parses() {
        let p = Policy::from_toml(
            "version = \"v\"\n[sessions]\nenabled = true\nmode = \"kernel\"\nmax_per_tenant = 2\nttl = \"30m\"\nidle = \"5m\"\n",
            "t",
        )
        .unwrap();
        assert!(p.sessions.enabled);
        assert_eq!(p.sessions.mode, SessionMode::Kernel);
        assert_eq!(p.sessions.max_per_tenant, 2);
        assert_eq!(p.sessions.ttl, Duration::from_secs(1800));
        assert_eq!(p.sessions.idle, Duration::from_secs(300));
    }

    #[test]
    fn bad_sessions_values_are_refused_naming_the_field() {
        for (bad, field) in [
            ("max_per_tenant = 0", "sessions.max_per_tenant"),
            ("max_per_tenant = 5000", "sessions.max_per_tenant"),
            ("ttl = \"0s\"", "sessions.ttl"),
            ("ttl = \"25h\"", "sessions.ttl"),
            ("idle = \"2h\"", "sessions.idle"),
            ("workspace_bytes = \"1KiB\"", "sessions.workspace_bytes"),
            ("workspace_files = 0", "sessions.workspace_files"),
            ("interrupt_grace = \"0s\"", "sessions.interrupt_grace"),
            ("mode = \"vm\"", "mode"),
            ("shared = true", "shared"),
        ] {
            let text = format!("version = \"t\"\n[sessions]\n{bad}\n");
            let err = Policy::from_toml(&text, "t").unwrap_err().to_string();
            assert!(err.contains(field), "{bad}: {err}");
        }
    }
}
