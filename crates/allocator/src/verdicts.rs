//! Per-node search results kept between topology-aware allocations on one
//! [`crate::DeviceIndex`], so that choosing a node among thousands costs a search only on the nodes
//! whose devices in use changed since the last claim of the same shape, and a comparison on the
//! others.
//!
//! What a node's search reads is fixed by three things: the inventory (immutable; the cache lives
//! in it and goes with it), the claims' requests (the *plan key*: the claims' `spec.devices`,
//! names left out, plus the step budget and the NUMA policy, which changes the score), and the part of the [`AllocatedState`] that concerns the
//! node — whether each candidate is allocated (exclusively or shared, with what it consumes) and
//! whether each device consuming its pools' counters is (the node's [`NodeUse`]). A node whose
//! use matches the stored one gets the stored result without a search.
//!
//! The stored result is the node's best solution found *without* a bound from earlier nodes (the
//! node's minimum score, first in enumeration order among equals), and the bounded search the
//! caller would have run is answered from it exactly: a best solution whose communication cost
//! is within the bound is what the bounded search returns (its pruning only removes branches whose
//! cost exceeds the bound, and the bound never prunes a prefix of that solution); above the bound,
//! the bounded search finds nothing. The cases where that reasoning does not hold are left to the
//! live search: `firstAvailable` requests (a pruned subrequest stops the later ones), searches
//! stopped at the step budget, and searches that fail with an error (the unbounded search reaches
//! candidates the bounded one may not).
//!
//! Hand-written: the cache is specific to this search; no crate does it.

use std::collections::{HashMap, VecDeque};

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::cluster::Cluster;
use crate::device::DeviceId;
use crate::pools::NodePools;
use crate::search::Solution;
use crate::state::{AllocatedState, SharedUse};
use crate::topology::NumaPolicy;

/// Distinct claim shapes kept at a time (least recently used dropped first).
const PLANS_KEPT: usize = 32;

/// What of the allocated state one node's search reads.
#[derive(Debug, PartialEq)]
pub(crate) struct NodeUse {
    /// Per candidate: 0 free, 1 allocated exclusively, 2 shared, 3 both.
    candidates: Vec<u8>,
    /// The shared allocations of the candidates that have some, by candidate position.
    shared: Vec<(usize, SharedUse)>,
    /// Per pool, per device consuming its counters: whether it is in use.
    consumers: Vec<bool>,
}

fn use_code(state: &AllocatedState, id: &DeviceId) -> u8 {
    u8::from(state.is_dedicated(id)) | (u8::from(state.shared(id).is_some()) << 1)
}

impl NodeUse {
    pub fn of(inv: &Cluster, np: &NodePools, state: &AllocatedState) -> NodeUse {
        let mut shared = Vec::new();
        let candidates = np
            .candidates
            .iter()
            .enumerate()
            .map(|(pos, &d)| {
                let id = &inv.devices[d].id;
                if let Some(s) = state.shared(id) {
                    shared.push((pos, s.clone()));
                }
                use_code(state, id)
            })
            .collect();
        NodeUse {
            candidates,
            shared,
            consumers: consumers(inv, np).map(|id| state.is_in_use(id)).collect(),
        }
    }

    /// Whether `state` gives the node this use (without building a new [`NodeUse`]).
    pub fn matches(&self, inv: &Cluster, np: &NodePools, state: &AllocatedState) -> bool {
        if self.candidates.len() != np.candidates.len() {
            return false;
        }
        let mut shared = self.shared.iter();
        for (pos, (&d, &code)) in np.candidates.iter().zip(&self.candidates).enumerate() {
            let id = &inv.devices[d].id;
            if use_code(state, id) != code {
                return false;
            }
            if code & 2 != 0 {
                match (shared.next(), state.shared(id)) {
                    (Some((at, stored)), Some(now)) if *at == pos && stored == now => {}
                    _ => return false,
                }
            }
        }
        let mut stored = self.consumers.iter();
        for id in consumers(inv, np) {
            if stored.next() != Some(&state.is_in_use(id)) {
                return false;
            }
        }
        stored.next().is_none()
    }
}

fn consumers<'i>(inv: &'i Cluster, np: &'i NodePools) -> impl Iterator<Item = &'i DeviceId> {
    np.pools
        .iter()
        .flat_map(|p| &p.consumers)
        .map(|(d, _)| &inv.devices[*d].id)
}

/// The stamps of the node's pools in `state` ([`AllocatedState`]'s stamps), in pool order.
pub(crate) fn pool_stamps<'s>(
    np: &'s NodePools,
    state: &'s AllocatedState,
) -> impl Iterator<Item = u64> + 's {
    np.pools.iter().map(|p| state.pool_stamp(&p.name))
}

/// One node's stored result.
#[derive(Debug)]
pub(crate) struct Stored {
    pub uses: NodeUse,
    /// The stamps of the node's pools when `uses` was last found to hold: while they are the
    /// same, it still holds without comparing devices.
    pub stamps: Vec<u64>,
    /// The node's best solution without a bound, `None` when nothing fits (or too few devices are
    /// free to try).
    pub solution: Option<Solution>,
}

/// The stored results of one claim shape, by node position.
#[derive(Debug, Default)]
pub(crate) struct PlanResults {
    pub nodes: Vec<Option<Stored>>,
}

/// The stored results of the recently used claim shapes.
#[derive(Debug, Default)]
pub(crate) struct VerdictCache {
    plans: HashMap<String, PlanResults>,
    /// Plan keys, least recently used first.
    order: VecDeque<String>,
}

impl VerdictCache {
    /// The results stored for `key`, created empty for `nodes` nodes when new.
    pub fn plan(&mut self, key: String, nodes: usize) -> &mut PlanResults {
        if let Some(i) = self.order.iter().position(|k| *k == key) {
            if let Some(k) = self.order.remove(i) {
                self.order.push_back(k);
            }
        } else {
            if self.order.len() >= PLANS_KEPT
                && let Some(old) = self.order.pop_front()
            {
                self.plans.remove(&old);
            }
            self.order.push_back(key.clone());
        }
        let results = self.plans.entry(key).or_default();
        if results.nodes.len() != nodes {
            results.nodes = (0..nodes).map(|_| None).collect();
        }
        results
    }
}

/// The key of a set of claims' requests: their `spec.devices` (not their names: claims made from
/// one template share the key), the step budget and the NUMA policy (a stored solution is the
/// best under the policy it was searched with). The `Debug` form is complete and deterministic
/// (k8s-openapi maps are `BTreeMap`s).
pub(crate) fn plan_key<'c>(
    claims: impl Iterator<Item = &'c ResourceClaim>,
    step_budget: u64,
    numa: NumaPolicy,
) -> String {
    let specs: Vec<_> = claims
        .map(|c| c.spec.as_ref().and_then(|s| s.devices.as_ref()))
        .collect();
    format!("{step_budget}:{numa}:{specs:?}")
}
