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
//!
//! What keeps the real value from coming back in responses, or going out toward other
//! hosts, is in [`crate::scrub`].

use crate::config::Secret;

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
    fn several_secrets_apply_in_turn() {
        let a = secret("PLACEHOLDER-A", "1");
        let b = secret("PLACEHOLDER-B", "2");
        assert_eq!(
            substitute_bytes(b"PLACEHOLDER-A:PLACEHOLDER-B", &[&a, &b]).as_deref(),
            Some(&b"1:2"[..])
        );
    }
}
