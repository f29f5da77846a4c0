//! The group's decision: all or nothing, close together. [`decide_group`] tries the domains level
//! by level, finest first, packs the members into as few sub-domains as it can, keeps the best
//! [`GroupScore`] among the first domains that hold the group, and stops at its budget.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};
use k8s_openapi::jiff::Timestamp;
use tessera_allocator::AllocatedState;

use crate::claims::{PodClaims, allocation};
use crate::group::domains::{Domain, Layout, Level, subdomains};
use crate::group::membership::GroupKey;
use crate::group::score::{GroupScore, decision_node, score};
use crate::group::settings::GroupSettings;
use crate::imex::{DomainJob, DomainNodes, channels, is_domain_claim};
use crate::planner::{Action, Failure, Placement, PodPlan};
use crate::pods::pod_usage_requests;
use crate::preemption::Demand;
use crate::protocol::object_key;
use crate::reason::PodReason;
use crate::resolve::PodClaim;
use crate::resources::{NodeUsage, Requests};
use crate::view::{PodContext, Settings, decide_pod_within};

/// Domains tried at the level where the group first fits, before the best is kept.
pub const ALTERNATIVES: usize = 4;

/// A gated pod of the group whose claims are resolved.
#[derive(Clone, Copy)]
pub struct Member<'a> {
    pub pod: &'a Pod,
    pub claims: &'a [PodClaim],
}

/// What one group decision reads besides the cluster.
pub struct GroupInput<'a> {
    pub key: &'a GroupKey,
    pub min_count: u32,
    /// Pods of the group already placed (released or bound): they count toward `min_count`.
    pub placed: u32,
    /// Pods to place, in the order to try them (arrival, then name).
    pub members: Vec<Member<'a>>,
    /// Pods of the group still waiting for their claims to be created.
    pub unresolved: u32,
    /// Pods of the group still held by other components' scheduling gates (a queue that has not
    /// admitted them): never placed until those gates are removed.
    pub held: u32,
    /// The IMEX domains on each node, when the group asks for a domain (empty otherwise): a
    /// member is never placed on a node that hosts another domain's pods.
    pub domain_nodes: DomainNodes,
}

impl GroupInput<'_> {
    /// How many of `members` must be placed in this decision.
    pub fn needed(&self) -> usize {
        self.min_count.saturating_sub(self.placed) as usize
    }
}

/// A member that was not placed in the attempt reported, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodAccount {
    pub pod: String,
    /// Where it was placed (in the attempt), or `None`.
    pub node: Option<String>,
    pub message: String,
}

/// The group's decision.
#[derive(Clone, Debug, PartialEq)]
pub enum GroupOutcome {
    /// Carry out each member's decision (index into [`GroupInput::members`]); members not listed
    /// stay gated for a later decision.
    Place {
        plans: Vec<(usize, PodPlan)>,
        domain: Domain,
        score: GroupScore,
    },
    /// Place nothing now.
    Wait {
        failure: Failure,
        /// The condition reason: `WaitingForGroup` (pods or claims missing),
        /// `GroupUnsatisfiable` or `InvalidInput`.
        reason: PodReason,
        message: String,
        /// The closest attempt (or each pod alone with [`GroupSettings::accounts`]).
        pods: Vec<PodAccount>,
    },
}

/// The search's answer for a group, and what it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupPlan {
    pub outcome: GroupOutcome,
    /// Pod decisions taken.
    pub steps: usize,
    /// The budget ran out: the group found may not be the best (or one may exist).
    pub truncated: bool,
    /// The group asks for an IMEX domain and waits because every channel of this clique (the
    /// one that has the trays) is in use: the decision names the domains holding them.
    pub channels_full: Option<String>,
}

/// A successful or partial attempt in one domain.
struct Attempt {
    placed: Vec<(usize, PodPlan)>,
    /// Members not placed, with the last reason.
    missed: Vec<(usize, String)>,
}

/// The search's shared state.
struct Search<'a, 'c> {
    input: &'a GroupInput<'a>,
    context: &'a PodContext<'c>,
    settings: &'a Settings,
    now: Timestamp,
    budget: usize,
    steps: usize,
    truncated: bool,
    /// Domains that cannot hold this by counting free managed devices are skipped without an
    /// attempt (the default: every domain is tried).
    floor: DemandFloor,
    /// Claims that more than one member names and that no one has allocated (an IMEX domain's
    /// claim, shared by its pods), by `namespace/name`: allocated once, with the first member
    /// placed, and fixed for the members after it.
    shared: HashSet<String>,
    /// The IMEX domain the group asks for: then only single fabric cliques are tried.
    imex: Option<DomainJob>,
    /// The devices in use and node usage attempts place members on, copied from the context at
    /// the first member placed that another member's decision reads; each attempt takes its
    /// changes back.
    scratch: Option<(AllocatedState, HashMap<String, NodeUsage>)>,
}

impl<'a, 'c> Search<'a, 'c> {
    fn new(
        input: &'a GroupInput<'a>,
        context: &'a PodContext<'c>,
        settings: &'a Settings,
        group: &GroupSettings,
        now: Timestamp,
        floor: DemandFloor,
    ) -> Search<'a, 'c> {
        Search {
            input,
            context,
            settings,
            now,
            budget: group.budget,
            steps: 0,
            truncated: false,
            floor,
            shared: shared_claims(input),
            imex: DomainJob::of(input.members.iter().map(|m| m.claims)),
            scratch: None,
        }
    }

    /// Places members in `nodes`, packing them into `subdomains` (groups of `nodes`, in order of
    /// preference; the ones already used come first).
    fn attempt(&mut self, subdomains: &[Vec<usize>]) -> Attempt {
        let mut placed_on = Scratch::default();
        let mut used: Vec<usize> = Vec::new();
        // Shared claims allocated in this attempt, with their allocation.
        let mut written: HashMap<String, Arc<ResourceClaim>> = HashMap::new();
        let mut attempt = Attempt {
            placed: Vec::new(),
            missed: Vec::new(),
        };
        let needed = self.input.needed();
        let total = self.input.members.len();
        for (index, member) in self.input.members.iter().enumerate() {
            if attempt.placed.len() + (total - index) < needed {
                attempt
                    .missed
                    .extend((index..total).map(|i| (i, "not tried".to_owned())));
                break;
            }
            let order: Vec<usize> = used
                .iter()
                .copied()
                .chain((0..subdomains.len()).filter(|s| !used.contains(s)))
                .collect();
            let mut last = String::from("no node of the domain is eligible");
            let mut done = false;
            let substituted;
            let claims = if written.is_empty() {
                member.claims
            } else {
                substituted = with_written(member.claims, &written);
                substituted.as_slice()
            };
            for sub in order {
                if self.steps >= self.budget {
                    self.truncated = true;
                    break;
                }
                self.steps += 1;
                let decision = self.decide_within(member.pod, claims, &subdomains[sub]);
                match &decision.action {
                    // The last member's placement is read by no later decision.
                    Action::Place(p) if index + 1 < total => {
                        let scratch = self.scratch.get_or_insert_with(|| {
                            (self.context.in_use.clone(), self.context.usage.clone())
                        });
                        placed_on.place(scratch, p, pod_usage_requests(member.pod));
                        for write in &p.writes {
                            self.note_shared(write, &mut written);
                        }
                    }
                    Action::Place(_) | Action::Release { .. } | Action::Nothing => {}
                    Action::CannotPlace { message, .. } | Action::LeaveToScheduler { message } => {
                        last = message.clone();
                        continue;
                    }
                }
                if !used.contains(&sub) {
                    used.push(sub);
                }
                attempt.placed.push((index, decision));
                done = true;
                break;
            }
            if !done {
                attempt.missed.push((index, last));
            }
        }
        if let Some(scratch) = self.scratch.as_mut() {
            placed_on.undo(scratch);
        }
        attempt
    }
}

impl Search<'_, '_> {
    /// One member's decision on `nodes`, against the devices and node usage the attempt's
    /// earlier members left (the scratch copy once a member was placed, else the context's).
    fn decide_within(&self, pod: &Pod, claims: &[PodClaim], nodes: &[usize]) -> PodPlan {
        let (in_use, usage) = match &self.scratch {
            Some((state, usage)) => (state, usage),
            None => (self.context.in_use, self.context.usage),
        };
        let context = PodContext {
            devices: self.context.devices,
            unmanaged: self.context.unmanaged,
            in_use,
            usage,
        };
        decide_pod_within(pod, claims, &context, self.settings, self.now, Some(nodes))
    }

    /// Keeps the allocation of a shared claim written for a member, for the members after it.
    fn note_shared(
        &self,
        write: &crate::planner::ClaimWrite,
        written: &mut HashMap<String, Arc<ResourceClaim>>,
    ) {
        if self.shared.is_empty() {
            return;
        }
        let key = object_key(&write.claim.metadata);
        if self.shared.contains(&key) {
            let mut claim = (*write.claim).clone();
            claim.status.get_or_insert_with(Default::default).allocation =
                Some(write.allocation.clone());
            written.insert(key, Arc::new(claim));
        }
    }
}

/// What one attempt changed in the search's scratch copy of the cluster, to take back after it:
/// the copy is made once per search, not once per attempt.
#[derive(Default)]
struct Scratch {
    /// Allocations added, and those of claims undone, in order.
    added: Vec<AllocationResult>,
    undone: Vec<AllocationResult>,
    /// Each node's usage before the attempt first changed it.
    usage: Vec<(String, Option<NodeUsage>)>,
}

impl Scratch {
    /// Places `p` (a member requesting `requests`) on the copy.
    fn place(
        &mut self,
        (state, usage): &mut (AllocatedState, HashMap<String, NodeUsage>),
        p: &Placement,
        requests: Requests,
    ) {
        // Recorded even when a change fails part way: taking back what was not done is harmless.
        for claim in &p.undo {
            if let Some(a) = allocation(claim) {
                let _ = state.remove_allocation(a);
                self.undone.push(a.clone());
            }
        }
        for write in &p.writes {
            let _ = state.add_allocation(&write.allocation);
            self.added.push(write.allocation.clone());
        }
        if !self.usage.iter().any(|(n, _)| *n == p.node) {
            self.usage
                .push((p.node.clone(), usage.get(&p.node).copied()));
        }
        usage.entry(p.node.clone()).or_default().add_pod(requests);
    }

    /// Takes every change back.
    fn undo(self, (state, usage): &mut (AllocatedState, HashMap<String, NodeUsage>)) {
        for a in self.added.iter().rev() {
            let _ = state.remove_allocation(a);
        }
        for a in self.undone.iter().rev() {
            let _ = state.add_allocation(a);
        }
        for (node, before) in self.usage {
            match before {
                Some(u) => usage.insert(node, u),
                None => usage.remove(&node),
            };
        }
    }
}

/// The claims more than one member names that are not allocated yet, by `namespace/name`.
fn shared_claims(input: &GroupInput<'_>) -> HashSet<String> {
    if input.members.len() < 2 {
        return HashSet::new();
    }
    // Counted by (namespace, name) borrowed from the claims: no string is built for the usual
    // group, whose members' claims are all their own.
    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    for c in input.members.iter().flat_map(|m| m.claims) {
        if allocation(&c.claim).is_none() {
            let meta = &c.claim.metadata;
            let key = (
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
            );
            *seen.entry(key).or_default() += 1;
        }
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((namespace, name), _)| format!("{namespace}/{name}"))
        .collect()
}

/// A member's claims with the shared claims allocated earlier in the attempt in their place:
/// allocated for another pod, they are fixed for this one and pin it to their nodes (a channel's
/// clique).
fn with_written(
    claims: &[PodClaim],
    written: &HashMap<String, Arc<ResourceClaim>>,
) -> Vec<PodClaim> {
    claims
        .iter()
        .map(|c| match written.get(&object_key(&c.claim.metadata)) {
            Some(allocated) => PodClaim {
                pod_claim: c.pod_claim.clone(),
                claim: allocated.clone(),
            },
            None => c.clone(),
        })
        .collect()
}

/// The group waits for pods (or their claims) that do not exist yet.
fn short_of_pods(input: &GroupInput<'_>) -> Option<GroupPlan> {
    let needed = input.needed();
    let have = input.members.len();
    if have >= needed {
        return None;
    }
    let missing = needed - have;
    let mut notes = Vec::new();
    if input.unresolved > 0 {
        notes.push(format!(
            "{} of them exist but wait for their claims to be created",
            input.unresolved
        ));
    }
    if input.held > 0 {
        notes.push(format!(
            "{} of them exist but are held by other scheduling gates",
            input.held
        ));
    }
    let claims = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    };
    Some(GroupPlan {
        outcome: GroupOutcome::Wait {
            failure: Failure::Unsatisfiable,
            reason: PodReason::WaitingForGroup,
            message: format!(
                "{} needs {} pods placed together (minCount {}, {} placed already); {} of them are gated \
                 here with their claims, waiting for {missing} more{claims}",
                input.key, needed, input.min_count, input.placed, have
            ),
            pods: Vec::new(),
        },
        steps: 0,
        truncated: false,
        channels_full: None,
    })
}

/// The best group in the domains of one level, and the closest failed attempt so far.
fn search_level(
    search: &mut Search<'_, '_>,
    layout: &Layout,
    domains: Vec<(Domain, Vec<usize>)>,
    sub_level: Option<&Level>,
    closest: &mut Option<(Domain, Attempt)>,
) -> Option<(GroupScore, Domain, Attempt)> {
    let needed = search.input.needed().max(1);
    let mut best: Option<(GroupScore, Domain, Attempt)> = None;
    let mut successes = 0;
    for (domain, mut nodes) in domains {
        if let Some(job) = &search.imex {
            nodes.retain(|&n| foreign_domain(search.input, search.context, job, n).is_none());
        }
        if search.steps >= search.budget {
            search.truncated = true;
            break;
        }
        // A domain the floor rules out places fewer members than any attempt already made
        // (none, for a floor of one member): it is skipped once there is a closest attempt.
        if (search.floor.whole || closest.is_some()) && !search.floor.may_hold(&nodes, &layout.free)
        {
            continue;
        }
        let attempt = search.attempt(&subdomains(&nodes, sub_level, &layout.free));
        if attempt.placed.len() >= needed {
            let s = score(
                &attempt.placed,
                layout.clique.as_ref(),
                &layout.labels,
                &layout.index,
            );
            if best.as_ref().is_none_or(|(b, _, _)| s < *b) {
                best = Some((s, domain, attempt));
            }
            successes += 1;
            if successes >= ALTERNATIVES {
                break;
            }
        } else if closest
            .as_ref()
            .is_none_or(|(_, c)| attempt.placed.len() > c.placed.len())
        {
            *closest = Some((domain, attempt));
        }
    }
    best
}

/// The other IMEX domain whose pods run on node `n` (index into [`crate::view::ClusterSnapshot::nodes`]),
/// if any: the node driver runs one IMEX daemon per node, so `job`'s pods cannot go there.
fn foreign_domain<'i>(
    input: &'i GroupInput<'_>,
    context: &PodContext<'_>,
    job: &DomainJob,
    n: usize,
) -> Option<&'i str> {
    if input.domain_nodes.is_empty() {
        return None;
    }
    let node = &context.devices.nodes.get(n)?.info.name;
    input.domain_nodes.other_than(node, &job.claim)
}

/// Decides the group: places at least [`GroupInput::needed`] members close together, or none.
pub fn decide_group(
    input: &GroupInput<'_>,
    context: &PodContext<'_>,
    settings: &Settings,
    group: &GroupSettings,
    now: Timestamp,
) -> GroupPlan {
    if let Some(waiting) = short_of_pods(input) {
        return waiting;
    }
    let layout = Layout::new(context, group);
    let floor = DemandFloor::of(input, context).one_member();
    let mut search = Search::new(input, context, settings, group, now, floor);
    // The closest failed attempt: most members placed.
    let mut closest: Option<(Domain, Attempt)> = None;
    if let Some((score, domain, attempt)) = search_levels(&mut search, &layout, &mut closest) {
        return GroupPlan {
            outcome: GroupOutcome::Place {
                plans: attempt.placed,
                domain,
                score,
            },
            steps: search.steps,
            truncated: search.truncated,
            channels_full: None,
        };
    }
    let (steps, truncated) = (search.steps, search.truncated);
    let imex = search.imex.as_ref().map(|job| {
        let smallest = DemandFloor::of(input, context).smallest;
        domain_wait(job, input, context, &layout, smallest)
    });
    let mut outcome = wait_outcome(input, context, settings, group, now, closest, truncated);
    let mut channels_full = None;
    if let (Some(wait), GroupOutcome::Wait { message, .. }) = (imex, &mut outcome) {
        message.push_str(&format!("; {}", wait.message));
        channels_full = wait.channels_full;
    }
    GroupPlan {
        outcome,
        steps,
        truncated,
        channels_full,
    }
}

/// Why a group that asks for an IMEX domain fits in no fabric clique, as counting says it.
struct DomainWait {
    message: String,
    /// The clique with the trays whose channels are all in use.
    channels_full: Option<String>,
}

/// Per fabric clique (only the channel's, when the domain has one), the trays free for `job`: with
/// room for the least demanding member (`smallest` free GPUs) and no other domain's pods; and,
/// when a tray with room hosts another domain, which (the first such tray).
fn free_trays<'l>(
    job: &DomainJob,
    input: &GroupInput<'_>,
    context: &PodContext<'_>,
    layout: &'l Layout,
    smallest: usize,
) -> (BTreeMap<&'l str, usize>, Option<String>) {
    let mut trays: BTreeMap<&str, usize> = BTreeMap::new();
    let mut taken = None;
    for &n in &layout.managed {
        let Some(clique) = layout.clique.as_ref().and_then(|l| l.of_node[n].as_deref()) else {
            continue;
        };
        if job.clique.as_deref().is_some_and(|c| c != clique) {
            continue;
        }
        let roomy = layout.free[n] >= smallest;
        let other = foreign_domain(input, context, job, n).filter(|_| roomy);
        if let (Some(other), None) = (other, &taken) {
            taken = Some(format!(
                "{} runs pods of the IMEX domain {other} (one IMEX domain per node)",
                context.devices.nodes[n].info.name
            ));
        }
        *trays.entry(clique).or_default() += usize::from(roomy && other.is_none());
    }
    (trays, taken)
}

/// Counts, per fabric clique (only the channel's, when the domain has one), the trays with room
/// for the least demanding member (free GPUs), and the free channels of the cliques with enough
/// trays.
fn domain_wait(
    job: &DomainJob,
    input: &GroupInput<'_>,
    context: &PodContext<'_>,
    layout: &Layout,
    smallest: usize,
) -> DomainWait {
    let needed = input.needed().max(1);
    let domain = &job.claim;
    let (trays, taken) = free_trays(job, input, context, layout, smallest);
    let wait = |message: String| DomainWait {
        message,
        channels_full: None,
    };
    let Some((best, most)) = trays
        .iter()
        .max_by_key(|(c, n)| (**n, std::cmp::Reverse(**c)))
    else {
        return wait(match &job.clique {
            Some(c) => format!(
                "the IMEX domain {domain} has its channel in clique {c}, which has no eligible tray"
            ),
            None => format!(
                "the IMEX domain {domain} needs its pods in one fabric clique, and no managed node publishes a fabricClique"
            ),
        });
    };
    if *most < needed {
        let shared = taken.map_or_else(String::new, |t| format!("; {t}"));
        return wait(format!(
            "no fabric clique has {needed} free trays for the IMEX domain {domain}: the most, {most}, are in clique {best}{shared}"
        ));
    }
    let counts = channels(&context.devices.managed, context.in_use);
    let roomy: Vec<&str> = trays
        .iter()
        .filter(|(_, n)| **n >= needed)
        .map(|(c, _)| *c)
        .collect();
    if roomy
        .iter()
        .any(|c| counts.get(*c).is_some_and(|ch| ch.free() > 0))
        || job.clique.is_some()
    {
        return wait(format!(
            "a clique has the trays and a channel for the IMEX domain {domain}, but its pods do not fit there together (the closest attempt says why)"
        ));
    }
    let clique = roomy[0];
    let others = match roomy.len() - 1 {
        0 => String::new(),
        1 => "; nor in the other clique with the trays".to_owned(),
        n => format!("; nor in the {n} other cliques with the trays"),
    };
    match counts.get(clique) {
        Some(ch) => DomainWait {
            message: format!(
                "no free IMEX channel in clique {clique} ({} of {} in use){others}",
                ch.in_use, ch.total
            ),
            channels_full: Some(clique.to_owned()),
        },
        None => wait(format!(
            "clique {clique} has the trays but no IMEX channel is published for it (the controller's \
             --imex-channels, chart value controller.imexChannels, is 0, or the channels are not published yet)"
        )),
    }
}

/// Where the group would be placed, as [`decide_group`] places it, without the account of why
/// it does not fit: what the preemption search asks once per set of evicted pods. Domains with
/// fewer free managed devices than the members need (the `needed` smallest demands, counted as
/// the preemption search counts them) are skipped without an attempt, so on a full cluster the
/// cost follows the domains that could hold the group, not all of them.
pub(crate) fn place_group(
    input: &GroupInput<'_>,
    context: &PodContext<'_>,
    settings: &Settings,
    group: &GroupSettings,
    now: Timestamp,
    floor: DemandFloor,
) -> PlacedGroup {
    let mut placed = PlacedGroup::default();
    if short_of_pods(input).is_some() {
        return placed;
    }
    let layout = Layout::new(context, group);
    let mut search = Search::new(input, context, settings, group, now, floor);
    let mut closest = None;
    let found = search_levels(&mut search, &layout, &mut closest);
    placed.plans = found.map(|(_, _, attempt)| attempt.placed);
    placed.steps = search.steps;
    placed.truncated = search.truncated;
    placed
}

/// What [`place_group`] found, and what it cost.
#[derive(Default)]
pub(crate) struct PlacedGroup {
    /// Each member's decision (index into [`GroupInput::members`]) when the group fits.
    pub(crate) plans: Option<Vec<(usize, PodPlan)>>,
    /// Pod decisions taken.
    pub(crate) steps: usize,
    pub(crate) truncated: bool,
}

/// What any placement of a group needs at least, in managed devices: a domain with fewer free
/// cannot hold it. Counted from the members' pending claims as the preemption search counts a
/// pod's ([`Demand`]); a request of a class that selects no managed device makes it no floor at all
/// (those devices are not counted free per node).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DemandFloor {
    /// Devices of the `needed` least demanding members together.
    pub(crate) total: usize,
    /// Devices the least demanding of them needs on its one node.
    pub(crate) smallest: usize,
    /// Members to place.
    pub(crate) members: usize,
    /// Whether the floor is the whole group's (a domain below it cannot hold the group) or one
    /// member's (a domain below it places nobody).
    pub(crate) whole: bool,
}

impl DemandFloor {
    /// The floor of `input`'s members in `context`.
    pub(crate) fn of(input: &GroupInput<'_>, context: &PodContext<'_>) -> DemandFloor {
        let mut managed_class: HashMap<String, bool> = HashMap::new();
        let mut demands = Vec::new();
        for m in &input.members {
            let sorted = PodClaims::sort(m.pod, m.claims);
            // Claims allocated for the member already (its own, undone to place it again) hold
            // devices that are not free but are the member's: only the pending ones count.
            // A domain's channel is not on any node: it takes none of a node's free devices.
            let demand = Demand::of(sorted.pending.iter().filter(|c| !is_domain_claim(c)));
            for class in &demand.classes {
                let managed = *managed_class.entry(class.clone()).or_insert_with(|| {
                    let selected = context.devices.managed.devices_of_class(class);
                    matches!(selected, Some(Ok(ids)) if !ids.is_empty())
                });
                if !managed {
                    return DemandFloor::default();
                }
            }
            demands.push(demand.count);
        }
        demands.sort_unstable();
        let needed = input.needed();
        DemandFloor {
            total: demands.iter().take(needed).sum(),
            smallest: demands.first().copied().unwrap_or(0),
            members: needed,
            whole: true,
        }
    }

    /// The floor of the least demanding member alone.
    pub(crate) fn one_member(self) -> DemandFloor {
        DemandFloor {
            total: self.smallest,
            smallest: self.smallest,
            members: self.members.min(1),
            whole: false,
        }
    }

    /// Whether `nodes`, with `free` managed devices each, may hold the members: enough free
    /// devices in all, and enough nodes each with room for the least demanding member (every
    /// member's devices are on its one node).
    pub(crate) fn may_hold(&self, nodes: &[usize], free: &[usize]) -> bool {
        if self.total == 0 || self.smallest == 0 {
            return true;
        }
        let total: usize = nodes.iter().map(|&n| free[n]).sum();
        let slots: usize = nodes.iter().map(|&n| free[n] / self.smallest.max(1)).sum();
        total >= self.total && slots >= self.members
    }
}

/// The best group at the finest level where one fits.
fn search_levels(
    search: &mut Search<'_, '_>,
    layout: &Layout,
    closest: &mut Option<(Domain, Attempt)>,
) -> Option<(GroupScore, Domain, Attempt)> {
    let levels = layout.levels();
    if let Some(job) = &search.imex {
        // A domain's pods share one clique's channel: single cliques only, never wider (and only
        // the channel's clique once the domain has one).
        let is_clique = |l: &&Level| layout.clique.as_ref().is_some_and(|c| std::ptr::eq(c, *l));
        if !levels.first().is_some_and(is_clique) {
            return None;
        }
        let (mut domains, sub_level) = layout.domains(&levels, 0);
        if let Some(clique) = &job.clique {
            domains.retain(|(d, _)| &d.value == clique);
        }
        return search_level(search, layout, domains, sub_level, closest);
    }
    for depth in 0..=levels.len() {
        let (domains, sub_level) = layout.domains(&levels, depth);
        if let Some(found) = search_level(search, layout, domains, sub_level, closest) {
            return Some(found);
        }
    }
    None
}

fn pod_name(member: &Member<'_>) -> String {
    object_key(&member.pod.metadata)
}

/// What the closest attempt placed and what it missed: a summary and the pods' accounts.
fn closest_account(
    input: &GroupInput<'_>,
    domain: &Domain,
    attempt: &Attempt,
) -> (String, Vec<PodAccount>) {
    let placed: Vec<String> = attempt
        .placed
        .iter()
        .map(|(i, d)| {
            format!(
                "{} on {}",
                pod_name(&input.members[*i]),
                decision_node(d).unwrap_or("its node")
            )
        })
        .collect();
    let mut summary = format!(
        "; the closest attempt, in {domain}, placed {} of them ({})",
        attempt.placed.len(),
        placed.join(", ")
    );
    if let Some((i, why)) = attempt.missed.first() {
        summary.push_str(&format!(
            "; {} did not fit there: {why}",
            pod_name(&input.members[*i])
        ));
    }
    let mut pods = Vec::new();
    for (i, d) in &attempt.placed {
        pods.push(PodAccount {
            pod: pod_name(&input.members[*i]),
            node: decision_node(d).map(str::to_owned),
            message: "placed in the closest attempt".into(),
        });
    }
    for (i, why) in &attempt.missed {
        pods.push(PodAccount {
            pod: pod_name(&input.members[*i]),
            node: None,
            message: why.clone(),
        });
    }
    (summary, pods)
}

/// Each member decided alone against the whole cluster, and the first bad input found.
fn alone_accounts(
    input: &GroupInput<'_>,
    context: &PodContext<'_>,
    settings: &Settings,
    now: Timestamp,
) -> (Vec<PodAccount>, Option<String>) {
    let mut pods = Vec::new();
    let mut invalid = None;
    for member in &input.members {
        let decision = crate::view::decide_pod(member.pod, member.claims, context, settings, now);
        let (node, message) = match &decision.action {
            Action::Place(p) => (Some(p.node.clone()), "fits alone".to_owned()),
            Action::Release { node } => (node.clone(), "already allocated".to_owned()),
            Action::Nothing => (None, "nothing to do".to_owned()),
            Action::LeaveToScheduler { message } => (None, message.clone()),
            Action::CannotPlace {
                failure, message, ..
            } => {
                if *failure == Failure::InvalidInput && invalid.is_none() {
                    invalid = Some(format!("{}: {message}", pod_name(member)));
                }
                (None, message.clone())
            }
        };
        pods.push(PodAccount {
            pod: pod_name(member),
            node,
            message,
        });
    }
    (pods, invalid)
}

fn wait_outcome(
    input: &GroupInput<'_>,
    context: &PodContext<'_>,
    settings: &Settings,
    group: &GroupSettings,
    now: Timestamp,
    closest: Option<(Domain, Attempt)>,
    truncated: bool,
) -> GroupOutcome {
    let needed = input.needed().max(1);
    let mut summary = format!(
        "{} needs {needed} of its {} gated pods placed together (minCount {}, {} placed already)",
        input.key,
        input.members.len(),
        input.min_count,
        input.placed
    );
    let mut pods = Vec::new();
    match &closest {
        Some((domain, attempt)) => {
            let (text, accounts) = closest_account(input, domain, attempt);
            summary.push_str(&text);
            pods = accounts;
        }
        None => summary.push_str("; no pod of the group fits on any eligible node"),
    }
    // Bad input of any member fails the group as such.
    let mut invalid = None;
    if group.accounts || closest.is_none() {
        (pods, invalid) = alone_accounts(input, context, settings, now);
        if closest.is_none()
            && let Some(first) = pods.first()
        {
            summary.push_str(&format!("; {}: {}", first.pod, first.message));
        }
    }
    if truncated {
        summary.push_str("; the search stopped at its budget");
    }
    if let Some(invalid) = invalid {
        return GroupOutcome::Wait {
            failure: Failure::InvalidInput,
            reason: PodReason::InvalidInput,
            message: format!("{}: {invalid}", input.key),
            pods,
        };
    }
    GroupOutcome::Wait {
        failure: Failure::Unsatisfiable,
        reason: PodReason::GroupUnsatisfiable,
        message: summary,
        pods,
    }
}
