//! What one node sees of the cluster's slices, as the API documents pools: the slices published
//! for the node (by name, for all nodes, by a node selector, or per device), grouped into pools by
//! driver and pool name, only the highest generation of each; a pool whose slices are not all
//! there is incomplete (or, when another node holds a newer generation, gone); duplicate device
//! names and references to counter sets or counters that do not exist make a pool invalid. Pools
//! are ordered by driver and name, pools with binding conditions last; within a pool, slices by
//! name and devices as listed — the order first fit tries them in.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};

use super::quantity::Nanos;
use super::state::{DeviceKey, State};
use super::stop::{Beyond, beyond, quantity};

/// Whether a pool's devices can be allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolState {
    Usable,
    Incomplete,
    Invalid,
}

/// A pool as one node sees it.
#[derive(Debug)]
pub struct Pool {
    pub driver: String,
    pub name: String,
    pub state: PoolState,
    /// What is left after the devices in use.
    pub available: CountersLeft,
}

/// Counter set → counter → what is left after the devices in use (may be negative).
pub type CountersLeft = BTreeMap<String, BTreeMap<String, Nanos>>;

/// A device first fit may try on the node: the devices of the device slices of usable pools
/// (per-device node selection is checked with the selectors, as a device's own property).
#[derive(Debug)]
pub struct Candidate<'a> {
    pub pool: usize,
    /// The slice and device positions in the instance (the selector table's key).
    pub slice_index: usize,
    pub device_index: usize,
    pub slice: &'a ResourceSlice,
    pub device: &'a Device,
    pub key: DeviceKey,
}

/// The pools and candidates of one node, in first-fit order.
#[derive(Debug)]
pub struct NodeView<'a> {
    pub pools: Vec<Pool>,
    pub candidates: Vec<Candidate<'a>>,
}

/// One pool's slices at its highest generation for the node, with their instance positions.
struct Gathered<'a> {
    driver: &'a str,
    pool: &'a str,
    generation: i64,
    declared: i64,
    slices: Vec<(usize, &'a ResourceSlice)>,
}

/// The node's pools and candidates.
pub fn node_view<'a>(
    slices: &'a [ResourceSlice],
    node: &Node,
    state: &State,
) -> Result<NodeView<'a>, Beyond> {
    let mut plain = Vec::new();
    let mut binding = Vec::new();
    for g in gather(slices, node)? {
        let Some((pool, devices)) = build(g, slices, state)? else {
            continue; // a newer generation elsewhere: the pool is gone
        };
        let has_binding = devices
            .iter()
            .any(|(_, _, _, d)| d.binding_conditions.is_some());
        if has_binding {
            binding.push((pool, devices));
        } else {
            plain.push((pool, devices));
        }
    }
    let by_id =
        |a: &(Pool, _), b: &(Pool, _)| (&a.0.driver, &a.0.name).cmp(&(&b.0.driver, &b.0.name));
    plain.sort_by(by_id);
    binding.sort_by(by_id);
    let mut view = NodeView {
        pools: Vec::new(),
        candidates: Vec::new(),
    };
    for (pool, devices) in plain.into_iter().chain(binding) {
        let position = view.pools.len();
        if pool.state == PoolState::Usable {
            for (slice_index, device_index, slice, device) in devices {
                view.candidates.push(Candidate {
                    pool: position,
                    slice_index,
                    device_index,
                    slice,
                    device,
                    key: DeviceKey::new(&pool.driver, &pool.name, &device.name),
                });
            }
        }
        view.pools.push(pool);
    }
    Ok(view)
}

/// The pools the node sees, each with its slices of the highest generation published for the
/// node: node-local slices first, then the others, each in the instance's order (the first slice
/// of a pool's highest generation supplies the declared slice count).
fn gather<'a>(slices: &'a [ResourceSlice], node: &Node) -> Result<Vec<Gathered<'a>>, Beyond> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let local = slices
        .iter()
        .enumerate()
        .filter(|(_, s)| s.spec.node_name.as_deref().is_some_and(|n| n == name));
    let shared = slices
        .iter()
        .enumerate()
        .filter(|(_, s)| s.spec.node_name.as_deref().unwrap_or_default().is_empty());
    let mut gathered: Vec<Gathered<'a>> = Vec::new();
    for (index, slice) in local.chain(shared) {
        if !relevant(slice, node)? {
            continue;
        }
        let spec = &slice.spec;
        let generation = spec.pool.generation;
        match gathered
            .iter_mut()
            .find(|g| g.driver == spec.driver && g.pool == spec.pool.name)
        {
            None => gathered.push(Gathered {
                driver: &spec.driver,
                pool: &spec.pool.name,
                generation,
                declared: spec.pool.resource_slice_count,
                slices: vec![(index, slice)],
            }),
            Some(g) if generation > g.generation => {
                g.generation = generation;
                g.declared = spec.pool.resource_slice_count;
                g.slices = vec![(index, slice)];
            }
            Some(g) if generation == g.generation => g.slices.push((index, slice)),
            Some(_) => {}
        }
    }
    Ok(gathered)
}

type Devices<'a> = Vec<(usize, usize, &'a ResourceSlice, &'a Device)>;

/// Where a gathered pool's slices that are not for the node stand.
enum Elsewhere<'a> {
    /// Another node holds a newer generation: the pool is being replaced.
    Replaced,
    /// The pool's generation lacks some of its declared slices.
    Incomplete,
    /// The pool's slices of the same generation that are not for this node (counters, and
    /// devices consuming them).
    Slices(Vec<&'a ResourceSlice>),
}

/// The pool's slices that are not for this node, when the node does not see all of them.
fn elsewhere<'a>(g: &Gathered<'a>, all: &'a [ResourceSlice]) -> Elsewhere<'a> {
    if i64::try_from(g.slices.len()).ok() == Some(g.declared) {
        return Elsewhere::Slices(Vec::new());
    }
    let same_pool = |s: &&ResourceSlice| s.spec.driver == g.driver && s.spec.pool.name == g.pool;
    if all
        .iter()
        .filter(same_pool)
        .any(|s| s.spec.pool.generation > g.generation)
    {
        return Elsewhere::Replaced;
    }
    let at_generation: Vec<&ResourceSlice> = all
        .iter()
        .filter(same_pool)
        .filter(|s| s.spec.pool.generation == g.generation)
        .collect();
    if i64::try_from(at_generation.len()).ok() != Some(g.declared) {
        return Elsewhere::Incomplete;
    }
    let names: HashSet<&str> = g
        .slices
        .iter()
        .filter_map(|(_, s)| s.metadata.name.as_deref())
        .collect();
    Elsewhere::Slices(
        at_generation
            .into_iter()
            .filter(|s| !names.contains(s.metadata.name.as_deref().unwrap_or_default()))
            .collect(),
    )
}

fn is_counter_slice(s: &ResourceSlice) -> bool {
    s.spec
        .shared_counters
        .as_ref()
        .is_some_and(|c| !c.is_empty())
}

/// A gathered pool as a [`Pool`] and its devices in order; `None` when another node holds a
/// newer generation (the pool is being replaced).
fn build<'a>(
    g: Gathered<'a>,
    all: &'a [ResourceSlice],
    state: &State,
) -> Result<Option<(Pool, Devices<'a>)>, Beyond> {
    let mut pool = Pool {
        driver: g.driver.to_owned(),
        name: g.pool.to_owned(),
        state: PoolState::Usable,
        available: BTreeMap::new(),
    };
    let elsewhere = match elsewhere(&g, all) {
        Elsewhere::Replaced => return Ok(None),
        Elsewhere::Incomplete => {
            pool.state = PoolState::Incomplete;
            return Ok(Some((pool, Vec::new())));
        }
        Elsewhere::Slices(slices) => slices,
    };
    let mut for_node = g.slices;
    for_node.sort_by(|a, b| a.1.metadata.name.cmp(&b.1.metadata.name));
    let devices: Devices<'a> = for_node
        .iter()
        .filter(|(_, s)| !is_counter_slice(s))
        .flat_map(|&(i, s)| {
            s.spec
                .devices
                .iter()
                .flatten()
                .enumerate()
                .map(move |(j, d)| (i, j, s, d))
        })
        .collect();
    let mut names = HashSet::new();
    if !devices
        .iter()
        .all(|(_, _, _, d)| names.insert(d.name.as_str()))
    {
        pool.state = PoolState::Invalid;
        return Ok(Some((pool, Vec::new())));
    }
    let counter_slices = for_node
        .iter()
        .map(|(_, s)| *s)
        .chain(elsewhere.iter().copied())
        .filter(|s| is_counter_slice(s));
    let every_device: Vec<&Device> = devices
        .iter()
        .map(|(_, _, _, d)| *d)
        .chain(
            elsewhere
                .iter()
                .filter(|s| !is_counter_slice(s))
                .flat_map(|s| s.spec.devices.iter().flatten()),
        )
        .collect();
    match counters_left(counter_slices, &every_device, (g.driver, g.pool), state)? {
        Some(available) => pool.available = available,
        None => {
            pool.state = PoolState::Invalid;
            return Ok(Some((pool, Vec::new())));
        }
    }
    Ok(Some((pool, devices)))
}

/// The pool's counter sets less what its devices in use (on this node or not) have consumed;
/// `None` when the pool is invalid (a set defined twice, a device consuming a counter no set
/// defines).
fn counters_left<'a>(
    counter_slices: impl Iterator<Item = &'a ResourceSlice>,
    every_device: &[&Device],
    (driver, pool): (&str, &str),
    state: &State,
) -> Result<Option<CountersLeft>, Beyond> {
    let mut sets = CountersLeft::new();
    for set in counter_slices.flat_map(|s| s.spec.shared_counters.iter().flatten()) {
        let counters = set
            .counters
            .iter()
            .map(|(n, c)| Ok((n.clone(), quantity(&c.value)?)))
            .collect::<Result<BTreeMap<_, _>, Beyond>>()?;
        if sets.insert(set.name.clone(), counters).is_some() {
            return Ok(None);
        }
    }
    for device in every_device {
        for consumption in device.consumes_counters.iter().flatten() {
            let known = sets
                .get(&consumption.counter_set)
                .is_some_and(|set| consumption.counters.keys().all(|c| set.contains_key(c)));
            if !known {
                return Ok(None);
            }
        }
    }
    for device in every_device {
        if !state.is_in_use(&DeviceKey::new(driver, pool, &device.name)) {
            continue;
        }
        for consumption in device.consumes_counters.iter().flatten() {
            let Some(set) = sets.get_mut(&consumption.counter_set) else {
                continue;
            };
            for (name, c) in &consumption.counters {
                let used = quantity(&c.value)?;
                if let Some(left) = set.get_mut(name) {
                    *left = *left - used;
                }
            }
        }
    }
    Ok(Some(sets))
}

/// Whether a slice is published for the node (per-device slices: whether any device is).
fn relevant(slice: &ResourceSlice, node: &Node) -> Result<bool, Beyond> {
    let spec = &slice.spec;
    let name = spec.node_name.as_deref().unwrap_or_default();
    let all = spec.all_nodes.unwrap_or(false);
    if !name.is_empty() || all || spec.node_selector.is_some() {
        return node_matches(node, name, all, spec.node_selector.as_ref());
    }
    if spec.per_device_node_selection.unwrap_or(false) {
        for device in spec.devices.iter().flatten() {
            if device_on_node(device, node)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Whether a device of a per-device slice is on the node.
pub fn device_on_node(device: &Device, node: &Node) -> Result<bool, Beyond> {
    node_matches(
        node,
        device.node_name.as_deref().unwrap_or_default(),
        device.all_nodes.unwrap_or(false),
        device.node_selector.as_ref(),
    )
}

/// A node name, all nodes, or a node selector (terms ORed, requirements ANDed; label
/// requirements with In, NotIn, Exists, DoesNotExist — anything else is beyond the reference).
fn node_matches(
    node: &Node,
    name: &str,
    all: bool,
    selector: Option<&NodeSelector>,
) -> Result<bool, Beyond> {
    if !name.is_empty() {
        return Ok(node.metadata.name.as_deref() == Some(name));
    }
    if all {
        return Ok(true);
    }
    let Some(selector) = selector else {
        return Ok(false);
    };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for term in &selector.node_selector_terms {
        if term.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
            return Err(beyond("a node selector with matchFields"));
        }
        let requirements = term.match_expressions.as_deref().unwrap_or_default();
        if requirements.is_empty() {
            continue; // an empty term matches nothing
        }
        let mut all_hold = true;
        for r in requirements {
            all_hold &= requirement_holds(r, &labels)?;
        }
        if all_hold {
            return Ok(true);
        }
    }
    Ok(false)
}

fn requirement_holds(
    r: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Result<bool, Beyond> {
    let values = r.values.as_deref().unwrap_or_default();
    let value = labels.get(&r.key);
    match r.operator.as_str() {
        "In" if !values.is_empty() => Ok(value.is_some_and(|v| values.contains(v))),
        "NotIn" if !values.is_empty() => Ok(!value.is_some_and(|v| values.contains(v))),
        "Exists" if values.is_empty() => Ok(value.is_some()),
        "DoesNotExist" if values.is_empty() => Ok(value.is_none()),
        other => Err(beyond(&format!("node selector operator {other}"))),
    }
}
