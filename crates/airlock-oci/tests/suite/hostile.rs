//! Hostile layers: each is refused with an error naming the entry, and nothing is written
//! outside the store (nor kept in it). Setuid files, device nodes and FIFOs, which stock
//! images have, are refused to jobs only: such an image is recorded for builds, without a
//! tree.

use airlock_oci::OciError;
use airlock_oci::unpack::UnpackLimits;

use super::common::{Area, TarBuilder, make_image, stage_image};

fn refused(tar: Vec<u8>, expect: &str) -> Area {
    let area = Area::new();
    let err = make_image(&area.store(), &[tar]).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(expect), "expected {expect:?} in: {text}");
    area.assert_nothing_kept();
    area
}

/// An image jobs must refuse but a build may take as its base: recorded with the reason,
/// no tree in the cache, and every way a job reaches it refused naming the entry.
fn refused_to_jobs(tar: Vec<u8>, expect: &str) {
    let area = Area::new();
    let store = area.store();
    let record = make_image(&store, &[tar]).unwrap();
    let reason = record
        .build_base_only
        .clone()
        .expect("recorded for builds only");
    assert!(reason.contains(expect), "expected {expect:?} in: {reason}");
    assert!(!store.rootfs_path(&record.id).exists());
    let err = store.rootfs(&record.id).unwrap_err();
    assert!(matches!(err, OciError::BuildBaseOnly { .. }), "{err}");
    assert!(err.to_string().contains(expect), "{err}");
    let err =
        airlock_oci::store::rootfs_for_job(store.root(), "t", record.id.as_str()).unwrap_err();
    assert!(err.to_string().contains("for builds only"), "{err}");
    // The unpack the cache does for jobs refuses it by itself, record or not.
    let err = store.ensure_rootfs(&record.id, &record.layers).unwrap_err();
    assert!(matches!(err, OciError::UnpackEntry { .. }), "{err}");
    assert!(err.to_string().contains(expect), "{err}");
    for sub in ["rootfs", "tmp"] {
        let left: Vec<_> = std::fs::read_dir(store.root().join(sub)).unwrap().collect();
        assert!(left.is_empty(), "left in store/{sub}: {left:?}");
    }
    assert!(area.written_outside_store().is_empty());
}

#[test]
fn dot_dot_paths_are_refused() {
    refused(
        TarBuilder::new()
            .file("../outside/pwned", 0o644, b"x")
            .finish(),
        "path with a .. segment",
    );
    refused(
        TarBuilder::new()
            .dir("usr", 0o755)
            .file("usr/../../outside/pwned", 0o644, b"x")
            .finish(),
        "..",
    );
}

#[test]
fn absolute_paths_are_refused() {
    let area = Area::new();
    let target = format!("{}/pwned", area.outside().display());
    let err = make_image(
        &area.store(),
        &[TarBuilder::new().file(&target, 0o644, b"x").finish()],
    )
    .unwrap_err();
    assert!(err.to_string().contains("absolute path"), "{err}");
    area.assert_nothing_kept();
    assert!(!area.outside().join("pwned").exists());
}

#[test]
fn symlinks_out_of_the_tree_are_refused() {
    refused(
        TarBuilder::new()
            .symlink("evil", "../../../../../../etc/shadow")
            .finish(),
        "points out of the tree",
    );
    refused(
        TarBuilder::new()
            .dir("a", 0o755)
            .symlink("a/evil", "../../x")
            .finish(),
        "points out of the tree",
    );
}

#[test]
fn writing_through_a_symlink_is_refused() {
    // An absolute symlink is fine as a link (the sandbox resolves it inside the image),
    // but the unpacker never follows it on the host.
    let area = Area::new();
    let outside = area.outside().display().to_string();
    let tar = TarBuilder::new()
        .symlink("esc", &outside)
        .file("esc/pwned", 0o644, b"x")
        .finish();
    let err = make_image(&area.store(), &[tar]).unwrap_err();
    assert!(err.to_string().contains("goes through a symlink"), "{err}");
    assert!(!area.outside().join("pwned").exists());
    area.assert_nothing_kept();
    // Also across layers: the link in one layer, the write in the next.
    let area = Area::new();
    let l1 = TarBuilder::new().symlink("esc", &outside).finish();
    let l2 = TarBuilder::new().file("esc/pwned", 0o644, b"x").finish();
    let err = make_image(&area.store(), &[l1, l2]).unwrap_err();
    assert!(err.to_string().contains("goes through a symlink"), "{err}");
    area.assert_nothing_kept();
}

#[test]
fn hard_links_out_of_the_tree_are_refused() {
    refused(
        TarBuilder::new()
            .hardlink("hl", "../outside/secret")
            .finish(),
        "points out of the tree",
    );
    refused(
        TarBuilder::new().hardlink("hl", "/etc/passwd").finish(),
        "points out of the tree",
    );
    refused(
        TarBuilder::new().hardlink("hl", "missing").finish(),
        "not in the tree",
    );
    refused(
        TarBuilder::new()
            .dir("d", 0o755)
            .hardlink("hl", "d")
            .finish(),
        "not a file",
    );
    // Through a symlink to outside: refused, the host's file untouched.
    let area = Area::new();
    std::fs::write(area.outside().join("secret"), b"host").unwrap();
    let tar = TarBuilder::new()
        .symlink("esc", &area.outside().display().to_string())
        .hardlink("hl", "esc/secret")
        .finish();
    let err = make_image(&area.store(), &[tar]).unwrap_err();
    assert!(err.to_string().contains("goes through a symlink"), "{err}");
    assert_eq!(
        std::fs::read(area.outside().join("secret")).unwrap(),
        b"host"
    );
    std::fs::remove_file(area.outside().join("secret")).unwrap();
    area.assert_nothing_kept();
}

#[test]
fn device_nodes_and_fifos_are_refused_to_jobs() {
    refused_to_jobs(
        TarBuilder::new()
            .special("dev-null", tar::EntryType::Char)
            .finish(),
        "device node",
    );
    refused_to_jobs(
        TarBuilder::new()
            .special("sda", tar::EntryType::Block)
            .finish(),
        "device node",
    );
    refused_to_jobs(
        TarBuilder::new()
            .special("fifo", tar::EntryType::Fifo)
            .finish(),
        "FIFO",
    );
}

#[test]
fn setuid_and_setgid_files_are_refused_to_jobs() {
    refused_to_jobs(
        TarBuilder::new().file("su", 0o4755, b"x").finish(),
        "setuid/setgid",
    );
    refused_to_jobs(
        TarBuilder::new().file("wall", 0o2755, b"x").finish(),
        "setuid/setgid",
    );
}

#[test]
fn a_build_base_is_still_refused_for_everything_else() {
    // A setuid file first, then an escape: the escape still refuses the whole image.
    refused(
        TarBuilder::new()
            .file("su", 0o4755, b"x")
            .symlink("evil", "../../etc/shadow")
            .finish(),
        "points out of the tree",
    );
}

#[test]
fn a_layer_that_expands_without_bound_is_refused() {
    // 64 MiB of zeros compress to a few KiB; the bound is 8 MiB.
    let area = Area::new();
    let store = area.store().with_limits(UnpackLimits {
        max_bytes: 8 << 20,
        max_entries: 1000,
    });
    let zeros = vec![0u8; 64 << 20];
    let tar = TarBuilder::new().file("bomb", 0o644, &zeros).finish();
    let manifest = stage_image(&store, &[tar], false);
    let err = store.commit(&manifest, &[], "test").unwrap_err();
    assert!(matches!(err, OciError::Bound { .. }), "{err}");
    area.assert_nothing_kept();
}

#[test]
fn too_many_entries_are_refused() {
    let area = Area::new();
    let store = area.store().with_limits(UnpackLimits {
        max_bytes: 1 << 30,
        max_entries: 100,
    });
    let mut tar = TarBuilder::new();
    for i in 0..200 {
        tar = tar.file(&format!("f{i}"), 0o644, b"x");
    }
    let manifest = stage_image(&store, &[tar.finish()], false);
    let err = store.commit(&manifest, &[], "test").unwrap_err();
    assert!(err.to_string().contains("entries"), "{err}");
    area.assert_nothing_kept();
}

#[test]
fn a_wrong_diff_id_is_refused() {
    let area = Area::new();
    let store = area.store();
    let manifest = stage_image(
        &store,
        &[TarBuilder::new().file("a", 0o644, b"x").finish()],
        true,
    );
    let err = store.commit(&manifest, &[], "test").unwrap_err();
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("diff_id"), "{err}");
    area.assert_nothing_kept();
}

#[test]
fn a_tampered_blob_is_refused_on_unpack() {
    let area = Area::new();
    let store = area.store();
    let record = make_image(
        &store,
        &[TarBuilder::new().file("a", 0o644, b"original").finish()],
    )
    .unwrap();
    // Tamper with the stored layer, then force a fresh unpack.
    let blob = store.blob_path(&record.layers[0].digest);
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 9;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    airlock_oci::unpack::remove_tree(&store.rootfs_path(&record.id)).unwrap();
    let err = store.rootfs(&record.id).unwrap_err();
    assert!(
        err.to_string().contains("digest mismatch") || err.to_string().contains("decompress"),
        "{err}"
    );
    assert!(!store.rootfs_path(&record.id).exists());
}
