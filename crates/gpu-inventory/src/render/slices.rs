//! Packing device groups into ResourceSlices within the API limits, and naming the slices.

use k8s_openapi::api::resource::v1::{CounterSet, Device};

use super::check::{
    MAX_CONSUMED_COUNTERS_PER_SLICE_1_34, MAX_COUNTER_SETS_PER_SLICE,
    MAX_SHARED_COUNTERS_PER_SLICE_1_34,
};
use super::devices::DeviceGroup;
use super::error::RenderError;
use super::options::ServerVersion;
use tessera_api::validation::{
    MAX_DEVICES_PER_SLICE, MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS, is_dns_subdomain,
};

/// What one slice will hold.
#[derive(Debug, Clone, Default)]
pub(crate) struct SliceContent {
    pub counter_sets: Vec<CounterSet>,
    pub devices: Vec<Device>,
}

impl SliceContent {
    fn is_empty(&self) -> bool {
        self.counter_sets.is_empty() && self.devices.is_empty()
    }
}

/// The budget of one slice: what it holds so far, measured the way the limits count.
#[derive(Debug, Clone, Copy, Default)]
struct Load {
    devices: usize,
    advanced: bool,
    shared_counters: usize,
    consumed_counters: usize,
}

impl Load {
    fn of(counter_set: Option<&CounterSet>, devices: &[Device]) -> Load {
        Load {
            devices: devices.len(),
            advanced: devices.iter().any(has_taints_or_counters),
            shared_counters: counter_set.map_or(0, |s| s.counters.len()),
            consumed_counters: devices.iter().map(consumed_counters).sum(),
        }
    }

    fn plus(self, other: Load) -> Load {
        Load {
            devices: self.devices + other.devices,
            advanced: self.advanced || other.advanced,
            shared_counters: self.shared_counters + other.shared_counters,
            consumed_counters: self.consumed_counters + other.consumed_counters,
        }
    }

    /// Why this load does not fit one slice, if it does not.
    fn excess(self, server: ServerVersion) -> Option<String> {
        let limit = if self.advanced {
            MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
        } else {
            MAX_DEVICES_PER_SLICE
        };
        if self.devices > limit {
            return Some(format!("{} devices, at most {limit}", self.devices));
        }
        if server.splits_counters_from_devices() {
            return None;
        }
        if self.shared_counters > MAX_SHARED_COUNTERS_PER_SLICE_1_34 {
            return Some(format!(
                "{} shared counters, at most {MAX_SHARED_COUNTERS_PER_SLICE_1_34} in 1.34",
                self.shared_counters
            ));
        }
        if self.consumed_counters > MAX_CONSUMED_COUNTERS_PER_SLICE_1_34 {
            return Some(format!(
                "{} consumed counters, at most {MAX_CONSUMED_COUNTERS_PER_SLICE_1_34} in 1.34",
                self.consumed_counters
            ));
        }
        None
    }
}

fn has_taints_or_counters(device: &Device) -> bool {
    device.taints.as_ref().is_some_and(|t| !t.is_empty())
        || device
            .consumes_counters
            .as_ref()
            .is_some_and(|c| !c.is_empty())
}

fn consumed_counters(device: &Device) -> usize {
    device
        .consumes_counters
        .iter()
        .flatten()
        .map(|c| c.counters.len())
        .sum()
}

/// Packs the groups, in order, into as few slices as the limits allow.
///
/// 1.34 (combined form): a GPU's counter set and the devices consuming it must share a slice, so
/// groups are never split; a group that does not fit an empty slice is an error.
/// 1.35+ (split form): counter sets go into slices of their own (at most 8 each), first; devices
/// follow, a GPU's devices kept together when they fit a slice and split otherwise.
pub(crate) fn pack(
    groups: Vec<DeviceGroup>,
    server: ServerVersion,
) -> Result<Vec<SliceContent>, RenderError> {
    let mut slices = Vec::new();
    if server.splits_counters_from_devices() {
        let sets: Vec<CounterSet> = groups
            .iter()
            .filter_map(|g| g.counter_set.clone())
            .collect();
        for chunk in sets.chunks(MAX_COUNTER_SETS_PER_SLICE) {
            slices.push(SliceContent {
                counter_sets: chunk.to_vec(),
                devices: Vec::new(),
            });
        }
    }
    let mut current = SliceContent::default();
    let mut load = Load::default();
    for group in groups.into_iter().filter(|g| !g.devices.is_empty()) {
        let set = if server.splits_counters_from_devices() {
            None
        } else {
            group.counter_set
        };
        let group_load = Load::of(set.as_ref(), &group.devices);
        if load.plus(group_load).excess(server).is_none() {
            current.counter_sets.extend(set);
            current.devices.extend(group.devices);
            load = load.plus(group_load);
            continue;
        }
        if !current.is_empty() {
            slices.push(std::mem::take(&mut current));
            load = Load::default();
        }
        match group_load.excess(server) {
            None => {
                current.counter_sets.extend(set);
                current.devices.extend(group.devices);
                load = group_load;
            }
            Some(reason) if !server.splits_counters_from_devices() => {
                return Err(RenderError::GpuDoesNotFitInSlice {
                    gpu: group.devices[0].name.clone(),
                    reason,
                });
            }
            Some(_) => {
                for device in group.devices {
                    let device_load = Load::of(None, std::slice::from_ref(&device));
                    if load.plus(device_load).excess(server).is_some() {
                        slices.push(std::mem::take(&mut current));
                        load = Load::default();
                    }
                    current.devices.push(device);
                    load = load.plus(device_load);
                }
            }
        }
    }
    if !current.is_empty() {
        slices.push(current);
    }
    Ok(slices)
}

/// Deterministic slice name: `<node>-<driver>-<n>` when that is a DNS subdomain. When it is not
/// (the node name is near 253 characters, or its last label near 63) the name is the node's first
/// label cut to 40 characters, a hash of the whole node name, then `-<driver>-<n>`.
pub(crate) fn slice_name(node: &str, driver: &str, index: usize) -> String {
    let suffix = format!("-{driver}-{index}");
    let name = format!("{node}{suffix}");
    if is_dns_subdomain(&name) {
        return name;
    }
    let hash = node.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let first_label = node.split('.').next().unwrap_or(node);
    let prefix = first_label[..first_label.len().min(40)].trim_end_matches('-');
    format!("{prefix}-{hash:08x}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_names_stay_dns_subdomains() {
        assert_eq!(
            slice_name("node-1", "gpu.tessera.dev", 0),
            "node-1-gpu.tessera.dev-0"
        );
        let long = format!("{}.{}.{}", "a".repeat(63), "b".repeat(63), "c".repeat(63));
        let long_last_label = format!("n.{}", "d".repeat(63));
        for node in [&long, &long_last_label] {
            assert!(is_dns_subdomain(node));
            let name = slice_name(node, "gpu.tessera.dev", 12);
            assert!(is_dns_subdomain(&name), "{name}");
            assert!(name.ends_with("-gpu.tessera.dev-12"), "{name}");
        }
        let other = format!("{}.{}.{}", "a".repeat(63), "b".repeat(63), "e".repeat(63));
        assert_ne!(
            slice_name(&long, "gpu.tessera.dev", 0),
            slice_name(&other, "gpu.tessera.dev", 0)
        );
    }
}
