//! `airlock token new`: the token alone on stdout, the entry appended to a tokens file
//! that `airlock serve` then loads.

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use super::common::airlock_bin;

fn token_new(args: &[&str]) -> std::process::Output {
    Command::new(airlock_bin())
        .args(["token", "new"])
        .args(args)
        .output()
        .unwrap()
}

fn only_the_token(stdout: &[u8]) -> String {
    let text = String::from_utf8(stdout.to_vec()).unwrap();
    let token = text
        .strip_suffix('\n')
        .unwrap_or_else(|| panic!("{text:?}"));
    assert!(token.starts_with("alk_") && token.len() == 47, "{text:?}");
    assert!(!token.contains('\n'), "{text:?}");
    token.to_owned()
}

#[test]
fn tokens_file_gets_the_digest_and_stdout_only_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    let file = path.to_str().unwrap();
    let first = token_new(&["--tenant", "alice", "--tokens-file", file]);
    assert!(first.status.success(), "{first:?}");
    let alice = only_the_token(&first.stdout);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let second = token_new(&[
        "--tenant",
        "bob",
        "--max-in-flight",
        "2",
        "--tokens-file",
        file,
    ]);
    assert!(second.status.success(), "{second:?}");
    let bob = only_the_token(&second.stdout);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(&alice) && !text.contains(&bob), "{text}");
    let tokens = airlock_server::TokensFile::load(&path).unwrap();
    assert_eq!(tokens.authenticate(&alice).unwrap().name, "alice");
    assert_eq!(tokens.authenticate(&bob).unwrap().max_in_flight, Some(2));

    // The same tenant again, or a file others may write: refused, nothing on stdout,
    // the file unchanged.
    let again = token_new(&["--tenant", "alice", "--tokens-file", file]);
    assert!(!again.status.success());
    assert!(again.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("nothing was written"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let open = token_new(&["--tenant", "carol", "--tokens-file", file]);
    assert!(!open.status.success());
    assert!(open.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&open.stderr);
    assert!(stderr.contains("group or others"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
}

#[test]
fn without_a_tokens_file_stdout_is_the_token_and_stderr_the_entry() {
    let output = token_new(&["--tenant", "me"]);
    assert!(output.status.success(), "{output:?}");
    let token = only_the_token(&output.stdout);
    // stderr is valid TOML as it is (comments and the entry): `2>>tokens.toml` works.
    let stderr = String::from_utf8(output.stderr).unwrap();
    let tokens = airlock_server::TokensFile::parse(&stderr, std::path::Path::new("/")).unwrap();
    assert_eq!(tokens.authenticate(&token).unwrap().name, "me");
    assert!(!stderr.contains(&token));
}
