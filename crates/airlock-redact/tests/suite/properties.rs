//! Properties over generated output: idempotence, nothing of a secret survives, and a stream
//! cut anywhere agrees with redacting the whole text.

use proptest::prelude::*;

use airlock_redact::{RedactionConfig, Redactor};

use super::common::{CASES, builtin};

/// Ordinary words of program output, including near-misses of rule keywords.
const WORDS: &[&str] = &[
    "loss=0.42",
    "Traceback",
    "File",
    "\"/work/main.py\",",
    "line",
    "14",
    "sha256:9f86d081884c7d65",
    "123e4567-e89b-12d3-a456-426614174000",
    "/usr/lib/python3",
    "Bearer",
    "password",
    "api_key",
    "token",
    "sk-",
    "ghp_",
    "AKIA",
    "eyJ",
    "-----BEGIN",
    "postgres://",
    "https://",
    "@",
    ":",
    "[REDACTED:github-pat]",
    "[REDACTED:exact]",
    "[REDACTED:",
    "]",
    "REDACTED",
    "x",
    "é",
    "東京",
    "0xdeadbeef",
    "3.14",
    "ok",
    "=",
    "==",
    "AccountKey",
    "sig=",
];

/// Between pieces, as in real output.
const SEPARATORS: &[&str] = &[
    " ", "\n", "\t", ", ", "; ", ": ", " = ", "\"", "'", "(", ")", "[", "]", "{", "}", ". ", " | ",
];

#[derive(Debug, Clone)]
enum Piece {
    Word(usize),
    Secret(usize),
    Random(String),
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        4 => (0..WORDS.len()).prop_map(Piece::Word),
        2 => (0..CASES.len()).prop_map(Piece::Secret),
        1 => "[ -~]{0,24}".prop_map(Piece::Random),
    ]
}

/// A text of pieces joined by separators, and the secrets in it.
fn output() -> impl Strategy<Value = (String, Vec<&'static str>)> {
    prop::collection::vec((piece(), 0..SEPARATORS.len()), 0..24).prop_map(|pieces| {
        let mut text = String::new();
        let mut secrets = Vec::new();
        for (piece, sep) in pieces {
            match piece {
                Piece::Word(i) => text += WORDS[i],
                Piece::Secret(i) => {
                    text += CASES[i].input;
                    secrets.push(CASES[i].secret);
                }
                Piece::Random(s) => text += &s,
            }
            text += SEPARATORS[sep];
        }
        (text, secrets)
    })
}

fn with_operator_values() -> &'static Redactor {
    static REDACTOR: std::sync::OnceLock<Redactor> = std::sync::OnceLock::new();
    REDACTOR.get_or_init(|| {
        Redactor::new(&RedactionConfig {
            builtin: true,
            extra: vec![r"ACME-[0-9]{4}".to_owned(), r"REDACT[A-Z]+".to_owned()],
            exact: vec!["loss=0.42".to_owned(), "ok, ".to_owned()],
        })
        .unwrap()
    })
}

/// The markers of `r`'s own labels in `text`, which it writes and protects. A look-alike
/// with a label no rule has (`[REDACTED:(` in generated text) is ordinary text, which a
/// secret's replacement may swallow: counting the prefix alone took that for a marker lost.
fn markers(r: &Redactor, text: &str) -> usize {
    r.rules()
        .map(|rule| text.matches(&format!("[REDACTED:{}]", rule.id)).count())
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn redaction_is_idempotent((text, _) in output()) {
        for r in [builtin(), with_operator_values()] {
            let once = r.redact(&text);
            let twice = r.redact(&once.text);
            prop_assert_eq!(&twice.text, &once.text);
            prop_assert_eq!(twice.count, 0);
        }
    }

    #[test]
    fn no_fragment_of_a_secret_survives((text, secrets) in output()) {
        for r in [builtin(), with_operator_values()] {
            let out = r.redact(&text).text;
            for secret in &secrets {
                for window in secret.as_bytes().windows(12) {
                    let window = std::str::from_utf8(window).unwrap();
                    prop_assert!(!out.contains(window), "{:?} survives in {:?}", window, out);
                }
            }
        }
    }

    /// Every secret is redacted (several may share a marker when a context rule such as
    /// `password = "..."` spans them), and `count` is the number of markers added.
    #[test]
    fn each_secret_is_counted((text, secrets) in output()) {
        let out = builtin().redact(&text);
        prop_assert!(secrets.is_empty() || out.count >= 1);
        let added = markers(builtin(), &out.text) - markers(builtin(), &text);
        prop_assert_eq!(out.count, added as u64);
        prop_assert_eq!(out.by_rule.values().sum::<u64>(), out.count);
    }

    #[test]
    fn a_stream_cut_anywhere_agrees_with_the_whole((text, _) in output(), cuts in prop::collection::vec(0usize..4000, 0..6)) {
        let r = builtin();
        let mut points: Vec<usize> = cuts.into_iter().map(|c| c % (text.len() + 1)).filter(|&c| text.is_char_boundary(c)).collect();
        points.sort_unstable();
        points.push(text.len());
        let mut s = r.stream();
        let mut out = String::new();
        let mut at = 0;
        for p in points {
            out += &s.push(&text[at..p]);
            at = p;
        }
        out += &s.finish();
        let whole = r.redact(&text);
        prop_assert_eq!(out, whole.text);
        prop_assert_eq!(s.count(), whole.count);
    }

    /// Idle flushes between the pieces (a job that pauses) never let a fragment of a secret
    /// through, wherever the pauses fall.
    #[test]
    fn idle_flushes_never_leak_a_fragment((text, secrets) in output(), cuts in prop::collection::vec(0usize..4000, 0..8)) {
        let r = builtin();
        let mut points: Vec<usize> = cuts.into_iter().map(|c| c % (text.len() + 1)).filter(|&c| text.is_char_boundary(c)).collect();
        points.sort_unstable();
        points.push(text.len());
        let mut s = r.stream();
        let mut out = String::new();
        let mut at = 0;
        for p in points {
            out += &s.push(&text[at..p]);
            out += &s.flush_idle();
            at = p;
        }
        out += &s.finish();
        for secret in &secrets {
            for window in secret.as_bytes().windows(12) {
                let window = std::str::from_utf8(window).unwrap();
                prop_assert!(!out.contains(window), "{:?} survives in {:?}", window, out);
            }
        }
    }
}

/// Found by `each_secret_is_counted`: a password holding a look-alike marker is replaced
/// whole, and counted once.
#[test]
fn a_look_alike_marker_inside_a_secret_goes_with_it() {
    let out = builtin().redact("postgres://(:([REDACTED:(@ ");
    assert_eq!(
        out.text,
        "postgres://(:[REDACTED:connection-string-password]@ "
    );
    assert_eq!(out.count, 1);
    assert_eq!(markers(builtin(), &out.text), 1);
}
