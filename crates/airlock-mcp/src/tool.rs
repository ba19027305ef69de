//! The `run_code` tool: its parameters (one schema for MCP, the HTTP API's tool schema and
//! OpenAI-style function calling), its description, and how a call becomes a job.

use std::time::Duration;

use airlock_core::Policy;
use airlock_core::request::{RequestError, RunRequest, TOOL_DOOR};
use airlock_core::units::format_duration;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The tool's name.
pub const TOOL_NAME: &str = "run_code";

/// What a call may take beyond the job's wall time: sandbox setup (an image's first
/// unpack, a container start, a queue wait) and teardown. Clients are told to wait the
/// wall time plus this before giving up.
pub const CALL_SETUP_ALLOWANCE: Duration = Duration::from_secs(30);

/// MCP's own argument beside the run request's: the session a call runs in. Offered only
/// where the policy enables sessions.
pub const SESSION_ARGUMENT: &str = "session";
/// The longest tool description OpenAI's function calling and LlamaIndex's
/// `to_openai_tool()` take; the built-in policy's descriptions stay within it.
pub const DESCRIPTION_BUDGET: usize = 1024;

/// The schema of `session`, MCP's own argument.
#[derive(JsonSchema)]
#[allow(dead_code)] // only its schema is used
struct SessionArgument {
    /// A session id from `session_start`: the code runs in that session (its files, and in
    /// a kernel session its Python variables, persist between calls). Absent: a fresh
    /// sandbox that keeps nothing.
    session: Option<String>,
}

/// A `run_code` call's arguments: the run request, as the tool door offers it, and the
/// session it names, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct RunCodeArguments {
    /// The request.
    pub request: RunRequest,
    /// The session the call runs in (`None`: a fresh sandbox).
    pub session: Option<String>,
}

impl RunCodeArguments {
    /// Reads a call's arguments under `policy`: `session` only where sessions are on, every
    /// other field as [`TOOL_DOOR`] offers it; errors name the field.
    pub fn parse(arguments: Option<Value>, policy: &Policy) -> Result<Self, RequestError> {
        let mut object = match arguments {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(object)) => object,
            Some(other) => {
                return Err(RequestError(format!(
                    "arguments: expected an object, got {}",
                    json_type(&other)
                )));
            }
        };
        let (session, extra): (_, &[&str]) = if policy.sessions.enabled {
            let session = match object.remove(SESSION_ARGUMENT) {
                None | Some(Value::Null) => None,
                Some(Value::String(id)) => Some(id),
                Some(other) => {
                    return Err(RequestError(format!(
                        "session: expected a session id (a string), got {}",
                        json_type(&other)
                    )));
                }
            };
            (session, &[SESSION_ARGUMENT])
        } else {
            (None, &[])
        };
        let request = RunRequest::from_door(&TOOL_DOOR, object, extra)?;
        Ok(Self { request, session })
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
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
/// `with_session`: offer MCP's own `session` argument (where the policy enables sessions).
/// A function-calling host sends a call to `POST /v1/runs`, which runs fresh jobs only,
/// so its schema never offers it: a model is not offered what would be refused.
fn params_schema(policy: &Policy, with_session: bool) -> Value {
    let mut value = RunRequest::schema_for(&TOOL_DOOR);
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
    if with_session
        && policy.sessions.enabled
        && let Some(properties) = value
            .pointer_mut("/properties")
            .and_then(Value::as_object_mut)
    {
        let session = airlock_core::schema::generator("/$defs")
            .into_root_schema_for::<SessionArgument>()
            .to_value();
        if let Some(schema) = session.pointer("/properties/session") {
            properties.insert(SESSION_ARGUMENT.to_owned(), schema.clone());
        }
    }
    value
}

/// MCP's `inputSchema`: no references, objects closed, optional arguments nullable and
/// not required (only `code` is).
pub fn input_schema(policy: &Policy) -> Map<String, Value> {
    match airlock_core::schema::closed(&params_schema(policy, true)) {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The strict parameters schema for function calling: every argument required, optional
/// ones nullable, no references, objects closed; no `session` (the host's calls go to
/// `POST /v1/runs`, which runs fresh jobs; sessions have their own API).
pub fn strict_input_schema(policy: &Policy) -> Value {
    airlock_core::schema::strict(&params_schema(policy, false))
}

/// What the model is told about the tool where files come back inline (the HTTP API's
/// tool schema): the limits of `policy`, the network, files and how output comes back.
pub fn description(policy: &Policy) -> String {
    let files = format!(
        "regular files it writes there come back in files[] as content_base64 (up to {} in \
         total; larger ones are listed without content).",
        policy.filesystem.out.inline_bytes
    );
    describe(policy, &files)
}

/// What an MCP client's model is told: as [`description`], but files come back inline only
/// up to `out.mcp_inline_bytes` and always as resource links.
pub fn mcp_description(policy: &Policy) -> String {
    let files = format!(
        "files it writes there are listed in files[]; up to {} in total come back inline \
         (pictures as images, others as content_base64), larger ones as resource links the \
         client can read.",
        policy.filesystem.out.mcp_inline_bytes
    );
    describe(policy, &files)
}

/// The description is kept under [`DESCRIPTION_BUDGET`] characters on the built-in policy:
/// OpenAI's function calling and LlamaIndex's `to_openai_tool()` refuse longer ones.
fn describe(policy: &Policy, files: &str) -> String {
    let limits = &policy.limits;
    let languages: Vec<&str> = policy.languages.keys().map(String::as_str).collect();
    let network = match policy.network.mode {
        airlock_core::policy::NetworkMode::None => {
            "The network is off: no internet, DNS or package installs.".to_owned()
        }
        airlock_core::policy::NetworkMode::Proxy => format!(
            "The network is off except through an allowlisting proxy to: {}.",
            policy.network.allow.join(", ")
        ),
    };
    format!(
        "Runs a program in a fresh, isolated sandbox; returns JSON. \
         Languages: {languages}. Nothing persists between calls. Limits: {timeout} wall time \
         (timeout_s may lower it), {memory} memory, {cpus} CPU, {pids} processes, {source} \
         of source. {network} The program runs as an unprivileged user in /work (read-only \
         unless the policy says otherwise), where files you pass are placed (Python can \
         import them); /tmp is a small writable tmpfs. With return_files \
         true it also gets a writable /out (at most {out_max}): {files} Print what you want \
         to see: the result has stdout (first {stdout} bytes), stderr (first {stderr} \
         bytes), *_truncated flags, byte counts, exit_code and outcome (exited, timeout, \
         oom, killed, output_limit, error); ok is true only for exit code 0. A call can take \
         {call} (wall time plus setup).",
        languages = languages.join(", "),
        timeout = format_duration(limits.timeout),
        memory = limits.memory,
        cpus = limits.cpus,
        pids = limits.pids,
        source = limits.source,
        stdout = limits.stdout.as_u64(),
        stderr = limits.stderr.as_u64(),
        out_max = policy.filesystem.out.max_bytes,
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

    fn parse(arguments: Value, policy: &Policy) -> Result<RunCodeArguments, RequestError> {
        RunCodeArguments::parse(Some(arguments), policy)
    }

    #[test]
    fn arguments_become_a_job() {
        let arguments = parse(
            serde_json::json!({
                "language": "python",
                "code": "print(1)",
                "files": [{"path": "a.txt", "content": "hi"}, {"path": "b.bin", "content_base64": "AAE="}],
                "timeout_s": 1.5
            }),
            &Policy::builtin(),
        )
        .unwrap();
        assert_eq!(arguments.session, None);
        let request = arguments.request.into_job(&Policy::builtin()).unwrap();
        assert_eq!(request.source, b"print(1)");
        assert_eq!(request.files[0].content, b"hi");
        assert_eq!(request.files[1].content, vec![0, 1]);
        assert_eq!(
            request.limits.timeout,
            Some(std::time::Duration::from_millis(1500))
        );
    }

    /// CrewAI sends `{"code":…,"files":null,"language":"python","timeout_s":null}`.
    #[test]
    fn null_means_absent() {
        let mut policy = Policy::builtin();
        policy.sessions.enabled = true;
        let arguments = parse(
            serde_json::json!({
                "code": "print(1)", "files": null, "language": null, "timeout_s": null,
                "return_files": null, "session": null
            }),
            &policy,
        )
        .unwrap();
        assert_eq!(arguments.session, None);
        let request = arguments.request.into_job(&policy).unwrap();
        assert!(request.files.is_empty());
        assert_eq!(request.limits.timeout, None);
        assert_eq!(request.language, "python");
        assert!(!request.out);
    }

    /// Issue 30: with sessions off, an unknown field's error listed `session` as accepted;
    /// a wrong type named no field.
    #[test]
    fn errors_name_the_field_and_offer_only_what_the_policy_has() {
        let mut off = Policy::builtin();
        off.sessions.enabled = false;
        let error = parse(serde_json::json!({"code": "", "network": "on"}), &off).unwrap_err();
        assert_eq!(
            error.0,
            "unknown field \"network\": run_code takes code, language, files, timeout_s, return_files"
        );
        let error = parse(serde_json::json!({"code": "", "session": "s"}), &off).unwrap_err();
        assert!(error.0.starts_with("unknown field \"session\""), "{error}");
        let mut on = Policy::builtin();
        on.sessions.enabled = true;
        let error = parse(serde_json::json!({"code": "", "network": "on"}), &on).unwrap_err();
        assert!(error.0.ends_with("return_files, session"), "{error}");
        let arguments = parse(serde_json::json!({"code": "1", "session": "s-1"}), &on).unwrap();
        assert_eq!(arguments.session.as_deref(), Some("s-1"));
        let error = parse(serde_json::json!({"code": 5}), &off).unwrap_err();
        assert_eq!(
            error.0,
            "code: invalid type: integer `5`, expected a string"
        );
        let error = parse(serde_json::json!({"code": "", "session": 5}), &on).unwrap_err();
        assert!(error.0.starts_with("session: expected"), "{error}");
        let error = RunCodeArguments::parse(Some(serde_json::json!([1])), &off).unwrap_err();
        assert_eq!(error.0, "arguments: expected an object, got an array");
    }

    #[test]
    fn a_huge_timeout_is_the_policy_s_to_deny() {
        let policy = Policy::builtin();
        let arguments = parse(serde_json::json!({"code": "", "timeout_s": 1e9}), &policy).unwrap();
        let request = arguments.request.into_job(&policy).unwrap();
        assert_eq!(
            request.resolve(&policy).unwrap_err().kind(),
            airlock_core::ErrorKind::PolicyDenied
        );
    }

    #[test]
    fn the_tool_schema_offers_no_executable_bit_and_requires_only_code() {
        let schema = Value::Object(input_schema(&Policy::builtin()));
        assert_eq!(schema["required"], serde_json::json!(["code"]));
        let file = &schema["properties"]["files"]["items"]["properties"];
        assert!(
            file["path"].is_object() && file["executable"].is_null(),
            "{file}"
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
    fn the_builtin_descriptions_fit_the_function_calling_budget() {
        let policy = Policy::builtin();
        for text in [description(&policy), mcp_description(&policy)] {
            assert!(
                text.chars().count() <= DESCRIPTION_BUDGET,
                "{} characters: {text}",
                text.chars().count()
            );
        }
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
        let mut policy = Policy::builtin();
        policy.sessions.enabled = false;
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
        // MCP offers its own `session` argument; a function-calling host's calls go to
        // POST /v1/runs, which has none, so its schema never offers it.
        let offered = function_schema(&with_sessions, ToolSchemaFormat::Chat);
        assert!(
            offered["function"]["parameters"]["properties"]["session"].is_null(),
            "{offered}"
        );
        let mcp = Value::Object(input_schema(&with_sessions));
        assert_eq!(
            mcp["properties"]["session"]["type"],
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
