//! The cluster as the allocator indexes it once: slices, their devices, DeviceClasses and nodes.
//! A [`Cluster`] is immutable after construction (class-selector results are computed on first
//! use and cached); [`crate::DeviceIndex`] holds it with what allocations keep between them.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};

use crate::device::{DeviceEntry, DeviceId};
use crate::node::NodeInfo;
use crate::quantity::Amount;
use crate::selection::{ClassEntry, SelectorCache};

/// A counter set published in a slice.
#[derive(Debug)]
pub(crate) struct CounterSetEntry {
    pub name: String,
    /// `Err` names the counter whose quantity does not parse.
    pub counters: Result<Vec<(String, Amount)>, String>,
}

/// A slice, with the devices moved out into the cluster's device table.
#[derive(Debug)]
pub(crate) struct SliceEntry {
    pub name: String,
    pub driver: Arc<str>,
    pub pool: Arc<str>,
    pub generation: i64,
    pub slice_count: i64,
    pub node_name: Option<String>,
    pub all_nodes: bool,
    pub node_selector: Option<NodeSelector>,
    pub per_device_node_selection: bool,
    pub devices: Range<usize>,
    pub counter_sets: Vec<CounterSetEntry>,
    /// Some device consumes counters with compatibility groups (alpha in 1.37, off by default):
    /// the scheduler ignores such a slice, which leaves its pool incomplete.
    pub compatibility_groups: bool,
}

impl SliceEntry {
    /// A slice publishing counter sets: only its counters count, not its devices (upstream, since
    /// 1.35 a slice holds one or the other; a 1.34 slice holding both contributes its counters).
    pub fn is_counter_slice(&self) -> bool {
        !self.counter_sets.is_empty()
    }
}

/// Everything the allocator knows about the cluster, indexed for allocation.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub slices: Vec<SliceEntry>,
    pub devices: Vec<DeviceEntry>,
    pub classes: HashMap<String, ClassEntry>,
    pub nodes: Vec<NodeInfo>,
    node_index: HashMap<String, usize>,
    /// Slices with `nodeName`, by node.
    pub slices_by_node: HashMap<String, Vec<usize>>,
    /// Slices without `nodeName`.
    pub shared_slices: Vec<usize>,
    /// All slices of a pool, by (driver, pool).
    pub slices_by_pool: HashMap<(Arc<str>, Arc<str>), Vec<usize>>,
    pub selectors: SelectorCache,
}

impl Cluster {
    /// Indexes slices, classes and nodes. With no nodes, the node set is derived from the
    /// `nodeName` of slices and devices (without labels, so label selectors match none of them).
    /// A class name given twice keeps the last definition.
    pub fn new(
        slices: Vec<ResourceSlice>,
        classes: Vec<DeviceClass>,
        nodes: Vec<NodeInfo>,
    ) -> Cluster {
        let mut inv = Cluster {
            slices: Vec::with_capacity(slices.len()),
            devices: Vec::new(),
            classes: HashMap::new(),
            nodes: Vec::new(),
            node_index: HashMap::new(),
            slices_by_node: HashMap::new(),
            shared_slices: Vec::new(),
            slices_by_pool: HashMap::new(),
            selectors: SelectorCache::default(),
        };
        let mut derived_nodes = BTreeSet::new();
        for slice in slices {
            inv.add_slice(slice, &mut derived_nodes);
        }
        let device_count = inv.devices.len();
        for class in classes {
            let name = class.metadata.name.clone().unwrap_or_default();
            inv.classes
                .insert(name, ClassEntry::new(class, device_count));
        }
        let mut nodes = if nodes.is_empty() {
            derived_nodes.into_iter().map(NodeInfo::named).collect()
        } else {
            nodes
        };
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        nodes.dedup_by(|a, b| a.name == b.name);
        inv.node_index = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
        inv.nodes = nodes;
        inv
    }

    fn add_slice(&mut self, slice: ResourceSlice, derived_nodes: &mut BTreeSet<String>) {
        let index = self.slices.len();
        let spec = slice.spec;
        let driver: Arc<str> = spec.driver.as_str().into();
        let pool: Arc<str> = spec.pool.name.as_str().into();
        let first_device = self.devices.len();
        let compatibility_groups = spec.devices.iter().flatten().any(|d| {
            d.consumes_counters.iter().flatten().any(|c| {
                c.compatibility_groups
                    .as_ref()
                    .is_some_and(|g| !g.is_empty())
            })
        });
        for device in spec.devices.into_iter().flatten() {
            if let Some(n) = device.node_name.as_ref().filter(|n| !n.is_empty()) {
                derived_nodes.insert(n.clone());
            }
            let id =
                DeviceId::from_parts(driver.clone(), pool.clone(), device.name.as_str().into());
            self.devices.push(DeviceEntry::new(id, index, device));
        }
        let counter_sets = spec
            .shared_counters
            .into_iter()
            .flatten()
            .map(|set| CounterSetEntry {
                counters: set
                    .counters
                    .iter()
                    .map(|(name, c)| {
                        Amount::from_quantity(&c.value)
                            .map(|a| (name.clone(), a))
                            .map_err(|e| format!("counter set {}: counter {name}: {e}", set.name))
                    })
                    .collect(),
                name: set.name,
            })
            .collect();
        let node_name = spec.node_name.filter(|n| !n.is_empty());
        match &node_name {
            Some(n) => {
                derived_nodes.insert(n.clone());
                self.slices_by_node
                    .entry(n.clone())
                    .or_default()
                    .push(index);
            }
            None => self.shared_slices.push(index),
        }
        self.slices_by_pool
            .entry((driver.clone(), pool.clone()))
            .or_default()
            .push(index);
        self.slices.push(SliceEntry {
            name: slice.metadata.name.unwrap_or_default(),
            driver,
            pool,
            generation: spec.pool.generation,
            slice_count: spec.pool.resource_slice_count,
            node_name,
            all_nodes: spec.all_nodes.unwrap_or(false),
            node_selector: spec.node_selector,
            per_device_node_selection: spec.per_device_node_selection.unwrap_or(false),
            devices: first_device..self.devices.len(),
            counter_sets,
            compatibility_groups,
        });
    }

    /// Index of a node by name.
    pub fn node_position(&self, name: &str) -> Option<usize> {
        self.node_index.get(name).copied()
    }
}
