//! The cluster as the allocator indexes it once: slices, their devices, DeviceClasses and nodes.
//! An [`DeviceIndex`] is immutable after construction and shared between allocations (it is `Send +
//! Sync`); per-node pool views and class-selector results are computed on first use and cached.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::core::v1::{Node, NodeSelector};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};

use crate::device::{DeviceEntry, DeviceId};
use crate::error::AllocateError;
use crate::node::NodeInfo;
use crate::pools::NodePools;
use crate::quantity::Amount;
use crate::selection::{ClassEntry, SelectorCache, Verdict};
use crate::verdicts::VerdictCache;

/// A counter set published in a slice.
#[derive(Debug)]
pub(crate) struct CounterSetEntry {
    pub name: String,
    /// `Err` names the counter whose quantity does not parse.
    pub counters: Result<Vec<(String, Amount)>, String>,
}

/// A slice, with the devices moved out into the inventory's device table.
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
pub struct DeviceIndex {
    pub(crate) slices: Vec<SliceEntry>,
    pub(crate) devices: Vec<DeviceEntry>,
    pub(crate) classes: HashMap<String, ClassEntry>,
    pub(crate) nodes: Vec<NodeInfo>,
    node_index: HashMap<String, usize>,
    /// Slices with `nodeName`, by node.
    pub(crate) slices_by_node: HashMap<String, Vec<usize>>,
    /// Slices without `nodeName`.
    pub(crate) shared_slices: Vec<usize>,
    /// All slices of a pool, by (driver, pool).
    pub(crate) slices_by_pool: HashMap<(Arc<str>, Arc<str>), Vec<usize>>,
    /// Per node (same index as `nodes`): its pools, gathered on first use.
    node_pools: Vec<OnceLock<NodePools>>,
    pub(crate) selectors: SelectorCache,
    /// Per-node search results of recent claim shapes (topology-aware choice among nodes).
    pub(crate) verdicts: Mutex<VerdictCache>,
    /// Whether [`DeviceIndex::set_reuse_results`] left the stored results on.
    pub(crate) reuse_results: AtomicBool,
}

impl DeviceIndex {
    /// Indexes slices, classes and nodes. With no nodes, the node set is derived from the
    /// `nodeName` of slices and devices (without labels, so label selectors match none of them).
    /// A class name given twice keeps the last definition.
    pub fn new(
        slices: Vec<ResourceSlice>,
        classes: Vec<DeviceClass>,
        nodes: Vec<NodeInfo>,
    ) -> DeviceIndex {
        let mut inv = DeviceIndex {
            slices: Vec::with_capacity(slices.len()),
            devices: Vec::new(),
            classes: HashMap::new(),
            nodes: Vec::new(),
            node_index: HashMap::new(),
            slices_by_node: HashMap::new(),
            shared_slices: Vec::new(),
            slices_by_pool: HashMap::new(),
            node_pools: Vec::new(),
            selectors: SelectorCache::default(),
            verdicts: Mutex::default(),
            reuse_results: AtomicBool::new(true),
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
        inv.node_pools = nodes.iter().map(|_| OnceLock::new()).collect();
        inv.nodes = nodes;
        inv
    }

    /// Like [`DeviceIndex::new`] with `core/v1` Node objects.
    pub fn from_nodes(
        slices: Vec<ResourceSlice>,
        classes: Vec<DeviceClass>,
        nodes: &[Node],
    ) -> DeviceIndex {
        DeviceIndex::new(slices, classes, nodes.iter().map(NodeInfo::from).collect())
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

    /// The nodes, sorted by name (the order first fit tries them in).
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.node_index.get(name).map(|&i| &self.nodes[i])
    }

    /// The devices of the slices published for `node` by name (counter slices have none), as
    /// the slices list them. Devices of slices shared between nodes are not included. Used to
    /// read node-wide facts a driver publishes on every device (a fabric clique).
    pub fn node_devices<'a>(
        &'a self,
        node: &str,
    ) -> impl Iterator<Item = (&'a DeviceId, &'a k8s_openapi::api::resource::v1::Device)> + 'a {
        self.slices_by_node
            .get(node)
            .into_iter()
            .flatten()
            .flat_map(move |&s| self.devices[self.slices[s].devices.clone()].iter())
            .map(|d| (&d.id, &d.device))
    }

    /// Number of devices in all slices.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// How many devices of the inventory (any node, in use or not) a DeviceClass's own selectors
    /// select; `None` when there is no class of that name. A selector that does not compile or
    /// fails on a device it is evaluated on is an error, as it would be in allocation. Verdicts are cached, so a
    /// later allocation on this inventory does not evaluate them again.
    pub fn devices_selected_by_class(&self, class: &str) -> Option<Result<usize, AllocateError>> {
        let entry = self.classes.get(class)?;
        let owner = || format!("class {class}");
        let mut selected = 0;
        for index in 0..self.devices.len() {
            match entry.verdict(&self.selectors, &self.devices, index) {
                Verdict::Match => selected += 1,
                Verdict::NoMatch(_) => {}
                Verdict::Failed {
                    selector,
                    message,
                    compile,
                } => {
                    return Some(Err(AllocateError::selector(
                        owner(),
                        selector,
                        &self.devices[index].id,
                        message,
                        compile,
                    )));
                }
            }
        }
        Some(Ok(selected))
    }

    /// Whether a topology-aware choice among nodes may answer a node from the result stored for
    /// an earlier claim of the same shape when the node's devices in use did not change (on by
    /// default). The choice is the same either way; off, every node is searched again, which
    /// the tests and benchmarks use to compare.
    pub fn set_reuse_results(&self, reuse: bool) {
        self.reuse_results.store(reuse, Ordering::Relaxed);
        if !reuse {
            *self
                .verdicts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = VerdictCache::default();
        }
    }

    /// Index of a node by name.
    pub(crate) fn node_position(&self, name: &str) -> Option<usize> {
        self.node_index.get(name).copied()
    }

    /// The pools the node at `position` can allocate from, gathered on first use.
    pub(crate) fn pools_for(&self, position: usize) -> &NodePools {
        self.node_pools[position].get_or_init(|| NodePools::gather(self, &self.nodes[position]))
    }
}
