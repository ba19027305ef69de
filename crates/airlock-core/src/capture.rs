//! Bounded output capture (DESIGN S7): keep the first N bytes of a stream, count the rest,
//! and render what was kept as text that is safe to show a terminal or a model.

/// Bytes kept beyond a stream's cap so that a secret straddling the cap is still seen whole
/// by redaction; they are never shown.
pub const REDACTION_LOOKAHEAD_BYTES: usize = 4096;

/// Keeps the first `cap` bytes of a stream (plus [`REDACTION_LOOKAHEAD_BYTES`] that only
/// redaction looks at) and counts every byte seen.
///
/// Memory use is bounded by `cap` plus the lookahead whatever the stream's length.
#[derive(Debug, Clone)]
pub struct BoundedCapture {
    kept: Vec<u8>,
    cap: usize,
    total: u64,
}

impl BoundedCapture {
    /// A capture that shows the first `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self {
            kept: Vec::with_capacity(cap.saturating_add(REDACTION_LOOKAHEAD_BYTES).min(64 * 1024)),
            cap,
            total: 0,
        }
    }

    /// How many bytes are kept in all (the cap plus the lookahead).
    pub fn keep(&self) -> usize {
        self.cap.saturating_add(REDACTION_LOOKAHEAD_BYTES)
    }

    /// Records a chunk of the stream.
    pub fn push(&mut self, chunk: &[u8]) {
        self.total = self.total.saturating_add(chunk.len() as u64);
        let room = self.keep().saturating_sub(self.kept.len());
        if room > 0 {
            let take = room.min(chunk.len());
            self.kept.extend_from_slice(&chunk[..take]);
        }
    }

    /// Bytes seen so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The result.
    pub fn finish(self) -> CapturedOutput {
        CapturedOutput {
            truncated: self.total > self.cap as u64,
            kept: self.kept,
            total_bytes: self.total,
            cap: self.cap,
        }
    }
}

/// What a [`BoundedCapture`] kept of one stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapturedOutput {
    /// The first bytes of the stream: up to `cap`, plus the redaction lookahead.
    pub kept: Vec<u8>,
    /// Every byte the stream produced.
    pub total_bytes: u64,
    /// Whether the stream was longer than `cap`.
    pub truncated: bool,
    /// How many bytes are shown.
    pub cap: usize,
}

impl CapturedOutput {
    /// A capture of exactly these bytes, none dropped (tests, fakes).
    pub fn whole(bytes: &[u8]) -> Self {
        Self {
            kept: bytes.to_vec(),
            total_bytes: bytes.len() as u64,
            truncated: false,
            cap: bytes.len(),
        }
    }

    /// Everything kept, rendered: what redaction of this stream sees, and the context
    /// the other stream is redacted in.
    pub fn rendered(&self) -> String {
        render_text(&self.kept, self.total_bytes > self.kept.len() as u64)
    }

    /// The text shown for this stream: rendered, redacted (with the lookahead, so a secret
    /// at the cap is recognised whole), then cut to at most `cap` bytes of delivered text
    /// (escapes and markers count as what they are on the wire), never inside a redaction
    /// marker, an escape or a character.
    pub fn render_redacted(&self, redact: &dyn Fn(String) -> (String, u64)) -> RenderedStream {
        self.render_redacted_from(self.rendered(), redact)
    }

    /// [`CapturedOutput::render_redacted`] for a caller that already holds
    /// [`CapturedOutput::rendered`].
    pub fn render_redacted_from(
        &self,
        rendered: String,
        redact: &dyn Fn(String) -> (String, u64),
    ) -> RenderedStream {
        let (redacted, redactions) = redact(rendered);
        // Never past what the first `cap` raw bytes render to, however redaction shrank
        // the text: the lookahead is for recognising secrets, not for showing more.
        let raw_end = if self.kept.len() > self.cap {
            render_text(&self.kept[..self.cap], true).len()
        } else {
            redacted.len()
        };
        let cut = cut_at_most(&redacted, raw_end.min(self.cap));
        RenderedStream {
            truncated: self.truncated || cut < redacted.len(),
            text: redacted[..cut].to_owned(),
            redactions,
        }
    }
}

/// One stream as the observation shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedStream {
    /// The text, at most the cap in bytes.
    pub text: String,
    /// Secrets replaced in it (also those in the lookahead past the cut).
    pub redactions: u64,
    /// Whether anything of the stream is missing from `text`: bytes past the cap, or
    /// rendered text that escaping made longer than the cap.
    pub truncated: bool,
}

/// The last and the first [`REDACTION_LOOKAHEAD_BYTES`] of `text` (at character
/// boundaries): all of another stream a secret split across the two can reach into.
pub fn context_window(text: &str) -> (&str, &str) {
    let mut tail = text.len().saturating_sub(REDACTION_LOOKAHEAD_BYTES);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    let mut head = REDACTION_LOOKAHEAD_BYTES.min(text.len());
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    (&text[tail..], &text[..head])
}

/// The marker redaction leaves behind, up to the rule's name.
pub const REDACTION_MARKER_PREFIX: &str = "[REDACTED:";

/// The longest escape [`render_text`] writes (`\u{9f}`).
const LONGEST_ESCAPE_BYTES: usize = 6;

/// A cut position at most `at` (and at most the text's length) that is a character
/// boundary and not inside a redaction marker or an escape: a cut there drops the whole
/// marker or escape rather than showing part of it.
pub fn cut_at_most(text: &str, at: usize) -> usize {
    if at >= text.len() {
        return text.len();
    }
    let mut cut = at;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    // A marker that starts before the cut and ends after it.
    if let Some(start) = text[..cut].rfind(REDACTION_MARKER_PREFIX)
        && text[start..].find(']').is_none_or(|end| start + end >= cut)
    {
        cut = start;
    } else if let Some(partial) = (1..REDACTION_MARKER_PREFIX.len())
        .filter(|&n| n <= cut)
        .find(|&n| {
            text[..cut].ends_with(&REDACTION_MARKER_PREFIX[..n])
                && text[cut - n..].starts_with(REDACTION_MARKER_PREFIX)
        })
    {
        cut -= partial;
    }
    // An escape that starts before the cut and ends after it.
    let from = cut.saturating_sub(LONGEST_ESCAPE_BYTES - 1);
    for start in from..cut {
        if text.as_bytes()[start] == b'\\'
            && let Some(len) = escape_len(&text.as_bytes()[start..])
            && start + len > cut
        {
            cut = start;
            break;
        }
    }
    cut
}

/// The length of the escape [`render_text`] writes that `bytes` starts with, if any.
fn escape_len(bytes: &[u8]) -> Option<usize> {
    let hex = |b: &u8| b.is_ascii_hexdigit();
    match bytes {
        [b'\\', b'x', a, b, ..] if hex(a) && hex(b) => Some(4),
        [b'\\', b'u', b'{', a, b, b'}', ..] if hex(a) && hex(b) => Some(6),
        _ => None,
    }
}

/// Renders captured bytes as text that cannot drive a terminal.
///
/// `\n` and `\t` pass through. Other C0 controls, DEL and invalid UTF-8 bytes become
/// `\xHH`; C1 controls (U+0080..U+009F, which terminals also obey) become `\u{HH}`. When the
/// capture was truncated in the middle of a UTF-8 sequence, the incomplete tail is dropped
/// (the `truncated` flag already says bytes are missing).
pub fn render_text(bytes: &[u8], truncated: bool) -> String {
    let mut out = String::with_capacity(bytes.len());
    let mut chunks = bytes.utf8_chunks().peekable();
    while let Some(chunk) = chunks.next() {
        for c in chunk.valid().chars() {
            match c {
                '\n' | '\t' => out.push(c),
                c if (c as u32) < 0x20 || c == '\u{7f}' => {
                    out.push_str(&format!("\\x{:02x}", c as u32));
                }
                c if (0x80..=0x9f).contains(&(c as u32)) => {
                    out.push_str(&format!("\\u{{{:02x}}}", c as u32));
                }
                c => out.push(c),
            }
        }
        let invalid = chunk.invalid();
        let is_cut_tail = truncated && chunks.peek().is_none() && is_incomplete_tail(invalid);
        if !is_cut_tail {
            for b in invalid {
                out.push_str(&format!("\\x{b:02x}"));
            }
        }
    }
    out
}

/// Renders a stream chunk by chunk with [`render_text`]'s escaping, holding back an
/// incomplete UTF-8 sequence at the end of a chunk until the next one completes it.
#[derive(Debug, Default)]
pub struct StreamRenderer {
    pending: Vec<u8>,
}

impl StreamRenderer {
    /// Renders what can be rendered of `chunk` now.
    pub fn push(&mut self, chunk: &[u8]) -> String {
        self.pending.extend_from_slice(chunk);
        let cut = incomplete_tail_start(&self.pending);
        let rest = self.pending.split_off(cut);
        let text = render_text(&self.pending, false);
        self.pending = rest;
        text
    }

    /// Renders whatever is held back (an unfinished sequence shows escaped).
    pub fn finish(self) -> String {
        render_text(&self.pending, false)
    }
}

/// Where a trailing incomplete UTF-8 sequence starts (`bytes.len()` when there is none).
fn incomplete_tail_start(bytes: &[u8]) -> usize {
    let from = bytes.len().saturating_sub(3);
    for start in (from..bytes.len()).rev() {
        if (0xc2..=0xf4).contains(&bytes[start]) {
            return if is_incomplete_tail(&bytes[start..]) {
                start
            } else {
                bytes.len()
            };
        }
        if !(0x80..=0xbf).contains(&bytes[start]) {
            break;
        }
    }
    bytes.len()
}

/// True when `bytes` is the start of a multi-byte UTF-8 sequence that was cut short.
fn is_incomplete_tail(bytes: &[u8]) -> bool {
    if bytes.is_empty() {
        return false;
    }
    let need = match bytes[0] {
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => return false,
    };
    bytes.len() < need && bytes[1..].iter().all(|b| (0x80..=0xbf).contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn capture_keeps_the_head_and_counts_the_rest() {
        let mut c = BoundedCapture::new(5);
        c.push(b"hel");
        c.push(b"lo world");
        c.push(b"!");
        assert_eq!(c.total(), 12);
        let out = c.finish();
        // The lookahead keeps more than the cap, but only the cap is shown.
        assert_eq!(out.kept, b"hello world!");
        assert_eq!(out.total_bytes, 12);
        assert!(out.truncated);
        assert_eq!(out.render_redacted(&|t| (t, 0)).text, "hello");
    }

    #[test]
    fn capture_memory_is_bounded_by_cap_and_lookahead() {
        let mut c = BoundedCapture::new(10);
        for _ in 0..1000 {
            c.push(&[b'x'; 1000]);
        }
        let out = c.finish();
        assert_eq!(out.kept.len(), 10 + REDACTION_LOOKAHEAD_BYTES);
        assert_eq!(out.total_bytes, 1_000_000);
    }

    #[test]
    fn a_secret_straddling_the_cap_is_redacted_whole() {
        let text = format!("{}SECRET-TOKEN-123 more", "a".repeat(10));
        let mut c = BoundedCapture::new(14);
        c.push(text.as_bytes());
        let out = c.finish();
        let redact = |t: String| {
            let n = t.matches("SECRET-TOKEN-123").count() as u64;
            (t.replace("SECRET-TOKEN-123", "[REDACTED:test]"), n)
        };
        let shown = out.render_redacted(&redact);
        // The marker would pass the cap, so it is dropped whole; the secret never shows.
        assert_eq!(shown.text, "aaaaaaaaaa");
        assert_eq!(shown.redactions, 1);
        assert!(shown.truncated);
        let mut c = BoundedCapture::new(30);
        c.push(text.as_bytes());
        let shown = c.finish().render_redacted(&redact);
        assert_eq!(shown.text, "aaaaaaaaaa[REDACTED:test] more");
    }

    #[test]
    fn cut_at_most_never_splits_a_marker_an_escape_or_a_character() {
        assert_eq!(cut_at_most("ab[REDACTED:x]cd", 4), 2);
        assert_eq!(cut_at_most("ab[REDACTED:x]cd", 14), 14);
        assert_eq!(cut_at_most("ab[REDACTED:x]cd", 15), 15);
        assert_eq!(cut_at_most("a✓b", 2), 1);
        assert_eq!(cut_at_most("abc", 10), 3);
        assert_eq!(cut_at_most("a\\xffb", 3), 1);
        assert_eq!(cut_at_most("a\\xffb", 5), 5);
        assert_eq!(cut_at_most("a\\u{9b}", 6), 1);
    }

    #[test]
    fn escaping_never_delivers_more_than_the_cap() {
        // 9,000 bytes of \xff used to deliver 31,919 bytes against a cap of 8,000.
        let mut c = BoundedCapture::new(8000);
        c.push(&[0xff; 9000]);
        let shown = c.finish().render_redacted(&|t| (t, 0));
        assert!(shown.text.len() <= 8000, "{}", shown.text.len());
        assert_eq!(shown.text.len(), 8000);
        assert!(shown.truncated);
        // Within the cap in raw bytes, but not once escaped: still truncated, honestly.
        let mut c = BoundedCapture::new(2000);
        c.push(&[0x01; 1000]);
        let out = c.finish();
        assert!(!out.truncated);
        let shown = out.render_redacted(&|t| (t, 0));
        assert_eq!(shown.text.len(), 2000);
        assert!(shown.truncated);
    }

    #[test]
    fn context_windows_are_the_tail_and_head_at_character_boundaries() {
        assert_eq!(context_window("short"), ("short", "short"));
        let long = format!(
            "{}✓{}",
            "a".repeat(REDACTION_LOOKAHEAD_BYTES - 1),
            "b".repeat(REDACTION_LOOKAHEAD_BYTES)
        );
        let (tail, head) = context_window(&long);
        assert_eq!(tail, "b".repeat(REDACTION_LOOKAHEAD_BYTES));
        assert_eq!(head, "a".repeat(REDACTION_LOOKAHEAD_BYTES - 1));
    }

    #[test]
    fn capture_of_exactly_the_limit_is_not_truncated() {
        let mut c = BoundedCapture::new(5);
        c.push(b"hello");
        let out = c.finish();
        assert!(!out.truncated);
    }

    #[test]
    fn zero_cap_shows_nothing() {
        let mut c = BoundedCapture::new(0);
        c.push(b"abc");
        let out = c.finish();
        assert!(out.truncated);
        assert_eq!(out.render_redacted(&|t| (t, 0)).text, "");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(render_text(b"a\tb\nc", false), "a\tb\nc");
        assert_eq!(
            render_text(b"\x1b[31mred\x07\x08\r", false),
            "\\x1b[31mred\\x07\\x08\\x0d"
        );
        assert_eq!(render_text(b"\x7f", false), "\\x7f");
        assert_eq!(render_text("\u{9b}2J".as_bytes(), false), "\\u{9b}2J");
        assert_eq!(render_text("héllo ✓".as_bytes(), false), "héllo ✓");
    }

    #[test]
    fn invalid_utf8_is_shown_not_dropped() {
        assert_eq!(render_text(b"a\xffb\xc3", false), "a\\xffb\\xc3");
        assert_eq!(render_text(b"a\xc3(", true), "a\\xc3(");
    }

    #[test]
    fn a_sequence_cut_by_truncation_is_dropped() {
        let s = "ab✓".as_bytes();
        assert_eq!(render_text(&s[..4], true), "ab");
        assert_eq!(render_text(&s[..4], false), "ab\\xe2\\x9c");
    }

    #[test]
    fn stream_renderer_joins_split_characters() {
        let text = "a✓b\x1bc";
        let bytes = text.as_bytes();
        for split in 0..=bytes.len() {
            let mut r = StreamRenderer::default();
            let mut out = r.push(&bytes[..split]);
            out.push_str(&r.push(&bytes[split..]));
            out.push_str(&r.finish());
            assert_eq!(out, "a✓b\\x1bc", "split at {split}");
        }
    }

    proptest::proptest! {
        #[test]
        fn stream_rendering_equals_whole_rendering(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..100),
            split in 0usize..100,
        ) {
            let split = split.min(bytes.len());
            let mut r = StreamRenderer::default();
            let mut out = r.push(&bytes[..split]);
            out.push_str(&r.push(&bytes[split..]));
            out.push_str(&r.finish());
            proptest::prop_assert_eq!(out, render_text(&bytes, false));
        }

        #[test]
        fn delivered_text_never_exceeds_the_cap(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
            cap in 0usize..300,
        ) {
            let mut c = BoundedCapture::new(cap);
            c.push(&bytes);
            let shown = c.finish().render_redacted(&|t| {
                let n = t.matches("ab").count() as u64;
                (t.replace("ab", "[REDACTED:x]"), n)
            });
            proptest::prop_assert!(shown.text.len() <= cap);
            let whole = render_text(&bytes, false).replace("ab", "[REDACTED:x]");
            proptest::prop_assert!(whole.starts_with(&shown.text));
            proptest::prop_assert_eq!(shown.truncated, shown.text.len() < whole.len());
        }

        #[test]
        fn rendered_text_has_no_control_characters(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let text = render_text(&bytes, false);
            proptest::prop_assert!(text.chars().all(|c| c == '\n' || c == '\t' || !(c.is_control())));
        }
    }
}
