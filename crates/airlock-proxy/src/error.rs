//! The one error type of this crate: each variant names the operation that failed.
//!
//! Only building a configuration and starting the proxy can fail. What happens to a
//! request (refused, upstream down, limit hit) is never an error of the proxy: it is an
//! HTTP answer to the job and a [`ConnectionRecord`](crate::ConnectionRecord).

use airlock_core::policy::NetworkMode;

/// Building a [`ProxyConfig`](crate::ProxyConfig) or starting the proxy failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The policy does not put the job's network in proxy mode.
    #[error("the policy's network mode is {mode}, not proxy")]
    CheckMode {
        /// The policy's mode.
        mode: NetworkMode,
    },
    /// An allowlist entry does not parse or cannot be matched safely.
    #[error("allowlist entry {entry:?} is invalid: {reason}")]
    ParseAllowEntry {
        /// The entry as written.
        entry: String,
        /// Why it is refused.
        reason: String,
    },
    /// The job asked for a host the policy does not allow.
    #[error("allowlist entry {entry:?} is not in the policy's allowlist")]
    CheckAllowEntry {
        /// The entry as written.
        entry: String,
    },
    /// An `allow_ranges` entry is not a CIDR range.
    #[error("allowed range {range:?} is invalid: {reason}")]
    ParseAllowRange {
        /// The range as written.
        range: String,
        /// Why it is refused.
        reason: String,
    },
    /// A secret's placeholder or hosts are unusable.
    #[error("secret #{index} (placeholder for {value_env}) is invalid: {reason}")]
    ParseSecret {
        /// Its position in the policy's `secrets`, from 0.
        index: usize,
        /// The executor variable holding its value.
        value_env: String,
        /// Why it is refused.
        reason: String,
    },
    /// The executor's environment has no value for a secret.
    #[error("secret #{index}: the executor's environment has no {value_env}")]
    ReadSecretValue {
        /// Its position in the policy's `secrets`, from 0.
        index: usize,
        /// The executor variable that is missing.
        value_env: String,
    },
    /// A secret's value cannot be sent in a header. The value is never part of the message.
    #[error("secret #{index}: the value of {value_env} {reason}")]
    CheckSecretValue {
        /// Its position in the policy's `secrets`, from 0.
        index: usize,
        /// The executor variable holding it.
        value_env: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An `extra_roots` file cannot be used.
    #[error("extra trust roots {path}: {reason}")]
    ReadExtraRoots {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The job's CA could not be made.
    #[error("make the job's CA")]
    GenerateCa {
        /// What went wrong.
        #[source]
        source: crate::ca::CaError,
    },
    /// A `[network.packages]` URL is unusable.
    #[error("package index {url:?}: {reason}")]
    ParsePackageIndex {
        /// The URL as written.
        url: String,
        /// Why.
        reason: String,
    },
    /// `spawn` was called outside a tokio runtime.
    #[error("cannot start the proxy outside a tokio runtime")]
    FindRuntime {
        /// What tokio reported.
        #[source]
        source: tokio::runtime::TryCurrentError,
    },
    /// The listening socket cannot be used by the runtime.
    #[error("cannot adopt the listening socket")]
    AdoptListener {
        /// What the OS reported.
        #[source]
        source: std::io::Error,
    },
}
