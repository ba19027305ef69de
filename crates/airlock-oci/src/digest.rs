//! Content digests (`sha256:` only) and readers and writers that compute them while the
//! bytes stream through, with a bound on how many may pass.

use std::fmt;
use std::io::{self, Read, Write};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

use crate::error::OciError;

/// A `sha256:<64 lowercase hex>` digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 hex>`.
    pub fn parse(text: &str) -> Result<Self, OciError> {
        if airlock_core::policy::is_sha256_digest(text) {
            Ok(Self(text.to_owned()))
        } else {
            Err(OciError::ParseDigest {
                text: text.chars().take(100).collect(),
            })
        }
    }

    /// The digest of some bytes.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        self.0.strip_prefix("sha256:").unwrap_or(&self.0)
    }

    /// The full text, `sha256:…`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, for listings.
    pub fn short(&self) -> &str {
        &self.hex()[..12]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Digest {
    type Err = OciError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Digest::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// The error a bounded reader or writer returns past its bound (inside an `io::Error`).
#[derive(Debug, thiserror::Error)]
#[error("more than {limit_bytes} bytes")]
pub struct BoundExceeded {
    /// The bound.
    pub limit_bytes: u64,
}

/// Whether an I/O error is a [`BoundExceeded`].
pub fn is_bound_exceeded(err: &io::Error) -> bool {
    err.get_ref().is_some_and(|e| e.is::<BoundExceeded>())
}

/// Reads through, computing the sha256 of what passed and refusing more than a bound.
#[derive(Debug)]
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
    limit_bytes: u64,
}

impl<R: Read> HashingReader<R> {
    /// Wraps `inner`; reading more than `limit_bytes` is an error.
    pub fn new(inner: R, limit_bytes: u64) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
            limit_bytes,
        }
    }

    /// Bytes read so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Reads and hashes the rest, then returns the digest, the byte count and the
    /// wrapped reader.
    pub fn finish(mut self) -> io::Result<(Digest, u64, R)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((
            Digest(format!("sha256:{}", hex::encode(self.hasher.finalize()))),
            self.bytes,
            self.inner,
        ))
    }

    /// The wrapped reader.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        if self.bytes > self.limit_bytes {
            return Err(io::Error::other(BoundExceeded {
                limit_bytes: self.limit_bytes,
            }));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Writes through, computing the sha256 of what passed.
#[derive(Debug)]
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// The digest and byte count of what was written, and the wrapped writer.
    pub fn finish(self) -> (Digest, u64, W) {
        (
            Digest(format!("sha256:{}", hex::encode(self.hasher.finalize()))),
            self.bytes,
            self.inner,
        )
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_and_hash() {
        let d = Digest::of_bytes(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(d.as_str()).unwrap(), d);
        assert_eq!(d.short(), "e3b0c44298fc");
        for bad in [
            "",
            "sha256:abc",
            "sha512:00",
            &format!("sha256:{}", "A".repeat(64)),
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hashing_reader_refuses_past_its_bound() {
        let mut r = HashingReader::new(&b"0123456789"[..], 4);
        let err = io::copy(&mut r, &mut io::sink()).unwrap_err();
        assert!(is_bound_exceeded(&err), "{err}");
        let r = HashingReader::new(&b"abc"[..], 3);
        let (d, n, _) = r.finish().unwrap();
        assert_eq!((d, n), (Digest::of_bytes(b"abc"), 3));
    }
}
