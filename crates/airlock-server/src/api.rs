//! The HTTP API's JSON: the run request (parsed with unknown fields rejected), the error
//! body, and schema mirrors of the observation. The OpenAPI document is generated from
//! these types, and a test proves the observation mirror matches the real observation
//! field for field, so the document cannot drift from what the server sends.

use std::collections::BTreeMap;

use airlock_core::policy::NetworkMode;
use airlock_core::units::parse_duration;
use airlock_core::{ByteSize, Cpus, ErrorKind, JobRequest, LimitsRequest, NetworkRequest};
use airlock_mcp::tool::{ParamsError, decode_file, seconds};
use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A job, as `POST /v1/runs` takes it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("anyOf" = [{"required": ["code"]}, {"required": ["code_base64"]}]))]
pub struct RunRequest {
    /// A language the policy defines (the built-in policy: python, node, bash, sh).
    pub language: String,
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
    /// The job this request asks for. Malformed values are `invalid_input`; the policy's
    /// ceilings are checked later, by the engine.
    pub fn into_job(self) -> Result<JobRequest, ParamsError> {
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
            language: self.language,
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
            out: false,
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
    pub outcome: OutcomeDoc,
    /// What went wrong.
    pub error: ErrorInfoDoc,
    /// The job's id, when the request reached the engine (and its audit log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
}

impl ErrorBody {
    /// An error that never reached the engine.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            ok: false,
            outcome: OutcomeDoc::Error,
            error: ErrorInfoDoc {
                kind: kind_doc(kind),
                message: message.into(),
            },
            job_id: None,
        }
    }
}

fn kind_doc(kind: ErrorKind) -> ErrorKindDoc {
    match kind {
        ErrorKind::InvalidInput => ErrorKindDoc::InvalidInput,
        ErrorKind::PolicyDenied => ErrorKindDoc::PolicyDenied,
        ErrorKind::Unauthorized => ErrorKindDoc::Unauthorized,
        ErrorKind::BackendUnavailable => ErrorKindDoc::BackendUnavailable,
        ErrorKind::Internal => ErrorKindDoc::Internal,
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

/// One output chunk of a streamed run (`event: stdout` or `event: stderr`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OutputChunk {
    /// Text, escaped like the observation's.
    pub text: String,
}

// ---- Schema mirrors of airlock-core's observation (core stays free of schemars). ----

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeDoc {
    /// The program exited by itself.
    Exited,
    /// The wall-time limit killed it.
    Timeout,
    /// The memory limit killed it.
    Oom,
    /// A signal killed it.
    Killed,
    /// It produced more output than the flood limit and was killed.
    OutputLimit,
    /// The sandbox could not run it.
    Error,
}

/// The class of an executor-side failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKindDoc {
    /// Malformed request (400), including a body over the limit (413).
    InvalidInput,
    /// Beyond the policy (403); today also a missing or wrong token (401), until the
    /// server answers those as `unauthorized`.
    PolicyDenied,
    /// Not authenticated (401).
    Unauthorized,
    /// The backend cannot run jobs now (503), or the queue is full (429).
    BackendUnavailable,
    /// airlock failed (500), or the job was interrupted by a shutdown.
    Internal,
}

/// The backend that ran the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BackendDoc {
    /// Linux namespaces, seccomp and cgroups.
    Native,
    /// Docker Engine API.
    Docker,
    /// Podman.
    Podman,
    /// gVisor.
    Gvisor,
    /// Kubernetes.
    Kube,
}

/// An executor-side failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorInfoDoc {
    /// Its class.
    pub kind: ErrorKindDoc,
    /// What went wrong, for a human.
    pub message: String,
}

/// A file released from /out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputFileDoc {
    /// Path relative to /out.
    pub path: String,
    /// Size.
    pub bytes: u64,
    /// SHA-256, lowercase hex.
    pub sha256: String,
    /// Media type sniffed from the content.
    pub media_type: String,
    /// Secret-shaped strings replaced in it.
    pub redactions: u64,
}

/// A file of /out that was not released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectedFileDoc {
    /// Path relative to /out.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// What went through the egress proxy (proxy mode only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkCountsDoc {
    /// Requests and tunnels, allowed or denied.
    pub connections: u64,
    /// How many of them were refused.
    pub denied: u64,
    /// Bytes sent upstream.
    pub bytes_up: u64,
    /// Bytes received from upstreams.
    pub bytes_down: u64,
    /// A proxy limit that was hit (`connections`, `bytes`, ...), if one was.
    pub limit_hit: Option<String>,
}

/// The observation: the bounded JSON result of one job (DESIGN §2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ObservationDoc {
    /// The job's id (UUID v7), also in the audit log.
    pub job_id: String,
    /// True only for `exited` with exit code 0.
    pub ok: bool,
    /// How the job ended.
    pub outcome: OutcomeDoc,
    /// The program's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the program, e.g. "SIGKILL".
    pub signal: Option<String>,
    /// The kept stdout (the first bytes up to the policy's cap), escaped.
    pub stdout: String,
    /// The kept stderr, escaped.
    pub stderr: String,
    /// Every byte written to stdout.
    pub stdout_bytes: u64,
    /// Every byte written to stderr.
    pub stderr_bytes: u64,
    /// Whether stdout was cut.
    pub stdout_truncated: bool,
    /// Whether stderr was cut.
    pub stderr_truncated: bool,
    /// Secret-shaped strings replaced.
    pub redactions: u64,
    /// Wall time of the program.
    pub duration_ms: u64,
    /// CPU time of every process of the job.
    pub cpu_ms: Option<u64>,
    /// Peak memory of the job.
    pub peak_memory_bytes: Option<u64>,
    /// Files released from /out.
    pub files: Vec<OutputFileDoc>,
    /// The backend that ran the job.
    pub backend: BackendDoc,
    /// The image, when the rootfs is an image.
    pub image_digest: Option<String>,
    /// The policy's version.
    pub policy_version: String,
    /// Set only when `outcome` is "error".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfoDoc>,
    /// What went through the egress proxy (proxy mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkCountsDoc>,
    /// Files of /out that were not released (absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected_files: Vec<RejectedFileDoc>,
    /// Controls that held only in a weaker form the policy accepted (absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::observation::{ErrorInfo, NetworkCounts, OutputFile};
    use airlock_core::{BackendKind, JobId, Observation, Outcome, RejectedFile};
    use pretty_assertions::assert_eq;
    use serde_json::json;

    /// Every field set. A struct literal on purpose: a field added to the observation
    /// stops this from compiling until the documented mirror (and this test) has it too.
    fn full_observation(outcome: Outcome, kind: ErrorKind, backend: BackendKind) -> Observation {
        Observation {
            job_id: JobId::generate(),
            ok: false,
            outcome,
            exit_code: Some(3),
            signal: Some("SIGKILL".into()),
            stdout: "out".into(),
            stderr: "err".into(),
            stdout_bytes: 3,
            stderr_bytes: 3,
            stdout_truncated: true,
            stderr_truncated: true,
            redactions: 1,
            duration_ms: 5,
            cpu_ms: Some(1),
            peak_memory_bytes: Some(2),
            files: vec![OutputFile {
                path: "a".into(),
                bytes: 1,
                sha256: "00".into(),
                media_type: "text/plain".into(),
                redactions: 0,
                content_base64: None,
            }],
            backend,
            image_digest: Some("sha256:00".into()),
            policy_version: "v1".into(),
            error: Some(ErrorInfo {
                kind,
                message: "m".into(),
            }),
            network: Some(NetworkCounts {
                connections: 2,
                denied: 1,
                bytes_up: 10,
                bytes_down: 20,
                limit_hit: Some("bytes".into()),
            }),
            rejected_files: vec![RejectedFile {
                path: "b".into(),
                reason: "symlink".into(),
            }],
            degraded: vec!["memory: RLIMIT_AS".into()],
        }
    }

    /// The mirror has exactly the observation's fields and values: anything the server
    /// sends parses as the documented schema and re-encodes identically.
    #[test]
    fn observation_mirror_matches_the_real_observation() {
        let outcomes = [
            Outcome::Exited,
            Outcome::Timeout,
            Outcome::Oom,
            Outcome::Killed,
            Outcome::OutputLimit,
            Outcome::Error,
        ];
        let kinds = [
            ErrorKind::InvalidInput,
            ErrorKind::PolicyDenied,
            ErrorKind::Unauthorized,
            ErrorKind::BackendUnavailable,
            ErrorKind::Internal,
        ];
        let backends = [
            BackendKind::Native,
            BackendKind::Docker,
            BackendKind::Podman,
            BackendKind::Gvisor,
            BackendKind::Kube,
        ];
        for (i, outcome) in outcomes.into_iter().enumerate() {
            let obs = full_observation(
                outcome,
                kinds[i % kinds.len()],
                backends[i % backends.len()],
            );
            let real = serde_json::to_value(&obs).unwrap();
            let doc: ObservationDoc = serde_json::from_value(real.clone()).unwrap();
            assert_eq!(serde_json::to_value(&doc).unwrap(), real);
            let minimal = Observation::error(
                JobId::generate(),
                backends[i % backends.len()],
                "v",
                kinds[i % kinds.len()],
                "m",
            );
            let real = serde_json::to_value(&minimal).unwrap();
            let doc: ObservationDoc = serde_json::from_value(real.clone()).unwrap();
            assert_eq!(serde_json::to_value(&doc).unwrap(), real);
            // Every error observation is also a valid error body.
            let body: ErrorBody = serde_json::from_value(real).unwrap();
            assert_eq!(body.job_id.as_deref(), Some(minimal.job_id.as_str()));
        }
        for kind in kinds {
            assert_eq!(
                serde_json::to_value(kind_doc(kind)).unwrap(),
                serde_json::to_value(kind).unwrap()
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
        let job = request.into_job().unwrap();
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
        let job = b64.into_job().unwrap();
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
            "language": "python", "code": "print(1)", "code_base64": null,
            "files": null, "stdin": null, "args": null, "timeout": null, "timeout_s": null,
            "memory": null, "cpus": null, "pids": null, "network": null, "allow": null,
            "env": null
        }))
        .unwrap();
        let job = request.into_job().unwrap();
        assert!(job.files.is_empty() && job.args.is_empty() && job.env.is_empty());
        assert_eq!(job.limits.timeout, None);
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
            let (kind, _) = request.into_job().unwrap_err();
            assert_eq!(kind, ErrorKind::InvalidInput, "{bad}");
        }
    }
}
