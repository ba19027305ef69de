//! The redactor: built-in rules, the policy's extra regexes and exact values, compiled once.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

use crate::error::RedactError;
use crate::prefilter::Prefilter;
use crate::rules::{
    Candidate, EXACT_LABEL, EXTRA_LABEL_PREFIX, Rule, RuleRegex, compile_extra, load_builtin,
};
use crate::span::{apply, resolve};
use crate::stream::{STREAM_HOLDBACK_BYTES, StreamRedactor};

/// How many times one call re-scans its own output. A second pass is needed only when a
/// replacement changes what a neighbouring rule sees (a marker is a word boundary where the
/// secret was not); it makes `redact(redact(x)) == redact(x)`.
pub const MAX_PASSES: usize = 4;

/// Shortest exact value accepted: a shorter one would redact ordinary text.
pub const EXACT_MIN_BYTES: usize = 4;

/// What to redact, as the policy's `[redaction]` table says.
#[derive(Clone, PartialEq, Eq)]
pub struct RedactionConfig {
    /// Whether airlock's built-in rules (`policy/redaction/*.toml`) apply.
    pub builtin: bool,
    /// More regexes from the policy, in the redaction dialect (see the crate docs). A group
    /// named `secret` marks the part replaced; without one the whole match is. Replaced by
    /// `[REDACTED:extra-<index>]`.
    pub extra: Vec<String>,
    /// Literal secret values the operator lists, matched case-sensitively anywhere.
    /// Replaced by `[REDACTED:exact]`.
    pub exact: Vec<String>,
}

impl Default for RedactionConfig {
    fn default() -> Self {
        Self {
            builtin: true,
            extra: Vec::new(),
            exact: Vec::new(),
        }
    }
}

impl std::fmt::Debug for RedactionConfig {
    /// Never prints the exact values: they are secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedactionConfig")
            .field("builtin", &self.builtin)
            .field("extra", &self.extra)
            .field("exact", &format_args!("<{} values>", self.exact.len()))
            .finish()
    }
}

/// The result of redacting a text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redacted {
    /// The text with every secret replaced by `[REDACTED:<rule id>]`.
    pub text: String,
    /// Markers inserted: one per replaced span (overlapping matches make one span).
    pub count: u64,
    /// The same count per rule id (`extra-<index>`, `exact` included); only ids that fired.
    pub by_rule: BTreeMap<String, u64>,
}

/// A rule as the redactor knows it, for listings and tests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RuleInfo<'a> {
    /// The id in the marker.
    pub id: &'a str,
    /// Why what it matches is a secret.
    pub description: &'a str,
    /// Prefilter keywords (lower case); empty for extra regexes.
    pub keywords: &'a [String],
    /// Fake secrets the rule must redact; empty for extra regexes.
    pub examples: &'a [String],
    /// Minimum Shannon entropy of the secret part, bits per byte.
    pub entropy: Option<f64>,
}

/// The built-in rules, compiled once per process and shared by every redactor.
#[derive(Debug)]
struct Builtin {
    rules: Vec<Rule>,
    prefilter: Prefilter,
    marker: RuleRegex,
    /// Rules whose keywords occur inside some marker: a pass after the first wakes them too.
    marker_wake: Vec<bool>,
}

/// One pass's matches, and which built-in rules the prefilter woke for it.
#[derive(Debug)]
pub(crate) struct Scan {
    pub(crate) candidates: Vec<Candidate>,
    woken: Vec<bool>,
}

static BUILTIN: OnceLock<Result<Arc<Builtin>, RedactError>> = OnceLock::new();

fn builtin_rules() -> Result<Arc<Builtin>, RedactError> {
    BUILTIN
        .get_or_init(|| {
            let rules = load_builtin()?;
            let prefilter = Prefilter::new(&rules)?;
            let marker = marker_pattern(rules.iter().map(|r| r.id.as_str()))?;
            let mut markers: String = rules
                .iter()
                .map(|r| format!("[REDACTED:{}]", r.id))
                .collect();
            markers.push_str("[REDACTED:exact][REDACTED:extra-0123456789]");
            let marker_wake = prefilter.triggered(markers.as_bytes());
            Ok(Arc::new(Builtin {
                rules,
                prefilter,
                marker,
                marker_wake,
            }))
        })
        .clone()
}

/// The pattern of a marker this redactor may have written: `[REDACTED:<known label>]`. A
/// look-alike with an unknown label (say, a token) is not protected from redaction.
/// Compiled the first time a text has something to redact.
fn marker_pattern<'a>(ids: impl Iterator<Item = &'a str>) -> Result<RuleRegex, RedactError> {
    let mut alternatives = vec![
        regex::escape(EXACT_LABEL),
        format!("{}[0-9]{{1,6}}", regex::escape(EXTRA_LABEL_PREFIX)),
    ];
    alternatives.extend(ids.map(regex::escape));
    let pattern = format!(r"\[REDACTED:(?:{})\]", alternatives.join("|"));
    RuleRegex::parse(&pattern)
        .map(|(regex, _)| regex)
        .map_err(|source| RedactError::CompileMarker { source })
}

/// Replaces secret-shaped strings with `[REDACTED:<rule id>]`.
///
/// Build one per policy and share it (`Send + Sync`); building compiles the extra regexes and
/// the exact-value automaton, the built-in rules are compiled once per process.
pub struct Redactor {
    builtin: Option<Arc<Builtin>>,
    extras: Vec<Rule>,
    exact: Option<AhoCorasick>,
    exact_count: usize,
    /// Builtin rule ids, then `extra-<i>`, then `exact`: indexed by candidate labels.
    labels: Vec<String>,
    marker: RuleRegex,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field(
                "builtin_rules",
                &self.builtin.as_ref().map_or(0, |b| b.rules.len()),
            )
            .field("extra", &self.extras.len())
            .field("exact", &format_args!("<{} values>", self.exact_count))
            .finish()
    }
}

impl Redactor {
    /// Builds a redactor. Fails on a built-in rule that does not load (a build defect), an
    /// extra regex that does not compile (named by its index), or an unusable exact value
    /// (empty, shorter than [`EXACT_MIN_BYTES`], or longer than [`STREAM_HOLDBACK_BYTES`]).
    pub fn new(config: &RedactionConfig) -> Result<Self, RedactError> {
        let builtin = if config.builtin {
            Some(builtin_rules()?)
        } else {
            None
        };
        let extras = config
            .extra
            .iter()
            .enumerate()
            .map(|(index, pattern)| compile_extra(index, pattern))
            .collect::<Result<Vec<_>, _>>()?;
        for (index, value) in config.exact.iter().enumerate() {
            let reason = if value.len() < EXACT_MIN_BYTES {
                Some(format!(
                    "shorter than {EXACT_MIN_BYTES} bytes, it would redact ordinary text"
                ))
            } else if value.len() > STREAM_HOLDBACK_BYTES {
                Some(format!(
                    "longer than {STREAM_HOLDBACK_BYTES} bytes, the longest secret a stream holds back"
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(RedactError::InvalidExact { index, reason });
            }
        }
        let exact = if config.exact.is_empty() {
            None
        } else {
            let automaton = AhoCorasickBuilder::new()
                .match_kind(MatchKind::Standard)
                .build(&config.exact)
                .map_err(|source| RedactError::BuildAutomaton {
                    what: "exact-value",
                    source,
                })?;
            Some(automaton)
        };
        let mut labels: Vec<String> = builtin
            .as_ref()
            .map(|b| b.rules.iter().map(|r| r.id.clone()).collect())
            .unwrap_or_default();
        labels.extend(extras.iter().map(|r| r.id.clone()));
        labels.push(EXACT_LABEL.to_owned());
        let marker = match &builtin {
            Some(b) => b.marker.clone(),
            None => marker_pattern(std::iter::empty())?,
        };
        Ok(Self {
            builtin,
            extras,
            exact,
            exact_count: config.exact.len(),
            labels,
            marker,
        })
    }

    /// A redactor with the built-in rules only.
    pub fn builtin() -> Result<Self, RedactError> {
        Self::new(&RedactionConfig::default())
    }

    /// Redacts a whole text. Linear in its length (per pass, see [`MAX_PASSES`]).
    pub fn redact(&self, text: &str) -> Redacted {
        let mut counts = vec![0u64; self.labels.len()];
        let text = self.redact_region(text, 0..text.len(), None, &mut counts);
        self.finish_counts(text, &counts)
    }

    /// Redacts `text` as it reads between `before` and `after`: a secret that starts in
    /// `before` and ends in `text` (or starts in `text` and ends in `after`) has its part in
    /// `text` replaced too. For two streams shown side by side (stdout between stderr and
    /// stderr), where a key split across them is whole again for the reader.
    pub fn redact_between(&self, before: &str, text: &str, after: &str) -> Redacted {
        if before.is_empty() && after.is_empty() {
            return self.redact(text);
        }
        let joined = format!("{before}{text}{after}");
        let mut counts = vec![0u64; self.labels.len()];
        let region = before.len()..before.len() + text.len();
        let text = self.redact_region(&joined, region, None, &mut counts);
        self.finish_counts(text, &counts)
    }

    /// A redactor for text that arrives in pieces; see [`StreamRedactor`].
    pub fn stream(&self) -> StreamRedactor<'_> {
        StreamRedactor::new(self)
    }

    /// The rules this redactor applies: built-in ones in priority order, then the extras.
    pub fn rules(&self) -> impl Iterator<Item = RuleInfo<'_>> {
        let builtin = self.builtin.as_deref().map_or(&[][..], |b| &b.rules[..]);
        builtin.iter().chain(self.extras.iter()).map(|r| RuleInfo {
            id: &r.id,
            description: &r.description,
            keywords: &r.keywords,
            examples: &r.examples,
            entropy: r.entropy,
        })
    }

    pub(crate) fn label_count(&self) -> usize {
        self.labels.len()
    }

    /// Turns per-label counts into a [`Redacted`].
    pub(crate) fn finish_counts(&self, text: String, counts: &[u64]) -> Redacted {
        let by_rule: BTreeMap<String, u64> = self
            .labels
            .iter()
            .zip(counts)
            .filter(|(_, n)| **n > 0)
            .map(|(label, n)| (label.clone(), *n))
            .collect();
        Redacted {
            text,
            count: counts.iter().sum(),
            by_rule,
        }
    }

    /// Every match of every rule that can match `text`, and every occurrence of every exact
    /// value; unordered, possibly overlapping. `woken` says which built-in rules to run;
    /// without it, the keyword prefilter decides.
    pub(crate) fn scan(&self, text: &[u8], woken: Option<Vec<bool>>) -> Scan {
        let mut candidates = Vec::new();
        let mut label = 0u32;
        let mut woken_out = Vec::new();
        if let Some(builtin) = &self.builtin {
            let woken = woken.unwrap_or_else(|| builtin.prefilter.triggered(text));
            for (rule, &awake) in builtin.rules.iter().zip(&woken) {
                if awake {
                    rule.collect(text, label, &mut candidates);
                }
                label += 1;
            }
            woken_out = woken;
        }
        for rule in &self.extras {
            rule.collect(text, label, &mut candidates);
            label += 1;
        }
        if let Some(exact) = &self.exact {
            // Overlapping: linear in the text and the occurrences, however long the values.
            for m in exact.find_overlapping_iter(text) {
                candidates.push(Candidate {
                    whole: m.range(),
                    secret: m.range(),
                    label,
                });
            }
        }
        Scan {
            candidates,
            woken: woken_out,
        }
    }

    /// Redacts `region` of `text`, using the rest of `text` as context only, and returns the
    /// redacted region. `first` is the first pass's scan of `text` when the caller has it.
    ///
    /// Passes repeat (at most [`MAX_PASSES`]) until one replaces nothing. A later pass reuses
    /// the first pass's prefilter result, plus the rules woken by marker text: the text
    /// outside the new markers is unchanged, and no keyword has a bracket, so no keyword can
    /// straddle a marker's edge.
    pub(crate) fn redact_region(
        &self,
        text: &str,
        region: Range<usize>,
        first: Option<Scan>,
        counts: &mut [u64],
    ) -> String {
        let prefix = region.start;
        let suffix = text.len() - region.end;
        let mut first = first;
        let mut woken_next: Option<Vec<bool>> = None;
        let mut owned: Option<String> = None;
        for _ in 0..MAX_PASSES {
            let current: &str = owned.as_deref().unwrap_or(text);
            let Scan {
                candidates,
                mut woken,
            } = match first.take() {
                Some(scan) => scan,
                None => self.scan(current.as_bytes(), woken_next.take()),
            };
            if candidates.is_empty() {
                break;
            }
            if let Some(builtin) = &self.builtin {
                for (w, m) in woken.iter_mut().zip(&builtin.marker_wake) {
                    *w |= *m;
                }
                woken_next = Some(woken);
            }
            // A marker pattern that cannot compile protects no marker: more is redacted.
            let markers: Vec<Range<usize>> = self
                .marker
                .get()
                .map(|marker| {
                    marker
                        .find_iter(current.as_bytes())
                        .map(|m| m.range())
                        .collect()
                })
                .unwrap_or_default();
            let region = prefix..current.len() - suffix;
            let spans = resolve(current, &candidates, &markers, region);
            if spans.is_empty() {
                break;
            }
            let next = apply(current, &spans, &self.labels, counts);
            owned = Some(next);
        }
        let current: &str = owned.as_deref().unwrap_or(text);
        current[prefix..current.len() - suffix].to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const GHP: &str = "ghp_JIGA9HK2gOCZPeJMQW9cy78kyEk2FINMdB8F";

    #[test]
    fn redactor_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Redactor>();
    }

    #[test]
    fn redacts_and_counts() {
        let r = Redactor::builtin().unwrap();
        let out = r.redact(&format!("token={GHP}\nok\n"));
        assert_eq!(out.text, "token=[REDACTED:github-pat]\nok\n");
        assert_eq!(out.count, 1);
        assert_eq!(
            out.by_rule,
            BTreeMap::from([("github-pat".to_owned(), 1u64)])
        );
    }

    #[test]
    fn a_key_split_between_two_texts_is_redacted_in_both() {
        let r = Redactor::builtin().unwrap();
        let (head, tail) = GHP.split_at(20);
        let stdout = format!("a: {head}");
        let stderr = format!("{tail} b\n");
        assert_eq!(r.redact(&stdout).count, 0, "each half alone is no key");
        assert_eq!(r.redact(&stderr).count, 0);
        let out = r.redact_between(&stderr, &stdout, &stderr);
        assert_eq!(out.text, "a: [REDACTED:github-pat]");
        let err = r.redact_between(&stdout, &stderr, &stdout);
        assert_eq!(err.text, "[REDACTED:github-pat] b\n");
        // In the other order too (stderr written first).
        let out = r.redact_between(&format!("x {head}"), &format!("{tail} y"), "");
        assert_eq!(out.text, "[REDACTED:github-pat] y");
        assert_eq!(r.redact_between("", "plain", "").text, "plain");
    }

    #[test]
    fn nothing_to_redact_is_returned_unchanged() {
        let r = Redactor::builtin().unwrap();
        let out = r.redact("hello\n");
        assert_eq!(
            out,
            Redacted {
                text: "hello\n".to_owned(),
                count: 0,
                by_rule: BTreeMap::new()
            }
        );
    }

    #[test]
    fn a_marker_that_unmasks_a_neighbour_is_caught_by_the_second_pass() {
        // AKIA... followed by a word character is not an access key id; once the exact
        // value after it is replaced by a marker, it is.
        let config = RedactionConfig {
            exact: vec!["zzzz".to_owned()],
            ..RedactionConfig::default()
        };
        let r = Redactor::new(&config).unwrap();
        let once = r.redact("AKIA454ML6LG4TJFCZ4Kzzzz");
        assert_eq!(once.text, "[REDACTED:aws-access-key-id][REDACTED:exact]");
        assert_eq!(once.count, 2);
        let twice = r.redact(&once.text);
        assert_eq!(twice.text, once.text);
        assert_eq!(twice.count, 0);
    }

    #[test]
    fn look_alike_markers_with_unknown_labels_are_not_protected() {
        let r = Redactor::builtin().unwrap();
        let out = r.redact(&format!("[REDACTED:{GHP}]"));
        assert_eq!(out.text, "[REDACTED:[REDACTED:github-pat]]");
    }

    #[test]
    fn debug_never_shows_exact_values() {
        let config = RedactionConfig {
            exact: vec!["hunter2-secret".to_owned()],
            ..RedactionConfig::default()
        };
        let r = Redactor::new(&config).unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
        assert!(!format!("{r:?}").contains("hunter2"));
    }

    #[test]
    fn exact_values_are_checked() {
        for (value, needle) in [
            ("", "shorter"),
            ("abc", "shorter"),
            (&"x".repeat(STREAM_HOLDBACK_BYTES + 1)[..], "longer"),
        ] {
            let config = RedactionConfig {
                exact: vec!["fine-value".to_owned(), value.to_owned()],
                ..RedactionConfig::default()
            };
            let err = Redactor::new(&config).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("#1") && msg.contains(needle), "{msg}");
            assert!(!value.is_empty() || !msg.contains("fine-value"));
        }
    }
}
