//! `airlock run --json --return-files`: /out without a directory, files inline.

use base64::Engine as _;
use pretty_assertions::assert_eq;
use serde_json::Value;

use super::common::TestEnv;
use crate::require_native;

const OUT_JOB: &str = "open('/out/data.bin', 'wb').write(bytes(range(256)))\n\
    open('/out/big.txt', 'w').write('x' * 5000)\n\
    open('/out/z.txt', 'w').write('last')";

fn inline(obs: &Value, path: &str) -> Option<Vec<u8>> {
    let file = obs["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("{path} not released: {obs:#}"));
    file.get("content_base64").map(|b| {
        base64::engine::general_purpose::STANDARD
            .decode(b.as_str().unwrap())
            .unwrap()
    })
}

#[test]
fn return_files_gives_out_and_inlines_within_the_cap() {
    require_native!();
    let env = TestEnv::new();
    let policy = env.policy("[filesystem.out]\ninline_bytes = \"1KiB\"");
    let run = env.run_json(&[
        "--return-files",
        "--policy",
        policy.to_str().unwrap(),
        "-c",
        OUT_JOB,
    ]);
    assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
    assert_eq!(
        inline(&run.obs, "data.bin"),
        Some((0..=255).collect::<Vec<u8>>())
    );
    assert_eq!(
        inline(&run.obs, "big.txt"),
        None,
        "5000 B is past the 1KiB cap"
    );
    // Files after one that did not fit still do.
    assert_eq!(inline(&run.obs, "z.txt"), Some(b"last".to_vec()));
}

#[test]
fn return_files_and_out_dir_together_do_both() {
    require_native!();
    let env = TestEnv::new();
    let dir = env.path().join("released");
    let run = env.run_json(&[
        "--return-files",
        "--out",
        dir.to_str().unwrap(),
        "-c",
        OUT_JOB,
    ]);
    assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
    let copied = std::fs::read(dir.join("data.bin")).unwrap();
    assert_eq!(inline(&run.obs, "data.bin"), Some(copied));
    assert_eq!(std::fs::read(dir.join("big.txt")).unwrap().len(), 5000);
}

#[test]
fn out_dir_alone_inlines_nothing() {
    require_native!();
    let env = TestEnv::new();
    let dir = env.path().join("released");
    let run = env.run_json(&["--out", dir.to_str().unwrap(), "-c", OUT_JOB]);
    assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
    assert_eq!(inline(&run.obs, "data.bin"), None);
}

#[test]
fn return_files_needs_json() {
    let env = TestEnv::new();
    let out = env
        .cmd()
        .args(["run", "--return-files", "-c", "print(1)"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--json"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
