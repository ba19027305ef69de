//! Importing `docker save` archives and OCI layouts shaped as Docker and skopeo write them
//! (the real tools' output is imported in `suite::e2e::docker`): links between the
//! archive's own files are followed, links out of it never are.

use std::fs;

use airlock_oci::Digest;
use serde_json::json;

use super::common::{Area, TarBuilder, walk};

/// A Docker-style config for layers with these uncompressed digests.
fn docker_config(diff_ids: &[&Digest]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "architecture": airlock_oci::image::host_architecture(),
        "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin"], "Cmd": null, "User": ""},
        "created": "2024-05-01T12:00:00.123456789Z",
        "docker_version": "20.10.24+dfsg1",
        "history": [{"created": "2024-05-01T12:00:00.123456789Z", "comment": "Imported from -"}],
        "rootfs": {"type": "layers", "diff_ids": diff_ids.iter().map(|d| d.as_str()).collect::<Vec<_>>()},
    }))
    .unwrap()
}

/// Every file of the store holding `needle`.
fn store_files_containing(area: &Area, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    walk(&area.dir.path().join("store"), &mut |p| {
        if p.is_file()
            && fs::read(p)
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle)
        {
            found.push(p.to_owned());
        }
    });
    found
}

#[test]
fn a_repeated_layer_linked_inside_the_archive_imports() {
    // docker save writes a layer whose content an earlier layer already had as a
    // symlink to that layer's layer.tar.
    let area = Area::new();
    let store = area.store();
    let layer = TarBuilder::new().file("hello", 0o644, b"hi").finish();
    let diff_id = Digest::of_bytes(&layer);
    let config = docker_config(&[&diff_id, &diff_id]);
    let config_name = format!("{}.json", Digest::of_bytes(&config).hex());
    let manifest = json!([{
        "Config": config_name,
        "RepoTags": ["airlock-oci-test/repeated:1"],
        "Layers": ["aaaa/layer.tar", "bbbb/layer.tar"],
    }]);
    let archive = TarBuilder::new()
        .file(&config_name, 0o644, &config)
        .dir("aaaa", 0o755)
        .file("aaaa/layer.tar", 0o644, &layer)
        .dir("bbbb", 0o755)
        .symlink("bbbb/layer.tar", "../aaaa/layer.tar")
        .file(
            "manifest.json",
            0o644,
            &serde_json::to_vec(&manifest).unwrap(),
        )
        .finish();
    let path = area.dir.path().join("save.tar");
    fs::write(&path, archive).unwrap();
    let record = airlock_oci::import::import(&store, &path, None).unwrap();
    assert_eq!(record.id, Digest::of_bytes(&config));
    assert_eq!(record.names, vec!["airlock-oci-test/repeated:1"]);
    assert_eq!(record.layers.len(), 2);
    assert!(record.layers.iter().all(|l| l.diff_id == diff_id));
    let (root, _) = store.rootfs(&record.id).unwrap();
    assert_eq!(fs::read(root.join("hello")).unwrap(), b"hi");
}

#[test]
fn a_docker_save_archive_linking_out_of_itself_copies_no_host_file() {
    // A hostile archive whose config or layer is a symlink to a host file: without the
    // check, the host file was read into a world-readable blob of the store.
    for link_the in ["config", "layer"] {
        let area = Area::new();
        let store = area.store();
        let secret = area.outside().join("secret");
        fs::write(&secret, b"root:$6$host-secret-hash:19000::::::\n").unwrap();
        let layer = TarBuilder::new().file("hello", 0o644, b"hi").finish();
        let config = docker_config(&[&Digest::of_bytes(&layer)]);
        let secret_target = secret.display().to_string();
        let mut archive = TarBuilder::new();
        archive = if link_the == "config" {
            archive.symlink("c.json", &secret_target)
        } else {
            archive.file("c.json", 0o644, &config)
        };
        archive = archive.dir("l", 0o755);
        archive = if link_the == "layer" {
            archive.symlink("l/layer.tar", &secret_target)
        } else {
            archive.file("l/layer.tar", 0o644, &layer)
        };
        let manifest =
            json!([{"Config": "c.json", "RepoTags": ["x:1"], "Layers": ["l/layer.tar"]}]);
        let archive = archive
            .file(
                "manifest.json",
                0o644,
                &serde_json::to_vec(&manifest).unwrap(),
            )
            .finish();
        let path = area.dir.path().join("store/evil.tar");
        fs::write(&path, archive).unwrap();
        let err = airlock_oci::import::import(&store, &path, None).unwrap_err();
        let text = super::common::chain(&err);
        assert!(
            text.contains("leads out of the directory"),
            "{link_the}: {text}"
        );
        fs::remove_file(&path).unwrap();
        assert!(
            store_files_containing(&area, b"host-secret-hash").is_empty(),
            "{link_the}: the host file was copied into the store"
        );
        fs::remove_file(&secret).unwrap();
        area.assert_nothing_kept();
    }
}

#[test]
fn an_oci_layout_directory_with_a_blob_linking_out_is_refused() {
    let area = Area::new();
    let source = tempfile::tempdir().unwrap();
    let src = area.store();
    let record =
        super::common::make_image(&src, &[TarBuilder::new().file("a", 0o644, b"a").finish()])
            .unwrap();
    // Its archive unpacked is a valid OCI layout; move the config out and link to it.
    let layout = source.path().join("layout");
    let mut bytes = Vec::new();
    airlock_oci::export::write_archive(&src, &record, None, &mut bytes).unwrap();
    tar::Archive::new(&bytes[..]).unpack(&layout).unwrap();
    let config = layout.join("blobs/sha256").join(record.id.hex());
    let moved = source.path().join("config-elsewhere");
    fs::rename(&config, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &config).unwrap();
    let fresh = Area::new();
    let err = airlock_oci::import::import(&fresh.store(), &layout, None).unwrap_err();
    assert!(
        super::common::chain(&err).contains("leads out of the directory"),
        "{}",
        super::common::chain(&err)
    );
    fresh.assert_nothing_kept();
}
