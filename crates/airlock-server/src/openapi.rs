//! The OpenAPI 3.1 document of the HTTP API. Its component schemas are derived from the
//! types the server parses and sends (the request types here, the observation in
//! airlock-core) through `airlock_core::schema::generator`, which writes enums as plain
//! `enum` arrays; a snapshot test (`src/snapshots/openapi.json`) shows every change.

use airlock_core::Observation;
use serde_json::{Value, json};

use crate::api::{ErrorBody, Health, OutputChunk, RunRequest};

/// The document.
pub fn document() -> Value {
    let mut generator = airlock_core::schema::generator("/components/schemas");
    let run_request = generator.subschema_for::<RunRequest>().to_value();
    let observation = generator.subschema_for::<Observation>().to_value();
    let error = generator.subschema_for::<ErrorBody>().to_value();
    let health = generator.subschema_for::<Health>().to_value();
    let chunk = generator.subschema_for::<OutputChunk>().to_value();
    let schemas = Value::Object(generator.take_definitions(true));

    let error_response = |description: &str| {
        json!({
            "description": description,
            "content": {"application/json": {"schema": error.clone()}}
        })
    };
    let unauthorized = error_response("Missing or wrong bearer token (error.kind unauthorized).");
    let bearer = json!([{"bearer": []}, {}]);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "airlock",
            "version": env!("CARGO_PKG_VERSION"),
            "summary": "Run untrusted, model-written code in a disposable, hardened sandbox.",
            "description": "Each job runs in a fresh sandbox and comes back as one bounded JSON \
                observation. With a tokens file every endpoint but /v1/health and \
                /v1/openapi.json needs `Authorization: Bearer <token>` (401, error.kind \
                unauthorized, otherwise). Without a tokens file the server is on loopback \
                and serves no web page: every request needs a `Host` naming its loopback \
                address and port, and an absent or loopback `Origin` (403 policy_denied \
                otherwise). POST bodies must be `Content-Type: application/json` (415 \
                invalid_input otherwise). The MCP tool server (streamable HTTP, same auth \
                and checks) is at /mcp.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"}
        },
        "paths": {
            "/v1/runs": {
                "post": {
                    "operationId": "run",
                    "summary": "Run one job",
                    "description": "200 when the job ran, whatever its exit (see `ok` and \
                        `outcome`). With stream=true the answer is server-sent events: `stdout` \
                        and `stderr` events carry output chunks (data: {\"text\": ...}) as the \
                        job writes them, then one `observation` event carries the observation.",
                    "security": bearer,
                    "parameters": [{
                        "name": "stream",
                        "in": "query",
                        "required": false,
                        "description": "Stream output as server-sent events.",
                        "schema": {"type": "boolean", "default": false}
                    }],
                    "requestBody": {
                        "required": true,
                        "content": {"application/json": {"schema": run_request}}
                    },
                    "responses": {
                        "200": {
                            "description": "The job ran; its observation.",
                            "content": {
                                "application/json": {"schema": observation},
                                "text/event-stream": {
                                    // OpenAPI 3.1 (without 3.2's itemSchema): `schema` is one event.
                                    "schema": {
                                        "type": "object",
                                        "description": "One server-sent event: `stdout` and `stderr` carry an OutputChunk as JSON, the last one, `observation`, the Observation as JSON (see x-events).",
                                        "properties": {
                                            "event": {"type": "string", "enum": ["stdout", "stderr", "observation"]},
                                            "data": {"type": "string", "description": "The event's JSON."}
                                        },
                                        "required": ["event", "data"]
                                    },
                                    "x-events": {"stdout": chunk.clone(), "stderr": chunk, "observation": observation}
                                }
                            }
                        },
                        "400": error_response("Malformed request (error.kind invalid_input)."),
                        "415": error_response("The body is not sent as Content-Type: application/json (invalid_input)."),
                        "401": unauthorized,
                        "403": error_response("The request asks for more than the policy allows, or, without tokens, comes with a foreign Host or Origin (policy_denied)."),
                        "408": error_response("The request body did not arrive in time."),
                        "413": error_response("The request body is over the server's limit."),
                        "429": {
                            "description": "The queue is full; retry after the given seconds.",
                            "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}},
                            "content": {"application/json": {"schema": error}}
                        },
                        "500": error_response("airlock failed (internal)."),
                        "503": error_response("The backend is unavailable, or the server is shutting down.")
                    }
                }
            },
            "/v1/health": {
                "get": {
                    "operationId": "health",
                    "summary": "Liveness and load",
                    "security": [],
                    "responses": {
                        "200": {"description": "Serving.", "content": {"application/json": {"schema": health.clone()}}},
                        "503": {"description": "Shutting down.", "content": {"application/json": {"schema": health}}}
                    }
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "summary": "Prometheus metrics",
                    "description": "Prometheus text format 0.0.4 (`text/plain; version=0.0.4`) by default; \
                        OpenMetrics 1.0.0 when the Accept header weighs \
                        `application/openmetrics-text` above `text/plain` (as Prometheus's \
                        scraper does).",
                    "security": bearer,
                    "responses": {
                        "200": {"description": "The exposition.", "content": {
                            "text/plain": {"schema": {"type": "string"}},
                            "application/openmetrics-text": {"schema": {"type": "string"}}
                        }},
                        "401": error_response("Missing or wrong bearer token (unauthorized).")
                    }
                }
            },
            "/v1/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document",
                    "security": [],
                    "responses": {"200": {"description": "OpenAPI 3.1.", "content": {"application/json": {"schema": {"type": "object"}}}}}
                }
            },
            "/v1/tool-schema": {
                "get": {
                    "operationId": "toolSchema",
                    "summary": "The run_code tool for strict function calling",
                    "description": "format=chat (the default): {\"type\": \"function\", \"function\": \
                        {\"name\": \"run_code\", \"description\", \"parameters\", \"strict\": true}}; \
                        format=responses: {\"type\": \"function\", \"name\", \"description\", \
                        \"parameters\", \"strict\": true}. The parameters have no $ref, every \
                        property required (optional ones nullable) and additionalProperties \
                        false; the description has the limits of the caller's policy.",
                    "security": bearer,
                    "parameters": [{
                        "name": "format",
                        "in": "query",
                        "required": false,
                        "description": "The shape: Chat Completions or the Responses API.",
                        "schema": {"type": "string", "enum": ["chat", "responses"], "default": "chat"}
                    }],
                    "responses": {
                        "200": {"description": "The tool.", "content": {"application/json": {"schema": {"type": "object"}}}},
                        "400": error_response("An unknown format, or strict=false (invalid_input)."),
                        "401": error_response("Missing or wrong bearer token (unauthorized).")
                    }
                }
            }
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "A token from `airlock token new`."}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The checked-in rendering of the document.
    fn snapshot_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/snapshots/openapi.json")
    }

    fn walk(value: &Value, visit: &mut dyn FnMut(&serde_json::Map<String, Value>)) {
        match value {
            Value::Object(object) => {
                visit(object);
                object.values().for_each(|v| walk(v, visit));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, visit)),
            _ => {}
        }
    }

    /// Any change to the document shows as a diff of `src/snapshots/openapi.json`.
    /// After an intended change: `AIRLOCK_BLESS=1 cargo nextest run -p airlock-server -E
    /// 'test(/openapi_document_matches/)'`, then review the diff.
    #[test]
    fn openapi_document_matches_its_snapshot() {
        let mut rendered = serde_json::to_string_pretty(&document()).unwrap();
        rendered.push('\n');
        let path = snapshot_path();
        if std::env::var_os("AIRLOCK_BLESS").is_some() {
            std::fs::write(&path, &rendered).unwrap();
        }
        let stored = std::fs::read_to_string(&path).unwrap_or_default();
        pretty_assertions::assert_eq!(
            stored,
            rendered,
            "{} differs from the rendered document; if the change is intended, rerun with AIRLOCK_BLESS=1 and review the diff",
            path.display()
        );
    }

    #[test]
    fn document_is_openapi_3_1_with_resolvable_refs() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for name in [
            "RunRequest",
            "Observation",
            "ErrorBody",
            "Health",
            "RequestFile",
            "OutputChunk",
        ] {
            assert!(
                schemas.contains_key(name),
                "{name} missing: {:?}",
                schemas.keys()
            );
        }
        // Every $ref points into components/schemas and resolves.
        let text = doc.to_string();
        for part in text.split("\"$ref\":\"").skip(1) {
            let target = &part[..part.find('"').unwrap()];
            let name = target
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("{target}"));
            assert!(schemas.contains_key(name), "{target} does not resolve");
        }
        assert_eq!(schemas["RunRequest"]["additionalProperties"], false);
    }

    /// What code generators need (openapi-python-client): enums as plain string `enum`s,
    /// never a `oneOf` of `const`s, and object types without a top-level `anyOf`/`oneOf`
    /// (which makes it drop `RunRequest`).
    #[test]
    fn schemas_are_generator_friendly() {
        let doc = document();
        walk(&doc, &mut |object| {
            assert!(!object.contains_key("oneOf"), "{object:?}");
            assert!(!object.contains_key("const"), "{object:?}");
        });
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for (name, schema) in schemas {
            if schema["type"] == "object" {
                assert!(schema.get("anyOf").is_none(), "{name}: {schema}");
            }
        }
        for (name, values) in [
            (
                "Outcome",
                json!([
                    "exited",
                    "timeout",
                    "oom",
                    "killed",
                    "output_limit",
                    "error"
                ]),
            ),
            (
                "ErrorKind",
                json!([
                    "invalid_input",
                    "policy_denied",
                    "unauthorized",
                    "backend_unavailable",
                    "internal"
                ]),
            ),
            ("NetworkChoice", json!(["none", "proxy"])),
        ] {
            assert_eq!(schemas[name]["type"], "string", "{name}");
            assert_eq!(schemas[name]["enum"], values, "{name}");
        }
        let request = &schemas["RunRequest"];
        assert_eq!(request.get("required"), None, "{request}");
        assert!(request["properties"].get("return_files").is_some());
        let file = &schemas["OutputFile"];
        assert!(file["properties"].get("content_base64").is_some());
    }
}
