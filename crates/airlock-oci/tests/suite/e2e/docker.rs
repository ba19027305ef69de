//! Images the real Docker engine made, through the `airlock` binary: a `docker save`
//! archive imports as Docker wrote it (id, config bytes, layers, tags), so does an OCI
//! layout skopeo made of it, and the stock Debian image it holds (setuid `su`, `/dev`
//! nodes, apt) is a build base whose build gives the very layer the debootstrap build of
//! the same spec gave. `scripts/ci/images.sh` makes it: `docker import` of the debootstrap
//! tree its build used, `docker save` to `AIRLOCK_TEST_DOCKER_SAVE`, tagged
//! `AIRLOCK_TEST_DOCKER_SAVE_IMAGE` in the daemon at `AIRLOCK_DOCKER_SOCKET`; its spec is
//! `AIRLOCK_TEST_OCI_SPEC`, its image `AIRLOCK_TEST_OCI_IMAGE` in `AIRLOCK_TEST_OCI_STORE`.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::super::common::{airlock_bin, skip_or_fail, walk};

struct DockerSave {
    /// The archive `docker save` wrote.
    archive: PathBuf,
    /// Its tag in the daemon.
    tag: String,
    /// `DOCKER_HOST` for the docker CLI.
    docker_host: String,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn docker_save() -> Option<DockerSave> {
    let socket = std::env::var("AIRLOCK_DOCKER_SOCKET")
        .unwrap_or_else(|_| "/var/run/docker.sock".to_owned());
    let docker_host = format!("unix://{socket}");
    let (Some(archive), Ok(tag)) = (
        env_path("AIRLOCK_TEST_DOCKER_SAVE"),
        std::env::var("AIRLOCK_TEST_DOCKER_SAVE_IMAGE"),
    ) else {
        skip_or_fail(
            "AIRLOCK_TEST_DOCKER_SAVE and AIRLOCK_TEST_DOCKER_SAVE_IMAGE are not set (scripts/ci/images.sh saves a docker image)",
        );
        return None;
    };
    let daemon = Command::new("docker")
        .env("DOCKER_HOST", &docker_host)
        .args(["image", "inspect", "--format", "{{.Id}}", &tag])
        .output()
        .is_ok_and(|o| o.status.success());
    if !daemon || !archive.is_file() {
        skip_or_fail(&format!(
            "the docker CLI, a daemon at {socket} with {tag}, and {} are needed (scripts/ci/images.sh)",
            archive.display()
        ));
        return None;
    }
    if !airlock_bin().is_file() {
        skip_or_fail("no airlock binary (cargo build -p airlock-cli)");
        return None;
    }
    Some(DockerSave {
        archive,
        tag,
        docker_host,
    })
}

impl DockerSave {
    /// `docker image inspect TAG`, the one image.
    fn inspect(&self) -> Value {
        let out = Command::new("docker")
            .env("DOCKER_HOST", &self.docker_host)
            .args(["image", "inspect", &self.tag])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let all: Value = serde_json::from_slice(&out.stdout).unwrap();
        all[0].clone()
    }
}

/// `airlock image --store STORE ARGS...`, which must succeed; its stdout and stderr.
fn airlock(store: &Path, args: &[&str]) -> (String, String) {
    let out: Output = Command::new(airlock_bin())
        .arg("image")
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("AIRLOCK_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "airlock image {args:?}: {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    (stdout, stderr)
}

fn inspect(store: &Path, image: &str) -> Value {
    serde_json::from_str(&airlock(store, &["inspect", image]).0).unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What the archive holds, read entry by entry: `manifest.json`'s one image, the
/// config's bytes, and per layer the sha256 and size of its content (a symlink to another
/// layer, as docker save writes repeated layers, resolved); and the type and mode of each
/// entry of the first layer, by path. Layers are hashed as they stream, never held.
struct Archive {
    manifest: Value,
    config: Vec<u8>,
    layers: Vec<(String, u64)>,
    first_layer_modes: HashMap<String, (tar::EntryType, u32)>,
}

/// `a/../b/layer.tar` → `b/layer.tar`
fn normalize(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for p in path.components() {
        match p {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    parts.join("/")
}

fn read_archive(path: &Path) -> Archive {
    let mut small: HashMap<String, Vec<u8>> = HashMap::new();
    let mut hashed: HashMap<String, (String, u64)> = HashMap::new();
    let mut links: HashMap<String, String> = HashMap::new();
    let mut ar = tar::Archive::new(std::fs::File::open(path).unwrap());
    for entry in ar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = normalize(&entry.path().unwrap());
        match entry.header().entry_type() {
            tar::EntryType::Regular if name.ends_with(".json") => {
                let mut bytes = Vec::new();
                entry.read_to_end(&mut bytes).unwrap();
                small.insert(name, bytes);
            }
            tar::EntryType::Regular => {
                let mut hasher = Sha256::new();
                let mut buf = vec![0u8; 1 << 20];
                let mut size = 0u64;
                loop {
                    let n = entry.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                    size += n as u64;
                }
                hashed.insert(name, (hex::encode(hasher.finalize()), size));
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name().unwrap().unwrap().into_owned();
                let dir = Path::new(&name).parent().unwrap().to_owned();
                links.insert(name, normalize(&dir.join(target)));
            }
            _ => {}
        }
    }
    let manifests: Value = serde_json::from_slice(&small["manifest.json"]).unwrap();
    assert_eq!(manifests.as_array().unwrap().len(), 1, "{manifests}");
    let manifest = manifests[0].clone();
    let config = small[manifest["Config"].as_str().unwrap()].clone();
    let resolve = |layer: &Value| {
        let name = layer.as_str().unwrap().to_owned();
        links.get(&name).cloned().unwrap_or(name)
    };
    let layers: Vec<(String, u64)> = manifest["Layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| hashed[&resolve(l)].clone())
        .collect();
    // Again, for the first layer's entries.
    let first = resolve(&manifest["Layers"][0]);
    let mut first_layer_modes = HashMap::new();
    let mut ar = tar::Archive::new(std::fs::File::open(path).unwrap());
    for entry in ar.entries().unwrap() {
        let entry = entry.unwrap();
        if normalize(&entry.path().unwrap()) != first {
            continue;
        }
        let mut layer = tar::Archive::new(entry);
        for inner in layer.entries().unwrap() {
            let inner = inner.unwrap();
            first_layer_modes.insert(
                normalize(&inner.path().unwrap()),
                (inner.header().entry_type(), inner.header().mode().unwrap()),
            );
        }
        break;
    }
    Archive {
        manifest,
        config,
        layers,
        first_layer_modes,
    }
}

fn blob_count(store: &Path) -> usize {
    std::fs::read_dir(store.join("blobs/sha256"))
        .unwrap()
        .count()
}

#[test]
fn a_docker_save_archive_imports_as_docker_wrote_it_and_rm_removes_it() {
    let Some(save) = docker_save() else { return };
    let docker = save.inspect();
    let archive = read_archive(&save.archive);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");

    let (stdout, stderr) = airlock(&store, &["import", save.archive.to_str().unwrap()]);
    let id = stdout.lines().next().unwrap().to_owned();
    // The id is Docker's, which is the sha256 of the config docker save wrote.
    assert_eq!(id, docker["Id"].as_str().unwrap());
    assert_eq!(id, format!("sha256:{}", sha256_hex(&archive.config)));
    assert_eq!(
        std::fs::read(store.join("blobs/sha256").join(&id[7..])).unwrap(),
        archive.config,
        "the config is stored as docker save wrote it"
    );
    // A stock Debian tree: recorded for builds only, and the import says so.
    assert!(
        stderr.contains("jobs refuse this image (") && stderr.contains("build from it: base = "),
        "{stderr}"
    );

    let record = inspect(&store, &id);
    assert_eq!(record["names"], archive.manifest["RepoTags"]);
    assert_eq!(record["names"], docker["RepoTags"]);
    assert_eq!(
        record["source"],
        format!("import {}", save.archive.display())
    );
    let config: Value = serde_json::from_slice(&archive.config).unwrap();
    assert_eq!(record["created"], config["created"]);
    assert_eq!(
        record["platform"],
        format!(
            "{}/{}",
            config["os"].as_str().unwrap(),
            config["architecture"].as_str().unwrap()
        )
    );
    let diff_ids = docker["RootFS"]["Layers"].as_array().unwrap();
    let layers = record["layers"].as_array().unwrap();
    assert_eq!(layers.len(), diff_ids.len());
    assert_eq!(layers.len(), archive.layers.len());
    for ((layer, diff_id), (sha, size)) in layers.iter().zip(diff_ids).zip(&archive.layers) {
        assert_eq!(&layer["diff_id"], diff_id);
        // Stored as they are: docker save's layer.tar, uncompressed.
        assert_eq!(layer["digest"], format!("sha256:{sha}"));
        assert_eq!(layer["size"], *size);
        assert_eq!(
            layer["media_type"],
            "application/vnd.oci.image.layer.v1.tar"
        );
    }
    let reason = record["build_base_only"].as_str().unwrap();
    assert!(
        reason.contains("device node") || reason.contains("setuid/setgid"),
        "{reason}"
    );
    assert!(record["rootfs"].is_null());
    // The manifest airlock wrote for it pins the same config and layers.
    let manifest_hex = &record["manifest"].as_str().unwrap()[7..];
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(store.join("blobs/sha256").join(manifest_hex)).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["config"]["digest"], id.as_str());
    assert_eq!(manifest["config"]["size"], archive.config.len());

    // ls lists it (as a build base), by name and id.
    let (table, _) = airlock(&store, &["ls"]);
    let row = table
        .lines()
        .find(|l| l.starts_with(&save.tag))
        .unwrap_or_else(|| panic!("{} not in:\n{table}", save.tag));
    assert!(
        row.contains(&id[..19]) && row.ends_with("base only"),
        "{row}"
    );
    let (json, _) = airlock(&store, &["ls", "--json"]);
    let listed: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["id"], id.as_str());

    // docker save | gzip, as people ship them: the same image.
    let gz = dir.path().join("save.tar.gz");
    let status = Command::new("sh")
        .arg("-c")
        .arg("gzip -1 -c \"$1\" >\"$2\"")
        .arg("sh")
        .arg(&save.archive)
        .arg(&gz)
        .status()
        .unwrap();
    assert!(status.success());
    let other = dir.path().join("other");
    assert_eq!(
        airlock(&other, &["import", gz.to_str().unwrap()])
            .0
            .lines()
            .next(),
        Some(id.as_str())
    );
    assert_eq!(inspect(&other, &id)["layers"], record["layers"]);

    // rm: the record and every blob (none is shared); the index is empty again.
    let (removed, _) = airlock(&store, &["rm", &save.tag]);
    assert_eq!(removed.trim(), format!("removed {id}"));
    assert_eq!(blob_count(&store), 0);
    let (json, _) = airlock(&store, &["ls", "--json"]);
    assert_eq!(json.trim(), "[]");
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(store.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["manifests"], serde_json::json!([]));
    assert_eq!(std::fs::read_dir(store.join("tmp")).unwrap().count(), 0);
}

#[test]
fn an_oci_layout_skopeo_made_of_the_docker_image_imports_as_a_directory_and_a_tar() {
    let Some(save) = docker_save() else { return };
    if Command::new("skopeo").arg("--version").output().is_err() {
        return skip_or_fail("skopeo is needed (scripts/ci/images.sh installs it)");
    }
    let docker = save.inspect();
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    let layout_tar = dir.path().join("layout.tar");
    for dest in [
        format!("oci:{}:ci", layout.display()),
        format!("oci-archive:{}:ci", layout_tar.display()),
    ] {
        let out = Command::new("skopeo")
            .args(["copy", "--quiet"])
            .arg(format!("docker-archive:{}", save.archive.display()))
            .arg(&dest)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{dest}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // What skopeo wrote: its manifest (it converts the config to OCI's, so the id is the
    // sha256 of its config, not Docker's) and compressed layers of the same content.
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(layout.join("index.json")).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(layout.join("blobs/sha256").join(&manifest_digest[7..])).unwrap(),
    )
    .unwrap();
    let config_digest = manifest["config"]["digest"].as_str().unwrap().to_owned();

    let store = dir.path().join("store");
    let (stdout, _) = airlock(
        &store,
        &[
            "import",
            layout.to_str().unwrap(),
            "--name",
            "airlock-oci-test/skopeo:ci",
        ],
    );
    assert_eq!(stdout.lines().next(), Some(config_digest.as_str()));
    let record = inspect(&store, "airlock-oci-test/skopeo:ci");
    assert_eq!(record["manifest"], manifest_digest.as_str());
    let layers = record["layers"].as_array().unwrap();
    let diff_ids = docker["RootFS"]["Layers"].as_array().unwrap();
    assert_eq!(layers.len(), diff_ids.len());
    for ((layer, written), diff_id) in layers
        .iter()
        .zip(manifest["layers"].as_array().unwrap())
        .zip(diff_ids)
    {
        assert_eq!(layer["digest"], written["digest"]);
        assert_eq!(layer["media_type"], written["mediaType"]);
        assert_eq!(
            &layer["diff_id"], diff_id,
            "the uncompressed layer is Docker's"
        );
    }

    // The oci-archive: the same image; its ref name (a bare tag) is no image name.
    let other = dir.path().join("other");
    let (stdout, _) = airlock(&other, &["import", layout_tar.to_str().unwrap()]);
    assert_eq!(stdout.lines().next(), Some(config_digest.as_str()));
    let again = inspect(&other, &config_digest);
    assert_eq!(again["manifest"], record["manifest"]);
    assert_eq!(again["names"], serde_json::json!([]));
}

#[test]
fn the_stock_debian_docker_image_builds_as_a_base_into_the_debootstrap_builds_layer() {
    let Some(save) = docker_save() else { return };
    let (Some(spec_path), Some(built_store), Ok(built_image)) = (
        env_path("AIRLOCK_TEST_OCI_SPEC"),
        env_path("AIRLOCK_TEST_OCI_STORE"),
        std::env::var("AIRLOCK_TEST_OCI_IMAGE"),
    ) else {
        return skip_or_fail(
            "AIRLOCK_TEST_OCI_SPEC, AIRLOCK_TEST_OCI_STORE and AIRLOCK_TEST_OCI_IMAGE are needed (scripts/ci/images.sh)",
        );
    };
    let archive = read_archive(&save.archive);
    // The base is what jobs refuse: a setuid su and device nodes, and apt.
    let su = archive.first_layer_modes.get("usr/bin/su").copied();
    assert!(
        su.is_some_and(|(_, mode)| mode & 0o4000 != 0),
        "the base has no setuid su: {su:?}"
    );
    assert!(
        archive
            .first_layer_modes
            .values()
            .any(|(kind, _)| matches!(kind, tar::EntryType::Char)),
        "the base has no device node"
    );
    assert!(archive.first_layer_modes.contains_key("usr/bin/apt-get"));

    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let id = airlock(&store, &["import", save.archive.to_str().unwrap()])
        .0
        .lines()
        .next()
        .unwrap()
        .to_owned();

    // images.sh's spec (debootstrap + python3, curl + the wheels), on the Docker image of
    // that very debootstrap tree instead: its packages are in the base already.
    let debian = airlock_oci::build::BuildSpec::load(&spec_path).unwrap();
    let python = debian.python.as_ref().expect("the spec installs wheels");
    let spec_dir = spec_path.parent().unwrap();
    let quoted = |v: &[String]| serde_json::to_string(v).unwrap();
    let mut spec = format!(
        "name = \"airlock-oci-test/on-docker-base:ci\"\nbase = \"image:{}@{id}\"\n\
         [python]\nwheelhouse = {:?}\nrequirements = {:?}\npip = {}\n\
         [image]\nenv = {}\nremove = {}\n[image.labels]\n",
        save.tag,
        spec_dir.join(&python.wheelhouse).display().to_string(),
        spec_dir.join(&python.requirements).display().to_string(),
        quoted(&python.pip),
        quoted(&debian.image.env),
        quoted(&debian.image.remove),
    );
    for (k, v) in &debian.image.labels {
        spec.push_str(&format!("{k:?} = {v:?}\n"));
    }
    let spec_file = dir.path().join("on-docker-base.toml");
    std::fs::write(&spec_file, spec).unwrap();

    let (stdout, stderr) = airlock(&store, &["build", spec_file.to_str().unwrap()]);
    let built = stdout.trim().to_owned();
    for step in [
        format!("base image {id}"),
        "dropped the base's setuid/setgid bits, device nodes and FIFOs (first: layer sha256:"
            .to_owned(),
        "pip install --no-index --require-hashes from ".to_owned(),
        "compiling Python bytecode".to_owned(),
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with("==> [") && l.contains(&step)),
            "no progress line {step:?} in:\n{stderr}"
        );
    }
    let record = inspect(&store, &built);
    assert!(record.get("build_base_only").is_none(), "{record}");
    let root = PathBuf::from(record["rootfs"].as_str().unwrap());

    // The base's files, the wheels, nothing setuid, no apt, no /dev nodes.
    for present in [
        "usr/bin/python3",
        "usr/bin/curl",
        "etc/debian_version",
        "usr/bin/su",
    ] {
        assert!(
            root.join(present).symlink_metadata().is_ok(),
            "{present} missing"
        );
    }
    let site = root.join("usr/local/lib/python3.11/dist-packages");
    assert!(site.join("six.py").is_file(), "six missing");
    assert!(
        site.join("packaging/version.py").is_file(),
        "packaging missing"
    );
    for gone in ["usr/bin/apt-get", "usr/bin/dpkg", "usr/lib/apt", "var"] {
        assert!(root.join(gone).symlink_metadata().is_err(), "{gone} left");
    }
    assert_eq!(std::fs::read_dir(root.join("dev")).unwrap().count(), 0);
    let mut setid = Vec::new();
    walk(&root, &mut |p| {
        let meta = p.symlink_metadata().unwrap();
        if !meta.file_type().is_symlink() && meta.mode() & 0o6000 != 0 {
            setid.push(p.to_owned());
        }
    });
    assert!(setid.is_empty(), "setuid/setgid left: {setid:?}");

    // The very layer the debootstrap build of the same tree, packages and wheels gave:
    // nothing of the way in (docker import, docker save, airlock import) shows in it.
    let debootstrap_built = airlock_oci::ImageStore::open_existing(&built_store)
        .unwrap()
        .resolve(&built_image)
        .unwrap();
    let layer = &record["layers"][0];
    assert_eq!(record["layers"].as_array().unwrap().len(), 1);
    assert_eq!(
        layer["diff_id"],
        debootstrap_built.layers[0].diff_id.as_str()
    );
    assert_eq!(layer["digest"], debootstrap_built.layers[0].digest.as_str());

    // Built again: the same image. Removing the base leaves it whole.
    assert_eq!(
        airlock(&store, &["build", spec_file.to_str().unwrap()])
            .0
            .trim(),
        built
    );
    let base_layer = archive.layers[0].0.clone();
    airlock(&store, &["rm", &id]);
    assert!(!store.join("blobs/sha256").join(&base_layer).exists());
    assert!(
        root.join("usr/local/lib/python3.11/dist-packages/six.py")
            .is_file()
    );
    let (json, _) = airlock(&store, &["ls", "--json"]);
    let listed: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["id"], built.as_str());
    assert_eq!(std::fs::read_dir(store.join("tmp")).unwrap().count(), 0);
}
