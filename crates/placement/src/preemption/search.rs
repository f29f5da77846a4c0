//! The preemption search for one pod: per node, victim sets in order of cost, each checked by the
//! pod's own decision on the devices in use less what the set frees (module docs of
//! [`crate::preemption`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;
use tessera_allocator::{AllocatedState, DeviceId};

use super::PreemptionInput;
use super::plan::{
    PreemptionCost, PreemptionDecision, PreemptionOutcome, PreemptionPlan, Reservation,
    not_possible, plan_message, planned_victims,
};
use super::priority::{pod_priority, preemption_allowed};
use super::victims::Victims;
use crate::claims::{PodClaims, allocation};
use crate::group::group_key;
use crate::nodes::{NodeFacts, PodRequirements};
use crate::planner::{Action, Placement};
use crate::protocol::object_key;
use crate::resolve::PodClaim;
use crate::resources::{NodeUsage, Requests};
use crate::view::{PodContext, Settings, decide_pod_within};

/// How many devices a pod's claims ask for, and of which classes: the counts preemption bounds
/// its search with. An `All` request counts nothing (its size depends on the node); a request
/// with alternatives counts its smallest.
pub(crate) struct Demand {
    pub count: usize,
    pub classes: Vec<String>,
}

impl Demand {
    pub(crate) fn of<'c>(claims: impl IntoIterator<Item = &'c Arc<ResourceClaim>>) -> Demand {
        let mut demand = Demand {
            count: 0,
            classes: Vec::new(),
        };
        let requests = claims
            .into_iter()
            .filter_map(|c| c.spec.as_ref()?.devices.as_ref()?.requests.as_ref())
            .flatten();
        for request in requests {
            let count = |mode: Option<&str>, count: Option<i64>| match mode {
                Some("All") => 0,
                _ => usize::try_from(count.unwrap_or(1)).unwrap_or(0),
            };
            if let Some(e) = &request.exactly {
                demand.count += count(e.allocation_mode.as_deref(), e.count);
                demand.classes.push(e.device_class_name.clone());
            } else if let Some(subs) = &request.first_available {
                demand.count += subs
                    .iter()
                    .map(|s| count(s.allocation_mode.as_deref(), s.count))
                    .min()
                    .unwrap_or(0);
                demand
                    .classes
                    .extend(subs.iter().map(|s| s.device_class_name.clone()));
            }
        }
        demand.classes.sort();
        demand.classes.dedup();
        demand
    }
}

/// What a pod's claims need of one node's devices. A domain's channel is on no node: evicting
/// pods frees none (it is free again only when its domain's claim is deallocated).
fn node_demand(sorted: &PodClaims) -> Demand {
    Demand::of(
        sorted
            .own
            .iter()
            .chain(&sorted.pending)
            .filter(|c| !crate::imex::is_domain_claim(c)),
    )
}

/// Sets of the same [`rank`] as a node's first plan that are still checked for a better topology.
const TIE_CHECKS: usize = 4;

/// Nodes whose bound ranks the same as the best plan found that are still searched for a better
/// topology, once there is a best plan.
const TIE_NODES: usize = 8;

/// A held claim with devices on one node, and how many of them the preemptor could use.
struct NodeClaim {
    index: usize,
    usable: usize,
}

/// One node where evicting units could make room.
struct NodeCandidate {
    node: usize,
    /// Eligible units with usable devices here, cheapest first.
    units: Vec<usize>,
    /// Claims here whose consumers are all eligible.
    claims: Vec<NodeClaim>,
    /// Usable devices to free beyond the free ones.
    deficit: usize,
    /// Fewest units that can free the deficit.
    min_units: usize,
}

/// A plan found on one node.
struct Found {
    node: usize,
    units: Vec<usize>,
    cost: PreemptionCost,
    placement: Placement,
}

impl Found {
    /// Fewer victims and lower priorities first ([`rank`]); among plans that tie there, the
    /// better connected placement (one NVLink island, one NUMA node) before less work lost, then
    /// the rest of the topology score, then the node's name.
    fn better_than(&self, other: &Found, nodes: &[NodeFacts]) -> bool {
        let name = |n: usize| nodes[n].info.name.as_str();
        let key = |f: &Found| {
            (
                rank(&f.cost),
                f.placement.score.connectivity(),
                f.cost.gpu_seconds,
                f.placement.score,
                name(f.node),
            )
        };
        key(self) < key(other)
    }
}

/// A placement no other victim set can connect better: on one NUMA node with every device
/// beside an NVLink peer, or a single device (no pair to connect, one NUMA node: every placement
/// of one device is connected alike).
fn well_connected(placement: &Placement) -> bool {
    let (_, numa_crossings, nvlink_stranded, numa_nodes) = placement.score.connectivity();
    let alone = placement_devices(placement).len() == 1;
    alone || (numa_crossings == 0 && nvlink_stranded == 0 && numa_nodes <= 1)
}

/// What a plan's victims cost before topology is looked at: how many, their highest priority,
/// the sum of their priorities. Work lost (GPU-hours) is weighed after the placement's
/// connectivity: a few GPU-hours never buy a placement across NUMA nodes or NVLink islands.
fn rank(cost: &PreemptionCost) -> (usize, i32, i64) {
    (cost.victims, cost.max_priority, cost.priority_sum)
}

/// The search's shared state.
struct Search<'a, 'c> {
    pod: &'a Pod,
    claims: &'a [PodClaim],
    context: &'a PodContext<'c>,
    settings: &'a Settings,
    input: &'a PreemptionInput<'a>,
    now: Timestamp,
    /// The devices in use, reservations included, changed and restored around each check.
    working: AllocatedState,
    reserved: &'a HashSet<&'a DeviceId>,
    best: Option<Found>,
    /// Nodes left to search that rank no better than the best plan ([`TIE_NODES`]).
    tie_nodes: usize,
    feasible_nodes: usize,
    steps: usize,
    combinations: usize,
    truncated: bool,
}

/// Searches for the cheapest set of lower-priority victims whose eviction lets `pod` (gated, its
/// claims resolved, not placeable on free devices) be placed. `context.in_use` is what allocated
/// claims hold, without nominations: those are `input.reserved`.
pub fn preempt_pod(
    pod: &Pod,
    claims: &[PodClaim],
    context: &PodContext<'_>,
    settings: &Settings,
    input: &PreemptionInput<'_>,
    now: Timestamp,
) -> PreemptionDecision {
    if !preemption_allowed(pod) {
        return PreemptionDecision::not_possible(
            "the pod's preemptionPolicy is Never, so it preempts nobody".into(),
        );
    }
    let sorted = PodClaims::sort(pod, claims);
    if sorted.pending.is_empty() {
        return PreemptionDecision::not_possible("the pod's claims are all allocated".into());
    }
    let demand = node_demand(&sorted);
    let usable = match usable_devices(context, &demand) {
        Ok(usable) => usable,
        Err(message) => return PreemptionDecision::not_possible(message),
    };
    let priority = pod_priority(pod);
    let victims = input.victims;
    let (eligible, exclusions) = victims.eligible(priority, input.refused, group_key(pod).as_ref());
    let reserved: HashSet<&DeviceId> = input.reserved.iter().collect();
    let requirements = PodRequirements::of(pod);
    let candidate_input = CandidateInput {
        context,
        victims,
        eligible: &eligible,
        usable: &usable,
        reserved: &reserved,
        demand: demand.count,
        requirements: &requirements,
    };
    let names = |n: usize| context.devices.nodes[n].info.name.as_str();
    let mut bounds: Vec<(PreemptionCost, usize)> = victims
        .by_node
        .iter()
        .filter_map(|(&node, units)| Some((candidate_input.bound(node, units)?, node)))
        .collect();
    bounds.sort_by(|a, b| (a.0, names(a.1)).cmp(&(b.0, names(b.1))));
    if bounds.is_empty() {
        let why = format!(
            "no node has {} device(s) for the pod once lower-priority pods that may be evicted are gone",
            demand.count
        );
        return PreemptionDecision::set_aside(&why, &exclusions);
    }
    let mut working = context.in_use.clone();
    for id in input.reserved {
        working.insert_device(id.clone());
    }
    let mut search = Search {
        pod,
        claims,
        context,
        settings,
        input,
        now,
        working,
        reserved: &reserved,
        best: None,
        tie_nodes: TIE_NODES,
        feasible_nodes: 0,
        steps: 0,
        combinations: 0,
        truncated: false,
    };
    search.run(&candidate_input, &bounds);
    search.decision(&exclusions)
}

/// The devices the pod's classes select (borrowed from the index), or why that is unknown.
fn usable_devices<'c>(
    context: &'c PodContext<'_>,
    demand: &Demand,
) -> Result<HashSet<&'c DeviceId>, String> {
    let mut usable = HashSet::new();
    for class in &demand.classes {
        match context.devices.managed.devices_of_class(class) {
            Some(Ok(ids)) => usable.extend(ids),
            // The pod's own decision reports a missing class or a failing selector.
            Some(Err(e)) => return Err(format!("class {class}: {e}")),
            None => return Err(format!("DeviceClass {class} does not exist")),
        }
    }
    Ok(usable)
}

/// What every node candidate is computed from.
struct CandidateInput<'a> {
    context: &'a PodContext<'a>,
    victims: &'a Victims,
    /// Per unit: may this preemptor evict it.
    eligible: &'a [bool],
    /// Devices the preemptor's classes select.
    usable: &'a HashSet<&'a DeviceId>,
    /// Devices nominated for others.
    reserved: &'a HashSet<&'a DeviceId>,
    /// Devices the preemptor asks for.
    demand: usize,
    requirements: &'a PodRequirements,
}

impl CandidateInput<'_> {
    /// Whether a device could go to the preemptor once free.
    fn counts(&self, id: &DeviceId) -> bool {
        self.usable.contains(id) && !self.reserved.contains(id)
    }

    /// The claims on `node` that evicting eligible `units` could free, with their usable devices.
    fn node_claims(&self, node: usize, units: &[(usize, usize)]) -> Vec<NodeClaim> {
        let victims = self.victims;
        let mut claims: Vec<NodeClaim> = units
            .iter()
            .map(|&(u, _)| u)
            .filter(|&u| self.eligible[u])
            .flat_map(|u| victims.units[u].claims.iter().copied())
            .filter(|&c| victims.claims[c].units.iter().all(|&u| self.eligible[u]))
            .map(|c| NodeClaim {
                index: c,
                usable: victims.claims[c]
                    .devices
                    .iter()
                    .filter(|(id, n)| *n == node && self.counts(id))
                    .count(),
            })
            .filter(|c| c.usable > 0)
            .collect();
        claims.sort_by_key(|c| c.index);
        claims.dedup_by_key(|c| c.index);
        claims
    }

    /// A lower bound on the cost of any plan on `node`, from device counts alone (any managed
    /// device counted as usable): `None` when its eligible units cannot free enough. Cheap, so
    /// that every node can be bounded and only the promising ones searched.
    fn bound(&self, node: usize, units: &[(usize, usize)]) -> Option<PreemptionCost> {
        let mut held: Vec<(usize, usize)> = units
            .iter()
            .filter(|(u, _)| self.eligible[*u])
            .copied()
            .collect();
        if held.is_empty() {
            return None;
        }
        let name = &self.context.devices.nodes[node].info.name;
        let free = self
            .context
            .devices
            .managed
            .node_devices(name)
            .filter(|(id, _)| !self.context.in_use.is_dedicated(id) && !self.reserved.contains(id))
            .count();
        let deficit = self.demand.saturating_sub(free);
        held.sort_unstable_by_key(|&(_, devices)| std::cmp::Reverse(devices));
        let (mut min_units, mut covered) = (0, 0);
        while covered < deficit {
            covered += held.get(min_units)?.1;
            min_units += 1;
        }
        held.sort_unstable_by_key(|&(u, _)| {
            let unit = &self.victims.units[u];
            (unit.pods.len(), unit.priority, unit.gpu_seconds, u)
        });
        Some(PreemptionCost::of(
            self.victims,
            held.iter().take(min_units.max(1)).map(|&(u, _)| u),
        ))
    }

    /// What `node` offers the preemptor, if evicting its eligible units could make room there.
    fn candidate(&self, node: usize, units: &[(usize, usize)]) -> Option<NodeCandidate> {
        let claims = self.node_claims(node, units);
        // Per unit, the usable devices it frees here, counting a shared claim for each of its
        // units: an over-count, so the bound below stays a bound.
        let mut frees: HashMap<usize, usize> = HashMap::new();
        for c in &claims {
            for &u in &self.victims.claims[c.index].units {
                *frees.entry(u).or_default() += c.usable;
            }
        }
        let facts = &self.context.devices.nodes[node];
        let free = self
            .context
            .devices
            .managed
            .node_devices(&facts.info.name)
            .filter(|(id, _)| self.counts(id) && !self.context.in_use.is_dedicated(id))
            .count();
        let deficit = self.demand.saturating_sub(free);
        let mut sizes: Vec<usize> = frees.values().copied().collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let (mut min_units, mut covered) = (0, 0);
        while covered < deficit {
            covered += *sizes.get(min_units)?;
            min_units += 1;
        }
        let mut units: Vec<usize> = frees.into_keys().collect();
        let usage = usage_without(self.context, self.victims, node, &units);
        if self.requirements.rejection(facts, &usage).is_some() {
            return None;
        }
        units.sort_by_cached_key(|&u| unit_order(self.victims, u, node));
        Some(NodeCandidate {
            node,
            units,
            claims,
            deficit,
            min_units: min_units.max(1),
        })
    }
}

/// The order units are enumerated in: any set's cost grows when one of its units is replaced by
/// a later one, so sets come out cheapest first. Among units of equal cost, the one holding the
/// lowest-numbered device on the node comes first, so the first sets free neighbouring devices.
fn unit_order(victims: &Victims, unit: usize, node: usize) -> (usize, i32, u64, String, usize) {
    let u = &victims.units[unit];
    let first = u
        .claims
        .iter()
        .flat_map(|&c| victims.claims[c].devices.iter())
        .filter(|(_, n)| *n == node)
        .map(|(id, _)| natural_key(id.device()))
        .min()
        .unwrap_or_default();
    (u.pods.len(), u.priority, u.gpu_seconds, first, unit)
}

/// A device name whose trailing number is zero-padded, so names compare in numeric order.
fn natural_key(name: &str) -> String {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (prefix, number) = name.split_at(name.len() - digits);
    format!("{prefix}{number:0>20}")
}

/// What the pods on `node` request, less the pods of `units` bound there.
fn usage_without(
    context: &PodContext<'_>,
    victims: &Victims,
    node: usize,
    units: &[usize],
) -> NodeUsage {
    let name = &context.devices.nodes[node].info.name;
    let mut usage = context.usage.get(name).copied().unwrap_or_default();
    for &u in units {
        for &p in &victims.units[u].pods {
            let pod = &victims.pods[p];
            if &pod.node == name {
                remove_pod(&mut usage, pod.requests);
            }
        }
    }
    usage
}

/// Takes one pod requesting `requests` off a node's usage.
pub(crate) fn remove_pod(usage: &mut NodeUsage, requests: Requests) {
    usage.requests.cpu = usage.requests.cpu.saturating_sub(requests.cpu);
    usage.requests.memory = usage.requests.memory.saturating_sub(requests.memory);
    usage.pods = (usage.pods - 1).max(0);
}

/// Sets of `k` positions into a candidate's units, cheapest first (each set's successors replace
/// one unit by the next one not in the set, which never costs less).
struct Combinations {
    heap: BinaryHeap<Reverse<(PreemptionCost, Vec<usize>)>>,
    seen: HashSet<Vec<usize>>,
    n: usize,
}

impl Combinations {
    fn new(victims: &Victims, units: &[usize], k: usize) -> Combinations {
        let first: Vec<usize> = (0..k).collect();
        let mut combinations = Combinations {
            heap: BinaryHeap::new(),
            seen: HashSet::new(),
            n: units.len(),
        };
        combinations.push(victims, units, first);
        combinations
    }

    fn push(&mut self, victims: &Victims, units: &[usize], positions: Vec<usize>) {
        if self.seen.insert(positions.clone()) {
            let cost = PreemptionCost::of(victims, positions.iter().map(|&p| units[p]));
            self.heap.push(Reverse((cost, positions)));
        }
    }

    fn peek_cost(&self) -> Option<PreemptionCost> {
        self.heap.peek().map(|Reverse((cost, _))| *cost)
    }

    fn pop(&mut self, victims: &Victims, units: &[usize]) -> Option<(PreemptionCost, Vec<usize>)> {
        let Reverse((cost, positions)) = self.heap.pop()?;
        for j in 0..positions.len() {
            let limit = positions.get(j + 1).copied().unwrap_or(self.n);
            if positions[j] + 1 < limit {
                let mut next = positions.clone();
                next[j] += 1;
                self.push(victims, units, next);
            }
        }
        Some((cost, positions))
    }
}

impl Search<'_, '_> {
    fn node_name(&self, node: usize) -> &str {
        &self.context.devices.nodes[node].info.name
    }

    /// Whether the search must stop before looking at a node whose plans cost at least `bound`.
    fn done_before(&mut self, bound: &PreemptionCost, cap: usize) -> bool {
        if let Some(best) = &self.best {
            if self.beyond(bound, best) || self.tie_nodes == 0 {
                return true;
            }
            if rank(bound) == rank(&best.cost) {
                self.tie_nodes -= 1;
            }
        }
        if self.feasible_nodes >= cap {
            return true;
        }
        if self.steps >= self.input.settings.step_budget
            || self.combinations >= self.input.settings.combination_budget
        {
            self.truncated = true;
            return true;
        }
        false
    }

    /// Visits the nodes cheapest bound first, searching each that can make room.
    fn run(&mut self, candidates: &CandidateInput<'_>, bounds: &[(PreemptionCost, usize)]) {
        let cap = self.input.settings.candidate_cap(bounds.len());
        for (bound, node) in bounds {
            if self.done_before(bound, cap) {
                break;
            }
            let units = &self.input.victims.by_node[node];
            let Some(candidate) = candidates.candidate(*node, units) else {
                continue;
            };
            if let Some(found) = self.search_node(&candidate) {
                self.feasible_nodes += 1;
                let nodes = &self.context.devices.nodes;
                if self
                    .best
                    .as_ref()
                    .is_none_or(|b| found.better_than(b, nodes))
                {
                    self.best = Some(found);
                }
            }
        }
    }

    /// The cheapest plan on one node (ties: the better topology score among the first
    /// [`TIE_CHECKS`] further sets of the same cost).
    fn search_node(&mut self, candidate: &NodeCandidate) -> Option<Found> {
        let victims = self.input.victims;
        let mut best: Option<Found> = None;
        let mut ties = TIE_CHECKS;
        for k in candidate.min_units..=candidate.units.len() {
            let mut sets = Combinations::new(victims, &candidate.units, k);
            let floor = sets.peek_cost()?;
            if self.beaten(&best, &floor) {
                break;
            }
            while let Some(cost) = sets.peek_cost() {
                if self.beaten(&best, &cost) || (best.is_some() && ties == 0) {
                    break;
                }
                if self.combinations >= self.input.settings.combination_budget
                    || self.steps >= self.input.settings.step_budget
                {
                    self.truncated = true;
                    return best;
                }
                self.combinations += 1;
                let (cost, positions) = sets.pop(victims, &candidate.units)?;
                let units: Vec<usize> = positions.iter().map(|&p| candidate.units[p]).collect();
                let checked = self.steps;
                let placement = self.check(candidate, &units);
                if best.is_some() && self.steps > checked {
                    ties -= 1;
                }
                if let Some(placement) = placement {
                    if self.takes_the_node(candidate.node, &placement) {
                        // Every set that fits here frees the whole node: the same placement.
                        ties = 0;
                    }
                    let found = Found {
                        node: candidate.node,
                        units,
                        cost,
                        placement,
                    };
                    let nodes = &self.context.devices.nodes;
                    if best.as_ref().is_none_or(|b| found.better_than(b, nodes)) {
                        best = Some(found);
                    }
                }
            }
        }
        best
    }

    /// Whether `placement` takes every managed device of `node`.
    fn takes_the_node(&self, node: usize, placement: &Placement) -> bool {
        let devices = &self.context.devices.managed;
        let all = devices.node_devices(self.node_name(node)).count();
        placement_devices(placement).len() >= all
    }

    /// Whether a set costing `cost` can no longer be the best (it ranks below the best found on
    /// this node or overall; an equal rank may still win on topology, [`Found::better_than`]).
    fn beaten(&self, node_best: &Option<Found>, cost: &PreemptionCost) -> bool {
        node_best.as_ref().is_some_and(|b| self.beyond(cost, b))
            || self.best.as_ref().is_some_and(|b| self.beyond(cost, b))
    }

    /// Whether plans costing at least `cost` cannot beat `best`: they rank below it, or its
    /// placement is as well connected as a placement gets ([`well_connected`]) and they cost
    /// more (only work lost is left to compare).
    fn beyond(&self, cost: &PreemptionCost, best: &Found) -> bool {
        if well_connected(&best.placement) {
            *cost > best.cost
        } else {
            rank(cost) > rank(&best.cost)
        }
    }

    /// The pod's placement on the candidate's node once `units` are gone, if it fits.
    fn check(&mut self, candidate: &NodeCandidate, units: &[usize]) -> Option<Placement> {
        let victims = self.input.victims;
        let freed: Vec<&NodeClaim> = candidate
            .claims
            .iter()
            .filter(|c| {
                victims.claims[c.index]
                    .units
                    .iter()
                    .all(|u| units.contains(u))
            })
            .collect();
        if freed.iter().map(|c| c.usable).sum::<usize>() < candidate.deficit
            || !victims.within_budgets(units.iter().copied())
        {
            return None;
        }
        self.steps += 1;
        let allocations: Vec<_> = freed
            .iter()
            .filter_map(|c| allocation(&victims.claims[c.index].claim))
            .collect();
        for a in &allocations {
            let _ = self.working.remove_allocation(a);
        }
        for c in &freed {
            for (id, _) in &victims.claims[c.index].devices {
                if self.reserved.contains(id) {
                    self.working.insert_device(id.clone());
                }
            }
        }
        let name = self.node_name(candidate.node).to_owned();
        let usage = HashMap::from([(
            name,
            usage_without(self.context, victims, candidate.node, units),
        )]);
        let context = PodContext {
            devices: self.context.devices,
            unmanaged: self.context.unmanaged,
            in_use: &self.working,
            usage: &usage,
        };
        let within = [candidate.node];
        let decision = decide_pod_within(
            self.pod,
            self.claims,
            &context,
            self.settings,
            self.now,
            Some(&within),
        );
        for a in &allocations {
            let _ = self.working.add_allocation(a);
        }
        match decision.action {
            Action::Place(placement) => Some(placement),
            _ => None,
        }
    }

    fn decision(self, exclusions: &super::victims::Exclusions) -> PreemptionDecision {
        let outcome = match &self.best {
            Some(found) => PreemptionOutcome::Preempt(self.plan(found)),
            None => {
                let why = if self.truncated {
                    "no set of lower-priority victims found within the search budget lets the pod fit"
                } else {
                    "no set of lower-priority victims lets the pod fit with its placement requirements"
                };
                not_possible(why, exclusions)
            }
        };
        PreemptionDecision {
            outcome,
            steps: self.steps,
            combinations: self.combinations,
            // One pod decision per victim set checked.
            pod_decisions: self.steps,
            truncated: self.truncated,
        }
    }

    fn plan(&self, found: &Found) -> PreemptionPlan {
        let victims = planned_victims(self.input.victims, &found.units);
        let reservation = Reservation {
            pod: object_key(&self.pod.metadata),
            uid: self.pod.metadata.uid.clone().unwrap_or_default(),
            node: found.placement.node.clone(),
            devices: placement_devices(&found.placement),
        };
        let reservations = vec![reservation];
        let message = plan_message(
            &self.context.devices.managed,
            &victims,
            &reservations,
            &found.cost,
        );
        PreemptionPlan {
            grace_seconds: grace_seconds(self.input.victims, &found.units),
            victims,
            reservations,
            cost: found.cost,
            message,
        }
    }
}

/// The longest grace period among the pods of `units`.
pub(crate) fn grace_seconds(victims: &Victims, units: &[usize]) -> i64 {
    units
        .iter()
        .flat_map(|&u| victims.units[u].pods.iter())
        .map(|&p| victims.pods[p].grace_seconds)
        .max()
        .unwrap_or(0)
}

/// The devices a placement allocates (admin access aside).
pub(crate) fn placement_devices(placement: &Placement) -> Vec<DeviceId> {
    placement
        .writes
        .iter()
        .flat_map(|w| {
            w.allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
        })
        .filter(|r| r.admin_access != Some(true))
        .map(|r| DeviceId::new(&r.driver, &r.pool, &r.device))
        .collect()
}
