//! `[env]`: the environment variables a request may set.

use serde::{Deserialize, Serialize};

/// True for a POSIX-style environment variable name.
pub fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 128
}

/// Environment variables a request may set (beyond the fixed base of DESIGN S1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct EnvPolicy {
    /// Names a request may set.
    pub allow: Vec<String>,
}

impl EnvPolicy {
    /// Checks that every allowed name is a variable name; returns the field name and reason.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        for name in &self.allow {
            if !is_env_name(name) {
                return Err(("allow", format!("{name:?} is not a variable name")));
            }
        }
        Ok(())
    }
}
