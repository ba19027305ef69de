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

/// An error and every one of its sources, joined with ": ". Sources carry the detail a
/// caller needs (the OS reason behind an I/O failure), and `Display` of the outer error
/// alone drops them.
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Like [`chain`], but a source whose text already appears in the message so far is left
/// out: for errors whose `Display` already embeds their source (`"...: {0}"` with
/// `#[from]`), which would otherwise be printed twice.
pub fn chain_without_repeats(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let source_text = s.to_string();
        if !text.contains(&source_text) {
            text.push_str(": ");
            text.push_str(&source_text);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a fixed message and an optional source.
    #[derive(Debug)]
    struct Link {
        message: &'static str,
        source: Option<Box<Link>>,
    }

    impl std::fmt::Display for Link {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.message)
        }
    }

    impl std::error::Error for Link {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.source
                .as_deref()
                .map(|s| s as &(dyn std::error::Error + 'static))
        }
    }

    fn links(messages: &[&'static str]) -> Link {
        let mut link: Option<Box<Link>> = None;
        for message in messages.iter().rev() {
            link = Some(Box::new(Link {
                message,
                source: link,
            }));
        }
        *link.unwrap()
    }

    #[test]
    fn chain_joins_every_source_in_order() {
        let err = links(&["open /x", "mount", "Permission denied (os error 13)"]);
        assert_eq!(
            chain(&err),
            "open /x: mount: Permission denied (os error 13)"
        );
        assert_eq!(chain(&links(&["alone"])), "alone");
    }

    #[test]
    fn chain_keeps_repeated_text_and_chain_without_repeats_drops_it() {
        let err = links(&["read policy: not found", "not found", "os error 2"]);
        assert_eq!(chain(&err), "read policy: not found: not found: os error 2");
        assert_eq!(
            chain_without_repeats(&err),
            "read policy: not found: os error 2"
        );
    }
}
