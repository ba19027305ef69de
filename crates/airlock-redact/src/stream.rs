//! Redaction of text that arrives in pieces (reads of a pipe), without missing a secret that
//! straddles two pieces.
//!
//! The stream keeps the text not yet emitted (`pending`), plus up to
//! [`STREAM_CONTEXT_BYTES`] of already emitted text as left context for the regexes. Once
//! `pending` is long enough it is scanned, and everything but the last
//! [`STREAM_HOLDBACK_BYTES`] is emitted, redacted. The cut never falls inside a match: a
//! match that crosses it is emitted whole when it ends well before the end of `pending`, and
//! is held back from its start when it runs (nearly) to the end, because it may go on in the
//! next piece.
//!
//! Two kinds of rules make this complete:
//! - **bounded** rules match at most [`STREAM_HOLDBACK_BYTES`] bytes (a test checks every
//!   built-in one), so a secret that starts before the cut is wholly in `pending`;
//! - **unbounded** rules (private-key blocks, JWTs, bearer tokens, ...) match every long
//!   enough prefix of their secret up to its end (a test checks that too), so a secret that is
//!   still going on at the end of `pending` is seen as an open match and held back.
//!
//! An open match is held back up to [`STREAM_MAX_PENDING_BYTES`]; past that, the pending text
//! is emitted with the match redacted so far, and the head of the match (its first
//! [`STREAM_CONTEXT_BYTES`]) becomes the left context of the next scan, so that the rest of the
//! secret still matches as its continuation and is redacted too (one marker per release). A
//! PEM private key is at most a few KiB (RSA-8192 is about 6.5 KiB), far below the bound; the
//! release exists so that hostile output cannot make the stream buffer without limit.

use crate::redactor::Redactor;
use crate::span::{ceil_char_boundary, floor_char_boundary};

/// Text held back at the end of a stream between pushes, in bytes: at least the longest
/// match of a bounded rule and the longest exact value (both enforced).
pub const STREAM_HOLDBACK_BYTES: usize = 4096;

/// How much pending text beyond the holdback a scan waits for. Each scan covers at most
/// about `STREAM_HOLDBACK_BYTES + STREAM_SCAN_STEP_BYTES` bytes and emits at least
/// `STREAM_SCAN_STEP_BYTES` of them, so every byte is scanned a bounded number of times
/// however small the pushes are.
pub const STREAM_SCAN_STEP_BYTES: usize = 4096;

/// Already-emitted text kept as left context (for `\b` and similar), in bytes.
pub const STREAM_CONTEXT_BYTES: usize = 256;

/// The most text an open (unbounded) match may hold back, in bytes.
pub const STREAM_MAX_PENDING_BYTES: usize = 64 * 1024;

/// A match ending this close to the end of pending text may still grow. Longer than a PEM
/// END line, so a key block cut inside its END line is still treated as open.
pub const STREAM_TAIL_MARGIN_BYTES: usize = 256;

/// Redacts a stream of text chunks; built by [`Redactor::stream`].
///
/// ```
/// # use airlock_redact::Redactor;
/// let redactor = Redactor::builtin().unwrap();
/// let mut stream = redactor.stream();
/// let mut out = stream.push("token: ghp_JIGA9HK2gOCZPe");
/// out += &stream.push("JMQW9cy78kyEk2FINMdB8F\n");
/// out += &stream.finish();
/// assert_eq!(out, "token: [REDACTED:github-pat]\n");
/// assert_eq!(stream.count(), 1);
/// ```
#[derive(Debug)]
pub struct StreamRedactor<'a> {
    redactor: &'a Redactor,
    /// `buf[..context]` was emitted already; `buf[context..]` is pending.
    buf: String,
    context: usize,
    /// Pending length at which the next scan runs.
    scan_at: usize,
    counts: Vec<u64>,
}

impl<'a> StreamRedactor<'a> {
    pub(crate) fn new(redactor: &'a Redactor) -> Self {
        Self {
            redactor,
            buf: String::new(),
            context: 0,
            scan_at: STREAM_HOLDBACK_BYTES + STREAM_SCAN_STEP_BYTES,
            counts: vec![0; redactor.label_count()],
        }
    }

    /// Appends a chunk and returns the text that is safe to emit now, redacted. It may be
    /// empty: the last [`STREAM_HOLDBACK_BYTES`] (more while a match is open) wait for the
    /// next chunk or [`finish`](Self::finish).
    pub fn push(&mut self, chunk: &str) -> String {
        self.buf.push_str(chunk);
        if self.pending() < self.scan_at {
            return String::new();
        }
        self.scan(false)
    }

    /// Emits everything still held back, redacted. The stream is then empty: [`count`] and
    /// [`by_rule`] keep the totals of the whole stream, and a later [`push`] starts a new,
    /// independent text.
    ///
    /// [`count`]: Self::count
    /// [`by_rule`]: Self::by_rule
    /// [`push`]: Self::push
    pub fn finish(&mut self) -> String {
        let out = self.scan(true);
        self.buf.clear();
        self.context = 0;
        self.scan_at = STREAM_HOLDBACK_BYTES + STREAM_SCAN_STEP_BYTES;
        out
    }

    /// Emits what can be emitted now although no more text has arrived for a while (a job
    /// that prints a line, then works): pending text up to its last whitespace, never cutting
    /// into a match and holding back any match that may still be going on. A token cut short
    /// by the pause has no whitespace after it, so it stays held back until it is complete.
    pub fn flush_idle(&mut self) -> String {
        if self.pending() == 0 {
            return String::new();
        }
        let Some(last_space) = self.buf[self.context..].rfind(|c: char| c.is_ascii_whitespace())
        else {
            return String::new();
        };
        let len = self.buf.len();
        let mut cut = self.context + last_space + 1;
        let scan = self.redactor.scan(self.buf.as_bytes(), None);
        // Move the cut before every match it would split, and before any match that reaches
        // the end of the text (it may go on: an unbounded rule's secret, such as a key block
        // whose END line has not arrived, matches as far as the text goes), until it settles.
        // A match that ends before the cut is followed by whitespace, so it is complete.
        loop {
            let moved = scan
                .candidates
                .iter()
                .filter(|c| c.whole.start < cut && (c.whole.end > cut || c.whole.end >= len))
                .map(|c| c.whole.start)
                .min();
            match moved {
                Some(start) if start < cut => cut = start,
                _ => break,
            }
        }
        let cut = floor_char_boundary(&self.buf, cut.max(self.context));
        if cut <= self.context {
            return String::new();
        }
        self.emit_to(
            Cut {
                at: cut,
                released_open_match: None,
            },
            scan,
        )
    }

    /// Markers emitted so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Markers emitted so far, per rule id; only ids that fired.
    pub fn by_rule(&self) -> std::collections::BTreeMap<String, u64> {
        self.redactor
            .finish_counts(String::new(), &self.counts)
            .by_rule
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.context
    }

    /// Scans the buffer and emits what is safe (everything when `all`).
    fn scan(&mut self, all: bool) -> String {
        if self.pending() == 0 {
            return String::new();
        }
        let scan = self.redactor.scan(self.buf.as_bytes(), None);
        let cut = if all {
            Cut {
                at: self.buf.len(),
                released_open_match: None,
            }
        } else {
            self.choose_cut(&scan.candidates)
        };
        self.emit_to(cut, scan)
    }

    /// Emits the pending text before `cut`, redacted, and keeps the rest (with context).
    fn emit_to(&mut self, cut: Cut, scan: crate::redactor::Scan) -> String {
        let out = if cut.at > self.context {
            let out = self.redactor.redact_region(
                &self.buf,
                self.context..cut.at,
                Some(scan),
                &mut self.counts,
            );
            // The next scan sees, before the pending text, the end of what was emitted; or,
            // after releasing an open match, the head of that match, so that the rest of it
            // still matches as its continuation.
            let context = match cut.released_open_match {
                Some(start) => start..floor_char_boundary(&self.buf, start + STREAM_CONTEXT_BYTES),
                None => {
                    floor_char_boundary(&self.buf, cut.at.saturating_sub(STREAM_CONTEXT_BYTES))
                        ..cut.at
                }
            };
            let mut next = String::with_capacity(context.len() + self.buf.len() - cut.at);
            next.push_str(&self.buf[context.clone()]);
            next.push_str(&self.buf[cut.at..]);
            self.buf = next;
            self.context = context.len();
            out
        } else {
            String::new()
        };
        self.scan_at = (self.pending() + STREAM_SCAN_STEP_BYTES)
            .max(STREAM_HOLDBACK_BYTES + STREAM_SCAN_STEP_BYTES);
        out
    }

    /// Where to cut: [`STREAM_HOLDBACK_BYTES`] before the end, moved out of any match.
    fn choose_cut(&self, candidates: &[crate::rules::Candidate]) -> Cut {
        let len = self.buf.len();
        let cut = floor_char_boundary(&self.buf, len.saturating_sub(STREAM_HOLDBACK_BYTES));
        // The group of overlapping matches that contains the cut, if any.
        let mut ranges: Vec<(usize, usize)> = candidates
            .iter()
            .map(|c| (c.whole.start, c.whole.end))
            .collect();
        ranges.sort_unstable();
        let mut group: Option<(usize, usize)> = None;
        for (start, end) in ranges {
            match group {
                Some((g_start, g_end)) if start < g_end => group = Some((g_start, g_end.max(end))),
                _ => {
                    if group.is_some_and(|(g_start, g_end)| g_start < cut && cut < g_end) {
                        break;
                    }
                    if start >= cut {
                        group = None;
                        break;
                    }
                    group = Some((start, end));
                }
            }
        }
        let at = |at| Cut {
            at,
            released_open_match: None,
        };
        let Some((start, end)) = group.filter(|g| g.0 < cut && cut < g.1) else {
            return at(cut);
        };
        if end + STREAM_TAIL_MARGIN_BYTES <= len {
            // Complete: emit it whole.
            return at(ceil_char_boundary(&self.buf, end));
        }
        let start = floor_char_boundary(&self.buf, start);
        if start > self.context {
            // Open: hold it back from its start.
            return at(start);
        }
        if self.pending() >= STREAM_MAX_PENDING_BYTES {
            // Open for too long: emit it as it is, and keep its head as context.
            return Cut {
                at: len,
                released_open_match: Some(start),
            };
        }
        at(self.context)
    }
}

/// Where a scan cuts the buffer.
struct Cut {
    /// Everything before is emitted.
    at: usize,
    /// Set when an open match is emitted before its end: where it starts.
    released_open_match: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const GHP: &str = "ghp_JIGA9HK2gOCZPeJMQW9cy78kyEk2FINMdB8F";

    fn noise(len: usize) -> String {
        let line = "step 17: loss=0.4213 acc=0.871 elapsed=12.5s\n";
        line.repeat(len / line.len() + 1)[..len].to_owned()
    }

    fn run(redactor: &Redactor, chunks: &[&str]) -> (String, u64) {
        let mut s = redactor.stream();
        let mut out = String::new();
        for c in chunks {
            out += &s.push(c);
        }
        out += &s.finish();
        (out, s.count())
    }

    #[test]
    fn idle_flush_emits_whole_lines_but_holds_an_unfinished_token() {
        let r = Redactor::builtin().unwrap();
        let mut s = r.stream();
        assert_eq!(s.push("step 1 done\ntoken: ghp_JIGA9HK2"), "");
        assert_eq!(s.flush_idle(), "step 1 done\ntoken: ");
        assert_eq!(s.push("gOCZPeJMQW9cy78kyEk2FINMdB8F\nnext"), "");
        assert_eq!(s.flush_idle(), "[REDACTED:github-pat]\n");
        assert_eq!(s.finish(), "next");
        assert_eq!(s.count(), 1);
    }

    #[test]
    fn idle_flush_keeps_context_for_a_secret_that_follows_its_label() {
        let r = Redactor::builtin().unwrap();
        let mut s = r.stream();
        let mut out = s.push("aws_secret_access_key = ");
        out += &s.flush_idle();
        out += &s.push("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n");
        out += &s.flush_idle();
        out += &s.finish();
        assert!(!out.contains("wJalrXUtnFEMI"), "{out}");
    }

    #[test]
    fn idle_flush_holds_an_open_private_key_block() {
        let r = Redactor::builtin().unwrap();
        let mut s = r.stream();
        let head = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAJ9BvVvLsPHXvabshwfXd8bxP6YN5igcX3jeP2GLGpI\n";
        let out = s.push(head) + &s.flush_idle();
        assert!(!out.contains("MIIEp"), "{out:?}");
        let rest = s.push("/A7s3aEcu6t7E\n-----END RSA PRIVATE KEY-----\n") + &s.finish();
        assert!(!rest.contains("MIIEp") && !rest.contains("A7s3"), "{rest}");
    }

    #[test]
    fn small_pushes_emit_nothing_until_finish() {
        let r = Redactor::builtin().unwrap();
        let mut s = r.stream();
        assert_eq!(s.push("hello "), "");
        assert_eq!(s.push(GHP), "");
        assert_eq!(s.finish(), "hello [REDACTED:github-pat]");
        assert_eq!(s.count(), 1);
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn long_streams_emit_as_they_go_and_keep_the_holdback() {
        let r = Redactor::builtin().unwrap();
        let mut s = r.stream();
        let text = noise(3 * STREAM_HOLDBACK_BYTES);
        let emitted = s.push(&text);
        assert!(!emitted.is_empty());
        assert_eq!(text.len() - emitted.len(), STREAM_HOLDBACK_BYTES);
        assert_eq!(emitted + &s.finish(), text);
    }

    #[test]
    fn a_secret_across_the_cut_is_emitted_whole() {
        let r = Redactor::builtin().unwrap();
        // Put the token right where the cut falls.
        for shift in 0..GHP.len() + 2 {
            let before = noise(STREAM_HOLDBACK_BYTES + STREAM_SCAN_STEP_BYTES - shift);
            let text = format!(
                "{before}{GHP}\n{}",
                noise(STREAM_HOLDBACK_BYTES - GHP.len() + shift)
            );
            let (out, count) = run(&r, &[&text]);
            assert_eq!(out, r.redact(&text).text, "shift {shift}");
            assert_eq!(count, 1);
        }
    }

    #[test]
    fn an_open_match_is_held_back_until_it_ends() {
        let r = Redactor::builtin().unwrap();
        let jwt_head = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0";
        let long = "A".repeat(3 * STREAM_HOLDBACK_BYTES);
        let text = format!("x {jwt_head}{long} y\n");
        let mut s = r.stream();
        let first = s.push(&format!("x {jwt_head}"));
        let second = s.push(&long);
        assert_eq!(first + &second, "x ");
        let rest = s.push(" y\n") + &s.finish();
        assert_eq!(format!("x {rest}"), r.redact(&text).text);
        assert_eq!(rest, "[REDACTED:jwt] y\n");
    }

    /// Letters and digits from a xorshift generator: high entropy, no keyword by chance
    /// (tests check the output).
    fn random_token(len: usize, mut seed: u64) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                char::from(ALPHABET[(seed % 62) as usize])
            })
            .collect()
    }

    #[test]
    fn an_open_match_is_released_at_the_pending_bound() {
        let r = Redactor::builtin().unwrap();
        let mut s = r.stream();
        let mut out = s.push("Authorization: Bearer ");
        let token = random_token(STREAM_MAX_PENDING_BYTES + 3 * STREAM_SCAN_STEP_BYTES, 7);
        let mut most_pending = 0;
        for piece in token.as_bytes().chunks(1000) {
            out += &s.push(std::str::from_utf8(piece).unwrap());
            most_pending = most_pending.max(s.pending());
        }
        out += &s.finish();
        assert!(most_pending <= STREAM_MAX_PENDING_BYTES + STREAM_SCAN_STEP_BYTES);
        // Released once or more, and the continuation is redacted too.
        assert!(s.count() >= 2, "{}", s.count());
        let rest = out.strip_prefix("Authorization: Bearer ").unwrap();
        assert_eq!(rest.replace("[REDACTED:bearer-token]", ""), "");
    }

    #[test]
    fn one_byte_pushes_match_the_whole_text() {
        let r = Redactor::builtin().unwrap();
        let text = format!(
            "{}\nkey {GHP}\n{}\npostgres://u:Wq9x2LmP4vR8tZ@db/x\n{}",
            noise(5000),
            noise(7000),
            noise(300)
        );
        let mut s = r.stream();
        let mut out = String::new();
        let mut buf = [0u8; 4];
        for c in text.chars() {
            out += &s.push(c.encode_utf8(&mut buf));
        }
        out += &s.finish();
        assert_eq!(out, r.redact(&text).text);
        assert_eq!(s.count(), 2);
        assert_eq!(
            s.by_rule().into_iter().collect::<Vec<_>>(),
            vec![
                ("connection-string-password".to_owned(), 1),
                ("github-pat".to_owned(), 1)
            ]
        );
    }
}
