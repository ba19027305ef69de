//! The built Python image run by real jobs: from inside the sandbox, no gcc, pip, apt or
//! setuid file; the wheels import; the same digest on every backend, in the observation
//! and in the audit line. Needs the image `scripts/ci/images.sh` builds:
//! `AIRLOCK_TEST_OCI_STORE` (the store) and `AIRLOCK_TEST_OCI_IMAGE` (`NAME@sha256:ID`);
//! `AIRLOCK_TEST_OCI_BACKENDS` lists the backends to run it on (default `native`).

use std::path::Path;

use super::common::{airlock_bin, skip_or_fail};

mod docker;

/// The probe: python3-minimal has no json or shutil, so plain `key=value` lines.
const PROBE: &str = r#"
import os, stat
for name in ["gcc", "cc", "pip", "pip3", "apt", "apt-get", "dpkg", "as", "ld"]:
    for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/sbin", "/usr/local/bin"]:
        if d and os.path.exists(os.path.join(d, name)):
            print("found=" + os.path.join(d, name))
for top in ["/usr", "/etc", "/var", "/opt", "/srv", "/home", "/root", "/bin", "/sbin", "/lib"]:
    for d, dirs, files in os.walk(top):
        for name in files + dirs:
            p = os.path.join(d, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                print("setid=" + p)
try:
    import pip
    print("pip_module=yes")
except ImportError:
    print("pip_module=no")
import six, packaging.version
print("uid=%d" % os.getuid())
print("gid=%d" % os.getgid())
print("six=" + six.__version__)
print("packaging=" + str(packaging.version.Version("24.1")))
"#;

fn env() -> Option<(String, String)> {
    let store = std::env::var("AIRLOCK_TEST_OCI_STORE")
        .ok()
        .filter(|v| !v.is_empty());
    let image = std::env::var("AIRLOCK_TEST_OCI_IMAGE")
        .ok()
        .filter(|v| !v.is_empty());
    match (store, image) {
        (Some(s), Some(i)) => Some((s, i)),
        _ => {
            skip_or_fail(
                "AIRLOCK_TEST_OCI_STORE and AIRLOCK_TEST_OCI_IMAGE are not set (scripts/ci/images.sh builds the image)",
            );
            None
        }
    }
}

fn policy(dir: &Path, store: &str, image: &str) -> std::path::PathBuf {
    let path = dir.join("policy.toml");
    let docker =
        std::env::var("AIRLOCK_DOCKER_SOCKET").unwrap_or_else(|_| "/var/run/docker.sock".into());
    let podman =
        std::env::var("AIRLOCK_PODMAN_SOCKET").unwrap_or_else(|_| "/run/podman/podman.sock".into());
    std::fs::write(
        &path,
        format!(
            "version = \"oci-test-1\"\n[limits]\ntimeout = \"20s\"\n[filesystem]\nrootfs = \"image:{image}\"\n\
             [images]\nstore = {store:?}\nrebuild_age_days = 30\n[docker]\ndocker_socket = {docker:?}\npodman_socket = {podman:?}\n\
             [audit]\npath = \"audit.jsonl\"\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn the_built_image_runs_stripped_with_the_same_digest_on_every_backend() {
    let Some((store, image)) = env() else { return };
    if !airlock_bin().is_file() {
        return skip_or_fail("no airlock binary (cargo build -p airlock-cli)");
    }
    let digest = image.rsplit_once('@').unwrap().1.to_owned();
    let backends = std::env::var("AIRLOCK_TEST_OCI_BACKENDS").unwrap_or_else(|_| "native".into());
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), &store, &image);
    let mut seen = Vec::new();
    for backend in backends.split(',').filter(|b| !b.is_empty()) {
        let out = std::process::Command::new(airlock_bin())
            .env("AIRLOCK_STATE_DIR", dir.path())
            .args(["run", "--json", "--backend", backend, "--policy"])
            .arg(&policy)
            .args(["-c", PROBE])
            .output()
            .unwrap();
        let obs: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{backend}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(obs["ok"], true, "{backend}: {obs:#}");
        assert_eq!(obs["image_digest"], digest.as_str(), "{backend}");
        let stdout = obs["stdout"].as_str().unwrap();
        let lines: Vec<&str> = stdout.lines().collect();
        let bad: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with("found=") || l.starts_with("setid="))
            .collect();
        assert!(bad.is_empty(), "{backend}: in the image: {bad:?}");
        for want in [
            "pip_module=no",
            "uid=65534",
            "gid=65534",
            "six=1.16.0",
            "packaging=24.1",
        ] {
            assert!(lines.contains(&want), "{backend}: want {want} in {stdout}");
        }
        seen.push(backend.to_owned());
    }
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), seen.len());
    for line in &lines {
        assert_eq!(line["image_digest"], digest.as_str(), "audit line {line}");
    }
    eprintln!("ran on {seen:?} with {digest}");
}

#[test]
fn an_image_missing_from_the_store_is_refused_not_pulled() {
    let Some((store, image)) = env() else { return };
    let dir = tempfile::tempdir().unwrap();
    let missing = format!(
        "{}@sha256:{}",
        image.rsplit_once('@').unwrap().0,
        "0".repeat(64)
    );
    let policy = policy(dir.path(), &store, &missing);
    let out = std::process::Command::new(airlock_bin())
        .env("AIRLOCK_STATE_DIR", dir.path())
        .args(["run", "--json", "--policy"])
        .arg(&policy)
        .args(["-c", "print('must not run')"])
        .output()
        .unwrap();
    let obs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(obs["outcome"], "error", "{obs:#}");
    let message = obs["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("no image") && message.contains("airlock image"),
        "{message}"
    );
}

#[test]
fn doctor_reports_the_image_and_warns_when_it_is_older_than_the_rebuild_age() {
    let Some((store, image)) = env() else { return };
    let dir = tempfile::tempdir().unwrap();
    let fresh_policy = policy(dir.path(), &store, &image);
    let age_check = |policy: &Path| {
        let out = std::process::Command::new(airlock_bin())
            .env("AIRLOCK_STATE_DIR", dir.path())
            .args(["doctor", "--json", "--policy"])
            .arg(policy)
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["control"] == "image age")
            .cloned()
            .unwrap_or_else(|| panic!("no image age check: {report:#}"))
    };
    assert_eq!(age_check(&fresh_policy)["status"], "ok");

    // An image whose config says it was made 40 days ago, in a store of its own.
    let old_store = dir.path().join("old-store");
    let store = airlock_oci::ImageStore::open(&old_store).unwrap();
    let tar = super::common::TarBuilder::new().dir("usr", 0o755).finish();
    let blob = super::common::gzip(&tar);
    let layer = airlock_oci::image::LayerRef {
        digest: store.add_blob_bytes(&blob).unwrap(),
        diff_id: airlock_oci::Digest::of_bytes(&tar),
        media_type: airlock_oci::unpack::Compression::Gzip
            .oci_media_type()
            .into(),
        size: blob.len() as u64,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let config = airlock_oci::image::render_config(&airlock_oci::image::ConfigSpec {
        created: Some(airlock_oci::store::format_rfc3339(now - 40 * 86_400)),
        user: "65534:65534".into(),
        env: vec![],
        working_dir: "/".into(),
        labels: vec![],
        diff_ids: vec![layer.diff_id.clone()],
        history: vec![],
    });
    let config_digest = store.add_blob_bytes(&config).unwrap();
    let manifest =
        airlock_oci::image::render_manifest((&config_digest, config.len() as u64), &[layer]);
    let manifest = store.add_blob_bytes(&manifest).unwrap();
    let record = store
        .commit(&manifest, &["airlock-oci-test/old:1".into()], "test")
        .unwrap();
    let old_policy = policy(
        dir.path(),
        &old_store.display().to_string(),
        &format!("airlock-oci-test/old:1@{}", record.id),
    );
    let check = age_check(&old_policy);
    assert_eq!(check["status"], "warning", "{check}");
    assert!(
        check["detail"].as_str().unwrap().contains("40 days ago"),
        "{check}"
    );
}
