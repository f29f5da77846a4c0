//! Device names in the published pool (docs/attributes.md) and their resolution back to hardware, which
//! the node plugin needs to prepare an allocated device.
//!
//! - whole GPU: `gpu-<minor>`
//! - MIG device: `gpu-<minor>-mig-<profile label>-<placement start>`, where the profile label is the
//!   profile name as a DNS label (`1g.10gb+me` is `1g-10gb-me`).

use std::fmt;

use crate::model::{Gpu, GpuInventory, MigInstance, MigProfile};

/// A device name, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceName {
    /// A whole GPU.
    Gpu { minor: u32 },
    /// A MIG device: an existing instance (static MIG) or a creatable placement (dynamic MIG).
    Mig {
        minor: u32,
        /// The profile label (DNS-label form of the profile name).
        profile_label: String,
        placement_start: u32,
    },
}

impl DeviceName {
    /// The name of the MIG device of `profile` at `placement_start` on GPU `minor`.
    pub fn mig(minor: u32, profile: &str, placement_start: u32) -> DeviceName {
        DeviceName::Mig {
            minor,
            profile_label: profile_label(profile),
            placement_start,
        }
    }

    /// Parses a device name Tessera published; `None` for anything else.
    pub fn parse(name: &str) -> Option<DeviceName> {
        let rest = name.strip_prefix("gpu-")?;
        let (minor, rest) = match rest.split_once('-') {
            Some((minor, rest)) => (minor, Some(rest)),
            None => (rest, None),
        };
        let minor = parse_decimal(minor)?;
        let Some(rest) = rest else {
            return Some(DeviceName::Gpu { minor });
        };
        let rest = rest.strip_prefix("mig-")?;
        let (label, start) = rest.rsplit_once('-')?;
        if label.is_empty() || label != profile_label(label) {
            return None;
        }
        Some(DeviceName::Mig {
            minor,
            profile_label: label.to_owned(),
            placement_start: parse_decimal(start)?,
        })
    }

    /// The minor number of the (parent) GPU.
    pub fn minor(&self) -> u32 {
        match self {
            DeviceName::Gpu { minor } | DeviceName::Mig { minor, .. } => *minor,
        }
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceName::Gpu { minor } => write!(f, "gpu-{minor}"),
            DeviceName::Mig {
                minor,
                profile_label,
                placement_start,
            } => write!(f, "gpu-{minor}-mig-{profile_label}-{placement_start}"),
        }
    }
}

fn parse_decimal(s: &str) -> Option<u32> {
    // Reject `+1`, `01` and other spellings that would not round-trip.
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

/// The DNS-label form of a MIG profile name: lower case, every run of characters other than
/// `a-z0-9` becomes one `-`, no leading or trailing `-` (`1g.10gb+me` is `1g-10gb-me`).
pub fn profile_label(profile: &str) -> String {
    let mut label = String::with_capacity(profile.len());
    for c in profile.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            label.push(c);
        } else if !label.is_empty() && !label.ends_with('-') {
            label.push('-');
        }
    }
    while label.ends_with('-') {
        label.pop();
    }
    label
}

/// What a published device name stands for on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolvedDevice<'a> {
    /// A whole GPU.
    Gpu(&'a Gpu),
    /// A MIG device of `profile` at `placement_start`; `instance` is the existing MIG instance
    /// there (static MIG, or a dynamic placement that has already been created), if any.
    Mig {
        gpu: &'a Gpu,
        profile: &'a MigProfile,
        placement_start: u32,
        instance: Option<&'a MigInstance>,
    },
}

impl GpuInventory {
    /// Resolves a published device name to the hardware it names. `None` when the name is not one
    /// of Tessera's or names a GPU, profile or placement this inventory does not have.
    pub fn resolve_device(&self, name: &str) -> Option<ResolvedDevice<'_>> {
        match DeviceName::parse(name)? {
            DeviceName::Gpu { minor } => self.gpu_by_minor(minor).map(ResolvedDevice::Gpu),
            DeviceName::Mig {
                minor,
                profile_label: label,
                placement_start,
            } => {
                let gpu = self.gpu_by_minor(minor)?;
                let mig = gpu.mig.as_ref()?;
                let profile = mig
                    .profiles
                    .iter()
                    .find(|p| profile_label(&p.name) == label)?;
                if !profile.placements.contains(&placement_start) {
                    return None;
                }
                let instance = mig
                    .instances
                    .iter()
                    .find(|i| i.profile == profile.name && i.placement_start == placement_start);
                Some(ResolvedDevice::Mig {
                    gpu,
                    profile,
                    placement_start,
                    instance,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_labels_are_dns_labels() {
        for (name, label) in [
            ("1g.10gb", "1g-10gb"),
            ("1g.10gb+me", "1g-10gb-me"),
            ("7g.80gb", "7g-80gb"),
            ("1c.3g.40gb", "1c-3g-40gb"),
            ("MIG 2g.20gb", "mig-2g-20gb"),
            ("+x+", "x"),
        ] {
            assert_eq!(profile_label(name), label, "{name}");
        }
    }

    #[test]
    fn names_round_trip() {
        for name in [
            DeviceName::Gpu { minor: 0 },
            DeviceName::Gpu { minor: 17 },
            DeviceName::mig(3, "1g.10gb+me", 6),
            DeviceName::mig(0, "7g.80gb", 0),
        ] {
            assert_eq!(DeviceName::parse(&name.to_string()), Some(name.clone()));
        }
        assert_eq!(
            DeviceName::mig(3, "1g.10gb+me", 6).to_string(),
            "gpu-3-mig-1g-10gb-me-6"
        );
        for bad in [
            "gpu-",
            "gpu-01",
            "gpu-x",
            "gpu-1-mig",
            "gpu-1-mig-1g-10gb",
            "gpu-1-mig--0",
            "gpu-1-foo-1g-0",
            "nic-0",
            "gpu-1-mig-1G-10gb-0",
        ] {
            assert_eq!(DeviceName::parse(bad), None, "{bad}");
        }
    }
}
