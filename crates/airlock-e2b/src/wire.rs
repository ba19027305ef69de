//! E2B's wire shapes that are not one route's: the control plane's error body, Connect's
//! error codes and envelope framing (connectrpc.com/docs/protocol: a server stream's
//! messages are each `flags(1) length(4, big-endian) payload`; the last has flag `0x02` and
//! carries the end of the stream, an error or nothing), and a multipart reader for
//! `/files` uploads.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::{HeaderValue, StatusCode};

/// Flag of the envelope that ends a Connect stream.
pub const END_STREAM_FLAG: u8 = 0x02;
/// Flag of a compressed envelope (never sent, refused when received).
pub const COMPRESSED_FLAG: u8 = 0x01;
/// Content type of a Connect stream with the JSON codec.
pub const CONNECT_JSON_STREAM: &str = "application/connect+json";

/// An error of the control plane (`/sandboxes`) or the envd HTTP API (`/files`,
/// `/health`) in E2B's shape: `{code, message}` with the HTTP status as the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status (the SDKs map 400, 401, 404, 429, 502, 507 to their exceptions).
    pub status: StatusCode,
    /// What went wrong, for a human.
    pub message: String,
}

impl ApiError {
    /// An error with this status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// What airlock does not implement, said so (501).
    pub fn unsupported(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("not supported by airlock: {what}"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        json_response(self.status, &body)
    }
}

/// A JSON response.
pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    let mut response = (status, value.to_string()).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Connect's error codes (the subset airlock answers with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectCode {
    /// The request is malformed or names something it may not.
    InvalidArgument,
    /// No such thing.
    NotFound,
    /// It exists already.
    AlreadyExists,
    /// No valid access token.
    Unauthenticated,
    /// A cap was reached.
    ResourceExhausted,
    /// Not implemented by airlock.
    Unimplemented,
    /// The sandbox is gone (the SDKs look for "was not found" in the message).
    Unavailable,
    /// The deadline passed.
    DeadlineExceeded,
    /// A failure of airlock's own.
    Internal,
}

impl ConnectCode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectCode::InvalidArgument => "invalid_argument",
            ConnectCode::NotFound => "not_found",
            ConnectCode::AlreadyExists => "already_exists",
            ConnectCode::Unauthenticated => "unauthenticated",
            ConnectCode::ResourceExhausted => "resource_exhausted",
            ConnectCode::Unimplemented => "unimplemented",
            ConnectCode::Unavailable => "unavailable",
            ConnectCode::DeadlineExceeded => "deadline_exceeded",
            ConnectCode::Internal => "internal",
        }
    }

    /// The HTTP status of a unary error with this code (the protocol's table).
    pub fn status(self) -> StatusCode {
        match self {
            ConnectCode::InvalidArgument => StatusCode::BAD_REQUEST,
            ConnectCode::NotFound => StatusCode::NOT_FOUND,
            ConnectCode::AlreadyExists => StatusCode::CONFLICT,
            ConnectCode::Unauthenticated => StatusCode::UNAUTHORIZED,
            ConnectCode::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            ConnectCode::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            ConnectCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ConnectCode::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            ConnectCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An error of a Connect RPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    /// Its code.
    pub code: ConnectCode,
    /// What went wrong, for a human.
    pub message: String,
}

impl RpcError {
    /// An error with this code and message.
    pub fn new(code: ConnectCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// What airlock does not implement, said so.
    pub fn unsupported(what: &str) -> Self {
        Self::new(
            ConnectCode::Unimplemented,
            format!("not supported by airlock: {what}"),
        )
    }

    /// The JSON of the error.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }

    /// The error as a unary RPC's answer.
    pub fn unary_response(&self) -> Response {
        json_response(self.code.status(), &self.to_json())
    }

    /// The error as a whole server-stream answer: status 200, one end-of-stream envelope
    /// carrying it (how Connect ends a stream with an error).
    pub fn stream_response(&self) -> Response {
        let end = serde_json::json!({"error": self.to_json()});
        stream_response(Body::from(envelope(
            END_STREAM_FLAG,
            end.to_string().as_bytes(),
        )))
    }
}

impl From<ApiError> for RpcError {
    fn from(e: ApiError) -> Self {
        let code = match e.status.as_u16() {
            400 => ConnectCode::InvalidArgument,
            401 => ConnectCode::Unauthenticated,
            404 => ConnectCode::NotFound,
            429 | 507 => ConnectCode::ResourceExhausted,
            501 => ConnectCode::Unimplemented,
            502 | 503 => ConnectCode::Unavailable,
            _ => ConnectCode::Internal,
        };
        RpcError::new(code, e.message)
    }
}

/// A streamed answer's head: 200 with Connect's stream content type.
pub fn stream_response(body: Body) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(CONNECT_JSON_STREAM));
    response
}

/// One envelope: flags, the payload's length (big-endian u32), the payload.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    out.put_slice(payload);
    out.freeze()
}

/// The single message of a server-stream request's body: exactly one uncompressed
/// envelope, nothing after it.
pub fn single_message(body: &[u8]) -> Result<&[u8], RpcError> {
    let invalid = |why: &str| RpcError::new(ConnectCode::InvalidArgument, why.to_owned());
    let Some((head, rest)) = body.split_first_chunk::<5>() else {
        return Err(invalid(
            "the request is not a Connect envelope (under 5 bytes)",
        ));
    };
    let flags = head[0];
    let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if flags & COMPRESSED_FLAG != 0 {
        return Err(RpcError::unsupported("compressed Connect messages"));
    }
    if flags != 0 {
        return Err(invalid("the request's envelope has unknown flags"));
    }
    if rest.len() != length {
        return Err(invalid(
            "the request's envelope length does not match its body (one message expected)",
        ));
    }
    Ok(rest)
}

/// One file of a multipart upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadPart {
    /// The part's `filename` (the SDKs put the file's path there), when given.
    pub filename: Option<String>,
    /// The bytes.
    pub content: Bytes,
}

/// The `boundary` parameter of a `multipart/form-data` content type.
pub fn multipart_boundary(content_type: &str) -> Option<String> {
    let (mime, params) = content_type.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|param| {
        let (name, value) = param.trim().split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"').to_owned())
            .filter(|b| !b.is_empty() && b.len() <= 200)
    })
}

/// The parts of a `multipart/form-data` body named `file` (RFC 7578), binary-safe: a
/// part's content is everything up to the CRLF before the next delimiter.
pub fn multipart_files(body: &Bytes, boundary: &str) -> Result<Vec<UploadPart>, ApiError> {
    let bad = |why: &str| ApiError::new(StatusCode::BAD_REQUEST, format!("multipart body: {why}"));
    let delimiter = format!("--{boundary}");
    let next_delimiter = format!("\r\n--{boundary}");
    let mut pos = find(body, delimiter.as_bytes(), 0).ok_or_else(|| bad("no boundary"))?;
    let mut parts = Vec::new();
    loop {
        pos += delimiter.len();
        if body.get(pos..pos + 2) == Some(b"--") {
            return Ok(parts);
        }
        if body.get(pos..pos + 2) != Some(b"\r\n") {
            return Err(bad("a boundary is not followed by CRLF"));
        }
        pos += 2;
        let headers_end =
            find(body, b"\r\n\r\n", pos).ok_or_else(|| bad("a part's headers do not end"))?;
        let headers = String::from_utf8_lossy(&body[pos..headers_end]).into_owned();
        let content_start = headers_end + 4;
        let end = find(body, next_delimiter.as_bytes(), content_start)
            .ok_or_else(|| bad("a part does not end"))?;
        let disposition = headers
            .split("\r\n")
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("content-disposition")
                    .then(|| value.trim().to_owned())
            })
            .unwrap_or_default();
        let param = |key: &str| {
            disposition.split(';').find_map(|p| {
                let (name, value) = p.trim().split_once('=')?;
                (name.trim() == key).then(|| value.trim().trim_matches('"').to_owned())
            })
        };
        if param("name").as_deref() == Some("file") {
            parts.push(UploadPart {
                filename: param("filename"),
                content: body.slice(content_start..end),
            });
        }
        pos = end + 2;
    }
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_round_trips_and_bad_ones_are_refused() {
        let framed = envelope(0, br#"{"a":1}"#);
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(single_message(&framed).unwrap(), br#"{"a":1}"#);
        assert_eq!(envelope(END_STREAM_FLAG, b"{}")[0], 2);
        assert!(single_message(&framed[..6]).is_err());
        let mut two = framed.to_vec();
        two.extend_from_slice(&framed);
        assert!(single_message(&two).is_err());
        let compressed = envelope(COMPRESSED_FLAG, b"x");
        assert_eq!(
            single_message(&compressed).unwrap_err().code,
            ConnectCode::Unimplemented
        );
    }

    #[test]
    fn multipart_parts_are_binary_safe() {
        let all: Vec<u8> = (0..=255u8).collect();
        let mut body = Vec::new();
        body.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n");
        body.extend_from_slice(&all);
        body.extend_from_slice(
            b"\r\n--XyZ\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nx\r\n--XyZ--\r\n",
        );
        let boundary = multipart_boundary("multipart/form-data; boundary=XyZ").unwrap();
        let parts = multipart_files(&Bytes::from(body), &boundary).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].filename.as_deref(), Some("/home/user/a.bin"));
        assert_eq!(&parts[0].content[..], &all[..]);
        assert!(multipart_boundary("application/json").is_none());
        assert!(multipart_files(&Bytes::from_static(b"--XyZ\r\nbroken"), "XyZ").is_err());
    }

    #[test]
    fn errors_have_the_shapes_the_sdks_map() {
        let e = ApiError::unsupported("pause");
        assert_eq!(e.status, StatusCode::NOT_IMPLEMENTED);
        assert_eq!(e.message, "not supported by airlock: pause");
        let rpc = RpcError::from(ApiError::new(StatusCode::NOT_FOUND, "x"));
        assert_eq!(rpc.code.as_str(), "not_found");
        assert_eq!(rpc.code.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            rpc.to_json(),
            serde_json::json!({"code": "not_found", "message": "x"})
        );
    }
}
