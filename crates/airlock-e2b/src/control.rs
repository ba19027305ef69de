//! E2B's control plane: `POST /sandboxes` and `/v2/sandboxes` (create), `GET` list and
//! get, `DELETE` (kill), `POST …/timeout`, `…/connect`, `…/refreshes`; what airlock does
//! not have (pause, resume, snapshots, forks, logs, metrics, network updates) answers 501
//! "not supported by airlock: …".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use airlock_core::policy::Policy;
use airlock_engine::sessions::{SessionError, SessionOptions};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use http::{HeaderMap, StatusCode};
use serde::Deserialize;

use crate::registry::{Sandbox, audit};
use crate::wire::{ApiError, json_response};
use crate::{API_KEY_HEADER, E2b, ENVD_VERSION};

/// The `timeout` of a create that gives none (E2B's default, seconds).
pub const DEFAULT_TIMEOUT_S: u64 = 300;
/// The client id shown in sandbox records.
pub const CLIENT_ID: &str = "airlock";

/// The control-plane routes.
pub fn router(e2b: E2b) -> Router {
    let unsupported = |what: &'static str| any(move || async move { ApiError::unsupported(what) });
    Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/pause", unsupported("pausing a sandbox"))
        .route("/sandboxes/{id}/resume", unsupported("resuming a sandbox"))
        .route("/sandboxes/{id}/snapshots", unsupported("snapshots"))
        .route("/sandboxes/{id}/fork", unsupported("forking a sandbox"))
        .route(
            "/sandboxes/{id}/network",
            unsupported("changing a sandbox's network"),
        )
        .route("/sandboxes/{id}/logs", unsupported("sandbox logs"))
        .route("/v2/sandboxes/{id}/logs", unsupported("sandbox logs"))
        .route("/sandboxes/{id}/metrics", unsupported("sandbox metrics"))
        .route("/sandboxes/metrics", unsupported("sandbox metrics"))
        .route("/snapshots", unsupported("snapshots"))
        .route("/volumes", unsupported("volumes"))
        .route(
            "/templates",
            unsupported("building templates (they are named in the policy's [e2b.templates])"),
        )
        .with_state(e2b)
}

/// The caller's tenant from `X-API-Key` (or a bearer token).
fn caller(e2b: &E2b, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let key = headers
        .get(API_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        })
        .map(str::trim);
    e2b.host.tenant(key).map_err(|()| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "a valid API key is required (X-API-Key: the key `airlock token new --e2b` printed)",
        )
    })
}

fn session_tenant(tenant: Option<&str>) -> String {
    tenant.unwrap_or("-").to_owned()
}

/// A session error as E2B's error.
pub fn session_error(e: &SessionError) -> ApiError {
    let status = match e {
        SessionError::Disabled | SessionError::Denied(_) => StatusCode::FORBIDDEN,
        SessionError::TooMany { .. } => StatusCode::TOO_MANY_REQUESTS,
        SessionError::NotFound(_) => StatusCode::NOT_FOUND,
        SessionError::Unsupported(_) | SessionError::Invalid(_) => StatusCode::BAD_REQUEST,
        SessionError::Workspace(_) if e.is_missing_file() => StatusCode::NOT_FOUND,
        SessionError::Workspace(h) => match h.kind() {
            airlock_core::ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
        SessionError::KernelStart(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    ApiError::new(status, e.to_string())
}

#[derive(Debug, Deserialize)]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    #[serde(rename = "envVars")]
    env_vars: Option<BTreeMap<String, String>>,
    metadata: Option<BTreeMap<String, String>>,
    allow_internet_access: Option<bool>,
    network: Option<serde_json::Value>,
    #[serde(rename = "autoPause")]
    auto_pause: Option<bool>,
    #[serde(rename = "autoResume")]
    auto_resume: Option<serde_json::Value>,
    mcp: Option<serde_json::Value>,
    iam: Option<serde_json::Value>,
    #[serde(rename = "volumeMounts")]
    volume_mounts: Option<serde_json::Value>,
}

fn present(value: &Option<serde_json::Value>) -> bool {
    match value {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Array(a)) => !a.is_empty(),
        Some(serde_json::Value::Object(o)) => !o.is_empty(),
        Some(serde_json::Value::Bool(b)) => *b,
        Some(_) => true,
    }
}

/// Refuses what the create asks for that airlock does not do.
/// Create options airlock does not implement are a bad request (400, naming them), not a
/// server error: the same body without them is served.
fn refuse_unsupported(body: &NewSandbox) -> Result<(), ApiError> {
    let refuse = |what: &str| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("not supported by airlock: {what}"),
        )
    };
    if body.auto_pause == Some(true) {
        return Err(refuse("autoPause (a sandbox ends at its timeout)"));
    }
    let auto_resume_on = body
        .auto_resume
        .as_ref()
        .is_some_and(|v| v.get("enabled").and_then(serde_json::Value::as_bool) == Some(true));
    if auto_resume_on {
        return Err(refuse("autoResume"));
    }
    for (what, value) in [
        (
            "the network options (the policy's [network] decides; allow_internet_access=False turns it off)",
            &body.network,
        ),
        ("MCP gateways", &body.mcp),
        ("IAM roles", &body.iam),
        ("volumes", &body.volume_mounts),
    ] {
        if present(value) {
            return Err(refuse(what));
        }
    }
    Ok(())
}

/// Refuses environment variables the policy does not let a request set.
fn check_envs(policy: &Policy, envs: &BTreeMap<String, String>) -> Result<(), ApiError> {
    for name in envs.keys() {
        if !policy.env.allow.iter().any(|a| a == name) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "environment variable {name:?} is not allowed by the policy's [env] allow list ({})",
                    if policy.env.allow.is_empty() {
                        "empty".to_owned()
                    } else {
                        policy.env.allow.join(", ")
                    }
                ),
            ));
        }
    }
    Ok(())
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let text: &[u8] = if body.is_empty() { b"{}" } else { body };
    serde_json::from_slice(text)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("the request body: {e}")))
}

fn rfc3339(time: SystemTime) -> String {
    airlock_core::audit::format_rfc3339_millis(time)
}

/// The record create and connect answer (E2B's `Sandbox`).
fn sandbox_json(sandbox: &Sandbox) -> serde_json::Value {
    serde_json::json!({
        "templateID": sandbox.template,
        "sandboxID": sandbox.id,
        "alias": sandbox.template,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sandbox.access_token,
        "trafficAccessToken": sandbox.traffic_token,
        "domain": null,
    })
}

/// The record get and list answer (E2B's `SandboxDetail` / `ListedSandbox`).
fn detail_json(sandbox: &Sandbox, policy: &Policy, with_token: bool) -> serde_json::Value {
    let mib = 1024 * 1024;
    let mut detail = serde_json::json!({
        "templateID": sandbox.template,
        "sandboxID": sandbox.id,
        "alias": sandbox.template,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339(sandbox.started_at),
        "endAt": rfc3339(sandbox.end_at()),
        "envdVersion": ENVD_VERSION,
        "cpuCount": policy.limits.cpus.millis().div_ceil(1000).max(1),
        "memoryMB": policy.limits.memory.as_u64() / mib,
        "diskSizeMB": policy.sessions.workspace_bytes.as_u64() / mib,
        "state": "running",
        "metadata": sandbox.metadata,
        "allowInternetAccess": sandbox.internet,
    });
    if with_token {
        detail["envdAccessToken"] = serde_json::json!(sandbox.access_token);
    }
    detail
}

async fn create(State(e2b): State<E2b>, headers: HeaderMap, body: Bytes) -> Response {
    match create_sandbox(&e2b, &headers, &body).await {
        Ok(sandbox) => json_response(StatusCode::CREATED, &sandbox_json(&sandbox)),
        Err(e) => e.into_response(),
    }
}

async fn create_sandbox(
    e2b: &E2b,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Arc<Sandbox>, ApiError> {
    let tenant = caller(e2b, headers)?;
    let body: NewSandbox = parse_json(body)?;
    let engine = e2b.host.engine(tenant.as_deref());
    let policy = engine.policy().clone();
    if !policy.e2b.enabled {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the E2B API is disabled by the policy ([e2b] enabled = false)",
        ));
    }
    let template = body
        .template_id
        .clone()
        .unwrap_or_else(|| "base".to_owned());
    if !policy.e2b.templates.contains_key(&template) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "template {template:?} does not exist on this server; its templates are: {}",
                policy.e2b.names()
            ),
        ));
    }
    refuse_unsupported(&body)?;
    let envs = body.env_vars.clone().unwrap_or_default();
    check_envs(&policy, &envs)?;
    let timeout = Duration::from_secs(body.timeout.unwrap_or(DEFAULT_TIMEOUT_S).max(1));
    let sessions = e2b.host.sessions().map_err(|e| session_error(&e))?;
    let session_tenant = session_tenant(tenant.as_deref());
    // The template's engine: its own root and memory when it names them.
    // Its /tmp persists between its commands (and its kernel), as an E2B sandbox's does.
    let info = sessions
        .create_with(
            e2b.host.template_engine(tenant.as_deref(), &template),
            &session_tenant,
            SessionOptions {
                lazy_kernel: false,
                persistent_tmp: true,
            },
        )
        .await
        .map_err(|e| session_error(&e))?;
    let secrets = crate::random_hex(10)
        .and_then(|id| Ok((id, crate::random_hex(32)?, crate::random_hex(32)?)));
    let (id, token, traffic_token) = match secrets {
        Ok(pair) => pair,
        Err(e) => {
            let _ = sessions.delete(&session_tenant, &info.id).await;
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("read /dev/urandom: {e}"),
            ));
        }
    };
    let sandbox = Arc::new(Sandbox::new(
        id,
        tenant,
        session_tenant,
        info.id,
        template,
        token,
        traffic_token,
        body.metadata.unwrap_or_default(),
        envs,
        body.allow_internet_access.unwrap_or(true),
        timeout,
        policy.sessions.ttl,
    ));
    e2b.sandboxes.insert(sandbox.clone());
    audit(
        e2b.host.as_ref(),
        &sandbox,
        serde_json::json!({
            "event": "e2b_sandbox_create",
            "timeout_s": timeout.as_secs(),
            "end_at": rfc3339(sandbox.end_at()),
        }),
    );
    tracing::info!(sandbox = %sandbox.id, session = %sandbox.session_id, "e2b sandbox created");
    Ok(sandbox)
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("sandbox {id:?} not found"))
}

/// The caller's sandbox `id`.
fn owned(e2b: &E2b, headers: &HeaderMap, id: &str) -> Result<Arc<Sandbox>, ApiError> {
    let tenant = caller(e2b, headers)?;
    e2b.sandboxes
        .get_owned(tenant.as_deref(), id)
        .ok_or_else(|| not_found(id))
}

async fn info(State(e2b): State<E2b>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    match owned(&e2b, &headers, &id) {
        Ok(sandbox) => {
            let engine = e2b
                .host
                .template_engine(sandbox.tenant.as_deref(), &sandbox.template);
            json_response(
                StatusCode::OK,
                &detail_json(&sandbox, engine.policy(), true),
            )
        }
        Err(e) => e.into_response(),
    }
}

async fn kill(State(e2b): State<E2b>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    match owned(&e2b, &headers, &id) {
        Ok(sandbox) => {
            e2b.sandboxes
                .kill(e2b.host.as_ref(), &sandbox.id, "kill")
                .await;
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => e.into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct TimeoutBody {
    timeout: Option<u64>,
    duration: Option<u64>,
}

async fn set_timeout(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let result = owned(&e2b, &headers, &id).and_then(|sandbox| {
        let body: TimeoutBody = parse_json(&body)?;
        let seconds = body.timeout.ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "the body needs a \"timeout\" (seconds)",
            )
        })?;
        sandbox.set_timeout(Duration::from_secs(seconds));
        Ok(())
    });
    match result {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn refresh(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let result = owned(&e2b, &headers, &id).and_then(|sandbox| {
        let body: TimeoutBody = parse_json(&body)?;
        if let Some(seconds) = body.duration
            && sandbox.end_after(Duration::from_secs(seconds)) > sandbox.end_at()
        {
            sandbox.set_timeout(Duration::from_secs(seconds));
        }
        Ok(())
    });
    match result {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn connect(
    State(e2b): State<E2b>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let result = owned(&e2b, &headers, &id).and_then(|sandbox| {
        let body: TimeoutBody = parse_json(&body)?;
        // Connecting never shortens a sandbox's life.
        if let Some(seconds) = body.timeout
            && sandbox.end_after(Duration::from_secs(seconds)) > sandbox.end_at()
        {
            sandbox.set_timeout(Duration::from_secs(seconds));
        }
        Ok(sandbox)
    });
    match result {
        Ok(sandbox) => json_response(StatusCode::OK, &sandbox_json(&sandbox)),
        Err(e) => e.into_response(),
    }
}

/// Percent-decodes a query component (`+` is a space).
pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query's pairs, decoded.
fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

async fn list(State(e2b): State<E2b>, headers: HeaderMap, RawQuery(query): RawQuery) -> Response {
    let tenant = match caller(&e2b, &headers) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let pairs = query_pairs(query.as_deref());
    let mut wanted_metadata: Vec<(String, String)> = Vec::new();
    let mut running_wanted = true;
    for (name, value) in &pairs {
        match name.as_str() {
            // `metadata` is itself a query string: key=value&key=value.
            "metadata" => wanted_metadata.extend(query_pairs(Some(value))),
            "state" => {
                running_wanted = value.split(',').any(|s| s.trim() == "running");
            }
            _ => {}
        }
    }
    let listed: Vec<serde_json::Value> = if running_wanted {
        e2b.sandboxes
            .list(tenant.as_deref())
            .iter()
            .filter(|s| {
                wanted_metadata
                    .iter()
                    .all(|(k, v)| s.metadata.get(k) == Some(v))
            })
            .map(|s| {
                let engine = e2b.host.template_engine(tenant.as_deref(), &s.template);
                detail_json(s, engine.policy(), false)
            })
            .collect()
    } else {
        Vec::new()
    };
    json_response(StatusCode::OK, &serde_json::Value::Array(listed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_decode() {
        let pairs = query_pairs(Some("metadata=user%3Dme%26kind%3Dtest&state=running"));
        assert_eq!(pairs[0].1, "user=me&kind=test");
        assert_eq!(
            query_pairs(Some(&pairs[0].1)),
            [
                ("user".to_owned(), "me".to_owned()),
                ("kind".to_owned(), "test".to_owned())
            ]
        );
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("a+b%41"), "a bA");
    }

    #[test]
    fn unsupported_create_options_are_refused() {
        let body: NewSandbox =
            serde_json::from_str(r#"{"templateID":"base","autoPause":true}"#).unwrap();
        assert_eq!(
            refuse_unsupported(&body).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        let body: NewSandbox = serde_json::from_str(
            r#"{"templateID":"base","autoPause":false,"network":null,"volumeMounts":[]}"#,
        )
        .unwrap();
        assert!(refuse_unsupported(&body).is_ok());
    }
}
