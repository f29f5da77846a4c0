//! The cluster's topology domains as one group decision reads them: per level (a fabric clique,
//! then each node label of the [`Hierarchy`]), each node's value, and the domains of a level
//! ordered for the search.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use tessera_allocator::{DeviceId, DeviceIndex};
use tessera_api::names::{DRIVER_NAME, attr};

use crate::group::settings::{GroupSettings, Hierarchy};
use crate::view::{ClusterSnapshot, PodContext};

/// Where the group went, for messages: `rack=r1 (gpu.tessera.dev/rack)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    /// `fabricClique`, a label key, or `cluster`.
    pub level: String,
    pub value: String,
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.level == "cluster" {
            f.write_str("the whole cluster")
        } else {
            write!(f, "{}={}", self.level, self.value)
        }
    }
}

/// One level of domains: each node's value (indexed like [`ClusterSnapshot::nodes`]).
pub(crate) struct Level {
    pub(crate) name: String,
    pub(crate) of_node: Vec<Option<String>>,
}

/// Each node's fabric clique: the `fabricClique` attribute of its first managed device.
fn clique_level(devices: &ClusterSnapshot) -> Option<Level> {
    let of_node = devices.cliques(|devices| {
        let qualified = format!("{DRIVER_NAME}/{}", attr::FABRIC_CLIQUE);
        devices
            .nodes
            .iter()
            .map(|n| node_clique(&devices.managed, &n.info.name, &qualified))
            .collect()
    });
    of_node.iter().any(Option::is_some).then(|| Level {
        name: attr::FABRIC_CLIQUE.to_owned(),
        of_node: of_node.to_vec(),
    })
}

fn node_clique(inventory: &DeviceIndex, node: &str, qualified: &str) -> Option<String> {
    inventory.node_devices(node).find_map(|(_, device)| {
        let attributes = device.attributes.as_ref()?;
        attributes
            .get(qualified)
            .or_else(|| attributes.get(attr::FABRIC_CLIQUE))?
            .string
            .clone()
            .filter(|s| !s.is_empty())
    })
}

fn label_levels(devices: &ClusterSnapshot, hierarchy: &Hierarchy) -> Vec<Level> {
    hierarchy
        .labels
        .iter()
        .map(|key| Level {
            name: key.clone(),
            of_node: devices
                .nodes
                .iter()
                .map(|n| n.info.labels.get(key).cloned())
                .collect(),
        })
        .collect()
}

/// Groups `nodes` by their value at `level` (no level: all in one group, the planner picks the
/// node; a node without the label: a group of its own), emptiest (most free devices) first.
pub(crate) fn subdomains(
    nodes: &[usize],
    level: Option<&Level>,
    free: &[usize],
) -> Vec<Vec<usize>> {
    if level.is_none() {
        return vec![nodes.to_vec()];
    }
    let mut groups: BTreeMap<(u8, String), Vec<usize>> = BTreeMap::new();
    for &n in nodes {
        let key = match level.and_then(|l| l.of_node[n].clone()) {
            Some(v) => (0, v),
            None => (1, n.to_string()),
        };
        groups.entry(key).or_default().push(n);
    }
    let mut out: Vec<Vec<usize>> = groups.into_values().collect();
    out.sort_by_key(|g| std::cmp::Reverse(g.iter().map(|&n| free[n]).sum::<usize>()));
    out
}

/// What a [`Layout`] reads that a snapshot never changes, built once per snapshot and hierarchy
/// ([`ClusterSnapshot::layout_base`]): every group decision on the snapshot shares it.
pub(crate) struct LayoutBase {
    /// Node name → index into [`ClusterSnapshot::nodes`].
    pub(crate) index: HashMap<String, usize>,
    /// Nodes with managed devices.
    pub(crate) managed: Vec<usize>,
    /// The managed devices of each node (indexed like [`ClusterSnapshot::nodes`]).
    node_devices: Vec<Vec<DeviceId>>,
    pub(crate) clique: Option<Level>,
    pub(crate) labels: Vec<Level>,
}

impl LayoutBase {
    fn new(devices: &ClusterSnapshot, hierarchy: &Hierarchy) -> LayoutBase {
        LayoutBase {
            index: devices
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.info.name.clone(), i))
                .collect(),
            managed: (0..devices.nodes.len())
                .filter(|&i| devices.managed_nodes.contains(&devices.nodes[i].info.name))
                .collect(),
            node_devices: devices
                .nodes
                .iter()
                .map(|n| {
                    let ids = devices.managed.node_devices(&n.info.name);
                    ids.map(|(id, _)| id.clone()).collect()
                })
                .collect(),
            clique: clique_level(devices),
            labels: label_levels(devices, hierarchy),
        }
    }
}

/// The cluster's domains as one group decision reads them: the snapshot's [`LayoutBase`] and the
/// free devices per node.
pub(crate) struct Layout {
    base: Arc<LayoutBase>,
    /// Free (not in use) managed devices per node.
    pub(crate) free: Vec<usize>,
}

impl Deref for Layout {
    type Target = LayoutBase;

    fn deref(&self) -> &LayoutBase {
        &self.base
    }
}

impl Layout {
    pub(crate) fn new(context: &PodContext<'_>, group: &GroupSettings) -> Layout {
        let devices = context.devices;
        let base = devices.layout_base(&group.hierarchy.labels, || {
            LayoutBase::new(devices, &group.hierarchy)
        });
        let free = base
            .node_devices
            .iter()
            .map(|ids| {
                ids.iter()
                    .filter(|id| !context.in_use.is_in_use(id))
                    .count()
            })
            .collect();
        Layout { base, free }
    }

    /// The levels some managed node has a value at, finest first.
    pub(crate) fn levels(&self) -> Vec<&Level> {
        self.clique
            .iter()
            .chain(self.labels.iter())
            .filter(|l| self.managed.iter().any(|&n| l.of_node[n].is_some()))
            .collect()
    }

    /// The domains at `depth` of `levels` (past the last: the whole cluster), fullest first, and
    /// the level below them.
    pub(crate) fn domains<'l>(
        &self,
        levels: &[&'l Level],
        depth: usize,
    ) -> (Vec<(Domain, Vec<usize>)>, Option<&'l Level>) {
        let Some(level) = levels.get(depth) else {
            let all = Domain {
                level: "cluster".into(),
                value: String::new(),
            };
            return (vec![(all, self.managed.clone())], levels.last().copied());
        };
        let mut by_value: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for &n in &self.managed {
            if let Some(v) = level.of_node[n].as_deref() {
                by_value.entry(v).or_default().push(n);
            }
        }
        let mut domains: Vec<(Domain, Vec<usize>)> = by_value
            .into_iter()
            .map(|(v, nodes)| {
                let domain = Domain {
                    level: level.name.clone(),
                    value: v.to_owned(),
                };
                (domain, nodes)
            })
            .collect();
        // Best fit: the fullest domain first, so large domains stay whole.
        domains.sort_by_key(|(_, nodes)| nodes.iter().map(|&n| self.free[n]).sum::<usize>());
        (domains, depth.checked_sub(1).map(|d| levels[d]))
    }
}
