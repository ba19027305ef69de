//! The `run_code` tool: its parameters (one schema for MCP, the HTTP API's tool schema and
//! OpenAI-style function calling), its description, and how a call becomes a job.

use std::time::Duration;

use airlock_core::units::format_duration;
use airlock_core::{ErrorKind, InputFile, JobRequest, LimitsRequest, Policy};
use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The tool's name.
pub const TOOL_NAME: &str = "run_code";

/// What a call may take beyond the job's wall time: sandbox setup (an image's first
/// unpack, a container start, a queue wait) and teardown. Clients are told to wait the
/// wall time plus this before giving up.
pub const CALL_SETUP_ALLOWANCE: Duration = Duration::from_secs(30);

/// The arguments of a `run_code` call. `null` for any optional argument means absent
/// (strict-mode models and CrewAI send every property).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "run_code arguments")]
pub struct RunCodeParams {
    /// The program's complete source code (UTF-8). Its stdout and stderr are returned.
    pub code: String,
    /// The language of `code`; the policy's default language (python) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Input files, placed under /work (the program's working directory) before it starts.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "airlock_core::schema::null_as_default"
    )]
    #[schemars(with = "Vec<RunCodeFile>")]
    pub files: Vec<RunCodeFile>,
    /// Wall-time limit in seconds; the default and the maximum are the policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01))]
    pub timeout_s: Option<f64>,
    /// Return the files the program writes under /out, with their content (base64) up to
    /// the policy's inline cap; larger ones are listed without content.
    #[serde(
        default,
        skip_serializing_if = "std::ops::Not::not",
        deserialize_with = "airlock_core::schema::null_as_default"
    )]
    #[schemars(with = "bool")]
    pub return_files: bool,
    /// A session id from `session_start`: the code runs in that session (its files, and in
    /// a kernel session its Python variables, persist between calls). Absent: a fresh
    /// sandbox that keeps nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// An input file of a `run_code` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeFile {
    /// Path relative to /work, e.g. `data/input.csv` (no `..`, not absolute).
    pub path: String,
    /// The file's content as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The file's content as base64, for binary files (instead of `content`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
}

/// A request that cannot become a job: the kind and message of the error observation.
pub type ParamsError = (ErrorKind, String);

/// Decodes one input file (`content` or `content_base64`, exactly one of them).
pub fn decode_file(
    field: &str,
    path: String,
    content: Option<String>,
    content_base64: Option<String>,
) -> Result<InputFile, ParamsError> {
    let content = match (content, content_base64) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| {
                (
                    ErrorKind::InvalidInput,
                    format!("{field}.content_base64: not base64: {e}"),
                )
            })?,
        // Never an empty file in place of content that was lost on the way (a model
        // sending nulls for both): an empty file is `"content": ""`.
        (None, None) => {
            return Err((
                ErrorKind::InvalidInput,
                format!(
                    "{field}: give content or content_base64 (\"content\": \"\" for an empty file)"
                ),
            ));
        }
        (Some(_), Some(_)) => {
            return Err((
                ErrorKind::InvalidInput,
                format!("{field}: give content or content_base64, not both"),
            ));
        }
    };
    Ok(InputFile {
        path,
        content,
        executable: false,
    })
}

/// Seconds as a [`Duration`]: finite and positive, else an `invalid_input` error. A value
/// too large for a `Duration` saturates, so the policy's ceiling check denies it.
pub fn seconds(field: &str, value: f64) -> Result<Duration, ParamsError> {
    if !value.is_finite() || value <= 0.0 {
        return Err((
            ErrorKind::InvalidInput,
            format!("{field}: {value} is not a positive number of seconds"),
        ));
    }
    Ok(Duration::try_from_secs_f64(value).unwrap_or(Duration::MAX))
}

impl RunCodeParams {
    /// The job these arguments ask for under `policy` (which gives the default language).
    /// `return_files` asks for `/out`; inlining its files is the caller's part.
    pub fn into_request(self, policy: &Policy) -> Result<JobRequest, ParamsError> {
        let files = self
            .files
            .into_iter()
            .enumerate()
            .map(|(i, f)| decode_file(&format!("files[{i}]"), f.path, f.content, f.content_base64))
            .collect::<Result<Vec<_>, _>>()?;
        let timeout = self
            .timeout_s
            .map(|s| seconds("timeout_s", s))
            .transpose()?;
        Ok(JobRequest {
            language: self
                .language
                .unwrap_or_else(|| policy.default_language().to_owned()),
            source: self.code.into_bytes(),
            files,
            limits: LimitsRequest {
                timeout,
                ..LimitsRequest::default()
            },
            out: self.return_files,
            ..JobRequest::default()
        })
    }
}

/// The shape a tool schema is served in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolSchemaFormat {
    /// Chat Completions: `{"type": "function", "function": {"name", "description",
    /// "parameters", "strict": true}}`.
    #[default]
    Chat,
    /// The Responses API: `{"type": "function", "name", "description", "parameters",
    /// "strict": true}`.
    Responses,
}

impl std::str::FromStr for ToolSchemaFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "chat" => Ok(Self::Chat),
            "responses" => Ok(Self::Responses),
            other => Err(format!(
                "unknown tool schema format {other:?}: chat or responses"
            )),
        }
    }
}

/// The arguments' schema from the type, with `language` narrowed to the policy's languages
/// and `timeout_s` to its ceiling; references and `$schema` still in.
fn params_schema(policy: &Policy) -> Value {
    let mut value = airlock_core::schema::generator("/$defs")
        .into_root_schema_for::<RunCodeParams>()
        .to_value();
    if let Some(language) = value.pointer_mut("/properties/language")
        && let Some(object) = language.as_object_mut()
    {
        object.insert(
            "enum".to_owned(),
            Value::Array(
                policy
                    .languages
                    .keys()
                    .map(|name| Value::String(name.clone()))
                    .collect(),
            ),
        );
    }
    if let Some(timeout) = value.pointer_mut("/properties/timeout_s")
        && let Some(object) = timeout.as_object_mut()
    {
        object.insert(
            "maximum".to_owned(),
            Value::from(policy.limits.timeout.as_secs_f64()),
        );
    }
    // `session` only where sessions exist: a model is not offered what would be refused.
    if !policy.sessions.enabled
        && let Some(properties) = value
            .pointer_mut("/properties")
            .and_then(Value::as_object_mut)
    {
        properties.remove("session");
    }
    value
}

/// MCP's `inputSchema`: no references, objects closed, optional arguments nullable and
/// not required (only `code` is).
pub fn input_schema(policy: &Policy) -> Map<String, Value> {
    match airlock_core::schema::closed(&params_schema(policy)) {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The strict parameters schema for function calling: every argument required, optional
/// ones nullable, no references, objects closed.
pub fn strict_input_schema(policy: &Policy) -> Value {
    airlock_core::schema::strict(&params_schema(policy))
}

/// What the model is told about the tool: the limits of `policy`, the network, files and
/// how output comes back.
pub fn description(policy: &Policy) -> String {
    let limits = &policy.limits;
    let languages: Vec<&str> = policy.languages.keys().map(String::as_str).collect();
    let network = match policy.network.mode {
        airlock_core::policy::NetworkMode::None => {
            "The network is off: no internet, no DNS, no package installs; use only what the \
             interpreter ships with."
                .to_owned()
        }
        airlock_core::policy::NetworkMode::Proxy => format!(
            "The network is off except through an allowlisting proxy to: {}.",
            policy.network.allow.join(", ")
        ),
    };
    format!(
        "Run a program in a fresh, disposable, isolated sandbox and get its result as JSON. \
         Languages: {languages}. Each call starts from scratch: nothing persists between calls. \
         Limits: {timeout} wall time (timeout_s may lower it), {memory} memory, {cpus} CPU, \
         {pids} processes; the source may be at most {source}. {network} \
         The program runs in /work (read-only unless the policy says otherwise) as an \
         unprivileged user; files you pass are placed under /work; /tmp is a small writable \
         tmpfs. With return_files true the program also gets a writable /out (at most \
         {out_max}): regular files it writes there come back in files[] with their content \
         as content_base64 (up to {inline} in total; larger ones are listed without \
         content). Print what you want to see: the result has stdout (first {stdout} bytes) \
         and stderr (first {stderr} bytes), *_truncated flags and byte counts, exit_code, and \
         outcome (exited, timeout, oom, killed, output_limit, or error). ok is true only when \
         the program exited with code 0. A call can take {call} (wall time plus setup); \
         clients should wait at least that long.",
        languages = languages.join(", "),
        timeout = format_duration(limits.timeout),
        memory = limits.memory,
        cpus = limits.cpus,
        pids = limits.pids,
        source = limits.source,
        stdout = limits.stdout.as_u64(),
        stderr = limits.stderr.as_u64(),
        out_max = policy.filesystem.out.max_bytes,
        inline = policy.filesystem.out.inline_bytes,
        call = format_duration(limits.timeout + CALL_SETUP_ALLOWANCE),
    )
}

/// The tool for function calling, strict, in `format`'s shape.
pub fn function_schema(policy: &Policy, format: ToolSchemaFormat) -> Value {
    let parameters = strict_input_schema(policy);
    match format {
        ToolSchemaFormat::Chat => serde_json::json!({
            "type": "function",
            "function": {
                "name": TOOL_NAME,
                "description": description(policy),
                "parameters": parameters,
                "strict": true,
            }
        }),
        ToolSchemaFormat::Responses => serde_json::json!({
            "type": "function",
            "name": TOOL_NAME,
            "description": description(policy),
            "parameters": parameters,
            "strict": true,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn params_become_a_job() {
        let params: RunCodeParams = serde_json::from_value(serde_json::json!({
            "language": "python",
            "code": "print(1)",
            "files": [{"path": "a.txt", "content": "hi"}, {"path": "b.bin", "content_base64": "AAE="}],
            "timeout_s": 1.5
        }))
        .unwrap();
        let request = params.into_request(&Policy::builtin()).unwrap();
        assert_eq!(request.source, b"print(1)");
        assert_eq!(request.files[0].content, b"hi");
        assert_eq!(request.files[1].content, vec![0, 1]);
        assert_eq!(request.limits.timeout, Some(Duration::from_millis(1500)));
    }

    /// CrewAI sends `{"code":…,"files":null,"language":"python","timeout_s":null}`.
    #[test]
    fn null_means_absent() {
        let params: RunCodeParams = serde_json::from_value(serde_json::json!({
            "code": "print(1)", "files": null, "language": null, "timeout_s": null,
            "return_files": null
        }))
        .unwrap();
        let request = params.into_request(&Policy::builtin()).unwrap();
        assert!(request.files.is_empty());
        assert_eq!(request.limits.timeout, None);
        assert_eq!(request.language, "python");
        assert!(!request.out);
    }

    #[test]
    fn a_file_without_content_is_refused_not_made_empty() {
        let params: RunCodeParams = serde_json::from_value(serde_json::json!({
            "code": "", "files": [{"path": "a.txt", "content": null, "content_base64": null}]
        }))
        .unwrap();
        let (kind, message) = params.into_request(&Policy::builtin()).unwrap_err();
        assert_eq!(kind, ErrorKind::InvalidInput);
        assert!(message.contains("files[0]"), "{message}");
    }

    #[test]
    fn return_files_asks_for_out() {
        let params: RunCodeParams =
            serde_json::from_value(serde_json::json!({"code": "", "return_files": true})).unwrap();
        assert!(params.into_request(&Policy::builtin()).unwrap().out);
    }

    #[test]
    fn unknown_fields_and_bad_timeouts_are_refused() {
        assert!(
            serde_json::from_value::<RunCodeParams>(
                serde_json::json!({"language": "python", "code": "", "network": "on"})
            )
            .is_err()
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(seconds("timeout_s", bad).is_err(), "{bad}");
        }
        // Huge is not malformed: it is above the ceiling, which the policy denies.
        assert_eq!(seconds("timeout_s", 1e300).unwrap(), Duration::MAX);
        let params: RunCodeParams =
            serde_json::from_value(serde_json::json!({"code": "", "timeout_s": 1e9})).unwrap();
        let request = params.into_request(&Policy::builtin()).unwrap();
        assert_eq!(
            request.resolve(&Policy::builtin()).unwrap_err().kind(),
            ErrorKind::PolicyDenied
        );
    }

    fn walk(value: &Value, visit: &mut dyn FnMut(&Map<String, Value>)) {
        match value {
            Value::Object(object) => {
                visit(object);
                object.values().for_each(|v| walk(v, visit));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, visit)),
            _ => {}
        }
    }

    fn required(schema: &Value) -> Vec<&str> {
        schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect()
    }

    #[test]
    fn schema_lists_the_policy_languages_and_limits() {
        let policy = Policy::builtin();
        let schema = Value::Object(input_schema(&policy));
        let languages = schema["properties"]["language"]["enum"].as_array().unwrap();
        assert!(languages.contains(&Value::from("python")));
        assert!(languages.contains(&Value::Null), "{languages:?}");
        assert_eq!(schema["properties"]["timeout_s"]["maximum"], 5.0);
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(required(&schema), vec!["code"]);
        let text = description(&policy);
        assert!(text.contains("5s wall time"), "{text}");
        assert!(text.contains("network is off"), "{text}");
    }

    #[test]
    fn schemas_have_no_references_and_closed_objects() {
        let policy = Policy::builtin();
        for schema in [
            Value::Object(input_schema(&policy)),
            strict_input_schema(&policy),
        ] {
            walk(&schema, &mut |object| {
                for key in ["$ref", "$defs", "$schema", "format", "oneOf"] {
                    assert!(!object.contains_key(key), "{key} in {object:?}");
                }
                if object.contains_key("properties") {
                    assert_eq!(object["additionalProperties"], false, "{object:?}");
                }
            });
        }
    }

    #[test]
    fn function_schemas_are_strict_in_both_shapes() {
        let policy = Policy::builtin();
        let chat = function_schema(&policy, ToolSchemaFormat::Chat);
        assert_eq!(chat["type"], "function");
        assert_eq!(chat["function"]["name"], "run_code");
        assert_eq!(chat["function"]["strict"], true);
        let parameters = &chat["function"]["parameters"];
        let mut names = required(parameters);
        names.sort_unstable();
        assert_eq!(
            names,
            vec!["code", "files", "language", "return_files", "timeout_s"]
        );
        assert_eq!(
            parameters["properties"]["files"]["type"],
            serde_json::json!(["array", "null"])
        );
        let mut with_sessions = Policy::builtin();
        with_sessions.sessions.enabled = true;
        let offered = function_schema(&with_sessions, ToolSchemaFormat::Chat);
        assert_eq!(
            offered["function"]["parameters"]["properties"]["session"]["type"],
            serde_json::json!(["string", "null"])
        );
        let responses = function_schema(&policy, ToolSchemaFormat::Responses);
        assert_eq!(responses["name"], "run_code");
        assert_eq!(responses["strict"], true);
        assert_eq!(&responses["parameters"], parameters);
        assert_eq!("responses".parse(), Ok(ToolSchemaFormat::Responses));
        assert!("xml".parse::<ToolSchemaFormat>().is_err());
    }
}
