//! Units that appear in policies and requests: byte sizes, durations and CPU shares.
//!
//! Each is a newtype that is parsed once at the edge (`"256MiB"`, `"5s"`, `0.5`) and
//! printed back in the same notation, so a policy round-trips and error messages quote
//! values the way the user wrote them.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of bytes. Parsed from `"256MiB"`, `"16m"`, `"8000"` or a bare integer.
///
/// Binary units (`KiB`, `MiB`, `GiB`, `TiB`) and the one-letter forms `k`, `m`, `g`, `t`
/// (Docker's notation, also binary) are accepted, as are decimal units (`KB`, `MB`, `GB`, `TB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(u64);

impl ByteSize {
    /// One kibibyte.
    pub const KIB: u64 = 1024;
    /// One mebibyte.
    pub const MIB: u64 = 1024 * 1024;
    /// One gibibyte.
    pub const GIB: u64 = 1024 * 1024 * 1024;

    /// A size of `bytes` bytes.
    pub const fn bytes(bytes: u64) -> Self {
        Self(bytes)
    }

    /// A size of `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        Self(n * Self::MIB)
    }

    /// The size in bytes.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

/// Why a unit string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnitError(String);

impl FromStr for ByteSize {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let unit = unit.trim();
        let multiplier: u64 = match unit {
            "" | "B" | "b" => 1,
            "KiB" | "k" | "K" | "kib" => ByteSize::KIB,
            "MiB" | "m" | "M" | "mib" => ByteSize::MIB,
            "GiB" | "g" | "G" | "gib" => ByteSize::GIB,
            "TiB" | "t" | "T" | "tib" => ByteSize::GIB * 1024,
            "KB" | "kB" | "kb" => 1000,
            "MB" | "mb" => 1000 * 1000,
            "GB" | "gb" => 1000 * 1000 * 1000,
            "TB" | "tb" => 1000 * 1000 * 1000 * 1000,
            other => {
                return Err(UnitError(format!(
                    "unknown size unit {other:?} in {text:?} (use B, KiB, MiB, GiB, KB, MB, GB)"
                )));
            }
        };
        if number.is_empty() {
            return Err(UnitError(format!("no number in size {text:?}")));
        }
        if let Some((whole, frac)) = number.split_once('.') {
            let value: f64 = format!("{whole}.{frac}")
                .parse()
                .map_err(|_| UnitError(format!("bad number in size {text:?}")))?;
            let bytes = value * multiplier as f64;
            if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
                return Err(UnitError(format!("size {text:?} is out of range")));
            }
            return Ok(ByteSize(bytes.round() as u64));
        }
        let value: u64 = number
            .parse()
            .map_err(|_| UnitError(format!("bad number in size {text:?}")))?;
        value
            .checked_mul(multiplier)
            .map(ByteSize)
            .ok_or_else(|| UnitError(format!("size {text:?} is out of range")))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [
            (ByteSize::GIB * 1024, "TiB"),
            (ByteSize::GIB, "GiB"),
            (ByteSize::MIB, "MiB"),
            (ByteSize::KIB, "KiB"),
        ];
        for (size, name) in units {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{name}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte size such as \"256MiB\" or a number of bytes")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("size {v} is negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

/// Parses a duration such as `"5s"`, `"500ms"`, `"1.5s"`, `"2m"` or `"1h"`.
///
/// A bare number is refused: a timeout of `5` could mean seconds or milliseconds, and the
/// wrong guess is a thousandfold error.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let seconds_per_unit = match unit.trim() {
        "ms" => 0.001,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "" => {
            return Err(UnitError(format!(
                "duration {text:?} has no unit (write e.g. \"5s\" or \"500ms\")"
            )));
        }
        other => {
            return Err(UnitError(format!(
                "unknown duration unit {other:?} in {text:?} (use ms, s, m, h)"
            )));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| UnitError(format!("bad number in duration {text:?}")))?;
    let seconds = value * seconds_per_unit;
    if !seconds.is_finite() || !(0.0..=1.0e9).contains(&seconds) {
        return Err(UnitError(format!("duration {text:?} is out of range")));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Formats a duration the way [`parse_duration`] reads it (`"5s"`, `"1500ms"`).
pub fn format_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis.is_multiple_of(1000) {
        format!("{}s", millis / 1000)
    } else {
        format!("{millis}ms")
    }
}

/// Serde helpers for `Duration` fields written as `"5s"`.
pub mod duration_serde {
    use super::{format_duration, parse_duration};
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Writes a duration as `"5s"`.
    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_duration(*value))
    }

    /// Reads a duration from `"5s"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_duration(&text).map_err(serde::de::Error::custom)
    }

    /// The same for `Option<Duration>`.
    pub mod option {
        use super::{format_duration, parse_duration};
        use serde::{Deserialize, Deserializer, Serializer};
        use std::time::Duration;

        /// Writes `Some(d)` as `"5s"` and `None` as null.
        pub fn serialize<S: Serializer>(
            value: &Option<Duration>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match value {
                Some(d) => serializer.serialize_str(&format_duration(*d)),
                None => serializer.serialize_none(),
            }
        }

        /// Reads an optional `"5s"`.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<Duration>, D::Error> {
            let text = Option::<String>::deserialize(deserializer)?;
            text.map(|t| parse_duration(&t).map_err(serde::de::Error::custom))
                .transpose()
        }
    }
}

/// A CPU share in thousandths of a CPU: `0.5` is 500.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cpus(u32);

impl Cpus {
    /// The share in thousandths of one CPU.
    pub const fn millis(self) -> u32 {
        self.0
    }

    /// A share of `millis` thousandths of a CPU.
    pub const fn from_millis(millis: u32) -> Self {
        Self(millis)
    }

    fn from_f64(value: f64) -> Result<Self, UnitError> {
        if !value.is_finite() || !(0.0..=1_000_000.0).contains(&value) {
            return Err(UnitError(format!("cpus {value} is out of range")));
        }
        Ok(Self((value * 1000.0).round() as u32))
    }
}

impl FromStr for Cpus {
    type Err = UnitError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let value: f64 = text
            .trim()
            .parse()
            .map_err(|_| UnitError(format!("bad cpus value {text:?} (write e.g. 0.5)")))?;
        Self::from_f64(value)
    }
}

impl fmt::Display for Cpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / 1000;
        let frac = self.0 % 1000;
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let text = format!("{whole}.{frac:03}");
            f.write_str(text.trim_end_matches('0'))
        }
    }
}

impl Serialize for Cpus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(f64::from(self.0) / 1000.0)
    }
}

impl<'de> Deserialize<'de> for Cpus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CpusVisitor;
        impl Visitor<'_> for CpusVisitor {
            type Value = Cpus;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of CPUs such as 0.5")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Cpus, E> {
                Cpus::from_f64(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Cpus, E> {
                Cpus::from_f64(v as f64).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Cpus, E> {
                Cpus::from_f64(v as f64).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Cpus, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(CpusVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn byte_sizes_parse_in_every_notation() {
        assert_eq!("256MiB".parse::<ByteSize>().unwrap(), ByteSize::mib(256));
        assert_eq!("256m".parse::<ByteSize>().unwrap(), ByteSize::mib(256));
        assert_eq!("16 MiB".parse::<ByteSize>().unwrap(), ByteSize::mib(16));
        assert_eq!("8000".parse::<ByteSize>().unwrap(), ByteSize::bytes(8000));
        assert_eq!(
            "1GB".parse::<ByteSize>().unwrap(),
            ByteSize::bytes(1_000_000_000)
        );
        assert_eq!("1.5KiB".parse::<ByteSize>().unwrap(), ByteSize::bytes(1536));
        assert!("12 parsecs".parse::<ByteSize>().is_err());
        assert!("MiB".parse::<ByteSize>().is_err());
        assert!("-5MiB".parse::<ByteSize>().is_err());
        assert!("99999999999999999999TiB".parse::<ByteSize>().is_err());
    }

    #[test]
    fn byte_sizes_print_in_the_largest_exact_unit() {
        assert_eq!(ByteSize::mib(256).to_string(), "256MiB");
        assert_eq!(ByteSize::bytes(8000).to_string(), "8000B");
        assert_eq!(ByteSize::bytes(1536).to_string(), "1536B");
        assert_eq!(ByteSize::bytes(2048).to_string(), "2KiB");
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("5 fortnights").is_err());
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(5)), "5s");
    }

    #[test]
    fn cpus_are_thousandths() {
        assert_eq!("0.5".parse::<Cpus>().unwrap().millis(), 500);
        assert_eq!("2".parse::<Cpus>().unwrap().millis(), 2000);
        assert_eq!(Cpus::from_millis(500).to_string(), "0.5");
        assert_eq!(Cpus::from_millis(1250).to_string(), "1.25");
        assert!("-1".parse::<Cpus>().is_err());
        assert!("lots".parse::<Cpus>().is_err());
    }

    proptest::proptest! {
        #[test]
        fn byte_size_round_trips(bytes in 0u64..(1u64 << 50)) {
            let size = ByteSize::bytes(bytes);
            proptest::prop_assert_eq!(size.to_string().parse::<ByteSize>().unwrap(), size);
        }
    }
}
