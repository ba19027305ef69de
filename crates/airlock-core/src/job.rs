//! A job request (what a caller asks for) and a job spec (the request checked against a
//! policy, with every default filled in). Backends only ever see a [`JobSpec`].

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::policy::{
    self, FilesystemPolicy, HostPattern, Limits, NetworkMode, Policy, bounds, is_env_name,
};
use crate::units::{ByteSize, Cpus, duration_serde};

/// The directory the job's files live in, inside the sandbox.
pub const WORKDIR: &str = "/work";

/// The fixed base environment of every job (DESIGN S1). Nothing from the executor's own
/// environment is ever passed on.
pub const BASE_ENV: &[(&str, &str)] = &[
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", "/tmp"),
    ("LANG", "C.UTF-8"),
    ("PYTHONDONTWRITEBYTECODE", "1"),
];

/// The port of the egress proxy on the job's own `127.0.0.1`, on every backend.
pub const PROXY_PORT: u16 = 3128;

/// Where the job's CA bundle is, on every backend, when the proxy intercepts TLS: the
/// bundle file of Debian, Ubuntu and Alpine, replaced by (a bind of) the job's own, which
/// holds the host's trust roots, the policy's `extra_roots` and the job's CA.
pub const TRUST_BUNDLE_PATH: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The variables that point TLS clients at [`TRUST_BUNDLE_PATH`]: OpenSSL (Python's `ssl`
/// and `urllib`, Go), Python `requests`, pip, Node.js (added to its own roots) and curl.
pub const TRUST_BUNDLE_ENV: [&str; 5] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "CURL_CA_BUNDLE",
];

/// A proxy-mode job's environment: `env`, plus the variables that send HTTP(S) through
/// the egress proxy on the job's own `127.0.0.1:port` (and keep the job's own loopback
/// direct); when the proxy intercepts TLS ([`policy::NetworkPolicy::intercepts_tls`]),
/// the ones naming the job's CA bundle; and for `[network.packages]`, pip's and npm's
/// index and pip's hash checking. Sorted; a variable set here replaces the job's own.
pub fn proxy_env(
    env: &[(String, String)],
    port: u16,
    network: &policy::NetworkPolicy,
) -> Vec<(String, String)> {
    let proxy = format!("http://127.0.0.1:{port}");
    let mut set: Vec<(&str, &str)> = vec![
        ("HTTP_PROXY", &proxy),
        ("HTTPS_PROXY", &proxy),
        ("http_proxy", &proxy),
        ("https_proxy", &proxy),
        ("NO_PROXY", "localhost,127.0.0.1,::1"),
        ("no_proxy", "localhost,127.0.0.1,::1"),
        // Node.js 22.21+ and 24.5+ send fetch() and http(s) through HTTP(S)_PROXY only
        // when told to; older versions ignore it (docs/proxy.md).
        ("NODE_USE_ENV_PROXY", "1"),
    ];
    if network.intercepts_tls() {
        set.extend(
            TRUST_BUNDLE_ENV
                .iter()
                .map(|name| (*name, TRUST_BUNDLE_PATH)),
        );
    }
    let packages = &network.packages;
    if let Some(index) = &packages.index {
        set.push(("PIP_INDEX_URL", index));
        set.push(("PIP_DISABLE_PIP_VERSION_CHECK", "1"));
        if packages.require_hashes {
            set.push(("PIP_REQUIRE_HASHES", "1"));
        }
    }
    if let Some(registry) = &packages.npm_registry {
        set.push(("npm_config_registry", registry));
    }
    let mut out: Vec<(String, String)> = env
        .iter()
        .filter(|(name, _)| !set.iter().any(|(n, _)| n == name))
        .cloned()
        .collect();
    out.extend(set.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())));
    out.sort();
    out
}

/// A unique, time-ordered job identifier (UUID v7).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(transparent)]
pub struct JobId(String);

impl JobId {
    /// A fresh id.
    pub fn generate() -> Self {
        Self(uuid::Uuid::now_v7().to_string())
    }

    /// The id as text (also safe as a file or cgroup name: `[0-9a-f-]`).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Limits a request may ask for; each `None` takes the policy's value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsRequest {
    /// Wall time.
    #[serde(
        with = "duration_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// CPU share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Cpus>,
    /// Processes and threads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
}

/// The network a request asks for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkRequest {
    /// `none` or `proxy`.
    pub mode: NetworkMode,
    /// Hosts to reach through the proxy; each must be in the policy's allowlist.
    pub allow: Vec<String>,
}

/// An input file placed under `/work`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    /// Relative path under `/work`.
    pub path: String,
    /// The bytes.
    pub content: Vec<u8>,
    /// Whether the file is executable in the sandbox.
    pub executable: bool,
}

/// What a caller asks airlock to run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobRequest {
    /// A language the policy defines.
    pub language: String,
    /// The program, passed to the interpreter byte for byte.
    pub source: Vec<u8>,
    /// Input files.
    pub files: Vec<InputFile>,
    /// Bytes on the program's stdin (otherwise stdin is empty).
    pub stdin: Option<Vec<u8>>,
    /// Arguments after the source file.
    pub args: Vec<String>,
    /// Limits, each at most the policy's ceiling.
    pub limits: LimitsRequest,
    /// Network.
    pub network: NetworkRequest,
    /// Extra environment; names must be allowed by the policy.
    pub env: BTreeMap<String, String>,
    /// Asks for a writable, size-capped `/out` whose files are released after the job
    /// (also on when the policy enables it).
    pub out: bool,
    /// A session's host-side `/work`, set only by the session manager (never from a
    /// caller's request): the job's `/work` is this directory, writable, and what the job
    /// leaves there stays for the session's next call.
    pub workspace: Option<std::path::PathBuf>,
    /// A session's host-side `/tmp` (an E2B sandbox's: [`crate::policy::SessionsPolicy`]
    /// bounds it with the workspace), set only by the session manager and only with
    /// `workspace`: bound at `/tmp` instead of the job's fresh tmpfs, writable and
    /// executable as the session's `/work` is, and what the job leaves there stays for
    /// the session's next job.
    pub session_tmp: Option<std::path::PathBuf>,
    /// Set only by the session manager, with `workspace`, on a kernel session's one job
    /// (its driver): a sandbox forked for it from a zygote keeps the modules the driver
    /// imports, already imported ([`crate::warm::python::KERNEL_MODULES`]).
    pub session_kernel: bool,
}

/// A checked input file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFile {
    /// Relative path under `/work`, validated.
    pub path: String,
    /// The bytes.
    pub content: Vec<u8>,
    /// Whether it is executable.
    pub executable: bool,
}

/// A request checked against a policy, with every default filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The job's id.
    pub id: JobId,
    /// The language name.
    pub language: String,
    /// The full argv, `{file}` substituted, arguments appended.
    pub argv: Vec<String>,
    /// The source's file name under `/work`.
    pub source_file: String,
    /// The source.
    pub source: Vec<u8>,
    /// `sha256:` of the source, for the audit line.
    pub source_sha256: String,
    /// Input files.
    pub files: Vec<JobFile>,
    /// Stdin bytes.
    pub stdin: Option<Vec<u8>>,
    /// The complete environment of the program.
    pub env: Vec<(String, String)>,
    /// Effective limits.
    pub limits: Limits,
    /// Network mode.
    pub network: NetworkMode,
    /// Hosts reachable through the proxy.
    pub network_allow: Vec<String>,
    /// The policy's network section (ranges, secrets, limits) for the proxy.
    pub network_policy: crate::policy::NetworkPolicy,
    /// Root filesystem and directories.
    pub filesystem: FilesystemPolicy,
    /// The policy's version.
    pub policy_version: String,
    /// A session's host-side `/work` (see [`JobRequest::workspace`]); `None` for a job
    /// whose `/work` is its own, removed after it.
    #[serde(default)]
    pub workspace: Option<std::path::PathBuf>,
    /// A session's host-side `/tmp` (see [`JobRequest::session_tmp`]); `None`: a fresh
    /// tmpfs of `limits.tmp`, removed with the job.
    #[serde(default)]
    pub session_tmp: Option<std::path::PathBuf>,
    /// A kernel session's driver job (see [`JobRequest::session_kernel`]).
    #[serde(default)]
    pub session_kernel: bool,
}

/// `sha256:<hex>` of some bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Checks a single path segment used as a file name.
pub fn check_file_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty name".to_owned());
    }
    if name == "." || name == ".." {
        return Err(format!("{name:?} is not a file name"));
    }
    if name.len() > bounds::INPUT_NAME_MAX_BYTES {
        return Err(format!(
            "name is {} bytes, more than {}",
            name.len(),
            bounds::INPUT_NAME_MAX_BYTES
        ));
    }
    if let Some(c) = name.chars().find(|c| *c == '/' || c.is_control()) {
        return Err(format!("name contains {c:?}"));
    }
    Ok(())
}

/// The prefix of the names in `/work` that airlock keeps for itself: the source file of
/// the built-in languages (`.airlock-main.py`), a kernel session's driver and its control
/// directory (`.airlock/`). A caller's file never has such a name, so airlock never
/// overwrites one, and a session's listing shows only the caller's own.
pub const RESERVED_PREFIX: &str = ".airlock";

/// Why `path` (relative to `/work`) is not a caller's to write or read: its first segment
/// starts with [`RESERVED_PREFIX`], or is the source file of one of the policy's
/// languages. One rule for a job's input files and a session's uploads.
pub fn reserved_path_reason(path: &str, policy: &Policy) -> Option<String> {
    let first = path.split('/').next().unwrap_or(path);
    if first.starts_with(RESERVED_PREFIX) {
        return Some(format!(
            "{path:?}: names starting with {RESERVED_PREFIX:?} are airlock's own (the source file and the kernel's files)"
        ));
    }
    policy
        .languages
        .iter()
        .find(|(_, spec)| spec.file == first)
        .map(|(name, _)| format!("{path:?}: {first:?} is where the {name} source goes"))
}

/// Checks an input file's relative path: no `..`, no absolute path, no NUL or control
/// characters, no empty segments, each segment at most 255 bytes, depth at most 8.
pub fn check_relative_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty path".to_owned());
    }
    if path.contains('\0') {
        return Err("path contains a NUL byte".to_owned());
    }
    if path.starts_with('/') {
        return Err("path is absolute; give a path relative to /work".to_owned());
    }
    let segments: Vec<&str> = path.split('/').collect();
    if segments.len() > bounds::INPUT_PATH_MAX_DEPTH {
        return Err(format!(
            "path is {} levels deep, more than {}",
            segments.len(),
            bounds::INPUT_PATH_MAX_DEPTH
        ));
    }
    for segment in segments {
        check_file_name(segment).map_err(|r| format!("path {path:?}: {r}"))?;
    }
    Ok(())
}

impl JobRequest {
    /// Checks the request against `policy` and fills in every default.
    ///
    /// Malformed input is [`Error::InvalidInput`]; anything beyond the policy is
    /// [`Error::PolicyDenied`]. Nothing is clamped.
    pub fn resolve(self, policy: &Policy) -> Result<JobSpec, Error> {
        let language = policy.language(&self.language).ok_or_else(|| {
            let known: Vec<&str> = policy.languages.keys().map(String::as_str).collect();
            Error::invalid(
                "language",
                format!(
                    "unknown language {:?}; this policy has: {}",
                    self.language,
                    known.join(", ")
                ),
            )
        })?;

        if self.source.contains(&0) {
            return Err(Error::invalid(
                "source",
                "contains a NUL byte (interpreters would silently stop there)",
            ));
        }
        let source_len = self.source.len() as u64;
        if source_len > policy.limits.source.as_u64() {
            return Err(Error::invalid(
                "source",
                format!(
                    "{} is larger than the policy's limit of {}",
                    ByteSize::bytes(source_len),
                    policy.limits.source
                ),
            ));
        }

        let limits = resolve_limits(&self.limits, &policy.limits)?;
        let files = resolve_files(self.files, policy)?;
        let input_bytes: u64 = files.iter().map(|f| f.content.len() as u64).sum::<u64>()
            + self.stdin.as_ref().map_or(0, |s| s.len() as u64);
        if input_bytes > policy.limits.files.as_u64() {
            return Err(Error::invalid(
                "files",
                format!(
                    "input files and stdin total {}, more than the policy's limit of {}",
                    ByteSize::bytes(input_bytes),
                    policy.limits.files
                ),
            ));
        }

        if self.args.len() > bounds::ARGS_MAX_COUNT {
            return Err(Error::invalid(
                "args",
                format!("more than {} arguments", bounds::ARGS_MAX_COUNT),
            ));
        }
        for (i, arg) in self.args.iter().enumerate() {
            if arg.contains('\0') {
                return Err(Error::invalid(format!("args[{i}]"), "contains a NUL byte"));
            }
            if arg.len() > bounds::ARG_MAX_BYTES {
                return Err(Error::invalid(
                    format!("args[{i}]"),
                    format!("longer than {} bytes", bounds::ARG_MAX_BYTES),
                ));
            }
        }

        let mut env = resolve_env(&self.env, policy)?;
        let (network, network_allow) = resolve_network(&self.network, policy)?;
        if network == NetworkMode::Proxy {
            // The job sees each secret only as its placeholder.
            for secret in &policy.network.secrets {
                env.retain(|(name, _)| name != &secret.env);
                env.push((secret.env.clone(), secret.placeholder.clone()));
            }
            env.sort();
        }

        let source_path = format!("{WORKDIR}/{}", language.file);
        let mut argv: Vec<String> = language
            .command
            .iter()
            .map(|a| a.replace(policy::LanguageSpec::FILE_PLACEHOLDER, &source_path))
            .collect();
        argv.extend(self.args);

        Ok(JobSpec {
            id: JobId::generate(),
            language: self.language,
            argv,
            source_file: language.file.clone(),
            source_sha256: sha256_digest(&self.source),
            source: self.source,
            files,
            stdin: self.stdin,
            env,
            limits,
            network,
            network_allow,
            network_policy: policy.network.clone(),
            filesystem: {
                let mut fs = policy.filesystem.clone();
                fs.out.enabled |= self.out;
                // A session's /work carries its state: the job must be able to write it.
                if self.workspace.is_some() {
                    fs.workdir = policy::WorkdirMode::Rw;
                }
                fs
            },
            policy_version: policy.version.clone(),
            // Only beside a session's /work (the session manager sets both).
            session_tmp: self.session_tmp.filter(|_| self.workspace.is_some()),
            session_kernel: self.session_kernel && self.workspace.is_some(),
            workspace: self.workspace,
        })
    }
}

// The ceiling is checked before the value's own sanity bounds: a request for more than the
// policy allows is `policy_denied` however absurd the number (a model asking for 1e9 s).
fn resolve_limits(request: &LimitsRequest, ceiling: &Limits) -> Result<Limits, Error> {
    let mut limits = ceiling.clone();
    if let Some(timeout) = request.timeout {
        if timeout > ceiling.timeout {
            return Err(above(
                "limits.timeout",
                &crate::units::format_duration(timeout),
                &crate::units::format_duration(ceiling.timeout),
            ));
        }
        policy::check_timeout(timeout).map_err(|r| Error::invalid("limits.timeout", r))?;
        limits.timeout = timeout;
    }
    if let Some(memory) = request.memory {
        if memory > ceiling.memory {
            return Err(above(
                "limits.memory",
                &memory.to_string(),
                &ceiling.memory.to_string(),
            ));
        }
        policy::check_memory(memory).map_err(|r| Error::invalid("limits.memory", r))?;
        limits.memory = memory;
    }
    if let Some(cpus) = request.cpus {
        if cpus > ceiling.cpus {
            return Err(above(
                "limits.cpus",
                &cpus.to_string(),
                &ceiling.cpus.to_string(),
            ));
        }
        policy::check_cpus(cpus).map_err(|r| Error::invalid("limits.cpus", r))?;
        limits.cpus = cpus;
    }
    if let Some(pids) = request.pids {
        if pids > ceiling.pids {
            return Err(above(
                "limits.pids",
                &pids.to_string(),
                &ceiling.pids.to_string(),
            ));
        }
        policy::check_pids(pids).map_err(|r| Error::invalid("limits.pids", r))?;
        limits.pids = pids;
    }
    Ok(limits)
}

/// A request above a ceiling, naming the policy key that sets it (`limits.memory` is
/// `[limits] memory` in the policy file), so the reader knows what an operator would change.
fn above(field: &str, asked: &str, ceiling: &str) -> Error {
    let key = match field.split_once('.') {
        Some((section, key)) => format!("[{section}] {key}"),
        None => field.to_owned(),
    };
    Error::denied(
        field,
        format!("{asked} is above the policy's ceiling of {ceiling} ({key} in the policy)"),
    )
}

fn resolve_files(files: Vec<InputFile>, policy: &Policy) -> Result<Vec<JobFile>, Error> {
    let max_count = policy.limits.input_files;
    if files.len() > max_count as usize {
        return Err(Error::invalid(
            "files",
            format!(
                "{} files, more than the policy's limit of {max_count}",
                files.len()
            ),
        ));
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::with_capacity(files.len());
    for (i, file) in files.into_iter().enumerate() {
        let field = format!("files[{i}].path");
        check_relative_path(&file.path).map_err(|r| Error::invalid(&field, r))?;
        if let Some(reason) = reserved_path_reason(&file.path, policy) {
            return Err(Error::invalid(&field, reason));
        }
        if seen.insert(file.path.clone(), i).is_some() {
            return Err(Error::invalid(
                &field,
                format!("{:?} given twice", file.path),
            ));
        }
        out.push(JobFile {
            path: file.path,
            content: file.content,
            executable: file.executable,
        });
    }
    // A file may not also be a directory of another file ("a" and "a/b").
    for path in seen.keys() {
        let mut prefix = path.as_str();
        while let Some((parent, _)) = prefix.rsplit_once('/') {
            if let Some(i) = seen.get(parent) {
                return Err(Error::invalid(
                    format!("files[{i}].path"),
                    format!("{parent:?} is a file but {path:?} needs it to be a directory"),
                ));
            }
            prefix = parent;
        }
    }
    Ok(out)
}

/// The job's environment: the base variables, then the request's, each name allowed by
/// the policy's `[env] allow`, in all at most [`bounds::ENV_MAX_BYTES`]. A kernel
/// session's call checks its own environment with it too.
pub fn resolve_env(
    request: &BTreeMap<String, String>,
    policy: &Policy,
) -> Result<Vec<(String, String)>, Error> {
    let mut env: BTreeMap<String, String> = BASE_ENV
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let mut total = 0usize;
    for (name, value) in request {
        let field = format!("env.{name}");
        if !is_env_name(name) {
            return Err(Error::invalid(&field, "not a variable name"));
        }
        if value.contains('\0') {
            return Err(Error::invalid(&field, "value contains a NUL byte"));
        }
        if !policy.env.allow.iter().any(|allowed| allowed == name) {
            return Err(Error::denied(
                &field,
                "the policy does not allow setting this variable ([env] allow)",
            ));
        }
        total += name.len() + value.len();
        if total > bounds::ENV_MAX_BYTES {
            return Err(Error::invalid(
                "env",
                format!("more than {} bytes", bounds::ENV_MAX_BYTES),
            ));
        }
        env.insert(name.clone(), value.clone());
    }
    Ok(env.into_iter().collect())
}

fn resolve_network(
    request: &NetworkRequest,
    policy: &Policy,
) -> Result<(NetworkMode, Vec<String>), Error> {
    match request.mode {
        NetworkMode::None => {
            if !request.allow.is_empty() {
                return Err(Error::invalid(
                    "network.allow",
                    "hosts given but the network mode is none",
                ));
            }
            Ok((NetworkMode::None, Vec::new()))
        }
        NetworkMode::Proxy => {
            if policy.network.mode != NetworkMode::Proxy {
                return Err(Error::denied(
                    "network.mode",
                    "the policy's network mode is none ([network] mode = \"proxy\" in the policy allows the egress proxy)",
                ));
            }
            let allowed: Vec<HostPattern> = policy
                .network
                .allow
                .iter()
                .filter_map(|e| e.parse().ok())
                .collect();
            for host in &request.allow {
                let asked: HostPattern = host
                    .parse()
                    .map_err(|r: String| Error::invalid("network.allow", r))?;
                if !allowed.iter().any(|a| a == &asked) {
                    return Err(Error::denied(
                        "network.allow",
                        format!("{host:?} is not in the policy's allowlist ([network] allow)"),
                    ));
                }
            }
            let allow = if request.allow.is_empty() {
                policy.network.allow.clone()
            } else {
                request.allow.clone()
            };
            Ok((NetworkMode::Proxy, allow))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_env_names_the_ca_bundle_and_the_package_index_only_when_needed() {
        let env = vec![("SSL_CERT_FILE".to_owned(), "/mine.pem".to_owned())];
        let mut network = policy::NetworkPolicy {
            mode: NetworkMode::Proxy,
            ..policy::NetworkPolicy::default()
        };
        let plain = proxy_env(&env, 3128, &network);
        let get = |env: &[(String, String)], name: &str| {
            env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
        };
        assert_eq!(
            get(&plain, "HTTPS_PROXY").as_deref(),
            Some("http://127.0.0.1:3128")
        );
        assert_eq!(get(&plain, "NODE_USE_ENV_PROXY").as_deref(), Some("1"));
        // Nothing intercepted: the job's own choice stays.
        assert_eq!(get(&plain, "SSL_CERT_FILE").as_deref(), Some("/mine.pem"));
        assert_eq!(get(&plain, "PIP_INDEX_URL"), None);
        network.packages.index = Some("https://pypi.org/simple".to_owned());
        network.packages.npm_registry = Some("https://registry.npmjs.org".to_owned());
        let intercepting = proxy_env(&env, 3128, &network);
        for name in TRUST_BUNDLE_ENV {
            assert_eq!(
                get(&intercepting, name).as_deref(),
                Some(TRUST_BUNDLE_PATH),
                "{name}"
            );
        }
        assert_eq!(
            get(&intercepting, "PIP_INDEX_URL").as_deref(),
            Some("https://pypi.org/simple")
        );
        assert_eq!(
            get(&intercepting, "PIP_REQUIRE_HASHES").as_deref(),
            Some("1")
        );
        assert_eq!(
            get(&intercepting, "npm_config_registry").as_deref(),
            Some("https://registry.npmjs.org")
        );
        network.packages.require_hashes = false;
        assert_eq!(
            get(&proxy_env(&env, 3128, &network), "PIP_REQUIRE_HASHES"),
            None
        );
        let mut sorted = intercepting.clone();
        sorted.sort();
        assert_eq!(sorted, intercepting);
    }
    use crate::error::ErrorKind;
    use pretty_assertions::assert_eq;

    fn python(source: &str) -> JobRequest {
        JobRequest {
            language: "python".into(),
            source: source.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    fn file(path: &str) -> InputFile {
        InputFile {
            path: path.into(),
            content: b"x".to_vec(),
            executable: false,
        }
    }

    #[test]
    fn a_plain_request_takes_the_policy_defaults() {
        let spec = python("print(1)").resolve(&Policy::builtin()).unwrap();
        assert_eq!(
            spec.argv,
            vec!["python3", "-B", "-E", "-s", "-u", "/work/.airlock-main.py"]
        );
        assert_eq!(spec.limits, Policy::builtin().limits);
        assert_eq!(spec.policy_version, "default-1");
        assert_eq!(
            spec.env,
            vec![
                ("HOME".to_owned(), "/tmp".to_owned()),
                ("LANG".to_owned(), "C.UTF-8".to_owned()),
                ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
                ("PYTHONDONTWRITEBYTECODE".to_owned(), "1".to_owned()),
            ]
        );
        assert_eq!(
            sha256_digest(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(spec.source_sha256, sha256_digest(b"print(1)"));
    }

    #[test]
    fn unknown_language_is_invalid_input() {
        let mut req = python("1");
        req.language = "cobol".into();
        let err = req.resolve(&Policy::builtin()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("python"), "{err}");
    }

    #[test]
    fn nul_in_source_is_invalid_input() {
        let err = python("print(1)\0")
            .resolve(&Policy::builtin())
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn oversized_source_is_invalid_input() {
        let big = "#".repeat(50 * 1024 * 1024);
        let err = python(&big).resolve(&Policy::builtin()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn limits_above_the_ceiling_are_denied_not_clamped() {
        let mut req = python("1");
        req.limits.memory = Some(ByteSize::mib(512));
        let err = req.resolve(&Policy::builtin()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PolicyDenied);
        assert!(err.to_string().contains("512MiB"), "{err}");

        let mut req = python("1");
        req.limits.timeout = Some(Duration::from_secs(6));
        assert_eq!(
            req.resolve(&Policy::builtin()).unwrap_err().kind(),
            ErrorKind::PolicyDenied
        );
    }

    #[test]
    fn zero_limits_are_invalid_input_and_absurd_ones_policy_denied() {
        let zero = [
            LimitsRequest {
                timeout: Some(Duration::ZERO),
                ..Default::default()
            },
            LimitsRequest {
                memory: Some(ByteSize::bytes(0)),
                ..Default::default()
            },
            LimitsRequest {
                cpus: Some(Cpus::from_millis(0)),
                ..Default::default()
            },
            LimitsRequest {
                pids: Some(0),
                ..Default::default()
            },
        ];
        // Above every ceiling: denied like any other value above it, never a parse error.
        let absurd = [
            LimitsRequest {
                timeout: Some(Duration::from_secs(1_000_000_000)),
                ..Default::default()
            },
            LimitsRequest {
                memory: Some(ByteSize::bytes(u64::MAX)),
                ..Default::default()
            },
            LimitsRequest {
                pids: Some(u32::MAX),
                ..Default::default()
            },
        ];
        for (limits, kind) in zero
            .iter()
            .map(|l| (l, ErrorKind::InvalidInput))
            .chain(absurd.iter().map(|l| (l, ErrorKind::PolicyDenied)))
        {
            let mut req = python("1");
            req.limits = limits.clone();
            let err = req.resolve(&Policy::builtin()).unwrap_err();
            assert_eq!(err.kind(), kind, "{limits:?}: {err}");
        }
    }

    #[test]
    fn lower_limits_are_accepted() {
        let mut req = python("1");
        req.limits = LimitsRequest {
            timeout: Some(Duration::from_secs(1)),
            memory: Some(ByteSize::mib(64)),
            cpus: Some(Cpus::from_millis(250)),
            pids: Some(8),
        };
        let spec = req.resolve(&Policy::builtin()).unwrap();
        assert_eq!(spec.limits.timeout, Duration::from_secs(1));
        assert_eq!(spec.limits.memory, ByteSize::mib(64));
        assert_eq!(spec.limits.cpus.millis(), 250);
        assert_eq!(spec.limits.pids, 8);
    }

    #[test]
    fn bad_file_names_are_refused() {
        let long = "a".repeat(256);
        let deep = ["d"; 9].join("/");
        for bad in [
            "",
            "/etc/passwd",
            "../escape",
            "a/../../b",
            "a//b",
            "a/./b",
            "nul\0byte",
            "new\nline",
            long.as_str(),
            deep.as_str(),
            ".airlock-main.py",
            ".airlock-main.py/x",
            ".airlock/call-1.py",
            ".airlock-mine",
        ] {
            let mut req = python("1");
            req.files = vec![file(bad)];
            let err = req.resolve(&Policy::builtin()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}: {err}");
        }
    }

    #[test]
    fn file_and_directory_of_the_same_name_conflict() {
        let mut req = python("1");
        req.files = vec![file("data"), file("data/x.csv")];
        assert_eq!(
            req.resolve(&Policy::builtin()).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        let mut req = python("1");
        req.files = vec![file("a.csv"), file("a.csv")];
        assert_eq!(
            req.resolve(&Policy::builtin()).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn a_users_main_py_is_an_ordinary_input_file() {
        // The source is airlock's own name, so main.py (and util.py beside it) are the
        // caller's to pass.
        let mut req = python("import main");
        req.files = vec![file("main.py"), file("util.py")];
        let spec = req.resolve(&Policy::builtin()).unwrap();
        assert_eq!(spec.source_file, ".airlock-main.py");
        assert_eq!(spec.files.len(), 2);
    }

    #[test]
    fn a_custom_languages_source_name_is_refused_as_an_input_file() {
        let policy = Policy::from_toml(
            "version = \"v\"\n[languages.python]\ncommand = [\"python3\", \"{file}\"]\nfile = \"m.py\"\n[languages.sh]\ncommand = [\"sh\", \"{file}\"]\nfile = \"m.sh\"\n",
            "t",
        )
        .unwrap();
        for name in ["m.py", "m.sh", "m.sh/x"] {
            let mut req = python("1");
            req.files = vec![file(name)];
            let err = req.resolve(&policy).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{name:?}: {err}");
        }
    }

    #[test]
    fn good_file_names_are_kept() {
        let mut req = python("1");
        let name = "b".repeat(255);
        req.files = vec![file("data/in.csv"), file(&name), file("a/b/c/d/e/f/g/h")];
        let spec = req.resolve(&Policy::builtin()).unwrap();
        assert_eq!(spec.files.len(), 3);
    }

    #[test]
    fn too_many_input_files_or_bytes_are_invalid_input() {
        let mut req = python("1");
        req.files = (0..65).map(|i| file(&format!("f{i}"))).collect();
        assert_eq!(
            req.resolve(&Policy::builtin()).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        let mut req = python("1");
        req.files = vec![InputFile {
            path: "big".into(),
            content: vec![b'x'; 17 * 1024 * 1024],
            executable: false,
        }];
        assert_eq!(
            req.resolve(&Policy::builtin()).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn env_needs_the_policy() {
        let mut req = python("1");
        req.env.insert("OPENAI_API_KEY".into(), "sk-x".into());
        assert_eq!(
            req.resolve(&Policy::builtin()).unwrap_err().kind(),
            ErrorKind::PolicyDenied
        );
        let mut policy = Policy::builtin();
        policy.env.allow.push("MODE".into());
        let mut req = python("1");
        req.env.insert("MODE".into(), "fast".into());
        let spec = req.resolve(&policy).unwrap();
        assert!(spec.env.contains(&("MODE".to_owned(), "fast".to_owned())));
    }

    #[test]
    fn proxy_needs_a_proxy_policy() {
        let mut req = python("1");
        req.network.mode = NetworkMode::Proxy;
        assert_eq!(
            req.resolve(&Policy::builtin()).unwrap_err().kind(),
            ErrorKind::PolicyDenied
        );
        let mut policy = Policy::builtin();
        policy.network.mode = NetworkMode::Proxy;
        policy.network.allow = vec!["pypi.org:443".into()];
        let mut req = python("1");
        req.network.mode = NetworkMode::Proxy;
        req.network.allow = vec!["evil.com:443".into()];
        assert_eq!(
            req.resolve(&policy).unwrap_err().kind(),
            ErrorKind::PolicyDenied
        );
    }

    #[test]
    fn args_are_appended() {
        let mut req = python("1");
        req.args = vec!["--flag".into(), "x y".into()];
        let spec = req.resolve(&Policy::builtin()).unwrap();
        assert_eq!(
            spec.argv,
            vec![
                "python3",
                "-B",
                "-E",
                "-s",
                "-u",
                "/work/.airlock-main.py",
                "--flag",
                "x y"
            ]
        );
    }

    proptest::proptest! {
        #[test]
        fn accepted_paths_never_escape(path in "[a-z./]{1,30}") {
            if check_relative_path(&path).is_ok() {
                proptest::prop_assert!(!path.starts_with('/'));
                proptest::prop_assert!(path.split('/').all(|s| !s.is_empty() && s != ".." && s != "."));
            }
        }
    }
}
