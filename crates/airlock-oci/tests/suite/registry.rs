//! Pull by digest from a real registry on 127.0.0.1 (Debian's docker-registry, started by
//! `scripts/ci/images.sh`, which also gives its storage directory so a blob can be
//! tampered with): the pulled image has the pushed image's id, and content that does not
//! match its digest is refused.

use std::path::PathBuf;
use std::process::Command;

use super::common::{Area, TarBuilder, make_image, skip_or_fail, walk};

struct Registry {
    addr: String,
    storage: PathBuf,
}

fn registry() -> Option<Registry> {
    let addr = std::env::var("AIRLOCK_TEST_REGISTRY")
        .ok()
        .filter(|v| !v.is_empty());
    let storage = std::env::var_os("AIRLOCK_TEST_REGISTRY_STORAGE").map(PathBuf::from);
    let skopeo = Command::new("skopeo")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    match (addr, storage, skopeo) {
        (Some(addr), Some(storage), true) => Some(Registry { addr, storage }),
        _ => {
            skip_or_fail(
                "AIRLOCK_TEST_REGISTRY, AIRLOCK_TEST_REGISTRY_STORAGE and skopeo are needed (scripts/ci/images.sh)",
            );
            None
        }
    }
}

/// Builds a small image, pushes it with skopeo, and returns the area, the record and the
/// pushed repository.
fn push_image(reg: &Registry, marker: &str) -> (Area, airlock_oci::ImageRecord, String) {
    let area = Area::new();
    let store = area.store();
    let record = make_image(
        &store,
        &[TarBuilder::new()
            .dir("usr", 0o755)
            .file("usr/marker", 0o644, marker.as_bytes())
            .finish()],
    )
    .unwrap();
    let archive = area.dir.path().join("store/push.tar");
    let mut bytes = Vec::new();
    airlock_oci::export::write_archive(&store, &record, None, &mut bytes).unwrap();
    std::fs::write(&archive, bytes).unwrap();
    let repo = format!("{}/airlock-oci-test/{marker}", reg.addr);
    let out = Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("oci-archive:{}", archive.display()))
        .arg(format!("docker://{repo}:t"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&archive).unwrap();
    (area, record, repo)
}

fn pull(
    store: &airlock_oci::ImageStore,
    reference: &str,
) -> Result<airlock_oci::ImageRecord, airlock_oci::OciError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(airlock_oci::pull::pull(
        store,
        reference,
        Some("airlock-oci-test/pulled:1"),
        &airlock_oci::pull::PullOptions {
            plain_http: true,
            basic_auth: None,
        },
    ))
}

fn marker() -> String {
    format!(
        "m{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

#[test]
fn pull_by_digest_gets_the_pushed_image() {
    let Some(reg) = registry() else { return };
    let (_area, record, repo) = push_image(&reg, &marker());
    let other = tempfile::tempdir().unwrap();
    let store = airlock_oci::ImageStore::open(other.path()).unwrap();
    let pulled = pull(&store, &format!("{repo}@{}", record.manifest)).unwrap();
    assert_eq!(pulled.id, record.id, "the same image id");
    assert_eq!(
        pulled.manifest, record.manifest,
        "skopeo kept the manifest byte for byte"
    );
    let (root, _) = store.rootfs(&pulled.id).unwrap();
    assert!(root.join("usr/marker").is_file());
    // A tag is never enough.
    let err = pull(&store, &format!("{repo}:t")).unwrap_err();
    assert!(err.to_string().contains("by digest only"), "{err}");
}

#[test]
fn a_digest_the_registry_does_not_have_is_refused() {
    let Some(reg) = registry() else { return };
    let (_area, _record, repo) = push_image(&reg, &marker());
    let other = tempfile::tempdir().unwrap();
    let store = airlock_oci::ImageStore::open(other.path()).unwrap();
    let wrong = format!("{repo}@sha256:{}", "0".repeat(64));
    assert!(pull(&store, &wrong).is_err());
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn a_tampered_layer_in_the_registry_is_refused() {
    let Some(reg) = registry() else { return };
    let (_area, record, repo) = push_image(&reg, &marker());
    // The registry's copy of the layer: same size, other bytes.
    let hex = record.layers[0].digest.hex().to_owned();
    let mut data = None;
    walk(&reg.storage, &mut |p| {
        if p.ends_with(format!("{}/{hex}/data", &hex[..2])) {
            data = Some(p.to_owned());
        }
    });
    let data = data.expect("the layer blob in the registry's storage");
    let mut bytes = std::fs::read(&data).unwrap();
    let n = bytes.len();
    bytes[n - 12] ^= 0x55;
    std::fs::write(&data, &bytes).unwrap();
    let other = tempfile::tempdir().unwrap();
    let store = airlock_oci::ImageStore::open(other.path()).unwrap();
    let err = pull(&store, &format!("{repo}@{}", record.manifest)).unwrap_err();
    let text = super::common::chain(&err).to_lowercase();
    assert!(text.contains("digest"), "{text}");
    assert!(
        store.list().unwrap().is_empty(),
        "no record for a refused pull"
    );
    assert!(
        !store.blob_path(&record.layers[0].digest).exists(),
        "the tampered blob was not kept"
    );
}
