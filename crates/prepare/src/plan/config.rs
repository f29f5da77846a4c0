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
//!
//! NVIDIA's configs (`resource.nvidia.com/v1beta1`, [`tessera_api::nvidia`]) are accepted under
//! our driver name, and under NVIDIA's (`gpu.nvidia.com`) when no device of the allocation is
//! NVIDIA's driver's (then the config can only have been meant for ours). They mean what they
//! mean in NVIDIA's driver; their per-device MPS limits, keyed by device UUID or by index among
//! the devices the config applies to, are resolved here once those devices are known.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;
use tessera_api::DRIVER_NAME;
use tessera_api::config::{GPU_CONFIG_KIND, MIG_DEVICE_CONFIG_KIND, OpaqueConfig};
use tessera_api::names::device_type;
use tessera_api::nvidia::{
    AcceptedConfig, ConfiguredDevice, NVIDIA_DRIVER_NAME, decode_accepting_nvidia,
    resolve_per_device_key,
};

use super::error::{ConfigSource, PlanError, device_type as type_of};
use crate::checkpoint::{DeviceRecord, DeviceTarget};

/// One of our configs, decoded.
#[derive(Debug, Clone)]
pub(super) struct DecodedConfig {
    /// Index among the allocation's configs of the same source: for a claim config, its index
    /// in the claim's `spec.devices.config`.
    pub index: usize,
    pub source: ConfigSource,
    pub requests: Vec<String>,
    pub config: OpaqueConfig,
    /// NVIDIA's per-device MPS limits (key: device UUID or index among the devices this config
    /// applies to), still to resolve.
    pub nvidia_per_device: BTreeMap<String, String>,
}

impl DecodedConfig {
    fn fits(&self) -> &'static str {
        match self.config {
            OpaqueConfig::Gpu(_) => device_type::GPU,
            OpaqueConfig::Mig(_) => device_type::MIG,
        }
    }
}

/// Whether an opaque config of `driver` is this plugin's to apply; `nvidia_devices` says
/// whether the allocation holds devices of NVIDIA's driver.
pub(super) fn is_ours(driver: &str, nvidia_devices: bool) -> bool {
    driver == DRIVER_NAME || (driver == NVIDIA_DRIVER_NAME && !nvidia_devices)
}

/// Decodes the configs of this driver, class configs first, then claim configs.
pub(super) fn decode_configs(
    configs: &[DeviceAllocationConfiguration],
    nvidia_devices: bool,
) -> Result<Vec<DecodedConfig>, PlanError> {
    let mut decoded = Vec::new();
    for (index, entry, position) in with_positions(configs) {
        let Some(opaque) = entry
            .opaque
            .as_ref()
            .filter(|o| is_ours(&o.driver, nvidia_devices))
        else {
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
        let accepted = decode_accepting_nvidia(&opaque.parameters.0).map_err(|error| {
            PlanError::InvalidConfig {
                index: position,
                source_kind: source,
                requests: requests.clone(),
                error,
            }
        })?;
        decoded.push(DecodedConfig {
            index: position,
            source,
            requests,
            config: accepted.config,
            nvidia_per_device: accepted
                .translation
                .map(|t| t.per_device_pinned_memory_limit)
                .unwrap_or_default(),
        });
    }
    // Stable: list order is kept within each source.
    decoded.sort_by_key(|c| c.source);
    Ok(decoded)
}

/// What the plugin reads differently from how it is written: one line per NVIDIA config of the
/// claim's allocation that this plugin applies (for the log and an Event on the claim). Configs
/// that do not decode are left out: planning reports them as errors.
pub fn translation_notes(claim: &k8s_openapi::api::resource::v1::ResourceClaim) -> Vec<String> {
    let Some(allocation) = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
    else {
        return Vec::new();
    };
    let nvidia_devices = allocation
        .results
        .iter()
        .flatten()
        .any(|r| r.driver == NVIDIA_DRIVER_NAME);
    let mut notes = Vec::new();
    let configs = allocation.config.as_deref().unwrap_or_default();
    for (_, entry, position) in with_positions(configs) {
        let Some(opaque) = entry
            .opaque
            .as_ref()
            .filter(|o| is_ours(&o.driver, nvidia_devices))
        else {
            continue;
        };
        let Ok(AcceptedConfig {
            translation: Some(translation),
            ..
        }) = decode_accepting_nvidia(&opaque.parameters.0)
        else {
            continue;
        };
        let mut parts = translation.notes;
        if opaque.driver == NVIDIA_DRIVER_NAME {
            parts.insert(
                0,
                format!(
                    "driver {NVIDIA_DRIVER_NAME} taken as {DRIVER_NAME} (no device of this claim is NVIDIA's driver's)"
                ),
            );
        }
        let requests = entry.requests.clone().unwrap_or_default();
        let source = if entry.source == "FromClass" {
            ConfigSource::FromClass
        } else {
            ConfigSource::FromClaim
        };
        notes.push(format!(
            "{}: {}",
            super::config_label(source, position, &requests),
            parts.join("; ")
        ));
    }
    notes
}

/// Each allocation config with its index in the allocation and its index among the entries of
/// the same source (`FromClaim` entries are the claim's `spec.devices.config`, copied in order).
fn with_positions(
    configs: &[DeviceAllocationConfiguration],
) -> impl Iterator<Item = (usize, &DeviceAllocationConfiguration, usize)> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    configs.iter().enumerate().map(move |(index, entry)| {
        let count = seen.entry(entry.source.as_str()).or_default();
        let position = *count;
        *count += 1;
        (index, entry, position)
    })
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
    // Which config each device got (position in `configs`).
    let mut winner: Vec<Option<usize>> = vec![None; devices.len()];
    for (position, config) in configs.iter().enumerate() {
        let fits = config.fits();
        let mut applied = false;
        for ((device, slot), won) in devices.iter().zip(effective.iter_mut()).zip(&mut winner) {
            let Some(reach) = reach(&config.requests, &device.request) else {
                continue;
            };
            let device_type = type_of(&device.target);
            if device_type == fits {
                *slot = Some(config.config.clone());
                *won = Some(position);
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
    for (position, config) in configs.iter().enumerate() {
        if !config.nvidia_per_device.is_empty() {
            resolve_nvidia_per_device(config, position, devices, &winner, &mut effective)?;
        }
    }
    Ok(effective)
}

/// Puts an NVIDIA config's per-device MPS limits on the devices it applies to.
fn resolve_nvidia_per_device(
    config: &DecodedConfig,
    position: usize,
    devices: &[DeviceRecord],
    winner: &[Option<usize>],
    effective: &mut [Option<OpaqueConfig>],
) -> Result<(), PlanError> {
    let group: Vec<usize> = (0..devices.len())
        .filter(|&i| winner[i] == Some(position))
        .collect();
    let configured: Vec<ConfiguredDevice<'_>> = group
        .iter()
        .map(|&i| ConfiguredDevice {
            name: &devices[i].device,
            uuid: devices[i].target.visible_uuid(),
        })
        .collect();
    let mut limits = BTreeMap::new();
    for (key, limit) in &config.nvidia_per_device {
        let name =
            resolve_per_device_key(key, &configured).map_err(|error| PlanError::InvalidConfig {
                index: config.index,
                source_kind: config.source,
                requests: config.requests.clone(),
                error,
            })?;
        limits.insert(name.to_owned(), limit.clone());
    }
    for &i in &group {
        let mps = match effective[i].as_mut() {
            Some(OpaqueConfig::Gpu(c)) => c.sharing.as_mut(),
            Some(OpaqueConfig::Mig(c)) => c.sharing.as_mut(),
            None => None,
        }
        .and_then(|s| s.mps.as_mut());
        if let Some(mps) = mps {
            mps.per_device_pinned_memory_limit = limits.clone();
        }
    }
    Ok(())
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
