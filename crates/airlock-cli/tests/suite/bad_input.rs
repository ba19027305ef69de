//! Bad input gets a clear error, exit code 125, and starts no sandbox.

use super::common::{TestEnv, assert_error, json_run};
use crate::require_native;

/// Runs `airlock run --json ARGS` with the native backend's debug log on, and checks that
/// no sandbox was created.
fn refused(env: &TestEnv, args: &[&str]) -> super::common::JsonRun {
    let mut cmd = env.cmd();
    cmd.env("AIRLOCK_LOG", "airlock_native=debug");
    cmd.arg("run").arg("--json").args(args);
    let run = json_run(cmd.output().unwrap());
    assert!(
        !run.stderr.contains("creating sandbox"),
        "a sandbox was created for {args:?}"
    );
    run
}

#[test]
fn sandbox_creation_is_visible_in_the_debug_log() {
    // The check above is only meaningful if a real run logs the line.
    require_native!();
    let env = TestEnv::new();
    let mut cmd = env.cmd();
    cmd.env("AIRLOCK_LOG", "airlock_native=debug");
    cmd.args(["run", "--json", "-c", "pass"]);
    let run = json_run(cmd.output().unwrap());
    assert!(run.stderr.contains("creating sandbox"), "{}", run.stderr);
}

#[test]
fn unknown_language_is_invalid_input() {
    let env = TestEnv::new();
    let run = refused(&env, &["-l", "cobol", "-c", "DISPLAY 'x'"]);
    assert_error(&run, "invalid_input");
    assert!(
        run.obs["error"]["message"]
            .as_str()
            .unwrap()
            .contains("python")
    );
}

#[test]
fn source_over_the_policy_limit_is_invalid_input() {
    let env = TestEnv::new();
    let big = env.path().join("big.py");
    std::fs::write(&big, vec![b'#'; 50 * 1024 * 1024]).unwrap();
    let run = refused(&env, &[big.to_str().unwrap()]);
    assert_error(&run, "invalid_input");
}

#[test]
fn too_many_input_files_or_bytes_are_invalid_input() {
    let env = TestEnv::new();
    let small = env.path().join("small");
    std::fs::write(&small, "x").unwrap();
    let mut args = vec!["-c".to_owned(), "pass".to_owned()];
    for i in 0..65 {
        args.push("--file".to_owned());
        args.push(format!("f{i}={}", small.display()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_error(&refused(&env, &args), "invalid_input");
    let big = env.path().join("big");
    std::fs::write(&big, vec![b'x'; 17 * 1024 * 1024]).unwrap();
    let run = refused(
        &env,
        &["-c", "pass", "--file", &format!("big={}", big.display())],
    );
    assert_error(&run, "invalid_input");
}

#[test]
fn symlinked_input_files_are_never_followed() {
    let env = TestEnv::new();
    let link = env.path().join("link");
    std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
    let run = refused(
        &env,
        &["-c", "pass", "--file", &format!("p={}", link.display())],
    );
    assert_error(&run, "invalid_input");
    assert!(
        run.obs["error"]["message"]
            .as_str()
            .unwrap()
            .contains("symbolic link")
    );
}

#[test]
fn nul_in_source_is_invalid_input() {
    let env = TestEnv::new();
    let src = env.path().join("nul.py");
    std::fs::write(&src, b"print(1)\0print(2)").unwrap();
    let run = refused(&env, &[src.to_str().unwrap()]);
    assert_error(&run, "invalid_input");
}

#[test]
fn escaping_file_names_are_invalid_input() {
    let env = TestEnv::new();
    let data = env.path().join("data.txt");
    std::fs::write(&data, "x").unwrap();
    let long = "n".repeat(300);
    for name in [
        "../escape",
        "/etc/cron.d/x",
        "a//b",
        "a/./b",
        ".airlock-main.py",
        long.as_str(),
    ] {
        let run = refused(
            &env,
            &[
                "-c",
                "pass",
                "--file",
                &format!("{name}={}", data.display()),
            ],
        );
        assert_error(&run, "invalid_input");
    }
}

#[test]
fn zero_negative_and_malformed_limits_are_invalid_input() {
    let env = TestEnv::new();
    for args in [
        ["--timeout", "0s"],
        ["--timeout", "-1s"],
        ["--timeout", "5"],
        ["--memory", "0"],
        ["--memory", "-5MiB"],
        ["--cpus", "0"],
        ["--cpus", "-1"],
        ["--pids", "0"],
        ["--pids", "-1"],
    ] {
        let mut full = args.to_vec();
        full.extend(["-c", "pass"]);
        let run = refused(&env, &full);
        assert_error(&run, "invalid_input");
    }
}

#[test]
fn limits_above_the_ceiling_are_denied() {
    let env = TestEnv::new();
    for args in [
        ["--timeout", "6s"],
        ["--memory", "512MiB"],
        ["--cpus", "2"],
        ["--pids", "65"],
        // Absurd is still above the ceiling: denied, not malformed.
        ["--memory", "100TiB"],
        ["--timeout", "1000000000s"],
    ] {
        let mut full = args.to_vec();
        full.extend(["-c", "pass"]);
        let run = refused(&env, &full);
        assert_error(&run, "policy_denied");
        let message = run.obs["error"]["message"].as_str().unwrap();
        assert!(message.contains("ceiling"), "{message}");
    }
}

#[test]
fn proxy_network_needs_a_proxy_policy() {
    let env = TestEnv::new();
    let run = refused(
        &env,
        &["--net", "proxy", "--allow", "pypi.org:443", "-c", "pass"],
    );
    assert_error(&run, "policy_denied");
}

#[test]
fn env_names_need_the_policy() {
    let env = TestEnv::new();
    let run = refused(&env, &["--env", "OPENAI_API_KEY=sk-x", "-c", "pass"]);
    assert_error(&run, "policy_denied");
}

#[test]
fn unreadable_or_invalid_policy_is_invalid_input() {
    let env = TestEnv::new();
    let missing = env.path().join("missing.toml");
    let run = refused(&env, &["--policy", missing.to_str().unwrap(), "-c", "pass"]);
    assert_error(&run, "invalid_input");
    let bad = env.policy("[limits]\ntimout = \"5s\"");
    let run = refused(&env, &["--policy", bad.to_str().unwrap(), "-c", "pass"]);
    assert_error(&run, "invalid_input");
    assert!(
        run.obs["error"]["message"]
            .as_str()
            .unwrap()
            .contains("timout")
    );
}

#[test]
fn missing_interpreter_is_reported_clearly() {
    require_native!();
    let env = TestEnv::new();
    let policy = env.policy(
        "[languages.ruby]\ncommand = [\"ruby-not-installed\", \"{file}\"]\nfile = \"main.rb\"",
    );
    let run = env.run_json(&[
        "--policy",
        policy.to_str().unwrap(),
        "-l",
        "ruby",
        "-c",
        "puts 1",
    ]);
    assert_error(&run, "invalid_input");
    let message = run.obs["error"]["message"].as_str().unwrap();
    assert!(message.contains("ruby-not-installed"), "{message}");
}
