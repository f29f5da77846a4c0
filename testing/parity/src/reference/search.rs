//! First fit as an enumeration: the claims' devices are chosen in the order the API documents
//! for structured allocation — claims, then requests, in order; within a request, combinations of
//! the node's devices in first-fit order (never permutations); the alternatives of a
//! `firstAvailable` request in order — and the first assignment that satisfies every rule wins.
//!
//! An assignment is extended one device at a time and abandoned at the first rule it breaks
//! (every rule only gets harder as devices are added, so no completion of a broken prefix is
//! valid). Selectors and capacity checks can fail with an error, and first fit reports the first
//! error it meets, so which device is tried when matters: the walk tries devices exactly in
//! first-fit order, checking, per device, what is in use, the selectors, capacity, counters,
//! taints and constraints in that order. When the instance cannot produce an error at all
//! ([`Search::errors_impossible`]), the walk also skips a prefix as soon as some remaining
//! request provably has too few devices left ([`Search::feasible`]): that changes no answer and
//! decides in microseconds what a plain walk needs hours for.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

use super::alternative::{AllocationMode, Alternative};
use super::checks;
use super::pools::{Candidate, NodeView};
use super::quantity::Nanos;
use super::request::{ClaimPlan, Constraint};
use super::selectors::SelectorTable;
use super::state::State;
use super::stop::{NodeStop, beyond, quantity};

/// One device of the assignment being built.
#[derive(Debug)]
pub struct Chosen {
    pub claim: usize,
    pub request: usize,
    pub alt: usize,
    /// Position in the node's candidates.
    pub cand: usize,
    /// A multi-allocatable device: a share, never held whole.
    pub multi: bool,
    /// Whether its counters were charged (a further share of a shared device's are not).
    pub charged: bool,
    /// What a share consumes of the device's capacities.
    pub consumed: BTreeMap<String, Nanos>,
}

/// The walk on one node.
pub struct Search<'a, 'v> {
    pub plans: &'v [ClaimPlan<'a>],
    pub view: &'v NodeView<'a>,
    pub table: &'v SelectorTable,
    pub state: &'v State,
    pub node: &'v Node,
    /// The assignment so far, in the order devices were chosen.
    pub chosen: Vec<Chosen>,
    /// The alternative chosen for each claim's requests.
    pub picks: Vec<Vec<usize>>,
    /// Devices tried so far, and the most the reference tries before giving up.
    pub trials: u64,
    pub budget: u64,
    /// Whether prefixes may be pruned (when no error is possible).
    pub prune: bool,
    /// Per claim, request, alternative and candidate: could the device ever be chosen for it?
    /// Present only when pruning (then prefixes are pruned with it).
    eligible: Option<Vec<Vec<Vec<Vec<bool>>>>>,
}

impl<'a, 'v> Search<'a, 'v> {
    pub fn new(
        plans: &'v [ClaimPlan<'a>],
        view: &'v NodeView<'a>,
        table: &'v SelectorTable,
        state: &'v State,
        node: &'v Node,
        budget: u64,
        prune: bool,
    ) -> Search<'a, 'v> {
        Search {
            plans,
            view,
            table,
            state,
            node,
            chosen: Vec::new(),
            picks: plans.iter().map(|p| vec![0; p.requests.len()]).collect(),
            trials: 0,
            budget,
            prune,
            eligible: None,
        }
    }

    /// Runs the walk: `true` when an assignment was found (in `chosen` and `picks`).
    pub fn run(&mut self) -> Result<bool, NodeStop> {
        if self.prune && self.errors_impossible()? {
            self.eligible = Some(self.eligibility()?);
        }
        self.request(0, 0)
    }

    /// Whether the walk pruned (no error was possible).
    pub fn pruned(&self) -> bool {
        self.eligible.is_some()
    }

    fn alt(&self, c: usize, r: usize, a: usize) -> &'v Alternative<'a> {
        &self.plans[c].requests[r].alternatives[a]
    }

    fn cand(&self, i: usize) -> &'v Candidate<'a> {
        &self.view.candidates[i]
    }

    fn request(&mut self, c: usize, r: usize) -> Result<bool, NodeStop> {
        if c == self.plans.len() {
            return Ok(true);
        }
        if r == self.plans[c].requests.len() {
            return self.request(c + 1, 0);
        }
        for a in 0..self.plans[c].requests[r].alternatives.len() {
            self.picks[c][r] = a;
            if self.place(c, r, a, 0, 0)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Device `i` of alternative `a`, from candidate `start` on.
    fn place(
        &mut self,
        c: usize,
        r: usize,
        a: usize,
        i: usize,
        start: usize,
    ) -> Result<bool, NodeStop> {
        if self.eligible.is_some() && !self.feasible(c, r, a, i, start) {
            return Ok(false);
        }
        match &self.alt(c, r, a).mode {
            AllocationMode::All(devices) => {
                if devices.is_empty() {
                    return Ok(false);
                }
                if i == devices.len() {
                    return self.request(c, r + 1);
                }
                self.count_trial()?;
                if !self.allocate(c, r, a, devices[i], true)? {
                    return Ok(false);
                }
                if self.place(c, r, a, i + 1, 0)? {
                    return Ok(true);
                }
                self.chosen.pop();
                Ok(false)
            }
            AllocationMode::Exact(n) => {
                if i == *n {
                    return self.request(c, r + 1);
                }
                for cand in start..self.view.candidates.len() {
                    self.count_trial()?;
                    if !self.admit(c, r, a, cand)? || !self.allocate(c, r, a, cand, false)? {
                        continue;
                    }
                    if self.place(c, r, a, i + 1, cand + 1)? {
                        return Ok(true);
                    }
                    self.chosen.pop();
                }
                Ok(false)
            }
        }
    }

    fn count_trial(&mut self) -> Result<(), NodeStop> {
        self.trials += 1;
        if self.trials > self.budget {
            return Err(NodeStop::Beyond(beyond(&format!(
                "more than {} devices tried on one node",
                self.budget
            ))));
        }
        Ok(())
    }

    /// What is checked of a device before it is taken for an `ExactCount` alternative: in use,
    /// selectors, capacity.
    fn admit(&self, c: usize, r: usize, a: usize, i: usize) -> Result<bool, NodeStop> {
        let (alt, cand) = (self.alt(c, r, a), self.cand(i));
        let taken = if alt.admin {
            self.held_for(i, Some(c))
        } else {
            self.state.is_held_whole(&cand.key) || self.held_for(i, None)
        };
        if taken || !checks::selectable(self.table, alt, cand, self.node)? {
            return Ok(false);
        }
        self.capacity_fits(alt, i)
    }

    /// Takes device `i` for alternative `a` if it is free, its counters suffice, its taints are
    /// tolerated, the claim's constraints accept it and its capacity holds the request. An `All`
    /// alternative must take this very device (`must`): a constraint refusing it is an error.
    fn allocate(
        &mut self,
        c: usize,
        r: usize,
        a: usize,
        i: usize,
        must: bool,
    ) -> Result<bool, NodeStop> {
        let (alt, cand) = (self.alt(c, r, a), self.cand(i));
        let multi = cand.device.allow_multiple_allocations == Some(true);
        if !multi && alt.admin && self.held_for(i, Some(c)) {
            return Ok(false);
        }
        if !alt.admin && (self.state.is_held_whole(&cand.key) || self.held_for(i, None)) {
            return Ok(false);
        }
        let consumes = cand
            .device
            .consumes_counters
            .as_ref()
            .is_some_and(|c| !c.is_empty());
        let shared_already = multi && (self.state.has_shares(&cand.key) || self.has_share(i));
        let charged = consumes && !shared_already;
        if charged && !self.counters_fit(i)? {
            return Ok(false);
        }
        if !checks::tolerated(alt, cand.device) {
            return Ok(false);
        }
        for constraint in &self.plans[c].constraints {
            if constraint.covers(alt) && !self.accepts(c, constraint, cand) {
                if must {
                    return Err(NodeStop::Error("all-constraint"));
                }
                return Ok(false);
            }
        }
        if !self.capacity_fits(alt, i)? {
            return Ok(false);
        }
        let consumed = if multi {
            checks::consumed_capacity(alt, cand.device)?
        } else {
            BTreeMap::new()
        };
        self.chosen.push(Chosen {
            claim: c,
            request: r,
            alt: a,
            cand: i,
            multi,
            charged,
            consumed,
        });
        Ok(true)
    }

    /// Whether the assignment holds candidate `i` whole (for claim `claim`, or for any). A
    /// node's candidates are distinct devices (a pool naming a device twice is invalid).
    fn held_for(&self, i: usize, claim: Option<usize>) -> bool {
        self.chosen
            .iter()
            .any(|e| !e.multi && e.cand == i && claim.is_none_or(|c| e.claim == c))
    }

    /// Whether the assignment holds a share of candidate `i`.
    fn has_share(&self, i: usize) -> bool {
        self.chosen.iter().any(|e| e.multi && e.cand == i)
    }

    fn capacity_fits(&self, alt: &Alternative<'_>, i: usize) -> Result<bool, NodeStop> {
        let key = &self.cand(i).key;
        let already = |name: &str| self.state.consumed(key, name).unwrap_or_default();
        let pending = |name: &str| {
            self.chosen
                .iter()
                .filter(|e| e.cand == i)
                .filter_map(|e| e.consumed.get(name).copied())
                .sum()
        };
        checks::capacity_fits(alt, self.cand(i).device, &already, &pending)
    }

    /// The pool's counters hold what the assignment's charged devices of the pool and this one
    /// consume (every counter of the pool is checked, so a pool already over-consumed holds no
    /// further device that consumes counters).
    fn counters_fit(&self, i: usize) -> Result<bool, NodeStop> {
        let cand = self.cand(i);
        let mut consumed: BTreeMap<(&str, &str), Nanos> = BTreeMap::new();
        let charged = self
            .chosen
            .iter()
            .filter(|e| e.charged && self.cand(e.cand).pool == cand.pool)
            .map(|e| self.cand(e.cand).device);
        for device in charged.chain([cand.device]) {
            for consumption in device.consumes_counters.iter().flatten() {
                for (name, c) in &consumption.counters {
                    let entry = consumed
                        .entry((consumption.counter_set.as_str(), name.as_str()))
                        .or_default();
                    *entry = *entry + quantity(&c.value).map_err(NodeStop::Beyond)?;
                }
            }
        }
        let pool = &self.view.pools[cand.pool];
        Ok(pool.available.iter().all(|(set, counters)| {
            counters.iter().all(|(name, left)| {
                *left
                    >= consumed
                        .get(&(set.as_str(), name.as_str()))
                        .copied()
                        .unwrap_or_default()
            })
        }))
    }

    /// Whether a constraint of claim `c` accepts the device beside the claim's devices so far.
    fn accepts(&self, c: usize, constraint: &Constraint<'_>, cand: &Candidate<'_>) -> bool {
        let Some(new) = checks::attribute(cand.device, &cand.key.driver, constraint.attribute)
        else {
            return false;
        };
        let mut earlier = self
            .chosen
            .iter()
            .filter(|e| e.claim == c && constraint.covers(self.alt(e.claim, e.request, e.alt)))
            .filter_map(|e| {
                let d = self.cand(e.cand);
                checks::attribute(d.device, &d.key.driver, constraint.attribute)
            });
        if constraint.distinct {
            earlier.all(|old| checks::same_value(new, old) == Some(false))
        } else {
            earlier
                .next()
                .is_none_or(|first| checks::same_value(new, first) == Some(true))
        }
    }

    /// Whether no error can happen on this node whatever is tried: every selector evaluates
    /// on every device, no capacity computation fails, and no `All` alternative is under a
    /// constraint (whose refusal would be an error).
    fn errors_impossible(&self) -> Result<bool, NodeStop> {
        for (c, plan) in self.plans.iter().enumerate() {
            for (r, request) in plan.requests.iter().enumerate() {
                for a in 0..request.alternatives.len() {
                    let alt = self.alt(c, r, a);
                    if matches!(alt.mode, AllocationMode::All(_))
                        && plan.constraints.iter().any(|k| k.covers(alt))
                    {
                        return Ok(false);
                    }
                    for cand in &self.view.candidates {
                        match checks::selectable(self.table, alt, cand, self.node) {
                            Err(NodeStop::Error(_)) => return Ok(false),
                            Err(beyond) => return Err(beyond),
                            Ok(_) => {}
                        }
                        match checks::consumed_capacity(alt, cand.device) {
                            Err(NodeStop::Error(_)) => return Ok(false),
                            Err(beyond) => return Err(beyond),
                            Ok(_) => {}
                        }
                    }
                }
            }
        }
        Ok(true)
    }

    /// Per claim, request, alternative and candidate: whether the device could be chosen for
    /// the alternative in some assignment (what does not depend on the other devices chosen).
    fn eligibility(&self) -> Result<Vec<Vec<Vec<Vec<bool>>>>, NodeStop> {
        let mut out = Vec::new();
        for (c, plan) in self.plans.iter().enumerate() {
            let mut requests = Vec::new();
            for (r, request) in plan.requests.iter().enumerate() {
                let mut alternatives = Vec::new();
                for a in 0..request.alternatives.len() {
                    let mut row = Vec::new();
                    for i in 0..self.view.candidates.len() {
                        row.push(self.eligible_alone(c, r, a, i)?);
                    }
                    alternatives.push(row);
                }
                requests.push(alternatives);
            }
            out.push(requests);
        }
        Ok(out)
    }

    fn eligible_alone(&self, c: usize, r: usize, a: usize, i: usize) -> Result<bool, NodeStop> {
        let (alt, cand) = (self.alt(c, r, a), self.cand(i));
        if !alt.admin && self.state.is_held_whole(&cand.key) {
            return Ok(false);
        }
        if !checks::selectable(self.table, alt, cand, self.node)?
            || !checks::tolerated(alt, cand.device)
        {
            return Ok(false);
        }
        if !self.capacity_fits(alt, i)? {
            return Ok(false);
        }
        let multi = cand.device.allow_multiple_allocations == Some(true);
        let consumes = cand
            .device
            .consumes_counters
            .as_ref()
            .is_some_and(|c| !c.is_empty());
        if consumes && !(multi && self.state.has_shares(&cand.key)) {
            return self.counters_fit(i);
        }
        Ok(true)
    }

    /// Whether the rest of the assignment can still be completed, by counts alone: the current
    /// alternative has enough devices left after `start`, and every later request has some
    /// alternative with enough devices that are eligible, not held by the assignment, and
    /// consistent with the values the claim's `matchAttribute` constraints have fixed.
    fn feasible(&self, c: usize, r: usize, a: usize, i: usize, start: usize) -> bool {
        let current = match &self.alt(c, r, a).mode {
            AllocationMode::Exact(n) => {
                let left = (start..self.view.candidates.len())
                    .filter(|&x| self.admissible(c, r, a, x))
                    .count();
                left >= n - i
            }
            AllocationMode::All(devices) => devices[i.min(devices.len())..]
                .iter()
                .all(|&x| self.admissible(c, r, a, x)),
        };
        if !current {
            return false;
        }
        let later = self.plans.iter().enumerate().flat_map(|(c2, p)| {
            let from = if c2 == c { r + 1 } else { 0 };
            (from..p.requests.len()).map(move |r2| (c2, r2))
        });
        later.filter(|&(c2, _)| c2 >= c).all(|(c2, r2)| {
            (0..self.plans[c2].requests[r2].alternatives.len()).any(|a2| {
                match &self.alt(c2, r2, a2).mode {
                    AllocationMode::Exact(n) => {
                        (0..self.view.candidates.len())
                            .filter(|&x| self.admissible(c2, r2, a2, x))
                            .count()
                            >= *n
                    }
                    AllocationMode::All(devices) => {
                        !devices.is_empty()
                            && devices.iter().all(|&x| self.admissible(c2, r2, a2, x))
                    }
                }
            })
        })
    }

    fn admissible(&self, c: usize, r: usize, a: usize, i: usize) -> bool {
        let eligible = self.eligible.as_ref().is_some_and(|e| e[c][r][a][i]);
        let (alt, cand) = (self.alt(c, r, a), self.cand(i));
        let multi = cand.device.allow_multiple_allocations == Some(true);
        let held = if alt.admin {
            !multi && self.held_for(i, Some(c))
        } else {
            self.held_for(i, None)
        };
        eligible
            && !held
            && self.plans[c]
                .constraints
                .iter()
                .filter(|k| k.covers(alt))
                .all(|k| self.consistent(c, k, cand))
    }

    /// A device a constraint could still accept: it has the attribute, and under
    /// `matchAttribute` the value the claim's first device fixed.
    fn consistent(&self, c: usize, constraint: &Constraint<'_>, cand: &Candidate<'_>) -> bool {
        if constraint.distinct {
            return checks::attribute(cand.device, &cand.key.driver, constraint.attribute)
                .is_some();
        }
        self.accepts(c, constraint, cand)
    }
}
