//! Secret-shaped output is redacted: printed from inside the job, whole or split across two
//! writes with a pause between them, and in released text files.

use pretty_assertions::assert_eq;

use super::common::TestEnv;
use crate::require_native;

/// (rule id, first example) of every curated rule in `policy/redaction/rules.toml`.
fn curated_examples() -> Vec<(String, String)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../policy/redaction/rules.toml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let doc: toml::Value = toml::from_str(&text).unwrap();
    doc["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| {
            (
                rule["id"].as_str().unwrap().to_owned(),
                rule["examples"][0].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Runs a job that prints each example between markers, optionally in two writes with a
/// sleep in between, and returns each section of the observation's stdout.
fn print_examples(split: bool) -> (Vec<(String, String, String)>, serde_json::Value) {
    let env = TestEnv::new();
    let examples = curated_examples();
    assert!(
        examples.len() >= 20,
        "only {} curated rules",
        examples.len()
    );
    let data = env.path().join("secrets.json");
    let list: Vec<&str> = examples.iter().map(|(_, e)| e.as_str()).collect();
    std::fs::write(&data, serde_json::to_string(&list).unwrap()).unwrap();
    let policy = env.policy("[limits]\nstdout = \"1MiB\"\ntimeout = \"5s\"");
    let source = format!(
        "import json, sys, time\n\
         split = {}\n\
         for i, secret in enumerate(json.load(open('/work/secrets.json'))):\n\
         \x20   sys.stdout.write(f'<<{{i}}>>')\n\
         \x20   if split:\n\
         \x20       half = len(secret) // 2\n\
         \x20       sys.stdout.write(secret[:half]); sys.stdout.flush(); time.sleep(0.05)\n\
         \x20       sys.stdout.write(secret[half:])\n\
         \x20   else:\n\
         \x20       sys.stdout.write(secret)\n\
         \x20   sys.stdout.write('\\n'); sys.stdout.flush()",
        if split { "True" } else { "False" }
    );
    let run = env.run_json(&[
        "--policy",
        policy.to_str().unwrap(),
        "--file",
        &format!("secrets.json={}", data.display()),
        "-c",
        &source,
    ]);
    assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
    let stdout = run.obs["stdout"].as_str().unwrap().to_owned();
    let mut sections = Vec::new();
    for (i, (id, example)) in examples.into_iter().enumerate() {
        let start = stdout.find(&format!("<<{i}>>")).unwrap() + format!("<<{i}>>").len();
        let end = stdout[start..]
            .find(&format!("<<{}>>", i + 1))
            .map_or(stdout.len(), |e| start + e);
        sections.push((id, example, stdout[start..end].to_owned()));
    }
    (sections, run.obs)
}

fn assert_all_redacted(sections: &[(String, String, String)]) {
    for (id, example, shown) in sections {
        assert!(
            shown.contains(&format!("[REDACTED:{id}]")),
            "rule {id}: not redacted as itself: {shown:?}"
        );
        // No line of the secret (the part a rule matches) survives whole.
        let longest_line = example.lines().max_by_key(|l| l.len()).unwrap_or("");
        if longest_line.len() >= 16 {
            assert!(
                !shown.contains(longest_line),
                "rule {id}: {longest_line:?} shown in {shown:?}"
            );
        }
    }
}

#[test]
fn every_secret_kind_printed_by_a_job_comes_back_redacted() {
    require_native!();
    let (sections, obs) = print_examples(false);
    assert_all_redacted(&sections);
    assert!(obs["redactions"].as_u64().unwrap() >= sections.len() as u64);
}

#[test]
fn secrets_split_across_two_writes_with_a_pause_are_still_redacted() {
    require_native!();
    let (sections, _) = print_examples(true);
    assert_all_redacted(&sections);
}

#[test]
fn a_secret_at_the_output_cap_is_not_shown_in_part() {
    require_native!();
    let env = TestEnv::new();
    // The token starts 20 bytes before the 8000-byte cap: a naive cut would show its head.
    let secret = format!(
        "ghp_{}",
        "A1b2C3d4E5f6G7h8I9j0"
            .repeat(2)
            .chars()
            .take(36)
            .collect::<String>()
    );
    let source =
        format!("import sys\nsys.stdout.write('x' * 7979 + ' ' + {secret:?} + ' ' + 'y' * 100)");
    let run = env.run_json(&["-c", &source]);
    let stdout = run.obs["stdout"].as_str().unwrap();
    assert_eq!(run.obs["stdout_truncated"], true);
    assert!(
        !stdout.contains("ghp_A1b2"),
        "the head of the token is shown"
    );
    // Its marker would end past the cap, so it is left out whole: the cap is a bound
    // on delivered bytes, and the redaction is still counted.
    assert!(stdout.len() <= 8000, "{}", stdout.len());
    assert!(
        stdout.ends_with(&format!("{} ", "x".repeat(100))),
        "{}",
        &stdout[7900..]
    );
    assert_eq!(run.obs["redactions"], 1);
}

#[test]
fn released_text_files_are_redacted_and_counted() {
    require_native!();
    let env = TestEnv::new();
    let out = env.path().join("out");
    let source = "open('/out/report.txt', 'w').write('token: AKIAIOSFODNN7EXAMPLE\\nok\\n')";
    let run = env.run_json(&["--out", out.to_str().unwrap(), "-c", source]);
    assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
    let written = std::fs::read_to_string(out.join("report.txt")).unwrap();
    assert_eq!(written, "token: [REDACTED:aws-access-key-id]\nok\n");
    assert_eq!(run.obs["files"][0]["redactions"], 1);
    assert_eq!(run.obs["redactions"], 1);
    assert_eq!(env.audit_lines()[0]["redactions"], 1);
}

#[test]
fn the_executors_own_secrets_are_redacted_even_if_a_job_learns_them() {
    require_native!();
    let env = TestEnv::new();
    let policy = env.policy("[redaction]\nexact_env = [\"AIRLOCK_TEST_HOST_SECRET\"]");
    let data = env.path().join("leak.txt");
    std::fs::write(&data, "the value is plain-words-no-pattern\n").unwrap();
    let mut cmd = env.cmd();
    cmd.env("AIRLOCK_TEST_HOST_SECRET", "plain-words-no-pattern");
    cmd.args(["run", "--json", "--policy"])
        .arg(&policy)
        .args(["--file", &format!("leak.txt={}", data.display())])
        .args(["-c", "print(open('/work/leak.txt').read())"]);
    let run = super::common::json_run(cmd.output().unwrap());
    assert_eq!(
        run.obs["stdout"], "the value is [REDACTED:exact]\n\n",
        "{:#}",
        run.obs
    );
}

#[test]
fn secrets_on_stderr_are_redacted_too() {
    require_native!();
    let env = TestEnv::new();
    // A traceback that quotes a token, as a failing client library would print it.
    let source = "import sys\n\
                  print('Traceback (most recent call last):', file=sys.stderr)\n\
                  print('AuthError: bad key xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx', file=sys.stderr)\n\
                  sys.exit(1)";
    let run = env.run_json(&["-c", source]);
    assert_eq!(run.obs["exit_code"], 1, "{:#}", run.obs);
    let stderr = run.obs["stderr"].as_str().unwrap();
    assert!(!stderr.contains("xoxb-1234"), "{stderr}");
    assert!(stderr.contains("AuthError: bad key [REDACTED:"), "{stderr}");
    assert_eq!(run.obs["redactions"], 1);
    assert_eq!(env.audit_lines()[0]["redactions"], 1);
}

/// Half a key on stdout and the rest on stderr: whoever reads the observation can join
/// them, so each half is redacted.
#[test]
fn a_key_split_between_stdout_and_stderr_is_redacted_in_both() {
    require_native!();
    let env = TestEnv::new();
    let source = "import sys\nk = 'ghp_' + 'A1b2C3d4E5f6G7h8I9j0A1b2C3d4E5f6G7h8'\nsys.stdout.write('id ' + k[:18])\nsys.stdout.flush()\nsys.stderr.write(k[18:] + ' end')\n";
    let run = env.run_json(&["-c", source]);
    let stdout = run.obs["stdout"].as_str().unwrap();
    let stderr = run.obs["stderr"].as_str().unwrap();
    assert_eq!(stdout, "id [REDACTED:github-pat]", "{:#}", run.obs);
    assert_eq!(stderr, "[REDACTED:github-pat] end", "{:#}", run.obs);
}
