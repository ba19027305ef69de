//! The store: whiteouts, import and export round trips, names, removal.

use std::fs;

use super::common::{Area, TarBuilder, make_image};

#[test]
fn whiteouts_remove_lower_layers_only() {
    let area = Area::new();
    let store = area.store();
    let l1 = TarBuilder::new()
        .dir("a", 0o755)
        .file("a/x", 0o644, b"x")
        .file("a/y", 0o644, b"y")
        .dir("b", 0o755)
        .file("b/z", 0o644, b"z")
        .dir("d", 0o755)
        .file("d/old", 0o644, b"old")
        .file("keep", 0o644, b"keep")
        .finish();
    let l2 = TarBuilder::new()
        .file("a/.wh.x", 0o644, b"")
        .file(".wh.b", 0o644, b"")
        .file("d/new", 0o644, b"new")
        .file("d/.wh..wh..opq", 0o644, b"")
        // A whiteout never hides what its own layer made.
        .file("same", 0o644, b"same")
        .file(".wh.same", 0o644, b"")
        .finish();
    let record = make_image(&store, &[l1, l2]).unwrap();
    let (root, _) = store.rootfs(&record.id).unwrap();
    assert!(!root.join("a/x").exists());
    assert_eq!(fs::read(root.join("a/y")).unwrap(), b"y");
    assert!(!root.join("b").exists());
    assert!(!root.join("d/old").exists());
    assert_eq!(fs::read(root.join("d/new")).unwrap(), b"new");
    assert_eq!(fs::read(root.join("same")).unwrap(), b"same");
    assert_eq!(fs::read(root.join("keep")).unwrap(), b"keep");
    // No whiteout file itself lands in the tree.
    let mut whiteouts = Vec::new();
    super::common::walk(&root, &mut |p| {
        if p.file_name().unwrap().to_string_lossy().starts_with(".wh.") {
            whiteouts.push(p.to_owned());
        }
    });
    assert!(whiteouts.is_empty(), "{whiteouts:?}");
}

#[test]
fn modes_hard_links_and_replacements_apply() {
    let area = Area::new();
    let store = area.store();
    let l1 = TarBuilder::new()
        .dir("ro", 0o555)
        .file("ro/f", 0o444, b"f")
        .file("bin-tool", 0o755, b"tool")
        .hardlink("tool-link", "bin-tool")
        .file("was-file", 0o644, b"file")
        .finish();
    let l2 = TarBuilder::new()
        .dir("was-file", 0o755)
        .file("was-file/inner", 0o644, b"i")
        .finish();
    let record = make_image(&store, &[l1, l2]).unwrap();
    let (root, _) = store.rootfs(&record.id).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(root.join("ro")).unwrap().mode() & 0o7777,
        0o555
    );
    assert_eq!(
        fs::metadata(root.join("bin-tool")).unwrap().mode() & 0o7777,
        0o755
    );
    assert_eq!(
        fs::metadata(root.join("bin-tool")).unwrap().ino(),
        fs::metadata(root.join("tool-link")).unwrap().ino()
    );
    assert_eq!(fs::read(root.join("was-file/inner")).unwrap(), b"i");
}

#[test]
fn export_and_import_round_trip_with_the_same_id_and_names_move() {
    let area = Area::new();
    let store = area.store();
    let record = make_image(
        &store,
        &[TarBuilder::new().file("hello", 0o644, b"hi").finish()],
    )
    .unwrap();
    let archive = area.dir.path().join("store/tmp-archive.tar");
    let mut out = Vec::new();
    airlock_oci::export::write_archive(
        &store,
        &record,
        Some("airlock-oci-test/exported:v1"),
        &mut out,
    )
    .unwrap();
    // Deterministic: the same image gives the same archive.
    let mut again = Vec::new();
    airlock_oci::export::write_archive(
        &store,
        &record,
        Some("airlock-oci-test/exported:v1"),
        &mut again,
    )
    .unwrap();
    assert_eq!(out, again);
    fs::write(&archive, &out).unwrap();

    let other = tempfile::tempdir().unwrap();
    let store2 = airlock_oci::ImageStore::open(other.path()).unwrap();
    let imported = airlock_oci::import::import(&store2, &archive, None).unwrap();
    assert_eq!(imported.id, record.id);
    assert_eq!(imported.manifest, record.manifest);
    assert_eq!(imported.names, vec!["airlock-oci-test/exported:v1"]);
    assert_eq!(
        store2.resolve("airlock-oci-test/exported:v1").unwrap().id,
        record.id
    );
    assert_eq!(
        store2.resolve(record.manifest.as_str()).unwrap().id,
        record.id
    );
    assert_eq!(
        store2
            .resolve(&format!("anything@{}", record.id))
            .unwrap()
            .id,
        record.id
    );

    // As a docker save archive only (manifest.json, no OCI layout): the same id.
    let docker_dir = tempfile::tempdir().unwrap();
    let mut ar = tar::Archive::new(&out[..]);
    ar.unpack(docker_dir.path()).unwrap();
    fs::remove_file(docker_dir.path().join("oci-layout")).unwrap();
    fs::remove_file(docker_dir.path().join("index.json")).unwrap();
    let store3_dir = tempfile::tempdir().unwrap();
    let store3 = airlock_oci::ImageStore::open(store3_dir.path()).unwrap();
    let from_docker = airlock_oci::import::import(&store3, docker_dir.path(), None).unwrap();
    assert_eq!(
        from_docker.id, record.id,
        "the image id is the config digest either way"
    );

    // A name moves to the image that takes it.
    let second = make_image(
        &store2,
        &[TarBuilder::new().file("other", 0o644, b"o").finish()],
    )
    .unwrap();
    store2
        .commit(
            &second.manifest,
            &["airlock-oci-test/exported:v1".into()],
            "t",
        )
        .unwrap();
    assert_eq!(
        store2.resolve("airlock-oci-test/exported:v1").unwrap().id,
        second.id
    );
    assert!(store2.record(&record.id).unwrap().unwrap().names.is_empty());

    // rm takes the record, the tree and the blobs only it used.
    let removed = store2.remove(record.id.as_str()).unwrap();
    assert_eq!(removed.id, record.id);
    assert!(store2.record(&record.id).unwrap().is_none());
    assert!(!store2.rootfs_path(&record.id).exists());
    assert!(!store2.blob_path(&record.layers[0].digest).exists());
    assert!(store2.blob_path(&second.layers[0].digest).exists());
    let index = fs::read_to_string(other.path().join("index.json")).unwrap();
    assert!(index.contains(second.manifest.as_str()) && !index.contains(record.manifest.as_str()));
}

#[test]
fn a_hostile_archive_to_import_is_refused() {
    let area = Area::new();
    let store = area.store();
    let archive = area.dir.path().join("store/evil.tar");
    fs::write(
        &archive,
        TarBuilder::new()
            .file("../outside/pwned", 0o644, b"x")
            .finish(),
    )
    .unwrap();
    let err = airlock_oci::import::import(&store, &archive, None).unwrap_err();
    assert!(err.to_string().contains(".."), "{err}");
    fs::remove_file(&archive).unwrap();
    area.assert_nothing_kept();
}
