//! The HTTP API's JSON: the error body, health, sessions and stream chunks; the run
//! request is every door's, airlock-core's [`RunRequest`]. Their JSON Schemas, and the observation's, are derived
//! from these and airlock-core's types (`airlock_core::schema`), so the OpenAPI document
//! cannot drift from what the server parses and sends.

use airlock_core::ErrorKind;
use airlock_core::observation::{ErrorInfo, Outcome};
pub use airlock_core::request::{NetworkChoice, RequestFile, RunRequest};
use airlock_core::request::{RequestError, seconds};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The body of every error response (DESIGN §2). When the engine saw the request, the
/// body is the whole error observation, so it also has `job_id` and the other fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    /// Always false.
    pub ok: bool,
    /// Always "error".
    pub outcome: Outcome,
    /// What went wrong.
    pub error: ErrorInfo,
    /// The job's id, when the request reached the engine (and its audit log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
}

impl ErrorBody {
    /// An error that never reached the engine.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            ok: false,
            outcome: Outcome::Error,
            error: ErrorInfo {
                kind,
                message: message.into(),
            },
            job_id: None,
        }
    }
}

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Health {
    /// "ok" while serving, "draining" during shutdown.
    pub status: String,
    /// airlock's version.
    pub version: String,
    /// Jobs running now.
    pub jobs_in_flight: u64,
    /// Jobs waiting for a slot now.
    pub queue_depth: u64,
    /// Most jobs running at once.
    pub max_in_flight: u64,
    /// Most jobs waiting.
    pub max_queue: u64,
}

/// `POST /v1/sessions/{id}/runs`: one call in a session.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRunRequest {
    /// The code. A `kernel` session runs it in its Python interpreter, whose globals
    /// persist between calls, and returns the last expression's value like a notebook
    /// cell; a `workspace` session runs it as a fresh job whose /work is the session's.
    pub code: String,
    /// The language (`workspace` sessions; a `kernel` session is python only); the
    /// policy's default language when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// The call's wall time in seconds (at most the policy's `[limits] timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// A `kernel` session: also return the rich formats of the cell's value when it has
    /// them (a pandas DataFrame's HTML table as `value.html`, `_repr_png_` as `value.png`,
    /// ...) in `results` and `observation.files`. `display()` outputs and figures come
    /// back whatever this says.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub html: bool,
    /// A `kernel` session: the code context to run in (`default` when absent); see
    /// `POST /v1/sessions/{id}/contexts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Environment of this call only; each name must be in the policy's `[env] allow`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
    /// A `kernel` session: run this call as a fresh job over the session's /work (any
    /// policy language, its own sandbox and limits), while the kernel keeps its state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub workspace: bool,
}

impl SessionRunRequest {
    /// The call this request asks for.
    pub fn into_call(self) -> Result<airlock_engine::sessions::SessionCall, RequestError> {
        if self.code.contains('\0') {
            return Err(RequestError("code: contains a NUL byte".into()));
        }
        Ok(airlock_engine::sessions::SessionCall {
            code: self.code,
            language: self.language,
            timeout: self
                .timeout_s
                .map(|s| seconds("timeout_s", s))
                .transpose()?,
            html: self.html,
            context: self.context,
            env: self.env,
            workspace: self.workspace,
        })
    }
}

/// What a session keeps between calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionModeName {
    /// Each call is a fresh sandbox; only /work persists.
    Workspace,
    /// One sandbox holding a Python interpreter whose globals persist.
    Kernel,
}

/// A session (`POST /v1/sessions`, `GET /v1/sessions/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionBody {
    /// The session's id (only its tenant can use it; to others it does not exist).
    pub id: String,
    /// What the session keeps between calls.
    pub mode: SessionModeName,
    /// When it was opened (RFC 3339).
    pub created_at: String,
    /// When it ends at the latest, whatever its use (RFC 3339).
    pub expires_at: String,
    /// Seconds without a call after which it is destroyed.
    pub idle_timeout_s: u64,
    /// Calls made so far.
    pub calls: u64,
}

impl From<airlock_engine::sessions::SessionInfo> for SessionBody {
    fn from(info: airlock_engine::sessions::SessionInfo) -> Self {
        Self {
            id: info.id,
            mode: match info.mode {
                airlock_core::policy::SessionMode::Workspace => SessionModeName::Workspace,
                airlock_core::policy::SessionMode::Kernel => SessionModeName::Kernel,
            },
            created_at: info.created_at,
            expires_at: info.expires_at,
            idle_timeout_s: info.idle_timeout_s,
            calls: info.calls,
        }
    }
}

/// The exception a kernel call raised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CellErrorBody {
    /// The exception's class name, e.g. "NameError".
    pub name: String,
    /// Its message (redacted).
    pub value: String,
    /// The traceback from the cell's own frames on (redacted); also in the
    /// observation's stderr.
    #[serde(default)]
    pub traceback: String,
}

/// One result of a kernel call, in the shape of E2B's code interpreter: each format the
/// object has; `png`, `jpeg` and `pdf` base64-encoded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RichResultBody {
    /// `repr()` of the object (IPython's pretty form where the root has IPython).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// HTML (`_repr_html_`, a DataFrame's table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// Markdown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    /// SVG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    /// PNG, base64 (a matplotlib figure, `_repr_png_`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    /// JPEG, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jpeg: Option<String>,
    /// PDF, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdf: Option<String>,
    /// LaTeX.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latex: Option<String>,
    /// JSON (`_repr_json_`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
    /// JavaScript.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub javascript: Option<String>,
    /// Whether this is the value of the cell's last expression (else a `display()`
    /// output or a figure).
    pub is_main_result: bool,
}

impl From<airlock_engine::sessions::RichResult> for RichResultBody {
    fn from(r: airlock_engine::sessions::RichResult) -> Self {
        Self {
            text: r.text,
            html: r.html,
            markdown: r.markdown,
            svg: r.svg,
            png: r.png,
            jpeg: r.jpeg,
            pdf: r.pdf,
            latex: r.latex,
            json: r.json,
            javascript: r.javascript,
            is_main_result: r.is_main_result,
        }
    }
}

/// A code context of a kernel session: its own globals and working directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KernelContextBody {
    /// The context's id (`default`, or one `POST .../contexts` made).
    pub id: String,
    /// Its language: `python`.
    pub language: String,
    /// Its working directory (`/work` or below).
    pub cwd: String,
}

impl From<airlock_engine::sessions::KernelContext> for KernelContextBody {
    fn from(c: airlock_engine::sessions::KernelContext) -> Self {
        Self {
            id: c.id,
            language: c.language,
            cwd: c.cwd,
        }
    }
}

/// The body of `POST /v1/sessions/{id}/contexts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContextRequest {
    /// The context's working directory, `/work` or below (`/work` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Its language: only `python`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
}

/// The answer to a session call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionRunResponse {
    /// The session.
    pub session_id: String,
    /// The call's number in the session, from 1.
    pub call: u64,
    /// The call's observation: stdout, stderr, outcome (`timeout` when the call reached
    /// its wall time), duration. `workspace` sessions: the job's whole observation.
    pub observation: airlock_core::Observation,
    /// `kernel` sessions: the repr of the cell's last expression when it is not None
    /// (redacted, bounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `kernel` sessions: the exception the call raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CellErrorBody>,
    /// `kernel` sessions: set (to the reason) when the kernel had died since the last
    /// call (out of memory, a call that would not stop) and this call ran in a fresh one:
    /// every variable is gone, the files in /work remain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_restarted: Option<String>,
    /// `kernel` sessions: the call's results in order (each `display()` output and
    /// figure, then the cell's value as the main result).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<RichResultBody>,
    /// `kernel` sessions: the context's execution count after this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_count: Option<u64>,
}

impl From<airlock_engine::sessions::SessionRunResult> for SessionRunResponse {
    fn from(r: airlock_engine::sessions::SessionRunResult) -> Self {
        Self {
            session_id: r.session_id,
            call: r.call,
            observation: r.observation,
            value: r.value,
            error: r.error.map(|e| CellErrorBody {
                name: e.name,
                value: e.value,
                traceback: e.traceback,
            }),
            kernel_restarted: r.kernel_restarted,
            results: r.results.into_iter().map(RichResultBody::from).collect(),
            execution_count: r.execution_count,
        }
    }
}

/// A file of a session's /work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionFile {
    /// Path relative to /work.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// `GET /v1/sessions/{id}/files`: the regular files of the session's /work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionFiles {
    /// In path order.
    pub files: Vec<SessionFile>,
}

/// One output chunk of a streamed run (`event: stdout` or `event: stderr`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OutputChunk {
    /// Text, escaped like the observation's.
    pub text: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::{BackendKind, JobId, Observation};
    use pretty_assertions::assert_eq;

    /// Every error observation the engine makes is also a valid error body.
    #[test]
    fn error_observations_are_error_bodies() {
        for kind in [
            ErrorKind::InvalidInput,
            ErrorKind::PolicyDenied,
            ErrorKind::Unauthorized,
            ErrorKind::BackendUnavailable,
            ErrorKind::Internal,
        ] {
            let observation =
                Observation::error(JobId::generate(), BackendKind::Native, "v", kind, "m");
            let real = serde_json::to_value(&observation).unwrap();
            let body: ErrorBody = serde_json::from_value(real).unwrap();
            assert_eq!(body.job_id.as_deref(), Some(observation.job_id.as_str()));
            assert_eq!(body.error.kind, kind);
            assert_eq!(
                serde_json::to_value(ErrorBody::new(kind, "m")).unwrap()["error"]["kind"],
                kind.as_str()
            );
        }
    }
}
