//! `[redaction]`: redaction of secret-shaped output.

use serde::{Deserialize, Serialize};

/// Redaction of secret-shaped output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedactionPolicy {
    /// Whether the built-in secret patterns apply.
    pub builtin: bool,
    /// More regular expressions (a group named `secret`, when present, is what is replaced).
    pub extra: Vec<String>,
    /// Literal values that are secrets wherever they appear (4 bytes or more).
    pub exact: Vec<String>,
    /// Names of the executor's environment variables whose values are secrets wherever they
    /// appear: the executor's own keys stay out of observations even if a job learns them.
    pub exact_env: Vec<String>,
}

impl Default for RedactionPolicy {
    fn default() -> Self {
        Self {
            builtin: true,
            extra: Vec::new(),
            exact: Vec::new(),
            exact_env: Vec::new(),
        }
    }
}
