//! Keeping a secret's real value from coming back to the job, or going anywhere else.
//!
//! The proxy puts a secret's real value into requests toward its own hosts, plain HTTP or
//! intercepted HTTPS ([`crate::secrets`]). An upstream that echoes what it received (a debugging endpoint, an
//! error page quoting the `Authorization` header) would hand the value to the job, which
//! could then send it, encoded past output redaction, to any other allowlisted host. So:
//!
//! - a response from a secret's host has every form of the value the [`Scrubber`] knows
//!   replaced by the placeholder, in the reason phrase, header values (a header whose
//!   *name* holds it is dropped) and the body, streamed or chunked;
//! - a request toward a host outside a secret's scope that carries the value in a known
//!   form is refused: in its target, host name or headers before anything is dialled, in
//!   its body as the body streams (cut off before the bytes holding the value go out).
//!
//! The forms: the raw bytes; URL percent-encoding of any subset of the bytes, in either
//! hex case, with `+` for a space; JSON string escapes (`\u00XX`, `\/`, `\"`, `\\`); hex
//! in either case; base64 in the standard and URL-safe alphabets, padded or not, at any of
//! the three alignments the value can have inside a longer base64 string (there the one
//! character at each edge that mixes the value with its neighbours stays, a few bits). Any
//! other transformation (base32, line-wrapped MIME base64, compression inside the body,
//! part of the value) passes: the scrubber is a filter for the ways a server echoes
//! a value, not a proof that none of it can leak. A CONNECT tunnel the proxy does not
//! intercept is not inspected at all (see docs/proxy.md).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use base64::Engine as _;
use base64::engine::GeneralPurpose;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::config::Secret;
use crate::edit::{Edit, EditedBody};
use crate::record::Verdict;
use crate::state::InFlight;

/// The longest text form of one byte of a value: a JSON `\u00XX` escape.
const MAX_TEXT_BYTES_PER_BYTE: usize = 6;

/// Why a request toward a host outside a secret's scope is refused; also its audit reason.
pub(crate) const FOREIGN_SECRET_REASON: &str =
    "the request carries a secret's real value to a host outside its scope";

/// One secret's value and what replaces it. No `Debug`: it would print the value.
struct Known {
    value: Vec<u8>,
    placeholder: Vec<u8>,
    /// The base64 forms, exact strings.
    base64: Vec<Vec<u8>>,
}

/// Finds and replaces every form of a set of secrets' values (see the module docs). No
/// `Debug`: it would print the values.
pub(crate) struct Scrubber {
    known: Vec<Known>,
    /// The longest match any form can have, in bytes: how much a stream holds back.
    longest: usize,
    /// The bytes a match can start with (in either case), so most positions are passed
    /// over at the cost of one lookup.
    starts: [bool; 256],
}

impl Scrubber {
    /// The scrubber for `secrets`; `None` when there are none (or all values are empty).
    pub(crate) fn new(secrets: &[&Secret]) -> Option<Self> {
        let known: Vec<Known> = secrets
            .iter()
            .map(|secret| secret.value.expose().as_bytes())
            .zip(secrets.iter().map(|s| s.placeholder.as_bytes()))
            .filter(|(value, _)| !value.is_empty())
            .map(|(value, placeholder)| Known {
                value: value.to_vec(),
                placeholder: placeholder.to_vec(),
                base64: base64_forms(value),
            })
            .collect();
        let longest = known
            .iter()
            .map(|k| {
                let text = k.value.len() * MAX_TEXT_BYTES_PER_BYTE;
                k.base64.iter().map(Vec::len).fold(text, usize::max)
            })
            .max()?;
        let mut starts = [false; 256];
        let mut mark = |b: u8| {
            for b in [b, b.to_ascii_lowercase(), b.to_ascii_uppercase()] {
                starts[usize::from(b)] = true;
            }
        };
        for b in [b'%', b'+', b'\\'] {
            mark(b);
        }
        for k in &known {
            let first = k.value[0];
            mark(first);
            hex::encode([first]).bytes().for_each(&mut mark);
            k.base64.iter().for_each(|form| mark(form[0]));
        }
        Some(Self {
            known,
            longest,
            starts,
        })
    }

    /// The longest form at the start of `input`: its length and the placeholder for it.
    fn match_at(&self, input: &[u8], fold_case: bool) -> Option<(usize, &[u8])> {
        if !self.starts[usize::from(*input.first()?)] {
            return None;
        }
        let mut best: Option<(usize, &[u8])> = None;
        for known in &self.known {
            let lengths = [
                text_len(&known.value, input, fold_case),
                hex_len(&known.value, input),
                known
                    .base64
                    .iter()
                    .filter(|form| starts_with(input, form, fold_case))
                    .map(Vec::len)
                    .max(),
            ];
            for len in lengths.into_iter().flatten() {
                if best.is_none_or(|(longest, _)| len > longest) {
                    best = Some((len, &known.placeholder));
                }
            }
        }
        best
    }

    /// True when `input` holds any form of a value. `fold_case` compares letters without
    /// case, for text that was lowercased on the way (header names).
    pub(crate) fn finds(&self, input: &[u8], fold_case: bool) -> bool {
        (0..input.len()).any(|i| self.match_at(&input[i..], fold_case).is_some())
    }

    /// Replaces every match that starts before `limit` (all of `input` when `None`);
    /// returns the output, how far `input` was consumed, and the number of replacements.
    /// A match that starts before `limit` must end inside `input`: a stream keeps
    /// `longest - 1` bytes after `limit`.
    fn scrub_until(&self, input: &[u8], limit: Option<usize>) -> (Vec<u8>, usize, u64) {
        let end = limit.unwrap_or(input.len()).min(input.len());
        let mut out = Vec::with_capacity(input.len());
        let mut count = 0;
        let mut i = 0;
        while i < end {
            if let Some((len, placeholder)) = self.match_at(&input[i..], false) {
                out.extend_from_slice(placeholder);
                i += len;
                count += 1;
            } else {
                out.push(input[i]);
                i += 1;
            }
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

    /// Where a stream of `buffered` bytes may be scrubbed up to now.
    fn safe_len(&self, buffered: usize) -> usize {
        buffered.saturating_sub(self.longest.saturating_sub(1))
    }
}

fn starts_with(input: &[u8], needle: &[u8], fold_case: bool) -> bool {
    input.len() >= needle.len()
        && if fold_case {
            input[..needle.len()].eq_ignore_ascii_case(needle)
        } else {
            input.starts_with(needle)
        }
}

/// The base64 strings that `value` shows as: whole (padded and not), and the part that
/// depends on the value alone when it sits 0, 1 or 2 bytes into a longer encoded string.
fn base64_forms(value: &[u8]) -> Vec<Vec<u8>> {
    let mut forms: Vec<Vec<u8>> = Vec::new();
    let engines: [(&GeneralPurpose, &GeneralPurpose); 2] =
        [(&STANDARD, &STANDARD_NO_PAD), (&URL_SAFE, &URL_SAFE_NO_PAD)];
    for (padded, unpadded) in engines {
        forms.push(padded.encode(value).into_bytes());
        forms.push(unpadded.encode(value).into_bytes());
        for shift in 0..3 {
            let mut shifted = vec![0u8; shift];
            shifted.extend_from_slice(value);
            let encoded = unpadded.encode(&shifted).into_bytes();
            // Character j holds bits 6j..6j+6; the value holds bits 8*shift..8*(shift+len).
            let first = (8 * shift).div_ceil(6);
            let end = (8 * (shift + value.len())) / 6;
            if first < end {
                forms.push(encoded[first..end].to_vec());
            }
        }
    }
    let mut unique: Vec<Vec<u8>> = Vec::new();
    for form in forms {
        if !form.is_empty() && !unique.contains(&form) {
            unique.push(form);
        }
    }
    unique
}

/// How long the longest text form of `value` at the start of `input` is: each byte raw,
/// percent-encoded, `+` for a space, or JSON-escaped. Several readings can apply at once
/// (`%25` is `%` or the start of `%`, `2`, `5`), so every reading is followed, as a set of
/// offsets.
fn text_len(value: &[u8], input: &[u8], fold_case: bool) -> Option<usize> {
    // Most positions fail on the first byte; only then is the set allocated.
    if byte_as_text(*value.first()?, input, fold_case) == [None, None] {
        return None;
    }
    let mut offsets = vec![0usize];
    let mut next = Vec::new();
    for &byte in value {
        next.clear();
        for &at in &offsets {
            let rest = &input[at..];
            for len in byte_as_text(byte, rest, fold_case).into_iter().flatten() {
                if !next.contains(&(at + len)) {
                    next.push(at + len);
                }
            }
        }
        if next.is_empty() {
            return None;
        }
        std::mem::swap(&mut offsets, &mut next);
    }
    offsets.into_iter().max()
}

/// The lengths of the readings of `byte` at the start of `input`: raw, and one escape.
fn byte_as_text(byte: u8, input: &[u8], fold_case: bool) -> [Option<usize>; 2] {
    let Some(&first) = input.first() else {
        return [None, None];
    };
    let raw = (first == byte || (fold_case && first.eq_ignore_ascii_case(&byte))).then_some(1);
    let escaped = match first {
        b'%' => input
            .get(1..3)
            .and_then(hex_byte)
            .is_some_and(|b| b == byte)
            .then_some(3),
        b'+' if byte == b' ' => Some(1),
        b'\\' => match input.get(1) {
            Some(b'u') if byte.is_ascii() => input
                .get(2..6)
                .filter(|digits| digits.starts_with(b"00"))
                .and_then(|digits| hex_byte(&digits[2..]))
                .is_some_and(|b| b == byte)
                .then_some(6),
            Some(&c) if c == byte && matches!(byte, b'/' | b'"' | b'\\') => Some(2),
            _ => None,
        },
        _ => None,
    };
    [raw, escaped]
}

/// The length of `value` in hex (either case, per digit) at the start of `input`.
fn hex_len(value: &[u8], input: &[u8]) -> Option<usize> {
    let digits = input.get(..value.len() * 2)?;
    digits
        .chunks_exact(2)
        .zip(value)
        .all(|(pair, &byte)| hex_byte(pair) == Some(byte))
        .then_some(value.len() * 2)
}

fn hex_byte(pair: &[u8]) -> Option<u8> {
    let digit = |c: u8| char::from(c).to_digit(16);
    match pair {
        [hi, lo] => u8::try_from(digit(*hi)? * 16 + digit(*lo)?).ok(),
        _ => None,
    }
}

/// The [`Edit`] that replaces the values of a [`Scrubber`] in a response body as it
/// streams ([`EditedBody`]), counting each replacement in the request's record.
pub(crate) struct ScrubEdit {
    scrubber: Arc<Scrubber>,
    inflight: Arc<InFlight>,
}

/// `inner` with the scrubber's values replaced as it streams.
pub(crate) fn scrubbed<B>(
    inner: B,
    scrubber: Arc<Scrubber>,
    inflight: Arc<InFlight>,
) -> EditedBody<B, ScrubEdit> {
    EditedBody::new(inner, ScrubEdit { scrubber, inflight })
}

impl Edit for ScrubEdit {
    fn hold(&self) -> usize {
        self.scrubber.longest.saturating_sub(1)
    }

    fn edit(&mut self, input: &[u8], limit: Option<usize>) -> (Vec<u8>, usize) {
        let (out, used, n) = self.scrubber.scrub_until(input, limit);
        if n > 0 {
            self.inflight.update(|r| r.secrets_scrubbed += n);
        }
        (out, used)
    }
}

/// Why a guarded request body stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestBodyError {
    /// Reading the job's body failed.
    #[error("reading the request body: {0}")]
    Read(#[from] hyper::Error),
    /// The body holds a secret's value and its host is outside the secret's scope.
    #[error("{FOREIGN_SECRET_REASON}")]
    CarriesSecret,
}

/// A request body toward a host outside some secrets' scope, passed on unchanged unless it
/// holds one of their values: then it ends in an error before the bytes of the value are
/// sent (the same hold-back as [`ScrubbedBody`]), which aborts the upstream request, and
/// the record is marked denied. `refused` tells the request's other tasks.
pub(crate) struct GuardedBody<B> {
    inner: B,
    scrubber: Scrubber,
    carry: Vec<u8>,
    inflight: Arc<InFlight>,
    refused: Arc<AtomicBool>,
    ended: bool,
}

impl<B> GuardedBody<B> {
    pub(crate) fn new(
        inner: B,
        scrubber: Scrubber,
        inflight: Arc<InFlight>,
        refused: Arc<AtomicBool>,
    ) -> Self {
        Self {
            inner,
            scrubber,
            carry: Vec::new(),
            inflight,
            refused,
            ended: false,
        }
    }

    fn refuse(&mut self) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        self.ended = true;
        self.carry.clear();
        self.refused.store(true, Ordering::SeqCst);
        tracing::warn!(reason = FOREIGN_SECRET_REASON, "proxy request body cut off");
        self.inflight.update(|r| {
            r.verdict = Verdict::Denied {
                reason: FOREIGN_SECRET_REASON.to_owned(),
            };
        });
        Poll::Ready(Some(Err(RequestBodyError::CarriesSecret)))
    }
}

impl<B> Body for GuardedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<RequestBodyError>,
{
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    this.carry.extend_from_slice(&data);
                    if this.scrubber.finds(&this.carry, false) {
                        return this.refuse();
                    }
                    // Every match starting before `safe` would have been found above, so
                    // those bytes cannot begin a value.
                    let safe = this.scrubber.safe_len(this.carry.len());
                    if safe > 0 {
                        let out: Vec<u8> = this.carry.drain(..safe).collect();
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    let rest = std::mem::take(&mut this.carry);
                    if rest.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        // The bytes pass unchanged, so the job's length still holds.
        self.inner.size_hint()
    }
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
            env: "E".to_owned(),
            substitute: Vec::new(),
        }
    }

    /// Scrubs `body` whole and at every split into two reads; all must agree.
    fn scrub_every_way(scrubber: &Scrubber, body: &[u8]) -> (String, u64) {
        let (whole, _, whole_count) = scrubber.scrub_until(body, None);
        for split in 0..=body.len() {
            let mut carry = body[..split].to_vec();
            let safe = scrubber.safe_len(carry.len());
            let (mut out, used, mut count) = scrubber.scrub_until(&carry, Some(safe));
            carry.drain(..used);
            carry.extend_from_slice(&body[split..]);
            let (rest, _, more) = scrubber.scrub_until(&carry, None);
            out.extend_from_slice(&rest);
            count += more;
            assert_eq!(out, whole, "split at {split}");
            assert_eq!(count, whole_count, "split at {split}");
        }
        (String::from_utf8(whole).unwrap(), whole_count)
    }

    #[test]
    fn every_encoding_is_scrubbed_across_any_split() {
        let value = "sk/real+value?x";
        let s = secret("PH", value);
        let scrubber = Scrubber::new(&[&s]).unwrap();
        let forms = [
            value.to_owned(),
            STANDARD.encode(value),
            STANDARD_NO_PAD.encode(value),
            URL_SAFE.encode(value),
            URL_SAFE_NO_PAD.encode(value),
            "sk%2Freal%2Bvalue%3Fx".to_owned(),
            "sk%2freal%2bvalue%3fx".to_owned(),
            // Unreserved bytes encoded too, mixed case: still the same value to a decoder.
            "%73k%2Freal%2bv%61lue%3Fx".to_owned(),
            "sk\\/real+value?x".to_owned(),
            "\\u0073k/real\\u002Bvalue?x".to_owned(),
            hex::encode(value),
            hex::encode_upper(value),
            "736B2f7265616c2B76616C75653f78".to_owned(),
        ];
        for form in forms {
            let body = format!("a {form} b {form}");
            let (out, n) = scrub_every_way(&scrubber, body.as_bytes());
            assert_eq!(out, "a PH b PH", "{form}");
            assert_eq!(n, 2, "{form}");
        }
        assert!(scrubber.scrub(b"nothing here").is_none());
        assert!(scrubber.scrub(b"sk/real+valu").is_none());
    }

    #[test]
    fn a_value_inside_a_longer_base64_string_is_found_at_every_alignment() {
        let value = b"sk-real-value-0123456789";
        let s = secret("PH", std::str::from_utf8(value).unwrap());
        let scrubber = Scrubber::new(&[&s]).unwrap();
        for prefix in ["", "a", "ab", "abc", "Bearer "] {
            for suffix in ["", "x", "xy", "\n"] {
                let mut data = prefix.as_bytes().to_vec();
                data.extend_from_slice(value);
                data.extend_from_slice(suffix.as_bytes());
                for engine in [&STANDARD, &URL_SAFE_NO_PAD] {
                    let encoded = engine.encode(&data);
                    assert!(scrubber.finds(encoded.as_bytes(), false), "{encoded}");
                    let (out, n) = scrub_every_way(&scrubber, encoded.as_bytes());
                    assert_eq!(n, 1, "{encoded} -> {out}");
                    // What is left around the placeholder is a few characters at most.
                    let left = out.replace("PH", "");
                    assert!(left.len() <= encoded.len() - 28, "{encoded} -> {out}");
                }
            }
        }
    }

    #[test]
    fn header_names_match_without_case() {
        let s = secret("PH", "Sk-Real");
        let scrubber = Scrubber::new(&[&s]).unwrap();
        assert!(scrubber.finds(b"x-sk-real-echo", true));
        assert!(!scrubber.finds(b"x-sk-real-echo", false));
        assert!(!scrubber.finds(b"x-sk-rea", true));
    }

    #[test]
    fn a_percent_sign_in_the_value_is_read_both_ways() {
        // Where the value has a `%`, the input's `%` may be that byte raw or start an
        // escape; both readings are followed.
        let s = secret("PH", "a%2541");
        let scrubber = Scrubber::new(&[&s]).unwrap();
        for form in ["a%2541", "a%252541", "a%25%32541", "%61%2541"] {
            assert_eq!(scrubber.scrub(form.as_bytes()).unwrap().0, b"PH", "{form}");
        }
        assert!(scrubber.scrub(b"a%41").is_none());
    }

    #[test]
    fn several_secrets_each_get_their_own_placeholder() {
        let a = secret("PH-A", "first-value");
        let b = secret("PH-B", "second-value");
        let scrubber = Scrubber::new(&[&a, &b]).unwrap();
        let body = format!("{} {}", hex::encode("second-value"), "first-value");
        assert_eq!(scrub_every_way(&scrubber, body.as_bytes()).0, "PH-B PH-A");
    }

    #[test]
    fn no_values_no_scrubber() {
        assert!(Scrubber::new(&[]).is_none());
        assert!(Scrubber::new(&[&secret("PH", "")]).is_none());
    }
}
