//! What the proxy's own TLS trusts, and what the job's does.
//!
//! Toward an upstream whose TLS it intercepts, the proxy verifies the certificate against
//! the host's trust roots (the system store, read once per process by
//! `rustls-native-certs`: `/etc/ssl/certs` on Debian, honouring `SSL_CERT_FILE` and
//! `SSL_CERT_DIR`) plus the policy's `extra_roots`. The job's CA bundle holds the same
//! roots and the job's CA: the job still verifies every host the proxy tunnels untouched
//! (against the real roots), and the proxy's leaves for the hosts it intercepts (against its
//! CA).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Most certificates read from one `extra_roots` file.
pub const EXTRA_ROOTS_MAX_PER_FILE: usize = 1024;

/// The host's trust roots, read once.
fn host_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let loaded = rustls_native_certs::load_native_certs();
        for error in &loaded.errors {
            tracing::warn!(%error, "a trust root of the host could not be read");
        }
        if loaded.certs.is_empty() {
            tracing::warn!(
                "the host has no trust roots: intercepted upstreams verify against the \
                 policy's extra_roots only"
            );
        }
        loaded.certs
    })
}

/// The roots of the proxy's upstream TLS and the PEM text of the job's bundle (without
/// the job's CA, which [`TrustRoots::bundle_with`] adds).
pub struct TrustRoots {
    store: Arc<RootCertStore>,
    pem: String,
}

impl std::fmt::Debug for TrustRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustRoots")
            .field("roots", &self.store.len())
            .finish()
    }
}

impl TrustRoots {
    /// The host's roots plus the certificates of each PEM file in `extra`. A file that
    /// cannot be read or holds no certificate is an error naming it.
    pub fn load(extra: &[impl AsRef<Path>]) -> Result<Self, (String, String)> {
        let mut certs: Vec<CertificateDer<'static>> = host_roots().to_vec();
        for path in extra {
            let path = path.as_ref();
            let bad = |reason: String| (path.display().to_string(), reason);
            let mut found = 0;
            for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))? {
                let cert = cert.map_err(|e| bad(e.to_string()))?;
                found += 1;
                if found > EXTRA_ROOTS_MAX_PER_FILE {
                    return Err(bad(format!(
                        "more than {EXTRA_ROOTS_MAX_PER_FILE} certificates"
                    )));
                }
                certs.push(cert);
            }
            if found == 0 {
                return Err(bad("holds no PEM certificate".to_owned()));
            }
        }
        let mut store = RootCertStore::empty();
        let (_, unusable) = store.add_parsable_certificates(certs.iter().cloned());
        if unusable > 0 {
            tracing::debug!(unusable, "trust roots rustls cannot use were left out");
        }
        let mut pem = String::new();
        for cert in &certs {
            pem.push_str(&to_pem(cert));
        }
        Ok(Self {
            store: Arc::new(store),
            pem,
        })
    }

    /// The roots, for the proxy's TLS toward upstreams.
    pub fn store(&self) -> Arc<RootCertStore> {
        self.store.clone()
    }

    /// The job's CA bundle: these roots and `ca_pem` last.
    pub fn bundle_with(&self, ca_pem: &str) -> String {
        let mut bundle = String::with_capacity(self.pem.len() + ca_pem.len() + 64);
        bundle.push_str(&self.pem);
        bundle.push_str("# airlock: this job's own CA, for the hosts its proxy intercepts\n");
        bundle.push_str(ca_pem);
        bundle
    }
}

/// A certificate as PEM text.
fn to_pem(cert: &CertificateDer<'_>) -> String {
    let encoded = STANDARD.encode(cert.as_ref());
    let mut pem = String::with_capacity(encoded.len() + encoded.len() / 64 + 64);
    pem.push_str("-----BEGIN CERTIFICATE-----\n");
    for line in encoded.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_round_trips() {
        let der = CertificateDer::from((0u8..=200).collect::<Vec<u8>>());
        let pem = to_pem(&der);
        assert!(pem.lines().all(|l| l.len() <= 64));
        let back: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back, vec![der]);
    }

    #[test]
    fn a_missing_or_empty_extra_roots_file_is_an_error() {
        let dir = std::env::temp_dir().join(format!("airlock-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let err = TrustRoots::load(&[&empty]).unwrap_err();
        assert!(err.1.contains("no PEM certificate"), "{err:?}");
        let missing = dir.join("missing.pem");
        assert!(TrustRoots::load(&[&missing]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
