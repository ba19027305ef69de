//! `[filesystem]`: the job's root filesystem, `/work` and `/out`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::bounds;
use crate::units::ByteSize;

/// The root filesystem and the job's directories.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct FilesystemPolicy {
    /// What `/` is.
    pub rootfs: RootfsSpec,
    /// Whether `/work` is writable.
    pub workdir: WorkdirMode,
    /// The optional `/out` directory.
    pub out: OutPolicy,
    /// Host directories of installed packages (e.g. `/usr/lib/python3/dist-packages`) that
    /// the minimal host root (`rootfs = "host"`) holds beside each interpreter's standard
    /// library, with the shared libraries their extension modules load. Empty: the
    /// standard library only. Other rootfs kinds ignore it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub site_packages: Vec<PathBuf>,
}

/// Top-level directories of a job's root that airlock mounts afresh for every job.
const SITE_PACKAGES_SHADOWED: &[&str] = &["tmp", "work", "out", "dev", "proc", "etc"];

impl FilesystemPolicy {
    /// Checks the `/out` bounds; returns the field name and reason.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        let out = &self.out;
        if out.max_bytes.as_u64() == 0 || out.max_bytes.as_u64() > bounds::OUT_MAX_BYTES {
            return Err((
                "out.max_bytes",
                format!(
                    "must be between 1B and {}",
                    ByteSize::bytes(bounds::OUT_MAX_BYTES)
                ),
            ));
        }
        if out.max_files == 0 || out.max_files > bounds::OUT_FILES_MAX_COUNT {
            return Err((
                "out.max_files",
                format!("must be between 1 and {}", bounds::OUT_FILES_MAX_COUNT),
            ));
        }
        if out.max_file_bytes.as_u64() == 0 {
            return Err(("out.max_file_bytes", "must not be 0".to_owned()));
        }
        if self.site_packages.len() > bounds::SITE_PACKAGES_MAX_COUNT {
            return Err((
                "site_packages",
                format!("at most {} directories", bounds::SITE_PACKAGES_MAX_COUNT),
            ));
        }
        for dir in &self.site_packages {
            let plain = dir.is_absolute()
                && dir.components().all(|c| {
                    matches!(
                        c,
                        std::path::Component::RootDir | std::path::Component::Normal(_)
                    )
                });
            if !plain || dir == std::path::Path::new("/") {
                return Err((
                    "site_packages",
                    format!(
                        "{} must be an absolute path below / without . or ..",
                        dir.display()
                    ),
                ));
            }
            // The job's own mounts cover these: a copy there would never be seen.
            if let Some(top) = SITE_PACKAGES_SHADOWED
                .iter()
                .find(|top| dir.starts_with(Path::new("/").join(top)))
            {
                return Err((
                    "site_packages",
                    format!(
                        "{} is under /{top}, which every job gets a fresh one of: \
                         install the packages elsewhere (/opt, /usr/local, /var/lib)",
                        dir.display()
                    ),
                ));
            }
            // Each directory is one line of a `.pth` file in the minimal root.
            if dir.to_str().is_none_or(|d| d.chars().any(char::is_control)) {
                return Err((
                    "site_packages",
                    format!("{} must be UTF-8 without control characters", dir.display()),
                ));
            }
        }
        Ok(())
    }
}

/// What the job's root filesystem is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RootfsSpec {
    /// The minimal host root: each language's interpreter, its standard library, the
    /// policy's `site_packages`, the shared libraries they load, `sh` and the few utilities
    /// `policy/minimal_root.toml` lists, copied once from the host into airlock's cache and
    /// shown read-only, with a synthesized `/etc`.
    #[default]
    Host,
    /// The whole host view: a read-only view of the host's `/usr`, `/bin`, `/sbin`, `/lib*`
    /// (every installed program, compilers and network tools included) and a synthesized
    /// `/etc`.
    HostFull,
    /// A directory holding a whole root filesystem (for example made by debootstrap).
    Dir(PathBuf),
    /// An OCI image pinned by digest.
    Image {
        /// The reference without the digest, e.g. `python:3.12-slim`.
        reference: String,
        /// The `sha256:` digest.
        digest: String,
    },
}

impl FromStr for RootfsSpec {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "host" {
            return Ok(RootfsSpec::Host);
        }
        if text == "host-full" {
            return Ok(RootfsSpec::HostFull);
        }
        if let Some(path) = text.strip_prefix("dir:") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(format!("dir rootfs {text:?} must be an absolute path"));
            }
            return Ok(RootfsSpec::Dir(path));
        }
        if let Some(image) = text.strip_prefix("image:") {
            let (reference, digest) = image
                .rsplit_once('@')
                .ok_or_else(|| format!("image rootfs {text:?} must be pinned as REF@sha256:…"))?;
            if !is_sha256_digest(digest) {
                return Err(format!(
                    "image rootfs {text:?}: {digest:?} is not a sha256:<64 hex> digest"
                ));
            }
            return Ok(RootfsSpec::Image {
                reference: reference.to_owned(),
                digest: digest.to_owned(),
            });
        }
        Err(format!(
            "rootfs {text:?} must be \"host\", \"host-full\", \"dir:/path\" or \"image:REF@sha256:…\""
        ))
    }
}

/// True for `sha256:` followed by 64 lowercase hex digits.
pub fn is_sha256_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

impl fmt::Display for RootfsSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RootfsSpec::Host => f.write_str("host"),
            RootfsSpec::HostFull => f.write_str("host-full"),
            RootfsSpec::Dir(path) => write!(f, "dir:{}", path.display()),
            RootfsSpec::Image { reference, digest } => write!(f, "image:{reference}@{digest}"),
        }
    }
}

impl Serialize for RootfsSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for RootfsSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Whether `/work` is read-only or writable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkdirMode {
    /// Read-only (the default).
    #[default]
    Ro,
    /// Writable.
    Rw,
}

/// The `/out` directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutPolicy {
    /// Whether jobs get a writable `/out`.
    pub enabled: bool,
    /// Size cap of `/out` (the tmpfs's size: the filesystem itself enforces it).
    pub max_bytes: ByteSize,
    /// Most files released from `/out`.
    pub max_files: u32,
    /// Largest single file released.
    pub max_file_bytes: ByteSize,
    /// Most released bytes returned inline (base64 in the observation) when an HTTP or
    /// MCP caller asks for `return_files`; files past it are listed without content.
    pub inline_bytes: ByteSize,
    /// Most released bytes an MCP `run_code` result carries inline (base64, or an image
    /// block for a small picture). Smaller than `inline_bytes` because MCP results go
    /// straight into the model's context: every file is also offered as a `resource_link`
    /// the client reads back with `resources/read`, so bytes past this cost nothing.
    pub mcp_inline_bytes: ByteSize,
}

impl Default for OutPolicy {
    fn default() -> Self {
        Self {
            enabled: false,
            max_bytes: ByteSize::mib(8),
            max_files: 64,
            max_file_bytes: ByteSize::mib(8),
            inline_bytes: ByteSize::mib(1),
            mcp_inline_bytes: ByteSize::bytes(64 * ByteSize::KIB),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn rootfs_specs_parse() {
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            format!("image:python:3.12@{digest}")
                .parse::<RootfsSpec>()
                .unwrap(),
            RootfsSpec::Image {
                reference: "python:3.12".into(),
                digest: digest.clone()
            }
        );
        assert_eq!(
            "dir:/srv/root".parse::<RootfsSpec>().unwrap(),
            RootfsSpec::Dir("/srv/root".into())
        );
        assert!("image:python@sha256:abc".parse::<RootfsSpec>().is_err());
        assert_eq!("host".parse::<RootfsSpec>().unwrap(), RootfsSpec::Host);
        assert_eq!(
            "host-full".parse::<RootfsSpec>().unwrap(),
            RootfsSpec::HostFull
        );
        assert_eq!(RootfsSpec::HostFull.to_string(), "host-full");
    }

    #[test]
    fn site_packages_must_be_plain_absolute_paths() {
        let mut fs = FilesystemPolicy {
            site_packages: vec!["/usr/lib/python3/dist-packages".into()],
            ..FilesystemPolicy::default()
        };
        assert!(fs.check().is_ok());
        for bad in [
            "relative/dir",
            "/usr/../etc",
            "/",
            "/opt/a\nb",
            "/tmp/venv/lib",
            "/etc/py",
        ] {
            fs.site_packages = vec![bad.into()];
            assert!(fs.check().is_err(), "{bad} accepted");
        }
    }
}
