//! When first fit may pass a node by without searching it: the node provably has no solution and
//! its search could raise no error. First fit must fail on an error from any node it tries
//! (kube-scheduler's Filter runs the allocator on each node), so a node may not be skipped merely
//! because it lacks free devices: the search evaluates the selectors of every free device it
//! walks past, and one that fails fails the pod. The checks below decide the question from what
//! the search would evaluate; a node they cannot decide is searched.
//!
//! What a search on a node can raise, and why none of it happens on a node passed by:
//! - an `All` request: its devices are collected before the search from every device of the node
//!   (in use or not), on pools that must be complete and valid — plans with one are never passed
//!   by ([`first_fit_may_skip_nodes`]);
//! - admin access may take devices in use, whose selectors the search then evaluates — likewise;
//! - the 32-result limit: for counted requests [`Plan::new`] already refuses a claim over it;
//! - a selector or capacity check that fails on a (slot, candidate) pair ([`PairCheck`]): the
//!   search evaluates only pairs of candidates not in use (a device in use is passed over
//!   first), so the node is passed by only when every such pair evaluates without error. With
//!   fewer free devices than the smallest allocation there are few of them (none on a full node),
//!   and the verdicts are cached for the search of any later node that shares those devices.
//!
//! A node without enough free devices has no solution: without multi-allocatable devices every
//! device the claims take is a different device not in use.

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

/// Whether first fit may pass by the node of `pairs` without searching it (for a plan that
/// [`first_fit_may_skip_nodes`] allows): no multi-allocatable candidate, fewer candidates not in
/// use than `min` (the plan's smallest allocation), and every pair of a plan's slot with such a
/// candidate evaluates without error.
pub(crate) fn first_fit_may_skip(pairs: PairCheck<'_>, state: &AllocatedState, min: usize) -> bool {
    let np = pairs.np;
    if np.has_multi_allocatable {
        return false;
    }
    let free = |pos: &usize| !state.is_in_use(&pairs.inv.devices[np.candidates[*pos]].id);
    let positions = 0..np.candidates.len();
    if positions.clone().filter(free).take(min).count() >= min {
        return false;
    }
    positions
        .filter(free)
        .all(|pos| (0..pairs.plan.slots.len()).all(|slot| pairs.selectable(slot, pos).is_ok()))
}
