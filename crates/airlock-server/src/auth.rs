//! Bearer tokens: the tokens file (TOML), tokens stored as sha256 digests and compared in
//! constant time, each mapping to a tenant, its policy and its concurrency limit.
//!
//! ```toml
//! [tenants.alice]
//! tokens = ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
//! policy = "alice.toml"   # optional: relative to this file; default: the server's policy
//! max_in_flight = 2       # optional: jobs of this tenant running at once
//! ```
//!
//! A token is `alk_` and 43 characters of base64url (32 random bytes): high entropy, so a
//! plain sha256 is as good as a slow hash, and the file never holds a usable secret.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ServerError;

/// The prefix of airlock tokens (makes them recognisable to secret scanners).
pub const TOKEN_PREFIX: &str = "alk_";
/// Random bytes in a token.
pub const TOKEN_RANDOM_BYTES: usize = 32;
/// Longest bearer token accepted (longer ones are not ours and are not hashed).
pub const TOKEN_MAX_BYTES: usize = 256;
/// Longest tenant name.
pub const TENANT_NAME_MAX_BYTES: usize = 64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFileToml {
    #[serde(default)]
    tenants: BTreeMap<String, TenantToml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantToml {
    tokens: Vec<String>,
    #[serde(default)]
    policy: Option<PathBuf>,
    #[serde(default)]
    max_in_flight: Option<usize>,
}

/// A tenant as the tokens file defines it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantConfig {
    /// Its name (in audit lines and logs).
    pub name: String,
    /// Its policy file (absolute, or relative to the tokens file's directory resolved);
    /// `None` for the server's policy.
    pub policy: Option<PathBuf>,
    /// Its jobs running at once; `None` for no limit of its own.
    pub max_in_flight: Option<usize>,
}

/// The parsed tokens file.
#[derive(Debug, Clone)]
pub struct TokensFile {
    /// The tenants, by name.
    pub tenants: Vec<TenantConfig>,
    /// `(digest, index into tenants)`.
    digests: Vec<([u8; 32], usize)>,
}

fn valid_tenant_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= TENANT_NAME_MAX_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Parses `sha256:<64 hex>`.
fn parse_digest(text: &str) -> Option<[u8; 32]> {
    let hex_part = text.strip_prefix("sha256:")?;
    let bytes = hex::decode(hex_part).ok()?;
    bytes.try_into().ok()
}

impl TokensFile {
    /// Reads and validates a tokens file. Relative policy paths resolve against its
    /// directory.
    pub fn load(path: &Path) -> Result<Self, ServerError> {
        let text = std::fs::read_to_string(path).map_err(|source| ServerError::ReadTokens {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, base).map_err(|reason| ServerError::ParseTokens {
            path: path.to_owned(),
            reason,
        })
    }

    /// Parses a tokens file's text; relative policy paths resolve against `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Self, String> {
        let parsed: TokensFileToml = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut tenants = Vec::new();
        let mut digests: Vec<([u8; 32], usize)> = Vec::new();
        for (name, tenant) in parsed.tenants {
            if !valid_tenant_name(&name) {
                return Err(format!(
                    "tenants.{name}: a tenant name is 1-{TENANT_NAME_MAX_BYTES} characters of [A-Za-z0-9._-]"
                ));
            }
            if tenant.tokens.is_empty() {
                return Err(format!("tenants.{name}.tokens: no token"));
            }
            if tenant.max_in_flight == Some(0) {
                return Err(format!("tenants.{name}.max_in_flight: must be at least 1"));
            }
            let index = tenants.len();
            for (i, entry) in tenant.tokens.iter().enumerate() {
                let digest = parse_digest(entry).ok_or_else(|| {
                    format!(
                        "tenants.{name}.tokens[{i}]: expected \"sha256:<64 hex digits>\" (the hash \
                         `airlock token new` prints, never the token itself)"
                    )
                })?;
                if digests.iter().any(|(d, _)| *d == digest) {
                    return Err(format!(
                        "tenants.{name}.tokens[{i}]: this token is listed twice"
                    ));
                }
                digests.push((digest, index));
            }
            tenants.push(TenantConfig {
                name,
                policy: tenant
                    .policy
                    .map(|p| if p.is_absolute() { p } else { base.join(p) }),
                max_in_flight: tenant.max_in_flight,
            });
        }
        Ok(Self { tenants, digests })
    }

    /// The tenant a bearer token belongs to. Every stored digest is compared, in constant
    /// time, whatever matches.
    pub fn authenticate(&self, token: &str) -> Option<&TenantConfig> {
        if token.is_empty() || token.len() > TOKEN_MAX_BYTES {
            return None;
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found: Option<usize> = None;
        for (stored, index) in &self.digests {
            if bool::from(stored.ct_eq(&digest)) {
                found = Some(*index);
            }
        }
        found.and_then(|i| self.tenants.get(i))
    }
}

/// The bearer token of an `Authorization` header value, if it is one.
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The digest line of a token for the tokens file: `sha256:<hex>`.
pub fn token_digest(token: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(token.as_bytes())))
}

/// A new random token.
pub fn generate_token() -> Result<String, ServerError> {
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(ServerError::Random)?;
    Ok(format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// A new random token in E2B's API key shape (`e2b_` and 64 hex digits), which E2B's
/// SDKs check keys against; as high in entropy as [`generate_token`]'s.
pub fn generate_e2b_token() -> Result<String, ServerError> {
    airlock_e2b::generate_api_key().map_err(ServerError::Random)
}

/// The tokens-file entry of a new token: `[tenants.NAME]` with the token's digest (never
/// the token), and the tenant's policy and limit when given.
pub fn tokens_file_entry(
    tenant: &str,
    token: &str,
    policy: Option<&Path>,
    max_in_flight: Option<usize>,
) -> Result<String, String> {
    if !valid_tenant_name(tenant) {
        return Err(format!(
            "tenant {tenant:?}: a tenant name is 1-{TENANT_NAME_MAX_BYTES} characters of [A-Za-z0-9._-]"
        ));
    }
    if max_in_flight == Some(0) {
        return Err("max_in_flight: must be at least 1".to_owned());
    }
    let mut text = format!(
        "[tenants.{tenant}]\ntokens = [\"{}\"]\n",
        token_digest(token)
    );
    if let Some(policy) = policy {
        let quoted = toml::Value::String(policy.display().to_string()).to_string();
        text.push_str(&format!("policy = {quoted}\n"));
    }
    if let Some(n) = max_in_flight {
        text.push_str(&format!("max_in_flight = {n}\n"));
    }
    Ok(text)
}

/// Appends `entry` (from [`tokens_file_entry`]) to the tokens file at `path`, creating it
/// with mode 0600 when missing. Refused, with the file untouched: a path that is a
/// symlink or not a regular file, a file that group or others may write (whoever can
/// write it can add their own token), and a result that would not load (the tenant is
/// already there, or the file was invalid already).
pub fn append_to_tokens_file(path: &Path, entry: &str) -> Result<(), ServerError> {
    use std::io::Write as _;
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let unsafe_file = |reason: String| ServerError::UnsafeTokensFile {
        path: path.to_owned(),
        reason,
    };
    let write_error = |source| ServerError::WriteTokens {
        path: path.to_owned(),
        source,
    };
    let existing = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(unsafe_file(
                "is a symlink; give the file it points to".into(),
            ));
        }
        Ok(meta) if !meta.is_file() => return Err(unsafe_file("not a regular file".into())),
        Ok(meta) if meta.mode() & 0o022 != 0 => {
            return Err(unsafe_file(format!(
                "mode {:04o} lets group or others write it (and add their own token); \
                 chmod go-w it first",
                meta.mode() & 0o7777
            )));
        }
        Ok(_) => Some(
            std::fs::read_to_string(path).map_err(|source| ServerError::ReadTokens {
                path: path.to_owned(),
                source,
            })?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(ServerError::ReadTokens {
                path: path.to_owned(),
                source,
            });
        }
    };
    let mut addition = String::new();
    if let Some(text) = &existing {
        if !text.is_empty() && !text.ends_with('\n') {
            addition.push('\n');
        }
        if !text.trim().is_empty() {
            addition.push('\n');
        }
    }
    addition.push_str(entry);
    let combined = format!("{}{addition}", existing.as_deref().unwrap_or(""));
    let base = path.parent().unwrap_or(Path::new("."));
    TokensFile::parse(&combined, base).map_err(|reason| ServerError::ParseTokens {
        path: path.to_owned(),
        reason: format!("{reason} (nothing was written)"),
    })?;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create_new(existing.is_none())
        .mode(0o600)
        .open(path)
        .map_err(write_error)?;
    // The file may have been swapped between the check and the open.
    let meta = file.metadata().map_err(write_error)?;
    if meta.mode() & 0o022 != 0 || !meta.is_file() {
        return Err(unsafe_file("changed while it was being checked".into()));
    }
    file.write_all(addition.as_bytes()).map_err(write_error)?;
    file.sync_all().map_err(write_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn tokens_authenticate_their_tenant_only() {
        let a = generate_token().unwrap();
        let b = generate_token().unwrap();
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 43);
        assert_ne!(a, b);
        let text = format!(
            "[tenants.alice]\ntokens = [\"{}\"]\nmax_in_flight = 2\n\n[tenants.bob]\ntokens = [\"{}\"]\npolicy = \"bob.toml\"\n",
            token_digest(&a),
            token_digest(&b)
        );
        let file = TokensFile::parse(&text, Path::new("/etc/airlock")).unwrap();
        assert_eq!(file.authenticate(&a).unwrap().name, "alice");
        assert_eq!(file.authenticate(&a).unwrap().max_in_flight, Some(2));
        let bob = file.authenticate(&b).unwrap();
        assert_eq!(bob.name, "bob");
        assert_eq!(
            bob.policy.as_deref(),
            Some(Path::new("/etc/airlock/bob.toml"))
        );
        assert!(file.authenticate("alk_wrong").is_none());
        assert!(file.authenticate("").is_none());
        // The digest itself is not a token.
        assert!(file.authenticate(&token_digest(&a)).is_none());
    }

    #[test]
    fn bad_files_are_refused_with_the_key() {
        let base = Path::new("/");
        for (text, needle) in [
            (
                "[tenants.a]\ntokens = [\"alk_plain\"]\n",
                "tenants.a.tokens[0]",
            ),
            ("[tenants.a]\ntokens = []\n", "no token"),
            ("[tenants.\"a b\"]\ntokens = []\n", "tenant name"),
            ("[tenants.a]\ntokens = []\nbogus = 1\n", "unknown field"),
            (
                "[tenants.a]\ntokens = [\"sha256:00\"]\n",
                "expected \"sha256:<64 hex digits>\"",
            ),
        ] {
            let err = TokensFile::parse(text, base).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
        let d = token_digest("x");
        let twice = format!("[tenants.a]\ntokens = [\"{d}\"]\n[tenants.b]\ntokens = [\"{d}\"]\n");
        assert!(
            TokensFile::parse(&twice, base)
                .unwrap_err()
                .contains("twice")
        );
    }

    #[test]
    fn bearer_header_parsing() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
    }

    #[test]
    fn an_entry_has_the_digest_not_the_token() {
        let text =
            tokens_file_entry("alice", "alk_x", Some(Path::new("p \"q\".toml")), Some(3)).unwrap();
        assert!(text.contains(&token_digest("alk_x")));
        assert!(!text.contains("alk_x\""));
        assert!(text.contains("[tenants.alice]"));
        assert!(text.contains("max_in_flight = 3"));
        let file = TokensFile::parse(&text, Path::new("/")).unwrap();
        assert_eq!(file.authenticate("alk_x").unwrap().name, "alice");
        assert_eq!(
            file.tenants[0].policy.as_deref(),
            Some(Path::new("/p \"q\".toml"))
        );
        assert!(tokens_file_entry("a b", "t", None, None).is_err());
        assert!(tokens_file_entry("a", "t", None, Some(0)).is_err());
    }

    #[test]
    fn appending_creates_0600_adds_tenants_and_refuses_unsafe_files() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        append_to_tokens_file(&path, &tokens_file_entry("a", "alk_a", None, None).unwrap())
            .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        append_to_tokens_file(
            &path,
            &tokens_file_entry("b", "alk_b", None, Some(2)).unwrap(),
        )
        .unwrap();
        let file = TokensFile::load(&path).unwrap();
        assert_eq!(file.authenticate("alk_a").unwrap().name, "a");
        assert_eq!(file.authenticate("alk_b").unwrap().max_in_flight, Some(2));
        // The same tenant twice would not load: refused, file unchanged.
        let before = std::fs::read(&path).unwrap();
        let err =
            append_to_tokens_file(&path, &tokens_file_entry("a", "alk_c", None, None).unwrap())
                .unwrap_err();
        assert!(matches!(err, ServerError::ParseTokens { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // Writable by others: refused, untouched.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o622)).unwrap();
        let err =
            append_to_tokens_file(&path, &tokens_file_entry("c", "alk_c", None, None).unwrap())
                .unwrap_err();
        assert!(matches!(err, ServerError::UnsafeTokensFile { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // A symlink: refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let err =
            append_to_tokens_file(&link, &tokens_file_entry("c", "alk_c", None, None).unwrap())
                .unwrap_err();
        assert!(matches!(err, ServerError::UnsafeTokensFile { .. }), "{err}");
        // A file without a final newline still gets a valid entry.
        let bare = dir.path().join("bare.toml");
        std::fs::write(&bare, "# tokens").unwrap();
        std::fs::set_permissions(&bare, std::fs::Permissions::from_mode(0o600)).unwrap();
        append_to_tokens_file(&bare, &tokens_file_entry("d", "alk_d", None, None).unwrap())
            .unwrap();
        assert_eq!(
            TokensFile::load(&bare)
                .unwrap()
                .authenticate("alk_d")
                .unwrap()
                .name,
            "d"
        );
    }
}
