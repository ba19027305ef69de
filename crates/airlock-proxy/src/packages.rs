//! Reviewed package indexes (`[network.packages]`): the hosts an index links to for its
//! files are allowed as it names them.
//!
//! A simple repository page (PEP 503 HTML) links to each file with `href="URL"`; its JSON
//! form (PEP 691) and npm's package documents give it as `"url": "URL"` and
//! `"tarball": "URL"`. The proxy reads the index's answers as they stream to the job
//! (decoded, [`crate::decode`]) and, for each such link that is an absolute `https://`
//! URL, allows its `host:port` for the rest of the job ([`FILE_HOSTS_MAX`] at most).
//! Other URLs in a page (a project's homepage, its repository) are not links to files
//! and allow nothing; relative links stay on the index's own host; `http://` links are
//! never allowed. The index is trusted to name its own file hosts: that is what
//! reviewing it means.
//!
//! [`FILE_HOSTS_MAX`]: crate::state::FILE_HOSTS_MAX

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::host::TargetHost;
use crate::state::Shared;

/// The keys that introduce a link to a file, each followed (after spaces, and a `:` in
/// JSON) by a quoted URL.
const LINK_KEYS: [&[u8]; 3] = [b"href=", b"\"url\"", b"\"tarball\""];

/// Bytes kept back between reads so that a link split across them is still found: a key,
/// spaces, a quote, `https://` and the longest authority (253 bytes of name, a port).
const HOLD_BYTES: usize = 512;

/// Reads a link's `host:port` at the start of `input` (the bytes after a key); `None`
/// when it is not a quoted absolute `https://` URL with a usable host.
fn link_at(input: &[u8]) -> Option<(TargetHost, u16)> {
    let mut i = 0;
    let skip_spaces = |i: &mut usize| {
        while input.get(*i).is_some_and(|b| b.is_ascii_whitespace()) {
            *i += 1;
        }
    };
    skip_spaces(&mut i);
    if input.get(i) == Some(&b':') {
        i += 1;
        skip_spaces(&mut i);
    }
    if !matches!(input.get(i), Some(b'"' | b'\'')) {
        return None;
    }
    i += 1;
    let rest = input.get(i..)?;
    let scheme = b"https://";
    if rest.len() < scheme.len() || !rest[..scheme.len()].eq_ignore_ascii_case(scheme) {
        return None;
    }
    let rest = &rest[scheme.len()..];
    let end = rest.iter().position(|b| {
        matches!(b, b'/' | b'"' | b'\'' | b'?' | b'#' | b'\\') || b.is_ascii_whitespace()
    })?;
    let authority = std::str::from_utf8(&rest[..end]).ok()?;
    if authority.contains('@') {
        return None;
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(']') || host.ends_with(']') => {
            (host, port.parse::<u16>().ok().filter(|p| *p != 0)?)
        }
        _ => (authority, 443),
    };
    let host = TargetHost::parse(host).ok()?;
    Some((host, port))
}

/// Every link's `host:port` that starts before `limit` in `input`, and how far the scan
/// got (a link starting before `limit` must lie whole in `input`: a stream holds
/// [`HOLD_BYTES`] back).
fn scan(input: &[u8], limit: usize) -> (Vec<(TargetHost, u16)>, usize) {
    let mut found = Vec::new();
    let end = limit.min(input.len());
    for i in 0..end {
        for key in LINK_KEYS {
            let rest = &input[i..];
            if rest.len() >= key.len()
                && rest[..key.len()].eq_ignore_ascii_case(key)
                && let Some(link) = link_at(&rest[key.len()..])
                && !found.contains(&link)
            {
                found.push(link);
            }
        }
    }
    (found, end)
}

/// An index's answer, passed on unchanged while the links in it are read.
pub(crate) struct LinkScanner<B> {
    inner: B,
    shared: Arc<Shared>,
    /// The last bytes seen, kept for a link split across reads.
    carry: Vec<u8>,
    /// Set once the inner body has ended (and the carry was scanned).
    ended: bool,
}

impl<B> LinkScanner<B> {
    pub(crate) fn new(inner: B, shared: Arc<Shared>) -> Self {
        Self {
            inner,
            shared,
            carry: Vec::new(),
            ended: false,
        }
    }

    /// Scans what was held back, once.
    fn finish(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        let rest = std::mem::take(&mut self.carry);
        let (links, _) = scan(&rest, rest.len());
        self.learn(links);
    }

    fn learn(&self, links: Vec<(TargetHost, u16)>) {
        for (host, port) in links {
            if !self.shared.learn_file_host(host.clone(), port) {
                tracing::warn!(%host, port, "a package index named more file hosts than allowed");
            }
        }
    }
}

impl<B> Body for LinkScanner<B>
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
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.carry.extend_from_slice(data);
                    let limit = this.carry.len().saturating_sub(HOLD_BYTES);
                    let (links, used) = scan(&this.carry, limit);
                    this.carry.drain(..used);
                    this.learn(links);
                }
                // A body of known length may not be polled again once it says so, and the
                // job may ask for a file before it would be: the rest is read now.
                if this.inner.is_end_stream() {
                    this.finish();
                }
            }
            Poll::Ready(None) => this.finish(),
            Poll::Ready(Some(Err(_))) | Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        // Not the inner body's: polled to its end, the held-back bytes get scanned.
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        // The length holds, but a known length lets hyper stop before the end.
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(page: &str) -> Vec<String> {
        scan(page.as_bytes(), page.len())
            .0
            .into_iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect()
    }

    #[test]
    fn links_to_files_are_read_and_nothing_else() {
        let html = r#"<a href="https://files.pythonhosted.org/packages/a/b/six-1.16.0-py2.py3-none-any.whl#sha256=ab">six</a>
<a HREF='https://Mirror.test:8443/x.tar.gz'>x</a>
<a href="../../packages/y.whl">y</a>
<a href="http://plain.test/z.whl">z</a>
<a href="https://user@evil.test/z.whl">z</a>"#;
        assert_eq!(
            hosts(html),
            vec!["files.pythonhosted.org:443", "mirror.test:8443"]
        );
        let json = r#"{"files": [{"url": "https://files.test/a.whl", "hashes": {}}],
            "homepage": "https://github.com/x/y", "dist": {"tarball":"https://registry.test/p/-/p-1.0.0.tgz"}}"#;
        assert_eq!(hosts(json), vec!["files.test:443", "registry.test:443"]);
        assert!(hosts(r#"<a href="https://2130706433/x">"#).is_empty());
    }

    #[test]
    fn a_link_split_across_reads_is_found() {
        let page = format!(
            "{}<a href=\"https://files.test/a.whl\">a</a>",
            "x".repeat(1000)
        );
        for split in [1000, 1005, 1015, 1025] {
            let mut carry = page.as_bytes()[..split].to_vec();
            let limit = carry.len().saturating_sub(HOLD_BYTES);
            let (mut links, used) = scan(&carry, limit);
            carry.drain(..used);
            carry.extend_from_slice(&page.as_bytes()[split..]);
            links.extend(scan(&carry, carry.len()).0);
            assert_eq!(links.len(), 1, "split at {split}");
        }
    }
}
