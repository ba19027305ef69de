//! `airlock image import|ls|inspect|rm|build|prepare` run as the binary, on OCI layouts
//! written here by hand and GNU tar (as skopeo's `oci:` lays them out) and on a store of
//! the test's own. The `docker save` archives of the real Docker engine are imported in
//! airlock-oci's `suite::e2e::docker` (scripts/ci/images.sh).

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use airlock_oci::Digest;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::TestEnv;

const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";

/// `airlock image --store STORE ARGS...`.
fn image(env: &TestEnv, store: &Path, args: &[&str]) -> Output {
    env.cmd()
        .arg("image")
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("spawn airlock")
}

fn ok(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The error line of a failed command (exit 1).
fn failed(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

fn ls_json(env: &TestEnv, store: &Path) -> Vec<Value> {
    serde_json::from_str(&ok(&image(env, store, &["ls", "--json"])))
        .expect("ls --json is a JSON array")
}

/// A directory tree as an uncompressed layer tar, written by GNU tar.
fn tar_layer(tree: &Path) -> Vec<u8> {
    let out = Command::new("tar")
        .args(["--numeric-owner", "--sort=name", "--mtime=@0", "-C"])
        .arg(tree)
        .args(["-cf", "-", "."])
        .output()
        .expect("run tar");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// One image of a layout: its config, manifest and layers, as bytes.
struct LayoutImage {
    tag: &'static str,
    config: Vec<u8>,
    manifest: Vec<u8>,
    layers: Vec<Vec<u8>>,
}

impl LayoutImage {
    fn new(tag: &'static str, layers: Vec<Vec<u8>>) -> Self {
        let config = serde_json::to_vec(&json!({
            "created": "2024-05-01T12:00:00Z",
            "architecture": airlock_oci::image::host_architecture(),
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"]},
            "rootfs": {
                "type": "layers",
                "diff_ids": layers.iter().map(|l| Digest::of_bytes(l).to_string()).collect::<Vec<_>>(),
            },
            "history": [{"created_by": tag}],
        }))
        .unwrap();
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": Digest::of_bytes(&config).to_string(),
                "size": config.len(),
            },
            "layers": layers.iter().map(|l| json!({
                "mediaType": LAYER_TAR,
                "digest": Digest::of_bytes(l).to_string(),
                "size": l.len(),
            })).collect::<Vec<_>>(),
        }))
        .unwrap();
        Self {
            tag,
            config,
            manifest,
            layers,
        }
    }

    fn id(&self) -> String {
        Digest::of_bytes(&self.config).to_string()
    }

    fn manifest_digest(&self) -> String {
        Digest::of_bytes(&self.manifest).to_string()
    }
}

/// Writes an OCI image layout of `images` into `dir`, each tagged in `index.json` with
/// `org.opencontainers.image.ref.name` only (as `skopeo copy … oci:DIR:TAG` does).
fn write_layout(dir: &Path, images: &[&LayoutImage]) {
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    let mut manifests = Vec::new();
    for img in images {
        for blob in [&img.config, &img.manifest].into_iter().chain(&img.layers) {
            fs::write(blobs.join(Digest::of_bytes(blob).hex()), blob).unwrap();
        }
        manifests.push(json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": img.manifest_digest(),
            "size": img.manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": img.tag},
        }));
    }
    fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": manifests})).unwrap(),
    )
    .unwrap();
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

/// Writes files (path, mode, content) under a fresh directory in `base`.
fn tree(base: &Path, name: &str, files: &[(&str, u32, &str)]) -> PathBuf {
    let root = base.join(name);
    for (path, mode, content) in files {
        let path = root.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, content).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(*mode)).unwrap();
    }
    root
}

fn blob_names(store: &Path) -> BTreeSet<String> {
    fs::read_dir(store.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn hex(digest: &str) -> String {
    digest.strip_prefix("sha256:").unwrap().to_owned()
}

/// Two images sharing their lower layer, in one layout.
fn two_images(base: &Path) -> (LayoutImage, LayoutImage) {
    let shared = tar_layer(&tree(
        base,
        "shared",
        &[
            ("usr/bin/tool", 0o755, "#!/bin/sh\necho tool\n"),
            ("etc/os-release", 0o644, "ID=layout\n"),
        ],
    ));
    let upper = tar_layer(&tree(base, "upper", &[("etc/app.conf", 0o644, "b\n")]));
    (
        LayoutImage::new("a", vec![shared.clone()]),
        LayoutImage::new("b", vec![shared, upper]),
    )
}

#[test]
fn image_import_ls_inspect_and_rm_through_the_cli() {
    let env = TestEnv::new();
    let store = env.path().join("store");
    let (a, b) = two_images(env.path());
    let layout = env.path().join("layout");
    write_layout(&layout, &[&a, &b]);
    let layout_arg = layout.to_str().unwrap();

    // Two images and no --name: which one is for the user to say.
    let err = failed(&image(&env, &store, &["import", layout_arg]));
    assert!(
        err.contains("is ambiguous: 2 images; name one with --name (a, b)"),
        "{err}"
    );
    assert!(ls_json(&env, &store).is_empty());

    let out = image(&env, &store, &["import", layout_arg, "--name", "a"]);
    assert_eq!(ok(&out).lines().next(), Some(a.id().as_str()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("pin it: rootfs = \"image:a:latest@{}\"", a.id())),
        "{stderr}"
    );
    let out = image(&env, &store, &["import", layout_arg, "--name", "b"]);
    assert_eq!(ok(&out).trim(), b.id());

    // ls: both, as JSON records and as a table.
    let records = ls_json(&env, &store);
    let summary: Vec<(String, Vec<String>, String)> = records
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_owned(),
                serde_json::from_value(r["names"].clone()).unwrap(),
                r["manifest"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (a.id(), vec!["a:latest".to_owned()], a.manifest_digest()),
            (b.id(), vec!["b:latest".to_owned()], b.manifest_digest()),
        ]
    );
    for (record, img) in records.iter().zip([&a, &b]) {
        let layers = record["layers"].as_array().unwrap();
        assert_eq!(layers.len(), img.layers.len());
        for (layer, bytes) in layers.iter().zip(&img.layers) {
            assert_eq!(layer["digest"], Digest::of_bytes(bytes).to_string());
            assert_eq!(layer["diff_id"], Digest::of_bytes(bytes).to_string());
            assert_eq!(layer["media_type"], LAYER_TAR);
            assert_eq!(layer["size"], bytes.len());
        }
        assert_eq!(record["created"], "2024-05-01T12:00:00Z");
        assert_eq!(record["source"], format!("import {layout_arg}"));
    }
    let table = ok(&image(&env, &store, &["ls"]));
    let rows: Vec<&str> = table.lines().collect();
    assert!(
        rows[0].starts_with("NAME") && rows[0].ends_with("UNPACKED"),
        "{table}"
    );
    assert_eq!(rows.len(), 3, "{table}");
    for (row, img) in rows[1..].iter().zip([&a, &b]) {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[0], format!("{}:latest", img.tag), "{row}");
        assert_eq!(cols[1], &img.id()[..19], "{row}");
        assert_eq!(cols.last(), Some(&"yes"), "{row}");
    }

    // inspect: the record plus its unpacked tree, by name, id or manifest digest.
    let inspected: Value =
        serde_json::from_str(&ok(&image(&env, &store, &["inspect", "b"]))).unwrap();
    assert_eq!(inspected["id"], b.id());
    for query in [b.id(), b.manifest_digest(), format!("whatever@{}", b.id())] {
        let again: Value =
            serde_json::from_str(&ok(&image(&env, &store, &["inspect", &query]))).unwrap();
        assert_eq!(again, inspected, "{query}");
    }
    let rootfs = PathBuf::from(inspected["rootfs"].as_str().unwrap());
    assert_eq!(
        fs::read_to_string(rootfs.join("etc/app.conf")).unwrap(),
        "b\n"
    );
    assert_eq!(
        fs::read_to_string(rootfs.join("usr/bin/tool")).unwrap(),
        "#!/bin/sh\necho tool\n"
    );

    // Every blob is stored once; the shared layer once for both.
    let shared_layer = hex(&Digest::of_bytes(&a.layers[0]).to_string());
    let upper_layer = hex(&Digest::of_bytes(&b.layers[1]).to_string());
    let all: BTreeSet<String> = [
        hex(&a.id()),
        hex(&a.manifest_digest()),
        hex(&b.id()),
        hex(&b.manifest_digest()),
        shared_layer.clone(),
        upper_layer.clone(),
    ]
    .into();
    assert_eq!(blob_names(&store), all);

    // rm a: its record, tree, config and manifest go; the layer b shares stays.
    let a_rootfs = store.join("rootfs").join(hex(&a.id()));
    assert!(a_rootfs.is_dir());
    assert_eq!(
        ok(&image(&env, &store, &["rm", "a"])).trim(),
        format!("removed {}", a.id())
    );
    assert!(!a_rootfs.exists());
    assert!(
        !store
            .join("images")
            .join(format!("{}.json", hex(&a.id())))
            .exists()
    );
    assert_eq!(
        blob_names(&store),
        [
            hex(&b.id()),
            hex(&b.manifest_digest()),
            shared_layer,
            upper_layer
        ]
        .into()
    );
    let names: Vec<Value> = ls_json(&env, &store)
        .iter()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(names, vec![Value::from(b.id())]);
    let index = fs::read_to_string(store.join("index.json")).unwrap();
    assert!(
        !index.contains(&a.manifest_digest()) && index.contains(&b.manifest_digest()),
        "{index}"
    );
    assert!(rootfs.is_dir(), "b's tree went with a");

    // Removing what is not there says so, and changes nothing.
    let err = failed(&image(&env, &store, &["rm", "a"]));
    assert!(
        err.contains(&format!("no image a in the store {}", store.display())),
        "{err}"
    );
    let err = failed(&image(&env, &store, &["inspect", &a.id()]));
    assert!(err.contains("no image sha256:"), "{err}");

    // rm b by id: the store is empty again.
    ok(&image(&env, &store, &["rm", &b.id()]));
    assert!(ls_json(&env, &store).is_empty());
    assert!(blob_names(&store).is_empty());
    assert_eq!(fs::read_dir(store.join("rootfs")).unwrap().count(), 0);
    let index: Value =
        serde_json::from_str(&fs::read_to_string(store.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["manifests"], json!([]));

    // The same layout as a tar (skopeo's oci-archive:): the same images.
    let archive = env.path().join("layout.tar");
    let out = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .output()
        .unwrap();
    assert!(out.status.success());
    let other = env.path().join("other-store");
    let out = image(
        &env,
        &other,
        &["import", archive.to_str().unwrap(), "--name", "a"],
    );
    assert_eq!(ok(&out).trim(), a.id());
    assert_eq!(ls_json(&env, &other)[0]["manifest"], a.manifest_digest());
    assert_eq!(
        fs::read_dir(other.join("tmp")).unwrap().count(),
        0,
        "staging left behind"
    );
}

#[test]
fn image_import_refuses_bad_inputs_with_clear_errors() {
    let env = TestEnv::new();
    let store = env.path().join("store");
    let (a, _) = two_images(env.path());

    let missing = env.path().join("no-such.tar");
    let err = failed(&image(&env, &store, &["import", missing.to_str().unwrap()]));
    assert!(
        err.contains(&format!("open {}", missing.display())) && err.contains("No such file"),
        "{err}"
    );

    let empty = env.path().join("empty-dir");
    fs::create_dir(&empty).unwrap();
    let err = failed(&image(&env, &store, &["import", empty.to_str().unwrap()]));
    assert!(
        err.contains("neither an OCI image layout (oci-layout, index.json) nor a docker save archive (manifest.json)"),
        "{err}"
    );

    // A layout whose layer is not what its digest says.
    let tampered = env.path().join("tampered");
    write_layout(&tampered, &[&a]);
    let layer = tampered
        .join("blobs/sha256")
        .join(hex(&Digest::of_bytes(&a.layers[0]).to_string()));
    let mut bytes = fs::read(&layer).unwrap();
    let at = bytes.iter().position(|b| *b == b't').unwrap();
    bytes[at] = b'T';
    fs::write(&layer, bytes).unwrap();
    let err = failed(&image(
        &env,
        &store,
        &["import", tampered.to_str().unwrap()],
    ));
    assert!(
        err.contains("layer: digest mismatch: expected sha256:"),
        "{err}"
    );

    // A docker save archive whose config is a link to a host file.
    let secret = env.path().join("host-secret");
    fs::write(&secret, "root:$6$not-for-the-store:19000::::::\n").unwrap();
    let evil = env.path().join("evil");
    fs::create_dir_all(evil.join("l")).unwrap();
    std::os::unix::fs::symlink(&secret, evil.join("c.json")).unwrap();
    fs::write(evil.join("l/layer.tar"), &a.layers[0]).unwrap();
    fs::write(
        evil.join("manifest.json"),
        r#"[{"Config":"c.json","RepoTags":["evil:1"],"Layers":["l/layer.tar"]}]"#,
    )
    .unwrap();
    let evil_tar = env.path().join("evil.tar");
    assert!(
        Command::new("tar")
            .arg("-C")
            .arg(&evil)
            .arg("-cf")
            .arg(&evil_tar)
            .arg(".")
            .status()
            .unwrap()
            .success()
    );
    let err = failed(&image(
        &env,
        &store,
        &["import", evil_tar.to_str().unwrap()],
    ));
    assert!(
        err.contains("\"c.json\" leads out of the directory"),
        "{err}"
    );
    for blob in blob_names(&store) {
        let content = fs::read(store.join("blobs/sha256").join(&blob)).unwrap();
        assert!(
            !String::from_utf8_lossy(&content).contains("not-for-the-store"),
            "the host file is in the store as {blob}"
        );
    }

    // An archive entry climbing out of the staging directory.
    let climbing = tree(env.path(), "climb", &[("x", 0o644, "x")]);
    let climb_tar = env.path().join("climb.tar");
    assert!(
        Command::new("tar")
            .arg("-C")
            .arg(&climbing)
            .args(["--transform", "s,^\\./x,../outside-x,", "-P", "-cf"])
            .arg(&climb_tar)
            .arg("./x")
            .status()
            .unwrap()
            .success()
    );
    let err = failed(&image(
        &env,
        &store,
        &["import", climb_tar.to_str().unwrap()],
    ));
    assert!(err.contains("path with a .. segment"), "{err}");
    assert!(!env.path().join("outside-x").exists());

    // A name that is not one.
    write_layout(&env.path().join("good"), &[&a]);
    let err = failed(&image(
        &env,
        &store,
        &[
            "import",
            env.path().join("good").to_str().unwrap(),
            "--name",
            "Bad Name",
        ],
    ));
    assert!(err.contains("image name \"Bad Name\""), "{err}");

    assert!(ls_json(&env, &store).is_empty());
    assert_eq!(fs::read_dir(store.join("rootfs")).unwrap().count(), 0);
    assert_eq!(fs::read_dir(store.join("tmp")).unwrap().count(), 0);
}

#[test]
fn image_build_on_an_imported_stock_like_base_through_the_cli() {
    let env = TestEnv::new();
    let store = env.path().join("store");
    // A base like a stock Debian image: a setuid su (jobs refuse it), apt-get, docs.
    let base_tree = tree(
        env.path(),
        "base",
        &[
            ("etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\n"),
            ("etc/debian_version", 0o644, "12.0\n"),
            ("usr/bin/hello", 0o755, "#!/bin/sh\necho hello\n"),
            ("usr/bin/su", 0o4755, "su"),
            ("usr/bin/apt-get", 0o755, "apt"),
            ("usr/share/doc/base/copyright", 0o644, "c"),
            ("opt/tool/extra", 0o644, "x"),
        ],
    );
    let base = LayoutImage::new("base", vec![tar_layer(&base_tree)]);
    let layout = env.path().join("layout");
    write_layout(&layout, &[&base]);
    let out = image(
        &env,
        &store,
        &[
            "import",
            layout.to_str().unwrap(),
            "--name",
            "airlock-cli-test/base:1",
        ],
    );
    assert_eq!(ok(&out).trim(), base.id());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("jobs refuse this image (layer sha256:")
            && stderr.contains("usr/bin/su")
            && stderr.contains(&format!(
                "build from it: base = \"image:airlock-cli-test/base:1@{}\"",
                base.id()
            )),
        "{stderr}"
    );
    let table = ok(&image(&env, &store, &["ls"]));
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("airlock-cli-test/base:1") && l.ends_with("base only")),
        "{table}"
    );
    let err = failed(&image(
        &env,
        &store,
        &["prepare", "airlock-cli-test/base:1"],
    ));
    assert!(
        err.contains("is for builds only") && err.contains("usr/bin/su"),
        "{err}"
    );

    let spec = env.path().join("spec.toml");
    fs::write(
        &spec,
        format!(
            "name = \"airlock-cli-test/app:1\"\nbase = \"image:airlock-cli-test/base:1@{}\"\n\
             [image]\nenv = [\"PATH=/usr/bin:/bin\", \"APP=1\"]\nremove = [\"opt\"]\n\
             labels = {{ team = \"agents\" }}\n",
            base.id()
        ),
    )
    .unwrap();
    let saved = env.path().join("app.tar");
    let out = image(
        &env,
        &store,
        &[
            "build",
            spec.to_str().unwrap(),
            "-o",
            saved.to_str().unwrap(),
        ],
    );
    let id = ok(&out).trim().to_owned();
    assert!(id.starts_with("sha256:") && id != base.id(), "{id}");
    // Progress: one timed line per step on stderr, from the base to the cleanup.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let steps: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("==> ["))
        .map(|l| l.split_once("s] ").unwrap_or_else(|| panic!("{l:?}")).1)
        .collect();
    assert_eq!(
        steps.first().copied(),
        Some(format!("base image {}", base.id()).as_str()),
        "{stderr}"
    );
    assert!(
        steps[1].starts_with("dropped the base's setuid/setgid bits")
            && steps[1].contains("usr/bin/su"),
        "{stderr}"
    );
    assert_eq!(steps.last().copied(), Some("removing the build directory"));
    assert!(
        steps.iter().any(|s| s.starts_with("writing the layer")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "pin it: rootfs = \"image:airlock-cli-test/app:1@{id}\""
        )),
        "{stderr}"
    );

    // The result: the base's files, without su's setuid bit, apt, docs or /opt, with
    // the spec's env and labels and nobody as its user.
    let record: Value = serde_json::from_str(&ok(&image(
        &env,
        &store,
        &["inspect", "airlock-cli-test/app:1"],
    )))
    .unwrap();
    assert_eq!(record["id"], id.as_str());
    assert_eq!(record["user"], "65534:65534");
    assert!(record.get("build_base_only").is_none(), "{record}");
    let root = PathBuf::from(record["rootfs"].as_str().unwrap());
    assert_eq!(
        fs::read_to_string(root.join("etc/debian_version")).unwrap(),
        "12.0\n"
    );
    assert_eq!(
        fs::read_to_string(root.join("usr/bin/hello")).unwrap(),
        "#!/bin/sh\necho hello\n"
    );
    assert_eq!(
        fs::metadata(root.join("usr/bin/su"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
    for gone in ["usr/bin/apt-get", "usr/share/doc", "opt"] {
        assert!(root.join(gone).symlink_metadata().is_err(), "{gone} left");
    }
    assert!(
        fs::read_to_string(root.join("etc/passwd"))
            .unwrap()
            .contains("nobody:x:65534:65534:")
    );
    let config: Value =
        serde_json::from_slice(&fs::read(store.join("blobs/sha256").join(hex(&id))).unwrap())
            .unwrap();
    assert_eq!(
        config["config"]["Env"],
        json!(["PATH=/usr/bin:/bin", "APP=1"])
    );
    assert_eq!(config["config"]["Labels"]["team"], "agents");

    // Built again: the same digest. The archive it wrote imports with the same id.
    assert_eq!(
        ok(&image(&env, &store, &["build", spec.to_str().unwrap()])).trim(),
        id
    );
    let other = env.path().join("other-store");
    assert_eq!(
        ok(&image(&env, &other, &["import", saved.to_str().unwrap()])).trim(),
        id
    );
    assert_eq!(
        ls_json(&env, &other)[0]["names"],
        json!(["airlock-cli-test/app:1"])
    );

    // Removing the base leaves the built image whole; its blobs go.
    ok(&image(&env, &store, &["rm", "airlock-cli-test/base:1"]));
    assert!(!store.join("blobs/sha256").join(hex(&base.id())).exists());
    assert!(root.join("usr/bin/hello").is_file());
    let ids: Vec<Value> = ls_json(&env, &store)
        .iter()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(ids, vec![Value::from(id.as_str())]);

    // Bad bases: clear errors, nothing recorded or left in staging.
    for (base_line, expect) in [
        (
            "base = \"image:airlock-cli-test/base:1\"".to_owned(),
            "base: an image base must be pinned: image:REF@sha256:".to_owned(),
        ),
        (
            format!("base = \"image:airlock-cli-test/base:1@{}\"", base.id()),
            format!(
                "no image airlock-cli-test/base:1@{} in the store",
                base.id()
            ),
        ),
        (
            format!("base = \"image:airlock-cli-test/app:1@{id}\"\npackages = [\"curl\"]"),
            "build step packages: the base image has no apt-get".to_owned(),
        ),
    ] {
        fs::write(
            &spec,
            format!("name = \"airlock-cli-test/bad:1\"\n{base_line}\n"),
        )
        .unwrap();
        let err = failed(&image(&env, &store, &["build", spec.to_str().unwrap()]));
        assert!(err.contains(&expect), "{base_line}: {err}");
    }
    assert_eq!(ls_json(&env, &store).len(), 1);
    assert_eq!(fs::read_dir(store.join("tmp")).unwrap().count(), 0);
}
