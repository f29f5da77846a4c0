//! Checks on one candidate device during the search, and taking / releasing it: availability,
//! selectors, capacity, counters, taints and constraints (`isSelectable`, `CmpRequestOverCapacity`
//! and `allocateDevice` upstream, in upstream's order).

use crate::capacity::{self, CapacityRefusal, Consumption};
use crate::error::AllocateError;
use crate::quantity::Amount;
use crate::request::Slot;
use crate::taints::untolerated_taint;
use crate::topology::pair_cost;

use super::pair::PairCheck;
use super::state::{NodeSearch, Pick, Selectable, Stop, Undo};

impl<'a> NodeSearch<'a> {
    /// In exclusive use: allocated before (exclusively, or — a deliberate difference from
    /// upstream, for safety — shared while not multi-allocatable), or taken by a claim in this run.
    pub(crate) fn in_use(&self, pos: usize) -> bool {
        let dev = self.device(pos);
        self.state.is_dedicated(&dev.id)
            || (!dev.parsed().allow_multiple_allocations && self.state.shared(&dev.id).is_some())
            || !self.taken_by[pos].is_empty()
    }

    /// Whether the device's capacity is shared by some allocation already (upstream's
    /// `deviceCapacityInUse`): then a further share does not consume its counters again.
    pub(crate) fn capacity_in_use(&self, pos: usize) -> bool {
        self.state.shared(&self.device(pos).id).is_some() || self.run_shares[pos] > 0
    }

    /// Whether taking the device now consumes its counters: it consumes some, and it is not a
    /// multi-allocatable device whose capacity is shared already.
    pub(crate) fn charges_counters(&self, pos: usize) -> bool {
        if self.np.candidate_consumes[pos].is_empty() {
            return false;
        }
        let shared =
            self.device(pos).parsed().allow_multiple_allocations && self.capacity_in_use(pos);
        !shared
    }

    /// Whether the slot's class and request selectors select the device and, for per-device node
    /// selection, the device is available on the node. A selector that fails is an error, raised
    /// the first time the search asks about the pair.
    pub(crate) fn selectable(&mut self, slot: usize, pos: usize) -> Result<bool, AllocateError> {
        match self.evaluate_pair(slot, pos) {
            Selectable::Yes => Ok(true),
            Selectable::No => Ok(false),
            _ => Err(self.failures[&(slot, pos)].clone()),
        }
    }

    /// The cached verdict on a pair, evaluating it on first use without raising its error.
    pub(super) fn evaluate_pair(&mut self, slot: usize, pos: usize) -> Selectable {
        let cached = self.selectable_cache[slot][pos];
        if cached != Selectable::Unknown {
            return cached;
        }
        let verdict = match self.pairs().selectable(slot, pos) {
            Ok(true) => Selectable::Yes,
            Ok(false) => Selectable::No,
            Err(e) => {
                self.failures.insert((slot, pos), e);
                Selectable::Fails
            }
        };
        self.selectable_cache[slot][pos] = verdict;
        verdict
    }

    /// The checks of (slot, candidate) pairs on this node.
    pub(crate) fn pairs(&self) -> PairCheck<'a> {
        PairCheck {
            inv: self.inv,
            np: self.np,
            plan: self.plan,
        }
    }

    /// What the slot's capacity request would consume of the device now.
    pub(crate) fn capacity(&self, slot: usize, pos: usize) -> Result<Consumption, CapacityRefusal> {
        let dev = self.device(pos);
        let requests = &self.plan.slots[slot].capacity;
        capacity::consume(&dev.parsed().capacities, requests, &self.consumed_now(pos))
    }

    /// Whether the slot's capacity request fits the device now ([`NodeSearch::capacity`] without
    /// the consumption, which only a shared device's allocation records).
    pub(crate) fn capacity_fits(&self, slot: usize, pos: usize) -> Result<(), CapacityRefusal> {
        let dev = self.device(pos);
        let requests = &self.plan.slots[slot].capacity;
        capacity::fits(&dev.parsed().capacities, requests, &self.consumed_now(pos))
    }

    /// Capacity name → what allocations before this one and this run consume of the device.
    fn consumed_now(&self, pos: usize) -> impl Fn(&str) -> Amount + '_ {
        let shared = self.state.shared(&self.device(pos).id);
        let run = &self.run_capacity[pos];
        move |name| {
            let before = shared
                .and_then(|s| s.consumed.get(name))
                .copied()
                .unwrap_or_default();
            before.saturating_add(run.get(name).copied().unwrap_or_default())
        }
    }

    /// Whether the slot's capacity request fits the device when nothing of it is consumed
    /// (upstream's static check when it collects the devices of an `All` request).
    pub(crate) fn static_capacity_fits(&self, slot: usize, pos: usize) -> bool {
        capacity::fits(
            &self.device(pos).parsed().capacities,
            &self.plan.slots[slot].capacity,
            &|_| Amount::ZERO,
        )
        .is_ok()
    }

    /// Whether the device's counters fit what is left in its pool.
    pub(crate) fn counters_fit(&self, pos: usize) -> bool {
        self.counter_shortfall(pos).is_none()
    }

    /// The first counter of the device's pool that taking the device would overdraw (upstream
    /// checks every counter of the pool, so an already overdrawn one blocks too).
    pub(crate) fn counter_shortfall(&self, pos: usize) -> Option<usize> {
        let pool = self.np.candidate_pool[pos];
        let (left, used) = (&self.counters_left[pool], &self.counters_used[pool]);
        let extra = &self.np.candidate_consumes[pos];
        (0..left.len()).find(|&i| {
            let mine: Amount = extra
                .iter()
                .filter(|(c, _)| *c == i)
                .fold(Amount::ZERO, |acc, (_, a)| acc.saturating_add(*a));
            used[i].saturating_add(mine) > left[i]
        })
    }

    pub(super) fn charge(&mut self, pos: usize, sign: bool) {
        let pool = self.np.candidate_pool[pos];
        for &(i, amount) in &self.np.candidate_consumes[pos] {
            let used = &mut self.counters_used[pool][i];
            *used = if sign {
                used.saturating_add(amount)
            } else {
                used.saturating_sub(amount)
            };
        }
    }

    /// `allocateDevice` upstream: availability, counters, taints, constraints, capacity; on
    /// success the device is recorded for the claim. Counters are charged unless the device is
    /// multi-allocatable and already shared — so admin access to a device in use charges them
    /// again, as upstream does.
    pub(super) fn try_allocate(
        &mut self,
        claim: usize,
        slot: usize,
        pos: usize,
        must: bool,
    ) -> Result<Option<Undo>, Stop> {
        let dev = self.device(pos);
        let s: &'a Slot = &self.plan.slots[slot];
        let multi = dev.parsed().allow_multiple_allocations;
        if !multi && s.admin_access && self.taken_by[pos].contains(&claim) {
            return Ok(None);
        }
        if !s.admin_access && self.in_use(pos) {
            return Ok(None);
        }
        let charged = self.charges_counters(pos);
        if charged && !self.counters_fit(pos) {
            return Ok(None);
        }
        if untolerated_taint(dev.taints(), &s.tolerations).is_some() {
            return Ok(None);
        }
        if !self.add_to_constraints(claim, slot, pos, must)? {
            return Ok(None);
        }
        // Only a shared device's allocation records what it consumes.
        let consumption = if multi {
            self.capacity(slot, pos).map(Some)
        } else {
            self.capacity_fits(slot, pos).map(|()| None)
        };
        let Ok(consumption) = consumption else {
            for c in &mut self.constraints[claim] {
                c.remove(s);
            }
            return Ok(None);
        };
        if charged {
            self.charge(pos, true);
        }
        let comm_added = self.record(claim, slot, pos, consumption);
        Ok(Some(Undo {
            claim,
            slot,
            pos,
            charged,
            exclusive: !multi,
            shared: multi,
            comm_added,
        }))
    }

    /// Adds the device to the claim's constraints (all or none). With `must` (an `All` request),
    /// a constraint that rejects the device is an error: "all" cannot be satisfied.
    fn add_to_constraints(
        &mut self,
        claim: usize,
        slot: usize,
        pos: usize,
        must: bool,
    ) -> Result<bool, Stop> {
        let dev = self.device(pos);
        let s: &'a Slot = &self.plan.slots[slot];
        let constraints = &mut self.constraints[claim];
        for i in 0..constraints.len() {
            if !constraints[i].add(s, dev) {
                for c in &mut constraints[..i] {
                    c.remove(s);
                }
                if must {
                    return Err(Stop::Error(AllocateError::ConstraintRejectsAll {
                        claim: self.plan.claims[claim].name.clone(),
                        request: s.full_name.clone(),
                        device: dev.id.to_string(),
                    }));
                }
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Records the device as taken (exclusively, or as one more share with its consumption) and
    /// returns the communication cost it adds.
    fn record(
        &mut self,
        claim: usize,
        slot: usize,
        pos: usize,
        shared: Option<Consumption>,
    ) -> u64 {
        match &shared {
            None => self.taken_by[pos].push(claim),
            Some(consumption) => {
                self.run_shares[pos] += 1;
                capacity::add_into(&mut self.run_capacity[pos], consumption);
            }
        }
        let dev = self.device(pos);
        let comm_added: u64 = self
            .chosen
            .iter()
            .filter(|&&other| other != pos)
            .map(|&other| pair_cost(&dev.topology, &self.device(other).topology))
            .sum();
        self.comm_cost += comm_added;
        self.chosen.push(pos);
        self.picks[claim].push(Pick { pos, slot, shared });
        comm_added
    }

    pub(super) fn undo(&mut self, u: Undo) {
        self.prune.backtracked = true;
        let s = &self.plan.slots[u.slot];
        for c in &mut self.constraints[u.claim] {
            c.remove(s);
        }
        let pick = self.picks[u.claim].pop().expect("undo follows a pick");
        self.chosen.pop();
        self.comm_cost -= u.comm_added;
        if u.exclusive
            && let Some(i) = self.taken_by[u.pos].iter().rposition(|&c| c == u.claim)
        {
            self.taken_by[u.pos].remove(i);
        }
        if u.shared {
            self.run_shares[u.pos] -= 1;
            if let Some(consumption) = &pick.shared {
                capacity::sub_from(&mut self.run_capacity[u.pos], consumption);
            }
        }
        if u.charged {
            self.charge(u.pos, false);
        }
    }
}
