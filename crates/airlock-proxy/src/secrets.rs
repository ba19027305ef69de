//! Placeholder substitution, on plain-HTTP requests and on HTTPS requests the proxy
//! intercepts ([`crate::intercept`]).
//!
//! Where: the places each secret's `substitute` names, header values unless it names more:
//! header values; the query string of the request target (where the value is
//! percent-encoded); the request body, as it streams ([`SubstitutedBody`]). Never the
//! path, never header names. Only the secrets whose hosts admit the request's `host:port`
//! apply; toward any other host the placeholder passes through as the job wrote it (and
//! the record lists it, [`unbound_placeholders`]).
//!
//! A tunnel the proxy does not intercept is opaque: a placeholder sent through it reaches
//! the server as the placeholder, unseen.
//!
//! What keeps the real value from coming back in responses, or going out toward other
//! hosts, is in [`crate::scrub`].

use std::sync::Arc;

use crate::config::Secret;
use crate::edit::{Edit, EditedBody};
use crate::state::InFlight;

/// The job-side names of the secrets among `foreign` (secrets not for this request's
/// host) whose placeholder appears in `texts` (the request target, header values).
pub(crate) fn unbound_placeholders<'a>(
    foreign: &[&Secret],
    texts: impl Iterator<Item = &'a [u8]> + Clone,
) -> Vec<String> {
    foreign
        .iter()
        .filter(|secret| {
            let needle = secret.placeholder.as_bytes();
            texts
                .clone()
                .any(|text| text.windows(needle.len()).any(|w| w == needle))
        })
        .map(|secret| secret.env.clone())
        .collect()
}

/// The [`Edit`] that replaces every placeholder of its secrets by the real value in a
/// request body as it streams ([`EditedBody`]).
pub(crate) struct Substitute {
    /// (placeholder, value) pairs.
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The request whose record counts each replacement (`secrets_substituted`).
    inflight: Option<Arc<InFlight>>,
}

/// `inner` with the placeholders of `secrets` replaced as it streams, each replacement
/// counted in the request's record.
pub(crate) fn substituted_counted<B>(
    inner: B,
    secrets: &[&Secret],
    inflight: Arc<InFlight>,
) -> EditedBody<B, Substitute> {
    let mut body = substituted(inner, secrets);
    body.edit_mut().inflight = Some(inflight);
    body
}

/// `inner` with the placeholders of `secrets` replaced as it streams.
pub(crate) fn substituted<B>(inner: B, secrets: &[&Secret]) -> EditedBody<B, Substitute> {
    let pairs = secrets
        .iter()
        .filter(|s| !s.placeholder.is_empty())
        .map(|s| {
            (
                s.placeholder.as_bytes().to_vec(),
                s.value.expose().as_bytes().to_vec(),
            )
        })
        .collect();
    EditedBody::new(
        inner,
        Substitute {
            pairs,
            inflight: None,
        },
    )
}

impl Edit for Substitute {
    fn hold(&self) -> usize {
        self.pairs
            .iter()
            .map(|(placeholder, _)| placeholder.len().saturating_sub(1))
            .max()
            .unwrap_or(0)
    }

    fn edit(&mut self, input: &[u8], limit: Option<usize>) -> (Vec<u8>, usize) {
        let end = limit.unwrap_or(input.len()).min(input.len());
        let mut out = Vec::with_capacity(input.len());
        let mut i = 0;
        let mut replaced = 0u64;
        'scan: while i < end {
            for (placeholder, value) in &self.pairs {
                if input[i..].starts_with(placeholder) {
                    out.extend_from_slice(value);
                    i += placeholder.len();
                    replaced += 1;
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
        if replaced > 0
            && let Some(inflight) = &self.inflight
        {
            inflight.update(|r| r.secrets_substituted += replaced);
        }
        (out, i)
    }
}

/// Replaces every placeholder of `secrets` in `input`; `None` when nothing changed.
#[cfg(test)]
pub(crate) fn substitute_bytes(input: &[u8], secrets: &[&Secret]) -> Option<Vec<u8>> {
    substitute_bytes_counted(input, secrets).map(|(out, _)| out)
}

/// [`substitute_bytes`], with the number of placeholders replaced.
pub(crate) fn substitute_bytes_counted(
    input: &[u8],
    secrets: &[&Secret],
) -> Option<(Vec<u8>, u64)> {
    let mut current: Option<Vec<u8>> = None;
    let mut count = 0u64;
    for secret in secrets {
        let haystack = current.as_deref().unwrap_or(input);
        if let Some((replaced, n)) = replace_all(
            haystack,
            secret.placeholder.as_bytes(),
            secret.value.expose().as_bytes(),
        ) {
            current = Some(replaced);
            count += n;
        }
    }
    current.map(|out| (out, count))
}

/// Replaces the placeholders in the query part of a `path?query` target, percent-encoding
/// the value; the path is left alone. `None` when nothing changed.
#[cfg(test)]
pub(crate) fn substitute_query(path_and_query: &str, secrets: &[&Secret]) -> Option<String> {
    substitute_query_counted(path_and_query, secrets).map(|(out, _)| out)
}

/// [`substitute_query`], with the number of placeholders replaced.
pub(crate) fn substitute_query_counted(
    path_and_query: &str,
    secrets: &[&Secret],
) -> Option<(String, u64)> {
    let (path, query) = path_and_query.split_once('?')?;
    let mut current: Option<String> = None;
    let mut count = 0u64;
    for secret in secrets {
        if secret.placeholder.is_empty() {
            continue;
        }
        let haystack = current.as_deref().unwrap_or(query);
        let n = haystack.matches(secret.placeholder.as_str()).count() as u64;
        if n > 0 {
            current =
                Some(haystack.replace(&secret.placeholder, &percent_encode(secret.value.expose())));
            count += n;
        }
    }
    current.map(|query| (format!("{path}?{query}"), count))
}

/// `haystack` with every `needle` replaced, and how many; `None` when there was none.
fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Option<(Vec<u8>, u64)> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    let mut out: Option<Vec<u8>> = None;
    let mut count = 0u64;
    let mut start = 0;
    let mut i = 0;
    while i + needle.len() <= haystack.len() {
        if &haystack[i..i + needle.len()] == needle {
            let buf = out.get_or_insert_with(|| Vec::with_capacity(haystack.len()));
            buf.extend_from_slice(&haystack[start..i]);
            buf.extend_from_slice(with);
            count += 1;
            i += needle.len();
            start = i;
        } else {
            i += 1;
        }
    }
    let mut buf = out?;
    buf.extend_from_slice(&haystack[start..]);
    Some((buf, count))
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
            env: "E".to_owned(),
            substitute: Vec::new(),
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

    #[tokio::test]
    async fn a_body_gets_every_placeholder_across_any_split() {
        use bytes::Bytes;
        use http_body_util::{BodyExt, StreamBody};
        use hyper::body::Frame;
        let s = secret("PLACEHOLDER", "the-real-value");
        let body = b"a=PLACEHOLDER&b=PLACEHOLDER&c=PLACEHOLDE";
        for split in 0..=body.len() {
            let frames = vec![
                Ok::<_, std::convert::Infallible>(Frame::data(Bytes::copy_from_slice(
                    &body[..split],
                ))),
                Ok(Frame::data(Bytes::copy_from_slice(&body[split..]))),
            ];
            let inner = StreamBody::new(futures_util::stream::iter(frames));
            let out = substituted(inner, &[&s])
                .collect()
                .await
                .unwrap()
                .to_bytes();
            assert_eq!(
                &out[..],
                b"a=the-real-value&b=the-real-value&c=PLACEHOLDE",
                "split at {split}"
            );
        }
    }

    #[test]
    fn placeholders_toward_other_hosts_are_named() {
        let a = secret("PLACEHOLDER-A", "1");
        let mut b = secret("PLACEHOLDER-B", "2");
        b.env = "B_TOKEN".to_owned();
        let texts: [&[u8]; 2] = [b"/path?x=1", b"Bearer PLACEHOLDER-B"];
        assert_eq!(
            unbound_placeholders(&[&a, &b], texts.iter().copied()),
            vec!["B_TOKEN".to_owned()]
        );
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
