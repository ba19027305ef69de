//! The one error type of this crate: each variant names the operation that failed.

/// Building a [`Redactor`](crate::Redactor) failed. Redacting never fails.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RedactError {
    /// A built-in rule file is not valid TOML or does not have the rule format.
    #[error("cannot parse the redaction rules in {file}")]
    ParseRules {
        /// The rule file, relative to the repository root.
        file: &'static str,
        /// What the TOML parser reported.
        #[source]
        source: toml::de::Error,
    },
    /// A built-in rule's regex does not compile.
    #[error("redaction rule {id:?} does not compile")]
    CompileRule {
        /// The rule's id.
        id: String,
        /// What the regex compiler reported.
        #[source]
        source: regex::Error,
    },
    /// A built-in rule is well-formed TOML but breaks a rule invariant.
    #[error("redaction rule {id:?} is invalid: {reason}")]
    InvalidRule {
        /// The rule's id.
        id: String,
        /// Which invariant it breaks.
        reason: String,
    },
    /// An extra regex from the policy does not compile.
    #[error("extra redaction regex #{index} (policy [redaction] extra[{index}]) does not compile")]
    InvalidExtra {
        /// Its position in `extra`, from 0.
        index: usize,
        /// What the regex compiler reported.
        #[source]
        source: regex::Error,
    },
    /// An exact secret value is unusable. The value itself is never part of the message.
    #[error("exact secret value #{index} is invalid: {reason}")]
    InvalidExact {
        /// Its position in `exact`, from 0.
        index: usize,
        /// Why it was refused.
        reason: String,
    },
    /// The keyword prefilter or the exact-value matcher could not be built.
    #[error("cannot build the {what} automaton")]
    BuildAutomaton {
        /// Which automaton.
        what: &'static str,
        /// What aho-corasick reported.
        #[source]
        source: aho_corasick::BuildError,
    },
    /// The pattern that recognises earlier `[REDACTED:...]` markers does not compile.
    #[error("cannot compile the redaction marker pattern")]
    CompileMarker {
        /// What the regex compiler reported.
        #[source]
        source: regex::Error,
    },
}
