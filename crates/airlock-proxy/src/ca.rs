//! The job's own certificate authority: made when the proxy is configured, its private key
//! kept in this process's memory only (never written anywhere, never sent), and dropped
//! with the proxy's configuration at the end of the job. The sandbox trusts its
//! certificate (the job's CA bundle, [`crate::trust`]); the proxy signs with it a leaf
//! certificate for each host whose TLS it terminates, and for no other name.
//!
//! Keys are ECDSA P-256 (fast to make; every TLS client of the last decade takes them).
//! Both the CA and the leaves are valid from the day before they are made to
//! [`VALIDITY_DAYS`] after: a job lasts minutes, and the day before covers a clock a little
//! behind. Each job has its own CA, so a CA (or a leaf) of one job means nothing to
//! another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

use crate::host::TargetHost;
use crate::state::lock;

/// How long the job's CA and its leaves are valid, in days from the day they are made.
pub const VALIDITY_DAYS: i64 = 30;

/// Most leaf certificates one job's CA signs (one per intercepted host); past it a host is
/// refused rather than the cache growing.
pub const LEAVES_MAX: usize = 256;

/// The common name of every job CA (the job id is not known here; each is its own key).
const CA_COMMON_NAME: &str = "airlock job CA (this job only)";

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// rcgen refused the parameters or the key.
    #[error("make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the key.
    #[error("load the key into rustls: {0}")]
    LoadKey(#[from] rustls::Error),
    /// The leaf cache is full.
    #[error("this job's CA has signed {LEAVES_MAX} certificates already")]
    TooManyLeaves,
}

/// One job's CA. No `Debug`: its key must never be printed.
pub struct JobCa {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    cert_pem: String,
    provider: Arc<CryptoProvider>,
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl JobCa {
    /// Makes a new CA with a fresh key.
    pub fn generate(provider: Arc<CryptoProvider>) -> Result<Self, CaError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, CA_COMMON_NAME);
        name.push(DnType::OrganizationName, "airlock");
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        set_validity(&mut params);
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        let cert = cert.der().clone();
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert,
            cert_pem,
            provider,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA's certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's certificate, DER.
    #[cfg(test)]
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// The leaf certificate (and its key, for rustls) for `host`: made on first use, then
    /// kept for the job.
    pub fn leaf_for(&self, host: &TargetHost) -> Result<Arc<CertifiedKey>, CaError> {
        let name = host.to_string();
        if let Some(leaf) = lock(&self.leaves).get(&name) {
            return Ok(leaf.clone());
        }
        let leaf = Arc::new(self.sign_leaf(host)?);
        let mut leaves = lock(&self.leaves);
        if leaves.len() >= LEAVES_MAX && !leaves.contains_key(&name) {
            return Err(CaError::TooManyLeaves);
        }
        Ok(leaves.entry(name).or_insert(leaf).clone())
    }

    fn sign_leaf(&self, host: &TargetHost) -> Result<CertifiedKey, CaError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = vec![match host {
            TargetHost::Name(name) => SanType::DnsName(name.clone().try_into()?),
            TargetHost::V4(v4) => SanType::IpAddress((*v4).into()),
            TargetHost::V6(v6) => SanType::IpAddress((*v6).into()),
        }];
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, host.to_string());
        params.distinguished_name = name;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params);
        let cert = params.signed_by(&key, &self.issuer)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing_key = self.provider.key_provider.load_private_key(key_der)?;
        Ok(CertifiedKey::new(
            vec![cert.der().clone(), self.cert.clone()],
            signing_key,
        ))
    }
}

/// Valid from the start of yesterday (UTC) to [`VALIDITY_DAYS`] after today.
fn set_validity(params: &mut CertificateParams) {
    let today = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs() / 86_400).unwrap_or(0));
    let date = |days: i64| {
        let (year, month, day) = airlock_core::audit::civil_from_days(days);
        rcgen::date_time_ymd(
            i32::try_from(year).unwrap_or(i32::MAX),
            u8::try_from(month).unwrap_or(1),
            u8::try_from(day).unwrap_or(1),
        )
    };
    params.not_before = date(today - 1);
    params.not_after = date(today + VALIDITY_DAYS);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_are_made_once_per_host_and_chain_to_the_ca() {
        let ca = JobCa::generate(Arc::new(rustls::crypto::ring::default_provider())).unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let host = TargetHost::parse("api.test").unwrap();
        let leaf = ca.leaf_for(&host).unwrap();
        assert!(Arc::ptr_eq(&leaf, &ca.leaf_for(&host).unwrap()));
        assert_eq!(leaf.cert.len(), 2);
        assert_eq!(&leaf.cert[1], ca.cert_der());
        let ip = TargetHost::parse("127.0.0.2").unwrap();
        assert!(!Arc::ptr_eq(&leaf, &ca.leaf_for(&ip).unwrap()));
    }
}
