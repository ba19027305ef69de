//! Every rule kind is redacted and counted under its id.

use std::collections::BTreeMap;

use pretty_assertions::assert_eq;

use super::common::{CASES, builtin};

#[test]
fn every_secret_kind_in_realistic_output() {
    let r = builtin();
    for case in CASES {
        let out = r.redact(case.input);
        assert_eq!(out.text, case.expected, "rule {}", case.id);
        assert_eq!(out.count, 1, "{}", case.input);
        assert_eq!(out.by_rule, BTreeMap::from([(case.id.to_owned(), 1)]));
    }
}

#[test]
fn every_kind_the_issue_names_has_a_case() {
    let named = [
        "aws-access-key-id",
        "aws-secret-access-key",
        "private-key",
        "azure-storage-account-key",
        "openai-api-key",
        "anthropic-api-key",
        "anthropic-admin-key",
        "github-pat",
        "github-oauth-token",
        "github-user-token",
        "github-app-token",
        "github-refresh-token",
        "github-fine-grained-pat",
        "gitlab-pat",
        "slack-bot-token",
        "slack-user-token",
        "slack-token",
        "slack-webhook-url",
        "stripe-secret-key",
        "stripe-restricted-key",
        "google-api-key",
        "jwt",
        "connection-string-password",
        "bearer-token",
        "huggingface-token",
        "npm-token",
        "sendgrid-api-key",
        "twilio-api-key",
    ];
    for id in named {
        assert!(CASES.iter().any(|c| c.id == id), "no case for {id}");
    }
}

/// Each rule's `examples` (in the rule files) are redacted under its id, and redacting the
/// result again changes nothing.
#[test]
fn every_rule_redacts_its_examples() {
    let r = builtin();
    let mut checked = 0;
    for rule in r.rules() {
        assert!(!rule.examples.is_empty(), "{} has no example", rule.id);
        for example in rule.examples {
            let out = r.redact(example);
            assert!(
                out.by_rule.contains_key(rule.id),
                "{}: {example:?} gave {:?}",
                rule.id,
                out.text
            );
            let again = r.redact(&out.text);
            assert_eq!(again.text, out.text);
            assert_eq!(again.count, 0);
            checked += 1;
        }
    }
    assert!(checked > 140, "{checked} examples");
}

/// A key with a character glued in front (`xsk-…`, `xAKIA…`) is still a key: the rules
/// with a distinctive prefix have no leading word boundary.
#[test]
fn a_glued_character_does_not_hide_a_key() {
    let r = builtin();
    for case in CASES.iter().filter(|c| {
        [
            "openai-api-key",
            "anthropic-api-key",
            "anthropic-admin-key",
            "aws-access-key-id",
            "github-pat",
            "huggingface-token",
            "npm-token",
            "slack-bot-token",
            "stripe-secret-key",
            "google-api-key",
            "jwt",
        ]
        .contains(&c.id)
    }) {
        let example = r
            .rules()
            .find(|rule| rule.id == case.id)
            .and_then(|rule| rule.examples.first().cloned())
            .unwrap();
        for glued in [
            format!("x{example}"),
            format!("key=0{example}"),
            format!("_{example}"),
        ] {
            let out = r.redact(&glued);
            assert!(
                out.by_rule.contains_key(case.id),
                "{}: {glued:?} gave {:?}",
                case.id,
                out.text
            );
        }
    }
}

/// An OpenAI-style `sk-` key of 48 characters (no vendor infix) with a character glued in
/// front is still a key; a shorter `sk-` string glued to a word (`task-…`, `Flask-…`) and
/// ordinary hyphenated words stay as they are.
#[test]
fn a_glued_character_does_not_hide_a_48_character_sk_key() {
    let r = builtin();
    let key = "sk-Xq0bVf2NwR7tLk9mZs4HjP1cYd8gUe3AoTi6KyBn5WxQlrEv";
    assert_eq!(key.len(), 3 + 48);
    for glued in [
        format!("x{key}"),
        format!("9{key}"),
        format!("_{key}"),
        format!("OPENAI_API_KEY=_{key}\n"),
        format!("\"9{key}\""),
    ] {
        let out = r.redact(&glued);
        // After `KEY=` the assignment rule may name it first; either way it is gone.
        assert!(out.count >= 1, "{glued:?} gave {:?}", out.text);
        assert!(!out.text.contains(&key[3..]), "{:?}", out.text);
        if !glued.contains('=') {
            assert_eq!(out.by_rule.get("sk-api-key"), Some(&1), "{:?}", out.text);
        }
    }
    let ordinary = [
        // A glued sk- of any other length is an identifier, not a key.
        "task-3f9a1c7e5b2d4f60a8c1e9b7d3f5a2c4",
        "mask-Xq0bVf2NwR7tLk9mZs4HjP1cYd8gUe3AoTi6KyBn5WxQlrEvQ",
        "disk-Xq0bVf2NwR7tLk9mZs4HjP1cYd8gUe3AoTi6KyBn5Wx",
        // Hyphenated words and package names.
        "Flask-SQLAlchemy risk-adjusted ask-me-anything desk-booking whisk-together",
        "task-queue-worker-01 mask-rcnn-resnet50-fpn-coco-2017 sk-learn",
        // 48 characters, but not letters and digits only.
        "xsk-aaaaaaaa-bbbbbbbb-cccccccc-dddddddd-eeeeeeee-ffff",
        // 48 letters of ordinary low entropy.
        "task-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    ];
    for text in ordinary {
        let out = r.redact(text);
        assert_eq!(out.text, text);
        assert_eq!(out.count, 0, "{text}");
    }
}

#[test]
fn a_gcp_service_account_key_file_keeps_everything_but_the_key() {
    let file = r#"{
  "type": "service_account",
  "project_id": "airlock-jobs",
  "private_key_id": "3f9a1c7e5b2d4f60a8c1e9b7d3f5a2c4e6b8d0f1",
  "private_key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7Vx1rNzYyjDzB\nIjnp5xICEA+N8BNcY39fsq3ypKUPYyiuCtoDQu8PewMvf35GJMBVxqKu8lQxBUTd\nGalgCYrbVWEE9a0U57slAve3i0LQ5B+fAF879b2GcEjMlrXWCU1wJzC7Uu==\n-----END PRIVATE KEY-----\n",
  "client_email": "runner@airlock-jobs.iam.gserviceaccount.com",
  "client_id": "104583457212345678901",
  "auth_uri": "https://accounts.google.com/o/oauth2/auth",
  "token_uri": "https://oauth2.googleapis.com/token"
}
"#;
    let expected = r#"{
  "type": "service_account",
  "project_id": "airlock-jobs",
  "private_key_id": "3f9a1c7e5b2d4f60a8c1e9b7d3f5a2c4e6b8d0f1",
  "private_key": "[REDACTED:private-key]\n",
  "client_email": "runner@airlock-jobs.iam.gserviceaccount.com",
  "client_id": "104583457212345678901",
  "auth_uri": "https://accounts.google.com/o/oauth2/auth",
  "token_uri": "https://oauth2.googleapis.com/token"
}
"#;
    let out = builtin().redact(file);
    assert_eq!(out.text, expected);
    assert_eq!(out.count, 1);
}

#[test]
fn a_truncated_private_key_is_still_redacted() {
    let text = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAJ9BvVvLsPHXvabshwfXd8bxP6YN5igcX3jeP2GLGpI/A7s3aEcu6t7E\nYyjDzBIjnp5xICEA+N8BNcY39fsq3yp";
    assert_eq!(builtin().redact(text).text, "[REDACTED:private-key]");
}

#[test]
fn several_secrets_in_one_output_are_each_counted() {
    let text = CASES.iter().map(|c| c.input).collect::<Vec<_>>().join("\n");
    let expected = CASES
        .iter()
        .map(|c| c.expected)
        .collect::<Vec<_>>()
        .join("\n");
    let out = builtin().redact(&text);
    assert_eq!(out.text, expected);
    assert_eq!(out.count, CASES.len() as u64);
    let mut by_rule: BTreeMap<String, u64> = BTreeMap::new();
    for c in CASES {
        *by_rule.entry(c.id.to_owned()).or_default() += 1;
    }
    assert_eq!(out.by_rule, by_rule);
}

#[test]
fn overlapping_rules_redact_the_union() {
    // The bearer token is also a JWT that runs past the bearer rule's match: one marker,
    // nothing of either left.
    let jwt = CASES.iter().find(|c| c.id == "jwt").unwrap().input;
    let jwt = jwt.trim_start_matches("id_token: ");
    let text = format!("Authorization: Bearer {jwt}\n");
    let out = builtin().redact(&text);
    assert_eq!(out.text, "Authorization: Bearer [REDACTED:jwt]\n");
    assert_eq!(out.count, 1);
}

/// Found by the properties: the END label used to run on into the next key's BEGIN line,
/// and the second key's body was left in clear.
#[test]
fn two_private_keys_on_one_line_are_both_redacted() {
    let ec = CASES[5].input;
    let rsa = CASES[4].input.trim_end_matches("\nkey loaded");
    assert!(ec.starts_with("-----BEGIN EC") && rsa.starts_with("-----BEGIN RSA"));
    let out = builtin().redact(&format!("{ec} {rsa}\n"));
    assert_eq!(out.text, "[REDACTED:private-key] [REDACTED:private-key]\n");
    assert_eq!(out.count, 2);
}

/// airlock escapes a carriage return as the four characters `\x0d` before redaction: every
/// case still redacts the same with CRLF line ends.
#[test]
fn escaped_carriage_returns_do_not_hide_secrets() {
    for case in CASES {
        let input = format!("{}\n", case.input).replace('\n', "\\x0d\n");
        let expected = format!("{}\n", case.expected).replace('\n', "\\x0d\n");
        let out = builtin().redact(&input);
        assert_eq!(out.text, expected, "{}", case.id);
        assert_eq!(out.count, 1);
    }
}
