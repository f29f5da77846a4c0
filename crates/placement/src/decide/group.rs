//! The decision for a gated pod of a group (gang): the group's pods gathered, its `minCount`, its
//! members' claims resolved, whether an earlier group holds it back, then the group search
//! ([`crate::group::search::decide_group`]) — and the steps: every member's claims written before
//! any member is released, or, when the group waits, its members' leftover allocations undone.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tessera_api::names::GROUP_LABEL;

use crate::claims::PodClaims;
use crate::decide::pod::{
    decide_alone, held_back, placed_message, placement_steps, resolve, waiting_decision,
};
use crate::decide::preempt::{self, Preemption};
use crate::decide::steps::{in_context, undo_steps, waits};
use crate::decision::{
    ClusterSource, Count, Decision, GroupVerdict, Notice, PodPatch, Ruling, Step, Then,
};
use crate::group::domains::Domain;
use crate::group::membership::{
    GroupKey, GroupSource, label_min_count, member_arrival, pod_group_min_count,
};
use crate::group::score::GroupScore;
use crate::group::search::{GroupInput, GroupOutcome, GroupPlan, Member, decide_group};
use crate::group::starvation::{Waiting, fits_when_free};
use crate::imex::{DomainJob, DomainNodes};
use crate::message::add_to_summary;
use crate::planner::Action;
use crate::preemption::nomination::Nomination;
use crate::preemption::pod_priority;
use crate::protocol::{PodPlacement, foreign_gates, is_gated, object_key};
use crate::reason::{EventKind, PodReason};
use crate::resolve::{PodClaim, Resolution};
use crate::view::Settings;

/// The group as one decision reads it.
struct Gathered {
    key: GroupKey,
    /// Its pods that still matter ([`ClusterSource::group_pods`]).
    pods: Vec<Arc<Pod>>,
    /// Those gated by the controller alone: the members it may place now.
    gated: Vec<Arc<Pod>>,
    /// How many are gated by the controller and still held by other components' gates too.
    held: u32,
    /// How many were released or bound already.
    placed: u32,
    /// When its oldest gated pod was created: its place in line.
    arrived: Timestamp,
}

impl Gathered {
    fn new(key: GroupKey, source: &dyn ClusterSource, settings: &Settings) -> Gathered {
        let pods = source.group_pods(&key);
        let (gated, held): (Vec<Arc<Pod>>, Vec<Arc<Pod>>) = pods
            .iter()
            .filter(|p| is_gated(p, &settings.gate))
            .cloned()
            .partition(|p| foreign_gates(p, &settings.gate).is_empty());
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let placed = count(pods.len() - gated.len() - held.len());
        let held = count(held.len());
        let arrived = gated
            .iter()
            .map(|p| member_arrival(p))
            .min()
            .unwrap_or(Timestamp::UNIX_EPOCH);
        Gathered {
            key,
            pods,
            gated,
            held,
            placed,
            arrived,
        }
    }
}

/// The decision for `pod`, a gated member of group `key`, at `now`; `waiting`: the groups
/// waiting for capacity. A PodGroup with the basic policy places its pods one by one.
pub fn decide_for_group(
    pod: &Arc<Pod>,
    key: GroupKey,
    source: &dyn ClusterSource,
    waiting: &[Waiting],
    settings: &Settings,
    now: Timestamp,
) -> Decision {
    let group = Gathered::new(key, source, settings);
    let min_count = match min_count(&group, source) {
        Ok(Some(n)) => n,
        Ok(None) => return decide_alone(pod, source, waiting, settings, now),
        Err(decision) => return *decision,
    };
    let mut first = Vec::new();
    let (resolved, unresolved) = match resolve_members(&group, source, &mut first) {
        Ok(members) => members,
        Err(decision) => return *decision,
    };
    let own = Some(&group.key);
    if let Some(by) = held_back(pod, own, source, waiting, settings, now, &mut first)
        .filter(|by| by.arrived < group.arrived)
    {
        return held_back_group(&group, by, first);
    }
    let input = GroupInput {
        key: &group.key,
        min_count,
        placed: group.placed,
        members: resolved
            .iter()
            .map(|r| Member {
                pod: &r.pod,
                claims: &r.claims,
            })
            .collect(),
        unresolved,
        held: group.held,
        domain_nodes: domain_nodes(&resolved, source),
    };
    let (mut plan, fits_free) = search(&input, source, waiting, settings, now);
    name_channel_holders(&mut plan, source);
    first.extend(fits_free.map(|fits_when_free| {
        Step::Remember(Waiting {
            key: group.key.clone(),
            priority: pod_priority(pod),
            arrived: group.arrived,
            since: now,
            fits_when_free,
        })
    }));
    let plan = match preempt_or(plan, &input, &resolved, source, settings, now) {
        Ok(plan) => plan,
        Err(mut decision) => {
            first.append(&mut decision.first);
            decision.first = first;
            return *decision;
        }
    };
    let (more, mut per_pod, then) = steps(&group, &resolved, &plan, settings);
    per_pod.extend(withdrawn(&resolved));
    first.extend(more);
    let verdict = GroupVerdict::Decided {
        key: group.key.clone(),
        min_count,
        placed: group.placed,
        members: resolved
            .iter()
            .map(|r| object_key(&r.pod.metadata))
            .collect(),
        plan,
    };
    Decision {
        ruling: Ruling::Group(verdict),
        first,
        per_pod,
        then,
    }
}

/// Where the IMEX domains run, read only for a group that asks for one: no cost for the others.
fn domain_nodes(resolved: &[Resolved], source: &dyn ClusterSource) -> DomainNodes {
    if DomainJob::of(resolved.iter().map(|r| r.claims.as_slice())).is_some() {
        source.domain_nodes()
    } else {
        DomainNodes::default()
    }
}

/// A domain group waiting for a channel is told which domains hold the clique's channels.
fn name_channel_holders(plan: &mut GroupPlan, source: &dyn ClusterSource) {
    let Some(clique) = &plan.channels_full else {
        return;
    };
    let holders = source.channel_holders(clique);
    if holders.is_empty() {
        return;
    }
    const NAMED: usize = 5;
    let mut named = holders[..holders.len().min(NAMED)].join(", ");
    if holders.len() > NAMED {
        named.push_str(&format!(" and {} more", holders.len() - NAMED));
    }
    if let GroupOutcome::Wait { message, .. } = &mut plan.outcome {
        message.push_str(&format!(
            "; the channels of clique {clique} are held by the domains {named}, each free again once its last pod is gone"
        ));
    }
}

/// For a group that does not fit for want of capacity: the decision that preempts for it (or
/// waits for its victims), or the plan with why preemption does not help.
fn preempt_or(
    mut plan: GroupPlan,
    input: &GroupInput<'_>,
    resolved: &[Resolved],
    source: &dyn ClusterSource,
    settings: &Settings,
    now: Timestamp,
) -> Result<GroupPlan, Box<Decision>> {
    let capacity = matches!(
        plan.outcome,
        GroupOutcome::Wait {
            reason: PodReason::GroupUnsatisfiable,
            ..
        }
    );
    if !capacity {
        return Ok(plan);
    }
    let pods: Vec<Arc<Pod>> = resolved.iter().map(|r| r.pod.clone()).collect();
    match preempt::for_group(input, &pods, source, settings, now) {
        Some(Preemption::Decide(decision)) => Err(decision),
        Some(Preemption::Why { why, budgets }) => {
            if let GroupOutcome::Wait {
                message, reason, ..
            } = &mut plan.outcome
            {
                add_to_summary(message, &why);
                if budgets {
                    *reason = PodReason::PreemptionBlocked;
                }
            }
            Ok(plan)
        }
        None => Ok(plan),
    }
}

/// The nominations left on members once no preemption stands for the group (placed, or no
/// plan any more): removed, so the devices are nobody's to keep.
fn withdrawn(resolved: &[Resolved]) -> Vec<Vec<Step>> {
    resolved
        .iter()
        .filter(|r| Nomination::of(&r.pod).is_some())
        .map(|r| {
            vec![Step::Nominate {
                pod: r.pod.clone(),
                nomination: None,
            }]
        })
        .collect()
}

/// The group waits behind `by`, which arrived earlier: every gated member is told so.
fn held_back_group(group: &Gathered, by: Waiting, first: Vec<Step>) -> Decision {
    let message = format!(
        "{} waits behind {}, which arrived earlier and has waited for capacity since {}",
        group.key, by.key, by.since
    );
    let reason = PodReason::WaitingBehindGroup;
    let reports = reports(group, reason, &message, EventKind::Normal);
    let verdict = GroupVerdict::HeldBack {
        key: group.key.clone(),
        by,
        message,
    };
    waiting_decision(Ruling::Group(verdict), first, None, reports)
}

/// The group's `minCount` (`None`: a PodGroup with the basic policy); `Err`: the decision that
/// tells the pods why the group cannot be decided.
fn min_count(group: &Gathered, source: &dyn ClusterSource) -> Result<Option<u32>, Box<Decision>> {
    let key = &group.key;
    let count = match key.source {
        GroupSource::Label => label_min_count(key, group.pods.iter().map(|p| &**p)).map(Some),
        GroupSource::PodGroup => match source.pod_group(key) {
            Some(pod_group) => pod_group_min_count(pod_group),
            None => {
                let message = format!(
                    "the pod names {key} in spec.schedulingGroup.podGroupName, which does not exist \
                     (or the cluster does not serve scheduling.k8s.io/v1beta1: enable the GenericWorkload \
                     feature gate, or name the group with the label {GROUP_LABEL} instead)"
                );
                let reports = reports(
                    group,
                    PodReason::WaitingForGroup,
                    &message,
                    EventKind::Normal,
                );
                let verdict = GroupVerdict::MissingPodGroup {
                    key: key.clone(),
                    message,
                };
                return Err(Box::new(waiting_decision(
                    Ruling::Group(verdict),
                    Vec::new(),
                    None,
                    reports,
                )));
            }
        },
    };
    count.map_err(|e| Box::new(invalid(group, e.to_string())))
}

/// A gated member with its resolved claims.
struct Resolved {
    pod: Arc<Pod>,
    claims: Vec<PodClaim>,
}

/// The gated members whose claims resolve, in the order to try them (arrival, then name), and
/// how many still wait for their claims (the templates the controller creates for them added to
/// `creates`); `Err`: a member's claims are invalid.
fn resolve_members(
    group: &Gathered,
    source: &dyn ClusterSource,
    creates: &mut Vec<Step>,
) -> Result<(Vec<Resolved>, u32), Box<Decision>> {
    let mut resolved = Vec::new();
    let mut unresolved = 0;
    for member in &group.gated {
        let (resolution, create) = resolve(member, source);
        creates.extend(create);
        match resolution {
            Resolution::Resolved(claims) => resolved.push(Resolved {
                pod: member.clone(),
                claims,
            }),
            Resolution::Waiting(_) => unresolved += 1,
            Resolution::Invalid(message) | Resolution::MissingTemplate { message, .. } => {
                let pod = object_key(&member.metadata);
                let message = format!("{}: pod {pod}: {message}", group.key);
                return Err(Box::new(invalid(group, message)));
            }
        }
    }
    resolved.sort_by_cached_key(|r| (member_arrival(&r.pod), object_key(&r.pod.metadata)));
    Ok((resolved, unresolved))
}

/// The group's definition is wrong: every gated member is told why, and the pod waits.
fn invalid(group: &Gathered, message: String) -> Decision {
    let reports = reports(group, PodReason::InvalidInput, &message, EventKind::Warning);
    let verdict = Ruling::Group(GroupVerdict::Invalid(message));
    waiting_decision(verdict, Vec::new(), Some(PodReason::InvalidInput), reports)
}

/// One report per gated member.
fn reports(group: &Gathered, reason: PodReason, message: &str, kind: EventKind) -> Vec<Step> {
    group
        .gated
        .iter()
        .map(|pod| waits(pod, reason, message, kind))
        .collect()
}

/// The group search over the cluster of `source`; when the group waits for capacity and is not
/// known to be waiting yet, also whether it would fit the cluster when free.
fn search(
    input: &GroupInput<'_>,
    source: &dyn ClusterSource,
    waiting: &[Waiting],
    settings: &Settings,
    now: Timestamp,
) -> (GroupPlan, Option<bool>) {
    in_context(source, "", |context| {
        let plan = decide_group(input, context, settings, &settings.group, now);
        let capacity = matches!(
            plan.outcome,
            GroupOutcome::Wait {
                reason: PodReason::GroupUnsatisfiable,
                ..
            }
        );
        let known = waiting.iter().any(|w| &w.key == input.key);
        let fits_free = (capacity && !known).then(|| {
            fits_when_free(
                input,
                context.devices,
                context.unmanaged,
                settings,
                &settings.group,
                now,
            )
        });
        (plan, fits_free)
    })
}

/// The steps of the group's plan: carried out first, per pod, and how the pod leaves the queue.
/// A placed group's claims are all written before any member is released; a waiting group's
/// members keep no allocation the controller made.
fn steps(
    group: &Gathered,
    resolved: &[Resolved],
    plan: &GroupPlan,
    settings: &Settings,
) -> (Vec<Step>, Vec<Vec<Step>>, Then) {
    match &plan.outcome {
        GroupOutcome::Place {
            plans,
            domain,
            score,
        } => {
            let summary = placed_summary(&group.key, plans.len(), domain, score, plan.truncated);
            let mut first = vec![Step::Forget(group.key.clone())];
            let mut per_pod = Vec::new();
            for (index, member_plan) in plans {
                let pod = &resolved[*index].pod;
                let mut record = PodPlacement::of(pod).unwrap_or_default();
                let message = match &member_plan.action {
                    Action::Place(placement) => {
                        first.extend(placement_steps(pod, placement));
                        record.node = placement.node.clone();
                        placed_message(placement)
                    }
                    Action::Release { node } => {
                        if let Some(node) = node {
                            record.node = node.clone();
                        }
                        "every claim of the pod was already allocated".to_owned()
                    }
                    _ => continue,
                };
                per_pod.push(released(
                    pod,
                    record,
                    format!("{summary}; {message}"),
                    settings,
                ));
            }
            (first, per_pod, Then::Done)
        }
        GroupOutcome::Wait {
            failure,
            reason,
            message,
            ..
        } => {
            let mut first = vec![Step::Count(Count::Failure(failure.reason()))];
            for r in resolved {
                first.extend(undo_steps(&r.pod, &PodClaims::sort(&r.pod, &r.claims).own));
            }
            let per_pod = reports(group, *reason, message, EventKind::Warning)
                .into_iter()
                .map(|report| vec![report])
                .collect();
            (first, per_pod, Then::Park)
        }
    }
}

/// A member's release: the gate removed and the placement recorded, counted, reported.
fn released(
    pod: &Arc<Pod>,
    record: PodPlacement,
    message: String,
    settings: &Settings,
) -> Vec<Step> {
    vec![
        Step::PatchPod {
            pod: pod.clone(),
            patch: PodPatch::Release {
                record: Some(record),
                gate: Some(settings.gate.clone()),
            },
        },
        Step::Count(Count::PodPlaced),
        Step::Notify {
            pod: pod.clone(),
            notice: Notice {
                reason: PodReason::Allocated,
                message,
                kind: EventKind::Normal,
            },
        },
    ]
}

/// `group ns/g: 2 pods placed together in gpu.tessera.dev/rack=r1 (2 nodes)`.
fn placed_summary(
    key: &GroupKey,
    pods: usize,
    domain: &Domain,
    score: &GroupScore,
    truncated: bool,
) -> String {
    let truncated = if truncated {
        "; the search stopped at its budget, a closer placement may exist"
    } else {
        ""
    };
    format!(
        "{key}: {pods} pods placed together in {domain} ({} nodes{truncated})",
        score.nodes
    )
}
