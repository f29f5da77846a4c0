//! The CDI spec model: plain serde types for the JSON a container runtime reads from its CDI
//! spec directories (`/etc/cdi`, `/var/run/cdi`).
//!
//! Field names and omission rules match the CDI reference library, which parses specs
//! strictly: an unknown field makes the runtime reject the whole file. Only the fields Tessera
//! writes are modelled; reading a spec with other fields fails here too, on purpose.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::names::{Kind, NameError, validate_device_name};

/// A CDI specification version this crate knows. Ordered oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CdiVersion {
    /// 0.3.0, the oldest version current runtimes accept.
    V0_3_0,
    /// 0.4.0: mount `type`.
    V0_4_0,
    /// 0.5.0: device node `hostPath`; device names starting with a digit.
    V0_5_0,
    /// 0.6.0: annotations; a `.` in the class.
    V0_6_0,
    /// 0.7.0: Intel RDT, additional GIDs.
    V0_7_0,
    /// 0.8.0: no spec changes.
    V0_8_0,
    /// 1.0.0: no spec changes.
    V1_0_0,
    /// 1.1.0: network devices, more Intel RDT fields.
    V1_1_0,
}

impl CdiVersion {
    /// Every known version, oldest first.
    pub const ALL: [Self; 8] = [
        Self::V0_3_0,
        Self::V0_4_0,
        Self::V0_5_0,
        Self::V0_6_0,
        Self::V0_7_0,
        Self::V0_8_0,
        Self::V1_0_0,
        Self::V1_1_0,
    ];

    /// The version as specs spell it, e.g. `0.5.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_3_0 => "0.3.0",
            Self::V0_4_0 => "0.4.0",
            Self::V0_5_0 => "0.5.0",
            Self::V0_6_0 => "0.6.0",
            Self::V0_7_0 => "0.7.0",
            Self::V0_8_0 => "0.8.0",
            Self::V1_0_0 => "1.0.0",
            Self::V1_1_0 => "1.1.0",
        }
    }
}

impl fmt::Display for CdiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `cdiVersion` this crate does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cdiVersion {0:?} is not a CDI version this driver knows (0.3.0 to 1.1.0)")]
pub struct UnknownVersion(String);

impl FromStr for CdiVersion {
    type Err = UnknownVersion;

    fn from_str(version: &str) -> Result<Self, UnknownVersion> {
        let bare = version.strip_prefix('v').unwrap_or(version);
        Self::ALL
            .into_iter()
            .find(|known| known.as_str() == bare)
            .ok_or_else(|| UnknownVersion(version.to_owned()))
    }
}

impl TryFrom<String> for CdiVersion {
    type Error = UnknownVersion;

    fn try_from(version: String) -> Result<Self, UnknownVersion> {
        version.parse()
    }
}

impl From<CdiVersion> for String {
    fn from(version: CdiVersion) -> Self {
        version.as_str().to_owned()
    }
}

/// A CDI spec: one file in a CDI spec directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// The CDI version the file claims; must be at least [`Spec::required_version`].
    pub cdi_version: CdiVersion,
    /// `vendor/class` of every device in the spec.
    pub kind: Kind,
    /// The devices; at least one, names unique.
    pub devices: Vec<Device>,
    /// Edits applied to a container that gets any device of this spec.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One device of a spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// The name after `=` in the device id.
    pub name: String,
    /// What injecting the device does to a container; must not be empty.
    pub container_edits: ContainerEdits,
}

/// Changes to a container's OCI spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// Environment variables, `NAME=value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create in the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// OCI hooks to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Mounts to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    /// True when the edits change nothing.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
    }
}

/// The type of a device node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeviceNodeType {
    /// `b`: block device.
    #[serde(rename = "b")]
    Block,
    /// `c`: character device (GPUs).
    #[serde(rename = "c")]
    Char,
    /// `u`: unbuffered character device.
    #[serde(rename = "u")]
    Unbuffered,
    /// `p`: FIFO.
    #[serde(rename = "p")]
    Fifo,
}

/// A device node to create in the container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path inside the container, e.g. `/dev/nvidia0`.
    pub path: String,
    /// Path on the host when it differs from `path` (needs cdiVersion 0.5.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// Node type; the runtime reads it from the host node when absent.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub node_type: Option<DeviceNodeType>,
    /// Major number; the runtime reads it from the host node when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number; the runtime reads it from the host node when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// File mode bits of the node in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Cgroup device permissions: a combination of `r`, `w` and `m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Owner uid in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Owner gid in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A mount to add to the container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Target in the container.
    pub container_path: String,
    /// Mount options, e.g. `ro`, `nosuid`, `bind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Mount type, e.g. `bind` (needs cdiVersion 0.4.0).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
}

/// The OCI lifecycle point at which a hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HookName {
    /// `prestart` (deprecated in OCI, still accepted).
    Prestart,
    /// `createRuntime`.
    CreateRuntime,
    /// `createContainer`.
    CreateContainer,
    /// `startContainer`.
    StartContainer,
    /// `poststart`.
    Poststart,
    /// `poststop`.
    Poststop,
}

/// An OCI hook to add to the container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// When the hook runs.
    pub hook_name: HookName,
    /// Absolute path of the hook binary on the host.
    pub path: String,
    /// Arguments, including argv\[0\].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment, `NAME=value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i32>,
}

/// A spec the container runtime would reject.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The declared version lacks a feature the spec uses.
    #[error(
        "cdiVersion {declared} is too old for this spec: {feature} needs {required}; use Spec::set_minimum_version"
    )]
    VersionTooOld {
        /// The version in the spec.
        declared: CdiVersion,
        /// The version its content needs.
        required: CdiVersion,
        /// The first feature that needs it.
        feature: &'static str,
    },
    /// The spec has no devices.
    #[error("the spec has no devices; the runtime rejects such specs")]
    NoDevices,
    /// Two devices share a name.
    #[error("device name {name:?} appears twice in the spec")]
    DuplicateDevice {
        /// The repeated name.
        name: String,
    },
    /// A device has an invalid name.
    #[error(transparent)]
    DeviceName(#[from] NameError),
    /// A device changes nothing.
    #[error("device {device:?} has no container edits; the runtime rejects such devices")]
    EmptyDevice {
        /// The device.
        device: String,
    },
    /// An environment entry is not `NAME=value`.
    #[error("{scope}: environment entry {entry:?} is not NAME=value")]
    Env {
        /// Where (`device "x"`, `spec-level edits`, `hook ...`).
        scope: String,
        /// The entry.
        entry: String,
    },
    /// A device node without a path.
    #[error("{scope}: a device node has an empty path")]
    DeviceNodePath {
        /// Where.
        scope: String,
    },
    /// Device node permissions other than `r`, `w`, `m`.
    #[error(
        "{scope}: device node {path:?} has permissions {permissions:?}; use a combination of r, w and m"
    )]
    Permissions {
        /// Where.
        scope: String,
        /// The node.
        path: String,
        /// The permissions.
        permissions: String,
    },
    /// A mount without a host or container path.
    #[error("{scope}: a mount has an empty {which}")]
    MountPath {
        /// Where.
        scope: String,
        /// `hostPath` or `containerPath`.
        which: &'static str,
    },
    /// A hook without a path.
    #[error("{scope}: hook {hook:?} has an empty path")]
    HookPath {
        /// Where.
        scope: String,
        /// The hook.
        hook: HookName,
    },
}

impl Spec {
    /// A spec of `kind` with `devices`, declaring the lowest CDI version that expresses it
    /// (the widest runtime compatibility).
    pub fn new(kind: Kind, devices: Vec<Device>) -> Self {
        let mut spec = Self {
            cdi_version: CdiVersion::V0_3_0,
            kind,
            devices,
            container_edits: ContainerEdits::default(),
        };
        spec.set_minimum_version();
        spec
    }

    /// Sets `cdi_version` to [`Spec::required_version`]; call after changing the content.
    pub fn set_minimum_version(&mut self) {
        self.cdi_version = self.required_version().0;
    }

    /// The lowest CDI version that has every feature this spec uses, and the feature that
    /// forces it (as the CDI reference library computes it for the fields modelled here).
    pub fn required_version(&self) -> (CdiVersion, &'static str) {
        if self.kind.class().contains('.') {
            return (CdiVersion::V0_6_0, "a '.' in the class");
        }
        let all_edits = || {
            std::iter::once(&self.container_edits)
                .chain(self.devices.iter().map(|device| &device.container_edits))
        };
        if self
            .devices
            .iter()
            .any(|device| device.name.starts_with(|c: char| c.is_ascii_digit()))
        {
            return (CdiVersion::V0_5_0, "a device name starting with a digit");
        }
        if all_edits().any(|edits| {
            edits
                .device_nodes
                .iter()
                .any(|node| node.host_path.is_some())
        }) {
            return (CdiVersion::V0_5_0, "a device node hostPath");
        }
        if all_edits().any(|edits| edits.mounts.iter().any(|mount| mount.mount_type.is_some())) {
            return (CdiVersion::V0_4_0, "a mount type");
        }
        (CdiVersion::V0_3_0, "the base format")
    }

    /// Checks everything the container runtime checks when it loads the spec.
    pub fn validate(&self) -> Result<(), SpecError> {
        let (required, feature) = self.required_version();
        if self.cdi_version < required {
            return Err(SpecError::VersionTooOld {
                declared: self.cdi_version,
                required,
                feature,
            });
        }
        if self.devices.is_empty() {
            return Err(SpecError::NoDevices);
        }
        validate_edits("spec-level edits", &self.container_edits)?;
        let mut names = BTreeSet::new();
        for device in &self.devices {
            validate_device_name(&device.name)?;
            if !names.insert(device.name.as_str()) {
                return Err(SpecError::DuplicateDevice {
                    name: device.name.clone(),
                });
            }
            if device.container_edits.is_empty() {
                return Err(SpecError::EmptyDevice {
                    device: device.name.clone(),
                });
            }
            validate_edits(
                &format!("device {:?}", device.name),
                &device.container_edits,
            )?;
        }
        Ok(())
    }
}

fn validate_env(scope: &str, env: &[String]) -> Result<(), SpecError> {
    match env
        .iter()
        .find(|entry| entry.find('=').is_none_or(|at| at == 0))
    {
        Some(entry) => Err(SpecError::Env {
            scope: scope.to_owned(),
            entry: entry.clone(),
        }),
        None => Ok(()),
    }
}

fn validate_edits(scope: &str, edits: &ContainerEdits) -> Result<(), SpecError> {
    validate_env(scope, &edits.env)?;
    for node in &edits.device_nodes {
        if node.path.is_empty() {
            return Err(SpecError::DeviceNodePath {
                scope: scope.to_owned(),
            });
        }
        if let Some(permissions) = &node.permissions
            && !permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
        {
            return Err(SpecError::Permissions {
                scope: scope.to_owned(),
                path: node.path.clone(),
                permissions: permissions.clone(),
            });
        }
    }
    for mount in &edits.mounts {
        let which = if mount.host_path.is_empty() {
            Some("hostPath")
        } else if mount.container_path.is_empty() {
            Some("containerPath")
        } else {
            None
        };
        if let Some(which) = which {
            return Err(SpecError::MountPath {
                scope: scope.to_owned(),
                which,
            });
        }
    }
    for hook in &edits.hooks {
        if hook.path.is_empty() {
            return Err(SpecError::HookPath {
                scope: scope.to_owned(),
                hook: hook.hook_name,
            });
        }
        validate_env(&format!("{scope}, hook {:?}", hook.hook_name), &hook.env)?;
    }
    Ok(())
}
