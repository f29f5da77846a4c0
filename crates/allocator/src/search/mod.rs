//! The depth-first search over claims → requests → devices on one node, with upstream semantics
//! (`allocateOne` in k8s.io/dynamic-resource-allocation/structured, incubating variant).
//!
//! The recursion is upstream's, call for call: candidates are tried in first-fit order (pool,
//! slice, device); within one request only combinations are tried, never permutations; a
//! `firstAvailable` request tries its subrequests in order; `All` requests take their devices,
//! fixed when the search starts, in order; a claim whose results would pass the 32-result limit
//! makes the search back off as upstream's `errAllocationResultMaxSizeExceeded` does. Each
//! candidate is checked in upstream's order (in use, selectors and per-device node selection,
//! capacity, then counters, taints and constraints), so the first solution is upstream's and so
//! are the selector evaluations that fail on the way to it.
//!
//! What ends a search is not a step budget but pruning (module `prune`): once the search has had
//! to backtrack, every call first asks whether what is left can still be satisfied by the
//! remaining candidates (counts, per-device availability, counters, capacity, constraints) and
//! whether the same situation already failed; a subtree that cannot hold a solution is skipped.
//! Pruning only ever removes subtrees without a solution, and only on nodes where no skipped
//! candidate could have raised an error, so first fit still returns exactly what upstream
//! returns, usually after far fewer calls. A bound remains ([`crate::DEFAULT_STEP_BUDGET`] calls
//! of `allocate_one`, counted as upstream counts `allocateOne`); it is set where upstream's own
//! 10 s Filter timeout would have stopped it first.
//!
//! First fit stops at the first complete solution. Best-of search (topology-aware mode) goes on
//! enumerating and keeps the solution with the lowest [`TopologyScore`]; it prunes a branch as soon
//! as its communication cost (which only grows as devices are added) exceeds the best found, and it
//! finds the first-fit solution first, so it is never worse than first fit. At the bound it keeps
//! the best so far.
//!
//! Submodules: `pair` (the checks of a (slot, candidate) pair that can fail the allocation),
//! `state` (one node's search), `candidate` and `prune` (its checks and pruning), `skip` (which
//! nodes first fit may pass by without a search).

mod pair;
mod state;

mod candidate;
mod prune;
mod skip;

use std::collections::{BTreeMap, HashMap};

use crate::cluster::Cluster;
use crate::constraints::ConstraintState;
use crate::device::DeviceEntry;
use crate::error::AllocateError;
use crate::pools::{NodePools, PoolStatus};
use crate::quantity::Amount;
use crate::request::{MAX_RESULTS_PER_CLAIM, Plan, Wanted};
use crate::state::AllocatedState;
use crate::topology::{NumaPolicy, TopologyScore};

pub(crate) use pair::PairCheck;
pub(crate) use skip::{
    QuietNode, QuietNodes, QuietVerdicts, always_quiet, first_fit_may_skip_nodes, quiet_node,
};
use state::{Check, Flow, Position, Pruning, Selectable, Stop};
pub(crate) use state::{NodeSearch, NodeVerdict, Pick, SearchMode, Solution};

impl<'a> NodeSearch<'a> {
    /// The search, scoring NUMA alignment by `numa` (default [`NumaPolicy::Align`]).
    pub fn with_numa(mut self, numa: NumaPolicy) -> NodeSearch<'a> {
        self.numa = numa;
        self
    }

    pub fn new(
        inv: &'a Cluster,
        np: &'a NodePools,
        state: &'a AllocatedState,
        plan: &'a Plan<'a>,
        mode: SearchMode,
        budget: u64,
    ) -> Result<NodeSearch<'a>, AllocateError> {
        let n = np.candidates.len();
        let mut search = NodeSearch {
            inv,
            np,
            state,
            plan,
            mode,
            numa: NumaPolicy::default(),
            budget,
            steps: 0,
            need: vec![0; plan.slots.len()],
            all_devices: vec![Vec::new(); plan.slots.len()],
            selectable_cache: vec![vec![Selectable::Unknown; n]; plan.slots.len()],
            failures: HashMap::new(),
            free_before: np
                .candidates
                .iter()
                .map(|&d| !state.is_in_use(&inv.devices[d].id))
                .collect(),
            taken_by: vec![Vec::new(); n],
            run_shares: vec![0; n],
            run_capacity: vec![BTreeMap::new(); n],
            counters_left: np
                .pools
                .iter()
                .map(|p| counters_left(inv, state, p))
                .collect(),
            counters_used: np
                .pools
                .iter()
                .map(|p| vec![Amount::ZERO; p.counter_totals.len()])
                .collect(),
            constraints: plan
                .claims
                .iter()
                .map(|c| {
                    c.constraints
                        .iter()
                        .cloned()
                        .map(ConstraintState::new)
                        .collect()
                })
                .collect(),
            picks: vec![Vec::new(); plan.claims.len()],
            selected: plan
                .claims
                .iter()
                .map(|c| vec![0; c.requests.len()])
                .collect(),
            chosen: Vec::new(),
            comm_cost: 0,
            best: None,
            solutions: 0,
            pruned: 0,
            classes: None,
            prune: Pruning::default(),
        };
        search.count_needs()?;
        Ok(search)
    }

    /// Upstream's checks before the search, in its order: claim by claim, request by request,
    /// how many devices each (sub)request needs here (`All`: every matching device of complete,
    /// valid pools, which evaluates the selectors on all of them), and that the smallest number
    /// a claim can get by with stays within the 32-result limit.
    fn count_needs(&mut self) -> Result<(), AllocateError> {
        for claim in &self.plan.claims {
            let mut min_claim = 0usize;
            for request in &claim.requests {
                let mut min_request = usize::MAX;
                for &si in &request.slots {
                    let need = match self.plan.slots[si].wanted {
                        Wanted::Count(c) => c,
                        Wanted::All => {
                            self.collect_all(si)?;
                            self.all_devices[si].len()
                        }
                    };
                    self.need[si] = need;
                    min_request = min_request.min(need);
                }
                if min_request > MAX_RESULTS_PER_CLAIM - min_claim {
                    return Err(AllocateError::TooManyDevices {
                        claim: claim.name.clone(),
                        count: min_claim.saturating_add(min_request),
                        limit: MAX_RESULTS_PER_CLAIM,
                    });
                }
                min_claim += min_request;
            }
        }
        Ok(())
    }

    /// The devices an `All` slot must take on this node: every selectable candidate whose
    /// capacity could hold the request on an idle device (what is already consumed is checked
    /// when the device is taken, so a used-up device makes the request fail), from pools that
    /// must all be complete and valid.
    fn collect_all(&mut self, si: usize) -> Result<(), AllocateError> {
        let slot = &self.plan.slots[si];
        for (pi, pool) in self.np.pools.iter().enumerate() {
            let why = match pool.status {
                PoolStatus::Usable => {
                    for pos in 0..self.np.candidates.len() {
                        if self.np.candidate_pool[pos] != pi {
                            continue;
                        }
                        if self.selectable(si, pos)? && self.static_capacity_fits(si, pos) {
                            self.all_devices[si].push(pos);
                        }
                    }
                    continue;
                }
                PoolStatus::Incomplete { .. } => "being updated",
                PoolStatus::Invalid(_) => "invalid",
            };
            return Err(AllocateError::AllOnUnusablePool {
                claim: self.plan.claims[slot.claim].name.clone(),
                request: slot.full_name.clone(),
                pool: pool.id(),
                why,
            });
        }
        Ok(())
    }

    /// Whether a candidate was free before this allocation.
    pub fn free_before(&self, pos: usize) -> bool {
        self.free_before[pos]
    }

    /// Devices each slot needs on this node.
    pub fn need(&self, slot: usize) -> usize {
        self.need[slot]
    }

    pub fn run(mut self) -> Result<NodeVerdict, AllocateError> {
        if matches!(self.mode, SearchMode::Best { .. }) {
            self.classes = crate::symmetry::classes(&mut self)?;
        }
        let outcome = self.allocate_one(0, 0, None, 0, 0);
        let truncated = match outcome {
            Ok(_) => false,
            Err(Stop::Error(e)) => return Err(e),
            Err(Stop::Budget) if self.best.is_some() => true,
            Err(Stop::Budget) => {
                return Err(AllocateError::SearchBudgetExhausted {
                    claims: self
                        .plan
                        .claims
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    node: self.np.node.name.clone(),
                    steps: self.steps,
                    budget: self.budget,
                });
            }
        };
        Ok(NodeVerdict {
            solution: self.best,
            steps: self.steps,
            truncated,
        })
    }

    pub(crate) fn device(&self, pos: usize) -> &'a DeviceEntry {
        &self.inv.devices[self.np.candidates[pos]]
    }

    fn allocate_one(
        &mut self,
        claim: usize,
        request: usize,
        in_slot: Option<usize>,
        device: usize,
        start: usize,
    ) -> Result<Flow, Stop> {
        self.steps += 1;
        if self.steps > self.budget {
            return Err(Stop::Budget);
        }
        if claim == self.plan.claims.len() {
            return Ok(self.complete());
        }
        let claim_plan = &self.plan.claims[claim];
        if request == claim_plan.requests.len() {
            let flow = self.allocate_one(claim + 1, 0, None, 0, 0)?;
            // Not fatal: another allocation of this claim may pick a subrequest with fewer devices.
            return Ok(if flow == Flow::MaxSize {
                Flow::NotFound
            } else {
                flow
            });
        }
        let plan_request = &claim_plan.requests[request];
        let slot = match in_slot {
            Some(s) => s,
            None if plan_request.first_available => return self.try_subrequests(claim, request),
            None => plan_request.slots[0],
        };
        let need = self.need[slot];
        let is_all = self.plan.slots[slot].wanted == Wanted::All;
        if is_all && need == 0 {
            return Ok(Flow::NotFound);
        }
        if device >= need {
            return self.allocate_one(claim, request + 1, None, 0, 0);
        }
        if self.picks[claim].len() + need - device > MAX_RESULTS_PER_CLAIM {
            return Ok(Flow::MaxSize);
        }
        let at = Position {
            claim,
            request,
            slot,
            in_slot,
            device,
        };
        let memo = match self.pruned_before(at, start)? {
            Check::Skip(flow) => return Ok(flow),
            Check::Search(memo) => memo,
        };
        let flow = if is_all {
            self.take_next_of_all(at)?
        } else {
            self.try_candidates(at, start)?
        };
        if let Some(key) = memo {
            self.remember(key, flow);
        }
        Ok(flow)
    }

    /// `All`: the devices are known; take the next one or fail.
    fn take_next_of_all(&mut self, at: Position) -> Result<Flow, Stop> {
        let pos = self.all_devices[at.slot][at.device];
        let Some(undo) = self.try_allocate(at.claim, at.slot, pos, true)? else {
            return Ok(Flow::NotFound);
        };
        if self.beyond_bound() {
            self.undo(undo);
            self.pruned += 1;
            return Ok(Flow::NotFound);
        }
        let flow = self.allocate_one(at.claim, at.request, at.in_slot, at.device + 1, 0);
        if !matches!(flow, Ok(Flow::Found)) {
            self.undo(undo);
        }
        flow
    }

    /// One device of a counted request: every candidate from `start` on, in first-fit order.
    fn try_candidates(&mut self, at: Position, start: usize) -> Result<Flow, Stop> {
        let Position {
            claim,
            request,
            slot,
            in_slot,
            device,
        } = at;
        let need = self.need[slot];
        let n = self.np.candidates.len();
        let admin = self.plan.slots[slot].admin_access;
        let mut tried_classes = 0u64;
        for pos in start..n {
            // Not enough candidates left for the rest of this request: no combination can work
            // (skipping them is only allowed where none of them could fail a selector).
            if n - pos < need - device && self.may_prune() {
                break;
            }
            if admin && self.taken_by[pos].contains(&claim) {
                continue;
            }
            if !admin && self.in_use(pos) {
                continue;
            }
            if !self.selectable(slot, pos)? {
                continue;
            }
            if self.capacity_fits(slot, pos).is_err() {
                continue;
            }
            if let Some(classes) = self.classes.as_ref().filter(|_| !admin) {
                let bit = 1u64 << (classes[pos] % 64);
                if tried_classes & bit != 0 {
                    continue;
                }
                tried_classes |= bit;
            }
            let Some(undo) = self.try_allocate(claim, slot, pos, false)? else {
                continue;
            };
            if self.beyond_bound() {
                self.undo(undo);
                self.pruned += 1;
                continue;
            }
            let flow = self.allocate_one(claim, request, in_slot, device + 1, pos + 1)?;
            if flow == Flow::Found {
                return Ok(Flow::Found);
            }
            self.undo(undo);
            if flow == Flow::MaxSize {
                return Ok(Flow::MaxSize);
            }
        }
        Ok(Flow::NotFound)
    }

    fn try_subrequests(&mut self, claim: usize, request: usize) -> Result<Flow, Stop> {
        let mut all_too_many = true;
        let slots = self.plan.claims[claim].requests[request].slots.clone();
        for (index, slot) in slots.into_iter().enumerate() {
            self.selected[claim][request] = index;
            let (solutions, pruned) = (self.solutions, self.pruned);
            match self.allocate_one(claim, request, Some(slot), 0, 0)? {
                Flow::MaxSize => continue,
                Flow::Found => return Ok(Flow::Found),
                Flow::NotFound => {
                    all_too_many = false;
                    // Best-of search: this subrequest completes the allocation (or a branch was
                    // pruned because a better solution exists), so later ones are not admissible.
                    if self.solutions > solutions || self.pruned > pruned {
                        return Ok(Flow::NotFound);
                    }
                }
            }
        }
        Ok(if all_too_many {
            Flow::MaxSize
        } else {
            Flow::NotFound
        })
    }

    fn complete(&mut self) -> Flow {
        self.solutions += 1;
        let score =
            self.np
                .topology
                .score(&self.free_before, &self.chosen, self.comm_cost, self.numa);
        match self.mode {
            SearchMode::FirstFit => {
                self.best = Some(self.snapshot(score));
                Flow::Found
            }
            SearchMode::Best { .. } => {
                if self.best.as_ref().is_none_or(|b| score < b.score) {
                    self.best = Some(self.snapshot(score));
                }
                Flow::NotFound
            }
        }
    }

    fn snapshot(&self, score: TopologyScore) -> Solution {
        Solution {
            picks: self.picks.clone(),
            selected: self.selected.clone(),
            score,
        }
    }

    fn beyond_bound(&self) -> bool {
        let SearchMode::Best { bound } = self.mode else {
            return false;
        };
        let best = self.best.as_ref().map(|b| b.score.comm_cost);
        match (bound, best) {
            (Some(a), Some(b)) => self.comm_cost > a.min(b),
            (Some(a), None) | (None, Some(a)) => self.comm_cost > a,
            (None, None) => false,
        }
    }
}

/// A pool's counters minus what its allocated devices (on any node) consume; negative when the
/// allocated devices overdraw it (then no device consuming the pool's counters fits).
fn counters_left(inv: &Cluster, state: &AllocatedState, pool: &crate::pools::Pool) -> Vec<Amount> {
    let mut left = pool.counter_totals.clone();
    for (device, consumption) in &pool.consumers {
        if state.is_in_use(&inv.devices[*device].id) {
            for &(i, amount) in consumption {
                left[i] = left[i].saturating_sub(amount);
            }
        }
    }
    left
}
