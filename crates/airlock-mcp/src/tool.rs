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

/// The arguments of a `run_code` call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "run_code arguments")]
pub struct RunCodeParams {
    /// The language of `code`.
    pub language: String,
    /// The program's complete source code (UTF-8). Its stdout and stderr are returned.
    pub code: String,
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
        (None, None) => Vec::new(),
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

/// Seconds as a [`Duration`]: finite and positive, else an `invalid_input` error.
pub fn seconds(field: &str, value: f64) -> Result<Duration, ParamsError> {
    if !value.is_finite() || value <= 0.0 {
        return Err((
            ErrorKind::InvalidInput,
            format!("{field}: {value} is not a positive number of seconds"),
        ));
    }
    Duration::try_from_secs_f64(value)
        .map_err(|e| (ErrorKind::InvalidInput, format!("{field}: {e}")))
}

impl RunCodeParams {
    /// The job these arguments ask for.
    pub fn into_request(self) -> Result<JobRequest, ParamsError> {
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
            language: self.language,
            source: self.code.into_bytes(),
            files,
            limits: LimitsRequest {
                timeout,
                ..LimitsRequest::default()
            },
            ..JobRequest::default()
        })
    }
}

/// The JSON Schema of the tool's arguments, with `language` narrowed to the policy's
/// languages.
pub fn input_schema(policy: &Policy) -> Map<String, Value> {
    let schema = schemars::schema_for!(RunCodeParams);
    let mut value = schema.to_value();
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
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
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
         tmpfs. Print what you want to see: the result has stdout (first {stdout} bytes) and \
         stderr (first {stderr} bytes), *_truncated flags and byte counts, exit_code, and \
         outcome (exited, timeout, oom, killed, output_limit, or error). ok is true only when \
         the program exited with code 0.",
        languages = languages.join(", "),
        timeout = format_duration(limits.timeout),
        memory = limits.memory,
        cpus = limits.cpus,
        pids = limits.pids,
        source = limits.source,
        stdout = limits.stdout.as_u64(),
        stderr = limits.stderr.as_u64(),
    )
}

/// The tool in the shape OpenAI-style function calling uses:
/// `{"type": "function", "function": {"name", "description", "parameters"}}`.
pub fn function_schema(policy: &Policy) -> Value {
    serde_json::json!({
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": description(policy),
            "parameters": Value::Object(input_schema(policy)),
        }
    })
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
        let request = params.into_request().unwrap();
        assert_eq!(request.source, b"print(1)");
        assert_eq!(request.files[0].content, b"hi");
        assert_eq!(request.files[1].content, vec![0, 1]);
        assert_eq!(request.limits.timeout, Some(Duration::from_millis(1500)));
    }

    /// CrewAI sends `{"code":…,"files":null,"language":"python","timeout_s":null}`.
    #[test]
    fn null_means_absent() {
        let params: RunCodeParams = serde_json::from_value(serde_json::json!({
            "code": "print(1)", "files": null, "language": "python", "timeout_s": null
        }))
        .unwrap();
        let request = params.into_request().unwrap();
        assert!(request.files.is_empty());
        assert_eq!(request.limits.timeout, None);
    }

    #[test]
    fn unknown_fields_and_bad_timeouts_are_refused() {
        assert!(
            serde_json::from_value::<RunCodeParams>(
                serde_json::json!({"language": "python", "code": "", "network": "on"})
            )
            .is_err()
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300] {
            assert!(seconds("timeout_s", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn schema_lists_the_policy_languages_and_limits() {
        let policy = Policy::builtin();
        let schema = input_schema(&policy);
        let languages = schema["properties"]["language"]["enum"].as_array().unwrap();
        assert!(languages.contains(&Value::from("python")));
        assert_eq!(schema["properties"]["timeout_s"]["maximum"], 5.0);
        assert_eq!(schema["additionalProperties"], false);
        let required: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(required, vec!["language", "code"]);
        let text = description(&policy);
        assert!(text.contains("5s wall time"), "{text}");
        assert!(text.contains("network is off"), "{text}");
        let function = function_schema(&policy);
        assert_eq!(function["function"]["name"], "run_code");
    }
}
