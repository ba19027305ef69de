//! `/out` through the CLI's `--out` directory on the host: links planted there, a second
//! run into it. What `/out` itself guarantees on every backend (the cap, links, fifos and
//! sockets rejected, media types and hashes, the audit counts) is in airlock-conformance.

use pretty_assertions::assert_eq;

use super::common::TestEnv;
use crate::require_native;

#[test]
fn a_symlink_planted_in_the_out_dir_is_never_followed_on_the_host() {
    require_native!();
    let env = TestEnv::new();
    // DIR/sub is a link to a host directory; a job writing /out/sub/x.txt must not reach it.
    let elsewhere = env.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let out = env.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::symlink(&elsewhere, out.join("sub")).unwrap();
    let job = "import os\nos.mkdir('/out/sub')\nopen('/out/sub/x.txt', 'w').write('escaped')";
    let run = env.run_json(&["--out", out.to_str().unwrap(), "-c", job]);
    assert_eq!(run.obs["outcome"], "error", "{:#}", run.obs);
    assert_eq!(run.obs["error"]["kind"], "internal");
    let message = run.obs["error"]["message"].as_str().unwrap();
    assert!(message.contains("directory sub"), "{message}");
    assert_eq!(run.code, 125);
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "wrote through the link"
    );
}

#[test]
fn a_second_run_into_the_same_out_dir_reports_the_clash_in_its_observation() {
    require_native!();
    let env = TestEnv::new();
    let out = env.path().join("out");
    let job = "open('/out/report.txt', 'w').write('run')";
    let first = env.run_json(&["--out", out.to_str().unwrap(), "-c", job]);
    assert_eq!(first.obs["ok"], true, "{:#}", first.obs);
    std::fs::write(out.join("report.txt"), "kept").unwrap();
    let second = env.run_json(&["--out", out.to_str().unwrap(), "-c", job]);
    // One observation, and it says the file was not written: never ok:true then exit 125.
    assert_eq!(second.obs["ok"], false, "{:#}", second.obs);
    assert_eq!(second.obs["outcome"], "error");
    let message = second.obs["error"]["message"].as_str().unwrap();
    assert!(message.contains("create report.txt"), "{message}");
    assert!(message.contains("exists"), "{message}");
    assert_eq!(second.code, 125);
    assert_eq!(
        std::fs::read_to_string(out.join("report.txt")).unwrap(),
        "kept"
    );
}
