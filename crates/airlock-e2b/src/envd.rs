//! The in-sandbox API: envd's `/health`, `/files` and Connect RPCs (`process.Process/*`,
//! `filesystem.Filesystem/*`), and the code interpreter's `/execute` and `/contexts`, each
//! checked against the sandbox's access token first.

use std::io::Read as _;

use futures_util::StreamExt as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use airlock_core::policy::SessionMode;
use airlock_engine::sessions::{FILE_MAX_BYTES, SessionCall};
use airlock_host::workspace::{WorkspaceEntryKind, WorkspaceStat};
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Deserialize;

use crate::paths::{to_e2b, to_workspace};
use crate::registry::Sandbox;
use crate::wire::{
    ApiError, ConnectCode, RpcError, json_response, multipart_boundary, multipart_files,
};
use crate::{ACCESS_TOKEN_HEADER, E2b, SandboxTarget};

/// The traffic token header the code interpreter's SDK sends.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// How a request's failure is answered: plain HTTP, a unary RPC, or a server stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Http,
    Unary,
    Stream,
}

fn answer_for(path: &str) -> Answer {
    match path {
        "/process.Process/Start"
        | "/process.Process/Connect"
        | "/process.Process/StreamInput"
        | "/filesystem.Filesystem/WatchDir" => Answer::Stream,
        p if p.starts_with("/process.Process/") || p.starts_with("/filesystem.Filesystem/") => {
            Answer::Unary
        }
        _ => Answer::Http,
    }
}

fn fail(answer: Answer, error: ApiError) -> Response {
    match answer {
        Answer::Http => error.into_response(),
        Answer::Unary => RpcError::from(error).unary_response(),
        Answer::Stream => RpcError::from(error).stream_response(),
    }
}

/// The sandbox a request is for, when its token is right: the SDKs read a 502 saying the
/// sandbox "was not found" as a sandbox that is not running.
fn authorized(
    e2b: &E2b,
    target: &SandboxTarget,
    request: &Request,
    traffic_token_too: bool,
) -> Result<Arc<Sandbox>, ApiError> {
    let not_found = || {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("The sandbox {} was not found", target.sandbox_id),
        )
    };
    let sandbox = e2b
        .sandboxes
        .get(&target.sandbox_id)
        .ok_or_else(not_found)?;
    if sandbox.end_at() <= SystemTime::now() {
        return Err(not_found());
    }
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let access = header(ACCESS_TOKEN_HEADER).is_some_and(|t| sandbox.token_matches(t));
    let traffic = traffic_token_too
        && header(TRAFFIC_TOKEN_HEADER).is_some_and(|t| sandbox.traffic_token_matches(t));
    if !(access || traffic) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this sandbox's access token is required (X-Access-Token: the envdAccessToken its create returned)",
        ));
    }
    Ok(sandbox)
}

/// Reads a request body within the server's limit.
pub async fn read_body(e2b: &E2b, request: Request) -> Result<Bytes, ApiError> {
    let limit = e2b.host.max_body_bytes();
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than this server's limit of {limit} bytes \
                 (airlock serve --max-body)"
            ),
        )
    };
    // A declared length past the limit is refused before a byte of the body is read.
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let collect = Limited::new(request.into_body(), limit).collect();
    let Ok(collected) = tokio::time::timeout(e2b.host.body_timeout(), collect).await else {
        return Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time",
        ));
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("reading the request body: {e}"),
        )),
    }
}

/// The caller of a command or a code cell, as telemetry sees it: the request's W3C
/// `traceparent`, `tracestate` and `baggage` headers, and the session the sandbox is.
pub(crate) fn caller_of(request: &Request, sandbox: &Sandbox) -> airlock_telemetry::Caller {
    let mut caller = airlock_telemetry::Caller::from_carrier(|key| {
        request
            .headers()
            .get(key)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    caller.session_id = Some(sandbox.session_id.clone());
    caller
}

/// The attributes every E2B span starts with: the sandbox and its session.
pub(crate) fn span_attributes(sandbox: &Sandbox) -> Vec<airlock_telemetry::KeyValue> {
    vec![
        airlock_telemetry::KeyValue::new("airlock.e2b.sandbox.id", sandbox.id.clone()),
        airlock_telemetry::KeyValue::new("airlock.session.id", sandbox.session_id.clone()),
    ]
}

/// Serves envd's port.
pub async fn serve(e2b: E2b, target: SandboxTarget, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let answer = answer_for(&path);
    let sandbox = match authorized(&e2b, &target, &request, false) {
        Ok(s) => s,
        Err(e) => return fail(answer, e),
    };
    let method = request.method().clone();
    match (method, path.as_str()) {
        (Method::GET, "/health") => StatusCode::NO_CONTENT.into_response(),
        (Method::GET, "/files") => {
            let query = request.uri().query().map(str::to_owned);
            read_file(&e2b, &sandbox, query.as_deref()).unwrap_or_else(|e| e.into_response())
        }
        (Method::POST, "/files") => write_files(&e2b, &sandbox, request)
            .await
            .unwrap_or_else(|e| e.into_response()),
        (Method::POST, "/process.Process/Start") => {
            crate::process::start(e2b, sandbox, request).await
        }
        (Method::POST, "/process.Process/SendSignal") => {
            unary(&e2b, request, |body| {
                crate::process::send_signal(&sandbox, body)
            })
            .await
        }
        (Method::POST, "/process.Process/List") => {
            unary(&e2b, request, |_| Ok(crate::process::list(&sandbox))).await
        }
        (Method::POST, "/process.Process/Connect") => {
            RpcError::unsupported("reattaching to a running command (process.Connect)")
                .stream_response()
        }
        (Method::POST, "/process.Process/StreamInput") => {
            RpcError::unsupported("stdin to a command").stream_response()
        }
        (Method::POST, "/process.Process/SendInput" | "/process.Process/CloseStdin") => {
            RpcError::unsupported("stdin to a command").unary_response()
        }
        (Method::POST, "/process.Process/Update") => {
            RpcError::unsupported("PTY (terminals)").unary_response()
        }
        (Method::POST, "/filesystem.Filesystem/Stat") => {
            unary(&e2b, request, |body| stat(&e2b, &sandbox, body)).await
        }
        (Method::POST, "/filesystem.Filesystem/ListDir") => {
            unary(&e2b, request, |body| list_dir(&e2b, &sandbox, body)).await
        }
        (Method::POST, "/filesystem.Filesystem/MakeDir") => {
            unary(&e2b, request, |body| make_dir(&e2b, &sandbox, body)).await
        }
        (Method::POST, "/filesystem.Filesystem/Move") => {
            unary(&e2b, request, |body| move_entry(&e2b, &sandbox, body)).await
        }
        (Method::POST, "/filesystem.Filesystem/Remove") => {
            unary(&e2b, request, |body| remove(&e2b, &sandbox, body)).await
        }
        (Method::POST, "/filesystem.Filesystem/WatchDir") => {
            RpcError::unsupported("watching a directory").stream_response()
        }
        (
            Method::POST,
            "/filesystem.Filesystem/CreateWatcher"
            | "/filesystem.Filesystem/GetWatcherEvents"
            | "/filesystem.Filesystem/RemoveWatcher",
        ) => RpcError::unsupported("watching a directory").unary_response(),
        (_, path) => fail(
            answer,
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no such envd route {path:?} (not supported by airlock)"),
            ),
        ),
    }
}

/// A unary RPC: JSON in, JSON out, errors in Connect's unary shape.
async fn unary(
    e2b: &E2b,
    request: Request,
    handle: impl FnOnce(serde_json::Value) -> Result<serde_json::Value, RpcError>,
) -> Response {
    let content_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if !content_type.starts_with("application/json") {
        return RpcError::new(
            ConnectCode::InvalidArgument,
            format!("content type {content_type:?}: airlock answers Connect's JSON codec (application/json) only"),
        )
        .unary_response();
    }
    let body = match read_body(e2b, request).await {
        Ok(b) => b,
        Err(e) => return RpcError::from(e).unary_response(),
    };
    let value: serde_json::Value = if body.is_empty() {
        serde_json::json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return RpcError::new(ConnectCode::InvalidArgument, format!("the message: {e}"))
                    .unary_response();
            }
        }
    };
    match handle(value) {
        Ok(answer) => json_response(StatusCode::OK, &answer),
        Err(e) => e.unary_response(),
    }
}

fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| crate::control::percent_decode(v))
    })
}

fn read_file(e2b: &E2b, sandbox: &Sandbox, query: Option<&str>) -> Result<Response, ApiError> {
    let path = query_param(query, "path")
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "the query needs a path"))?;
    let rel = to_workspace(&path)?;
    if rel.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("path {path:?} is a directory"),
        ));
    }
    let sessions = session_manager(e2b)?;
    let content = sessions
        .read_file(&sandbox.session_tenant, &sandbox.session_id, &rel)
        .map_err(|e| {
            if e.is_missing_file() {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("path {path:?} does not exist (or is not a regular file)"),
                )
            } else {
                crate::control::session_error(&e)
            }
        })?;
    // Scanned as a released /out file is (the sessions files route does the same): text
    // comes back with its secrets replaced, a binary with one in it is withheld.
    let engine = e2b.host.engine(sandbox.tenant.as_deref());
    let read = content.len() as u64;
    // Audited as the sessions route's reads are (same event), with the API that asked.
    let shown_path = engine
        .shown_workspace_name(&rel)
        .map(|(shown, _)| shown)
        .unwrap_or_default();
    let audit = |redactions: u64, withheld: Option<&str>| {
        engine.audit_workspace_access(
            &sandbox.session_id,
            &sandbox.session_tenant,
            serde_json::json!({
                "event": "session_file_read",
                "api": "e2b",
                "path": shown_path,
                "bytes": read,
                "redactions": redactions,
                "withheld": withheld,
            }),
        );
    };
    let content = match engine.release_workspace_file(&rel, content) {
        airlock_core::observation::WorkspaceFileRelease::Released {
            content,
            redactions,
        } => {
            audit(redactions, None);
            content
        }
        airlock_core::observation::WorkspaceFileRelease::Withheld { reason, secrets } => {
            audit(secrets, Some(&reason));
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("path {shown_path:?} is withheld: {reason}"),
            ));
        }
    };
    let mut response = (StatusCode::OK, content).into_response();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

/// Inflates a gzip body, at most [`FILE_MAX_BYTES`].
fn gunzip(body: &[u8]) -> Result<Bytes, ApiError> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(FILE_MAX_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("gzip body: {e}")))?;
    if out.len() as u64 > FILE_MAX_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the file inflates to more than the cap of {FILE_MAX_BYTES} bytes a file may have"
            ),
        ));
    }
    Ok(out.into())
}

async fn write_files(e2b: &E2b, sandbox: &Sandbox, request: Request) -> Result<Response, ApiError> {
    let query = request.uri().query().map(str::to_owned);
    let (content_type, encoding) = {
        let header = |name| {
            request
                .headers()
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
                .map(str::to_owned)
        };
        (
            header(CONTENT_TYPE).unwrap_or_default(),
            header(CONTENT_ENCODING),
        )
    };
    let body = read_body(e2b, request).await?;
    let body = match encoding.as_deref().map(str::trim) {
        None | Some("identity") => body,
        Some("gzip") => gunzip(&body)?,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("Content-Encoding {other:?}: gzip only"),
            ));
        }
    };
    let query_path = query_param(query.as_deref(), "path");
    let files: Vec<(String, Bytes)> = if let Some(boundary) = multipart_boundary(&content_type) {
        let parts = multipart_files(&body, &boundary)?;
        let single = parts.len() == 1;
        parts
            .into_iter()
            .map(|part| {
                let path = if single {
                    query_path.clone().or(part.filename)
                } else {
                    part.filename
                };
                path.map(|p| (p, part.content)).ok_or_else(|| {
                    ApiError::new(StatusCode::BAD_REQUEST, "a file part has no path")
                })
            })
            .collect::<Result<_, _>>()?
    } else {
        let path = query_path
            .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "the query needs a path"))?;
        vec![(path, body)]
    };
    let sessions = session_manager(e2b)?;
    let mut written = Vec::new();
    for (path, content) in files {
        let rel = to_workspace(&path)?;
        sessions
            .write_file(&sandbox.session_tenant, &sandbox.session_id, &rel, &content)
            .map_err(|e| {
                let message = e.to_string();
                if message.contains("is full") {
                    ApiError::new(StatusCode::INSUFFICIENT_STORAGE, message)
                } else {
                    crate::control::session_error(&e)
                }
            })?;
        let name = rel.rsplit('/').next().unwrap_or(&rel).to_owned();
        written.push(serde_json::json!({"path": to_e2b(&rel), "name": name, "type": "file"}));
    }
    Ok(json_response(
        StatusCode::OK,
        &serde_json::Value::Array(written),
    ))
}

/// A string field of an RPC message.
fn field<'a>(body: &'a serde_json::Value, name: &str) -> Result<&'a str, RpcError> {
    body.get(name)
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| {
            RpcError::new(
                ConnectCode::InvalidArgument,
                format!("the message needs {name:?}"),
            )
        })
}

fn rel_path(path: &str) -> Result<String, RpcError> {
    to_workspace(path).map_err(RpcError::from)
}

fn workspace_error(e: airlock_engine::sessions::SessionError, path: &str) -> RpcError {
    if e.is_missing_file() {
        return RpcError::new(
            ConnectCode::NotFound,
            format!("path {path:?} does not exist"),
        );
    }
    RpcError::from(crate::control::session_error(&e))
}

fn with_workspace<T>(
    e2b: &E2b,
    sandbox: &Sandbox,
    path: &str,
    f: impl FnOnce(&airlock_host::workspace::Workspace) -> Result<T, airlock_host::HostError>,
) -> Result<T, RpcError> {
    let sessions = e2b
        .host
        .sessions()
        .map_err(|e| RpcError::from(crate::control::session_error(&e)))?;
    sessions
        .with_workspace(&sandbox.session_tenant, &sandbox.session_id, f)
        .map_err(|e| workspace_error(e, path))
}

fn permissions(kind: WorkspaceEntryKind, mode: u32) -> String {
    let first = match kind {
        WorkspaceEntryKind::Directory => 'd',
        WorkspaceEntryKind::Symlink => 'l',
        _ => '-',
    };
    let mut text = String::from(first);
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

/// E2B's `EntryInfo` of a workspace entry (protobuf JSON: int64 as a string, enums by
/// name, timestamps in RFC 3339).
fn entry_info(stat: &WorkspaceStat) -> serde_json::Value {
    let kind = match stat.kind {
        WorkspaceEntryKind::Directory => "FILE_TYPE_DIRECTORY",
        WorkspaceEntryKind::Symlink => "FILE_TYPE_SYMLINK",
        WorkspaceEntryKind::File | WorkspaceEntryKind::Other => "FILE_TYPE_FILE",
    };
    let name = stat.path.rsplit('/').next().unwrap_or(&stat.path);
    let modified = UNIX_EPOCH + Duration::from_secs(u64::try_from(stat.modified_s).unwrap_or(0));
    let mut info = serde_json::json!({
        "name": if stat.path.is_empty() { "user" } else { name },
        "type": kind,
        "path": to_e2b(&stat.path),
        "size": stat.bytes.to_string(),
        "mode": stat.mode,
        "permissions": permissions(stat.kind, stat.mode),
        "owner": "user",
        "group": "user",
        "modifiedTime": airlock_core::audit::format_rfc3339_millis(modified),
    });
    if let Some(target) = &stat.link_target {
        info["symlinkTarget"] = serde_json::json!(target);
    }
    info
}

fn stat_of(
    e2b: &E2b,
    sandbox: &Sandbox,
    path: &str,
    rel: &str,
) -> Result<serde_json::Value, RpcError> {
    let rel_owned = rel.to_owned();
    let found = with_workspace(e2b, sandbox, path, move |ws| ws.stat(&rel_owned))?;
    let Some(found) = found else {
        return Err(RpcError::new(
            ConnectCode::NotFound,
            format!("path {path:?} does not exist"),
        ));
    };
    let mut shown = Shown::new(e2b, sandbox);
    let entry = shown.entry(found)?;
    shown.audit();
    Ok(entry)
}

/// Entries of a workspace as the E2B filesystem service shows them: every name (and a
/// link's target) escaped and redacted as `/out`'s are, the secrets replaced counted and,
/// when there were any, audited as the sessions route's listings are.
struct Shown<'a> {
    engine: Arc<airlock_engine::Engine>,
    sandbox: &'a Sandbox,
    redactions: u64,
}

impl<'a> Shown<'a> {
    fn new(e2b: &E2b, sandbox: &'a Sandbox) -> Self {
        Self {
            engine: e2b.host.engine(sandbox.tenant.as_deref()),
            sandbox,
            redactions: 0,
        }
    }

    fn name(&mut self, name: &str) -> Result<String, RpcError> {
        let Some((shown, secrets)) = self.engine.shown_workspace_name(name) else {
            return Err(RpcError::new(
                ConnectCode::Unavailable,
                "the entry cannot be shown: the redaction rules could not be built",
            ));
        };
        self.redactions += secrets;
        Ok(shown)
    }

    fn entry(&mut self, stat: WorkspaceStat) -> Result<serde_json::Value, RpcError> {
        let path = self.name(&stat.path)?;
        let link_target = match &stat.link_target {
            Some(target) => Some(self.name(target)?),
            None => None,
        };
        Ok(entry_info(&WorkspaceStat {
            path,
            link_target,
            ..stat
        }))
    }

    fn audit(&self) {
        if self.redactions > 0 {
            self.engine.audit_workspace_access(
                &self.sandbox.session_id,
                &self.sandbox.session_tenant,
                serde_json::json!({
                    "event": "session_files_listed",
                    "api": "e2b",
                    "redactions": self.redactions,
                }),
            );
        }
    }
}

fn stat(
    e2b: &E2b,
    sandbox: &Sandbox,
    body: serde_json::Value,
) -> Result<serde_json::Value, RpcError> {
    let path = field(&body, "path")?;
    let rel = rel_path(path)?;
    Ok(serde_json::json!({"entry": stat_of(e2b, sandbox, path, &rel)?}))
}

fn list_dir(
    e2b: &E2b,
    sandbox: &Sandbox,
    body: serde_json::Value,
) -> Result<serde_json::Value, RpcError> {
    let path = field(&body, "path")?;
    let depth = body
        .get("depth")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(1)
        .max(1) as usize;
    let rel = rel_path(path)?;
    let max = FILE_LIST_MAX;
    let listed = with_workspace(e2b, sandbox, path, {
        let rel = rel.clone();
        move |ws| ws.list_dir(&rel, depth, max)
    })?;
    let Some(entries) = listed else {
        return Err(RpcError::new(
            ConnectCode::NotFound,
            format!("path {path:?} is not a directory"),
        ));
    };
    // Names are shown as a session's listing shows them: airlock's own reserved names
    // hidden, every name escaped and redacted as `/out`'s are (a file named after a key
    // lists as `[REDACTED:…]`); without a redactor nothing is listed.
    let mut shown = Shown::new(e2b, sandbox);
    let mut listed = Vec::with_capacity(entries.len());
    for entry in entries
        .into_iter()
        .filter(|e| !e.path.starts_with(".airlock"))
    {
        listed.push(shown.entry(entry)?);
    }
    shown.audit();
    Ok(serde_json::json!({"entries": listed}))
}

/// Most entries one ListDir returns.
pub const FILE_LIST_MAX: usize = 10_000;

fn make_dir(
    e2b: &E2b,
    sandbox: &Sandbox,
    body: serde_json::Value,
) -> Result<serde_json::Value, RpcError> {
    let path = field(&body, "path")?;
    let rel = rel_path(path)?;
    // The workspace itself always exists.
    let created = !rel.is_empty()
        && with_workspace(e2b, sandbox, path, {
            let rel = rel.clone();
            move |ws| ws.make_dir(&rel)
        })?;
    if !created {
        return Err(RpcError::new(
            ConnectCode::AlreadyExists,
            format!("directory {path:?} already exists"),
        ));
    }
    Ok(serde_json::json!({"entry": stat_of(e2b, sandbox, path, &rel)?}))
}

fn move_entry(
    e2b: &E2b,
    sandbox: &Sandbox,
    body: serde_json::Value,
) -> Result<serde_json::Value, RpcError> {
    let source = field(&body, "source")?;
    let destination = field(&body, "destination")?;
    let from = rel_path(source)?;
    let to = rel_path(destination)?;
    if from.is_empty() || to.is_empty() {
        return Err(RpcError::new(
            ConnectCode::InvalidArgument,
            "the workspace itself cannot be moved",
        ));
    }
    with_workspace(e2b, sandbox, source, {
        let (from, to) = (from.clone(), to.clone());
        move |ws| ws.rename(&from, &to)
    })?;
    Ok(serde_json::json!({"entry": stat_of(e2b, sandbox, destination, &to)?}))
}

fn remove(
    e2b: &E2b,
    sandbox: &Sandbox,
    body: serde_json::Value,
) -> Result<serde_json::Value, RpcError> {
    let path = field(&body, "path")?;
    let rel = rel_path(path)?;
    if rel.is_empty() {
        return Err(RpcError::new(
            ConnectCode::InvalidArgument,
            "the workspace itself cannot be removed",
        ));
    }
    let existing = with_workspace(e2b, sandbox, path, {
        let rel = rel.clone();
        move |ws| ws.stat(&rel)
    })?;
    let Some(existing) = existing else {
        return Err(RpcError::new(
            ConnectCode::NotFound,
            format!("path {path:?} does not exist"),
        ));
    };
    with_workspace(e2b, sandbox, path, move |ws| {
        if existing.kind == WorkspaceEntryKind::Directory {
            ws.remove_dir_all(&rel)
        } else {
            ws.remove_file(&rel)
        }
    })?;
    Ok(serde_json::json!({}))
}

/// Serves the code interpreter's port: `/execute` and `/contexts` on the session's
/// kernel, each context a set of globals and a working directory of its own.
pub async fn serve_code_interpreter(e2b: E2b, target: SandboxTarget, request: Request) -> Response {
    let sandbox = match authorized(&e2b, &target, &request, true) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    let engine = e2b.host.engine(sandbox.tenant.as_deref());
    let has_kernel = engine
        .policy()
        .e2b
        .templates
        .get(&sandbox.template)
        .is_some_and(|t| t.kernel)
        && engine.policy().sessions.mode == SessionMode::Kernel;
    if !has_kernel {
        return ApiError::unsupported(&format!(
            "the code interpreter in this sandbox: its template {:?} has no kernel here (a template with kernel = true, and the policy's [sessions] mode = \"kernel\")",
            sandbox.template
        ))
        .into_response();
    }
    match (method, path.as_str()) {
        (Method::GET, "/health") => StatusCode::NO_CONTENT.into_response(),
        (Method::POST, "/execute") => execute(&e2b, &sandbox, request)
            .await
            .unwrap_or_else(|e| e.into_response()),
        (Method::GET, "/contexts") => contexts(&e2b, &sandbox, ContextOrder::List)
            .await
            .unwrap_or_else(|e| e.into_response()),
        (Method::POST, "/contexts") => match read_body(&e2b, request).await.and_then(|body| {
            serde_json::from_slice::<NewContext>(if body.is_empty() { b"{}" } else { &body })
                .map_err(|e| {
                    ApiError::new(StatusCode::BAD_REQUEST, format!("the request body: {e}"))
                })
        }) {
            Ok(new) => contexts(&e2b, &sandbox, ContextOrder::Create(new))
                .await
                .unwrap_or_else(|e| e.into_response()),
            Err(e) => e.into_response(),
        },
        (Method::POST, p) if p.starts_with("/contexts/") && p.ends_with("/restart") => {
            let id = p["/contexts/".len()..p.len() - "/restart".len()].to_owned();
            contexts(&e2b, &sandbox, ContextOrder::Restart(id))
                .await
                .unwrap_or_else(|e| e.into_response())
        }
        (Method::DELETE, p) if p.starts_with("/contexts/") => {
            let id = p["/contexts/".len()..].to_owned();
            contexts(&e2b, &sandbox, ContextOrder::Remove(id))
                .await
                .unwrap_or_else(|e| e.into_response())
        }
        (_, p) => ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no such code interpreter route {p:?}"),
        )
        .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct ExecuteRequest {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<std::collections::BTreeMap<String, String>>,
}

fn ndjson_line(value: serde_json::Value) -> String {
    format!("{value}\n")
}

/// The sessions the E2B sandboxes are, or E2B's answer when the server keeps none.
fn session_manager(
    e2b: &E2b,
) -> Result<std::sync::Arc<airlock_engine::sessions::SessionManager>, ApiError> {
    e2b.host
        .sessions()
        .map_err(|e| crate::control::session_error(&e))
}

/// `POST /contexts` body.
#[derive(Debug, Default, Deserialize)]
struct NewContext {
    language: Option<String>,
    cwd: Option<String>,
}

/// What a client asks of the code contexts.
enum ContextOrder {
    List,
    Create(NewContext),
    Restart(String),
    Remove(String),
}

/// A context as E2B's SDKs read it: its cwd in E2B's terms (`/home/user/...`).
fn context_json(context: &airlock_engine::sessions::KernelContext) -> serde_json::Value {
    let rel = context
        .cwd
        .strip_prefix(crate::paths::WORK)
        .unwrap_or("")
        .trim_start_matches('/');
    serde_json::json!({
        "id": context.id,
        "language": context.language,
        "cwd": crate::paths::to_e2b(rel),
    })
}

async fn contexts(e2b: &E2b, sandbox: &Sandbox, order: ContextOrder) -> Result<Response, ApiError> {
    let sessions = session_manager(e2b)?;
    let (tenant, id) = (&sandbox.session_tenant, &sandbox.session_id);
    let failed = |e: airlock_engine::sessions::SessionError| crate::control::session_error(&e);
    Ok(match order {
        ContextOrder::List => {
            let all = sessions.list_contexts(tenant, id).await.map_err(failed)?;
            json_response(
                StatusCode::OK,
                &serde_json::Value::Array(all.iter().map(context_json).collect()),
            )
        }
        ContextOrder::Create(new) => {
            let cwd = match new.cwd.as_deref() {
                Some(cwd) => {
                    let rel = crate::paths::to_workspace(cwd)?;
                    Some(if rel.is_empty() {
                        crate::paths::WORK.to_owned()
                    } else {
                        format!("{}/{rel}", crate::paths::WORK)
                    })
                }
                None => None,
            };
            let made = sessions
                .create_context(tenant, id, cwd.as_deref(), new.language.as_deref())
                .await
                .map_err(failed)?;
            json_response(StatusCode::OK, &context_json(&made))
        }
        ContextOrder::Restart(context) => {
            sessions
                .restart_context(tenant, id, &context)
                .await
                .map_err(failed)?;
            StatusCode::NO_CONTENT.into_response()
        }
        ContextOrder::Remove(context) => {
            sessions
                .remove_context(tenant, id, &context)
                .await
                .map_err(failed)?;
            StatusCode::NO_CONTENT.into_response()
        }
    })
}

/// Most NDJSON lines of one execution waiting for a slow client; past it, output lines are
/// dropped (as a streamed job's are) while the results and the end still arrive.
const EXECUTE_BUFFER_LINES: usize = 256;

/// `POST /execute`: the cell runs on the session's kernel in its context; stdout and
/// stderr stream as NDJSON lines as the code writes them, then its results (`display()`
/// outputs, figures, the main result), an error with its traceback, the execution count
/// and the end.
async fn execute(e2b: &E2b, sandbox: &Sandbox, request: Request) -> Result<Response, ApiError> {
    // The cell is an `e2b run_code` span in the trace of the request's `traceparent`
    // (docs/telemetry.md), the session's call its child; never the cell's code.
    let caller = caller_of(&request, sandbox);
    let operation =
        airlock_telemetry::Operation::start("e2b run_code", &caller, span_attributes(sandbox));
    match start_execution(e2b, sandbox, request, &operation).await {
        Ok((call, stream)) => {
            let caller = operation.child_caller(caller);
            tokio::spawn(airlock_telemetry::with_caller(
                caller,
                finish_execution(call, operation),
            ));
            Ok(stream)
        }
        Err(e) => {
            operation.fail(&format!("http_{}", e.status.as_u16()));
            operation.end();
            Err(e)
        }
    }
}

/// A started execution: the session call still to run, with what it sends its lines to.
struct Execution {
    sessions: std::sync::Arc<airlock_engine::sessions::SessionManager>,
    tenant: String,
    id: String,
    call: SessionCall,
    sink: airlock_engine::sessions::SessionSink,
    lines_tx: tokio::sync::mpsc::Sender<String>,
}

/// Checks an `/execute` request and answers with the stream its lines will go to.
async fn start_execution(
    e2b: &E2b,
    sandbox: &Sandbox,
    request: Request,
    operation: &airlock_telemetry::Operation,
) -> Result<(Execution, Response), ApiError> {
    let body = read_body(e2b, request).await?;
    let order: ExecuteRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("the request body: {e}")))?;
    if let Some(language) = order.language.as_deref().filter(|l| *l != "python") {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("language {language:?}: this sandbox's kernel runs python only"),
        ));
    }
    let sessions = session_manager(e2b)?;
    // A sandbox that is gone, or a context that does not exist, is an HTTP error before
    // the stream starts, as E2B answers.
    let known = sessions
        .list_contexts(&sandbox.session_tenant, &sandbox.session_id)
        .await
        .map_err(|e| crate::control::session_error(&e))?;
    if let Some(context) = order.context_id.as_deref() {
        operation.set(airlock_telemetry::KeyValue::new(
            "airlock.e2b.context.id",
            context.to_owned(),
        ));
    }
    if let Some(context) = order.context_id.as_deref()
        && !known.iter().any(|c| c.id == context)
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("context {context:?} does not exist in this sandbox"),
        ));
    }
    let call = SessionCall {
        code: order.code,
        html: true,
        context: order.context_id,
        env: order.env_vars.unwrap_or_default(),
        ..Default::default()
    };
    let (lines_tx, lines_rx) = tokio::sync::mpsc::channel::<String>(EXECUTE_BUFFER_LINES);
    let output_tx = lines_tx.clone();
    let sink: airlock_engine::sessions::SessionSink = std::sync::Arc::new(move |event| {
        use airlock_engine::sessions::SessionEvent;
        let line = match event {
            SessionEvent::Output(output) => {
                let kind = match output.stream {
                    airlock_core::StreamKind::Stdout => "stdout",
                    airlock_core::StreamKind::Stderr => "stderr",
                };
                let now = airlock_core::audit::format_rfc3339_millis(SystemTime::now());
                ndjson_line(
                    serde_json::json!({"type": kind, "text": output.text, "timestamp": now}),
                )
            }
            SessionEvent::Result(result) => {
                let mut value = serde_json::to_value(&*result).unwrap_or_default();
                value["type"] = serde_json::json!("result");
                ndjson_line(value)
            }
        };
        // A client that does not keep up loses lines, never stalls the kernel.
        let _ = output_tx.try_send(line);
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(lines_rx)
        .map(|line| Ok::<Bytes, std::convert::Infallible>(Bytes::from(line)));
    let mut response = (StatusCode::OK, Body::from_stream(stream)).into_response();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    let execution = Execution {
        sessions,
        tenant: sandbox.session_tenant.clone(),
        id: sandbox.session_id.clone(),
        call,
        sink,
        lines_tx,
    };
    Ok((execution, response))
}

/// Runs the cell of a started execution and ends its stream: the error, the execution
/// count and the end.
async fn finish_execution(execution: Execution, operation: airlock_telemetry::Operation) {
    let Execution {
        sessions,
        tenant,
        id,
        call,
        sink,
        lines_tx,
    } = execution;
    let mut tail = String::new();
    match sessions.run_streaming(&tenant, &id, call, Some(sink)).await {
        Ok(result) => {
            operation.record_job(&result.observation);
            if let Some(count) = result.execution_count {
                operation.set(airlock_telemetry::KeyValue::new(
                    "airlock.e2b.execution_count",
                    i64::try_from(count).unwrap_or(i64::MAX),
                ));
            }
            if let Some(error) = &result.error {
                // The cell's own exception: the call worked, the code raised.
                operation.set(airlock_telemetry::KeyValue::new(
                    "airlock.e2b.cell_error",
                    true,
                ));
                tail.push_str(&ndjson_line(serde_json::json!({
                    "type": "error", "name": error.name, "value": error.value,
                    "traceback": error.traceback,
                })));
            } else if result.observation.outcome == airlock_core::Outcome::Timeout {
                tail.push_str(&ndjson_line(serde_json::json!({
                    "type": "error", "name": "TimeoutError",
                    "value": "the call passed its wall time and was interrupted",
                    "traceback": "",
                })));
            }
            tail.push_str(&ndjson_line(serde_json::json!({
                "type": "number_of_executions",
                "execution_count": result.execution_count.unwrap_or(result.call),
            })));
        }
        Err(e) => {
            operation.fail(&e.kind().to_string());
            tail.push_str(&ndjson_line(serde_json::json!({
                "type": "error", "name": "SandboxError", "value": e.to_string(), "traceback": "",
            })));
        }
    }
    tail.push_str(&ndjson_line(
        serde_json::json!({"type": "end_of_execution"}),
    ));
    operation.end();
    // The end waits for room: it is what the client's call returns on.
    let _ = lines_tx.send(tail).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_info_has_protobuf_json_shape() {
        let stat = WorkspaceStat {
            path: "a/b.txt".into(),
            kind: WorkspaceEntryKind::File,
            bytes: 3,
            mode: 0o644,
            modified_s: 0,
            link_target: None,
        };
        let info = entry_info(&stat);
        assert_eq!(info["name"], "b.txt");
        assert_eq!(info["type"], "FILE_TYPE_FILE");
        assert_eq!(info["path"], "/home/user/a/b.txt");
        assert_eq!(info["size"], "3");
        assert_eq!(info["permissions"], "-rw-r--r--");
        assert_eq!(answer_for("/process.Process/Start"), Answer::Stream);
        assert_eq!(answer_for("/filesystem.Filesystem/Stat"), Answer::Unary);
        assert_eq!(answer_for("/files"), Answer::Http);
    }
}
