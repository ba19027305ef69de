//! Placeholder substitution on plain-HTTP requests.
//!
//! Where: header values, and the query string of the request target (where the value is
//! percent-encoded). Not in the path, not in bodies, not in header names. Only the
//! secrets whose hosts admit the request's `host:port` apply; toward any other host the
//! placeholder passes through as the job wrote it.
//!
//! CONNECT tunnels are opaque: the proxy cannot see inside TLS, so a placeholder sent over
//! HTTPS reaches the server as the placeholder. Substituting there would need the proxy to
//! terminate TLS with a per-job CA that the job trusts (and to verify the real server's
//! certificate itself); that is not built.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::config::Secret;
use crate::state::InFlight;

/// What replaces the real values of a secret scope in responses: every form of each value
/// the proxy knows (raw, base64 standard and URL-safe with and without padding, percent
/// encoding with upper- and lower-case digits, hex lower and upper), each mapped to the
/// placeholder, longest first so that a padded form is not left half-replaced.
#[derive(Debug)]
pub(crate) struct Scrubber {
    needles: Vec<(Vec<u8>, Vec<u8>)>,
    longest: usize,
}

impl Scrubber {
    /// The scrubber for `secrets`; `None` when there are none.
    pub(crate) fn new(secrets: &[&Secret]) -> Option<Self> {
        let mut needles: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for secret in secrets {
            let value = secret.value.expose().as_bytes();
            let placeholder = secret.placeholder.as_bytes().to_vec();
            let percent = percent_encode(secret.value.expose());
            for form in [
                value.to_vec(),
                STANDARD.encode(value).into_bytes(),
                STANDARD_NO_PAD.encode(value).into_bytes(),
                URL_SAFE.encode(value).into_bytes(),
                URL_SAFE_NO_PAD.encode(value).into_bytes(),
                percent.clone().into_bytes(),
                percent_lower(&percent).into_bytes(),
                hex::encode(value).into_bytes(),
                hex::encode_upper(value).into_bytes(),
            ] {
                if !form.is_empty() && !needles.iter().any(|(n, _)| *n == form) {
                    needles.push((form, placeholder.clone()));
                }
            }
        }
        needles.sort_by_key(|(needle, _)| std::cmp::Reverse(needle.len()));
        let longest = needles.first()?.0.len();
        Some(Self { needles, longest })
    }

    /// True when `input` holds any form of a value.
    pub(crate) fn finds(&self, input: &[u8]) -> bool {
        self.needles
            .iter()
            .any(|(needle, _)| input.windows(needle.len()).any(|w| w == needle.as_slice()))
    }

    /// Replaces every match that starts before `limit` (all of `input` when `None`);
    /// returns the output, how far `input` was consumed, and the number of replacements.
    fn scrub_until(&self, input: &[u8], limit: Option<usize>) -> (Vec<u8>, usize, u64) {
        let end = limit.unwrap_or(input.len()).min(input.len());
        let mut out = Vec::with_capacity(input.len());
        let mut count = 0;
        let mut i = 0;
        'scan: while i < end {
            for (needle, with) in &self.needles {
                if input[i..].starts_with(needle) {
                    out.extend_from_slice(with);
                    i += needle.len();
                    count += 1;
                    continue 'scan;
                }
            }
            out.push(input[i]);
            i += 1;
        }
        if limit.is_none() {
            out.extend_from_slice(&input[i.min(input.len())..]);
            i = input.len();
        }
        (out, i, count)
    }

    /// Scrubs a whole value (a header); `None` when nothing matched.
    pub(crate) fn scrub(&self, input: &[u8]) -> Option<(Vec<u8>, u64)> {
        let (out, _, count) = self.scrub_until(input, None);
        (count > 0).then_some((out, count))
    }
}

/// A response body with the values of a [`Scrubber`] replaced as it streams. The last
/// `longest - 1` bytes of what has arrived are held back until more comes (or the body
/// ends), so that a value split across reads or chunks is still found.
pub(crate) struct ScrubbedBody<B> {
    inner: B,
    scrubber: Arc<Scrubber>,
    carry: Vec<u8>,
    inflight: Arc<InFlight>,
    ended: bool,
}

impl<B> ScrubbedBody<B> {
    pub(crate) fn new(inner: B, scrubber: Arc<Scrubber>, inflight: Arc<InFlight>) -> Self {
        Self {
            inner,
            scrubber,
            carry: Vec::new(),
            inflight,
            ended: false,
        }
    }

    fn count(&self, n: u64) {
        if n > 0 {
            self.inflight.update(|r| r.secrets_scrubbed += n);
        }
    }
}

impl<B> Body for ScrubbedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers are dropped: the proxy strips `Trailer`, and they could carry
                    // a value past the scrubber.
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    this.carry.extend_from_slice(&data);
                    let safe = this
                        .carry
                        .len()
                        .saturating_sub(this.scrubber.longest.saturating_sub(1));
                    let (out, used, n) = this.scrubber.scrub_until(&this.carry, Some(safe));
                    this.carry.drain(..used);
                    this.count(n);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    let rest = std::mem::take(&mut this.carry);
                    let (out, _, n) = this.scrubber.scrub_until(&rest, None);
                    this.count(n);
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

fn percent_lower(upper: &str) -> String {
    let mut out = String::with_capacity(upper.len());
    let mut digits = 0;
    for c in upper.chars() {
        if c == '%' {
            digits = 2;
            out.push(c);
        } else if digits > 0 {
            digits -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Replaces every placeholder of `secrets` in `input`; `None` when nothing changed.
pub(crate) fn substitute_bytes(input: &[u8], secrets: &[&Secret]) -> Option<Vec<u8>> {
    let mut current: Option<Vec<u8>> = None;
    for secret in secrets {
        let haystack = current.as_deref().unwrap_or(input);
        if let Some(replaced) = replace_all(
            haystack,
            secret.placeholder.as_bytes(),
            secret.value.expose().as_bytes(),
        ) {
            current = Some(replaced);
        }
    }
    current
}

/// Replaces the placeholders in the query part of a `path?query` target, percent-encoding
/// the value; the path is left alone. `None` when nothing changed.
pub(crate) fn substitute_query(path_and_query: &str, secrets: &[&Secret]) -> Option<String> {
    let (path, query) = path_and_query.split_once('?')?;
    let mut current: Option<String> = None;
    for secret in secrets {
        let haystack = current.as_deref().unwrap_or(query);
        if haystack.contains(&secret.placeholder) {
            current =
                Some(haystack.replace(&secret.placeholder, &percent_encode(secret.value.expose())));
        }
    }
    current.map(|query| format!("{path}?{query}"))
}

fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Option<Vec<u8>> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    let mut out: Option<Vec<u8>> = None;
    let mut start = 0;
    let mut i = 0;
    while i + needle.len() <= haystack.len() {
        if &haystack[i..i + needle.len()] == needle {
            let buf = out.get_or_insert_with(|| Vec::with_capacity(haystack.len()));
            buf.extend_from_slice(&haystack[start..i]);
            buf.extend_from_slice(with);
            i += needle.len();
            start = i;
        } else {
            i += 1;
        }
    }
    let mut buf = out?;
    buf.extend_from_slice(&haystack[start..]);
    Some(buf)
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SecretValue;

    fn secret(placeholder: &str, value: &str) -> Secret {
        Secret {
            placeholder: placeholder.to_owned(),
            value: SecretValue::new(value.to_owned()),
            hosts: Vec::new(),
            value_env: "V".to_owned(),
        }
    }

    #[test]
    fn headers_get_every_occurrence() {
        let s = secret("PLACEHOLDER", "real");
        assert_eq!(
            substitute_bytes(b"Bearer PLACEHOLDER and PLACEHOLDER", &[&s]).as_deref(),
            Some(&b"Bearer real and real"[..])
        );
        assert_eq!(substitute_bytes(b"Bearer PLACEHOLDE", &[&s]), None);
        assert_eq!(substitute_bytes(b"", &[&s]), None);
    }

    #[test]
    fn queries_are_encoded_and_paths_untouched() {
        let s = secret("PLACEHOLDER", "a b&c=d");
        assert_eq!(
            substitute_query("/PLACEHOLDER/x?key=PLACEHOLDER&y=1", &[&s]).as_deref(),
            Some("/PLACEHOLDER/x?key=a%20b%26c%3Dd&y=1")
        );
        assert_eq!(substitute_query("/PLACEHOLDER", &[&s]), None);
    }

    #[test]
    fn every_encoding_is_scrubbed_across_any_split() {
        let s = secret("PH", "sk/real+value?x");
        let scrubber = Scrubber::new(&[&s]).unwrap();
        let forms = [
            "sk/real+value?x".to_owned(),
            STANDARD.encode("sk/real+value?x"),
            STANDARD_NO_PAD.encode("sk/real+value?x"),
            URL_SAFE.encode("sk/real+value?x"),
            URL_SAFE_NO_PAD.encode("sk/real+value?x"),
            "sk%2Freal%2Bvalue%3Fx".to_owned(),
            "sk%2freal%2bvalue%3fx".to_owned(),
            hex::encode("sk/real+value?x"),
            hex::encode_upper("sk/real+value?x"),
        ];
        for form in forms {
            let body = format!("a {form} b {form}");
            let (out, n) = scrubber.scrub(body.as_bytes()).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), "a PH b PH", "{form}");
            assert_eq!(n, 2);
            // Streaming: every split point, with the hold-back of `longest - 1` bytes.
            for split in 0..=body.len() {
                let mut carry = body.as_bytes()[..split].to_vec();
                let safe = carry.len().saturating_sub(scrubber.longest - 1);
                let (mut out, used, mut count) = scrubber.scrub_until(&carry, Some(safe));
                carry.drain(..used);
                carry.extend_from_slice(&body.as_bytes()[split..]);
                let (rest, _, more) = scrubber.scrub_until(&carry, None);
                out.extend_from_slice(&rest);
                count += more;
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    "a PH b PH",
                    "{form} @{split}"
                );
                assert_eq!(count, 2);
            }
        }
        assert!(scrubber.scrub(b"nothing here").is_none());
    }

    #[test]
    fn several_secrets_apply_in_turn() {
        let a = secret("PLACEHOLDER-A", "1");
        let b = secret("PLACEHOLDER-B", "2");
        assert_eq!(
            substitute_bytes(b"PLACEHOLDER-A:PLACEHOLDER-B", &[&a, &b]).as_deref(),
            Some(&b"1:2"[..])
        );
    }
}
