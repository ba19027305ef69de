//! The OpenAPI 3.1 document of the HTTP API, generated from the request and response types
//! (JSON Schema 2020-12, which OpenAPI 3.1 uses as is).

use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use crate::api::{ErrorBody, Health, ObservationDoc, OutputChunk, RunRequest};

/// The document.
pub fn document() -> Value {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .into_generator();
    let run_request = generator.subschema_for::<RunRequest>().to_value();
    let observation = generator.subschema_for::<ObservationDoc>().to_value();
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
                /v1/openapi.json needs `Authorization: Bearer <token>`. The MCP tool server \
                (streamable HTTP, same auth) is at /mcp.",
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
                                    "schema": {"type": "string"},
                                    "x-events": {"stdout": chunk.clone(), "stderr": chunk, "observation": observation}
                                }
                            }
                        },
                        "400": error_response("Malformed request (error.kind invalid_input)."),
                        "401": unauthorized,
                        "403": error_response("The request asks for more than the policy allows (policy_denied)."),
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
                    "security": bearer,
                    "responses": {
                        "200": {"description": "Prometheus text exposition.", "content": {"application/openmetrics-text": {"schema": {"type": "string"}}}},
                        "401": error_response("Missing or wrong bearer token.")
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
                    "summary": "The run_code tool in OpenAI function-calling shape",
                    "description": "{\"type\": \"function\", \"function\": {\"name\": \"run_code\", \
                        \"description\", \"parameters\"}}, with the limits of the caller's policy.",
                    "security": bearer,
                    "responses": {
                        "200": {"description": "The tool.", "content": {"application/json": {"schema": {"type": "object"}}}},
                        "401": error_response("Missing or wrong bearer token.")
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

    #[test]
    fn document_is_openapi_3_1_with_resolvable_refs() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for name in [
            "RunRequest",
            "ObservationDoc",
            "ErrorBody",
            "Health",
            "RequestFile",
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
}
