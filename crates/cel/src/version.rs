//! Semantic versions as the Kubernetes semver CEL library sees them (`blang/semver` semantics):
//! strict semver 2.0.0 parsing, an optional normalization (`v` prefix, missing minor/patch,
//! leading zeros), and an order that ignores build metadata.

use std::cmp::Ordering;
use std::fmt;

/// A semantic version, compared as upstream compares them: build metadata neither orders nor
/// distinguishes versions.
#[derive(Debug, Clone)]
pub struct Version(semver::Version);

/// Why a string is not a semantic version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct VersionError(String);

impl Version {
    /// Parses a strict semver 2.0.0 version such as `1.2.3` or `1.0.0-rc.1+build.5`.
    pub fn parse(text: &str) -> Result<Version, VersionError> {
        semver::Version::parse(text)
            .map(Version)
            .map_err(|e| VersionError(format!("invalid semantic version {text:?}: {e}")))
    }

    /// Parses after normalizing like upstream's `semver(s, true)`: removes a leading `v`,
    /// removes leading zeros and fills in a missing minor and patch with `0`.
    pub fn parse_normalized(text: &str) -> Result<Version, VersionError> {
        let text = text.strip_prefix('v').unwrap_or(text);
        let mut parts: Vec<String> = text.splitn(3, '.').map(strip_leading_zeros).collect();
        if parts.len() < 3 {
            if parts.last().is_some_and(|last| last.contains(['+', '-'])) {
                return Err(VersionError(format!(
                    "invalid semantic version {text:?}: short version cannot contain PreRelease/Build meta data"
                )));
            }
            parts.resize(3, "0".to_owned());
        }
        Version::parse(&parts.join("."))
    }

    pub fn major(&self) -> u64 {
        self.0.major
    }

    pub fn minor(&self) -> u64 {
        self.0.minor
    }

    pub fn patch(&self) -> u64 {
        self.0.patch
    }
}

/// Upstream removes leading zeros from each part, keeping one digit in front of a non-digit.
fn strip_leading_zeros(part: &str) -> String {
    if part.len() <= 1 {
        return part.to_owned();
    }
    let stripped = part.trim_start_matches('0');
    if stripped.starts_with(|c: char| c.is_ascii_digit()) {
        stripped.to_owned()
    } else {
        format!("0{stripped}")
    }
}

impl Ord for Version {
    /// Precedence as semver 2.0.0 defines it: build metadata does not count.
    fn cmp(&self, other: &Self) -> Ordering {
        (self.0.major, self.0.minor, self.0.patch)
            .cmp(&(other.0.major, other.0.minor, other.0.patch))
            .then_with(|| self.0.pre.cmp(&other.0.pre))
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_parsing_matches_semver_2() {
        for good in ["1.0.0", "0.1.0-alpha.1", "1.2.3+build.7", "550.54.15"] {
            assert!(Version::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "v1.0.0", "1.0", "01.1.1", "200K", "Three", "Mi", "", "1.0.0-01",
        ] {
            assert!(Version::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn normalization_matches_the_library_docs() {
        let n = |t| Version::parse_normalized(t).map(|v| v.to_string());
        assert_eq!(n("v1.0.0").unwrap(), "1.0.0");
        assert_eq!(n("1.0").unwrap(), "1.0.0");
        assert_eq!(n("v1").unwrap(), "1.0.0");
        assert_eq!(n("01.01.01").unwrap(), "1.1.1");
        assert_eq!(n("1.0.0-rc.1").unwrap(), "1.0.0-rc.1");
        assert!(n("1.0-rc").is_err());
        assert!(n("hello").is_err());
    }

    #[test]
    fn build_metadata_does_not_order() {
        let v = |t| Version::parse(t).unwrap();
        assert_eq!(v("1.0.0+a").cmp(&v("1.0.0+b")), Ordering::Equal);
        assert!(v("1.0.0-rc.1") < v("1.0.0"));
        assert!(v("1.2.3") > v("0.1.2"));
        assert!(v("1.10.0") > v("1.9.0"));
    }
}
