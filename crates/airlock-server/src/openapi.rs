//! The OpenAPI 3.1 document of the HTTP API. Its component schemas are derived from the
//! types the server parses and sends (the request types here, the observation in
//! airlock-core) through `airlock_core::schema::generator`, which writes enums as plain
//! `enum` arrays; a snapshot test (`src/snapshots/openapi.json`) shows every change.

use airlock_core::Observation;
use serde_json::{Value, json};

use crate::api::{
    ErrorBody, Health, OutputChunk, RunRequest, SessionBody, SessionFiles, SessionRunRequest,
    SessionRunResponse,
};

/// The document.
pub fn document() -> Value {
    let mut generator = airlock_core::schema::generator("/components/schemas");
    let run_request = generator.subschema_for::<RunRequest>().to_value();
    let observation = generator.subschema_for::<Observation>().to_value();
    let error = generator.subschema_for::<ErrorBody>().to_value();
    let health = generator.subschema_for::<Health>().to_value();
    let chunk = generator.subschema_for::<OutputChunk>().to_value();
    let session = generator.subschema_for::<SessionBody>().to_value();
    let session_run = generator.subschema_for::<SessionRunRequest>().to_value();
    let session_result = generator.subschema_for::<SessionRunResponse>().to_value();
    let session_files = generator.subschema_for::<SessionFiles>().to_value();
    let schemas = Value::Object(generator.take_definitions(true));

    let error_response = |description: &str| {
        json!({
            "description": description,
            "content": {"application/json": {"schema": error.clone()}}
        })
    };
    let unauthorized = error_response("Missing or wrong bearer token (error.kind unauthorized).");
    let bearer = json!([{"bearer": []}, {}]);
    // Another tenant's session is as absent as one that never was: 404, not 403.
    let not_found = error_response("No such session for this tenant (invalid_input).");
    let session_id = json!({
        "name": "id",
        "in": "path",
        "required": true,
        "description": "The session's id.",
        "schema": {"type": "string"}
    });
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
            "/v1/sessions": {
                "post": {
                    "operationId": "createSession",
                    "summary": "Open a session",
                    "description": "A session keeps state across calls, within the bounds of the \
                        policy's [sessions] section (off unless enabled): owned by the caller's \
                        tenant only, destroyed after `idle` without a call and at `ttl` whatever \
                        its use. `workspace` sessions run each call in a fresh sandbox whose /work \
                        is the session's (files persist, processes never do); `kernel` sessions \
                        keep one sandbox with a Python interpreter whose globals persist. The \
                        body is {} or empty, sent as Content-Type: application/json like every \
                        POST (415 otherwise): the settings are the policy's.",
                    "security": bearer,
                    "requestBody": {
                        "required": false,
                        "content": {"application/json": {"schema": {"type": "object", "additionalProperties": false}}}
                    },
                    "responses": {
                        "201": {"description": "The session.", "content": {"application/json": {"schema": session.clone()}}},
                        "400": error_response("A body other than {} (invalid_input)."),
                        "401": unauthorized.clone(),
                        "403": error_response("Sessions are disabled by the policy, or this backend cannot hold them (policy_denied)."),
                        "408": error_response("The request body did not arrive in time."),
                        "413": error_response("The request body is over the server's limit."),
                        "415": error_response("The body is not sent as Content-Type: application/json (invalid_input)."),
                        "429": error_response("The tenant holds max_per_tenant sessions already (policy_denied)."),
                        "503": error_response("The kernel did not start, or the server is shutting down.")
                    }
                }
            },
            "/v1/sessions/{id}": {
                "parameters": [session_id.clone()],
                "get": {
                    "operationId": "getSession",
                    "summary": "A session",
                    "security": bearer,
                    "responses": {
                        "200": {"description": "The session.", "content": {"application/json": {"schema": session}}},
                        "401": unauthorized.clone(),
                        "404": not_found.clone()
                    }
                },
                "delete": {
                    "operationId": "deleteSession",
                    "summary": "End a session",
                    "description": "Stops a call in progress, kills the sandbox and removes the \
                        session's /work with everything in it.",
                    "security": bearer,
                    "responses": {
                        "204": {"description": "Ended."},
                        "401": unauthorized.clone(),
                        "404": not_found.clone()
                    }
                }
            },
            "/v1/sessions/{id}/runs": {
                "parameters": [session_id.clone()],
                "post": {
                    "operationId": "runInSession",
                    "summary": "Run one call in a session",
                    "description": "Calls of one session run one at a time. 200 when the call \
                        ran, whatever its end (see observation.outcome and error).",
                    "security": bearer,
                    "requestBody": {
                        "required": true,
                        "content": {"application/json": {"schema": session_run}}
                    },
                    "responses": {
                        "200": {"description": "The call's result.", "content": {"application/json": {"schema": session_result}}},
                        "400": error_response("Malformed request, or above the policy's wall time (invalid_input)."),
                        "401": unauthorized.clone(),
                        "403": error_response("The call was refused by the policy, or sessions cannot be held here (policy_denied)."),
                        "404": not_found.clone(),
                        "408": error_response("The request body did not arrive in time."),
                        "413": error_response("The request body is over the server's limit."),
                        "415": error_response("The body is not sent as Content-Type: application/json (invalid_input)."),
                        "500": error_response("airlock failed (internal)."),
                        "503": error_response("The kernel could not be restarted, or the server is shutting down.")
                    }
                }
            },
            "/v1/sessions/{id}/files": {
                "parameters": [session_id.clone()],
                "get": {
                    "operationId": "listSessionFiles",
                    "summary": "The files of a session's /work",
                    "security": bearer,
                    "responses": {
                        "200": {"description": "Regular files, in path order.", "content": {"application/json": {"schema": session_files}}},
                        "401": unauthorized.clone(),
                        "404": not_found.clone()
                    }
                }
            },
            "/v1/sessions/{id}/files/{path}": {
                "parameters": [session_id, {
                    "name": "path",
                    "in": "path",
                    "required": true,
                    "description": "Path relative to /work, the same rules as job files (no \"..\", not absolute, at most 8 levels); .airlock/ is the session's own.",
                    "schema": {"type": "string"}
                }],
                "get": {
                    "operationId": "readSessionFile",
                    "summary": "Read a file of a session's /work",
                    "description": "Only a regular file is read, never through a link the session's code left.",
                    "security": bearer,
                    "responses": {
                        "200": {"description": "The bytes.", "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                        "400": error_response("A bad path, or a file over the size cap (invalid_input)."),
                        "401": unauthorized.clone(),
                        "404": error_response("No such session for this tenant, or no such file.")
                    }
                },
                "put": {
                    "operationId": "writeSessionFile",
                    "summary": "Write a file into a session's /work",
                    "description": "The body is the file's bytes; what sits at the name is replaced.",
                    "security": bearer,
                    "requestBody": {
                        "required": true,
                        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
                    },
                    "responses": {
                        "204": {"description": "Written."},
                        "400": error_response("A bad path, a file over the size cap, or the session's /work is full (invalid_input)."),
                        "401": unauthorized,
                        "404": not_found,
                        "408": error_response("The request body did not arrive in time."),
                        "413": error_response("The request body is over the server's limit."),
                        "500": error_response("The workspace could not be written (internal).")
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
            "SessionBody",
            "SessionRunRequest",
            "SessionRunResponse",
            "SessionFiles",
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
