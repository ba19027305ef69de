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

/// The text `airlock token new` prints: the token, and the lines for the tokens file.
pub fn new_token_text(
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
    let mut text = format!(
        "# The token (give it to the client as `Authorization: Bearer <token>`; it is shown once\n\
         # and stored nowhere):\n{token}\n\n# Add to the tokens file (--tokens FILE):\n\
         [tenants.{tenant}]\ntokens = [\"{}\"]\n",
        token_digest(token)
    );
    if let Some(policy) = policy {
        text.push_str(&format!("policy = {:?}\n", policy.display().to_string()));
    }
    if let Some(n) = max_in_flight {
        text.push_str(&format!("max_in_flight = {n}\n"));
    }
    Ok(text)
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
    fn new_token_text_has_the_digest_not_just_the_token() {
        let text = new_token_text("alice", "alk_x", Some(Path::new("p.toml")), Some(3)).unwrap();
        assert!(text.contains(&token_digest("alk_x")));
        assert!(text.contains("[tenants.alice]"));
        assert!(text.contains("max_in_flight = 3"));
        let toml_part = text.split("(--tokens FILE):\n").nth(1).unwrap();
        TokensFile::parse(toml_part, Path::new("/")).unwrap();
        assert!(new_token_text("a b", "t", None, None).is_err());
    }
}
