//! The HTTP API's JSON: the run request (parsed with unknown fields rejected), the error
//! body, health and stream chunks. Their JSON Schemas, and the observation's, are derived
//! from these and airlock-core's types (`airlock_core::schema`), so the OpenAPI document
//! cannot drift from what the server parses and sends.

use std::collections::BTreeMap;

use airlock_core::observation::ErrorInfo;
use airlock_core::policy::NetworkMode;
use airlock_core::units::parse_duration;
use airlock_core::{
    ByteSize, Cpus, ErrorKind, JobRequest, LimitsRequest, NetworkRequest, Outcome, Policy,
};
use airlock_mcp::tool::{ParamsError, decode_file, seconds};
use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A job, as `POST /v1/runs` takes it. Exactly one of `code` and `code_base64` must be
/// given (a request with neither or both is `invalid_input`); `null` for any optional
/// field means absent.
// The "exactly one" rule is checked in `into_job`, not stated as a schema `anyOf`: a
// top-level `anyOf` makes code generators (openapi-python-client) drop the request type.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// A language the policy defines (the built-in policy: python, node, bash, sh); the
    /// policy's default language (python) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// The program's source as UTF-8 text. Give exactly one of `code` and `code_base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The program's source as base64, passed to the interpreter byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_base64: Option<String>,
    /// Input files placed under /work before the program starts.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "airlock_core::schema::null_as_default"
    )]
    #[schemars(with = "Vec<RequestFile>")]
    pub files: Vec<RequestFile>,
    /// Text on the program's stdin (otherwise stdin is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Arguments after the source file.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "airlock_core::schema::null_as_default"
    )]
    #[schemars(with = "Vec<String>")]
    pub args: Vec<String>,
    /// Wall-time limit as a duration, e.g. "5s" or "500ms" (at most the policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Wall-time limit in seconds (instead of `timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Memory limit, e.g. "256MiB" (at most the policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// CPU share, e.g. 0.5 (at most the policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Process and thread limit (at most the policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    /// Network: "none" (the default), or "proxy" (only hosts in `allow`, each in the
    /// policy's allowlist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkChoice>,
    /// Hosts the proxy may reach, HOST[:PORT] (proxy mode only).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "airlock_core::schema::null_as_default"
    )]
    #[schemars(with = "Vec<String>")]
    pub allow: Vec<String>,
    /// Environment variables for the program; the policy must allow each name.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "airlock_core::schema::null_as_default"
    )]
    #[schemars(with = "BTreeMap<String, String>")]
    pub env: BTreeMap<String, String>,
    /// Give the program a writable /out and return the files it leaves there inline: each
    /// released file of the observation's `files` then carries `content_base64`, in order,
    /// while their total stays within the policy's `[filesystem] out.inline_bytes`; files
    /// past it are listed without content. `false` (the default) runs without /out.
    #[serde(
        default,
        skip_serializing_if = "std::ops::Not::not",
        deserialize_with = "airlock_core::schema::null_as_default"
    )]
    #[schemars(with = "bool")]
    pub return_files: bool,
}

/// The network a job asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkChoice {
    /// No network at all (only `lo`).
    None,
    /// Only the allowlisting egress proxy.
    Proxy,
}

/// An input file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestFile {
    /// Path relative to /work, e.g. "data/input.csv" (no "..", not absolute).
    pub path: String,
    /// The content as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The content as base64 (instead of `content`), for binary files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
    /// Whether the file is executable in the sandbox.
    #[serde(
        default,
        skip_serializing_if = "std::ops::Not::not",
        deserialize_with = "airlock_core::schema::null_as_default"
    )]
    #[schemars(with = "bool")]
    pub executable: bool,
}

fn invalid(message: String) -> ParamsError {
    (ErrorKind::InvalidInput, message)
}

impl RunRequest {
    /// The job this request asks for under `policy` (which gives the default language).
    /// Malformed values are `invalid_input`; the policy's ceilings are checked later, by
    /// the engine.
    pub fn into_job(self, policy: &Policy) -> Result<JobRequest, ParamsError> {
        let source = match (self.code, self.code_base64) {
            (Some(code), None) => code.into_bytes(),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| invalid(format!("code_base64: not base64: {e}")))?,
            (None, None) => return Err(invalid("code: missing (give code or code_base64)".into())),
            (Some(_), Some(_)) => {
                return Err(invalid("code: give code or code_base64, not both".into()));
            }
        };
        let mut files = Vec::with_capacity(self.files.len());
        for (i, f) in self.files.into_iter().enumerate() {
            let mut file =
                decode_file(&format!("files[{i}]"), f.path, f.content, f.content_base64)?;
            file.executable = f.executable;
            files.push(file);
        }
        let timeout = match (self.timeout, self.timeout_s) {
            (Some(text), None) => {
                Some(parse_duration(&text).map_err(|e| invalid(format!("timeout {text:?}: {e}")))?)
            }
            (None, Some(s)) => Some(seconds("timeout_s", s)?),
            (None, None) => None,
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "timeout: give timeout or timeout_s, not both".into(),
                ));
            }
        };
        let memory = self
            .memory
            .map(|m| {
                m.parse::<ByteSize>()
                    .map_err(|e| invalid(format!("memory {m:?}: {e}")))
            })
            .transpose()?;
        let cpus = self
            .cpus
            .map(|c| {
                if !c.is_finite() {
                    return Err(invalid(format!("cpus: {c} is not a number of CPUs")));
                }
                c.to_string()
                    .parse::<Cpus>()
                    .map_err(|e| invalid(format!("cpus {c}: {e}")))
            })
            .transpose()?;
        let mode = match self.network {
            None | Some(NetworkChoice::None) => NetworkMode::None,
            Some(NetworkChoice::Proxy) => NetworkMode::Proxy,
        };
        Ok(JobRequest {
            language: self
                .language
                .unwrap_or_else(|| policy.default_language().to_owned()),
            source,
            files,
            stdin: self.stdin.map(String::into_bytes),
            args: self.args,
            limits: LimitsRequest {
                timeout,
                memory,
                cpus,
                pids: self.pids,
            },
            network: NetworkRequest {
                mode,
                allow: self.allow,
            },
            env: self.env,
            out: self.return_files,
            workspace: None,
        })
    }
}

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
    /// A `kernel` session: also return the HTML of the cell's value when it has one (a
    /// pandas DataFrame's table), as the file `value.html` in `observation.files`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub html: bool,
}

impl SessionRunRequest {
    /// The call this request asks for.
    pub fn into_call(self) -> Result<airlock_engine::sessions::SessionCall, ParamsError> {
        if self.code.contains('\0') {
            return Err(invalid("code: contains a NUL byte".into()));
        }
        Ok(airlock_engine::sessions::SessionCall {
            code: self.code,
            language: self.language,
            timeout: self
                .timeout_s
                .map(|s| seconds("timeout_s", s))
                .transpose()?,
            html: self.html,
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
    /// Its message (redacted). The traceback is in the observation's stderr.
    pub value: String,
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
            }),
            kernel_restarted: r.kernel_restarted,
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
    use serde_json::json;

    fn policy() -> Policy {
        Policy::builtin()
    }

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

    #[test]
    fn requests_become_jobs() {
        let request: RunRequest = serde_json::from_value(json!({
            "language": "python",
            "code": "print(1)",
            "files": [{"path": "x.sh", "content": "echo", "executable": true},
                      {"path": "b.bin", "content_base64": "AAE="}],
            "stdin": "in",
            "args": ["-v"],
            "timeout": "2s",
            "memory": "64MiB",
            "cpus": 0.25,
            "pids": 8,
            "env": {"A": "b"}
        }))
        .unwrap();
        let job = request.into_job(&policy()).unwrap();
        assert_eq!(job.source, b"print(1)");
        assert!(job.files[0].executable);
        assert_eq!(job.files[1].content, vec![0, 1]);
        assert_eq!(job.stdin.as_deref(), Some(&b"in"[..]));
        assert_eq!(job.limits.timeout, Some(std::time::Duration::from_secs(2)));
        assert_eq!(job.limits.memory, Some(ByteSize::mib(64)));
        assert_eq!(job.limits.cpus, Some(Cpus::from_millis(250)));
        assert_eq!(job.limits.pids, Some(8));
        assert_eq!(job.env["A"], "b");
        let b64: RunRequest = serde_json::from_value(
            json!({"language": "sh", "code_base64": "ZWNobyD/", "timeout_s": 0.5}),
        )
        .unwrap();
        let job = b64.into_job(&policy()).unwrap();
        assert_eq!(job.source, b"echo \xff");
        assert_eq!(
            job.limits.timeout,
            Some(std::time::Duration::from_millis(500))
        );
    }

    /// Strict-mode models and CrewAI send every optional property, unused ones as null.
    #[test]
    fn null_means_absent() {
        let request: RunRequest = serde_json::from_value(json!({
            "language": null, "code": "print(1)", "code_base64": null,
            "files": null, "stdin": null, "args": null, "timeout": null, "timeout_s": null,
            "memory": null, "cpus": null, "pids": null, "network": null, "allow": null,
            "env": null, "return_files": null
        }))
        .unwrap();
        let job = request.into_job(&policy()).unwrap();
        assert!(job.files.is_empty() && job.args.is_empty() && job.env.is_empty());
        assert_eq!(job.limits.timeout, None);
        assert_eq!(job.language, "python");
        assert!(!job.out);
    }

    /// `{"code": …}` alone runs in the policy's default language, which is the policy's,
    /// not a constant; `return_files` asks for /out.
    #[test]
    fn the_language_defaults_to_the_policy_s_and_return_files_asks_for_out() {
        let only_code: RunRequest = serde_json::from_value(json!({"code": "echo"})).unwrap();
        assert_eq!(
            only_code.clone().into_job(&policy()).unwrap().language,
            "python"
        );
        let shells = Policy::from_toml(
            "version = \"v\"\n[languages.sh]\ncommand = [\"sh\", \"{file}\"]\nfile = \"m.sh\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(only_code.into_job(&shells).unwrap().language, "sh");
        let files: RunRequest =
            serde_json::from_value(json!({"code": "", "return_files": true})).unwrap();
        assert!(files.into_job(&policy()).unwrap().out);
    }

    #[test]
    fn malformed_requests_are_invalid_input() {
        assert!(
            serde_json::from_value::<RunRequest>(
                json!({"language": "python", "code": "", "image": "x"})
            )
            .is_err()
        );
        for bad in [
            json!({"language": "python"}),
            json!({"language": "python", "code": "", "code_base64": ""}),
            json!({"language": "python", "code_base64": "!!"}),
            json!({"language": "python", "code": "", "timeout": "soon"}),
            json!({"language": "python", "code": "", "timeout": "1s", "timeout_s": 1}),
            json!({"language": "python", "code": "", "timeout_s": -1}),
            json!({"language": "python", "code": "", "memory": "lots"}),
            json!({"language": "python", "code": "", "cpus": -0.5}),
            json!({"language": "python", "code": "", "files": [{"path": "a", "content": "", "content_base64": ""}]}),
        ] {
            let request: RunRequest = serde_json::from_value(bad.clone()).unwrap();
            let (kind, _) = request.into_job(&policy()).unwrap_err();
            assert_eq!(kind, ErrorKind::InvalidInput, "{bad}");
        }
    }
}
