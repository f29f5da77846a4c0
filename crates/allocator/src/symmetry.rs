//! Interchangeable candidates, for best-of (topology-aware) search.
//!
//! Two candidates are interchangeable when swapping them in any allocation gives an allocation
//! that is equally valid and scores the same: same pool and counter consumption, same capacities,
//! taints and node selection, both free, same verdict of every request's selectors, same values
//! of every constrained attribute, same topology groups, and the same pair cost to every other
//! candidate. On an 8-GPU NVSwitch node that leaves two classes (one per NUMA node) instead of 8
//! devices, so choosing 4 GPUs explores 5 combinations instead of 70.
//!
//! The search uses the classes like this: within one loop over candidates (one device of one
//! request), once a candidate of a class was tried, later candidates of the same class are
//! skipped — every allocation through them is a relabelling of one already explored. The first
//! solution in first-fit order is never skipped, so best-of search still finds it first.

use crate::constraints::AttrSet;
use crate::error::AllocateError;
use crate::search::NodeSearch;
use crate::topology::pair_cost;

/// More candidates than this and classes are not computed (the pair matrix grows quadratically).
pub(crate) const MAX_CANDIDATES: usize = 64;

/// What must be equal, besides pair costs, for two candidates to be interchangeable.
#[derive(PartialEq)]
struct StaticKey<'a> {
    pool: usize,
    consumes: &'a [(usize, crate::quantity::Amount)],
    capacities: &'a [crate::device::Capacity],
    taints: &'a [k8s_openapi::api::resource::v1::DeviceTaint],
    /// Slice index when node selection is per device or by selector (it shapes the result).
    selection: Option<usize>,
    binds_to_node: bool,
    selectable: Vec<bool>,
    constrained: Vec<Option<AttrSet>>,
    island: Option<u32>,
    group: u32,
    numa: Option<i64>,
}

/// Class index per candidate (`None` when there are too many candidates or none can be shared).
/// Multi-allocatable devices and devices already in use each get a class of their own.
pub(crate) fn classes(search: &mut NodeSearch<'_>) -> Result<Option<Vec<u8>>, AllocateError> {
    let n = search.np.candidates.len();
    if n == 0 || n > MAX_CANDIDATES {
        return Ok(None);
    }
    let mut keys = Vec::with_capacity(n);
    for pos in 0..n {
        let mut selectable = Vec::with_capacity(search.plan.slots.len());
        for slot in 0..search.plan.slots.len() {
            selectable.push(search.selectable(slot, pos)?);
        }
        let dev = search.device(pos);
        let slice = &search.inv.slices[dev.slice];
        let constrained = search
            .plan
            .claims
            .iter()
            .flat_map(|c| &c.constraints)
            .map(|c| dev.attribute(&c.attribute).and_then(AttrSet::of))
            .collect();
        let shareable = !dev.parsed().allow_multiple_allocations && search.free_before(pos);
        keys.push((
            shareable,
            StaticKey {
                pool: search.np.candidate_pool[pos],
                consumes: &search.np.candidate_consumes[pos],
                capacities: &dev.parsed().capacities,
                taints: dev.taints(),
                selection: (slice.per_device_node_selection || slice.node_selector.is_some())
                    .then_some(dev.slice),
                binds_to_node: dev.binds_to_node(),
                selectable,
                constrained,
                island: search.np.topology.island[pos],
                group: search.np.topology.group[pos],
                numa: search.np.topology.numa[pos],
            },
        ));
    }
    let topo: Vec<_> = (0..n).map(|pos| &search.device(pos).topology).collect();
    let cost = |a: usize, b: usize| pair_cost(topo[a], topo[b]);
    let mut representatives: Vec<usize> = Vec::new();
    let mut class = vec![0u8; n];
    for pos in 0..n {
        let same = representatives.iter().position(|&r| {
            keys[pos].0
                && keys[r].0
                && keys[pos].1 == keys[r].1
                && (0..n).all(|x| x == pos || x == r || cost(pos, x) == cost(r, x))
        });
        class[pos] = match same {
            Some(c) => u8::try_from(c).unwrap_or(u8::MAX),
            None => {
                representatives.push(pos);
                u8::try_from(representatives.len() - 1).unwrap_or(u8::MAX)
            }
        };
    }
    Ok(Some(class))
}
