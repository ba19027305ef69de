//! Decoding a compressed answer the proxy must read.
//!
//! The proxy reads the body of an answer from a secret's host (to scrub the value out of
//! it) and from a package index (to learn the hosts it links to). It asks those hosts for
//! `Accept-Encoding: identity`; one that compresses anyway with `gzip` or `deflate` is
//! decoded here, as it streams, and the job gets the decoded bytes (without the
//! `Content-Encoding`). The decoded size is bounded ([`DECODED_BODY_MAX_BYTES`]): a small
//! compressed body can expand a thousandfold, so input goes to the decoder a little at a
//! time ([`INPUT_STEP_BYTES`]) and the body ends in an error once the bound is passed.
//! Any other coding (`br`, `zstd`, stacked codings, a compressed transfer coding) cannot
//! be read here, so such an answer is refused, never passed on unread.

use std::io::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use flate2::write::{GzDecoder, ZlibDecoder};
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{self, HeaderMap};

use crate::server::BodyError;

/// Most bytes one answer may decode to.
pub const DECODED_BODY_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Compressed bytes handed to the decoder at once: deflate expands at most about 1032
/// times, so one step yields about 1 MiB at most.
pub const INPUT_STEP_BYTES: usize = 1024;

/// A content coding the proxy decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coding {
    /// `gzip` or `x-gzip`.
    Gzip,
    /// `deflate` (zlib-wrapped, as HTTP defines it).
    Deflate,
}

/// How an answer is encoded: `Ok(None)` for identity (or only `chunked`, which hyper
/// removes), `Ok(Some(coding))` for one coding the proxy decodes, and `Err(name)` for
/// anything it cannot read (the coding's name, sanitized, for the refusal).
pub(crate) fn response_coding(headers: &HeaderMap) -> Result<Option<Coding>, String> {
    let tokens = |name| {
        headers
            .get_all(name)
            .iter()
            .flat_map(|value| value.as_bytes().split(|&b| b == b','))
            .map(|coding| String::from_utf8_lossy(coding).trim().to_ascii_lowercase())
            .filter(|coding| coding != "identity")
            .collect::<Vec<_>>()
    };
    if let Some(transfer) = tokens(header::TRANSFER_ENCODING)
        .into_iter()
        .find(|coding| coding != "chunked")
    {
        return Err(sanitize(&transfer));
    }
    let content = tokens(header::CONTENT_ENCODING);
    match content.as_slice() {
        [] => Ok(None),
        [one] if one == "gzip" || one == "x-gzip" => Ok(Some(Coding::Gzip)),
        [one] if one == "deflate" => Ok(Some(Coding::Deflate)),
        [one] => Err(sanitize(one)),
        many => Err(format!(
            "stacked ({})",
            many.iter()
                .map(|c| sanitize(c))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// A coding's name as it may appear in a message: letters, digits and dashes, bounded.
fn sanitize(coding: &str) -> String {
    if coding.is_empty() {
        return "an empty".to_owned();
    }
    coding
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(32)
        .collect()
}

/// Why a decoded body stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    /// The compressed stream is not valid.
    #[error("the upstream's {coding:?} body does not decode: {reason}")]
    Decode {
        /// The coding.
        coding: Coding,
        /// What the decoder said.
        reason: String,
    },
    /// It decodes to more than the bound.
    #[error("the upstream's compressed body decodes to more than {DECODED_BODY_MAX_BYTES} bytes")]
    TooLarge,
    /// Reading the upstream failed.
    #[error("reading the upstream's body: {0}")]
    Read(BodyError),
}

/// The decoder's output: refuses writes past the bound.
struct Bounded {
    out: Vec<u8>,
    total: u64,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.total = self.total.saturating_add(buf.len() as u64);
        if self.total > DECODED_BODY_MAX_BYTES {
            return Err(std::io::Error::other("decoded body too large"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

enum Decoder {
    Gzip(GzDecoder<Bounded>),
    Deflate(ZlibDecoder<Bounded>),
}

impl Decoder {
    fn new(coding: Coding) -> Self {
        let out = Bounded {
            out: Vec::new(),
            total: 0,
        };
        match coding {
            Coding::Gzip => Decoder::Gzip(GzDecoder::new(out)),
            Coding::Deflate => Decoder::Deflate(ZlibDecoder::new(out)),
        }
    }

    fn write_all(&mut self, input: &[u8]) -> std::io::Result<()> {
        match self {
            Decoder::Gzip(d) => d.write_all(input),
            Decoder::Deflate(d) => d.write_all(input),
        }
    }

    fn finish(&mut self) -> std::io::Result<()> {
        match self {
            Decoder::Gzip(d) => d.try_finish(),
            Decoder::Deflate(d) => d.try_finish(),
        }
    }

    fn bounded(&mut self) -> &mut Bounded {
        match self {
            Decoder::Gzip(d) => d.get_mut(),
            Decoder::Deflate(d) => d.get_mut(),
        }
    }

    fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.bounded().out)
    }
}

/// A compressed body, decoded as it streams.
pub(crate) struct DecodedBody<B> {
    inner: B,
    coding: Coding,
    decoder: Decoder,
    /// Compressed bytes not yet given to the decoder.
    pending: Bytes,
    ended: bool,
}

impl<B> DecodedBody<B> {
    pub(crate) fn new(inner: B, coding: Coding) -> Self {
        Self {
            inner,
            coding,
            decoder: Decoder::new(coding),
            pending: Bytes::new(),
            ended: false,
        }
    }

    fn fail(&mut self, error: &std::io::Error) -> DecodeError {
        self.ended = true;
        if self.decoder.bounded().total > DECODED_BODY_MAX_BYTES {
            DecodeError::TooLarge
        } else {
            DecodeError::Decode {
                coding: self.coding,
                reason: error.to_string(),
            }
        }
    }
}

impl<B> Body for DecodedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BodyError>,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            // Decode what is pending, a step at a time, handing on each step's output.
            while !this.pending.is_empty() {
                let step = this
                    .pending
                    .split_to(this.pending.len().min(INPUT_STEP_BYTES));
                if let Err(e) = this.decoder.write_all(&step) {
                    return Poll::Ready(Some(Err(this.fail(&e).into())));
                }
                let out = this.decoder.take();
                if !out.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                }
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(DecodeError::Read(e.into()).into())));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers are dropped, as everywhere the proxy reads a body.
                    if let Ok(data) = frame.into_data() {
                        this.pending = data;
                    }
                }
                Poll::Ready(None) => {
                    if let Err(e) = this.decoder.finish() {
                        return Poll::Ready(Some(Err(this.fail(&e).into())));
                    }
                    this.ended = true;
                    let out = this.decoder.take();
                    if out.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use hyper::header::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn codings_are_read_or_named() {
        assert_eq!(response_coding(&headers(&[])), Ok(None));
        assert_eq!(
            response_coding(&headers(&[("content-encoding", "identity")])),
            Ok(None)
        );
        assert_eq!(
            response_coding(&headers(&[("transfer-encoding", "chunked")])),
            Ok(None)
        );
        assert_eq!(
            response_coding(&headers(&[("content-encoding", "GZIP")])),
            Ok(Some(Coding::Gzip))
        );
        assert_eq!(
            response_coding(&headers(&[("content-encoding", "deflate")])),
            Ok(Some(Coding::Deflate))
        );
        assert_eq!(
            response_coding(&headers(&[("content-encoding", "br")])),
            Err("br".to_owned())
        );
        assert!(
            response_coding(&headers(&[("content-encoding", "gzip, gzip")]))
                .unwrap_err()
                .starts_with("stacked")
        );
        assert_eq!(
            response_coding(&headers(&[("transfer-encoding", "gzip, chunked")])),
            Err("gzip".to_owned())
        );
    }

    fn compress(coding: Coding, data: &[u8]) -> Vec<u8> {
        match coding {
            Coding::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Coding::Deflate => {
                let mut e =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
        }
    }

    async fn decode(coding: Coding, body: Vec<u8>) -> Result<Vec<u8>, String> {
        let inner = Full::new(Bytes::from(body)).map_err(|never| -> BodyError { match never {} });
        let collected = DecodedBody::new(inner, coding)
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(collected.to_bytes().to_vec())
    }

    #[tokio::test]
    async fn gzip_and_deflate_decode() {
        let data = b"a body with a secret in it ".repeat(1000);
        for coding in [Coding::Gzip, Coding::Deflate] {
            assert_eq!(decode(coding, compress(coding, &data)).await.unwrap(), data);
        }
        let err = decode(Coding::Gzip, b"not gzip at all".to_vec())
            .await
            .unwrap_err();
        assert!(err.contains("does not decode"), "{err}");
    }

    #[tokio::test]
    async fn a_bomb_stops_at_the_bound() {
        // 65 MiB of zeros compresses to about 64 KiB.
        let bomb = compress(Coding::Gzip, &vec![0u8; 65 * 1024 * 1024]);
        assert!(bomb.len() < 256 * 1024);
        let err = decode(Coding::Gzip, bomb).await.unwrap_err();
        assert!(err.contains("more than"), "{err}");
    }
}
