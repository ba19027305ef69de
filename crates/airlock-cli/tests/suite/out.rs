//! `/out`: size-capped, released as regular files only, never following a link.

use pretty_assertions::assert_eq;

use super::common::TestEnv;
use crate::require_native;

/// Python (standard library only) that writes a small PNG and prints its sha256.
const PNG_JOB: &str = r#"
import hashlib, struct, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
w, h = 16, 8
rows = b"".join(b"\x00" + b"".join(bytes([x * 16, y * 32, 128]) for x in range(w)) for y in range(h))
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) \
    + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
open("/out/plot.png", "wb").write(png)
print(hashlib.sha256(png).hexdigest())
"#;

#[test]
fn a_png_comes_back_with_its_sha256_and_media_type() {
    require_native!();
    let env = TestEnv::new();
    let out = env.path().join("out");
    let run = env.run_json(&["--out", out.to_str().unwrap(), "-c", PNG_JOB]);
    assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
    let printed = run.obs["stdout"].as_str().unwrap().trim().to_owned();
    let files = run.obs["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{:#}", run.obs);
    assert_eq!(files[0]["path"], "plot.png");
    assert_eq!(files[0]["media_type"], "image/png");
    assert_eq!(files[0]["sha256"], printed.as_str());
    let copied = std::fs::read(out.join("plot.png")).unwrap();
    assert_eq!(files[0]["bytes"], copied.len());
    let audit = env.audit_lines();
    assert_eq!(audit[0]["files_released"], 1);
}

#[test]
fn writing_a_gigabyte_into_out_stops_at_the_cap() {
    require_native!();
    let env = TestEnv::new();
    let out = env.path().join("out");
    let job = "import errno\ntry:\n    with open('/out/big', 'wb') as f:\n        for _ in range(1024):\n            f.write(b'x' * (1 << 20))\n    print('wrote it all')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])";
    let run = env.run_json(&["--out", out.to_str().unwrap(), "-c", job]);
    assert_eq!(run.obs["stdout"], "ENOSPC\n", "{:#}", run.obs);
    let rejected = run.obs["rejected_files"].as_array().unwrap();
    assert!(
        rejected.iter().any(|r| r["reason"]
            .as_str()
            .unwrap()
            .contains("reached its cap of 8MiB")),
        "{rejected:?}"
    );
    let size = std::fs::metadata(out.join("big"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(size <= 8 * 1024 * 1024, "{size} bytes released");
}

#[test]
fn links_fifos_and_devices_in_out_are_rejected_and_never_followed() {
    require_native!();
    let env = TestEnv::new();
    // A host file the job cannot see; a link to its host path must not be followed.
    let host_secret = env.path().join("host-secret.txt");
    std::fs::write(&host_secret, "HOST-ONLY-CONTENT").unwrap();
    let out = env.path().join("out");
    let job = format!(
        "import os, socket\nos.symlink('/etc/passwd', '/out/passwd')\nos.symlink({:?}, '/out/host')\nos.mkfifo('/out/fifo')\nsocket.socket(socket.AF_UNIX).bind('/out/sock')\nopen('/out/ok.txt', 'w').write('fine')\nos.link('/out/ok.txt', '/out/ok2.txt')\nopen('/out/plain.txt', 'w').write('plain')",
        host_secret.display().to_string()
    );
    let run = env.run_json(&["--out", out.to_str().unwrap(), "-c", &job]);
    assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
    let reasons: Vec<(String, String)> = run.obs["rejected_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap().to_owned(),
                r["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let reason_of = |path: &str| {
        reasons
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    };
    assert!(reason_of("passwd").contains("symbolic link"), "{reasons:?}");
    assert!(reason_of("host").contains("symbolic link"), "{reasons:?}");
    assert_eq!(reason_of("fifo"), "fifo");
    assert_eq!(reason_of("sock"), "socket");
    assert!(reason_of("ok.txt").contains("hard link"), "{reasons:?}");
    let released: Vec<&str> = run.obs["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(released, vec!["plain.txt"]);
    // Nothing but the released file was written, and no host content leaked anywhere.
    let mut written: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(written, vec!["plain.txt"]);
    let text = run.obs.to_string();
    assert!(!text.contains("HOST-ONLY-CONTENT"));
    assert!(!text.contains("root:x:0:0"));
    // The audit line counts what was held back as well as what was released.
    let audit = env.audit_lines();
    assert_eq!(audit[0]["files_released"], 1);
    assert_eq!(audit[0]["files_rejected"], reasons.len(), "{reasons:?}");
}

#[test]
fn out_does_not_exist_unless_asked_for() {
    require_native!();
    let env = TestEnv::new();
    let run = env.run_json(&["-c", "import os\nprint(os.path.exists('/out'))"]);
    assert_eq!(run.obs["stdout"], "False\n");
    assert_eq!(run.obs["files"], serde_json::json!([]));
}

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
