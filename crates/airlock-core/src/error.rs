//! The one error type of airlock-core.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The public classification of an executor-side failure (DESIGN §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is malformed: bad names, bad sizes, unknown language, NUL bytes.
    InvalidInput,
    /// The request is well formed but asks for more than the policy allows.
    PolicyDenied,
    /// The caller is not authenticated: no token, or a token the server does not know.
    Unauthorized,
    /// The backend cannot run jobs on this host right now.
    BackendUnavailable,
    /// airlock itself failed.
    Internal,
}

impl ErrorKind {
    /// The wire name (`"invalid_input"`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::PolicyDenied => "policy_denied",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::BackendUnavailable => "backend_unavailable",
            ErrorKind::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that can go wrong while parsing a policy or checking a request against it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The policy text is not valid TOML for the policy schema (includes unknown keys).
    #[error("policy {origin}: {source}")]
    ParsePolicy {
        /// Where the text came from (a path, or "built-in").
        origin: String,
        /// The TOML error, which names the offending key and line.
        source: toml::de::Error,
    },
    /// The policy parsed but a value is out of range or inconsistent.
    #[error("policy {origin}: {field}: {reason}")]
    InvalidPolicy {
        /// Where the policy came from.
        origin: String,
        /// The dotted key, e.g. `limits.memory`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The request is malformed.
    #[error("{field}: {reason}")]
    InvalidInput {
        /// The request field, e.g. `files[2].path`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The request exceeds what the policy allows.
    #[error("{field}: {reason}")]
    PolicyDenied {
        /// The request field, e.g. `limits.memory`.
        field: String,
        /// Which ceiling it exceeds.
        reason: String,
    },
}

impl Error {
    /// The public kind this error is reported as.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::ParsePolicy { .. } | Error::InvalidPolicy { .. } => ErrorKind::InvalidInput,
            Error::InvalidInput { .. } => ErrorKind::InvalidInput,
            Error::PolicyDenied { .. } => ErrorKind::PolicyDenied,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn denied(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::PolicyDenied {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
