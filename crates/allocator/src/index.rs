//! The allocator's entry object: the [`Cluster`] indexed once, with what allocations keep between
//! them. A [`DeviceIndex`] is shared between allocations (it is `Send + Sync`); per-node pool
//! views and per-node search results are computed on first use and kept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};

use crate::cluster::Cluster;
use crate::device::DeviceId;
use crate::error::AllocateError;
use crate::node::NodeInfo;
use crate::pools::NodePools;
use crate::search::QuietNodes;
use crate::selection::Verdict;
use crate::verdicts::VerdictCache;

/// Everything the allocator knows about the cluster, indexed for allocation.
#[derive(Debug)]
pub struct DeviceIndex {
    pub(crate) cluster: Cluster,
    /// Per node (same index as the cluster's `nodes`): its pools, gathered on first use.
    node_pools: Vec<OnceLock<NodePools>>,
    /// Per-node search results of recent claim shapes (topology-aware choice among nodes).
    pub(crate) verdicts: Mutex<VerdictCache>,
    /// Whether [`DeviceIndex::set_reuse_results`] left the stored results on.
    pub(crate) reuse_results: AtomicBool,
    /// Searches of one node run so far ([`DeviceIndex::node_searches`]).
    pub(crate) node_searches: AtomicU64,
    /// Per recent claim shape, per node: whether first fit's search there can raise no error
    /// whatever is in use (module `search::skip`).
    pub(crate) quiet: Mutex<QuietNodes>,
    /// How many devices each class selects ([`DeviceIndex::devices_selected_by_class`]), counted
    /// once: classes and devices never change in an index, nor do their verdicts.
    class_counts: Mutex<HashMap<String, Result<usize, AllocateError>>>,
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
        let cluster = Cluster::new(slices, classes, nodes);
        DeviceIndex {
            node_pools: cluster.nodes.iter().map(|_| OnceLock::new()).collect(),
            cluster,
            verdicts: Mutex::default(),
            reuse_results: AtomicBool::new(true),
            node_searches: AtomicU64::new(0),
            quiet: Mutex::default(),
            class_counts: Mutex::default(),
        }
    }

    /// Like [`DeviceIndex::new`] with `core/v1` Node objects.
    pub fn from_nodes(
        slices: Vec<ResourceSlice>,
        classes: Vec<DeviceClass>,
        nodes: &[Node],
    ) -> DeviceIndex {
        DeviceIndex::new(slices, classes, nodes.iter().map(NodeInfo::from).collect())
    }

    /// How many searches of one node's devices allocations on this index have run so far. Nodes
    /// passed by without a search (too few free devices, see [`DeviceIndex::allocate`]) and
    /// results reused from earlier searches are not counted: the difference before and after an
    /// allocation is the number of nodes it searched, a count tests can hold allocations to.
    pub fn node_searches(&self) -> u64 {
        self.node_searches.load(Ordering::Relaxed)
    }

    /// The nodes, sorted by name (the order first fit tries them in).
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.cluster.nodes
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        let cluster = &self.cluster;
        cluster.node_position(name).map(|i| &cluster.nodes[i])
    }

    /// The devices of the slices published for `node` by name (counter slices have none), as
    /// the slices list them. Devices of slices shared between nodes are not included. Used to
    /// read node-wide facts a driver publishes on every device (a fabric clique).
    pub fn node_devices<'a>(
        &'a self,
        node: &str,
    ) -> impl Iterator<Item = (&'a DeviceId, &'a k8s_openapi::api::resource::v1::Device)> + 'a {
        let cluster = &self.cluster;
        cluster
            .slices_by_node
            .get(node)
            .into_iter()
            .flatten()
            .flat_map(move |&s| cluster.devices[cluster.slices[s].devices.clone()].iter())
            .map(|d| (&d.id, &d.device))
    }

    /// Number of devices in all slices.
    pub fn device_count(&self) -> usize {
        self.cluster.devices.len()
    }

    /// How many devices of the inventory (any node, in use or not) a DeviceClass's own selectors
    /// select; `None` when there is no class of that name. A selector that does not compile or
    /// fails on a device it is evaluated on is an error, as it would be in allocation. Verdicts are cached, so a
    /// later allocation on this inventory does not evaluate them again.
    pub fn devices_selected_by_class(&self, class: &str) -> Option<Result<usize, AllocateError>> {
        let counts = || self.class_counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts().get(class) {
            return Some(count.clone());
        }
        let count = self.devices_of_class(class)?.map(|ids| ids.len());
        counts().insert(class.to_owned(), count.clone());
        Some(count)
    }

    /// The devices of the inventory (any node, in use or not) a DeviceClass's own selectors select,
    /// in inventory order; `None` when there is no class of that name. Errors as
    /// [`DeviceIndex::devices_selected_by_class`]. A request's own selectors may select fewer: this
    /// is what a search may bound itself with (preemption counts the devices a pod could use).
    pub fn devices_of_class(&self, class: &str) -> Option<Result<Vec<&DeviceId>, AllocateError>> {
        let cluster = &self.cluster;
        let entry = cluster.classes.get(class)?;
        let owner = || format!("class {class}");
        let mut selected = Vec::new();
        for index in 0..cluster.devices.len() {
            match entry.verdict(&cluster.selectors, &cluster.devices, index) {
                Verdict::Match => selected.push(&cluster.devices[index].id),
                Verdict::NoMatch(_) => {}
                Verdict::Failed {
                    selector,
                    message,
                    compile,
                } => {
                    return Some(Err(AllocateError::selector(
                        owner(),
                        selector,
                        &cluster.devices[index].id,
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

    /// The pools the node at `position` can allocate from, gathered on first use.
    pub(crate) fn pools_for(&self, position: usize) -> &NodePools {
        self.node_pools[position]
            .get_or_init(|| NodePools::gather(&self.cluster, &self.cluster.nodes[position]))
    }
}
