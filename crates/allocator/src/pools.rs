//! Gathering the resource pools a node can allocate from, with upstream semantics:
//!
//! - a node sees its own slices (`nodeName`) plus shared slices whose `allNodes`, `nodeSelector` or
//!   per-device node selection matches it; slices with none of these are skipped, and so are
//!   slices whose devices use counter compatibility groups (an alpha feature the scheduler has
//!   off: their pool counts as incomplete);
//! - of a pool only the highest generation counts; a pool whose generation is obsolete (a newer
//!   generation exists in slices the node does not see) is ignored;
//! - a pool with fewer slices than `resourceSliceCount` is incomplete: nothing is allocated from it
//!   and a request for `All` devices fails;
//! - a pool with duplicate device names, duplicate counter-set names, a device consuming a counter
//!   that does not exist, or a quantity that does not parse is invalid;
//! - a slice with `sharedCounters` is a counter slice: its counter sets count, its devices (the
//!   1.34 form put both in one slice) do not; devices of the pool that do not target the node
//!   still consume counters;
//! - in a slice with per-device node selection, every device is a candidate and its own node
//!   selection is checked after the selectors (as upstream does, so a selector failing on a device
//!   of another node fails the allocation);
//! - pools are ordered by driver and name, pools with binding conditions last; slices in a pool by
//!   name; that order is the first-fit order.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::cluster::{Cluster, SliceEntry};
use crate::device::DevicePosition;
use crate::node::{NodeInfo, node_matches};
use crate::quantity::Amount;
use crate::topology::NodeTopology;

/// What one device consumes of its pool's counters: (counter index, amount).
pub(crate) type CounterUse = Vec<(usize, Amount)>;

/// Why a pool cannot be allocated from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PoolStatus {
    Usable,
    Incomplete { have: usize, want: i64 },
    Invalid(String),
}

/// One pool as seen from one node.
#[derive(Debug)]
pub(crate) struct Pool {
    pub driver: Arc<str>,
    pub name: Arc<str>,
    pub status: PoolStatus,
    pub binding_conditions: bool,
    /// Flattened counters of all counter sets: `(set, counter)` and the published value.
    pub counter_names: Vec<(String, String)>,
    pub counter_totals: Vec<Amount>,
    /// Every device of the pool that consumes counters (targeting this node or not), with its
    /// consumption resolved to counter indices.
    pub consumers: Vec<(DevicePosition, CounterUse)>,
}

impl Pool {
    pub fn id(&self) -> String {
        format!("{}/{}", self.driver, self.name)
    }
}

/// The pools a node can allocate from and its candidate devices in first-fit order.
#[derive(Debug)]
pub(crate) struct NodePools {
    pub node: NodeInfo,
    pub pools: Vec<Pool>,
    /// Devices of usable pools available to the node, in first-fit order.
    pub candidates: Vec<DevicePosition>,
    /// Per candidate: index into `pools`.
    pub candidate_pool: Vec<usize>,
    /// Per candidate: counters it consumes, as indices into its pool's counters.
    pub candidate_consumes: Vec<CounterUse>,
    /// Per candidate: whether its own node selection (per-device node selection) selects the
    /// node; always true for devices of other slices.
    pub candidate_on_node: Vec<bool>,
    pub topology: NodeTopology,
    /// Some candidate allows multiple allocations (so "in use" does not mean unavailable).
    pub has_multi_allocatable: bool,
}

impl NodePools {
    pub fn gather(inv: &Cluster, node: &NodeInfo) -> NodePools {
        let mut pools: Vec<(Pool, Vec<usize>)> = relevant_slices(inv, node)
            .into_iter()
            .filter_map(|((driver, name), targeting)| resolve_pool(inv, driver, name, targeting))
            .collect();
        pools.sort_by(|(a, _), (b, _)| {
            (a.binding_conditions, &a.driver, &a.name).cmp(&(
                b.binding_conditions,
                &b.driver,
                &b.name,
            ))
        });
        let mut np = NodePools {
            node: node.clone(),
            pools: Vec::with_capacity(pools.len()),
            candidates: Vec::new(),
            candidate_pool: Vec::new(),
            candidate_consumes: Vec::new(),
            candidate_on_node: Vec::new(),
            topology: NodeTopology::default(),
            has_multi_allocatable: false,
        };
        for (pool, slices) in pools {
            if pool.status == PoolStatus::Usable {
                np.add_candidates(inv, &pool, &slices);
            }
            np.pools.push(pool);
        }
        np.topology = NodeTopology::new(np.candidates.iter().map(|&d| &inv.devices[d].topology));
        np.has_multi_allocatable = np
            .candidates
            .iter()
            .any(|&d| inv.devices[d].parsed().allow_multiple_allocations);
        np
    }

    /// Appends the devices of a usable pool's slices that are available to the node.
    fn add_candidates(&mut self, inv: &Cluster, pool: &Pool, slices: &[usize]) {
        let index = self.pools.len();
        let consumption: HashMap<DevicePosition, &CounterUse> =
            pool.consumers.iter().map(|(d, c)| (*d, c)).collect();
        for &s in slices {
            let slice = &inv.slices[s];
            if slice.is_counter_slice() {
                continue;
            }
            for d in slice.devices.clone() {
                let dev = &inv.devices[d].device;
                let on_node = !slice.per_device_node_selection
                    || node_matches(
                        &self.node,
                        dev.node_name.as_deref(),
                        dev.all_nodes.unwrap_or(false),
                        dev.node_selector.as_ref(),
                    );
                self.candidates.push(d);
                self.candidate_pool.push(index);
                self.candidate_on_node.push(on_node);
                self.candidate_consumes.push(
                    consumption
                        .get(&d)
                        .map(|c| (*c).clone())
                        .unwrap_or_default(),
                );
            }
        }
    }
}

/// The node's own and matching shared slices, by pool, of the highest generation seen.
fn relevant_slices(inv: &Cluster, node: &NodeInfo) -> HashMap<(Arc<str>, Arc<str>), Vec<usize>> {
    let mut by_pool: HashMap<(Arc<str>, Arc<str>), Vec<usize>> = HashMap::new();
    let own = inv
        .slices_by_node
        .get(&node.name)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for &s in own.iter().chain(&inv.shared_slices) {
        let slice = &inv.slices[s];
        if slice.compatibility_groups || !slice_relevant(inv, slice, node) {
            continue;
        }
        let entry = by_pool
            .entry((slice.driver.clone(), slice.pool.clone()))
            .or_default();
        match entry.first().map(|&f| inv.slices[f].generation) {
            Some(g) if slice.generation < g => {}
            Some(g) if slice.generation > g => *entry = vec![s],
            _ => entry.push(s),
        }
    }
    by_pool
}

/// A pool from its slices targeting the node (sorted by name, returned with the pool), checked
/// against all slices of its generation; `None` when the generation is obsolete.
fn resolve_pool(
    inv: &Cluster,
    driver: Arc<str>,
    name: Arc<str>,
    mut targeting: Vec<usize>,
) -> Option<(Pool, Vec<usize>)> {
    let first = &inv.slices[targeting[0]];
    let (generation, want) = (first.generation, first.slice_count);
    let mut others = Vec::new();
    if usize::try_from(want).ok() != Some(targeting.len()) {
        let all = &inv.slices_by_pool[&(driver.clone(), name.clone())];
        if all.iter().any(|&s| inv.slices[s].generation > generation) {
            return None; // obsolete: the driver is replacing this generation
        }
        let same_gen: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&s| {
                inv.slices[s].generation == generation && !inv.slices[s].compatibility_groups
            })
            .collect();
        if usize::try_from(want).ok() != Some(same_gen.len()) {
            let status = PoolStatus::Incomplete {
                have: same_gen.len(),
                want,
            };
            return Some((Pool::unusable(driver, name, status), Vec::new()));
        }
        others = same_gen
            .into_iter()
            .filter(|s| !targeting.contains(s))
            .collect();
    }
    targeting.sort_by(|&a, &b| inv.slices[a].name.cmp(&inv.slices[b].name));
    Some((
        Pool::build(inv, driver, name, &targeting, &others),
        targeting,
    ))
}

fn slice_relevant(inv: &Cluster, slice: &SliceEntry, node: &NodeInfo) -> bool {
    if slice.node_name.is_some() || slice.all_nodes || slice.node_selector.is_some() {
        return node_matches(
            node,
            slice.node_name.as_deref(),
            slice.all_nodes,
            slice.node_selector.as_ref(),
        );
    }
    if slice.per_device_node_selection {
        return inv.devices[slice.devices.clone()].iter().any(|d| {
            node_matches(
                node,
                d.device.node_name.as_deref(),
                d.device.all_nodes.unwrap_or(false),
                d.device.node_selector.as_ref(),
            )
        });
    }
    // Some future node-selection field this version does not know: skip the slice.
    false
}

impl Pool {
    fn unusable(driver: Arc<str>, name: Arc<str>, status: PoolStatus) -> Pool {
        Pool {
            driver,
            name,
            status,
            binding_conditions: false,
            counter_names: Vec::new(),
            counter_totals: Vec::new(),
            consumers: Vec::new(),
        }
    }

    fn build(
        inv: &Cluster,
        driver: Arc<str>,
        name: Arc<str>,
        targeting: &[usize],
        others: &[usize],
    ) -> Pool {
        match Pool::validate(inv, targeting, others) {
            Ok(counters) => Pool {
                binding_conditions: targeting
                    .iter()
                    .filter(|&&s| !inv.slices[s].is_counter_slice())
                    .flat_map(|&s| &inv.devices[inv.slices[s].devices.clone()])
                    .any(|d| d.has_binding_conditions()),
                driver,
                name,
                status: PoolStatus::Usable,
                counter_names: counters.names,
                counter_totals: counters.totals,
                consumers: counters.consumers,
            },
            Err(reason) => Pool::unusable(driver, name, PoolStatus::Invalid(reason)),
        }
    }

    fn validate(
        inv: &Cluster,
        targeting: &[usize],
        others: &[usize],
    ) -> Result<PoolCounters, String> {
        let devices = |slices: &[usize]| -> Vec<usize> {
            slices
                .iter()
                .copied()
                .filter(|&s| !inv.slices[s].is_counter_slice())
                .collect()
        };
        check_device_names(inv, &devices(targeting))?;
        let all: Vec<usize> = targeting.iter().chain(others).copied().collect();
        let counter_slices: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&s| inv.slices[s].is_counter_slice())
            .collect();
        let counters = Counters::of(inv, &counter_slices)?;
        let consumers = counters.consumers(inv, &devices(&all))?;
        Ok(PoolCounters {
            names: counters.names,
            totals: counters.totals,
            consumers,
        })
    }
}

/// A valid pool's counters and who consumes them.
struct PoolCounters {
    names: Vec<(String, String)>,
    totals: Vec<Amount>,
    consumers: Vec<(DevicePosition, CounterUse)>,
}

fn check_device_names(inv: &Cluster, slices: &[usize]) -> Result<(), String> {
    let mut names = HashSet::new();
    for &s in slices {
        for d in &inv.devices[inv.slices[s].devices.clone()] {
            if !names.insert(d.id.device()) {
                return Err(format!("duplicate device name {}", d.id.device()));
            }
        }
    }
    Ok(())
}

/// A pool's counters, flattened: `(set, counter)` names and published values.
struct Counters<'i> {
    names: Vec<(String, String)>,
    totals: Vec<Amount>,
    sets: HashSet<&'i str>,
    index: HashMap<(&'i str, &'i str), usize>,
}

impl<'i> Counters<'i> {
    fn of(inv: &'i Cluster, slices: &[usize]) -> Result<Counters<'i>, String> {
        let mut c = Counters {
            names: Vec::new(),
            totals: Vec::new(),
            sets: HashSet::new(),
            index: HashMap::new(),
        };
        for &s in slices {
            for set in &inv.slices[s].counter_sets {
                if !c.sets.insert(set.name.as_str()) {
                    return Err(format!("duplicate counter set name {}", set.name));
                }
                for (counter, value) in set.counters.as_ref().map_err(Clone::clone)? {
                    c.index
                        .insert((set.name.as_str(), counter.as_str()), c.totals.len());
                    c.names.push((set.name.clone(), counter.clone()));
                    c.totals.push(*value);
                }
            }
        }
        Ok(c)
    }

    /// Every device of `slices` that consumes counters, with its consumption resolved.
    fn consumers(
        &self,
        inv: &Cluster,
        slices: &[usize],
    ) -> Result<Vec<(DevicePosition, CounterUse)>, String> {
        let mut consumers = Vec::new();
        for &s in slices {
            for d in inv.slices[s].devices.clone() {
                let parsed = inv.devices[d].parsed.as_ref().map_err(Clone::clone)?;
                let mut resolved = Vec::new();
                for c in &parsed.consumes {
                    if !self.sets.contains(c.counter_set.as_str()) {
                        return Err(format!("counter set {} not found", c.counter_set));
                    }
                    for (counter, amount) in &c.counters {
                        let i = self
                            .index
                            .get(&(c.counter_set.as_str(), counter.as_str()))
                            .ok_or_else(|| {
                                format!(
                                    "counter {counter} not found in counter set {}",
                                    c.counter_set
                                )
                            })?;
                        resolved.push((*i, *amount));
                    }
                }
                if !parsed.consumes.is_empty() {
                    consumers.push((d, resolved));
                }
            }
        }
        Ok(consumers)
    }
}
