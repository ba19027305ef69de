//! The policy file (DESIGN §4): versioned TOML, unknown keys rejected, every limit both the
//! default and the ceiling a request may not exceed.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::Error;
use crate::units::{ByteSize, Cpus, duration_serde};

/// The built-in policy, equal to DESIGN §4. Also shipped as `policy/default.toml`.
pub const BUILTIN_POLICY_TOML: &str = include_str!("../../../policy/default.toml");

/// Where the built-in policy says it came from in error messages.
pub const BUILTIN_ORIGIN: &str = "built-in";

/// Absolute sanity bounds. A policy or request outside them is malformed, whatever the
/// policy's own ceilings say.
pub mod bounds {
    use std::time::Duration;

    /// Shortest wall-time limit.
    pub const TIMEOUT_MIN: Duration = Duration::from_millis(10);
    /// Longest wall-time limit.
    pub const TIMEOUT_MAX: Duration = Duration::from_secs(24 * 3600);
    /// Least memory a job can be given (an interpreter needs a few MiB to start).
    pub const MEMORY_MIN_BYTES: u64 = 4 * 1024 * 1024;
    /// Most memory a job can be given.
    pub const MEMORY_MAX_BYTES: u64 = 1 << 40;
    /// Smallest CPU share, in thousandths of a CPU.
    pub const CPUS_MIN_MILLIS: u32 = 10;
    /// Largest CPU share, in thousandths of a CPU.
    pub const CPUS_MAX_MILLIS: u32 = 1024 * 1000;
    /// Most processes and threads a job can be allowed.
    pub const PIDS_MAX: u32 = 65_536;
    /// Smallest `/tmp`.
    pub const TMP_MIN_BYTES: u64 = 64 * 1024;
    /// Largest `/tmp`.
    pub const TMP_MAX_BYTES: u64 = 64 << 30;
    /// Most output bytes kept per stream (they are held in memory per job).
    pub const STREAM_KEEP_MAX_BYTES: u64 = 16 << 20;
    /// Largest source a policy may allow.
    pub const SOURCE_MAX_BYTES: u64 = 64 << 20;
    /// Largest total of input files a policy may allow.
    pub const FILES_MAX_BYTES: u64 = 4 << 30;
    /// Fewest open files a job can be limited to (interpreters open a dozen at start).
    pub const OPEN_FILES_MIN: u32 = 16;
    /// Most open files a job can be allowed.
    pub const OPEN_FILES_MAX: u32 = 1 << 20;
    /// Most input files a policy may allow in one job.
    pub const INPUT_FILES_MAX_COUNT: usize = 4096;
    /// Most files a policy may let a job release from `/out`.
    pub const OUT_FILES_MAX_COUNT: u32 = 4096;
    /// Largest `/out` a policy may allow.
    pub const OUT_MAX_BYTES: u64 = 4 << 30;
    /// Deepest input file path (segments).
    pub const INPUT_PATH_MAX_DEPTH: usize = 8;
    /// Longest segment of an input file path, in bytes.
    pub const INPUT_NAME_MAX_BYTES: usize = 255;
    /// Most arguments passed to the program.
    pub const ARGS_MAX_COUNT: usize = 256;
    /// Longest single argument, in bytes.
    pub const ARG_MAX_BYTES: usize = 4096;
    /// Most bytes of extra environment (names and values) a job may bring.
    pub const ENV_MAX_BYTES: usize = 64 * 1024;
    /// Longest policy version string.
    pub const VERSION_MAX_BYTES: usize = 64;
}

/// A parsed, validated policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The policy version, reported in every observation and audit line.
    pub version: String,
    /// Defaults and ceilings.
    #[serde(default)]
    pub limits: Limits,
    /// Root filesystem and job directories.
    #[serde(default)]
    pub filesystem: FilesystemPolicy,
    /// Network mode and allowlist.
    #[serde(default)]
    pub network: NetworkPolicy,
    /// Redaction of secret-shaped output.
    #[serde(default)]
    pub redaction: RedactionPolicy,
    /// The languages jobs may use. When the table is present it is the complete set.
    #[serde(default = "builtin_languages")]
    pub languages: BTreeMap<String, LanguageSpec>,
    /// Environment variables a request may set.
    #[serde(default)]
    pub env: EnvPolicy,
    /// The audit log.
    #[serde(default)]
    pub audit: AuditPolicy,
    /// Settings of the native backend.
    #[serde(default)]
    pub native: NativePolicy,
    /// Settings of the Engine API backends (docker, podman, gvisor).
    #[serde(default)]
    pub docker: DockerPolicy,
    /// Settings of the Kubernetes backend.
    #[serde(default)]
    pub kube: KubePolicy,
    /// The image store and when images are due for a rebuild.
    #[serde(default)]
    pub images: ImagesPolicy,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            version: "default-1".to_owned(),
            limits: Limits::default(),
            filesystem: FilesystemPolicy::default(),
            network: NetworkPolicy::default(),
            redaction: RedactionPolicy::default(),
            languages: builtin_languages(),
            env: EnvPolicy::default(),
            audit: AuditPolicy::default(),
            native: NativePolicy::default(),
            docker: DockerPolicy::default(),
            kube: KubePolicy::default(),
            images: ImagesPolicy::default(),
        }
    }
}

impl Policy {
    /// The built-in policy (DESIGN §4).
    pub fn builtin() -> Self {
        Self::default()
    }

    /// Parses and validates a policy from TOML. `origin` names the source in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, Error> {
        let policy: Policy = toml::from_str(text).map_err(|source| Error::ParsePolicy {
            origin: origin.to_owned(),
            source,
        })?;
        policy.validate(origin)?;
        Ok(policy)
    }

    /// Renders the policy as TOML (every key explicit).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render policy: {e}\n"))
    }

    /// Checks every value against the absolute bounds and for consistency.
    pub fn validate(&self, origin: &str) -> Result<(), Error> {
        let bad = |field: &str, reason: String| Error::InvalidPolicy {
            origin: origin.to_owned(),
            field: field.to_owned(),
            reason,
        };
        if self.version.is_empty()
            || self.version.len() > bounds::VERSION_MAX_BYTES
            || !self
                .version
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b))
        {
            return Err(bad(
                "version",
                format!(
                    "must be 1-{} characters of [A-Za-z0-9._+-]",
                    bounds::VERSION_MAX_BYTES
                ),
            ));
        }
        self.limits
            .check_bounds()
            .map_err(|(field, reason)| bad(&format!("limits.{field}"), reason))?;
        let kept = self.limits.stdout.as_u64() + self.limits.stderr.as_u64();
        if self.limits.flood.as_u64() < kept {
            return Err(bad(
                "limits.flood",
                format!(
                    "{} is less than stdout + stderr kept ({})",
                    self.limits.flood,
                    ByteSize::bytes(kept)
                ),
            ));
        }
        let out = &self.filesystem.out;
        if out.max_bytes.as_u64() == 0 || out.max_bytes.as_u64() > bounds::OUT_MAX_BYTES {
            return Err(bad(
                "filesystem.out.max_bytes",
                format!(
                    "must be between 1B and {}",
                    ByteSize::bytes(bounds::OUT_MAX_BYTES)
                ),
            ));
        }
        if out.max_files == 0 || out.max_files > bounds::OUT_FILES_MAX_COUNT {
            return Err(bad(
                "filesystem.out.max_files",
                format!("must be between 1 and {}", bounds::OUT_FILES_MAX_COUNT),
            ));
        }
        if out.max_file_bytes.as_u64() == 0 {
            return Err(bad(
                "filesystem.out.max_file_bytes",
                "must not be 0".to_owned(),
            ));
        }
        if self.languages.is_empty() {
            return Err(bad("languages", "no language is defined".to_owned()));
        }
        for (name, spec) in &self.languages {
            let field = format!("languages.{name}");
            if !is_identifier(name) {
                return Err(bad(&field, "name must be [a-z0-9_-]".to_owned()));
            }
            spec.check().map_err(|reason| bad(&field, reason))?;
        }
        for name in &self.env.allow {
            if !is_env_name(name) {
                return Err(bad("env.allow", format!("{name:?} is not a variable name")));
            }
        }
        for entry in &self.network.allow {
            HostPattern::from_str(entry).map_err(|reason| bad("network.allow", reason))?;
        }
        for name in self.network.hosts.keys() {
            match HostPattern::from_str(name) {
                Ok(p) if p.port.is_none() && !p.host.starts_with("*.") => {}
                _ => {
                    return Err(bad(
                        "network.hosts",
                        format!("{name:?} must be a plain host name"),
                    ));
                }
            }
        }
        for range in &self.network.allow_ranges {
            parse_cidr(range).map_err(|reason| bad("network.allow_ranges", reason))?;
        }
        for (i, secret) in self.network.secrets.iter().enumerate() {
            let field = format!("network.secrets[{i}]");
            if !is_env_name(&secret.env) || !is_env_name(&secret.value_env) {
                return Err(bad(
                    &field,
                    "env and value_env must be variable names".to_owned(),
                ));
            }
            if secret.placeholder.len() < 8 || secret.placeholder.contains('\0') {
                return Err(bad(
                    &field,
                    "placeholder must be at least 8 characters (it is searched for in requests)"
                        .to_owned(),
                ));
            }
            if secret.hosts.is_empty() {
                return Err(bad(
                    &field,
                    "hosts must name where the secret may go".to_owned(),
                ));
            }
            for host in &secret.hosts {
                HostPattern::from_str(host).map_err(|reason| bad(&field, reason))?;
            }
        }
        if self.network.limits.connections == 0 {
            return Err(bad(
                "network.limits.connections",
                "must be at least 1".to_owned(),
            ));
        }
        if self.audit.path.as_os_str().is_empty() {
            return Err(bad("audit.path", "must not be empty".to_owned()));
        }
        if let CgroupParent::Path(path) = &self.native.cgroup_parent
            && (path.is_absolute() || path.components().any(|c| c.as_os_str() == ".."))
        {
            return Err(bad(
                "native.cgroup_parent",
                "must be \"auto\" or a relative path below the cgroup mount, without ..".to_owned(),
            ));
        }
        if self.native.host_uid_base < NativePolicy::HOST_UID_BASE_MIN
            || self.native.host_uid_base > u32::MAX - NativePolicy::MAPPED_IDS
        {
            return Err(bad(
                "native.host_uid_base",
                format!(
                    "must be between {} and {}",
                    NativePolicy::HOST_UID_BASE_MIN,
                    u32::MAX - NativePolicy::MAPPED_IDS
                ),
            ));
        }
        if self.native.warm_pool > NativePolicy::WARM_POOL_MAX {
            return Err(bad(
                "native.warm_pool",
                format!("must be at most {}", NativePolicy::WARM_POOL_MAX),
            ));
        }
        if !(NativePolicy::WARM_IDLE_MIN..=NativePolicy::WARM_IDLE_MAX)
            .contains(&self.native.warm_idle)
        {
            return Err(bad(
                "native.warm_idle",
                format!(
                    "must be between {}s and {}s",
                    NativePolicy::WARM_IDLE_MIN.as_secs(),
                    NativePolicy::WARM_IDLE_MAX.as_secs()
                ),
            ));
        }
        if self.native.warm_pool > 0 {
            let language = self.languages.get(&self.native.warm_language);
            let python = language.is_some_and(|l| {
                let program = l.command[0].rsplit('/').next().unwrap_or_default();
                program.starts_with("python")
                    && l.command.last().map(String::as_str) == Some(LanguageSpec::FILE_PLACEHOLDER)
                    && l.command
                        .iter()
                        .filter(|a| a.contains(LanguageSpec::FILE_PLACEHOLDER))
                        .count()
                        == 1
            });
            if !python {
                return Err(bad(
                    "native.warm_language",
                    format!(
                        "{:?} must be a language whose command is a Python interpreter with \
                         {} as its last argument (warm sandboxes start Python ahead of the job)",
                        self.native.warm_language,
                        LanguageSpec::FILE_PLACEHOLDER
                    ),
                ));
            }
        }
        self.docker
            .check()
            .map_err(|(field, reason)| bad(&format!("docker.{field}"), reason))?;
        self.kube
            .check()
            .map_err(|(field, reason)| bad(&format!("kube.{field}"), reason))?;
        self.images
            .check()
            .map_err(|(field, reason)| bad(&format!("images.{field}"), reason))?;
        Ok(())
    }

    /// Looks up a language.
    pub fn language(&self, name: &str) -> Option<&LanguageSpec> {
        self.languages.get(name)
    }

    /// The language a request that names none runs as: `python` when the policy defines
    /// it (what a model writes unless told otherwise, and the CLI's default), else the
    /// first language in name order. [`Policy::check`] guarantees there is one.
    pub fn default_language(&self) -> &str {
        if self.languages.contains_key("python") {
            return "python";
        }
        self.languages
            .keys()
            .next()
            .map_or("python", String::as_str)
    }
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// True for a POSIX-style environment variable name.
pub fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 128
}

/// Resource limits. In a policy each value is both the default and the ceiling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall time from the moment the program starts.
    #[serde(with = "duration_serde")]
    pub timeout: Duration,
    /// Memory (RAM, no swap), page cache and `/tmp` included.
    pub memory: ByteSize,
    /// CPU share.
    pub cpus: Cpus,
    /// Processes and threads.
    pub pids: u32,
    /// Size of the `/tmp` tmpfs.
    pub tmp: ByteSize,
    /// Bytes of stdout kept and returned.
    pub stdout: ByteSize,
    /// Bytes of stderr kept and returned.
    pub stderr: ByteSize,
    /// Total output after which the job is killed as `output_limit`.
    pub flood: ByteSize,
    /// Largest source.
    pub source: ByteSize,
    /// Largest total of input files and stdin.
    pub files: ByteSize,
    /// Most input files.
    pub input_files: u32,
    /// Open file descriptors per process (RLIMIT_NOFILE).
    pub open_files: u32,
    /// Largest file a process may write (RLIMIT_FSIZE).
    pub file_size: ByteSize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(5),
            memory: ByteSize::mib(256),
            cpus: Cpus::from_millis(500),
            pids: 64,
            tmp: ByteSize::mib(16),
            stdout: ByteSize::bytes(8000),
            stderr: ByteSize::bytes(2000),
            flood: ByteSize::mib(64),
            source: ByteSize::mib(1),
            files: ByteSize::mib(16),
            input_files: 64,
            open_files: 256,
            file_size: ByteSize::mib(64),
        }
    }
}

impl Limits {
    /// Checks each value against [`bounds`]; returns the field name and reason.
    pub(crate) fn check_bounds(&self) -> Result<(), (&'static str, String)> {
        use bounds::*;
        check_timeout(self.timeout).map_err(|r| ("timeout", r))?;
        check_memory(self.memory).map_err(|r| ("memory", r))?;
        check_cpus(self.cpus).map_err(|r| ("cpus", r))?;
        check_pids(self.pids).map_err(|r| ("pids", r))?;
        in_range(self.tmp.as_u64(), TMP_MIN_BYTES, TMP_MAX_BYTES).map_err(|r| ("tmp", r))?;
        in_range(self.stdout.as_u64(), 0, STREAM_KEEP_MAX_BYTES).map_err(|r| ("stdout", r))?;
        in_range(self.stderr.as_u64(), 0, STREAM_KEEP_MAX_BYTES).map_err(|r| ("stderr", r))?;
        in_range(self.flood.as_u64(), 1, u64::MAX).map_err(|r| ("flood", r))?;
        in_range(self.source.as_u64(), 1, SOURCE_MAX_BYTES).map_err(|r| ("source", r))?;
        in_range(self.files.as_u64(), 0, FILES_MAX_BYTES).map_err(|r| ("files", r))?;
        in_range(u64::from(self.input_files), 0, INPUT_FILES_MAX_COUNT as u64)
            .map_err(|r| ("input_files", r))?;
        in_range(
            u64::from(self.open_files),
            u64::from(OPEN_FILES_MIN),
            u64::from(OPEN_FILES_MAX),
        )
        .map_err(|r| ("open_files", r))?;
        in_range(self.file_size.as_u64(), 1, u64::MAX).map_err(|r| ("file_size", r))?;
        Ok(())
    }
}

fn in_range(value: u64, min: u64, max: u64) -> Result<(), String> {
    if value < min {
        Err(format!("{value} is below the minimum {min}"))
    } else if value > max {
        Err(format!("{value} is above the maximum {max}"))
    } else {
        Ok(())
    }
}

pub(crate) fn check_timeout(value: Duration) -> Result<(), String> {
    if value < bounds::TIMEOUT_MIN || value > bounds::TIMEOUT_MAX {
        return Err(format!(
            "{} is outside {}..{}",
            crate::units::format_duration(value),
            crate::units::format_duration(bounds::TIMEOUT_MIN),
            crate::units::format_duration(bounds::TIMEOUT_MAX)
        ));
    }
    Ok(())
}

pub(crate) fn check_memory(value: ByteSize) -> Result<(), String> {
    if value.as_u64() < bounds::MEMORY_MIN_BYTES || value.as_u64() > bounds::MEMORY_MAX_BYTES {
        return Err(format!(
            "{value} is outside {}..{}",
            ByteSize::bytes(bounds::MEMORY_MIN_BYTES),
            ByteSize::bytes(bounds::MEMORY_MAX_BYTES)
        ));
    }
    Ok(())
}

pub(crate) fn check_cpus(value: Cpus) -> Result<(), String> {
    if value.millis() < bounds::CPUS_MIN_MILLIS || value.millis() > bounds::CPUS_MAX_MILLIS {
        return Err(format!(
            "{value} is outside {}..{}",
            Cpus::from_millis(bounds::CPUS_MIN_MILLIS),
            Cpus::from_millis(bounds::CPUS_MAX_MILLIS)
        ));
    }
    Ok(())
}

pub(crate) fn check_pids(value: u32) -> Result<(), String> {
    if value == 0 || value > bounds::PIDS_MAX {
        return Err(format!("{value} is outside 1..{}", bounds::PIDS_MAX));
    }
    Ok(())
}

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
}

/// What the job's root filesystem is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RootfsSpec {
    /// A read-only view of the host's `/usr`, `/bin`, `/sbin`, `/lib*` and a synthesized `/etc`.
    #[default]
    Host,
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
            "rootfs {text:?} must be \"host\", \"dir:/path\" or \"image:REF@sha256:…\""
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
}

impl Default for OutPolicy {
    fn default() -> Self {
        Self {
            enabled: false,
            max_bytes: ByteSize::mib(8),
            max_files: 64,
            max_file_bytes: ByteSize::mib(8),
            inline_bytes: ByteSize::mib(1),
        }
    }
}

/// Network access of jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkPolicy {
    /// `none` or `proxy`.
    pub mode: NetworkMode,
    /// `host[:port]` entries the proxy may reach (`*.` wildcards allowed).
    pub allow: Vec<String>,
    /// Address ranges (CIDR, e.g. `127.0.0.1/32`) the proxy may connect to although they
    /// are in a blocked range (loopback, private, link-local, ...). Empty by default.
    pub allow_ranges: Vec<String>,
    /// Names the proxy resolves from this table instead of DNS (like curl's `--resolve`),
    /// e.g. an internal API: `{ "api.internal" = ["10.1.2.3"] }`. The answers are still
    /// checked against the blocked ranges.
    pub hosts: BTreeMap<String, Vec<std::net::IpAddr>>,
    /// Secrets the job sees only as placeholders; the proxy substitutes the real value in
    /// requests to the secret's hosts.
    pub secrets: Vec<SecretSpec>,
    /// Bounds on the proxy's work for one job.
    pub limits: ProxyLimits,
}

/// A secret kept on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    /// The environment variable the job sees, holding the placeholder.
    pub env: String,
    /// The placeholder text the job sees and sends.
    pub placeholder: String,
    /// Where the real value comes from: the executor's environment variable of this name.
    pub value_env: String,
    /// `host[:port]` patterns the real value may be sent to.
    pub hosts: Vec<String>,
}

/// Bounds on the egress proxy, per job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyLimits {
    /// Connections over the job's life.
    pub connections: u32,
    /// Bytes through the proxy in both directions.
    pub bytes: ByteSize,
    /// Time to connect to an upstream.
    #[serde(with = "duration_serde")]
    pub connect_timeout: Duration,
    /// A connection with no traffic this long is closed.
    #[serde(with = "duration_serde")]
    pub idle_timeout: Duration,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        Self {
            connections: 64,
            bytes: ByteSize::mib(64),
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// How a job reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// A fresh network namespace with only `lo`.
    #[default]
    None,
    /// Only the allowlisting egress proxy.
    Proxy,
}

impl fmt::Display for NetworkMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NetworkMode::None => "none",
            NetworkMode::Proxy => "proxy",
        })
    }
}

/// An allowlist entry: `host[:port]`, the host possibly starting with `*.`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    /// Lower-case host, or `*.suffix`.
    pub host: String,
    /// The port, if the entry names one.
    pub port: Option<u16>,
}

impl FromStr for HostPattern {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (host, port) = match text.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => {
                let port: u16 = port
                    .parse()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("{text:?}: bad port {port:?}"))?;
                (host, Some(port))
            }
            _ => (text, None),
        };
        let labels = host.strip_prefix("*.").unwrap_or(host);
        let valid = !labels.is_empty()
            && labels.len() <= 253
            && labels.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !valid {
            return Err(format!(
                "{text:?} is not a host name, *.domain or IPv4 address"
            ));
        }
        Ok(HostPattern {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

/// Parses `a.b.c.d/n` or `v6::/n` into an address and a prefix length.
pub fn parse_cidr(text: &str) -> Result<(std::net::IpAddr, u8), String> {
    let (addr, len) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?} is not a CIDR range (write e.g. 127.0.0.1/32)"))?;
    let addr: std::net::IpAddr = addr
        .parse()
        .map_err(|_| format!("{text:?}: {addr:?} is not an IP address"))?;
    let len: u8 = len
        .parse()
        .map_err(|_| format!("{text:?}: bad prefix length {len:?}"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(format!("{text:?}: prefix length above {max}"));
    }
    Ok((addr, len))
}

/// Redaction of secret-shaped output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedactionPolicy {
    /// Whether the built-in secret patterns apply.
    pub builtin: bool,
    /// More regular expressions (a group named `secret`, when present, is what is replaced).
    pub extra: Vec<String>,
    /// Literal values that are secrets wherever they appear (4 bytes or more).
    pub exact: Vec<String>,
    /// Names of the executor's environment variables whose values are secrets wherever they
    /// appear: the executor's own keys stay out of observations even if a job learns them.
    pub exact_env: Vec<String>,
}

impl Default for RedactionPolicy {
    fn default() -> Self {
        Self {
            builtin: true,
            extra: Vec::new(),
            exact: Vec::new(),
            exact_env: Vec::new(),
        }
    }
}

/// How a language's source is run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LanguageSpec {
    /// argv; `{file}` is replaced with the source's path inside the sandbox.
    pub command: Vec<String>,
    /// The source's file name under `/work`.
    pub file: String,
}

impl LanguageSpec {
    /// The placeholder replaced with the source path.
    pub const FILE_PLACEHOLDER: &'static str = "{file}";

    fn check(&self) -> Result<(), String> {
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err("command must not be empty".to_owned());
        }
        if !self
            .command
            .iter()
            .any(|a| a.contains(Self::FILE_PLACEHOLDER))
        {
            return Err(format!(
                "command must contain {} (where the source goes)",
                Self::FILE_PLACEHOLDER
            ));
        }
        if self.command.iter().any(|a| a.contains('\0')) {
            return Err("command contains a NUL byte".to_owned());
        }
        crate::job::check_file_name(&self.file).map_err(|r| format!("file: {r}"))?;
        Ok(())
    }
}

fn language(command: &[&str], file: &str) -> LanguageSpec {
    LanguageSpec {
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        file: file.to_owned(),
    }
}

/// The languages of the built-in policy.
pub fn builtin_languages() -> BTreeMap<String, LanguageSpec> {
    BTreeMap::from([
        (
            "python".to_owned(),
            language(&["python3", "-I", "-u", "{file}"], "main.py"),
        ),
        ("node".to_owned(), language(&["node", "{file}"], "main.js")),
        ("bash".to_owned(), language(&["bash", "{file}"], "main.sh")),
        ("sh".to_owned(), language(&["sh", "{file}"], "main.sh")),
    ])
}

/// Environment variables a request may set (beyond the fixed base of DESIGN S1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct EnvPolicy {
    /// Names a request may set.
    pub allow: Vec<String>,
}

/// The audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditPolicy {
    /// The JSONL file. A relative path is resolved against the policy file's directory,
    /// or for the built-in policy against airlock's state directory.
    pub path: PathBuf,
    /// Whether each line is flushed to disk (fdatasync) before the job's result is returned.
    pub fsync: bool,
}

impl Default for AuditPolicy {
    fn default() -> Self {
        Self {
            path: PathBuf::from("audit.jsonl"),
            fsync: true,
        }
    }
}

/// Settings of the native backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NativePolicy {
    /// Where job cgroups are created: `"auto"` or a path relative to the cgroup mount.
    pub cgroup_parent: CgroupParent,
    /// When airlock runs as root, in-sandbox ids 0..65535 map to host ids starting here,
    /// so the job's uid 65534 is an unused host uid, never a real account or root.
    pub host_uid_base: u32,
    /// Weaker shapes this policy accepts when the host cannot give the full one. Empty by
    /// default: a missing control refuses the job. `"cgroup"` accepts rlimits (address
    /// space, process count, CPU time) in place of cgroup limits, for unprivileged use
    /// without a delegated cgroup; `"swap"` accepts an uncapped swap on a host with swap
    /// enabled and no swap accounting; observations and audit lines then list what is
    /// degraded.
    pub allow_degraded: Vec<DegradedControl>,
    /// Sandboxes `airlock serve` and `airlock mcp` keep started ahead of time for
    /// `warm_language` jobs, each fully isolated and used for one job only. 0 (the default)
    /// starts every sandbox on demand.
    pub warm_pool: u32,
    /// The language warm sandboxes are started for; its interpreter must be Python.
    pub warm_language: String,
    /// How long a warm sandbox may wait for its job; older ones are torn down and replaced,
    /// so no sandbox outlives this however quiet the server is.
    #[serde(with = "duration_serde")]
    pub warm_idle: Duration,
}

/// A control a policy may accept in a weaker form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DegradedControl {
    /// rlimits instead of cgroup limits for memory, CPU and processes.
    Cgroup,
    /// A memory limit without a swap limit, on a host that has swap enabled but no swap
    /// accounting (v1 without `memory.memsw.*`, v2 without `memory.swap.max`): a job may
    /// then page out beyond its memory limit.
    Swap,
}

impl NativePolicy {
    /// How many ids are mapped (in-sandbox 0..=65535).
    pub const MAPPED_IDS: u32 = 65_536;
    /// The lowest allowed base: below it lie real accounts and subuid ranges.
    pub const HOST_UID_BASE_MIN: u32 = 1_000_000;
    /// The largest warm pool (each warm sandbox holds an interpreter's memory).
    pub const WARM_POOL_MAX: u32 = 64;
    /// The shortest idle lifetime: below it the pool would spend its time restarting.
    pub const WARM_IDLE_MIN: Duration = Duration::from_secs(1);
    /// The longest idle lifetime.
    pub const WARM_IDLE_MAX: Duration = Duration::from_secs(24 * 3600);
}

impl Default for NativePolicy {
    fn default() -> Self {
        Self {
            cgroup_parent: CgroupParent::Auto,
            host_uid_base: 1_879_048_192,
            allow_degraded: Vec::new(),
            warm_pool: 0,
            warm_language: "python".to_owned(),
            warm_idle: Duration::from_secs(600),
        }
    }
}

/// Settings of the Engine API backends: where their daemons listen and which OCI runtime
/// each uses. The job never sees any of this; the sockets stay on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DockerPolicy {
    /// The Docker daemon's socket, for `--backend docker` and `--backend gvisor`.
    pub docker_socket: PathBuf,
    /// Podman's Docker-compatible service socket (`podman system service`).
    pub podman_socket: PathBuf,
    /// The OCI runtime of `--backend docker`.
    pub runtime: String,
    /// The OCI runtime of `--backend gvisor`, as registered with the Docker daemon.
    pub gvisor_runtime: String,
    /// The OCI runtime of `--backend podman`; empty: the service's default.
    pub podman_runtime: String,
}

impl DockerPolicy {
    /// Longest runtime name.
    pub const RUNTIME_NAME_MAX_BYTES: usize = 64;

    fn check(&self) -> Result<(), (&'static str, String)> {
        for (field, path) in [
            ("docker_socket", &self.docker_socket),
            ("podman_socket", &self.podman_socket),
        ] {
            if !path.is_absolute() {
                return Err((field, format!("{} is not an absolute path", path.display())));
            }
            if path.as_os_str().as_encoded_bytes().contains(&0) {
                return Err((field, "contains a NUL byte".to_owned()));
            }
        }
        for (field, name, may_be_empty) in [
            ("runtime", &self.runtime, false),
            ("gvisor_runtime", &self.gvisor_runtime, false),
            ("podman_runtime", &self.podman_runtime, true),
        ] {
            if name.is_empty() && may_be_empty {
                continue;
            }
            let valid = !name.is_empty()
                && name.len() <= Self::RUNTIME_NAME_MAX_BYTES
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !valid {
                return Err((
                    field,
                    format!(
                        "{name:?} is not a runtime name (1-{} characters of [A-Za-z0-9._-])",
                        Self::RUNTIME_NAME_MAX_BYTES
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Default for DockerPolicy {
    fn default() -> Self {
        Self {
            docker_socket: PathBuf::from("/var/run/docker.sock"),
            podman_socket: PathBuf::from("/run/podman/podman.sock"),
            runtime: "runc".to_owned(),
            gvisor_runtime: "runsc".to_owned(),
            podman_runtime: String::new(),
        }
    }
}

/// Settings of the Kubernetes backend (`--backend kube`): where the API server is, the
/// namespace job Pods run in, and what each Pod is scheduled with. The job never sees any of
/// this; the credentials stay with airlock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubePolicy {
    /// A kubeconfig file. Empty: `$KUBECONFIG`, else `~/.kube/config`, else the in-cluster
    /// service account (airlock running in a Pod).
    pub kubeconfig: PathBuf,
    /// The kubeconfig context; empty: its current context.
    pub context: String,
    /// The namespace job Pods run in (prepared once by `airlock kube install`).
    pub namespace: String,
    /// The RuntimeClass of job Pods, e.g. `gvisor` or `kata`; empty: the nodes' default
    /// runtime.
    pub runtime_class: String,
    /// The job image, `REF@sha256:…`. Empty: the `[filesystem] rootfs` image.
    pub image: String,
    /// The service account job Pods run as (no token is mounted).
    pub service_account: String,
    /// Labels a node must have to run job Pods.
    pub node_selector: BTreeMap<String, String>,
    /// Taints job Pods tolerate (for a node pool reserved for them).
    pub tolerations: Vec<KubeToleration>,
    /// Ephemeral storage requested and limited per job Pod (the container's logs and
    /// writable layer count against it; the kubelet evicts a Pod above it).
    pub ephemeral_storage: ByteSize,
    /// Most job Pods at once in the namespace: the ResourceQuota `airlock kube install`
    /// creates.
    pub max_pods: u32,
    /// The seccomp profile of job Pods: `RuntimeDefault`, or `Localhost:<path>` for a
    /// profile installed on every node (below the kubelet's seccomp directory), e.g.
    /// airlock's own policy rendered by `airlock kube seccomp-profile`.
    pub seccomp_profile: String,
    /// How output is read: `merged` (stdout and stderr interleaved by the Pod log API,
    /// returned as stdout; needs `allow_degraded = ["merged_logs"]`) or `split` (the log
    /// API's `stream=Stdout|Stderr`, which needs the `PodLogsQuerySplitStreams` feature
    /// gate; a cluster that ignores it fails the job rather than mixing the streams).
    pub log_streams: KubeLogStreams,
    /// Longest time from the Pod's creation to its program's start (scheduling, image,
    /// volumes).
    #[serde(with = "duration_serde")]
    pub start_timeout: Duration,
    /// Controls a Pod can give only in a weaker form, accepted by this policy. Empty by
    /// default: the backend refuses jobs and says which are missing. See
    /// [`KubeDegraded`]; each accepted one is listed in every observation.
    pub allow_degraded: Vec<KubeDegraded>,
}

/// A control the Kubernetes backend can give only in a weaker form than DESIGN §1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KubeDegraded {
    /// S4: `/tmp` is a size-limited `emptyDir` (tmpfs); Kubernetes has no mount options
    /// for it, so it is not `noexec`.
    TmpExec,
    /// S6: a Pod spec has no pids limit; the node's kubelet `podPidsLimit` applies, not
    /// the job's own.
    Pids,
    /// S3: the Pod has a network namespace with an interface; egress is denied by the
    /// namespace's NetworkPolicy, which only a policy-enforcing CNI applies.
    NetworkPolicy,
    /// S5: with `seccomp_profile = "RuntimeDefault"` the runtime's default filter applies,
    /// not airlock's (which also denies ptrace, io_uring, userfaultfd, ...).
    Seccomp,
    /// S7: with `log_streams = "merged"`, stderr arrives interleaved in stdout.
    MergedLogs,
}

/// How the Kubernetes backend reads a job's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KubeLogStreams {
    /// One interleaved stream, reported as stdout.
    #[default]
    Merged,
    /// Two streams (`stream=Stdout`, `stream=Stderr`).
    Split,
}

impl KubeDegraded {
    /// The wire name, as in the policy.
    pub const fn as_str(self) -> &'static str {
        match self {
            KubeDegraded::TmpExec => "tmp_exec",
            KubeDegraded::Pids => "pids",
            KubeDegraded::NetworkPolicy => "network_policy",
            KubeDegraded::Seccomp => "seccomp",
            KubeDegraded::MergedLogs => "merged_logs",
        }
    }
}

/// A toleration of job Pods, as in a Pod spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeToleration {
    /// The taint key; empty with `operator = "Exists"` tolerates every taint.
    #[serde(default)]
    pub key: String,
    /// `Equal` or `Exists`.
    #[serde(default = "default_toleration_operator")]
    pub operator: String,
    /// The taint value (`Equal` only).
    #[serde(default)]
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule`, `NoExecute`, or empty for all.
    #[serde(default)]
    pub effect: String,
}

fn default_toleration_operator() -> String {
    "Equal".to_owned()
}

impl KubePolicy {
    /// The seccomp profile value of the default runtime's filter.
    pub const SECCOMP_RUNTIME_DEFAULT: &'static str = "RuntimeDefault";
    /// The prefix of a node-local profile.
    pub const SECCOMP_LOCALHOST_PREFIX: &'static str = "Localhost:";
    /// Most job Pods a policy may allow at once.
    pub const MAX_PODS_MAX: u32 = 10_000;
    /// Least ephemeral storage per Pod.
    pub const EPHEMERAL_STORAGE_MIN_BYTES: u64 = 1024 * 1024;
    /// Longest start timeout.
    pub const START_TIMEOUT_MAX: Duration = Duration::from_secs(3600);

    /// The image a job runs: `[kube] image`, else the `[filesystem] rootfs` image, as
    /// (reference, digest).
    pub fn image_ref<'a>(&'a self, rootfs: &'a RootfsSpec) -> Option<(String, String)> {
        if let Some((reference, digest)) = self.image.rsplit_once('@') {
            return Some((reference.to_owned(), digest.to_owned()));
        }
        match rootfs {
            RootfsSpec::Image { reference, digest } => Some((reference.clone(), digest.clone())),
            RootfsSpec::Host | RootfsSpec::Dir(_) => None,
        }
    }

    fn check(&self) -> Result<(), (&'static str, String)> {
        if !is_dns_label(&self.namespace) {
            return Err((
                "namespace",
                format!("{:?} is not a namespace name (a DNS label)", self.namespace),
            ));
        }
        if !self.runtime_class.is_empty() && !is_dns_subdomain(&self.runtime_class) {
            return Err((
                "runtime_class",
                format!("{:?} is not a RuntimeClass name", self.runtime_class),
            ));
        }
        if !is_dns_subdomain(&self.service_account) {
            return Err((
                "service_account",
                format!("{:?} is not a service account name", self.service_account),
            ));
        }
        if !self.image.is_empty() {
            match self.image.rsplit_once('@') {
                Some((reference, digest))
                    if !reference.is_empty()
                        && is_sha256_digest(digest)
                        && !reference
                            .bytes()
                            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) => {}
                _ => {
                    return Err((
                        "image",
                        format!("{:?} must be pinned as REF@sha256:<64 hex>", self.image),
                    ));
                }
            }
        }
        if self.kubeconfig.as_os_str().as_encoded_bytes().contains(&0) {
            return Err(("kubeconfig", "contains a NUL byte".to_owned()));
        }
        if self.context.chars().any(char::is_control) {
            return Err(("context", "contains a control character".to_owned()));
        }
        for (key, value) in &self.node_selector {
            if !is_label_key(key) {
                return Err(("node_selector", format!("{key:?} is not a label key")));
            }
            if !is_label_value(value) {
                return Err((
                    "node_selector",
                    format!("{value:?} (of {key:?}) is not a label value"),
                ));
            }
        }
        for (i, t) in self.tolerations.iter().enumerate() {
            t.check()
                .map_err(|reason| ("tolerations", format!("tolerations[{i}]: {reason}")))?;
        }
        if self.ephemeral_storage.as_u64() < Self::EPHEMERAL_STORAGE_MIN_BYTES {
            return Err((
                "ephemeral_storage",
                format!(
                    "{} is below {}",
                    self.ephemeral_storage,
                    ByteSize::bytes(Self::EPHEMERAL_STORAGE_MIN_BYTES)
                ),
            ));
        }
        if self.max_pods == 0 || self.max_pods > Self::MAX_PODS_MAX {
            return Err((
                "max_pods",
                format!("must be between 1 and {}", Self::MAX_PODS_MAX),
            ));
        }
        if self.seccomp_profile != Self::SECCOMP_RUNTIME_DEFAULT {
            let valid = self
                .seccomp_profile
                .strip_prefix(Self::SECCOMP_LOCALHOST_PREFIX)
                .is_some_and(|path| {
                    !path.is_empty()
                        && !path.starts_with('/')
                        && !path.split('/').any(|s| s.is_empty() || s == "..")
                        && !path.chars().any(char::is_control)
                });
            if !valid {
                return Err((
                    "seccomp_profile",
                    format!(
                        "{:?} must be \"RuntimeDefault\" or \"Localhost:<relative path>\"",
                        self.seccomp_profile
                    ),
                ));
            }
        }
        if self.start_timeout.is_zero() || self.start_timeout > Self::START_TIMEOUT_MAX {
            return Err((
                "start_timeout",
                format!(
                    "must be between 1s and {}",
                    crate::units::format_duration(Self::START_TIMEOUT_MAX)
                ),
            ));
        }
        Ok(())
    }
}

impl KubeToleration {
    fn check(&self) -> Result<(), String> {
        match self.operator.as_str() {
            "Exists" => {
                if !self.value.is_empty() {
                    return Err("operator Exists takes no value".to_owned());
                }
            }
            "Equal" => {
                if self.key.is_empty() {
                    return Err("operator Equal needs a key".to_owned());
                }
                if !is_label_value(&self.value) {
                    return Err(format!("{:?} is not a taint value", self.value));
                }
            }
            other => return Err(format!("operator {other:?} is not Equal or Exists")),
        }
        if !self.key.is_empty() && !is_label_key(&self.key) {
            return Err(format!("{:?} is not a taint key", self.key));
        }
        if !["", "NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&self.effect.as_str()) {
            return Err(format!(
                "effect {:?} is not NoSchedule, PreferNoSchedule or NoExecute",
                self.effect
            ));
        }
        Ok(())
    }
}

impl Default for KubePolicy {
    fn default() -> Self {
        Self {
            kubeconfig: PathBuf::new(),
            context: String::new(),
            namespace: "airlock-jobs".to_owned(),
            runtime_class: String::new(),
            image: String::new(),
            service_account: "airlock-job".to_owned(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            ephemeral_storage: ByteSize::mib(256),
            max_pods: 16,
            seccomp_profile: Self::SECCOMP_RUNTIME_DEFAULT.to_owned(),
            log_streams: KubeLogStreams::Merged,
            start_timeout: Duration::from_secs(60),
            allow_degraded: Vec::new(),
        }
    }
}

/// A DNS label (RFC 1123): 1-63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

/// A DNS subdomain (RFC 1123): dot-separated DNS labels, at most 253 characters.
pub fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253 && text.split('.').all(is_dns_label)
}

/// A Kubernetes label value: empty, or 1-63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
pub fn is_label_value(text: &str) -> bool {
    text.is_empty()
        || (text.len() <= 63
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && text.starts_with(|c: char| c.is_ascii_alphanumeric())
            && text.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// A Kubernetes label key: an optional DNS-subdomain prefix and `/`, then a name (a
/// non-empty label value).
pub fn is_label_key(text: &str) -> bool {
    let (prefix, name) = match text.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, text),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && is_label_value(name)
}

/// The local image store (`airlock image ...`) and the rebuild schedule of its images.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesPolicy {
    /// The store's directory, absolute; empty: `images` under airlock's state directory.
    /// Its parent directories must be searchable by all (the sandbox binds trees from it).
    pub store: PathBuf,
    /// `airlock doctor` warns when an image in use was made longer ago than this.
    pub rebuild_age_days: u32,
}

impl ImagesPolicy {
    /// Longest rebuild age a policy may set.
    pub const REBUILD_AGE_MAX_DAYS: u32 = 3650;

    fn check(&self) -> Result<(), (&'static str, String)> {
        if !self.store.as_os_str().is_empty() && !self.store.is_absolute() {
            return Err((
                "store",
                format!(
                    "{} is not an absolute path (leave it empty for the default)",
                    self.store.display()
                ),
            ));
        }
        if self.store.as_os_str().as_encoded_bytes().contains(&0) {
            return Err(("store", "contains a NUL byte".to_owned()));
        }
        if self.rebuild_age_days == 0 || self.rebuild_age_days > Self::REBUILD_AGE_MAX_DAYS {
            return Err((
                "rebuild_age_days",
                format!("must be between 1 and {}", Self::REBUILD_AGE_MAX_DAYS),
            ));
        }
        Ok(())
    }
}

impl Default for ImagesPolicy {
    fn default() -> Self {
        Self {
            store: PathBuf::new(),
            rebuild_age_days: 30,
        }
    }
}

/// Where job cgroups live.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CgroupParent {
    /// Below airlock's own cgroup.
    #[default]
    Auto,
    /// A path relative to the cgroup mount root.
    Path(PathBuf),
}

impl Serialize for CgroupParent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            CgroupParent::Auto => serializer.serialize_str("auto"),
            CgroupParent::Path(p) => serializer.serialize_str(&p.to_string_lossy()),
        }
    }
}

impl<'de> Deserialize<'de> for CgroupParent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(if text == "auto" {
            CgroupParent::Auto
        } else {
            CgroupParent::Path(PathBuf::from(text))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn shipped_default_policy_equals_the_built_in_one() {
        let parsed = Policy::from_toml(BUILTIN_POLICY_TOML, BUILTIN_ORIGIN).unwrap();
        assert_eq!(parsed, Policy::builtin());
    }

    #[test]
    fn built_in_policy_matches_design() {
        let p = Policy::builtin();
        assert_eq!(p.version, "default-1");
        assert_eq!(p.limits.timeout, Duration::from_secs(5));
        assert_eq!(p.limits.memory, ByteSize::mib(256));
        assert_eq!(p.limits.cpus.millis(), 500);
        assert_eq!(p.limits.pids, 64);
        assert_eq!(p.limits.tmp, ByteSize::mib(16));
        assert_eq!(p.limits.stdout.as_u64(), 8000);
        assert_eq!(p.limits.stderr.as_u64(), 2000);
        assert_eq!(p.limits.flood, ByteSize::mib(64));
        assert_eq!(p.filesystem.rootfs, RootfsSpec::Host);
        assert_eq!(p.filesystem.workdir, WorkdirMode::Ro);
        assert_eq!(p.network.mode, NetworkMode::None);
        assert_eq!(
            p.languages["python"].command,
            vec!["python3", "-I", "-u", "{file}"]
        );
    }

    #[test]
    fn the_default_language_is_python_when_defined_else_the_first() {
        assert_eq!(Policy::builtin().default_language(), "python");
        let p = Policy::from_toml(
            "version = \"v\"\n[languages.sh]\ncommand = [\"sh\", \"{file}\"]\nfile = \"m.sh\"\n[languages.bash]\ncommand = [\"bash\", \"{file}\"]\nfile = \"m.sh\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.default_language(), "bash");
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err =
            Policy::from_toml("version = \"x\"\n[limits]\ntimout = \"5s\"\n", "t").unwrap_err();
        assert!(err.to_string().contains("timout"), "{err}");
        let err = Policy::from_toml("version = \"x\"\ncolour = 1\n", "t").unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    #[test]
    fn version_is_required() {
        let err = Policy::from_toml("[limits]\ntimeout = \"5s\"\n", "t").unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
    }

    #[test]
    fn partial_sections_take_defaults() {
        let p =
            Policy::from_toml("version = \"v2\"\n[limits]\nmemory = \"128MiB\"\n", "t").unwrap();
        assert_eq!(p.limits.memory, ByteSize::mib(128));
        assert_eq!(p.limits.timeout, Duration::from_secs(5));
    }

    #[test]
    fn absurd_policy_values_are_refused() {
        for bad in [
            "[limits]\ntimeout = \"0s\"",
            "[limits]\nmemory = \"1KiB\"",
            "[limits]\npids = 0",
            "[limits]\ncpus = 0",
            "[limits]\nflood = \"1KiB\"",
            "[filesystem]\nrootfs = \"image:python:3\"",
            "[filesystem]\nrootfs = \"dir:relative\"",
            "[languages.x]\ncommand = [\"x\"]\nfile = \"x\"",
            "[languages.x]\ncommand = [\"x\", \"{file}\"]\nfile = \"../x\"",
            "[env]\nallow = [\"NOT-A-NAME\"]",
            "[native]\ncgroup_parent = \"/abs\"",
            "[native]\nhost_uid_base = 0",
            "[native]\nwarm_pool = 65",
            "[native]\nwarm_pool = 1\nwarm_language = \"node\"",
            "[native]\nwarm_pool = 1\nwarm_language = \"cobol\"",
            "[native]\nwarm_idle = \"0s\"",
            "[native]\nwarm_idle = \"90000s\"",
            "[docker]\ndocker_socket = \"relative.sock\"",
            "[docker]\npodman_socket = \"\"",
            "[docker]\nruntime = \"\"",
            "[docker]\ngvisor_runtime = \"runsc --platform=kvm\"",
            "[docker]\npodman_runtime = \"../crun\"",
            "[docker]\nsocket = \"/x\"",
            "[kube]\nnamespace = \"Jobs\"",
            "[kube]\nnamespace = \"\"",
            "[kube]\nruntime_class = \"g visor\"",
            "[kube]\nimage = \"python:3.12\"",
            "[kube]\nimage = \"python@sha256:abc\"",
            "[kube]\nservice_account = \"\"",
            "[kube]\nnode_selector = { \"bad key!\" = \"x\" }",
            "[kube]\nnode_selector = { pool = \"-x\" }",
            "[kube]\ntolerations = [{ key = \"k\", operator = \"Maybe\" }]",
            "[kube]\ntolerations = [{ operator = \"Equal\", value = \"v\" }]",
            "[kube]\ntolerations = [{ key = \"k\", operator = \"Exists\", value = \"v\" }]",
            "[kube]\ntolerations = [{ key = \"k\", effect = \"Sometimes\" }]",
            "[kube]\nephemeral_storage = \"1KiB\"",
            "[kube]\nmax_pods = 0",
            "[kube]\nseccomp_profile = \"Unconfined\"",
            "[kube]\nseccomp_profile = \"Localhost:/abs.json\"",
            "[kube]\nseccomp_profile = \"Localhost:../x.json\"",
            "[kube]\nstart_timeout = \"0s\"",
            "[kube]\nallow_degraded = [\"everything\"]",
            "[kube]\nlog_streams = \"both\"",
            "[kube]\napi = \"x\"",
        ] {
            let text = format!("version = \"t\"\n{bad}\n");
            assert!(Policy::from_toml(&text, "t").is_err(), "accepted: {bad}");
        }
    }

    #[test]
    fn docker_section_takes_defaults_and_overrides() {
        let p = Policy::builtin();
        assert_eq!(
            p.docker.docker_socket,
            PathBuf::from("/var/run/docker.sock")
        );
        assert_eq!(
            p.docker.podman_socket,
            PathBuf::from("/run/podman/podman.sock")
        );
        assert_eq!(p.docker.runtime, "runc");
        assert_eq!(p.docker.gvisor_runtime, "runsc");
        assert_eq!(p.docker.podman_runtime, "");
        let p = Policy::from_toml(
            "version = \"t\"\n[docker]\ndocker_socket = \"/srv/d.sock\"\npodman_runtime = \"crun\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.docker.docker_socket, PathBuf::from("/srv/d.sock"));
        assert_eq!(p.docker.podman_runtime, "crun");
        assert_eq!(p.docker.gvisor_runtime, "runsc");
    }

    #[test]
    fn kube_section_takes_defaults_and_overrides() {
        let p = Policy::builtin();
        assert_eq!(p.kube.namespace, "airlock-jobs");
        assert_eq!(p.kube.service_account, "airlock-job");
        assert_eq!(p.kube.seccomp_profile, "RuntimeDefault");
        assert_eq!(p.kube.runtime_class, "");
        assert!(
            p.kube.allow_degraded.is_empty(),
            "nothing weaker by default"
        );
        let digest = format!("sha256:{}", "c".repeat(64));
        let text = format!(
            "version = \"t\"\n[kube]\nnamespace = \"sandbox\"\nruntime_class = \"gvisor\"\n\
             image = \"registry.example/py:3@{digest}\"\nnode_selector = {{ \"airlock.dev/pool\" = \"jobs\" }}\n\
             tolerations = [{{ key = \"airlock.dev/jobs\", value = \"true\", effect = \"NoSchedule\" }}, {{ operator = \"Exists\" }}]\n\
             seccomp_profile = \"Localhost:profiles/airlock.json\"\n\
             allow_degraded = [\"tmp_exec\", \"pids\", \"network_policy\"]\n"
        );
        let p = Policy::from_toml(&text, "t").unwrap();
        assert_eq!(p.kube.namespace, "sandbox");
        assert_eq!(p.kube.runtime_class, "gvisor");
        assert_eq!(p.kube.tolerations[0].operator, "Equal");
        assert_eq!(p.kube.tolerations[1].key, "");
        assert_eq!(
            p.kube.allow_degraded,
            vec![
                KubeDegraded::TmpExec,
                KubeDegraded::Pids,
                KubeDegraded::NetworkPolicy
            ]
        );
        assert_eq!(
            p.kube.image_ref(&RootfsSpec::Host),
            Some(("registry.example/py:3".to_owned(), digest.clone()))
        );
        let again = Policy::from_toml(&p.to_toml(), "t").unwrap();
        assert_eq!(again, p);
        // Without [kube] image, the rootfs image is the job's.
        let rootfs = RootfsSpec::Image {
            reference: "py".into(),
            digest: digest.clone(),
        };
        assert_eq!(
            Policy::builtin().kube.image_ref(&rootfs),
            Some(("py".to_owned(), digest))
        );
        assert_eq!(Policy::builtin().kube.image_ref(&RootfsSpec::Host), None);
    }

    #[test]
    fn kubernetes_names() {
        assert!(is_dns_label("airlock-jobs"));
        assert!(!is_dns_label("-x") && !is_dns_label("A") && !is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("node.k8s.io"));
        assert!(is_label_key("kubernetes.io/os") && is_label_key("pool"));
        assert!(!is_label_key("/x") && !is_label_key("a/b/c") && !is_label_key(""));
        assert!(is_label_value("") && is_label_value("v1.2_x"));
        assert!(!is_label_value("x-") && !is_label_value("a b"));
    }

    #[test]
    fn images_section_takes_defaults_and_is_checked() {
        let p = Policy::builtin();
        assert_eq!(p.images.store, PathBuf::new());
        assert_eq!(p.images.rebuild_age_days, 30);
        let p = Policy::from_toml(
            "version = \"t\"\n[images]\nstore = \"/srv/images\"\nrebuild_age_days = 7\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.images.store, PathBuf::from("/srv/images"));
        assert_eq!(p.images.rebuild_age_days, 7);
        for bad in [
            "[images]\nstore = \"relative\"",
            "[images]\nrebuild_age_days = 0",
            "[images]\nrebuild_age_days = 100000",
            "[images]\nmax_age = 3",
        ] {
            let text = format!("version = \"t\"\n{bad}\n");
            assert!(Policy::from_toml(&text, "t").is_err(), "accepted: {bad}");
        }
        let again = Policy::from_toml(&p.to_toml(), "t").unwrap();
        assert_eq!(again.images, p.images);
    }

    #[test]
    fn languages_table_replaces_the_built_in_set() {
        let p = Policy::from_toml(
            "version = \"t\"\n[languages.python]\ncommand = [\"python3\", \"{file}\"]\nfile = \"m.py\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.languages.keys().collect::<Vec<_>>(), vec!["python"]);
    }

    #[test]
    fn policy_round_trips_through_toml() {
        let p = Policy::builtin();
        let again = Policy::from_toml(&p.to_toml(), "t").unwrap();
        assert_eq!(again, p);
    }

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
    }

    #[test]
    fn host_patterns() {
        assert_eq!(
            "PyPI.org:443".parse::<HostPattern>().unwrap(),
            HostPattern {
                host: "pypi.org".into(),
                port: Some(443)
            }
        );
        assert!("*.pythonhosted.org:443".parse::<HostPattern>().is_ok());
        assert!("evil.com:0".parse::<HostPattern>().is_err());
        assert!("a b".parse::<HostPattern>().is_err());
    }
}
