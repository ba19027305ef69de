//! The policy's extra regexes and exact values.

use std::collections::BTreeMap;
use std::error::Error as _;

use pretty_assertions::assert_eq;

use airlock_redact::{RedactError, RedactionConfig, Redactor};

fn config(extra: &[&str], exact: &[&str]) -> RedactionConfig {
    RedactionConfig {
        builtin: true,
        extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        exact: exact.iter().map(|s| (*s).to_owned()).collect(),
    }
}

#[test]
fn extra_regexes_replace_the_whole_match_or_the_secret_group() {
    let r = Redactor::new(&config(
        &[r"ACME-[0-9]{8}", r"session=(?P<secret>[a-f0-9]{16,})"],
        &[],
    ))
    .unwrap();
    let out = r.redact("id ACME-20240611 cookie session=9f86d081884c7d65; path=/\n");
    assert_eq!(
        out.text,
        "id [REDACTED:extra-0] cookie session=[REDACTED:extra-1]; path=/\n"
    );
    assert_eq!(
        out.by_rule,
        BTreeMap::from([("extra-0".to_owned(), 1), ("extra-1".to_owned(), 1)])
    );
}

#[test]
fn exact_values_are_replaced_wherever_they_occur() {
    let r = Redactor::new(&config(&[], &["tr0ub4dor&3", "hunter2hunter2"])).unwrap();
    let out = r.redact("pw tr0ub4dor&3, again:tr0ub4dor&3x and xhunter2hunter2x\n");
    assert_eq!(
        out.text,
        "pw [REDACTED:exact], again:[REDACTED:exact]x and x[REDACTED:exact]x\n"
    );
    assert_eq!(out.count, 3);
    assert_eq!(out.by_rule, BTreeMap::from([("exact".to_owned(), 3)]));
}

#[test]
fn overlapping_exact_values_leave_no_fragment() {
    let r = Redactor::new(&config(&[], &["abcdefgh", "efghijkl"])).unwrap();
    assert_eq!(r.redact("xabcdefghijklx").text, "x[REDACTED:exact]x");
}

#[test]
fn an_exact_value_inside_a_rule_match_is_one_replacement() {
    let ghp = "ghp_JIGA9HK2gOCZPeJMQW9cy78kyEk2FINMdB8F";
    let r = Redactor::new(&config(&[], &["9cy78kyE"])).unwrap();
    let out = r.redact(&format!("{ghp}\n"));
    assert_eq!(out.text, "[REDACTED:github-pat]\n");
    assert_eq!(out.count, 1);
}

#[test]
fn builtin_rules_can_be_turned_off() {
    let mut c = config(&["ACME-[0-9]{8}"], &[]);
    c.builtin = false;
    let r = Redactor::new(&c).unwrap();
    let text = "ghp_JIGA9HK2gOCZPeJMQW9cy78kyEk2FINMdB8F ACME-20240611";
    assert_eq!(
        r.redact(text).text,
        "ghp_JIGA9HK2gOCZPeJMQW9cy78kyEk2FINMdB8F [REDACTED:extra-0]"
    );
    assert_eq!(r.rules().map(|i| i.id).collect::<Vec<_>>(), vec!["extra-0"]);
}

#[test]
fn an_invalid_extra_regex_is_named_by_its_index() {
    let err = Redactor::new(&config(&[r"fine-[0-9]+", r"broken(", r"also(bad"], &[])).unwrap_err();
    assert!(
        matches!(err, RedactError::InvalidExtra { index: 1, .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "extra redaction regex #1 (policy [redaction] extra[1]) does not compile"
    );
    let source = err.source().unwrap().to_string();
    assert!(source.contains("unclosed group"), "{source}");
}

#[test]
fn an_extra_regex_is_in_the_ascii_dialect() {
    // `\w` is ASCII: the accented letter ends the match.
    let r = Redactor::new(&config(&[r"id:\w{4,}"], &[])).unwrap();
    assert_eq!(r.redact("id:abcdé").text, "[REDACTED:extra-0]é");
}

#[test]
fn extra_regexes_that_match_empty_strings_do_nothing() {
    let r = Redactor::new(&config(&["x*"], &[])).unwrap();
    let out = r.redact("abc xx def");
    assert_eq!(out.text, "abc [REDACTED:extra-0] def");
}

#[test]
fn invalid_exact_values_are_refused_without_echoing_them() {
    let err = Redactor::new(&config(&[], &["ok-value", "pw1"])).unwrap_err();
    assert!(matches!(err, RedactError::InvalidExact { index: 1, .. }));
    assert!(!err.to_string().contains("pw1"));
}

#[test]
fn unicode_can_be_turned_back_on_in_an_extra_regex() {
    let r = Redactor::new(&config(&[r"id:(?u:\w){4,}"], &[])).unwrap();
    assert_eq!(r.redact("id:abcdé!").text, "[REDACTED:extra-0]!");
}
