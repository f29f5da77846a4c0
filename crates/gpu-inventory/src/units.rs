//! Small value types of the inventory and their text forms: `major.minor` versions, memory sizes,
//! and the conversion of NVML's version strings into the semver form published in attributes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A `major.minor` pair: CUDA compute capability (`9.0`) or CUDA driver version (`12.4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MajorMinor {
    pub major: u32,
    pub minor: u32,
}

impl MajorMinor {
    pub const fn new(major: u32, minor: u32) -> Self {
        MajorMinor { major, minor }
    }

    /// From NVML's CUDA driver version integer (`nvmlSystemGetCudaDriverVersion_v2`):
    /// `major * 1000 + minor * 10`, e.g. 12040 is 12.4.
    pub fn from_cuda_driver_version(value: u32) -> Self {
        MajorMinor::new(value / 1000, (value % 1000) / 10)
    }

    /// The inverse of [`MajorMinor::from_cuda_driver_version`].
    pub fn to_cuda_driver_version(self) -> u32 {
        self.major * 1000 + self.minor * 10
    }

    /// Semver form published in version attributes: `9.0` is `9.0.0`.
    pub fn to_semver(self) -> String {
        format!("{}.{}.0", self.major, self.minor)
    }
}

impl fmt::Display for MajorMinor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for MajorMinor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parsed = s
            .split_once('.')
            .and_then(|(ma, mi)| Some(MajorMinor::new(ma.parse().ok()?, mi.parse().ok()?)));
        parsed.ok_or_else(|| format!("`{s}` is not a `<major>.<minor>` version such as `9.0`"))
    }
}

impl TryFrom<String> for MajorMinor {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<MajorMinor> for String {
    fn from(v: MajorMinor) -> String {
        v.to_string()
    }
}

/// Turns a dotted numeric version as NVML reports it (`550.54.15`, `535.129.03`, `12.4`) into
/// semver 2.0.0: leading zeros are dropped from every component and missing minor/patch
/// components are zero (`535.129.03` is `535.129.3`, `560.28` is `560.28.0`). `None` when the
/// text is not one to three dot-separated decimal numbers.
pub fn dotted_to_semver(version: &str) -> Option<String> {
    let parts: Vec<&str> = version.trim().split('.').collect();
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let mut numbers = [0u64; 3];
    for (slot, part) in numbers.iter_mut().zip(&parts) {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *slot = part.parse().ok()?;
    }
    Some(format!("{}.{}.{}", numbers[0], numbers[1], numbers[2]))
}

/// Memory sizes: integer byte counts, or quantities with a binary suffix (`Ki`, `Mi`, `Gi`, `Ti`).
/// Serialized as `<n>Mi` when the size is a whole number of MiB, otherwise as bytes.
pub mod bytes_quantity {
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};
    use std::fmt;

    const MIB: u64 = 1 << 20;

    pub fn serialize<S: Serializer>(bytes: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        if *bytes != 0 && bytes.is_multiple_of(MIB) {
            serializer.serialize_str(&format!("{}Mi", bytes / MIB))
        } else {
            serializer.serialize_u64(*bytes)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        deserializer.deserialize_any(BytesVisitor)
    }

    /// Parses `81559Mi`, `80Gi`, `1024Ki`, `2Ti` or a plain byte count.
    pub fn parse(text: &str) -> Option<u64> {
        let text = text.trim();
        let (digits, factor) = [
            ("Ki", 1u64 << 10),
            ("Mi", MIB),
            ("Gi", 1 << 30),
            ("Ti", 1 << 40),
        ]
        .iter()
        .find_map(|(suffix, factor)| text.strip_suffix(suffix).map(|d| (d, *factor)))
        .unwrap_or((text, 1));
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse::<u64>().ok()?.checked_mul(factor)
    }

    struct BytesVisitor;

    impl Visitor<'_> for BytesVisitor {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a byte count or a binary quantity such as `81559Mi` or `80Gi`")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            parse(v).ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_versions_become_semver() {
        for (nvml, semver) in [
            ("550.54.15", "550.54.15"),
            ("535.129.03", "535.129.3"),
            ("560.28", "560.28.0"),
            ("12", "12.0.0"),
            ("570.00.007", "570.0.7"),
        ] {
            assert_eq!(dotted_to_semver(nvml).as_deref(), Some(semver), "{nvml}");
        }
        for bad in ["", "1.2.3.4", "550.x.1", "v550.1", "1..2", "-1.0"] {
            assert_eq!(dotted_to_semver(bad), None, "{bad}");
        }
    }

    #[test]
    fn major_minor_round_trips() {
        let v: MajorMinor = "12.4".parse().unwrap();
        assert_eq!(v, MajorMinor::new(12, 4));
        assert_eq!(v.to_semver(), "12.4.0");
        assert_eq!(v.to_cuda_driver_version(), 12040);
        assert_eq!(MajorMinor::from_cuda_driver_version(12040), v);
        assert!("12".parse::<MajorMinor>().is_err());
        assert!("a.b".parse::<MajorMinor>().is_err());
    }

    #[test]
    fn memory_quantities() {
        assert_eq!(bytes_quantity::parse("81559Mi"), Some(81559 << 20));
        assert_eq!(bytes_quantity::parse("80Gi"), Some(80 << 30));
        assert_eq!(bytes_quantity::parse("4096"), Some(4096));
        assert_eq!(bytes_quantity::parse("80GB"), None);
        assert_eq!(bytes_quantity::parse("Mi"), None);
        assert_eq!(bytes_quantity::parse("99999999999999Ti"), None);
    }
}
