//! `airlock image build SPEC.toml`: a minimal image from a Debian base (`debootstrap
//! --variant=minbase`, cached) or an image in the store, plus Debian packages, plus Python
//! wheels installed only from a local wheelhouse with pinned hashes; then stripped of
//! package managers, pip, compilers and every setuid/setgid bit, with uid/gid 65534
//! (`nobody`/`nogroup`) as its user; written as one deterministic layer and recorded in the
//! store. Needs root (debootstrap and chroot).
//!
//! ```toml
//! name = "airlock-python:3.11"
//! base = "debian:bookworm"            # or "image:REF@sha256:…" (an image in the store)
//! mirror = "http://deb.debian.org/debian"
//! packages = ["python3-minimal"]
//! [python]
//! wheelhouse = "wheels"               # relative to the spec
//! requirements = "requirements.txt"   # every requirement pinned with --hash
//! [image]
//! env = ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]
//! remove = ["usr/bin/perl*"]          # more paths to strip (a * only in the last segment)
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::Deserialize;

use crate::digest::Digest;
use crate::error::OciError;
use crate::image::{self, ConfigSpec, LayerRef};
use crate::layer;
use crate::store::{ImageRecord, ImageStore, LAYER_BLOB_MAX_BYTES, check_name, format_rfc3339};
use crate::unpack;

/// The user every built image runs as.
pub const IMAGE_USER: &str = "65534:65534";
/// Lines of a failed tool's output shown in the error.
pub const TOOL_OUTPUT_TAIL_LINES: usize = 25;
/// The default Debian mirror.
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// What is stripped from every image, relative to its root. A `*` may end the last
/// segment. Package managers and their state, pip (also ensurepip, which carries a pip
/// wheel), compilers, assemblers and linkers, docs, and state that would make the image
/// depend on when it was built.
pub const STRIPPED: &[&str] = &[
    // package managers and their state
    "usr/bin/apt*",
    "usr/bin/dpkg*",
    "usr/sbin/dpkg*",
    "usr/lib/apt",
    "usr/lib/dpkg",
    "usr/share/dpkg",
    "usr/bin/debconf*",
    "usr/share/debconf",
    "usr/sbin/update-*",
    "etc/apt",
    "etc/dpkg",
    "var/lib/apt",
    "var/lib/dpkg",
    "var/cache/*",
    "var/log/*",
    "var/lib/systemd",
    "usr/share/lintian",
    "usr/share/bug",
    // pip
    "usr/bin/pip*",
    "usr/local/bin/pip*",
    "usr/bin/easy_install*",
    "usr/lib/python3/dist-packages/pip",
    "usr/lib/python3/dist-packages/pip-*",
    "usr/lib/python3/dist-packages/setuptools*",
    "usr/lib/python3.*/ensurepip",
    // compilers, assemblers, linkers
    "usr/bin/gcc*",
    "usr/bin/g++*",
    "usr/bin/cc",
    "usr/bin/c++",
    "usr/bin/cpp*",
    "usr/bin/x86_64-linux-gnu-*",
    "usr/bin/aarch64-linux-gnu-*",
    "usr/bin/clang*",
    "usr/bin/ld",
    "usr/bin/ld.*",
    "usr/bin/as",
    "usr/bin/tcc",
    "usr/bin/rustc",
    "usr/bin/cargo",
    "usr/bin/go",
    "usr/bin/javac",
    "usr/lib/gcc",
    "usr/libexec/gcc",
    // documentation
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    // accounts' secrets and host-specific or time-dependent state
    "etc/shadow*",
    "etc/gshadow*",
    "etc/passwd-",
    "etc/group-",
    "etc/subuid*",
    "etc/subgid*",
    "etc/hostname",
    "etc/resolv.conf",
    "etc/machine-id",
    "etc/mtab",
    "etc/ld.so.cache~",
    "root/*",
    "home/*",
    "dev/*",
    "proc/*",
    "sys/*",
    "run/*",
    "tmp/*",
    "var/tmp/*",
    "var/mail/*",
    "var/spool/*",
];

/// The build spec.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildSpec {
    /// The name the image gets in the store, e.g. `airlock-python:3.11`.
    pub name: String,
    /// `debian:SUITE` or `image:REF@sha256:…`.
    pub base: String,
    /// The Debian mirror.
    #[serde(default)]
    pub mirror: Option<String>,
    /// Debian packages to add.
    #[serde(default)]
    pub packages: Vec<String>,
    /// Python packages from a local wheelhouse.
    #[serde(default)]
    pub python: Option<PythonSpec>,
    /// The image's config and extra stripping.
    #[serde(default)]
    pub image: ImageSpec,
}

/// Python packages, installed offline with pinned hashes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonSpec {
    /// The directory of wheels (relative to the spec).
    pub wheelhouse: PathBuf,
    /// A requirements file with `--hash=sha256:…` on every requirement (relative to the
    /// spec).
    pub requirements: PathBuf,
    /// The pip that installs them, run on the build host (the image never has pip).
    #[serde(default = "default_pip")]
    pub pip: Vec<String>,
}

fn default_pip() -> Vec<String> {
    vec!["python3".into(), "-m".into(), "pip".into()]
}

/// The image's config and what else to strip.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImageSpec {
    /// The environment.
    pub env: Vec<String>,
    /// More paths to strip.
    pub remove: Vec<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

impl Default for ImageSpec {
    fn default() -> Self {
        Self {
            env: vec![
                "PATH=/usr/local/bin:/usr/bin:/bin".into(),
                "LANG=C.UTF-8".into(),
            ],
            remove: Vec::new(),
            labels: BTreeMap::new(),
        }
    }
}

/// Where the base comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// `debootstrap --variant=minbase SUITE`.
    Debian(String),
    /// An image in the store.
    Image(String),
}

impl BuildSpec {
    /// Reads and checks a spec file.
    pub fn load(path: &Path) -> Result<Self, OciError> {
        let text = fs::read_to_string(path).map_err(|source| OciError::ReadSpec {
            path: path.to_owned(),
            source,
        })?;
        let spec: BuildSpec = toml::from_str(&text).map_err(|source| OciError::ParseSpec {
            path: path.to_owned(),
            source,
        })?;
        let bad = |field: &str, reason: String| OciError::InvalidSpec {
            path: path.to_owned(),
            field: field.to_owned(),
            reason,
        };
        check_name(&spec.name).map_err(|e| bad("name", e.to_string()))?;
        spec.base_kind().map_err(|r| bad("base", r))?;
        for p in &spec.packages {
            if p.is_empty()
                || !p
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.:".contains(&b))
                || p.starts_with('-')
            {
                return Err(bad(
                    "packages",
                    format!("{p:?} is not a Debian package name"),
                ));
            }
        }
        if let Some(mirror) = &spec.mirror
            && !(mirror.starts_with("http://")
                || mirror.starts_with("https://")
                || mirror.starts_with("file:/"))
        {
            return Err(bad(
                "mirror",
                format!("{mirror:?} is not an http(s) or file URL"),
            ));
        }
        for r in &spec.image.remove {
            if unpack::normalize_entry_path(r.as_bytes()).is_err() || r.is_empty() {
                return Err(bad(
                    "image.remove",
                    format!("{r:?} must be a relative path without .."),
                ));
            }
        }
        if let Some(py) = &spec.python
            && py.pip.is_empty()
        {
            return Err(bad("python.pip", "must name a program".into()));
        }
        Ok(spec)
    }

    /// The base.
    pub fn base_kind(&self) -> Result<Base, String> {
        if let Some(suite) = self.base.strip_prefix("debian:") {
            if suite.is_empty()
                || !suite
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            {
                return Err(format!("{suite:?} is not a Debian suite"));
            }
            return Ok(Base::Debian(suite.to_owned()));
        }
        if let Some(image) = self.base.strip_prefix("image:") {
            if !image.contains("@sha256:") {
                return Err("an image base must be pinned: image:REF@sha256:…".into());
            }
            return Ok(Base::Image(image.to_owned()));
        }
        Err(format!(
            "{:?} must be \"debian:SUITE\" or \"image:REF@sha256:…\"",
            self.base
        ))
    }
}

/// How a build runs.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Where the debootstrap bases are cached.
    pub cache_dir: PathBuf,
    /// The layer's mtimes and the config's `created` (`SOURCE_DATE_EPOCH`); without it
    /// mtimes are 0 and `created` is left out, so the digest does not depend on the day.
    pub source_date_epoch: Option<u64>,
}

/// Builds the image of the spec at `spec_path` into the store. `progress` hears about each
/// step (for stderr).
pub fn build(
    store: &ImageStore,
    spec_path: &Path,
    options: &BuildOptions,
    progress: &dyn Fn(&str),
) -> Result<ImageRecord, OciError> {
    let spec = BuildSpec::load(spec_path)?;
    let spec_dir = spec_path
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."));
    let started = Instant::now();
    let step = |what: &str| {
        progress(&format!(
            "[{:>5.1}s] {what}",
            started.elapsed().as_secs_f64()
        ))
    };
    let work = tempfile::Builder::new()
        .prefix("build-")
        .tempdir_in(store.tmp_dir())
        .map_err(|e| OciError::store_io("create build directory", store.tmp_dir(), e))?;
    let root = work.path().join("rootfs");
    let result = (|| {
        match spec.base_kind().map_err(|reason| OciError::Build {
            step: "base",
            reason,
        })? {
            Base::Debian(suite) => {
                let mirror = spec.mirror.as_deref().unwrap_or(DEFAULT_MIRROR);
                debian_base(&root, &suite, mirror, &spec.packages, options, &step)?;
            }
            Base::Image(reference) => {
                let record = store.resolve(&reference)?;
                step(&format!("base image {}", record.id));
                // Unpacked here, not copied from the cache: a stock image's setuid files
                // and device nodes, which jobs refuse, are dropped as they come.
                if let Some(first) = store.unpack_build_base(&record, &root)? {
                    step(&format!(
                        "dropped the base's setuid/setgid bits, device nodes and FIFOs (first: {first})"
                    ));
                }
                if !spec.packages.is_empty() {
                    apt_install(&root, &spec.packages, &step)?;
                }
            }
        }
        if let Some(python) = &spec.python {
            install_wheels(&root, &spec_dir, python, &step)?;
        }
        step("stripping package managers, pip, compilers, setuid/setgid bits");
        let removed = strip(&root, &spec.image.remove)?;
        let cleared = clear_setid_bits(&root)?;
        step(&format!(
            "removed {removed} paths, cleared setuid/setgid on {cleared} files"
        ));
        ensure_nobody(&root)?;
        write_name_files(&root)?;
        compile_python(&root, &step)?;
        step("writing the layer");
        let layer_file = work.path().join("layer.tar.gz");
        let file = fs::File::create(&layer_file)
            .map_err(|e| OciError::store_io("create", &layer_file, e))?;
        let written = layer::write_layer(&root, file, options.source_date_epoch.unwrap_or(0))?;
        step(&format!(
            "layer {} ({} entries, {} bytes compressed)",
            written.digest, written.entries, written.size
        ));
        let store_lock = store.lock_store(false)?;
        let file =
            fs::File::open(&layer_file).map_err(|e| OciError::store_io("open", &layer_file, e))?;
        store.add_blob(
            std::io::BufReader::new(file),
            Some((&written.digest, written.size)),
            LAYER_BLOB_MAX_BYTES,
            "built layer",
        )?;
        let layer = LayerRef {
            digest: written.digest.clone(),
            diff_id: written.diff_id.clone(),
            media_type: written.media_type.to_owned(),
            size: written.size,
        };
        let mut labels: Vec<(String, String)> = spec.image.labels.clone().into_iter().collect();
        labels.push(("io.airlock.image.spec".into(), spec.name.clone()));
        labels.sort();
        let config = image::render_config(&ConfigSpec {
            created: options.source_date_epoch.map(format_rfc3339),
            user: IMAGE_USER.to_owned(),
            env: spec.image.env.clone(),
            working_dir: "/work".to_owned(),
            labels,
            diff_ids: vec![layer.diff_id.clone()],
            history: vec![format!("airlock image build ({})", spec.base)],
        });
        let config_digest = store.add_blob_bytes(&config)?;
        let manifest = image::render_manifest((&config_digest, config.len() as u64), &[layer]);
        let manifest_digest: Digest = store.add_blob_bytes(&manifest)?;
        drop(store_lock);
        step("unpacking into the rootfs cache and recording");
        store.commit(
            &manifest_digest,
            std::slice::from_ref(&spec.name),
            &format!("build {}", spec_path.display()),
        )
    })();
    step("removing the build directory");
    if root.exists() {
        let _ = unpack::remove_tree(&root);
    }
    result
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(TOOL_OUTPUT_TAIL_LINES)..].join("\n")
}

fn run_tool(
    step: &'static str,
    cmd: &mut Command,
    progress: &dyn Fn(&str),
) -> Result<(), OciError> {
    let program = format!("{:?}", cmd.get_program());
    tracing::debug!(step, ?cmd, "running");
    let _ = progress;
    let output = cmd.output().map_err(|source| OciError::SpawnTool {
        step,
        program: program.clone(),
        source,
    })?;
    if !output.status.success() {
        let mut all = output.stdout.clone();
        all.extend_from_slice(&output.stderr);
        return Err(OciError::ToolFailed {
            step,
            program,
            status: output.status.to_string(),
            output_tail: tail(&all),
        });
    }
    Ok(())
}

fn debian_base(
    root: &Path,
    suite: &str,
    mirror: &str,
    packages: &[String],
    options: &BuildOptions,
    step: &dyn Fn(&str),
) -> Result<(), OciError> {
    let mut sorted: Vec<&str> = packages.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let key = Digest::of_bytes(
        format!(
            "{suite}\n{mirror}\n{}\n{}",
            image::host_architecture(),
            sorted.join(",")
        )
        .as_bytes(),
    );
    fs::create_dir_all(&options.cache_dir)
        .map_err(|e| OciError::store_io("create cache directory", &options.cache_dir, e))?;
    let cached = options
        .cache_dir
        .join(format!("debootstrap-{suite}-{}.tar", &key.hex()[..16]));
    if !cached.is_file() {
        step(&format!(
            "debootstrap --variant=minbase {suite} with {} (cached as {}; a minute or two)",
            if sorted.is_empty() {
                "no extra packages".to_owned()
            } else {
                sorted.join(",")
            },
            cached.display()
        ));
        let mut cmd = Command::new("debootstrap");
        cmd.arg("--variant=minbase");
        if !sorted.is_empty() {
            cmd.arg(format!("--include={}", sorted.join(",")));
        }
        cmd.arg(suite).arg(root).arg(mirror);
        run_tool("debootstrap", &mut cmd, step)?;
        let partial = cached.with_extension("tar.partial");
        run_tool(
            "cache base",
            Command::new("tar")
                .arg("--numeric-owner")
                .arg("-C")
                .arg(root)
                .arg("-cf")
                .arg(&partial)
                .arg("."),
            step,
        )?;
        fs::rename(&partial, &cached).map_err(|e| OciError::store_io("cache base", &cached, e))?;
    } else {
        step(&format!("base from cache {}", cached.display()));
        fs::create_dir_all(root).map_err(|e| OciError::store_io("create", root, e))?;
        run_tool(
            "base",
            Command::new("tar")
                .arg("--numeric-owner")
                .arg("-xpf")
                .arg(&cached)
                .arg("-C")
                .arg(root),
            step,
        )?;
    }
    Ok(())
}

/// Debian packages into an image base: apt-get in a chroot, inside a private mount
/// namespace (so its /proc and /dev mounts vanish with it).
fn apt_install(root: &Path, packages: &[String], step: &dyn Fn(&str)) -> Result<(), OciError> {
    if !root.join("usr/bin/apt-get").exists() {
        return Err(OciError::Build {
            step: "packages",
            reason: "the base image has no apt-get (an airlock-built image is stripped of it); \
                     build from debian:SUITE with the packages listed instead"
                .into(),
        });
    }
    step(&format!("apt-get install {}", packages.join(" ")));
    // The build host's resolver, for apt inside the chroot (replaced by
    // write_name_files before the layer is written).
    if let Ok(resolv) = fs::read("/etc/resolv.conf") {
        replace_etc_file(root, "resolv.conf", &resolv)?;
    }
    let script = format!(
        "set -e; mount -t proc proc \"$1/proc\"; mount --rbind /dev \"$1/dev\"; \
         chroot \"$1\" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
         sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends {} && apt-get clean'",
        packages.join(" ")
    );
    run_tool(
        "packages",
        Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--fork",
                "--",
                "sh",
                "-c",
                &script,
                "sh",
            ])
            .arg(root),
        step,
    )
}

fn python_version(root: &Path) -> Result<String, OciError> {
    let link = fs::read_link(root.join("usr/bin/python3")).map_err(|e| OciError::Build {
        step: "python",
        reason: format!("the image has no /usr/bin/python3 to install wheels for ({e}); add python3-minimal to packages"),
    })?;
    let name = link
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.strip_prefix("python")
        .filter(|v| {
            v.split('.').count() == 2
                && v.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
        .ok_or_else(|| OciError::Build {
            step: "python",
            reason: format!(
                "/usr/bin/python3 points to {}, not pythonX.Y",
                link.display()
            ),
        })
}

fn install_wheels(
    root: &Path,
    spec_dir: &Path,
    python: &PythonSpec,
    step: &dyn Fn(&str),
) -> Result<(), OciError> {
    let version = python_version(root)?;
    let target = root.join(format!("usr/local/lib/python{version}/dist-packages"));
    fs::create_dir_all(&target).map_err(|e| OciError::store_io("create", &target, e))?;
    let wheelhouse = spec_dir.join(&python.wheelhouse);
    let requirements = spec_dir.join(&python.requirements);
    step(&format!(
        "pip install --no-index --require-hashes from {} for Python {version}",
        wheelhouse.display()
    ));
    let mut cmd = Command::new(&python.pip[0]);
    cmd.args(&python.pip[1..])
        .args([
            "install",
            "--no-index",
            "--require-hashes",
            "--only-binary=:all:",
            "--no-compile",
        ])
        .args([
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--no-warn-script-location",
        ])
        .arg("--find-links")
        .arg(&wheelhouse)
        .arg("--requirement")
        .arg(&requirements)
        .arg("--python-version")
        .arg(&version)
        .args(["--implementation", "cp", "--target"])
        .arg(&target)
        .env("PIP_CONFIG_FILE", "/dev/null")
        .env("PYTHONDONTWRITEBYTECODE", "1");
    run_tool("python wheels", &mut cmd, step)?;
    // Console scripts would point at the build host's interpreter: jobs import modules.
    let bin = target.join("bin");
    if bin.exists() {
        unpack::remove_tree(&bin).map_err(|e| OciError::store_io("remove", &bin, e))?;
    }
    Ok(())
}

/// Removes [`STRIPPED`] and `extra`; returns how many paths went.
pub fn strip(root: &Path, extra: &[String]) -> Result<usize, OciError> {
    let mut removed = 0;
    for pattern in STRIPPED
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
    {
        for path in expand(root, pattern) {
            match unpack::remove_tree(&path) {
                Ok(()) => removed += 1,
                Err(e) => return Err(OciError::store_io("strip", &path, e)),
            }
        }
    }
    Ok(removed)
}

/// The paths under `root` matching `pattern` (`*` only in the last segment, or in a
/// middle segment like `usr/lib/python3.*/ensurepip`), never following symlinked dirs.
fn expand(root: &Path, pattern: &str) -> Vec<PathBuf> {
    let mut current = vec![root.to_owned()];
    for segment in pattern.split('/').filter(|s| !s.is_empty()) {
        let mut next = Vec::new();
        for base in &current {
            if !segment.contains('*') {
                let p = base.join(segment);
                if p.symlink_metadata().is_ok() {
                    next.push(p);
                }
                continue;
            }
            let (pre, post) = segment.split_once('*').unwrap_or((segment, ""));
            if let Ok(entries) = fs::read_dir(base) {
                let mut names: Vec<String> = entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| {
                        n.starts_with(pre) && n.ends_with(post) && n.len() >= pre.len() + post.len()
                    })
                    .collect();
                names.sort();
                next.extend(names.into_iter().map(|n| base.join(n)));
            }
        }
        current = next;
        // Never descend through a symlink.
        current.retain(|p| p == root || p.symlink_metadata().is_ok());
    }
    current.retain(|p| p != root);
    current
}

/// Clears setuid and setgid bits everywhere; returns how many entries had them.
pub fn clear_setid_bits(root: &Path) -> Result<usize, OciError> {
    let mut cleared = 0;
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let entries = fs::read_dir(&dir).map_err(|e| OciError::store_io("read", &dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| OciError::store_io("read", &dir, e))?;
            let path = entry.path();
            let meta =
                fs::symlink_metadata(&path).map_err(|e| OciError::store_io("stat", &path, e))?;
            if meta.file_type().is_symlink() {
                continue;
            }
            if meta.mode() & 0o6000 != 0 {
                let mode = meta.mode() & 0o1777;
                fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                    .map_err(|e| OciError::store_io("chmod", &path, e))?;
                cleared += 1;
            }
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
    Ok(cleared)
}

/// Makes sure `nobody` (65534) and `nogroup` (65534) exist, the image's user.
pub fn ensure_nobody(root: &Path) -> Result<(), OciError> {
    for (file, seed, line, id_field) in [
        (
            "passwd",
            "root:x:0:0:root:/root:/usr/sbin/nologin\n",
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            2,
        ),
        ("group", "root:x:0:\n", "nogroup:x:65534:\n", 2),
    ] {
        let mut text = read_etc_file(root, file)?.unwrap_or_else(|| seed.to_owned());
        let has = text
            .lines()
            .any(|l| l.split(':').nth(id_field) == Some("65534"));
        if !has {
            if !text.ends_with('\n') && !text.is_empty() {
                text.push('\n');
            }
            text.push_str(line);
        }
        replace_etc_file(root, file, text.as_bytes())?;
    }
    Ok(())
}

/// The name-service files every backend's job expects, host-independent so the image's
/// digest does not depend on the machine that built it: `localhost` in `/etc/hosts`, a
/// fixed hostname, and an empty `resolv.conf` (jobs have no network; the proxy resolves
/// on the host). Docker, Podman and a kubelet bind their own over these; the native
/// backend shows them as they are. Replaces whatever the base had, never following a
/// link out of the tree.
pub fn write_name_files(root: &Path) -> Result<(), OciError> {
    for (name, text) in [
        (
            "hosts",
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        ),
        ("hostname", "airlock\n"),
        ("resolv.conf", ""),
    ] {
        replace_etc_file(root, name, text.as_bytes())?;
    }
    Ok(())
}

/// `root/etc`, which must be a directory of the tree itself, not a link out of it.
fn etc_dir(root: &Path) -> Result<PathBuf, OciError> {
    let etc = root.join("etc");
    match fs::symlink_metadata(&etc) {
        Ok(meta) if meta.is_dir() => Ok(etc),
        Ok(_) => Err(OciError::Build {
            step: "etc",
            reason: format!("{} is not a directory (a symlink?)", etc.display()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir(&etc).map_err(|e| OciError::store_io("create", &etc, e))?;
            Ok(etc)
        }
        Err(e) => Err(OciError::store_io("stat", &etc, e)),
    }
}

/// Replaces `root/etc/NAME` with a regular file holding `content`: whatever was there (a
/// symlink out of the tree included) is removed, never followed.
fn replace_etc_file(root: &Path, name: &str, content: &[u8]) -> Result<(), OciError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = etc_dir(root)?.join(name);
    unpack::remove_tree(&path).map_err(|e| OciError::store_io("remove", &path, e))?;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&path)
        .map_err(|e| OciError::store_io("create", &path, e))?;
    file.write_all(content)
        .map_err(|e| OciError::store_io("write", &path, e))
}

/// `root/etc/NAME` when it is a regular file of the tree (a link is not read).
fn read_etc_file(root: &Path, name: &str) -> Result<Option<String>, OciError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = etc_dir(root)?.join(name);
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
    let mut file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(&path)
    {
        Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => f,
        _ => return Ok(None),
    };
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|e| OciError::store_io("read", &path, e))?;
    Ok(Some(text))
}

const COMPILE_PY: &str = r#"
import os, sys, py_compile
n = 0
for top in sys.argv[1:]:
    for d, dirs, files in os.walk(top):
        dirs.sort()
        for f in sorted(files):
            if f.endswith('.py'):
                try:
                    py_compile.compile(os.path.join(d, f), doraise=True,
                        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
                    n += 1
                except Exception:
                    pass
print(n)
"#;

/// Replaces the image's bytecode with hash-based `.pyc` files (their content does not
/// depend on file mtimes, which the layer fixes), compiled by the image's own Python in a
/// chroot.
fn compile_python(root: &Path, step: &dyn Fn(&str)) -> Result<(), OciError> {
    if !root.join("usr/bin/python3").exists() {
        return Ok(());
    }
    let mut tops = Vec::new();
    for base in ["usr/lib", "usr/local/lib"] {
        for p in expand(root, &format!("{base}/python3*")) {
            if p.is_dir()
                && !p
                    .symlink_metadata()
                    .is_ok_and(|m| m.file_type().is_symlink())
            {
                tops.push(format!("/{}", p.strip_prefix(root).unwrap_or(&p).display()));
            }
        }
    }
    for top in &tops {
        for cache in find_named(&root.join(top.trim_start_matches('/')), "__pycache__") {
            unpack::remove_tree(&cache).map_err(|e| OciError::store_io("remove", &cache, e))?;
        }
    }
    step("compiling Python bytecode (hash-based, deterministic)");
    run_tool(
        "python bytecode",
        Command::new("chroot")
            .arg(root)
            .args([
                "/usr/bin/env",
                "-i",
                "PATH=/usr/bin:/bin",
                "/usr/bin/python3",
                "-I",
                "-c",
                COMPILE_PY,
            ])
            .args(&tops),
        step,
    )
}

fn find_named(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                if e.file_name() == name {
                    out.push(e.path());
                } else {
                    stack.push(e.path());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spec.toml");
        fs::write(
            &path,
            "name = \"airlock-python:3.11\"\nbase = \"debian:bookworm\"\npackages = [\"python3-minimal\"]\n\
             [python]\nwheelhouse = \"wheels\"\nrequirements = \"req.txt\"\n",
        )
        .unwrap();
        let spec = BuildSpec::load(&path).unwrap();
        assert_eq!(spec.base_kind().unwrap(), Base::Debian("bookworm".into()));
        assert_eq!(spec.image.env[0], "PATH=/usr/local/bin:/usr/bin:/bin");
        for bad in [
            "name = \"x\"\nbase = \"ubuntu\"\n",
            "name = \"x\"\nbase = \"image:python:3\"\n",
            "name = \"X\"\nbase = \"debian:bookworm\"\n",
            "name = \"x\"\nbase = \"debian:bookworm\"\npackages = [\"-oAPT::x\"]\n",
            "name = \"x\"\nbase = \"debian:bookworm\"\ncolour = 1\n",
            "name = \"x\"\nbase = \"debian:bookworm\"\n[image]\nremove = [\"../etc\"]\n",
        ] {
            fs::write(&path, bad).unwrap();
            assert!(BuildSpec::load(&path).is_err(), "accepted: {bad}");
        }
    }

    #[test]
    fn stripping_removes_managers_compilers_and_setid_bits() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in [
            "usr/bin",
            "usr/lib/python3.11/ensurepip",
            "var/lib/dpkg",
            "etc",
        ] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in [
            "usr/bin/apt-get",
            "usr/bin/gcc-12",
            "usr/bin/pip3",
            "usr/bin/python3.11",
            "usr/bin/su",
            "var/lib/dpkg/status",
        ] {
            fs::write(root.join(f), b"x").unwrap();
        }
        fs::set_permissions(root.join("usr/bin/su"), fs::Permissions::from_mode(0o4755)).unwrap();
        std::os::unix::fs::symlink("gcc-12", root.join("usr/bin/gcc")).unwrap();
        let removed = strip(root, &[]).unwrap();
        assert!(removed >= 5, "{removed}");
        for gone in [
            "usr/bin/apt-get",
            "usr/bin/gcc-12",
            "usr/bin/gcc",
            "usr/bin/pip3",
            "var/lib/dpkg",
            "usr/lib/python3.11/ensurepip",
        ] {
            assert!(root.join(gone).symlink_metadata().is_err(), "{gone} left");
        }
        assert!(root.join("usr/bin/python3.11").exists());
        assert_eq!(clear_setid_bits(root).unwrap(), 1);
        assert_eq!(
            fs::metadata(root.join("usr/bin/su")).unwrap().mode() & 0o7777,
            0o755
        );
        // A base whose /etc/group points out of the tree: neither read nor written.
        let outside = tempfile::tempdir().unwrap();
        let host_group = outside.path().join("group");
        fs::write(&host_group, "hostonly:x:4242:\n").unwrap();
        let _ = fs::remove_file(root.join("etc/group"));
        fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink(&host_group, root.join("etc/group")).unwrap();
        ensure_nobody(root).unwrap();
        assert_eq!(
            fs::read_to_string(&host_group).unwrap(),
            "hostonly:x:4242:\n"
        );
        let group = fs::read_to_string(root.join("etc/group")).unwrap();
        assert!(
            !group.contains("hostonly") && group.contains("65534"),
            "{group}"
        );
        // A base whose /etc/hosts points out of the tree: replaced, the target untouched.
        let target = outside.path().join("hosts");
        fs::write(&target, "host's own\n").unwrap();
        std::os::unix::fs::symlink(&target, root.join("etc/hosts")).unwrap();
        write_name_files(root).unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "host's own\n");
        assert!(
            fs::read_to_string(root.join("etc/hosts"))
                .unwrap()
                .contains("localhost")
        );
        assert!(
            !fs::symlink_metadata(root.join("etc/hosts"))
                .unwrap()
                .is_symlink()
        );
        assert_eq!(
            fs::read_to_string(root.join("etc/resolv.conf")).unwrap(),
            ""
        );
        assert!(
            fs::read_to_string(root.join("etc/passwd"))
                .unwrap()
                .contains("nobody:x:65534:65534")
        );
        assert!(
            fs::read_to_string(root.join("etc/group"))
                .unwrap()
                .contains("nogroup:x:65534:")
        );
    }
}
