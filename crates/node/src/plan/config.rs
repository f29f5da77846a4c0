//! The effective opaque configuration of each device of a claim.
//!
//! `status.allocation.devices.config` lists the configs the allocator copied from the
//! DeviceClasses (`FromClass`) and from the claim (`FromClaim`). Ours (driver
//! `gpu.tessera.dev`) are decoded strictly. They apply class configs first, then claim configs,
//! each in list order, the last applicable one winning. A config applies to a device when its
//! `requests` is empty or names the device's request (`req` also covers `req/<sub>`), and its
//! kind fits the device type (`GpuConfig` → `gpu`, `MigDeviceConfig` → `mig`). A config that
//! names a device's exact request with the wrong kind is an error, and so is a config that ends
//! up applying to no device at all: nothing is silently ignored.

use std::fmt;

use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;
use tessera_api::DRIVER_NAME;
use tessera_api::checkpoint::{DeviceRecord, DeviceTarget};
use tessera_api::config::{self, GPU_CONFIG_KIND, MIG_DEVICE_CONFIG_KIND, OpaqueConfig};
use tessera_api::names::device_type;

use super::{PlanError, device_type as type_of};

/// Where an allocation config came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConfigSource {
    /// A DeviceClass's `spec.config`.
    FromClass,
    /// The claim's `spec.devices.config`.
    FromClaim,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigSource::FromClass => "DeviceClass",
            ConfigSource::FromClaim => "claim",
        })
    }
}

/// One of our configs, decoded.
#[derive(Debug, Clone)]
pub(super) struct DecodedConfig {
    /// Index in `status.allocation.devices.config`.
    pub index: usize,
    pub source: ConfigSource,
    pub requests: Vec<String>,
    pub config: OpaqueConfig,
}

impl DecodedConfig {
    fn fits(&self) -> &'static str {
        match self.config {
            OpaqueConfig::Gpu(_) => device_type::GPU,
            OpaqueConfig::Mig(_) => device_type::MIG,
        }
    }
}

/// Decodes the configs of this driver, class configs first, then claim configs.
pub(super) fn decode_configs(
    configs: &[DeviceAllocationConfiguration],
) -> Result<Vec<DecodedConfig>, PlanError> {
    let mut decoded = Vec::new();
    for (index, entry) in configs.iter().enumerate() {
        let Some(opaque) = entry.opaque.as_ref().filter(|o| o.driver == DRIVER_NAME) else {
            continue;
        };
        let source = match entry.source.as_str() {
            "FromClass" => ConfigSource::FromClass,
            "FromClaim" => ConfigSource::FromClaim,
            other => {
                return Err(PlanError::UnknownConfigSource {
                    index,
                    source_name: other.to_owned(),
                });
            }
        };
        let requests = entry.requests.clone().unwrap_or_default();
        let config =
            config::decode(&opaque.parameters.0).map_err(|error| PlanError::InvalidConfig {
                index,
                source_kind: source,
                requests: requests.clone(),
                error,
            })?;
        decoded.push(DecodedConfig {
            index,
            source,
            requests,
            config,
        });
    }
    // Stable: list order is kept within each source.
    decoded.sort_by_key(|c| c.source);
    Ok(decoded)
}

/// How a config's `requests` reaches a device's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// `requests` is empty: every device.
    All,
    /// Names the parent `req` of a `req/sub` result.
    Parent,
    /// Names the result's request exactly.
    Exact,
}

fn reach(requests: &[String], device_request: &str) -> Option<Reach> {
    if requests.is_empty() {
        return Some(Reach::All);
    }
    let parent = device_request
        .split_once('/')
        .map(|(parent, _)| parent)
        .filter(|_| device_request.contains('/'));
    requests.iter().find_map(|r| {
        if r == device_request {
            Some(Reach::Exact)
        } else if Some(r.as_str()) == parent {
            Some(Reach::Parent)
        } else {
            None
        }
    })
}

/// The effective config of each device (in `devices` order).
pub(super) fn effective_configs(
    configs: &[DecodedConfig],
    devices: &[DeviceRecord],
) -> Result<Vec<Option<OpaqueConfig>>, PlanError> {
    let mut effective: Vec<Option<OpaqueConfig>> = vec![None; devices.len()];
    for config in configs {
        let fits = config.fits();
        let mut applied = false;
        for (device, slot) in devices.iter().zip(effective.iter_mut()) {
            let Some(reach) = reach(&config.requests, &device.request) else {
                continue;
            };
            let device_type = type_of(&device.target);
            if device_type == fits {
                *slot = Some(config.config.clone());
                applied = true;
            } else if reach == Reach::Exact {
                return Err(PlanError::WrongConfigKind {
                    index: config.index,
                    source_kind: config.source,
                    kind: config.config.kind(),
                    fits,
                    request: device.request.clone(),
                    device: device.device.clone(),
                    device_type,
                    wanted: kind_for(&device.target),
                });
            }
        }
        if !applied {
            return Err(PlanError::ConfigAppliesToNothing {
                index: config.index,
                source_kind: config.source,
                kind: config.config.kind(),
                fits,
                requests: config.requests.clone(),
            });
        }
    }
    Ok(effective)
}

fn kind_for(target: &DeviceTarget) -> &'static str {
    match target {
        DeviceTarget::Gpu { .. } => GPU_CONFIG_KIND,
        DeviceTarget::Mig { .. } => MIG_DEVICE_CONFIG_KIND,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reach_of_requests() {
        let r = |requests: &[&str], device: &str| {
            reach(
                &requests.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                device,
            )
        };
        assert_eq!(r(&[], "gpu"), Some(Reach::All));
        assert_eq!(r(&["gpu"], "gpu"), Some(Reach::Exact));
        assert_eq!(r(&["gpu"], "gpu/big"), Some(Reach::Parent));
        assert_eq!(r(&["gpu/big"], "gpu/big"), Some(Reach::Exact));
        assert_eq!(r(&["gpu/small"], "gpu/big"), None);
        assert_eq!(r(&["gpu/big"], "gpu"), None);
        assert_eq!(r(&["other"], "gpu"), None);
        assert_eq!(r(&["gp"], "gpu/x"), None);
    }
}
