//! Preemption for a gang: the group decision on the devices in use less the units the gang may
//! evict (lowest priorities first), then units given back one by one while the gang still fits on
//! the nodes chosen (module docs of [`crate::preemption`]).

use std::collections::{BTreeSet, HashMap, HashSet};

use k8s_openapi::api::resource::v1::AllocationResult;
use k8s_openapi::jiff::Timestamp;
use tessera_allocator::{AllocatedState, DeviceId};

use super::PreemptionInput;
use super::plan::{
    PreemptionCost, PreemptionDecision, PreemptionOutcome, PreemptionPlan, Reservation,
    plan_message, planned_victims,
};
use super::priority::{pod_priority, preemption_allowed};
use super::search::{grace_seconds, placement_devices, remove_pod};
use crate::claims::allocation;
use crate::group::search::{DemandFloor, place_group};
use crate::group::{GroupInput, GroupSettings};
use crate::planner::{Action, PodPlan};
use crate::pods::pod_usage_requests;
use crate::protocol::object_key;
use crate::resources::NodeUsage;
use crate::view::{PodContext, Settings, decide_pod_within};

/// The cluster with some units evicted: devices in use, node usage, and which units are out.
struct Evicted<'a> {
    input: &'a PreemptionInput<'a>,
    working: AllocatedState,
    usage: HashMap<String, NodeUsage>,
    /// Per unit: evicted now.
    out: Vec<bool>,
    reserved: HashSet<&'a DeviceId>,
}

impl Evicted<'_> {
    /// Whether claim `c` is freed: every unit reserving it is out.
    fn freed(&self, c: usize) -> bool {
        self.input.victims.claims[c]
            .units
            .iter()
            .all(|&u| self.out[u])
    }

    /// Takes unit `u` out: its claims that are now free leave the devices in use (reserved
    /// devices stay), its pods leave their nodes.
    fn evict(&mut self, u: usize) {
        let victims = self.input.victims;
        self.out[u] = true;
        for &c in &victims.units[u].claims {
            if !self.freed(c) {
                continue;
            }
            let held = &victims.claims[c];
            if held.whole {
                // Its devices by id: no allocation to read again.
                for (id, _) in held
                    .devices
                    .iter()
                    .filter(|(id, _)| !self.reserved.contains(id))
                {
                    self.working.remove_device(id);
                }
                continue;
            }
            if let Some(a) = allocation(&held.claim) {
                let _ = self.working.remove_allocation(a);
            }
            for (id, _) in &held.devices {
                if self.reserved.contains(id) {
                    self.working.insert_device(id.clone());
                }
            }
        }
        for &p in &victims.units[u].pods {
            let pod = &victims.pods[p];
            if let Some(usage) = self.usage.get_mut(&pod.node) {
                remove_pod(usage, pod.requests);
            }
        }
    }

    /// Gives unit `u` back: the inverse of [`Evicted::evict`].
    fn reprieve(&mut self, u: usize) {
        let victims = self.input.victims;
        for &c in &victims.units[u].claims {
            let held = &victims.claims[c];
            if !self.freed(c) {
                continue;
            }
            if held.whole {
                for (id, _) in &held.devices {
                    self.working.insert_device(id.clone());
                }
            } else if let Some(a) = allocation(&held.claim) {
                let _ = self.working.add_allocation(a);
            }
        }
        self.out[u] = false;
        for &p in &victims.units[u].pods {
            let pod = &victims.pods[p];
            self.usage
                .entry(pod.node.clone())
                .or_default()
                .add_pod(pod.requests);
        }
    }
}

/// The search's state.
struct GangSearch<'a, 'c> {
    group: &'a GroupInput<'a>,
    context: &'a PodContext<'c>,
    settings: &'a Settings,
    group_settings: &'a GroupSettings,
    now: Timestamp,
    /// What the gang needs at least, counted once ([`DemandFloor`]).
    floor: DemandFloor,
    steps: usize,
    /// Pod decisions taken, in group decisions and in reprieves.
    pod_decisions: usize,
    truncated: bool,
}

impl GangSearch<'_, '_> {
    /// The members placed on `nodes` (indices) placed there again, in the decision's order, on
    /// `evicted`: the new decisions if each still fits on its node, else `None`. The state is
    /// left as it was.
    fn replace_on(
        &mut self,
        evicted: &mut Evicted<'_>,
        decisions: &[(usize, PodPlan)],
        nodes: &BTreeSet<usize>,
    ) -> Option<Vec<(usize, PodPlan)>> {
        let mut new = decisions.to_vec();
        let mut added: Vec<AllocationResult> = Vec::new();
        let mut fits = true;
        for &node in nodes {
            let name = &self.context.devices.nodes[node].info.name;
            let mut usage = HashMap::from([(
                name.clone(),
                evicted.usage.get(name).copied().unwrap_or_default(),
            )]);
            for (i, decision) in new.iter_mut() {
                let placed_here = matches!(&decision.action, Action::Place(p) if &p.node == name);
                if !placed_here || !fits {
                    continue;
                }
                self.steps += 1;
                self.pod_decisions += 1;
                let member = &self.group.members[*i];
                let context = PodContext {
                    devices: self.context.devices,
                    unmanaged: self.context.unmanaged,
                    in_use: &evicted.working,
                    usage: &usage,
                };
                let again = decide_pod_within(
                    member.pod,
                    member.claims,
                    &context,
                    self.settings,
                    self.now,
                    Some(&[node]),
                );
                let Action::Place(p) = &again.action else {
                    fits = false;
                    continue;
                };
                for w in &p.writes {
                    let _ = evicted.working.add_allocation(&w.allocation);
                    added.push(w.allocation.clone());
                }
                if let Some(u) = usage.get_mut(name) {
                    u.add_pod(pod_usage_requests(member.pod));
                }
                *decision = again;
            }
        }
        for a in &added {
            let _ = evicted.working.remove_allocation(a);
        }
        fits.then_some(new)
    }

    /// The group decision on `evicted`, if it places the gang (domains too full to hold it
    /// are skipped by counting, [`place_group`]).
    fn place(&mut self, evicted: &Evicted<'_>) -> Option<Vec<(usize, PodPlan)>> {
        let context = PodContext {
            devices: self.context.devices,
            unmanaged: self.context.unmanaged,
            in_use: &evicted.working,
            usage: &evicted.usage,
        };
        let placed = place_group(
            self.group,
            &context,
            self.settings,
            self.group_settings,
            self.now,
            self.floor,
        );
        // One group decision, however many pod decisions it took.
        self.steps += 1;
        self.pod_decisions += placed.steps;
        self.truncated |= placed.truncated;
        placed.plans
    }
}

/// The nodes a gang's decisions place pods on.
fn used_nodes(decisions: &[(usize, PodPlan)]) -> BTreeSet<String> {
    decisions
        .iter()
        .filter_map(|(_, d)| match &d.action {
            Action::Place(p) => Some(p.node.clone()),
            Action::Release { node } => node.clone(),
            _ => None,
        })
        .collect()
}

/// Searches for lower-priority victims whose eviction lets the gang be placed. Its priority is
/// its members' lowest; a member with `preemptionPolicy: Never` keeps the gang from preempting.
/// `context.in_use` is what allocated claims hold, without nominations (`input.reserved`).
///
/// Eligible units are evicted priority level by level, lowest first, until the group decision
/// places the gang (so the gang goes where the lowest priorities make room); then the units it
/// does not need are given back ([`reprieve`]).
pub fn preempt_group(
    group: &GroupInput<'_>,
    context: &PodContext<'_>,
    settings: &Settings,
    group_settings: &GroupSettings,
    input: &PreemptionInput<'_>,
    now: Timestamp,
) -> PreemptionDecision {
    if let Some(m) = group.members.iter().find(|m| !preemption_allowed(m.pod)) {
        return PreemptionDecision::not_possible(format!(
            "pod {} of {} has preemptionPolicy Never, so the group preempts nobody",
            object_key(&m.pod.metadata),
            group.key
        ));
    }
    let Some(priority) = group.members.iter().map(|m| pod_priority(m.pod)).min() else {
        return PreemptionDecision::not_possible(format!("{} has no pod to place", group.key));
    };
    let victims = input.victims;
    let (eligible, exclusions) = victims.eligible(priority, input.refused, Some(group.key));
    let mut evicted = Evicted {
        input,
        working: context.in_use.clone(),
        usage: context.usage.clone(),
        out: vec![false; victims.units.len()],
        reserved: input.reserved.iter().collect(),
    };
    for id in input.reserved {
        evicted.working.insert_device(id.clone());
    }
    let candidates: Vec<usize> = (0..victims.units.len()).filter(|&u| eligible[u]).collect();
    let mut search = GangSearch {
        group,
        context,
        settings,
        group_settings,
        now,
        floor: DemandFloor::of(group, context),
        steps: 0,
        pod_decisions: 0,
        truncated: false,
    };
    let Some(first) = evict_by_level(&mut search, &mut evicted, &candidates) else {
        let why = format!(
            "{} does not fit even with every pod of lower priority that may be evicted gone",
            group.key
        );
        let mut decision = PreemptionDecision::set_aside(&why, &exclusions);
        decision.steps = search.steps;
        decision.pod_decisions = search.pod_decisions;
        return decision;
    };
    let decisions = reprieve(&mut search, &mut evicted, &candidates, first);
    let out: Vec<usize> = candidates
        .iter()
        .copied()
        .filter(|&u| evicted.out[u])
        .collect();
    let outcome = gang_outcome(group, context, input, &out, &decisions);
    PreemptionDecision {
        outcome,
        steps: search.steps,
        combinations: 0,
        pod_decisions: search.pod_decisions,
        truncated: search.truncated,
    }
}

/// What a gang's search ends in once `out` (the units evicted) is known: no preemption when none
/// needs to go, blocked when they would exceed a disruption budget, else the plan.
fn gang_outcome(
    group: &GroupInput<'_>,
    context: &PodContext<'_>,
    input: &PreemptionInput<'_>,
    out: &[usize],
    decisions: &[(usize, PodPlan)],
) -> PreemptionOutcome {
    if out.is_empty() {
        // Nothing needs to go (the gang fits on free devices): not a preemption.
        PreemptionOutcome::NotPossible {
            message: format!("{} fits without preempting anyone", group.key),
            budgets: false,
        }
    } else if !input.victims.within_budgets(out.iter().copied()) {
        let why = "the victims it needs would exceed a PodDisruptionBudget";
        PreemptionOutcome::NotPossible {
            message: format!("preemption cannot make room: {why}"),
            budgets: true,
        }
    } else {
        PreemptionOutcome::Preempt(group_plan(group, context, input, out, decisions))
    }
}

/// Evicts the candidates priority level by level, lowest first, until the group decision places
/// the gang; its decisions.
fn evict_by_level(
    search: &mut GangSearch<'_, '_>,
    evicted: &mut Evicted<'_>,
    candidates: &[usize],
) -> Option<Vec<(usize, PodPlan)>> {
    let victims = evicted.input.victims;
    let levels: BTreeSet<i32> = candidates
        .iter()
        .map(|&u| victims.units[u].priority)
        .collect();
    for level in levels {
        for &u in candidates {
            if !evicted.out[u] && victims.units[u].priority <= level {
                evicted.evict(u);
            }
        }
        if let Some(decisions) = search.place(evicted) {
            return Some(decisions);
        }
    }
    None
}

/// Gives evicted units back while the gang still fits on the nodes the group decision chose:
/// first, at once, every unit with no pod or device on those nodes (the decision stays valid);
/// then one by one, units under a budget they would overdraw first, then the highest priority
/// and most work first, each kept given back if the members on its nodes still fit there
/// ([`GangSearch::replace_on`]). Returns the gang's decisions on what is left evicted.
fn reprieve(
    search: &mut GangSearch<'_, '_>,
    evicted: &mut Evicted<'_>,
    candidates: &[usize],
    first: Vec<(usize, PodPlan)>,
) -> Vec<(usize, PodPlan)> {
    let victims = evicted.input.victims;
    let nodes = &search.context.devices.nodes;
    let mut decisions = first;
    // The few nodes the decision chose, by index and name: units are matched against them
    // without a lookup per pod.
    let used: Vec<(usize, String)> = used_nodes(&decisions)
        .into_iter()
        .filter_map(|name| Some((nodes.iter().position(|n| n.info.name == name)?, name)))
        .collect();
    let touched = |u: usize| -> BTreeSet<usize> {
        let unit = &victims.units[u];
        let on_devices = unit
            .claims
            .iter()
            .flat_map(|&c| victims.claims[c].devices.iter().map(|(_, n)| *n))
            .filter(|n| used.iter().any(|(i, _)| i == n));
        let on_pods = unit.pods.iter().filter_map(|&p| {
            let node = victims.pods[p].node.as_str();
            used.iter().find(|(_, name)| name == node).map(|(i, _)| *i)
        });
        on_devices.chain(on_pods).collect()
    };
    let mut order: Vec<(usize, BTreeSet<usize>)> = Vec::new();
    for &u in candidates {
        if !evicted.out[u] {
            continue;
        }
        let on = touched(u);
        if on.is_empty() {
            evicted.reprieve(u);
        } else {
            order.push((u, on));
        }
    }
    let out: Vec<usize> = order.iter().map(|(u, _)| *u).collect();
    let over = overdrawn(victims, &out);
    order.sort_by_key(|(u, _)| {
        let unit = &victims.units[*u];
        (
            !unit.budgets.keys().any(|b| over.contains(b)),
            std::cmp::Reverse(unit.priority),
            std::cmp::Reverse(unit.gpu_seconds),
            *u,
        )
    });
    let budget = evicted.input.settings.step_budget;
    for (u, on) in order {
        if search.steps >= budget {
            search.truncated = true;
            break;
        }
        evicted.reprieve(u);
        match search.replace_on(evicted, &decisions, &on) {
            Some(d) => decisions = d,
            None => evicted.evict(u),
        }
    }
    decisions
}

/// The budgets that evicting all of `units` would overdraw.
fn overdrawn(victims: &super::Victims, units: &[usize]) -> BTreeSet<usize> {
    let mut spent: HashMap<usize, u32> = HashMap::new();
    for &u in units {
        for (&b, &n) in &victims.units[u].budgets {
            *spent.entry(b).or_default() += n;
        }
    }
    spent
        .into_iter()
        .filter(|&(b, n)| n > victims.budgets.allowed(b))
        .map(|(b, _)| b)
        .collect()
}

/// The plan: the units still out, a reservation per member placed.
fn group_plan(
    group: &GroupInput<'_>,
    context: &PodContext<'_>,
    input: &PreemptionInput<'_>,
    out: &[usize],
    decisions: &[(usize, PodPlan)],
) -> PreemptionPlan {
    let victims = planned_victims(input.victims, out);
    let reservations: Vec<Reservation> = decisions
        .iter()
        .filter_map(|(i, d)| {
            let Action::Place(p) = &d.action else {
                return None;
            };
            let pod = group.members.get(*i)?.pod;
            Some(Reservation {
                pod: object_key(&pod.metadata),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                node: p.node.clone(),
                devices: placement_devices(p),
            })
        })
        .collect();
    let cost = PreemptionCost::of(input.victims, out.iter().copied());
    let message = format!(
        "{}: {}",
        group.key,
        plan_message(&context.devices.managed, &victims, &reservations, &cost)
    );
    PreemptionPlan {
        grace_seconds: grace_seconds(input.victims, out),
        victims,
        reservations,
        cost,
        message,
    }
}
