//! The Agent Card (A2A 1.0): who airlock is, where its JSON-RPC endpoint is, its one
//! skill, and the auth it needs.

use airlock_core::Policy;
use serde_json::{Value, json};

/// Where clients look for the card.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// The skill's id: the same as the MCP tool's name.
pub const SKILL_ID: &str = airlock_mcp::TOOL_NAME;

/// The card for an agent whose JSON-RPC endpoint is `url`; with `authenticated`, callers
/// need a bearer token (`airlock token new`).
pub fn agent_card(url: &str, policy: &Policy, authenticated: bool) -> Value {
    let languages: Vec<&str> = policy.languages.keys().map(String::as_str).collect();
    let mut card = json!({
        "name": "airlock",
        "description": "Runs code in a disposable, hardened sandbox and returns what happened: \
            send the program as a text part (the default language) or as a data part \
            {\"code\", \"language\", \"files\", \"timeout_s\", \"return_files\"}; the task's \
            artifacts are the observation (JSON), stdout, stderr and the files the program \
            wrote to /out. One message is one job; CancelTask kills it.",
        "supportedInterfaces": [{
            "url": url,
            "protocolBinding": "JSONRPC",
            "protocolVersion": crate::PROTOCOL_VERSION,
        }],
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true, "pushNotifications": false},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["application/json", "text/plain", "application/octet-stream"],
        "skills": [{
            "id": SKILL_ID,
            "name": "Run code",
            "description": airlock_mcp::tool::description(policy),
            "tags": ["code-execution", "sandbox"],
            "examples": ["print(sum(range(10)))"],
            "inputModes": ["text/plain", "application/json"],
            "outputModes": ["application/json", "text/plain", "application/octet-stream"],
        }],
    });
    if let Some(tags) = card["skills"][0]["tags"].as_array_mut() {
        tags.extend(languages.iter().map(|l| Value::from(*l)));
    }
    if authenticated {
        card["securitySchemes"] = json!({
            "bearer": {"httpAuthSecurityScheme": {
                "scheme": "Bearer",
                "description": "an airlock token (`airlock token new`), as Authorization: Bearer TOKEN",
            }}
        });
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
    }
    card
}
