//! GpuInventory → `resource.k8s.io/v1` devices (docs/attributes.md), grouped per GPU with the GPU's
//! counter set when it is published as partitionable (dynamic MIG).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, DeviceTaint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_api::names::{TOPOLOGY_MANAGED_TAINT, attr, capacity, counter, device_type};
use tessera_api::shares::{ConsumableShares, MEMORY_STEP_BYTES, memory_rounded};

use crate::device_name::DeviceName;
use crate::islands::{NvlinkIsland, island_of};
use crate::model::{Gpu, GpuInventory, MigEngines, MigInstance, MigProfile, MigState};
use crate::units::dotted_to_semver;

use super::RenderOptions;

/// The devices of one GPU, with the counter set they consume (dynamic MIG) if any. A group is the
/// unit slices are packed in: in the 1.34 combined form a counter set and its consumers must share
/// a slice.
#[derive(Debug, Clone)]
pub(crate) struct DeviceGroup {
    pub counter_set: Option<CounterSet>,
    pub devices: Vec<Device>,
}

type Attributes = BTreeMap<String, DeviceAttribute>;
type Capacities = BTreeMap<String, DeviceCapacity>;

/// Every device of the node, GPU by GPU in inventory order.
pub(crate) fn device_groups(inventory: &GpuInventory, options: &RenderOptions) -> Vec<DeviceGroup> {
    let islands = inventory.nvlink_islands();
    let driver_version = dotted_to_semver(&inventory.driver_version)
        .unwrap_or_else(|| inventory.driver_version.clone());
    let node = NodeFacts {
        inventory,
        islands: &islands,
        driver_version,
        options,
    };
    inventory.gpus.iter().map(|gpu| node.group(gpu)).collect()
}

/// Node-wide facts every device shares.
struct NodeFacts<'a> {
    inventory: &'a GpuInventory,
    islands: &'a [NvlinkIsland],
    driver_version: String,
    options: &'a RenderOptions,
}

impl NodeFacts<'_> {
    fn group(&self, gpu: &Gpu) -> DeviceGroup {
        match &gpu.mig {
            Some(mig) if mig.enabled && self.options.dynamic_mig => self.partitionable(gpu, mig),
            Some(mig) if mig.enabled => DeviceGroup {
                counter_set: None,
                devices: mig
                    .instances
                    .iter()
                    .filter_map(|i| mig.profile(&i.profile).map(|p| (i, p)))
                    .map(|(instance, profile)| self.mig_instance(gpu, profile, instance))
                    .collect(),
            },
            _ => DeviceGroup {
                counter_set: None,
                devices: vec![self.whole_gpu(gpu, None)],
            },
        }
    }

    /// Dynamic MIG: the whole GPU consuming everything, then every placement of every profile.
    /// The devices depend on the profiles only, never on which instances exist.
    fn partitionable(&self, gpu: &Gpu, mig: &MigState) -> DeviceGroup {
        let set = counter_set(gpu, mig);
        let mut devices = vec![self.whole_gpu(gpu, Some(consume_all(&set)))];
        let mut profiles: Vec<&MigProfile> = mig.profiles.iter().collect();
        profiles.sort_by(|a, b| {
            (a.compute_slices, a.memory_slices, &a.name).cmp(&(
                b.compute_slices,
                b.memory_slices,
                &b.name,
            ))
        });
        for profile in profiles {
            for &start in &profile.placements {
                let name = DeviceName::mig(gpu.minor, &profile.name, start).to_string();
                // No uuid even where an instance exists: the node plugin creates and destroys
                // instances at prepare/unprepare, and the published devices must not change
                // with them (each change would be a new pool generation).
                let mut device = self.mig_device(
                    gpu,
                    name,
                    profile,
                    None,
                    mig_capacities(
                        profile.memory_bytes,
                        profile.multiprocessors,
                        &profile.engines,
                    ),
                );
                device.consumes_counters = Some(vec![consume_placement(&set, profile, start)]);
                devices.push(device);
            }
        }
        DeviceGroup {
            counter_set: Some(set),
            devices,
        }
    }

    fn whole_gpu(&self, gpu: &Gpu, consumes: Option<DeviceCounterConsumption>) -> Device {
        let name = DeviceName::Gpu { minor: gpu.minor }.to_string();
        let mut attributes = self.shared_attributes(gpu);
        attributes.insert(attr::TYPE.into(), string(device_type::GPU));
        attributes.insert(attr::UUID.into(), string(&gpu.uuid));
        attributes.insert(attr::MIG_CAPABLE.into(), boolean(gpu.mig_capable()));
        attributes.insert(attr::MIG_ENABLED.into(), boolean(gpu.mig_enabled()));
        let links = gpu.active_nvlinks().count();
        if links > 0 {
            attributes.insert(attr::NVLINK_LINKS.into(), int(links as u64));
            attributes.insert(
                attr::NVLINK_BANDWIDTH_GBPS.into(),
                int(gpu.nvlink_bandwidth_gbps()),
            );
        }
        let mut capacities = Capacities::new();
        capacities.insert(capacity::MEMORY.into(), quantity(gpu.memory_bytes));
        capacities.insert(
            capacity::MULTIPROCESSORS.into(),
            quantity(u64::from(gpu.multiprocessors)),
        );
        let taints = self.taints(&name);
        let mut device = Device {
            name,
            attributes: Some(attributes),
            capacity: Some(capacities),
            consumes_counters: consumes.map(|c| vec![c]),
            taints,
            ..Device::default()
        };
        if device.consumes_counters.is_none() {
            share(&mut device, self.options.consumable_shares);
        }
        device
    }

    fn mig_instance(&self, gpu: &Gpu, profile: &MigProfile, instance: &MigInstance) -> Device {
        let name = DeviceName::mig(gpu.minor, &profile.name, instance.placement_start).to_string();
        let capacities = mig_capacities(
            instance.memory_bytes,
            instance.multiprocessors,
            &instance.engines,
        );
        let mut device = self.mig_device(gpu, name, profile, Some(&instance.uuid), capacities);
        share(&mut device, self.options.consumable_shares);
        device
    }

    fn mig_device(
        &self,
        gpu: &Gpu,
        name: String,
        profile: &MigProfile,
        uuid: Option<&str>,
        capacities: Capacities,
    ) -> Device {
        let mut attributes = self.shared_attributes(gpu);
        attributes.insert(attr::TYPE.into(), string(device_type::MIG));
        if let Some(uuid) = uuid {
            attributes.insert(attr::UUID.into(), string(uuid));
        }
        attributes.insert(attr::PROFILE.into(), string(&profile.name));
        attributes.insert(attr::PARENT_UUID.into(), string(&gpu.uuid));
        let taints = self.taints(&name);
        Device {
            name,
            attributes: Some(attributes),
            capacity: Some(capacities),
            taints,
            ..Device::default()
        }
    }

    /// Attributes a GPU and its MIG devices share (carriers "gpu, mig" in docs/attributes.md).
    fn shared_attributes(&self, gpu: &Gpu) -> Attributes {
        let mut a = Attributes::new();
        a.insert(attr::PRODUCT_NAME.into(), string(&gpu.product_name));
        a.insert(attr::BRAND.into(), string(gpu.brand.as_str()));
        a.insert(attr::ARCHITECTURE.into(), string(gpu.architecture.as_str()));
        a.insert(attr::INDEX.into(), int(u64::from(gpu.index)));
        a.insert(attr::MINOR.into(), int(u64::from(gpu.minor)));
        a.insert(
            attr::CUDA_COMPUTE_CAPABILITY.into(),
            version(gpu.cuda_compute_capability.to_semver()),
        );
        a.insert(
            attr::DRIVER_VERSION.into(),
            version(self.driver_version.clone()),
        );
        a.insert(
            attr::CUDA_DRIVER_VERSION.into(),
            version(self.inventory.cuda_driver_version.to_semver()),
        );
        if let Some(island) = island_of(self.islands, &gpu.uuid) {
            a.insert(attr::NVLINK_ISLAND.into(), string(&island.id));
        }
        if let Some(clique) = gpu.fabric_clique() {
            a.insert(attr::FABRIC_CLIQUE.into(), string(&clique));
        }
        a.insert(attr::PCI_BUS_ID.into(), string(&gpu.pci_bus_id));
        if let Some(root) = &gpu.pcie_root {
            a.insert(attr::PCIE_ROOT.into(), string(root));
        }
        if let Some(numa) = gpu.numa_node {
            a.insert(attr::NUMA_NODE.into(), int(u64::from(numa)));
            // The old name, for selectors written against it (docs/deviceclass-cookbook.md).
            a.insert(attr::LEGACY_NUMA_NODE.into(), int(u64::from(numa)));
        }
        a
    }

    fn taints(&self, device: &str) -> Option<Vec<DeviceTaint>> {
        let mut taints = Vec::new();
        if self.options.topology_managed {
            taints.push(DeviceTaint {
                key: TOPOLOGY_MANAGED_TAINT.to_owned(),
                effect: "NoSchedule".to_owned(),
                ..DeviceTaint::default()
            });
        }
        if let Some(extra) = self.options.device_taints.get(device) {
            taints.extend(extra.iter().cloned());
        }
        (!taints.is_empty()).then_some(taints)
    }
}

/// Publishes `device` for consumable shares in `mode`: multi-allocatable, its `memory` rounded
/// down to whole MiB with the mode's request policy, and in the N-shares mode a `shares` capacity.
/// Every other capacity (multiprocessors, engines) gets a policy with default 0: a capacity
/// without a policy is consumed whole by a claim that does not ask for it (upstream's rule), which
/// would let only one claim have the device. A capacity of 0 (a MIG device without decoders, say)
/// gets none: no step fits in it (the API server refuses a step larger than the capacity), and
/// consuming all of nothing takes nothing from the next claim.
fn share(device: &mut Device, mode: ConsumableShares) {
    if !mode.enabled() {
        return;
    }
    let capacities = device.capacity.get_or_insert_with(Capacities::new);
    if !capacities.contains_key(capacity::MEMORY) {
        return;
    }
    device.allow_multiple_allocations = Some(true);
    for (name, other) in capacities.iter_mut() {
        if name != capacity::MEMORY
            && let Ok(value) = other.value.0.parse::<u64>()
            && value > 0
        {
            other.request_policy = Some(range_policy(0, 0, value, 1));
        }
    }
    let Some(memory) = capacities.get_mut(capacity::MEMORY) else {
        return;
    };
    let bytes = memory
        .value
        .0
        .parse::<u64>()
        .map(memory_rounded)
        .unwrap_or_default();
    memory.value = Quantity(bytes.to_string());
    let (default, min) = match mode {
        ConsumableShares::Memory => (bytes, MEMORY_STEP_BYTES),
        _ => (0, 0),
    };
    memory.request_policy = Some(range_policy(default, min, bytes, MEMORY_STEP_BYTES));
    if let Some(shares) = mode.shares() {
        let shares = u64::from(shares);
        capacities.insert(
            capacity::SHARES.into(),
            DeviceCapacity {
                value: Quantity(shares.to_string()),
                request_policy: Some(range_policy(1, 1, shares, 1)),
            },
        );
    }
}

fn range_policy(default: u64, min: u64, max: u64, step: u64) -> CapacityRequestPolicy {
    CapacityRequestPolicy {
        default: Some(Quantity(default.to_string())),
        valid_range: Some(CapacityRequestPolicyRange {
            min: Quantity(min.to_string()),
            max: Some(Quantity(max.to_string())),
            step: Some(Quantity(step.to_string())),
        }),
        valid_values: None,
    }
}

fn mig_capacities(memory_bytes: u64, multiprocessors: u32, engines: &MigEngines) -> Capacities {
    let mut c = Capacities::new();
    c.insert(capacity::MEMORY.into(), quantity(memory_bytes));
    for (name, value) in [
        (capacity::MULTIPROCESSORS, multiprocessors),
        (capacity::COPY_ENGINES, engines.copy_engines),
        (capacity::DECODERS, engines.decoders),
        (capacity::ENCODERS, engines.encoders),
        (capacity::JPEG_ENGINES, engines.jpeg_engines),
        (capacity::OFA_ENGINES, engines.ofa_engines),
    ] {
        c.insert(name.into(), quantity(u64::from(value)));
    }
    c
}

/// Scarce engines a MIG placement consumes, with their counter names.
fn engine_counters(engines: &MigEngines) -> [(&'static str, u32); 4] {
    [
        (counter::DECODERS, engines.decoders),
        (counter::ENCODERS, engines.encoders),
        (counter::JPEG_ENGINES, engines.jpeg_engines),
        (counter::OFA_ENGINES, engines.ofa_engines),
    ]
}

/// The GPU's counter set: one counter per memory slice (value 1), compute slices, memory,
/// multiprocessors, and each engine kind some profile has (value: the most any profile has, i.e.
/// what the whole-GPU profile gets).
fn counter_set(gpu: &Gpu, mig: &MigState) -> CounterSet {
    let mut counters = BTreeMap::new();
    for slice in 0..mig.memory_slice_count() {
        counters.insert(counter::memory_slice(slice), count(1));
    }
    counters.insert(
        counter::COMPUTE_SLICES.to_owned(),
        count(u64::from(mig.compute_slice_count())),
    );
    counters.insert(counter::MEMORY.to_owned(), count(gpu.memory_bytes));
    counters.insert(
        counter::MULTIPROCESSORS.to_owned(),
        count(u64::from(gpu.multiprocessors)),
    );
    for (i, (name, _)) in engine_counters(&MigEngines::default())
        .into_iter()
        .enumerate()
    {
        let most = mig
            .profiles
            .iter()
            .map(|p| engine_counters(&p.engines)[i].1)
            .max()
            .unwrap_or(0);
        if most > 0 {
            counters.insert(name.to_owned(), count(u64::from(most)));
        }
    }
    CounterSet {
        name: counter::counter_set(gpu.minor),
        counters,
    }
}

/// The whole GPU consumes every counter of its set.
fn consume_all(set: &CounterSet) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: set.name.clone(),
        counters: set.counters.clone(),
        ..DeviceCounterConsumption::default()
    }
}

/// A placement at `start` consumes its memory slices, its compute slices, memory,
/// multiprocessors and engines.
fn consume_placement(
    set: &CounterSet,
    profile: &MigProfile,
    start: u32,
) -> DeviceCounterConsumption {
    let mut counters = BTreeMap::new();
    for slice in profile.memory_slice_range(start) {
        counters.insert(counter::memory_slice(slice), count(1));
    }
    counters.insert(
        counter::COMPUTE_SLICES.to_owned(),
        count(u64::from(profile.compute_slices)),
    );
    counters.insert(counter::MEMORY.to_owned(), count(profile.memory_bytes));
    counters.insert(
        counter::MULTIPROCESSORS.to_owned(),
        count(u64::from(profile.multiprocessors)),
    );
    for (name, value) in engine_counters(&profile.engines) {
        if value > 0 && set.counters.contains_key(name) {
            counters.insert(name.to_owned(), count(u64::from(value)));
        }
    }
    DeviceCounterConsumption {
        counter_set: set.name.clone(),
        counters,
        ..DeviceCounterConsumption::default()
    }
}

fn string(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.to_owned()),
        ..DeviceAttribute::default()
    }
}

fn int(value: u64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i64::try_from(value).unwrap_or(i64::MAX)),
        ..DeviceAttribute::default()
    }
}

fn boolean(value: bool) -> DeviceAttribute {
    DeviceAttribute {
        bool: Some(value),
        ..DeviceAttribute::default()
    }
}

fn version(value: String) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(value),
        ..DeviceAttribute::default()
    }
}

fn quantity(value: u64) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(value.to_string()),
        ..DeviceCapacity::default()
    }
}

fn count(value: u64) -> Counter {
    Counter {
        value: Quantity(value.to_string()),
    }
}
