//! The OpenAPI 3.1 document of the HTTP API. Its component schemas are derived from the
//! types the server parses and sends (the request types here, the observation in
//! airlock-core) through `airlock_core::schema::generator`, which writes enums as plain
//! `enum` arrays; a snapshot test (`src/snapshots/openapi.json`) shows every change.

use airlock_core::Observation;
use serde_json::{Value, json};

use crate::api::{
    CreateContextRequest, ErrorBody, Health, KernelContextBody, OutputChunk, RichResultBody,
    RunRequest, SessionBody, SessionFiles, SessionRunRequest, SessionRunResponse,
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
    let context_request = generator.subschema_for::<CreateContextRequest>().to_value();
    let context = generator.subschema_for::<KernelContextBody>().to_value();
    let rich_result = generator.subschema_for::<RichResultBody>().to_value();
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
    let mut doc = json!({
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
                            "description": "The queue is full, or the tenant has as many jobs waiting as its policy's admission.max_queued_per_tenant allows; retry after the given seconds.",
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
                        policy's [sessions] section (on in the built-in policy; 403 where a policy turns them off): owned by the caller's \
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
                        ran, whatever its end (see observation.outcome and error). With \
                        ?stream=true the answer is server-sent events: `stdout` and `stderr` \
                        chunks as the code writes them, `result` (a kernel call's results, \
                        once it ended), then `session_run` with the whole answer, or `error`.",
                    "security": bearer,
                    "parameters": [{
                        "name": "stream",
                        "in": "query",
                        "required": false,
                        "description": "true: answer with server-sent events.",
                        "schema": {"type": "boolean"}
                    }],
                    "requestBody": {
                        "required": true,
                        "content": {"application/json": {"schema": session_run}}
                    },
                    "responses": {
                        "200": {"description": "The call's result (or, streamed, its events).", "content": {
                            "application/json": {"schema": session_result},
                            "text/event-stream": {
                                // As /v1/runs's: `schema` is one event (OpenAPI 3.1).
                                "schema": {
                                    "type": "object",
                                    "description": "One server-sent event: `stdout` and `stderr` carry an OutputChunk as JSON, `result` a rich result, the last one `session_run` the whole answer (or `error` an error body), each as JSON (see x-events).",
                                    "properties": {
                                        "event": {"type": "string", "enum": ["stdout", "stderr", "result", "session_run", "error"]},
                                        "data": {"type": "string", "description": "The event's JSON."}
                                    },
                                    "required": ["event", "data"]
                                },
                                "x-events": {"stdout": chunk.clone(), "stderr": chunk.clone(), "result": rich_result, "session_run": session_result.clone()}
                            }
                        }},
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
            "/v1/sessions/{id}/contexts": {
                "parameters": [session_id.clone()],
                "get": {
                    "operationId": "listSessionContexts",
                    "summary": "The code contexts of a kernel session",
                    "security": bearer,
                    "responses": {
                        "200": {"description": "The contexts, the default one first.", "content": {"application/json": {"schema": {
                            "type": "object",
                            "required": ["contexts"],
                            "properties": {"contexts": {"type": "array", "items": context.clone()}}
                        }}}},
                        "401": unauthorized.clone(),
                        "403": error_response("A workspace session has no code contexts (policy_denied)."),
                        "404": not_found.clone()
                    }
                },
                "post": {
                    "operationId": "createSessionContext",
                    "summary": "Make a code context in a kernel session",
                    "description": "A context has its own globals and working directory in the session's one kernel; a call names it in `context`.",
                    "security": bearer,
                    "requestBody": {
                        "required": false,
                        "content": {"application/json": {"schema": context_request}}
                    },
                    "responses": {
                        "201": {"description": "The context.", "content": {"application/json": {"schema": context}}},
                        "400": error_response("A bad cwd or language, or too many contexts (invalid_input)."),
                        "401": unauthorized.clone(),
                        "403": error_response("A workspace session has no code contexts (policy_denied)."),
                        "404": not_found.clone()
                    }
                }
            },
            "/v1/sessions/{id}/contexts/{context}": {
                "parameters": [session_id.clone(), {"name": "context", "in": "path", "required": true, "description": "The context's id.", "schema": {"type": "string"}}],
                "delete": {
                    "operationId": "removeSessionContext",
                    "summary": "Remove a code context (not the default one)",
                    "security": bearer,
                    "responses": {
                        "204": {"description": "Removed."},
                        "400": error_response("No such context, or the default one (invalid_input)."),
                        "401": unauthorized.clone(),
                        "403": error_response("A workspace session has no code contexts (policy_denied)."),
                        "404": not_found.clone()
                    }
                }
            },
            "/v1/sessions/{id}/contexts/{context}/restart": {
                "parameters": [session_id.clone(), {"name": "context", "in": "path", "required": true, "description": "The context's id.", "schema": {"type": "string"}}],
                "post": {
                    "operationId": "restartSessionContext",
                    "summary": "Restart a code context: its next call starts from empty globals",
                    "security": bearer,
                    "responses": {
                        "204": {"description": "Restarted."},
                        "400": error_response("No such context (invalid_input)."),
                        "401": unauthorized.clone(),
                        "403": error_response("A workspace session has no code contexts (policy_denied)."),
                        "404": not_found.clone()
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
                    "description": "Only a regular file is read, never through a link the session's code left. Scanned as a released /out file is: text comes back with its secrets replaced ([REDACTED:<rule>]; X-Airlock-Redactions counts them), a binary with a secret in it or a file named like a secret is withheld (403).",
                    "security": bearer,
                    "responses": {
                        "200": {"description": "The bytes, secrets in text replaced.", "headers": {"X-Airlock-Redactions": {"description": "Secrets replaced in the content.", "schema": {"type": "integer"}}}, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                        "400": error_response("A bad path, or a file over the size cap (invalid_input)."),
                        "401": unauthorized.clone(),
                        "403": error_response("Withheld: a binary with a secret-shaped string in it, or a name that looks like a secret (policy_denied)."),
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
    });
    add_e2b(&mut doc);
    refuse_other_body_types(&mut doc);
    doc
}

/// Every POST, PUT or PATCH answers 415 to a body not sent as its type (a web page's form
/// post is refused before it is read: `refuse_web_pages`), so every such operation
/// documents it, in one place rather than in each.
fn refuse_other_body_types(doc: &mut Value) {
    let answer = json!({
        "description": "The body is not sent as its Content-Type (application/json; raw bytes for file uploads): invalid_input.",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    });
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for item in paths.values_mut() {
        for method in ["post", "put", "patch"] {
            if let Some(responses) = item
                .pointer_mut(&format!("/{method}/responses"))
                .and_then(Value::as_object_mut)
            {
                responses.entry("415").or_insert_with(|| answer.clone());
            }
        }
    }
}

/// The path parameter naming an E2B sandbox.
fn e2b_sandbox_id() -> Value {
    json!({
        "name": "id",
        "in": "path",
        "required": true,
        "description": "The E2B sandbox's id (`sandboxID`).",
        "schema": {"type": "string"}
    })
}

/// E2B's control plane (crates/airlock-e2b, docs/e2b.md): its JSON routes as operations,
/// its error shape and records as component schemas, and the in-sandbox API (routed by the
/// `E2b-Sandbox-Id` header or a `{port}-{sandboxID}.{domain}` Host, which OpenAPI cannot
/// express) described in the `e2b` tag. The schemas are written here, beside the records
/// `airlock_e2b::control` sends: the snapshot test shows any drift of the document, and
/// scripts/ci/server.sh's schemathesis pass checks the live answers against it.
fn add_e2b(doc: &mut Value) {
    let error = |description: &str| {
        json!({
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/E2bError"}}}
        })
    };
    let security = json!([{"e2bApiKey": []}, {"bearer": []}, {}]);
    let tags = json!(["e2b"]);
    let no_content = json!({"description": "Done (no body)."});
    let sandbox = json!({
        "description": "The sandbox (E2B's `Sandbox`).",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/E2bSandbox"}}}
    });
    let create = |operation_id: &str| {
        json!({
            "operationId": operation_id,
            "tags": tags,
            "summary": "E2B: create a sandbox",
            "description": "An E2B sandbox is an airlock session of the caller's tenant: \
                [sessions] bounds it (max_per_tenant, ttl, idle, workspace_bytes) and its \
                timeout is capped by the session's ttl. Options airlock does not have \
                (autoPause, autoResume, network, mcp, iam, volumeMounts) answer 501.",
            "security": security,
            "requestBody": {
                "required": false,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/E2bNewSandbox"}}}
            },
            "responses": {
                "201": sandbox,
                "400": error("An unknown template (the message names this server's), a bad body, an environment variable the policy does not allow, or an option airlock does not have (\"not supported by airlock: ...\")."),
                "401": error("No valid API key (X-API-Key, or a bearer token)."),
                "403": error("The policy turns the E2B API or sessions off, or the backend cannot hold sessions."),
                "429": error("The tenant holds max_per_tenant sessions already."),
                "503": error("The session's kernel did not start, or the server is shutting down.")
            }
        })
    };
    let list = |operation_id: &str| {
        json!({
            "operationId": operation_id,
            "tags": tags,
            "summary": "E2B: the caller's running sandboxes",
            "security": security,
            "parameters": [
                {"name": "metadata", "in": "query", "required": false,
                 "description": "Only sandboxes with this metadata: a query string itself (k=v&k2=v2), percent-encoded.",
                 "schema": {"type": "string"}},
                {"name": "state", "in": "query", "required": false,
                 "description": "Comma-separated states; a sandbox here is only ever running.",
                 "schema": {"type": "string"}}
            ],
            "responses": {
                "200": {"description": "The sandboxes.", "content": {"application/json": {"schema": {
                    "type": "array", "items": {"$ref": "#/components/schemas/E2bSandboxDetail"}}}}},
                "401": error("No valid API key.")
            }
        })
    };
    let not_found = error("No such sandbox for this tenant (another tenant's is as absent).");
    let timeout_body = |required: bool| {
        json!({
            "required": required,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/E2bTimeout"}}}
        })
    };
    let connect = |operation_id: &str| {
        json!({
            "operationId": operation_id,
            "tags": tags,
            "summary": "E2B: connect to a running sandbox",
            "description": "A longer timeout extends the sandbox (capped by the session's ttl); connecting never shortens it.",
            "security": security,
            "requestBody": timeout_body(false),
            "responses": {
                "200": sandbox,
                "400": error("A bad body."),
                "401": error("No valid API key."),
                "404": not_found
            }
        })
    };
    let paths = json!({
        "/sandboxes": {"post": create("e2bCreateSandbox"), "get": list("e2bListSandboxes")},
        "/v2/sandboxes": {"post": create("e2bCreateSandboxV2"), "get": list("e2bListSandboxesV2")},
        "/sandboxes/{id}": {
            "parameters": [e2b_sandbox_id()],
            "get": {
                "operationId": "e2bGetSandbox",
                "tags": tags,
                "summary": "E2B: a sandbox",
                "security": security,
                "responses": {
                    "200": {"description": "The sandbox (E2B's `SandboxDetail`, with its envdAccessToken).",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/E2bSandboxDetail"}}}},
                    "401": error("No valid API key."),
                    "404": not_found
                }
            },
            "delete": {
                "operationId": "e2bKillSandbox",
                "tags": tags,
                "summary": "E2B: kill a sandbox",
                "description": "Ends its session: a call in progress is stopped and its /work removed.",
                "security": security,
                "responses": {"204": no_content, "401": error("No valid API key."), "404": not_found}
            }
        },
        "/sandboxes/{id}/timeout": {
            "parameters": [e2b_sandbox_id()],
            "post": {
                "operationId": "e2bSetTimeout",
                "tags": tags,
                "summary": "E2B: end the sandbox `timeout` seconds from now",
                "description": "Capped by the session's ttl, never raised past it.",
                "security": security,
                "requestBody": timeout_body(true),
                "responses": {"204": no_content, "400": error("No timeout, or a bad body."),
                              "401": error("No valid API key."), "404": not_found}
            }
        },
        "/sandboxes/{id}/refreshes": {
            "parameters": [e2b_sandbox_id()],
            "post": {
                "operationId": "e2bRefreshSandbox",
                "tags": tags,
                "summary": "E2B: keep the sandbox alive `duration` seconds more",
                "description": "Only ever extends (capped by the session's ttl).",
                "security": security,
                "requestBody": timeout_body(false),
                "responses": {"204": no_content, "400": error("A bad body."),
                              "401": error("No valid API key."), "404": not_found}
            }
        },
        "/sandboxes/{id}/connect": {"parameters": [e2b_sandbox_id()], "post": connect("e2bConnectSandbox")},
        "/v2/sandboxes/{id}/connect": {"parameters": [e2b_sandbox_id()], "post": connect("e2bConnectSandboxV2")}
        // Pause, resume, snapshots and the rest answer 501 "not supported by airlock: …"
        // (docs/e2b.md); a route that only refuses is not an operation of the document.
    });
    let string_map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let schemas = json!({
        "E2bError": {
            "type": "object",
            "description": "E2B's error shape; the SDKs map the status to their exceptions.",
            "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
            "required": ["code", "message"]
        },
        "E2bNewSandbox": {
            "type": "object",
            "description": "E2B's create body. templateID defaults to base; timeout (seconds, default 300) is capped by [sessions] ttl.",
            "properties": {
                "templateID": {"type": ["string", "null"]},
                "timeout": {"type": ["integer", "null"], "minimum": 0},
                "envVars": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
                "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
                "allow_internet_access": {"type": ["boolean", "null"]},
                "secure": {"type": ["boolean", "null"]},
                "autoPause": {"type": ["boolean", "null"]}
            }
        },
        "E2bSandbox": {
            "type": "object",
            "description": "E2B's `Sandbox`: what create and connect answer.",
            "properties": {
                "templateID": {"type": "string"},
                "sandboxID": {"type": "string"},
                "alias": {"type": "string"},
                "clientID": {"type": "string"},
                "envdVersion": {"type": "string"},
                "envdAccessToken": {"type": "string"},
                "trafficAccessToken": {"type": "string"},
                "domain": {"type": ["string", "null"]}
            },
            "required": ["templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken"]
        },
        "E2bSandboxDetail": {
            "type": "object",
            "description": "E2B's `SandboxDetail` (get, with envdAccessToken) and `ListedSandbox` (list).",
            "properties": {
                "templateID": {"type": "string"},
                "sandboxID": {"type": "string"},
                "alias": {"type": "string"},
                "clientID": {"type": "string"},
                "startedAt": {"type": "string"},
                "endAt": {"type": "string"},
                "envdVersion": {"type": "string"},
                "envdAccessToken": {"type": "string"},
                "cpuCount": {"type": "integer"},
                "memoryMB": {"type": "integer"},
                "diskSizeMB": {"type": "integer"},
                "state": {"type": "string", "enum": ["running"]},
                "metadata": string_map,
                "allowInternetAccess": {"type": "boolean"}
            },
            "required": ["templateID", "sandboxID", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB", "state"]
        },
        "E2bTimeout": {
            "type": "object",
            "description": "timeout (set_timeout, connect) or duration (refreshes), in seconds.",
            "properties": {
                "timeout": {"type": ["integer", "null"], "minimum": 0},
                "duration": {"type": ["integer", "null"], "minimum": 0}
            }
        }
    });
    if let (Some(target), Value::Object(add)) = (doc["paths"].as_object_mut(), paths) {
        target.extend(add);
    }
    if let (Some(target), Value::Object(add)) =
        (doc["components"]["schemas"].as_object_mut(), schemas)
    {
        target.extend(add);
    }
    doc["components"]["securitySchemes"]["e2bApiKey"] = json!({
        "type": "apiKey", "in": "header", "name": "X-API-Key",
        "description": "A key from `airlock token new --e2b` (e2b_ and 64 hex digits); the E2B routes also take it, or any airlock token, as a bearer token."
    });
    doc["tags"] = json!([{
        "name": "e2b",
        "description": "E2B's control plane, for E2B's unmodified SDKs (docs/e2b.md). Errors are E2B's \
            {code, message}. The in-sandbox API is on the same listener but routed by the \
            E2b-Sandbox-Id and E2b-Sandbox-Port headers (or a Host of \
            {port}-{sandboxID}.{domain}), not by path, so it is not a set of operations here: \
            on port 49983, envd's GET /health, GET and POST /files (octet-stream or multipart, \
            gzip) and the Connect RPCs POST /process.Process/{Start,Connect,List,SendSignal,\
            SendInput,CloseStdin,Update,StreamInput} and /filesystem.Filesystem/{Stat,ListDir,\
            MakeDir,Move,Remove} (Connect's application/json for unary calls, \
            application/connect+json envelope streams for Start, Connect and StreamInput; \
            the watch calls answer \"not supported by airlock\"); on port 49999, \
            the code interpreter's POST /execute (an application/x-ndjson stream of stdout, \
            stderr, result, error and number_of_executions lines) and /contexts. Each needs \
            the sandbox's X-Access-Token (its envdAccessToken)."
    }]);
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

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

    /// The routes a router's source declares: `(path, methods)` of every `.route("…", …)`
    /// (axum's `{*path}` as OpenAPI's `{path}`), `/mcp` (a service of its own, documented
    /// in docs/mcp.md) left out.
    fn declared_routes(source: &str) -> BTreeMap<String, BTreeSet<String>> {
        let mut routes = BTreeMap::new();
        let mut rest = source;
        while let Some(at) = rest.find(".route(") {
            rest = &rest[at + ".route(".len()..];
            let Some(open) = rest.find('"') else { break };
            let after = &rest[open + 1..];
            let Some(close) = after.find('"') else { break };
            let path = after[..close].replace("{*", "{");
            // The handlers run to the call's closing parenthesis, nesting counted.
            let mut depth = 1usize;
            let mut end = 0;
            for (i, c) in after[close..].char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            end = close + i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let handlers = &after[close + 1..end];
            // `any(…)` and E2B's `unsupported(…)` (an answer for every method) route them all.
            let every = calls(handlers, "any") || calls(handlers, "unsupported");
            let methods: BTreeSet<String> = ["get", "post", "put", "delete", "patch"]
                .into_iter()
                .filter(|m| every || calls(handlers, m))
                .map(str::to_owned)
                .collect();
            routes
                .entry(path)
                .or_insert_with(BTreeSet::new)
                .extend(methods);
            rest = &after[end..];
        }
        routes
    }

    /// Whether `code` calls the function `name` (`get(…)`, `.get(…)`, not `get_x(…)`).
    fn calls(code: &str, name: &str) -> bool {
        code.match_indices(&format!("{name}(")).any(|(at, _)| {
            !code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    }

    #[test]
    fn routes_are_read_from_a_router_s_source() {
        let routes = declared_routes(
            r#"Router::new().route("/a", post(post_a)).route(
                "/b/{*rest}",
                get(get_b).put(put_b),
            ).route("/c", unsupported("x")).route_service("/mcp", mcp)"#,
        );
        assert_eq!(routes.len(), 3, "{routes:?}");
        assert_eq!(routes["/a"], BTreeSet::from(["post".to_owned()]));
        assert_eq!(
            routes["/b/{rest}"],
            BTreeSet::from(["get".to_owned(), "put".to_owned()])
        );
        assert_eq!(routes["/c"].len(), 5, "an answer for every method");
    }

    /// Issue 29: the OpenAPI paths were a hand-written function nothing tied to the router.
    /// Every route the server's router declares is documented with exactly its methods,
    /// and every documented path is routed (the E2B router's routes may be documented; the
    /// ones it only refuses need not be).
    #[test]
    fn the_document_and_the_router_declare_the_same_routes() {
        let doc = document();
        let documented: BTreeMap<String, BTreeSet<String>> = doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(path, item)| {
                let methods = item
                    .as_object()
                    .unwrap()
                    .keys()
                    .filter(|k| ["get", "post", "put", "delete", "patch"].contains(&k.as_str()))
                    .cloned()
                    .collect();
                (path.clone(), methods)
            })
            .collect();
        let server = declared_routes(include_str!("http.rs"));
        assert!(server.contains_key("/v1/runs"), "{server:?}");
        assert_eq!(server["/v1/sessions/{id}"].len(), 2, "{server:?}");
        for (path, methods) in &server {
            assert_eq!(
                documented.get(path),
                Some(methods),
                "{path} is routed with {methods:?}; the document has {:?}",
                documented.get(path)
            );
        }
        let e2b = declared_routes(include_str!("../../airlock-e2b/src/control.rs"));
        for (path, methods) in &documented {
            let routed = server.get(path).or_else(|| e2b.get(path));
            assert!(
                routed.is_some_and(|r| methods.is_subset(r)),
                "{path} {methods:?} is documented but not routed so"
            );
        }
    }
}
