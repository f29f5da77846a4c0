//! When first fit may pass a node by without searching it: the node is *quiet* (its search
//! provably raises no error) and either has too few free devices to fit or does not matter for
//! the node chosen. First fit must fail on an error from any node it tries (kube-scheduler's
//! Filter runs the allocator on each node), so a node may not be skipped merely because it lacks
//! free devices: the search evaluates the selectors of every free device it walks past, and one
//! that fails fails the pod. The checks below decide the question from what the search would
//! evaluate; a node they cannot decide is searched.
//!
//! What a search on a node can raise, and why none of it happens on a node passed by:
//! - an `All` request: its devices are collected before the search from every device of the node
//!   (in use or not), on pools that must be complete and valid — plans with one are never passed
//!   by ([`first_fit_may_skip_nodes`]);
//! - admin access may take devices in use, whose selectors the search then evaluates — likewise;
//! - the 32-result limit: for counted requests [`Plan::new`] already refuses a claim over it;
//! - a selector or capacity check that fails on a (slot, candidate) pair ([`PairCheck`]): the
//!   search evaluates only pairs of candidates not in use (a device in use is passed over
//!   first), so a node is quiet only when every such pair evaluates without error (on a full
//!   node there are none; class selector verdicts are cached per device);
//! - the step budget: a search passed by is not run, so it cannot exhaust the budget. Upstream
//!   has no step budget; on a quiet node its search ends without a solution or with one, never
//!   with an error, which is what passing the node by assumes.
//!
//! A quiet node without enough free devices has no solution: without multi-allocatable devices
//! every device the claims take is a different device not in use. A quiet node with enough may
//! fit; first fit needs to know only once it has found its node and must still try further nodes
//! for errors (`DeviceIndex::search_nodes` defers those searches until a node that is not quiet
//! needs the count of nodes that fit).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use crate::request::{Plan, Wanted};
use crate::state::AllocatedState;

use super::pair::PairCheck;

/// Whether first fit may pass nodes by for this plan at all: every request counts its devices and
/// none asks for admin access.
pub(crate) fn first_fit_may_skip_nodes(plan: &Plan<'_>) -> bool {
    plan.slots
        .iter()
        .all(|s| !s.admin_access && s.wanted != Wanted::All)
}

/// What the checks before a first-fit search say of a node whose search can raise no error (see
/// [`quiet_node`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QuietNode {
    /// Fewer candidates not in use than the plan's smallest allocation: no solution.
    TooFewFree,
    /// Enough free candidates: the search may or may not find a solution, and raises no error.
    MayFit,
}

/// Whether a first-fit search of the node of `pairs` can raise no error (for a plan that
/// [`first_fit_may_skip_nodes`] allows), and if so whether it has too few free candidates for
/// `min` devices (the plan's smallest allocation). `None`: a search could raise an error — a
/// multi-allocatable candidate (the search also evaluates candidates shared already), or a pair
/// of one of the plan's slots with a candidate not in use whose selector or capacity check fails.
/// With `always_quiet` ([`always_quiet`] said so) only the free candidates are counted.
pub(crate) fn quiet_node(
    pairs: PairCheck<'_>,
    state: &AllocatedState,
    min: usize,
    always_quiet: bool,
) -> Option<QuietNode> {
    let np = pairs.np;
    if np.has_multi_allocatable {
        return None;
    }
    let mut free = 0usize;
    for pos in 0..np.candidates.len() {
        if state.is_in_use(&pairs.inv.devices[np.candidates[pos]].id) {
            continue;
        }
        free += 1;
        if always_quiet {
            if free >= min {
                return Some(QuietNode::MayFit);
            }
        } else if !quiet_candidate(pairs, pos) {
            return None;
        }
    }
    Some(if free < min {
        QuietNode::TooFewFree
    } else {
        QuietNode::MayFit
    })
}

/// Whether the node of `pairs` is quiet whatever is in use: no candidate is multi-allocatable
/// and every pair of a plan's slot with any candidate (in use or not) evaluates without error.
/// It depends on the plan's requests and the inventory only, so it is kept per claim shape
/// ([`QuietNodes`]).
pub(crate) fn always_quiet(pairs: PairCheck<'_>) -> bool {
    !pairs.np.has_multi_allocatable
        && (0..pairs.np.candidates.len()).all(|pos| quiet_candidate(pairs, pos))
}

fn quiet_candidate(pairs: PairCheck<'_>, pos: usize) -> bool {
    (0..pairs.plan.slots.len()).all(|slot| pairs.selectable(slot, pos).is_ok())
}

/// Distinct claim shapes whose [`always_quiet`] verdicts are kept at a time.
const SHAPES_KEPT: usize = 32;

/// Per node, whether it is [`always_quiet`] for one claim shape, decided on first need.
pub(crate) type QuietVerdicts = Arc<[OnceLock<bool>]>;

/// The [`QuietVerdicts`] of recent claim shapes, by the claims' requests (`verdicts::plan_key`):
/// first fit over many nodes asks every node for every claim, and claims made from one template
/// share their verdicts.
#[derive(Debug, Default)]
pub(crate) struct QuietNodes {
    shapes: HashMap<String, QuietVerdicts>,
}

impl QuietNodes {
    /// The verdicts of the shape `key` on `nodes` nodes (all forgotten when too many shapes are
    /// kept: a cluster's claims come from few templates).
    pub fn shape(&mut self, key: String, nodes: usize) -> QuietVerdicts {
        if !self.shapes.contains_key(&key) && self.shapes.len() >= SHAPES_KEPT {
            self.shapes.clear();
        }
        self.shapes
            .entry(key)
            .or_insert_with(|| (0..nodes).map(|_| OnceLock::new()).collect())
            .clone()
    }
}
