//! `image build` on an image base (`base = "image:REF@sha256:…"`), without Debian tools:
//! the base's files, the spec's additions, the stripping, a stable digest, the progress
//! the build reports, and clear errors for bad bases. (The debootstrap base and wheels
//! are built by `scripts/ci/images.sh`; a real Docker image as base in `suite::e2e::docker`.)

use std::cell::RefCell;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use airlock_oci::build::{BuildOptions, build};
use airlock_oci::{ImageRecord, ImageStore, OciError};

use super::common::{Area, TarBuilder, stage_image};

/// A base like a stock Debian image: a setuid `su`, a device node, a setgid directory,
/// apt and docs (stripped by the build), a hard link and a symlink, and a second layer
/// with a whiteout.
pub fn stock_like_layers() -> Vec<Vec<u8>> {
    let lower = TarBuilder::new()
        .dir("etc", 0o755)
        .file("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\n")
        .file("etc/os-release", 0o644, b"ID=base\n")
        .file("etc/obsolete.conf", 0o644, b"old\n")
        .dir("usr", 0o755)
        .dir("usr/bin", 0o755)
        .file("usr/bin/hello", 0o755, b"#!/bin/sh\necho hello\n")
        .hardlink("usr/bin/hello-again", "usr/bin/hello")
        .symlink("usr/bin/hi", "hello")
        .file("usr/bin/su", 0o4755, b"su")
        .file("usr/bin/apt-get", 0o755, b"apt")
        .dir("usr/share", 0o755)
        .dir("usr/share/doc", 0o755)
        .file("usr/share/doc/README", 0o644, b"docs")
        .dir("dev", 0o755)
        .special("dev/null", tar::EntryType::Char)
        .dir("var", 0o755)
        .dir("var/mail", 0o2775)
        .dir("opt", 0o755)
        .file("opt/unwanted", 0o644, b"x")
        .finish();
    let upper = TarBuilder::new()
        .file("etc/.wh.obsolete.conf", 0o644, b"")
        .file("etc/app.conf", 0o644, b"from the upper layer\n")
        .finish();
    vec![lower, upper]
}

pub fn commit_base(store: &ImageStore) -> ImageRecord {
    let manifest = stage_image(store, &stock_like_layers(), false);
    store
        .commit(&manifest, &["airlock-oci-test/base:1".to_owned()], "test")
        .unwrap()
}

pub fn write_spec(dir: &Path, base: &str, extra: &str) -> std::path::PathBuf {
    let path = dir.join("spec.toml");
    fs::write(
        &path,
        format!(
            "name = \"airlock-oci-test/built:1\"\nbase = \"{base}\"\n{extra}\n\
             [image]\nenv = [\"PATH=/usr/bin:/bin\", \"APP=1\"]\nremove = [\"opt\"]\n\
             labels = {{ team = \"agents\" }}\n"
        ),
    )
    .unwrap();
    path
}

fn options(area: &Area) -> BuildOptions {
    BuildOptions {
        cache_dir: area.dir.path().join("cache"),
        source_date_epoch: None,
    }
}

/// Builds, collecting the progress lines.
fn build_collecting(
    store: &ImageStore,
    spec: &Path,
    options: &BuildOptions,
) -> (Result<ImageRecord, OciError>, Vec<String>) {
    let lines = RefCell::new(Vec::new());
    let result = build(store, spec, options, &|line| {
        lines.borrow_mut().push(line.to_owned())
    });
    (result, lines.into_inner())
}

/// `[  1.2s] what` → (1.2, "what").
fn parse_progress(line: &str) -> (f64, &str) {
    let rest = line.strip_prefix('[').unwrap_or_else(|| panic!("{line:?}"));
    let (secs, what) = rest.split_once("s] ").unwrap_or_else(|| panic!("{line:?}"));
    (
        secs.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{line:?}: {e}")),
        what,
    )
}

#[test]
fn a_build_on_an_image_base_keeps_its_files_adds_the_specs_and_strips() {
    let area = Area::new();
    let store = area.store();
    let base = commit_base(&store);
    assert!(
        base.build_base_only
            .as_deref()
            .is_some_and(|r| r.contains("usr/bin/su") || r.contains("dev/null")),
        "{:?}",
        base.build_base_only
    );
    let spec = write_spec(
        area.dir.path(),
        &format!("image:airlock-oci-test/base:1@{}", base.id),
        "",
    );
    let (built, lines) = build_collecting(&store, &spec, &options(&area));
    let built = built.unwrap();
    assert_eq!(built.names, vec!["airlock-oci-test/built:1"]);
    assert_eq!(built.user.as_deref(), Some("65534:65534"));
    assert_eq!(built.build_base_only, None);
    assert_eq!(built.layers.len(), 1);
    let (root, unpacked) = store.rootfs(&built.id).unwrap();
    assert!(!unpacked, "build records an unpacked tree");

    // The base's files, both layers applied.
    assert_eq!(
        fs::read(root.join("usr/bin/hello")).unwrap(),
        b"#!/bin/sh\necho hello\n"
    );
    assert_eq!(
        fs::metadata(root.join("usr/bin/hello")).unwrap().mode() & 0o7777,
        0o755
    );
    assert_eq!(
        fs::metadata(root.join("usr/bin/hello")).unwrap().ino(),
        fs::metadata(root.join("usr/bin/hello-again"))
            .unwrap()
            .ino()
    );
    assert_eq!(
        fs::read_link(root.join("usr/bin/hi")).unwrap(),
        Path::new("hello")
    );
    assert_eq!(fs::read(root.join("etc/os-release")).unwrap(), b"ID=base\n");
    assert_eq!(
        fs::read(root.join("etc/app.conf")).unwrap(),
        b"from the upper layer\n"
    );
    assert!(!root.join("etc/obsolete.conf").exists(), "whiteout ignored");
    // Kept without its setuid bit; the setgid directory without setgid.
    assert_eq!(
        fs::metadata(root.join("usr/bin/su")).unwrap().mode() & 0o7777,
        0o755
    );
    assert_eq!(
        fs::metadata(root.join("var/mail")).unwrap().mode() & 0o7777,
        0o775
    );
    // Stripped: apt, docs, /dev's contents, and what the spec removes.
    for gone in ["usr/bin/apt-get", "usr/share/doc", "dev/null", "opt"] {
        assert!(root.join(gone).symlink_metadata().is_err(), "{gone} left");
    }
    // What every build adds.
    let passwd = fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(
        passwd.starts_with("root:x:0:0:") && passwd.contains("nobody:x:65534:65534:"),
        "{passwd}"
    );
    assert!(
        fs::read_to_string(root.join("etc/group"))
            .unwrap()
            .contains("nogroup:x:65534:")
    );
    assert_eq!(
        fs::read_to_string(root.join("etc/hostname")).unwrap(),
        "airlock\n"
    );
    assert!(
        fs::read_to_string(root.join("etc/hosts"))
            .unwrap()
            .contains("localhost")
    );

    // The config: the spec's env and labels, its user, no created.
    let config: serde_json::Value =
        serde_json::from_slice(&store.read_blob(&built.id, 1 << 20).unwrap()).unwrap();
    assert_eq!(
        config["config"]["Env"],
        serde_json::json!(["PATH=/usr/bin:/bin", "APP=1"])
    );
    assert_eq!(config["config"]["User"], "65534:65534");
    assert_eq!(config["config"]["Labels"]["team"], "agents");
    assert_eq!(
        config["config"]["Labels"]["io.airlock.image.spec"],
        "airlock-oci-test/built:1"
    );
    assert!(config.get("created").is_none(), "{config}");
    assert!(
        config["history"][0]["created_by"]
            .as_str()
            .unwrap()
            .contains(base.id.as_str()),
        "{config}"
    );

    // The progress: timed lines, in order, from the base to the cleanup.
    let steps: Vec<(f64, &str)> = lines.iter().map(|l| parse_progress(l)).collect();
    assert!(
        steps.windows(2).all(|w| w[0].0 <= w[1].0),
        "times go back: {lines:#?}"
    );
    let whats: Vec<&str> = steps.iter().map(|s| s.1).collect();
    let expected_prefixes = [
        format!("base image {}", base.id),
        "dropped the base's setuid/setgid bits, device nodes and FIFOs (first: layer sha256:"
            .to_owned(),
        "stripping package managers, pip, compilers, setuid/setgid bits".to_owned(),
        "removed ".to_owned(),
        "writing the layer".to_owned(),
        format!("layer {} (", built.layers[0].digest),
        "unpacking into the rootfs cache and recording".to_owned(),
        "removing the build directory".to_owned(),
    ];
    assert_eq!(whats.len(), expected_prefixes.len(), "{lines:#?}");
    for (what, prefix) in whats.iter().zip(&expected_prefixes) {
        assert!(
            what.starts_with(prefix.as_str()),
            "{what:?} is not {prefix:?}…"
        );
    }

    // The same spec again, and in a fresh store with the same base: the same image.
    let (again, _) = build_collecting(&store, &spec, &options(&area));
    assert_eq!(again.unwrap().id, built.id);
    let fresh = Area::new();
    let fresh_store = fresh.store();
    assert_eq!(commit_base(&fresh_store).id, base.id);
    let (elsewhere, _) = build_collecting(&fresh_store, &spec, &options(&fresh));
    assert_eq!(
        elsewhere.unwrap().id,
        built.id,
        "the digest depends on the store"
    );

    // Nothing of the builds is left in staging; the base itself stays without a tree.
    assert_eq!(fs::read_dir(store.tmp_dir()).unwrap().count(), 0);
    assert!(!store.rootfs_path(&base.id).exists());
}

#[test]
fn bad_image_bases_are_refused_clearly_and_leave_nothing() {
    let area = Area::new();
    let store = area.store();
    let base = commit_base(&store);
    let missing = format!("sha256:{}", "0".repeat(64));
    for (base_ref, extra, expect) in [
        (
            "image:airlock-oci-test/base:1".to_owned(),
            "",
            "an image base must be pinned: image:REF@sha256:",
        ),
        (
            format!("image:airlock-oci-test/base:1@{missing}"),
            "",
            "no image airlock-oci-test/base:1@sha256:000",
        ),
        (
            format!("image:airlock-oci-test/base:1@{}", base.id),
            // The base has a (fake) apt-get, but python3 is needed for wheels.
            "[python]\nwheelhouse = \"w\"\nrequirements = \"r.txt\"\n",
            "the image has no /usr/bin/python3",
        ),
    ] {
        let spec = write_spec(area.dir.path(), &base_ref, extra);
        let (result, _) = build_collecting(&store, &spec, &options(&area));
        let err = result.unwrap_err();
        let text = super::common::chain(&err);
        assert!(text.contains(expect), "{base_ref}: {text}");
    }
    // A stripped base (an airlock build) has no apt-get for packages.
    let spec = write_spec(
        area.dir.path(),
        &format!("image:airlock-oci-test/base:1@{}", base.id),
        "",
    );
    let (built, _) = build_collecting(&store, &spec, &options(&area));
    let built = built.unwrap();
    let spec = write_spec(
        area.dir.path(),
        &format!("image:airlock-oci-test/built:1@{}", built.id),
        "packages = [\"curl\"]\n",
    );
    let (result, _) = build_collecting(&store, &spec, &options(&area));
    let text = super::common::chain(&result.unwrap_err());
    assert!(
        text.contains("build step packages: the base image has no apt-get"),
        "{text}"
    );
    assert_eq!(fs::read_dir(store.tmp_dir()).unwrap().count(), 0);
    assert_eq!(store.list().unwrap().len(), 2);
}
