//! Ending the search early without changing its answer.
//!
//! Once the search has backtracked once (the easy cases never get here), every call of
//! `allocate_one` first checks two things about the subtree it is about to explore:
//!
//! 1. **Feasibility.** What is left to allocate — the rest of the current (sub)request from the
//!    candidates after the current one, every later request (a `firstAvailable` request as its
//!    cheapest viable subrequest over the union of their devices), every later claim — is
//!    matched against the candidates each could still take *somewhere below*: selected by its
//!    selectors, not in use, fitting its capacity and its pool's counters as they are now,
//!    tolerated, and accepted by its claim's constraints as they stand. Everything that makes a
//!    candidate unavailable only gets worse deeper in the search, so if these sets cannot cover
//!    the demands — one device per unit of demand, a device serving one unit unless it is
//!    multi-allocatable (a bipartite matching) — no solution exists below. Constraints add two
//!    more necessary conditions: the requests under an unstarted `matchAttribute` need one value
//!    that enough of each request's devices share; the devices under a `distinctAttribute` need
//!    that many distinct values.
//! 2. **Repetition** (first fit only). The subtree's outcome depends only on where the search is
//!    and on what it has taken so far (which claim holds which device, counters and capacity
//!    consumed, the current claim's constraint values, its result count). A situation that
//!    failed before fails again; the search skips it.
//!
//! Both only skip subtrees without a solution, so the first solution found is the one the plain
//! search finds. But a skipped subtree is also a set of selector evaluations that upstream
//! makes, and a selector that fails there fails upstream's whole allocation. So pruning is only
//! used on a node where no (request, candidate) pair fails (all pairs are evaluated, and their
//! verdicts cached, before the first pruning decision) and no `All` request has a constraint
//! (whose violation is an error). Elsewhere the search runs unpruned, as upstream does.

use std::hash::{Hash, Hasher};

use crate::constraints::AttrSet;
use crate::request::{ConstraintKind, Wanted};
use crate::taints::untolerated_taint;

use super::state::{Check, Flow, NodeSearch, Position, SearchMode, Selectable, Stop};

/// Most situations remembered per node search (each key is a few hundred bytes).
const MEMO_LIMIT: usize = 200_000;

/// What remains to be allocated for one request: `need` devices out of `allowed`.
struct Demand {
    claim: usize,
    slots: Vec<usize>,
    need: usize,
    allowed: Vec<usize>,
    admin: bool,
}

impl NodeSearch<'_> {
    /// Whether pruning may skip subtrees on this node: no (slot, candidate) pair fails its
    /// selectors and no `All` request is under a constraint.
    pub(super) fn may_prune(&mut self) -> bool {
        if let Some(allowed) = self.prune.allowed {
            return allowed;
        }
        let mut allowed = true;
        'slots: for slot in 0..self.plan.slots.len() {
            let s = &self.plan.slots[slot];
            if s.wanted == Wanted::All
                && self.plan.claims[s.claim]
                    .constraints
                    .iter()
                    .any(|c| c.applies_to(s))
            {
                allowed = false;
                break;
            }
            for pos in 0..self.np.candidates.len() {
                if self.evaluate_pair(slot, pos) == Selectable::Fails {
                    allowed = false;
                    break 'slots;
                }
            }
        }
        self.prune.allowed = Some(allowed);
        allowed
    }

    /// The pruning decision at `at` (see the module docs).
    pub(super) fn pruned_before(&mut self, at: Position, start: usize) -> Result<Check, Stop> {
        if !self.prune.backtracked || !self.may_prune() {
            return Ok(Check::Search(None));
        }
        let key = (self.mode == SearchMode::FirstFit)
            .then(|| self.memo_key(at, start))
            .flatten();
        if let Some(flow) = key.as_ref().and_then(|k| self.prune.memo.get(k)) {
            self.prune.skipped += 1;
            return Ok(Check::Skip(*flow));
        }
        if !self.feasible(at, start) {
            self.prune.skipped += 1;
            if let Some(key) = key {
                self.remember(key, Flow::NotFound);
            }
            return Ok(Check::Skip(Flow::NotFound));
        }
        Ok(Check::Search(key))
    }

    /// Remembers that the situation `key` failed.
    pub(super) fn remember(&mut self, key: Vec<u64>, flow: Flow) {
        if flow != Flow::Found && self.prune.memo.len() < MEMO_LIMIT {
            self.prune.memo.insert(key, flow);
        }
    }

    /// Everything the subtree at `at` depends on, or `None` when it cannot be written down
    /// compactly (more than 64 claims).
    fn memo_key(&self, at: Position, start: usize) -> Option<Vec<u64>> {
        if self.plan.claims.len() > 64 {
            return None;
        }
        let n = self.np.candidates.len();
        let mut key = Vec::with_capacity(8 + 2 * n);
        key.extend([
            at.claim as u64,
            at.request as u64,
            at.in_slot.map_or(0, |s| s as u64 + 1),
            at.device as u64,
            start as u64,
            self.picks[at.claim].len() as u64,
        ]);
        for pos in 0..n {
            let mask = self.taken_by[pos]
                .iter()
                .fold(0u64, |m, &c| m | (1u64 << c));
            key.push(mask);
            key.push(u64::from(self.run_shares[pos]));
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for used in &self.counters_used {
            used.hash(&mut h);
        }
        for (pos, capacity) in self.run_capacity.iter().enumerate() {
            if !capacity.is_empty() {
                pos.hash(&mut h);
                capacity.hash(&mut h);
            }
        }
        for c in &self.constraints[at.claim] {
            c.hash_state(&mut h);
        }
        key.push(h.finish());
        Some(key)
    }

    /// Whether candidate `pos` could still be taken for `slot` somewhere below the current
    /// point of the search (a necessary condition; see the module docs).
    fn could_take(&mut self, slot: usize, pos: usize) -> bool {
        let s = &self.plan.slots[slot];
        let dev = self.device(pos);
        let multi = dev.parsed().allow_multiple_allocations;
        if s.admin_access {
            if !multi && self.taken_by[pos].contains(&s.claim) {
                return false;
            }
        } else if self.in_use(pos) {
            return false;
        }
        if self.evaluate_pair(slot, pos) != Selectable::Yes {
            return false;
        }
        if self.capacity_fits(slot, pos).is_err() {
            return false;
        }
        if self.charges_counters(pos) && !self.counters_fit(pos) {
            return false;
        }
        if untolerated_taint(dev.taints(), &s.tolerations).is_some() {
            return false;
        }
        self.constraints[s.claim].iter().all(|c| c.accepts(s, dev))
    }

    /// The demand of one (sub)request slot from position `from` on, or `None` when it is
    /// impossible already.
    fn slot_demand(&mut self, slot: usize, from: usize, done: usize) -> Option<Demand> {
        let s = &self.plan.slots[slot];
        let (claim, admin) = (s.claim, s.admin_access);
        if s.wanted == Wanted::All {
            let devices = self.all_devices[slot].clone();
            if devices.is_empty() {
                return None;
            }
            let rest = &devices[done.min(devices.len())..];
            if rest.iter().any(|&p| !self.could_take(slot, p)) {
                return None;
            }
            return Some(Demand {
                claim,
                slots: vec![slot],
                need: rest.len(),
                allowed: rest.to_vec(),
                admin,
            });
        }
        let need = self.need[slot].saturating_sub(done);
        let allowed: Vec<usize> = (from..self.np.candidates.len())
            .filter(|&p| self.could_take(slot, p))
            .collect();
        (allowed.len() >= need).then_some(Demand {
            claim,
            slots: vec![slot],
            need,
            allowed,
            admin,
        })
    }

    /// The demand of a whole request not started yet: its one slot, or the cheapest viable
    /// subrequest over the union of the subrequests' devices.
    fn request_demand(&mut self, claim: usize, request: usize) -> Option<Demand> {
        let slots = self.plan.claims[claim].requests[request].slots.clone();
        let mut merged: Option<Demand> = None;
        for slot in slots {
            let Some(d) = self.slot_demand(slot, 0, 0) else {
                continue;
            };
            merged = Some(match merged {
                None => d,
                Some(mut m) => {
                    m.need = m.need.min(d.need);
                    m.allowed.extend(d.allowed);
                    m.allowed.sort_unstable();
                    m.allowed.dedup();
                    m.slots.extend(d.slots);
                    m.admin &= d.admin;
                    m
                }
            });
        }
        merged
    }

    /// Whether what is left at `at` can still be satisfied (necessary conditions only).
    fn feasible(&mut self, at: Position, start: usize) -> bool {
        let mut demands = Vec::new();
        let current = if self.plan.slots[at.slot].wanted == Wanted::All {
            self.slot_demand(at.slot, 0, at.device)
        } else {
            self.slot_demand(at.slot, start, at.device)
        };
        let Some(current) = current else {
            return false;
        };
        demands.push(current);
        for claim in at.claim..self.plan.claims.len() {
            let first = if claim == at.claim { at.request + 1 } else { 0 };
            for request in first..self.plan.claims[claim].requests.len() {
                match self.request_demand(claim, request) {
                    Some(d) => demands.push(d),
                    None => return false,
                }
            }
        }
        self.devices_cover(&demands) && self.constraints_satisfiable(&demands)
    }

    /// Whether every non-admin demand can get its own devices at once: a bipartite matching of
    /// demand units to candidates (a multi-allocatable candidate can serve any number of units).
    fn devices_cover(&self, demands: &[Demand]) -> bool {
        let n = self.np.candidates.len();
        let multi: Vec<bool> = (0..n)
            .map(|p| self.device(p).parsed().allow_multiple_allocations)
            .collect();
        let mut units: Vec<&[usize]> = Vec::new();
        for d in demands {
            if d.admin {
                continue; // admin access may share devices; its count was checked on its own
            }
            if d.allowed.iter().any(|&p| multi[p]) {
                continue;
            }
            for _ in 0..d.need {
                units.push(&d.allowed);
            }
        }
        let mut owner: Vec<Option<usize>> = vec![None; n];
        for u in 0..units.len() {
            let mut seen = vec![false; n];
            if !augment(u, &units, &mut owner, &mut seen) {
                return false;
            }
        }
        true
    }

    /// The constraints' necessary conditions over the demands they apply to.
    fn constraints_satisfiable(&self, demands: &[Demand]) -> bool {
        for claim in demands
            .iter()
            .map(|d| d.claim)
            .collect::<std::collections::BTreeSet<_>>()
        {
            for c in &self.constraints[claim] {
                let spec = c.spec();
                let scope: Vec<&Demand> = demands
                    .iter()
                    .filter(|d| {
                        d.claim == claim
                            && d.need > 0
                            && d.slots
                                .iter()
                                .all(|&s| spec.applies_to(&self.plan.slots[s]))
                    })
                    .collect();
                if scope.is_empty() {
                    continue;
                }
                let values = |p: usize| {
                    self.device(p)
                        .attribute(&spec.attribute)
                        .and_then(AttrSet::of)
                };
                match spec.kind {
                    ConstraintKind::Match if !c.started() => {
                        let mut elements: Vec<AttrSet> = scope
                            .iter()
                            .flat_map(|d| d.allowed.iter())
                            .filter_map(|&p| values(p))
                            .flat_map(|v| v.elements())
                            .collect();
                        elements.sort_by_key(|e| format!("{e:?}"));
                        elements.dedup();
                        let shared = elements.iter().any(|e| {
                            scope.iter().all(|d| {
                                d.allowed
                                    .iter()
                                    .filter(|&&p| {
                                        values(p).is_some_and(|v| v.intersection(e).is_some())
                                    })
                                    .count()
                                    >= d.need
                            })
                        });
                        if !shared {
                            return false;
                        }
                    }
                    ConstraintKind::Match => {} // started: the candidates were filtered already
                    ConstraintKind::Distinct => {
                        let mut elements: Vec<AttrSet> = scope
                            .iter()
                            .flat_map(|d| d.allowed.iter())
                            .filter_map(|&p| values(p))
                            .flat_map(|v| v.elements())
                            .collect();
                        elements.sort_by_key(|e| format!("{e:?}"));
                        elements.dedup();
                        let needed: usize = scope.iter().map(|d| d.need).sum();
                        if needed > elements.len() {
                            return false;
                        }
                    }
                }
            }
        }
        true
    }
}

/// Kuhn's augmenting path for unit `u`.
fn augment(u: usize, units: &[&[usize]], owner: &mut [Option<usize>], seen: &mut [bool]) -> bool {
    for &p in units[u] {
        if seen[p] {
            continue;
        }
        seen[p] = true;
        if owner[p].is_none_or(|v| augment(v, units, owner, seen)) {
            owner[p] = Some(u);
            return true;
        }
    }
    false
}
