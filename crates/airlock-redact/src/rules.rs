//! Rules as data: the built-in rule files, their format, and compiling one rule.

use std::sync::{Arc, OnceLock};

use regex::bytes::{Regex, RegexBuilder};
use serde::Deserialize;

use crate::entropy::shannon_entropy;
use crate::error::RedactError;

/// The built-in rule files, in label-priority order, embedded at build time.
pub(crate) const BUILTIN_FILES: &[(&str, &str)] = &[
    (
        "policy/redaction/rules.toml",
        include_str!("../../../policy/redaction/rules.toml"),
    ),
    (
        "policy/redaction/gitleaks.toml",
        include_str!("../../../policy/redaction/gitleaks.toml"),
    ),
    (
        "policy/redaction/generic.toml",
        include_str!("../../../policy/redaction/generic.toml"),
    ),
];

/// The compiled size limit of one regex (the `regex` crate's default is 10 MiB).
const RULE_REGEX_SIZE_LIMIT_BYTES: usize = 16 * 1024 * 1024;

/// Longest rule id: ids end up in every marker.
const RULE_ID_MAX_BYTES: usize = 64;

/// The label of exact values.
pub(crate) const EXACT_LABEL: &str = "exact";

/// The label prefix of extra regexes: `extra-<index>`.
pub(crate) const EXTRA_LABEL_PREFIX: &str = "extra-";

/// The named group that marks the secret part of an extra regex.
pub(crate) const EXTRA_SECRET_GROUP: &str = "secret";

/// One rule file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    rules: Vec<RuleSpec>,
}

/// One rule as written in a rule file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    id: String,
    description: String,
    regex: String,
    keywords: Vec<String>,
    #[serde(default)]
    secret_group: Option<usize>,
    #[serde(default)]
    entropy: Option<f64>,
    #[serde(default)]
    examples: Vec<String>,
}

/// A rule's regex, compiled the first time it is needed.
///
/// Compiling the built-in rules takes about 12 ms of CPU (release build), which every
/// `airlock run` would pay for output that usually wakes none of them: the prefilter runs a
/// rule only when one of its keywords is in the text, so a rule is compiled on the first
/// text that wakes it. The tests parse and compile every built-in rule, so a failure here
/// would be the size limit on a rule no test saw; [`Rule::collect`] then fails closed.
/// Clones share the compiled regex.
#[derive(Debug, Clone)]
pub(crate) struct RuleRegex {
    source: Arc<str>,
    compiled: Arc<OnceLock<Result<Regex, regex::Error>>>,
}

impl RuleRegex {
    /// Checks `source`'s syntax as the regex crate will read it, without compiling it, and
    /// returns the regex and its number of capture groups (the whole match included).
    pub(crate) fn parse(source: &str) -> Result<(Self, usize), regex::Error> {
        let hir = regex_syntax::ParserBuilder::new()
            .unicode(false)
            .utf8(false)
            .build()
            .parse(source)
            .map_err(|e| regex::Error::Syntax(e.to_string()))?;
        let captures = hir.properties().explicit_captures_len() + 1;
        let lazy = Self {
            source: source.into(),
            compiled: Arc::new(OnceLock::new()),
        };
        Ok((lazy, captures))
    }

    /// `source`, not checked until it is compiled (a built-in rule's, which a test parses).
    pub(crate) fn unparsed(source: &str) -> Self {
        Self {
            source: source.into(),
            compiled: Arc::new(OnceLock::new()),
        }
    }

    /// A regex compiled already (an operator's extra regex, whose errors the policy check
    /// must report at once).
    pub(crate) fn compiled(regex: Regex) -> Self {
        Self {
            source: regex.as_str().into(),
            compiled: Arc::new(OnceLock::from(Ok(regex))),
        }
    }

    /// The pattern as written.
    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &str {
        &self.source
    }

    /// The compiled regex, compiling it on the first call.
    pub(crate) fn get(&self) -> Result<&Regex, &regex::Error> {
        self.compiled
            .get_or_init(|| compile_pattern(&self.source))
            .as_ref()
    }
}

/// A rule, its regex compiled when first needed.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub(crate) id: String,
    pub(crate) description: String,
    pub(crate) regex: RuleRegex,
    /// The capture group replaced; 0 is the whole match.
    pub(crate) secret_group: usize,
    /// Minimum Shannon entropy of the secret part, bits per byte.
    pub(crate) entropy: Option<f64>,
    /// Lower-case literals; empty means "always run" (extra regexes).
    pub(crate) keywords: Vec<String>,
    pub(crate) examples: Vec<String>,
}

/// A match of a rule: the whole match and the part that is replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Byte range of the whole match (context included).
    pub(crate) whole: std::ops::Range<usize>,
    /// Byte range of the secret part; never empty.
    pub(crate) secret: std::ops::Range<usize>,
    /// Index into the redactor's labels.
    pub(crate) label: u32,
}

/// Compiles a pattern in the redaction dialect: `regex` on bytes, ASCII classes and ASCII
/// `\b` (Unicode word boundaries would make the lazy DFA give up on non-ASCII output).
pub(crate) fn compile_pattern(pattern: &str) -> Result<Regex, regex::Error> {
    RegexBuilder::new(pattern)
        .unicode(false)
        .size_limit(RULE_REGEX_SIZE_LIMIT_BYTES)
        .build()
}

/// Parses every built-in rule, in priority order, each regex to be compiled on first use.
///
/// The regexes' syntax is not parsed here: the built-in rules are part of the build, and
/// `every_builtin_rule_passes_the_syntax_check` parses each one (parsing all of them took
/// about half of building a redactor, on every `airlock run`). A regex that still failed to
/// compile, or lacked its secret group, would fail closed when woken ([`Rule::collect`]).
pub(crate) fn load_builtin() -> Result<Vec<Rule>, RedactError> {
    let mut rules: Vec<Rule> = Vec::new();
    for (file, text) in BUILTIN_FILES {
        let parsed: RuleFile =
            toml::from_str(text).map_err(|source| RedactError::ParseRules { file, source })?;
        for spec in parsed.rules {
            let rule = compile_spec(spec)?;
            if rules.iter().any(|r| r.id == rule.id) {
                return Err(invalid(&rule.id, "the id is used by another rule"));
            }
            rules.push(rule);
        }
    }
    Ok(rules)
}

fn invalid(id: &str, reason: &str) -> RedactError {
    RedactError::InvalidRule {
        id: id.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Checks a rule's invariants but its regex's, which is compiled on first use (see
/// [`load_builtin`]).
fn compile_spec(spec: RuleSpec) -> Result<Rule, RedactError> {
    let id = spec.id;
    let id_ok = !id.is_empty()
        && id.len() <= RULE_ID_MAX_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-');
    if !id_ok {
        return Err(invalid(
            &id,
            "an id is 1 to 64 characters of a-z, 0-9 and '-', not starting with '-'",
        ));
    }
    if id == EXACT_LABEL || id.starts_with(EXTRA_LABEL_PREFIX) {
        return Err(invalid(&id, "the id is reserved for operator values"));
    }
    if spec.description.trim().is_empty() {
        return Err(invalid(&id, "the description is empty"));
    }
    if spec.keywords.is_empty() {
        return Err(invalid(&id, "a rule needs at least one keyword"));
    }
    // No brackets: a keyword then cannot straddle a marker's edge, so later passes can reuse
    // the first pass's prefilter result (see `Redactor::redact_region`).
    if let Some(bad) = spec.keywords.iter().find(|k| {
        k.is_empty() || **k != k.to_ascii_lowercase() || k.contains('[') || k.contains(']')
    }) {
        return Err(invalid(
            &id,
            &format!("keyword {bad:?} is empty, not lower case, or has a bracket"),
        ));
    }
    if let Some(e) = spec.entropy
        && !(e.is_finite() && e > 0.0 && e <= 8.0)
    {
        return Err(invalid(&id, "entropy must be in (0, 8] bits per byte"));
    }
    Ok(Rule {
        id,
        description: spec.description,
        regex: RuleRegex::unparsed(&spec.regex),
        secret_group: spec.secret_group.unwrap_or(0),
        entropy: spec.entropy,
        keywords: spec.keywords,
        examples: spec.examples,
    })
}

/// Compiles an operator's extra regex. A group named `secret` is the part replaced;
/// without one, the whole match is.
pub(crate) fn compile_extra(index: usize, pattern: &str) -> Result<Rule, RedactError> {
    let regex =
        compile_pattern(pattern).map_err(|source| RedactError::InvalidExtra { index, source })?;
    let secret_group = regex
        .capture_names()
        .position(|name| name == Some(EXTRA_SECRET_GROUP))
        .unwrap_or(0);
    Ok(Rule {
        id: format!("{EXTRA_LABEL_PREFIX}{index}"),
        description: "an extra regex from the policy".to_owned(),
        regex: RuleRegex::compiled(regex),
        secret_group,
        entropy: None,
        keywords: Vec::new(),
        examples: Vec::new(),
    })
}

impl Rule {
    /// Appends every match of this rule in `text` that passes the entropy gate.
    ///
    /// A rule whose regex cannot be compiled (see [`RuleRegex`]) fails closed: the whole
    /// text is its match.
    pub(crate) fn collect(&self, text: &[u8], label: u32, out: &mut Vec<Candidate>) {
        // A regex that does not compile, or lacks the group to replace, redacts the whole
        // text it was woken for rather than nothing.
        let usable = self
            .regex
            .get()
            .ok()
            .filter(|regex| self.secret_group < regex.captures_len());
        let Some(regex) = usable else {
            if !text.is_empty() {
                out.push(Candidate {
                    whole: 0..text.len(),
                    secret: 0..text.len(),
                    label,
                });
            }
            return;
        };
        if self.secret_group == 0 {
            for m in regex.find_iter(text) {
                self.push(m.range(), m.range(), text, label, out);
            }
        } else {
            for caps in regex.captures_iter(text) {
                let (Some(whole), Some(secret)) = (caps.get(0), caps.get(self.secret_group)) else {
                    continue;
                };
                self.push(whole.range(), secret.range(), text, label, out);
            }
        }
    }

    fn push(
        &self,
        whole: std::ops::Range<usize>,
        secret: std::ops::Range<usize>,
        text: &[u8],
        label: u32,
        out: &mut Vec<Candidate>,
    ) {
        if secret.is_empty() {
            return;
        }
        if let Some(min) = self.entropy
            && shannon_entropy(&text[secret.clone()]) < min
        {
            return;
        }
        out.push(Candidate {
            whole,
            secret,
            label,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn spec(id: &str, regex: &str) -> RuleSpec {
        RuleSpec {
            id: id.to_owned(),
            description: "d".to_owned(),
            regex: regex.to_owned(),
            keywords: vec!["k".to_owned()],
            secret_group: None,
            entropy: None,
            examples: vec![],
        }
    }

    #[test]
    fn builtin_rules_load() {
        let rules = load_builtin().unwrap();
        assert!(rules.len() > 100, "{} rules", rules.len());
        assert!(rules.iter().all(|r| !r.examples.is_empty()));
    }

    #[test]
    fn invariants_are_checked() {
        let bad_id = compile_spec(spec("Bad_Id", "x")).unwrap_err();
        assert!(
            matches!(bad_id, RedactError::InvalidRule { .. }),
            "{bad_id}"
        );
        let reserved = compile_spec(spec("extra-1", "x")).unwrap_err();
        assert!(reserved.to_string().contains("reserved"), "{reserved}");
        let mut no_kw = spec("a", "x");
        no_kw.keywords.clear();
        assert!(
            compile_spec(no_kw)
                .unwrap_err()
                .to_string()
                .contains("keyword")
        );
        let mut upper = spec("a", "x");
        upper.keywords = vec!["AKIA".to_owned()];
        assert!(
            compile_spec(upper)
                .unwrap_err()
                .to_string()
                .contains("lower case")
        );
        let mut bracket = spec("a", "x");
        bracket.keywords = vec!["[x".to_owned()];
        assert!(
            compile_spec(bracket)
                .unwrap_err()
                .to_string()
                .contains("bracket")
        );
        let mut group = spec("a", "(x)");
        group.secret_group = Some(2);
        assert!(
            check_regex(&compile_spec(group).unwrap())
                .unwrap_err()
                .to_string()
                .contains("secret_group")
        );
        let mut entropy = spec("a", "x");
        entropy.entropy = Some(9.0);
        assert!(
            compile_spec(entropy)
                .unwrap_err()
                .to_string()
                .contains("entropy")
        );
        let broken = check_regex(&compile_spec(spec("a", "(")).unwrap()).unwrap_err();
        assert!(matches!(broken, RedactError::CompileRule { ref id, .. } if id == "a"));
    }

    #[test]
    fn extra_uses_the_secret_group() {
        let r = compile_extra(3, r"pw=(?P<secret>\S+)").unwrap();
        assert_eq!(r.id, "extra-3");
        assert_eq!(r.secret_group, 1);
        let mut out = vec![];
        r.collect(b"x pw=hunter2 y", 7, &mut out);
        assert_eq!(
            out,
            vec![Candidate {
                whole: 2..12,
                secret: 5..12,
                label: 7
            }]
        );
        assert_eq!(compile_extra(0, "abc").unwrap().secret_group, 0);
    }

    #[test]
    fn dialect_is_ascii() {
        // `\b` is an ASCII word boundary: "é" is not a word character.
        let re = compile_pattern(r"\bAKIA").unwrap();
        assert!(re.is_match("éAKIA".as_bytes()));
        // negated classes match any byte, so they work on non-UTF-8 text too.
        let re = compile_pattern(r"[^@\s]{2}@").unwrap();
        assert!(re.is_match("é@".as_bytes()));
    }

    /// What loading a rule no longer checks, for the tests to check on every built-in
    /// one: its regex's syntax as the regex crate reads it, and the group it replaces.
    fn check_regex(rule: &Rule) -> Result<(), RedactError> {
        let (_, captures_len) =
            RuleRegex::parse(rule.regex.as_str()).map_err(|source| RedactError::CompileRule {
                id: rule.id.clone(),
                source,
            })?;
        if rule.secret_group >= captures_len {
            return Err(invalid(
                &rule.id,
                "secret_group names a group the regex does not have",
            ));
        }
        Ok(())
    }

    #[test]
    fn every_builtin_rule_passes_the_syntax_check() {
        for rule in load_builtin().unwrap() {
            check_regex(&rule).unwrap_or_else(|e| panic!("{}: {e}", rule.id));
        }
    }

    /// A rule whose secret group the regex lacks redacts the whole text it is woken for.
    #[test]
    fn a_rule_without_its_secret_group_fails_closed() {
        let mut rule = compile_spec(spec("a", "x")).unwrap();
        rule.secret_group = 1;
        let mut out = Vec::new();
        rule.collect(b"a x b", 2, &mut out);
        assert_eq!(
            out,
            [Candidate {
                whole: 0..5,
                secret: 0..5,
                label: 2
            }]
        );
    }

    /// Rules compile lazily; every built-in one must compile (within the size limit), and its
    /// group count must be what the syntax check at load said.
    #[test]
    fn every_builtin_rule_compiles_as_its_syntax_check_said() {
        for rule in load_builtin().unwrap() {
            let regex = rule
                .regex
                .get()
                .unwrap_or_else(|e| panic!("{}: {e}", rule.id));
            let (_, captures) = RuleRegex::parse(rule.regex.as_str()).unwrap();
            assert_eq!(regex.captures_len(), captures, "{}", rule.id);
        }
    }

    /// A rule whose regex does not compile (here: past the size limit) redacts the whole
    /// text it is woken for, rather than nothing.
    #[test]
    fn a_rule_that_cannot_compile_fails_closed() {
        let mut rule = load_builtin().unwrap().remove(0);
        let (huge, _) = RuleRegex::parse(r"(?:\w{1000}){1000}").unwrap();
        assert!(huge.get().is_err());
        rule.regex = huge;
        let mut out = Vec::new();
        rule.collect(b"some text", 3, &mut out);
        assert_eq!(
            out,
            [Candidate {
                whole: 0..9,
                secret: 0..9,
                label: 3
            }]
        );
    }

    /// The prefilter runs a rule only when one of its keywords is in the text, so every
    /// match must contain one (checked on the examples), within the stream holdback of its
    /// start.
    #[test]
    fn every_example_match_contains_a_keyword() {
        for rule in load_builtin().unwrap() {
            for example in &rule.examples {
                let m = rule.regex.get().unwrap().find(example.as_bytes()).unwrap();
                let matched = example[m.range()].to_ascii_lowercase();
                let first = rule
                    .keywords
                    .iter()
                    .filter_map(|k| matched.find(k.as_str()))
                    .min();
                assert!(
                    first.is_some_and(|at| at < crate::STREAM_HOLDBACK_BYTES),
                    "{}: no keyword in {matched:?}",
                    rule.id
                );
            }
        }
    }

    /// Every built-in rule is bounded by the stream holdback, or is one of the few
    /// unbounded rules whose every long-enough prefix is matched (README "Streaming").
    #[test]
    fn rule_lengths_fit_the_stream_holdback() {
        let unbounded_allowed = [
            "private-key",
            "aws-session-token",
            "google-oauth-access-token",
            "jwt",
            "1password-service-account-token",
            "facebook-page-access-token",
            "flyio-access-token",
            "bearer-token",
            "authorization-header",
        ];
        let mut unbounded = vec![];
        for rule in load_builtin().unwrap() {
            let source = rule.regex.as_str();
            match max_len::max_match_len(source) {
                Some(n) => assert!(
                    n <= crate::STREAM_HOLDBACK_BYTES,
                    "{} can match {n} bytes, more than the stream holdback",
                    rule.id
                ),
                None => unbounded.push(rule.id.clone()),
            }
        }
        assert_eq!(unbounded, unbounded_allowed.to_vec());
    }

    /// An unbounded rule must match every prefix of its examples (past the first part) up
    /// to the prefix's end, or to within the stream's tail margin of it (a cut inside a PEM
    /// END line), so a stream that holds back an open match loses nothing.
    #[test]
    fn unbounded_rules_are_prefix_closed() {
        for rule in load_builtin().unwrap() {
            if max_len::max_match_len(rule.regex.as_str()).is_some() {
                continue;
            }
            for example in &rule.examples {
                let bytes = example.as_bytes();
                let regex = rule.regex.get().unwrap();
                let full = regex.find(bytes).unwrap();
                let from = full.start() + (full.len() * 3 / 4);
                for cut in from..full.end() {
                    let end = regex.find(&bytes[..cut]).map_or(0, |m| m.end());
                    assert!(
                        end + crate::stream::STREAM_TAIL_MARGIN_BYTES >= cut,
                        "{}: prefix of {cut} bytes of {example:?} matched to {end}",
                        rule.id
                    );
                }
            }
        }
    }

    #[test]
    fn max_len_of_the_dialect() {
        use max_len::max_match_len as m;
        assert_eq!(m(r"abc"), Some(3));
        assert_eq!(m(r"a|bcd"), Some(3));
        assert_eq!(m(r"(?i)\bx[a-z]{2,5}(?:\.y)?\b"), Some(8));
        assert_eq!(m(r"[\]a-]{3}"), Some(3));
        assert_eq!(m(r"[[:alnum:]]{4}\x60"), Some(5));
        assert_eq!(m(r"(?P<n>a){1,}"), None);
        assert_eq!(m(r"a*"), None);
        assert_eq!(m(r"a+?"), None);
        assert_eq!(m(r"a{2}?b??"), Some(3));
        assert_eq!(m(r"^(?-i:x)$\z"), Some(1));
    }

    /// A small analyser of the rule dialect: the longest match of a pattern, in bytes
    /// (every atom matches one byte in ASCII mode), or `None` when unbounded. Test-only: it
    /// guards the stream holdback; it is not used to redact.
    mod max_len {
        pub(super) fn max_match_len(pattern: &str) -> Option<usize> {
            let chars: Vec<char> = pattern.chars().collect();
            let mut p = Parser { s: &chars, i: 0 };
            let n = p.alternation();
            assert_eq!(p.i, chars.len(), "unparsed rest of {pattern:?}");
            n
        }

        struct Parser<'a> {
            s: &'a [char],
            i: usize,
        }

        impl Parser<'_> {
            fn peek(&self) -> Option<char> {
                self.s.get(self.i).copied()
            }

            fn alternation(&mut self) -> Option<usize> {
                let mut best = self.concat();
                while self.peek() == Some('|') {
                    self.i += 1;
                    let next = self.concat();
                    best = match (best, next) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                }
                best
            }

            fn concat(&mut self) -> Option<usize> {
                let mut total = Some(0usize);
                while let Some(c) = self.peek() {
                    if c == '|' || c == ')' {
                        break;
                    }
                    let atom = self.atom();
                    let n = self.quantified(atom);
                    total = match (total, n) {
                        (Some(a), Some(b)) => Some(a + b),
                        _ => None,
                    };
                }
                total
            }

            fn atom(&mut self) -> Option<usize> {
                let c = self.s[self.i];
                self.i += 1;
                match c {
                    '(' => {
                        if self.peek() == Some('?') {
                            self.i += 1;
                            // flags, `:`, `P<name>`, `<name>`
                            if self.peek() == Some('P') || self.peek() == Some('<') {
                                while self.peek() != Some('>') {
                                    self.i += 1;
                                }
                                self.i += 1;
                            } else {
                                while let Some(f) = self.peek() {
                                    self.i += 1;
                                    if f == ':' {
                                        break;
                                    }
                                    if f == ')' {
                                        return Some(0); // `(?i)`: flags only
                                    }
                                }
                            }
                        }
                        let n = self.alternation();
                        assert_eq!(self.peek(), Some(')'));
                        self.i += 1;
                        n
                    }
                    '[' => {
                        self.class();
                        Some(1)
                    }
                    '\\' => {
                        let e = self.s[self.i];
                        self.i += 1;
                        match e {
                            'b' | 'B' | 'A' | 'z' => Some(0),
                            'x' => {
                                if self.peek() == Some('{') {
                                    while self.peek() != Some('}') {
                                        self.i += 1;
                                    }
                                    self.i += 1;
                                } else {
                                    self.i += 2;
                                }
                                Some(1)
                            }
                            _ => Some(1),
                        }
                    }
                    '^' | '$' => Some(0),
                    _ => Some(1),
                }
            }

            /// Skips a class body after its `[`, nested classes included.
            fn class(&mut self) {
                if self.peek() == Some('^') {
                    self.i += 1;
                }
                if self.peek() == Some(']') {
                    self.i += 1;
                }
                while let Some(c) = self.peek() {
                    self.i += 1;
                    match c {
                        '\\' => self.i += 1,
                        '[' => self.class(),
                        ']' => return,
                        _ => {}
                    }
                }
            }

            fn quantified(&mut self, atom: Option<usize>) -> Option<usize> {
                let (lo_hi, consumed) = match self.peek() {
                    Some('*') | Some('+') => (None, true),
                    Some('?') => (Some(1), true),
                    Some('{') => {
                        let start = self.i + 1;
                        let end = start + self.s[start..].iter().position(|&c| c == '}')?;
                        let body: String = self.s[start..end].iter().collect();
                        self.i = end;
                        let max = match body.split_once(',') {
                            None => body.parse::<usize>().ok(),
                            Some((_, "")) => None,
                            Some((_, hi)) => hi.parse::<usize>().ok(),
                        };
                        (max, true)
                    }
                    _ => return atom,
                };
                if consumed {
                    self.i += 1;
                    if self.peek() == Some('?') {
                        self.i += 1; // lazy
                    }
                }
                match (atom, lo_hi) {
                    (Some(a), Some(m)) => Some(a * m),
                    _ => None,
                }
            }
        }
    }
}
