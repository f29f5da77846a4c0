//! CDI names: the spec kind (`vendor/class`), device names, fully qualified device ids
//! (`vendor/class=name`) and transient spec file names, with the CDI specification's rules.
//!
//! Rules (as the CDI reference library enforces them):
//! - vendor and class: start with a letter, end with a letter or digit, and contain only
//!   letters, digits, `_`, `-` and `.` (a class with `.` needs cdiVersion 0.6.0);
//! - device name: starts and ends with a letter or digit, and contains only letters,
//!   digits, `_`, `-`, `.` and `:` (a name starting with a digit needs cdiVersion 0.5.0).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A name that breaks the CDI naming rules.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// An invalid vendor.
    #[error(
        "CDI vendor {name:?} is invalid: {reason}; a vendor looks like a domain, e.g. gpu.tessera.dev"
    )]
    Vendor {
        /// The rejected vendor.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// An invalid class.
    #[error("CDI class {name:?} is invalid: {reason}; a class is a short word, e.g. claim")]
    Class {
        /// The rejected class.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A kind that is not `vendor/class`.
    #[error("CDI kind {kind:?} is not of the form vendor/class (e.g. gpu.tessera.dev/claim)")]
    Kind {
        /// The rejected kind.
        kind: String,
    },
    /// An invalid device name.
    #[error(
        "CDI device name {name:?} is invalid: {reason}; use letters, digits, '_', '-', '.' and ':', \
         starting and ending with a letter or digit"
    )]
    Device {
        /// The rejected name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A string that is not `vendor/class=name`.
    #[error(
        "CDI device id {id:?} is not of the form vendor/class=name (e.g. gpu.tessera.dev/claim=abc-gpu-0)"
    )]
    QualifiedDevice {
        /// The rejected id.
        id: String,
    },
    /// A transient id that cannot be part of a spec file name.
    #[error(
        "transient spec id {id:?} is invalid: {reason}; use letters, digits, '_', '-' and '.', such as a claim UID"
    )]
    TransientId {
        /// The rejected id.
        id: String,
        /// What is wrong.
        reason: &'static str,
    },
}

fn check_vendor_or_class(name: &str) -> Result<(), String> {
    let first = name.chars().next().ok_or("it is empty")?;
    if !first.is_ascii_alphabetic() {
        return Err(format!("it must start with a letter, not {first:?}"));
    }
    if let Some(bad) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!("it contains {bad:?}"));
    }
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("it must end with a letter or digit".to_owned());
    }
    Ok(())
}

/// Checks a device name (the part after `=` in a device id).
pub fn validate_device_name(name: &str) -> Result<(), NameError> {
    let error = |reason: String| NameError::Device {
        name: name.to_owned(),
        reason,
    };
    let first = name
        .chars()
        .next()
        .ok_or_else(|| error("it is empty".into()))?;
    if !first.is_ascii_alphanumeric() {
        return Err(error(format!(
            "it must start with a letter or digit, not {first:?}"
        )));
    }
    if let Some(bad) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(error(format!("it contains {bad:?}")));
    }
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(error("it must end with a letter or digit".into()));
    }
    Ok(())
}

/// A spec's kind: `vendor/class`, e.g. `gpu.tessera.dev/claim`. Serialized as that string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Kind {
    vendor: String,
    class: String,
}

impl Kind {
    /// A kind from a vendor (e.g. `gpu.tessera.dev`) and a class (e.g. `claim`).
    pub fn new(vendor: impl Into<String>, class: impl Into<String>) -> Result<Self, NameError> {
        let (vendor, class) = (vendor.into(), class.into());
        check_vendor_or_class(&vendor).map_err(|reason| NameError::Vendor {
            name: vendor.clone(),
            reason,
        })?;
        check_vendor_or_class(&class).map_err(|reason| NameError::Class {
            name: class.clone(),
            reason,
        })?;
        Ok(Self { vendor, class })
    }

    /// The vendor part.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The class part.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The fully qualified id of device `name` of this kind: `vendor/class=name`.
    pub fn device_id(&self, name: &str) -> Result<QualifiedDevice, NameError> {
        validate_device_name(name)?;
        Ok(QualifiedDevice {
            kind: self.clone(),
            name: name.to_owned(),
        })
    }

    /// The file name (without directory) of the transient spec `transient_id` of this kind:
    /// `<vendor>-<class>_<transient id>.json`, the CDI library's transient naming. A `/` in
    /// the id becomes `_`, as the CDI library does.
    pub fn transient_spec_file_name(&self, transient_id: &str) -> Result<String, NameError> {
        let id = transient_id.replace('/', "_");
        let error = |reason| NameError::TransientId {
            id: transient_id.to_owned(),
            reason,
        };
        if id.is_empty() {
            return Err(error("it is empty"));
        }
        if id.starts_with('.') {
            return Err(error("it starts with '.'"));
        }
        if !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(error(
                "it contains a character other than letters, digits, '_', '-' and '.'",
            ));
        }
        Ok(format!("{}{id}.json", self.transient_spec_prefix()))
    }

    /// `<vendor>-<class>_`: how every transient spec file name of this kind starts.
    pub(crate) fn transient_spec_prefix(&self) -> String {
        format!("{}-{}_", self.vendor, self.class)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vendor, self.class)
    }
}

impl FromStr for Kind {
    type Err = NameError;

    fn from_str(kind: &str) -> Result<Self, NameError> {
        let (vendor, class) = kind.split_once('/').ok_or_else(|| NameError::Kind {
            kind: kind.to_owned(),
        })?;
        Self::new(vendor, class)
    }
}

impl TryFrom<String> for Kind {
    type Error = NameError;

    fn try_from(kind: String) -> Result<Self, NameError> {
        kind.parse()
    }
}

impl From<Kind> for String {
    fn from(kind: Kind) -> Self {
        kind.to_string()
    }
}

/// A fully qualified CDI device id, `vendor/class=name`: what a DRA driver returns to the
/// kubelet and the container runtime looks up in the spec directories.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedDevice {
    kind: Kind,
    name: String,
}

impl QualifiedDevice {
    /// The kind part.
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The device name part.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for QualifiedDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.kind, self.name)
    }
}

impl FromStr for QualifiedDevice {
    type Err = NameError;

    fn from_str(id: &str) -> Result<Self, NameError> {
        let (kind, name) = id
            .split_once('=')
            .ok_or_else(|| NameError::QualifiedDevice { id: id.to_owned() })?;
        let kind: Kind = kind.parse().map_err(|error| match error {
            NameError::Kind { .. } => NameError::QualifiedDevice { id: id.to_owned() },
            other => other,
        })?;
        kind.device_id(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_cdi_vendor_and_class_rules() {
        let kind: Kind = "gpu.tessera.dev/claim".parse().unwrap();
        assert_eq!((kind.vendor(), kind.class()), ("gpu.tessera.dev", "claim"));
        assert_eq!(kind.to_string(), "gpu.tessera.dev/claim");
        for (bad, what) in [
            ("claim", "no slash"),
            ("/claim", "empty vendor"),
            ("1gpu.example/claim", "vendor starting with a digit"),
            ("gpu.example./claim", "vendor ending with a dot"),
            ("gpu.example/cla/im", "slash in class"),
            ("gpu.example/cl aim", "space in class"),
            ("gpu.example/", "empty class"),
        ] {
            assert!(bad.parse::<Kind>().is_err(), "{what}: {bad:?} was accepted");
        }
        let error = Kind::new("gpu.tessera.dev", "-claim").unwrap_err();
        assert_eq!(
            error.to_string(),
            "CDI class \"-claim\" is invalid: it must start with a letter, not '-'; a class is a short word, e.g. claim"
        );
    }

    #[test]
    fn device_names_follow_the_cdi_rules() {
        for good in ["gpu-0", "0b8e7c1a-3c5e-gpu-0", "a", "mig:1g.10gb_0"] {
            validate_device_name(good).unwrap();
        }
        for bad in ["", "-gpu", "gpu-", "gpu/0", "gpu 0", "gpu=0", "gpü"] {
            assert!(validate_device_name(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn qualified_ids_round_trip() {
        let kind = Kind::new("gpu.tessera.dev", "claim").unwrap();
        let id = kind.device_id("8d4f3c2e-gpu-0").unwrap();
        assert_eq!(id.to_string(), "gpu.tessera.dev/claim=8d4f3c2e-gpu-0");
        assert_eq!(id.to_string().parse::<QualifiedDevice>().unwrap(), id);
        assert!(matches!(
            "gpu.tessera.dev/claim".parse::<QualifiedDevice>(),
            Err(NameError::QualifiedDevice { .. })
        ));
        assert!(matches!(
            "claim=gpu-0".parse::<QualifiedDevice>(),
            Err(NameError::QualifiedDevice { .. })
        ));
        assert!(matches!(
            "gpu.tessera.dev/claim=-x".parse::<QualifiedDevice>(),
            Err(NameError::Device { .. })
        ));
    }

    #[test]
    fn transient_spec_file_names_follow_the_cdi_library() {
        let kind = Kind::new("gpu.tessera.dev", "claim").unwrap();
        assert_eq!(
            kind.transient_spec_file_name("0b8e7c1a-3c5e").unwrap(),
            "gpu.tessera.dev-claim_0b8e7c1a-3c5e.json"
        );
        assert_eq!(
            kind.transient_spec_file_name("ns/name").unwrap(),
            "gpu.tessera.dev-claim_ns_name.json"
        );
        for bad in ["", ".hidden", "a b", "a\0b", "x\\y"] {
            assert!(
                kind.transient_spec_file_name(bad).is_err(),
                "{bad:?} was accepted"
            );
        }
    }
}
