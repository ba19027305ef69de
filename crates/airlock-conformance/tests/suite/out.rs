//! `/out`: size-capped, released as regular files only, never following a link. Container
//! backends mount the tmpfs on the host; where they cannot (rootless), they refuse. kube
//! refuses `/out` (released files would need a third API call per job or a host path;
//! docs/kube.md).

use pretty_assertions::assert_eq;

use super::common::{JsonRun, Kind, Target, assert_error};

/// Runs an `/out` job, or checks kube's refusal (policy_denied, naming `/out`, nothing run).
fn run_out(t: &Target, out: &std::path::Path, job: &str) -> Option<JsonRun> {
    let run = t.run(&["--out", out.to_str().unwrap(), "-c", job]);
    if t.kind.base() == Kind::Kube {
        assert_error(&run, "policy_denied");
        let message = run.obs["error"]["message"].as_str().unwrap();
        assert!(message.contains("/out"), "{message}");
        assert_eq!(run.obs["stdout"], "");
        assert!(!out.exists() || std::fs::read_dir(out).unwrap().next().is_none());
        return None;
    }
    Some(run)
}

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

conformance! {
    fn a_png_comes_back_with_its_sha256_and_media_type(t: &Target) {
        let out = t.path().join("out");
        let Some(run) = run_out(t, &out, PNG_JOB) else { return };
        assert_eq!(run.obs["ok"], true, "{:#}\n{}", run.obs, run.stderr);
        let printed = run.obs["stdout"].as_str().unwrap().trim().to_owned();
        let files = run.obs["files"].as_array().unwrap();
        assert_eq!(files.len(), 1, "{:#}", run.obs);
        assert_eq!(files[0]["path"], "plot.png");
        assert_eq!(files[0]["media_type"], "image/png");
        assert_eq!(files[0]["sha256"], printed.as_str());
        let copied = std::fs::read(out.join("plot.png")).unwrap();
        assert_eq!(files[0]["bytes"], copied.len());
        let audit = t.audit_lines();
        assert_eq!(audit[0]["files_released"], 1);
    }

    fn writing_a_gigabyte_into_out_stops_at_the_cap(t: &Target) {
        let out = t.path().join("out");
        let job = "import errno\ntry:\n    with open('/out/big', 'wb') as f:\n        for _ in range(1024):\n            f.write(b'x' * (1 << 20))\n    print('wrote it all')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])";
        let Some(run) = run_out(t, &out, job) else { return };
        assert_eq!(run.obs["stdout"], "ENOSPC\n", "{:#}", run.obs);
        // The observation says why the file is missing. gVisor's gofer may keep the last
        // blocks in its own kernel, so the host tmpfs need not end exactly full there.
        if t.kind.base() != Kind::Gvisor {
            let rejected = run.obs["rejected_files"].as_array().unwrap();
            assert!(
                rejected.iter().any(|r| r["reason"].as_str().unwrap().contains("reached its cap of 8MiB")),
                "{rejected:?}"
            );
        }
        let size = std::fs::metadata(out.join("big")).map(|m| m.len()).unwrap_or(0);
        assert!(size <= 8 * 1024 * 1024, "{size} bytes released");
    }

    fn links_fifos_and_hard_links_in_out_are_rejected_and_never_followed(t: &Target) {
        let host_secret = t.path().join("host-secret.txt");
        std::fs::write(&host_secret, "HOST-ONLY-CONTENT").unwrap();
        let out = t.path().join("out");
        let job = format!(
            "import os, socket\nos.symlink('/etc/passwd', '/out/passwd')\nos.symlink({:?}, '/out/host')\nos.mkfifo('/out/fifo')\nsocket.socket(socket.AF_UNIX).bind('/out/sock')\nopen('/out/ok.txt', 'w').write('fine')\nos.link('/out/ok.txt', '/out/ok2.txt')\nopen('/out/plain.txt', 'w').write('plain')",
            host_secret.display().to_string()
        );
        let Some(run) = run_out(t, &out, &job) else { return };
        assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
        let reason_of = |path: &str| {
            run.obs["rejected_files"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["path"] == path)
                .map(|r| r["reason"].as_str().unwrap().to_owned())
                .unwrap_or_default()
        };
        assert!(reason_of("passwd").contains("symbolic link"), "{:#}", run.obs);
        assert!(reason_of("host").contains("symbolic link"));
        // gVisor keeps named pipes and sockets inside its own kernel: the host's /out never
        // has them.
        if t.kind.base() == Kind::Gvisor {
            assert!(["fifo", ""].contains(&reason_of("fifo").as_str()), "{:#}", run.obs);
            assert!(["socket", ""].contains(&reason_of("sock").as_str()), "{:#}", run.obs);
        } else {
            assert_eq!(reason_of("fifo"), "fifo");
            assert_eq!(reason_of("sock"), "socket");
        }
        assert!(reason_of("ok.txt").contains("hard link"));
        let released: Vec<&str> = run.obs["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
        assert_eq!(released, vec!["plain.txt"]);
        // Nothing but the released file was written on the host.
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
        let rejected = run.obs["rejected_files"].as_array().unwrap().len();
        let audit = t.audit_lines();
        assert_eq!(audit[0]["files_released"], 1);
        assert_eq!(audit[0]["files_rejected"], rejected, "{:#}", run.obs);
    }

    fn out_does_not_exist_unless_asked_for(t: &Target) {
        let run = t.run(&["-c", "import os\nprint(os.path.exists('/out'))"]);
        assert_eq!(run.obs["stdout"], "False\n", "{:#}", run.obs);
        assert_eq!(run.obs["files"], serde_json::json!([]));
    }
}
