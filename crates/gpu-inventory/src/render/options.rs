//! What rendering needs besides the inventory.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::resource::v1::DeviceTaint;
use tessera_api::DRIVER_NAME;
use tessera_api::shares::ConsumableShares;

/// The Kubernetes minor release the slices are written for. It decides the shape of dynamic MIG
/// (1.34: counter sets and the devices consuming them in one slice; 1.35+: counter sets in slices
/// of their own) and a few limits (taints per device: 4 in 1.34, 16 later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerVersion {
    pub major: u32,
    pub minor: u32,
}

impl ServerVersion {
    /// 1.34, the first release with `resource.k8s.io/v1`.
    pub const V1_34: ServerVersion = ServerVersion::new(1, 34);
    /// 1.35: a slice holds devices or shared counters, not both.
    pub const V1_35: ServerVersion = ServerVersion::new(1, 35);

    pub const fn new(major: u32, minor: u32) -> Self {
        ServerVersion { major, minor }
    }

    /// Whether shared counters must live in slices without devices (1.35+).
    pub fn splits_counters_from_devices(self) -> bool {
        self >= Self::V1_35
    }

    /// Most taints one device may carry.
    pub fn max_taints_per_device(self) -> usize {
        if self >= Self::V1_35 { 16 } else { 4 }
    }

    /// Taint effects the API server accepts (`None` exists from 1.35).
    pub fn taint_effects(self) -> &'static [&'static str] {
        if self >= Self::V1_35 {
            &["None", "NoSchedule", "NoExecute"]
        } else {
            &["NoSchedule", "NoExecute"]
        }
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A server version that could not be parsed or is older than 1.34.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "server version `{0}` is not usable: expected `<major>.<minor>` of 1.34 or later (e.g. `1.34`, `v1.35.2`), the releases serving resource.k8s.io/v1"
)]
pub struct ServerVersionError(pub String);

impl FromStr for ServerVersion {
    type Err = ServerVersionError;

    /// Accepts `1.34`, `1.35+`, `v1.35.2`, `v1.36.0-rc.1` (what `/version` reports as gitVersion,
    /// or its `major`/`minor` fields joined by a dot).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ServerVersionError(s.to_owned());
        let text = s.trim().trim_start_matches('v');
        let mut parts = text.splitn(3, '.');
        let major: u32 = parts.next().ok_or_else(err)?.parse().map_err(|_| err())?;
        let minor_text = parts.next().ok_or_else(err)?;
        let digits: String = minor_text
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let rest = &minor_text[digits.len()..];
        if digits.is_empty() || !(rest.is_empty() || rest == "+") {
            return Err(err());
        }
        let version = ServerVersion::new(major, digits.parse().map_err(|_| err())?);
        if version < ServerVersion::V1_34 {
            return Err(err());
        }
        Ok(version)
    }
}

/// Everything about the published pool that does not come from the hardware.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderOptions {
    /// The node's name: the pool name, `spec.nodeName`, and the prefix of slice names.
    pub node_name: String,
    /// The DRA driver name (`gpu.tessera.dev`).
    pub driver_name: String,
    /// The API server release the slices are written for.
    pub server_version: ServerVersion,
    /// Publish MIG-enabled GPUs as partitionable devices (every placement of every profile,
    /// consuming the GPU's counter set) instead of their existing MIG instances.
    pub dynamic_mig: bool,
    /// The node is topology-managed (docs/protocol.md): every device carries the taint
    /// `gpu.tessera.dev/topology-managed` with effect `NoSchedule`.
    pub topology_managed: bool,
    /// `spec.pool.generation` of every slice; the node plugin bumps it when the device set changes.
    pub pool_generation: i64,
    /// Further taints by device name (health monitoring), after the topology-managed taint.
    pub device_taints: BTreeMap<String, Vec<DeviceTaint>>,
    /// Consumable shares (`tessera_api::shares`): whole GPUs and static MIG devices are published
    /// with `allowMultipleAllocations: true` and the mode's request policies. Devices that consume
    /// counters (dynamic MIG) are never shared.
    pub consumable_shares: ConsumableShares,
}

impl RenderOptions {
    /// Options for `node_name` with Tessera's driver name, server 1.34, static MIG, not
    /// topology-managed, generation 0, no extra taints, no consumable shares.
    pub fn new(node_name: impl Into<String>) -> Self {
        RenderOptions {
            node_name: node_name.into(),
            driver_name: DRIVER_NAME.to_owned(),
            server_version: ServerVersion::V1_34,
            dynamic_mig: false,
            topology_managed: false,
            pool_generation: 0,
            device_taints: BTreeMap::new(),
            consumable_shares: ConsumableShares::Disabled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions_parse() {
        for (text, want) in [
            ("1.34", ServerVersion::V1_34),
            ("1.35+", ServerVersion::V1_35),
            ("v1.35.2", ServerVersion::V1_35),
            ("v1.37.0-rc.1", ServerVersion::new(1, 37)),
            ("2.0", ServerVersion::new(2, 0)),
        ] {
            assert_eq!(text.parse::<ServerVersion>(), Ok(want), "{text}");
        }
        for bad in ["1.33", "1", "", "1.x", "one.34", "1.34x", "v1.31.0"] {
            assert!(bad.parse::<ServerVersion>().is_err(), "{bad}");
        }
        assert!(ServerVersion::V1_35.splits_counters_from_devices());
        assert!(!ServerVersion::V1_34.splits_counters_from_devices());
    }
}
