//! From rule matches to replaced text: clipping, union of overlaps, and the markers.

use std::ops::Range;

use crate::rules::Candidate;

/// The text that opens every replacement: `[REDACTED:<rule id>]`.
pub const MARKER_PREFIX: &str = "[REDACTED:";

/// One replaced range and the label that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) range: Range<usize>,
    pub(crate) label: u32,
}

/// The disjoint, sorted spans that replace the secrets of `candidates` inside `region`:
///
/// - each secret part is clipped to `region` and widened to UTF-8 character boundaries (a
///   negated class can stop inside a character; widening redacts more, never less);
/// - earlier markers are never rewritten: the parts of a secret that cover one are cut out,
///   which keeps redaction idempotent;
/// - overlapping secrets are merged, so no fragment of either survives. A merged span is
///   named by its earliest candidate (ties: the longer one, then the lower label).
pub(crate) fn resolve(
    text: &str,
    candidates: &[Candidate],
    markers: &[Range<usize>],
    region: Range<usize>,
) -> Vec<Span> {
    let mut pieces: Vec<(usize, usize, u32)> = Vec::with_capacity(candidates.len());
    for c in candidates {
        let start = c.secret.start.max(region.start);
        let end = c.secret.end.min(region.end);
        if start >= end {
            continue;
        }
        let end = ceil_char_boundary(text, end);
        let mut start = floor_char_boundary(text, start);
        let first = markers.partition_point(|m| m.end <= start);
        for m in &markers[first..] {
            if m.start >= end {
                break;
            }
            if m.start > start {
                pieces.push((start, m.start, c.label));
            }
            start = start.max(m.end);
            if start >= end {
                break;
            }
        }
        if start < end {
            pieces.push((start, end, c.label));
        }
    }
    pieces.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let mut spans: Vec<Span> = Vec::with_capacity(pieces.len());
    for (start, end, label) in pieces {
        match spans.last_mut() {
            Some(last) if start < last.range.end => last.range.end = last.range.end.max(end),
            _ => spans.push(Span {
                range: start..end,
                label,
            }),
        }
    }
    spans
}

/// Replaces each span of `text` with its marker and counts it under its label.
pub(crate) fn apply(text: &str, spans: &[Span], labels: &[String], counts: &mut [u64]) -> String {
    let mut out = String::with_capacity(text.len() + spans.len() * 32);
    let mut at = 0;
    for span in spans {
        let label = span.label as usize;
        out.push_str(&text[at..span.range.start]);
        out.push_str(MARKER_PREFIX);
        out.push_str(&labels[label]);
        out.push(']');
        counts[label] += 1;
        at = span.range.end;
    }
    out.push_str(&text[at..]);
    out
}

/// The largest character boundary of `text` at or before `i`.
pub(crate) fn floor_char_boundary(text: &str, mut i: usize) -> usize {
    i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest character boundary of `text` at or after `i`.
pub(crate) fn ceil_char_boundary(text: &str, mut i: usize) -> usize {
    while i < text.len() && !text.is_char_boundary(i) {
        i += 1;
    }
    i.min(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn cand(secret: Range<usize>, label: u32) -> Candidate {
        Candidate {
            whole: secret.clone(),
            secret,
            label,
        }
    }

    fn spans(v: &[(Range<usize>, u32)]) -> Vec<Span> {
        v.iter()
            .map(|(r, l)| Span {
                range: r.clone(),
                label: *l,
            })
            .collect()
    }

    #[test]
    fn overlaps_merge_into_the_union() {
        let text = "0123456789abcdef";
        let got = resolve(
            text,
            &[cand(4..8, 2), cand(2..6, 1), cand(7..10, 0)],
            &[],
            0..16,
        );
        assert_eq!(got, spans(&[(2..10, 1)]));
    }

    #[test]
    fn touching_spans_stay_apart_and_ties_pick_longest_then_lowest_label() {
        let text = "0123456789";
        let got = resolve(
            text,
            &[cand(0..2, 3), cand(2..4, 1), cand(2..5, 2), cand(2..5, 0)],
            &[],
            0..10,
        );
        assert_eq!(got, spans(&[(0..2, 3), (2..5, 0)]));
    }

    #[test]
    fn markers_are_cut_out() {
        let text = "ab[REDACTED:exact]cd";
        let marker = 2..18;
        let inside = resolve(
            text,
            &[cand(3..10, 0)],
            std::slice::from_ref(&marker),
            0..20,
        );
        assert_eq!(inside, vec![]);
        let across = resolve(text, &[cand(0..20, 0)], &[marker], 0..20);
        assert_eq!(across, spans(&[(0..2, 0), (18..20, 0)]));
    }

    #[test]
    fn spans_are_clipped_to_the_region_and_widened_to_characters() {
        let text = "aéb"; // é is bytes 1..3
        assert_eq!(
            resolve(text, &[cand(2..4, 0)], &[], 0..4),
            spans(&[(1..4, 0)])
        );
        assert_eq!(
            resolve(text, &[cand(0..4, 0)], &[], 1..3),
            spans(&[(1..3, 0)])
        );
    }

    #[test]
    fn apply_writes_markers_and_counts() {
        let labels = vec!["a".to_owned(), "b".to_owned()];
        let mut counts = vec![0, 0];
        let out = apply(
            "xx SECRET yy S2",
            &spans(&[(3..9, 1), (13..15, 1)]),
            &labels,
            &mut counts,
        );
        assert_eq!(out, "xx [REDACTED:b] yy [REDACTED:b]");
        assert_eq!(counts, vec![0, 2]);
    }
}
