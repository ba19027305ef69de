//! `airlock tool-schema`: the strict function schema in each shape, from the policy.

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::TestEnv;

fn tool_schema(env: &TestEnv, args: &[&str]) -> Value {
    let out = env.cmd().arg("tool-schema").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

fn sorted(names: &Value) -> Vec<String> {
    let mut names: Vec<String> = names
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_default_is_the_strict_chat_completions_tool() {
    let env = TestEnv::new();
    let chat = tool_schema(&env, &[]);
    assert_eq!(chat, tool_schema(&env, &["--format", "chat"]));
    assert_eq!(chat["type"], "function");
    let function = &chat["function"];
    assert_eq!(function["name"], "run_code");
    assert_eq!(function["strict"], true);
    assert_eq!(
        sorted(&function["parameters"]["required"]),
        ["code", "files", "language", "return_files", "timeout_s"]
    );
    assert_eq!(function["parameters"]["additionalProperties"], false);
    assert!(!function.to_string().contains("$ref"));
}

#[test]
fn responses_is_the_flat_shape_with_the_same_parameters() {
    let env = TestEnv::new();
    let responses = tool_schema(&env, &["--format", "responses"]);
    let chat = tool_schema(&env, &["--format", "chat"]);
    assert_eq!(responses["type"], "function");
    assert_eq!(responses["name"], "run_code");
    assert_eq!(responses["strict"], true);
    assert_eq!(responses["parameters"], chat["function"]["parameters"]);
    assert!(responses.get("function").is_none());
}

#[test]
fn mcp_is_the_listed_tool_with_both_schemas() {
    let env = TestEnv::new();
    let tool = tool_schema(&env, &["--format", "mcp"]);
    assert_eq!(tool["name"], "run_code");
    assert_eq!(tool["inputSchema"]["required"], json!(["code"]));
    assert_eq!(tool["outputSchema"]["type"], "object");
    assert!(
        sorted(&tool["outputSchema"]["required"]).contains(&"outcome".to_owned()),
        "{tool:#}"
    );
}

#[test]
fn the_policy_gives_the_languages_and_limits() {
    let env = TestEnv::new();
    let policy = env.policy("[limits]\ntimeout = \"20s\"");
    let chat = tool_schema(&env, &["--policy", policy.to_str().unwrap()]);
    let parameters = &chat["function"]["parameters"];
    assert_eq!(parameters["properties"]["timeout_s"]["maximum"], 20.0);
    let description = chat["function"]["description"].as_str().unwrap();
    assert!(description.contains("20s wall time"), "{description}");
    assert!(
        description.contains("50s"),
        "the client timeout: {description}"
    );
}

#[test]
fn a_bad_format_or_policy_is_refused() {
    let env = TestEnv::new();
    let out = env
        .cmd()
        .args(["tool-schema", "--format", "xml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let missing = env.path().join("no-such-policy.toml");
    let out = env
        .cmd()
        .args(["tool-schema", "--policy"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}
