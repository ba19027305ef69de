//! The run request every door takes: `POST /v1/runs`, MCP's `run_code`, and the
//! `run_code` tool schema for function calling. One wire type ([`RunRequest`]), one way to
//! read it from JSON with errors that name the field ([`RunRequest::from_json`]), and one
//! conversion to a [`JobRequest`] ([`RunRequest::into_job`]).
//!
//! A door that offers fewer fields (MCP offers a model only what it needs) says which with
//! a [`Door`]: its JSON Schema is the request's, narrowed to those fields, and a call
//! naming another field is refused with the list of what that door takes. What a door adds
//! of its own (MCP's `session`) it declares and takes out before the request is read.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::job::{InputFile, JobRequest, LimitsRequest, NetworkRequest};
use crate::policy::{NetworkMode, Policy};
use crate::units::{ByteSize, Cpus, parse_duration};

/// A request that cannot become a job: always `invalid_input`, and the message names the
/// field (`files[1].content_base64: not base64: …`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RequestError(pub String);

impl RequestError {
    fn field(field: impl std::fmt::Display, message: impl std::fmt::Display) -> Self {
        Self(format!("{field}: {message}"))
    }
}

/// A job to run, as `POST /v1/runs` and the `run_code` tool take it. Exactly one of `code`
/// and `code_base64` must be given (a request with neither or both is `invalid_input`);
/// `null` for any optional field means absent (strict-mode models and CrewAI send every
/// property).
// The "exactly one" rule is checked in `into_job`, not stated as a schema `anyOf`: a
// top-level `anyOf` makes code generators (openapi-python-client) drop the request type.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The language of the code; the policy's default language (python) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// The program's complete source code (UTF-8). Its stdout and stderr are returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The program's source as base64 (instead of `code`), passed to the interpreter byte
    /// for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_base64: Option<String>,
    /// Input files, placed under /work (the program's working directory) before it
    /// starts.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::schema::null_as_default"
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
        deserialize_with = "crate::schema::null_as_default"
    )]
    #[schemars(with = "Vec<String>")]
    pub args: Vec<String>,
    /// Wall-time limit as a duration, e.g. "5s" or "500ms" (at most the policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Wall-time limit in seconds (instead of `timeout`); the default and the maximum are
    /// the policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01))]
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
        deserialize_with = "crate::schema::null_as_default"
    )]
    #[schemars(with = "Vec<String>")]
    pub allow: Vec<String>,
    /// Environment variables for the program; the policy must allow each name.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "crate::schema::null_as_default"
    )]
    #[schemars(with = "BTreeMap<String, String>")]
    pub env: BTreeMap<String, String>,
    /// Give the program a writable /out and return the regular files it leaves there
    /// (name, size, sha256, media type) in the result's `files`; how much of their content
    /// comes back inline is the door's and the policy's (`[filesystem] out.inline_bytes`).
    /// `false` (the default) runs without /out.
    #[serde(
        default,
        skip_serializing_if = "std::ops::Not::not",
        deserialize_with = "crate::schema::null_as_default"
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
    /// The file's content as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The file's content as base64 (instead of `content`), for binary files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
    /// Whether the file is executable in the sandbox.
    #[serde(
        default,
        skip_serializing_if = "std::ops::Not::not",
        deserialize_with = "crate::schema::null_as_default"
    )]
    #[schemars(with = "bool")]
    pub executable: bool,
}

/// The fields of [`RunRequest`] one door offers, and those it requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Door {
    /// The door's name in messages (`run_code`, `POST /v1/runs`).
    pub name: &'static str,
    /// The top-level fields it offers (in the order an unknown field's error lists them).
    pub fields: &'static [&'static str],
    /// The fields its schema marks required.
    pub required: &'static [&'static str],
    /// Fields of [`RequestFile`] it does not offer.
    pub hidden_file_fields: &'static [&'static str],
}

/// `POST /v1/runs`: every field.
pub const HTTP_DOOR: Door = Door {
    name: "POST /v1/runs",
    fields: &[
        "language",
        "code",
        "code_base64",
        "files",
        "stdin",
        "args",
        "timeout",
        "timeout_s",
        "memory",
        "cpus",
        "pids",
        "network",
        "allow",
        "env",
        "return_files",
    ],
    required: &[],
    hidden_file_fields: &[],
};

/// The `run_code` tool (MCP, function calling): what a model needs to run a program, and
/// nothing it could get wrong without gain (limits below the policy's other than time,
/// the network, stdin, binary source, executable bits).
pub const TOOL_DOOR: Door = Door {
    name: "run_code",
    fields: &["code", "language", "files", "timeout_s", "return_files"],
    required: &["code"],
    hidden_file_fields: &["executable"],
};

impl RunRequest {
    /// Reads a request from JSON; a value of the wrong type is named by its path
    /// (`timeout: invalid type: integer `5`, expected a string`).
    pub fn from_json(body: &[u8]) -> Result<Self, RequestError> {
        read_json(body)
    }

    /// Reads the arguments a `door` got as a JSON object: a field the door does not offer
    /// is refused with the list of those it does (`extra` names fields the door took out
    /// already, which it offers of its own).
    pub fn from_door(
        door: &Door,
        arguments: Map<String, Value>,
        extra: &[&str],
    ) -> Result<Self, RequestError> {
        if let Some(unknown) = arguments
            .keys()
            .find(|key| !door.fields.contains(&key.as_str()))
        {
            let mut offered: Vec<&str> = door.fields.to_vec();
            offered.extend_from_slice(extra);
            return Err(RequestError(format!(
                "unknown field {unknown:?}: {door} takes {offered}",
                door = door.name,
                offered = offered.join(", ")
            )));
        }
        serde_path_to_error::deserialize(Value::Object(arguments)).map_err(path_error)
    }

    /// The request's JSON Schema narrowed to what `door` offers (references and `$defs`
    /// still in; [`crate::schema::closed`] and [`crate::schema::strict`] inline them).
    pub fn schema_for(door: &Door) -> Value {
        let mut value = crate::schema::generator("/$defs")
            .into_root_schema_for::<RunRequest>()
            .to_value();
        if let Some(Value::Object(properties)) = value.get_mut("properties") {
            let mut kept = Map::new();
            for name in door.fields {
                if let Some(schema) = properties.remove(*name) {
                    kept.insert((*name).to_owned(), schema);
                }
            }
            *properties = kept;
        }
        if let Some(object) = value.as_object_mut() {
            object.insert(
                "required".to_owned(),
                Value::Array(
                    door.required
                        .iter()
                        .map(|name| Value::String((*name).to_owned()))
                        .collect(),
                ),
            );
        }
        if let Some(Value::Object(file)) = value.pointer_mut("/$defs/RequestFile/properties") {
            for hidden in door.hidden_file_fields {
                file.remove(*hidden);
            }
        }
        value
    }

    /// The job this request asks for under `policy` (which gives the default language).
    /// Malformed values are refused here; the policy's ceilings are checked later, by the
    /// engine.
    pub fn into_job(self, policy: &Policy) -> Result<JobRequest, RequestError> {
        let source = match (self.code, self.code_base64) {
            (Some(code), None) => code.into_bytes(),
            (None, Some(b64)) => decode_base64("code_base64", &b64)?,
            (None, None) => return Err(RequestError::field("code", "missing")),
            (Some(_), Some(_)) => {
                return Err(RequestError::field(
                    "code",
                    "give code or code_base64, not both",
                ));
            }
        };
        let files = self
            .files
            .into_iter()
            .enumerate()
            .map(|(i, f)| f.into_input(&format!("files[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let timeout = match (self.timeout, self.timeout_s) {
            (Some(text), None) => Some(
                parse_duration(&text)
                    .map_err(|e| RequestError::field(format_args!("timeout {text:?}"), e))?,
            ),
            (None, Some(s)) => Some(seconds("timeout_s", s)?),
            (None, None) => None,
            (Some(_), Some(_)) => {
                return Err(RequestError::field(
                    "timeout",
                    "give timeout or timeout_s, not both",
                ));
            }
        };
        let memory = self
            .memory
            .map(|m| {
                m.parse::<ByteSize>()
                    .map_err(|e| RequestError::field(format_args!("memory {m:?}"), e))
            })
            .transpose()?;
        let cpus = self
            .cpus
            .map(|c| {
                if !c.is_finite() {
                    return Err(RequestError::field("cpus", "not a number of CPUs"));
                }
                c.to_string()
                    .parse::<Cpus>()
                    .map_err(|e| RequestError::field(format_args!("cpus {c}"), e))
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
            session_tmp: None,
            session_kernel: false,
        })
    }
}

impl RequestFile {
    /// The input file: `content` or `content_base64`, exactly one of them (`field` names
    /// the file in errors).
    pub fn into_input(self, field: &str) -> Result<InputFile, RequestError> {
        let content = match (self.content, self.content_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(b64)) => decode_base64(&format!("{field}.content_base64"), &b64)?,
            // Never an empty file in place of content that was lost on the way (a model
            // sending nulls for both): an empty file is `"content": ""`.
            (None, None) => {
                return Err(RequestError::field(
                    field,
                    "give content or content_base64 (\"content\": \"\" for an empty file)",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(RequestError::field(
                    field,
                    "give content or content_base64, not both",
                ));
            }
        };
        Ok(InputFile {
            path: self.path,
            content,
            executable: self.executable,
        })
    }
}

fn decode_base64(field: &str, text: &str) -> Result<Vec<u8>, RequestError> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| RequestError::field(field, format_args!("not base64: {e}")))
}

/// Seconds as a [`Duration`]: finite and positive, else an error naming `field`. A value
/// too large for a `Duration` saturates, so the policy's ceiling check denies it.
pub fn seconds(field: &str, value: f64) -> Result<Duration, RequestError> {
    if !value.is_finite() || value <= 0.0 {
        return Err(RequestError::field(
            field,
            format_args!("{value} is not a positive number of seconds"),
        ));
    }
    Ok(Duration::try_from_secs_f64(value).unwrap_or(Duration::MAX))
}

/// Reads any request body of the doors from JSON, a value of the wrong type named by its
/// path, as [`RunRequest::from_json`] does.
pub fn read_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, RequestError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut deserializer).map_err(path_error)
}

/// serde's message with the path of the value it failed on in front (`files[0].path:
/// invalid type: …`); serde's own "at line L column C" is dropped, the path says where.
fn path_error<E: std::fmt::Display>(error: serde_path_to_error::Error<E>) -> RequestError {
    let path = error.path().to_string();
    let inner = error.inner().to_string();
    let inner = match inner.rfind(" at line ") {
        Some(at) if inner[at..].contains(" column ") => inner[..at].to_owned(),
        _ => inner,
    };
    if path == "." || path.is_empty() {
        RequestError(inner)
    } else {
        RequestError::field(path, inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn policy() -> Policy {
        Policy::builtin()
    }

    fn request(value: Value) -> RunRequest {
        RunRequest::from_json(value.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn requests_become_jobs() {
        let job = request(json!({
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
        .into_job(&policy())
        .unwrap();
        assert_eq!(job.source, b"print(1)");
        assert!(job.files[0].executable);
        assert_eq!(job.files[1].content, vec![0, 1]);
        assert_eq!(job.stdin.as_deref(), Some(&b"in"[..]));
        assert_eq!(job.limits.timeout, Some(Duration::from_secs(2)));
        assert_eq!(job.limits.memory, Some(ByteSize::mib(64)));
        assert_eq!(job.limits.cpus, Some(Cpus::from_millis(250)));
        assert_eq!(job.limits.pids, Some(8));
        assert_eq!(job.env["A"], "b");
        let job = request(json!({"language": "sh", "code_base64": "ZWNobyD/", "timeout_s": 0.5}))
            .into_job(&policy())
            .unwrap();
        assert_eq!(job.source, b"echo \xff");
        assert_eq!(job.limits.timeout, Some(Duration::from_millis(500)));
    }

    /// Strict-mode models and CrewAI send every optional property, unused ones as null.
    #[test]
    fn null_means_absent() {
        let job = request(json!({
            "language": null, "code": "print(1)", "code_base64": null,
            "files": null, "stdin": null, "args": null, "timeout": null, "timeout_s": null,
            "memory": null, "cpus": null, "pids": null, "network": null, "allow": null,
            "env": null, "return_files": null
        }))
        .into_job(&policy())
        .unwrap();
        assert!(job.files.is_empty() && job.args.is_empty() && job.env.is_empty());
        assert_eq!(job.limits.timeout, None);
        assert_eq!(job.language, "python");
        assert!(!job.out);
    }

    /// `{"code": …}` alone runs in the policy's default language, which is the policy's,
    /// not a constant; `return_files` asks for /out.
    #[test]
    fn the_language_defaults_to_the_policy_s_and_return_files_asks_for_out() {
        let only_code = request(json!({"code": "echo"}));
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
        let files = request(json!({"code": "", "return_files": true}));
        assert!(files.into_job(&policy()).unwrap().out);
    }

    #[test]
    fn malformed_requests_are_refused_naming_the_field() {
        for (bad, field) in [
            (json!({"language": "python"}), "code: missing"),
            (
                json!({"language": "python", "code": "", "code_base64": ""}),
                "code: give",
            ),
            (json!({"code_base64": "!!"}), "code_base64: not base64"),
            (json!({"code": "", "timeout": "soon"}), "timeout \"soon\""),
            (
                json!({"code": "", "timeout": "1s", "timeout_s": 1}),
                "timeout: give",
            ),
            (json!({"code": "", "timeout_s": -1}), "timeout_s: -1"),
            (json!({"code": "", "memory": "lots"}), "memory \"lots\""),
            (json!({"code": "", "cpus": -0.5}), "cpus -0.5"),
            (
                json!({"code": "", "files": [{"path": "a", "content": "", "content_base64": ""}]}),
                "files[0]: give content or content_base64, not both",
            ),
            (
                json!({"code": "", "files": [{"path": "a", "content": null, "content_base64": null}]}),
                "files[0]: give content or content_base64 (",
            ),
        ] {
            let error = request(bad.clone()).into_job(&policy()).unwrap_err();
            assert!(error.0.starts_with(field), "{bad}: {error}");
        }
    }

    /// Issue 30: `"timeout": 5` said "invalid type: integer `5`, expected a string at line
    /// 1 column 30", naming no field.
    #[test]
    fn a_value_of_the_wrong_type_is_named_by_its_path() {
        let error = RunRequest::from_json(br#"{"code": "x", "timeout": 5}"#).unwrap_err();
        assert_eq!(
            error.0,
            "timeout: invalid type: integer `5`, expected a string"
        );
        let error = RunRequest::from_json(br#"{"code": "x", "files": [{"path": 1}]}"#).unwrap_err();
        assert!(
            error.0.starts_with("files[0].path: invalid type"),
            "{error}"
        );
        let error = RunRequest::from_json(br#"{"code": "x", "image": "y"}"#).unwrap_err();
        assert!(
            error.0.starts_with("image: unknown field `image`"),
            "{error}"
        );
        let error = RunRequest::from_json(b"{\"code\": ").unwrap_err();
        assert!(error.0.contains("EOF"), "{error}");
    }

    #[test]
    fn a_door_refuses_what_it_does_not_offer_and_says_what_it_takes() {
        let arguments = |value: Value| match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        };
        let error = RunRequest::from_door(
            &TOOL_DOOR,
            arguments(json!({"code": "", "network": "proxy"})),
            &[],
        )
        .unwrap_err();
        assert_eq!(
            error.0,
            "unknown field \"network\": run_code takes code, language, files, timeout_s, return_files"
        );
        let error = RunRequest::from_door(&TOOL_DOOR, arguments(json!({"code": 5})), &["session"])
            .unwrap_err();
        assert_eq!(
            error.0,
            "code: invalid type: integer `5`, expected a string"
        );
        let error = RunRequest::from_door(&TOOL_DOOR, arguments(json!({"x": 1})), &["session"])
            .unwrap_err();
        assert!(error.0.ends_with("return_files, session"), "{error}");
        let ok = RunRequest::from_door(
            &TOOL_DOOR,
            arguments(json!({"code": "1", "files": [{"path": "a", "content": "b"}]})),
            &[],
        )
        .unwrap();
        assert_eq!(ok.code.as_deref(), Some("1"));
    }

    #[test]
    fn a_door_s_schema_has_only_its_fields() {
        let tool = RunRequest::schema_for(&TOOL_DOOR);
        let names: Vec<&String> = tool["properties"].as_object().unwrap().keys().collect();
        assert_eq!(
            names,
            ["code", "files", "language", "return_files", "timeout_s"]
        );
        assert_eq!(tool["required"], json!(["code"]));
        assert!(tool["$defs"]["RequestFile"]["properties"]["executable"].is_null());
        let http = RunRequest::schema_for(&HTTP_DOOR);
        assert_eq!(http["properties"].as_object().unwrap().len(), 15);
        assert!(http["$defs"]["RequestFile"]["properties"]["executable"].is_object());
        // Every field the type has is in the HTTP door, and only those.
        let all = crate::schema::generator("/$defs")
            .into_root_schema_for::<RunRequest>()
            .to_value();
        let mut every: Vec<&String> = all["properties"].as_object().unwrap().keys().collect();
        every.sort();
        let mut offered: Vec<&str> = HTTP_DOOR.fields.to_vec();
        offered.sort_unstable();
        assert_eq!(every, offered);
    }
}
