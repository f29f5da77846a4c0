//! Preemption in a pod's decision ([`crate::preemption`]). A gated pod that fits on no free
//! devices gets a plan — its victims marked and evicted, the devices they free nominated for
//! it — when its priority and policy allow one; while its nomination stands it waits for the
//! victims to release their claims (evicting again any that still run). The devices stay in
//! use until then: nothing is allocated twice.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;

use crate::decide::steps::{in_context, undo_steps, waits};
use crate::decision::{
    ClusterSource, Count, Decision, GroupVerdict, PodVerdict, PreemptionObjects, Ruling, Step, Then,
};
use crate::group::membership::GroupKey;
use crate::group::search::GroupInput;
use crate::message::add_to_summary;
use crate::planner::{Action, Failure, PodPlan};
use crate::preemption::nomination::{DEFAULT_NOMINATION_MARGIN, Nomination, PreemptedBy};
use crate::preemption::{
    ManagedDevices, PreemptionDecision, PreemptionInput, PreemptionOutcome, PreemptionPlan,
    Victims, preempt_group, preempt_pod, preemption_allowed, victim_index,
};
use crate::protocol::{is_gated, object_key};
use crate::reason::{EventKind, PodReason};
use crate::resolve::PodClaim;
use crate::view::{PodContext, Settings};

/// What preemption makes of a pod that cannot be placed.
pub(crate) enum Preemption {
    /// Carry this decision out instead (a plan made now, or a nomination that stands).
    Decide(Box<Decision>),
    /// No plan: why, for the pod's message; `budgets`: disruption budgets set victims aside
    /// (the condition says `PreemptionBlocked`).
    Why { why: String, budgets: bool },
}

/// Preemption for `pod` (its claims resolved, `plan` the planner's plan on free devices), or
/// `None` when it does not apply: the pod is placed, is not gated, or `source` does not preempt.
pub(crate) fn for_pod(
    pod: &Arc<Pod>,
    claims: &[PodClaim],
    plan: &PodPlan,
    source: &dyn ClusterSource,
    settings: &Settings,
    now: Timestamp,
) -> Option<Preemption> {
    let Action::CannotPlace {
        failure: Failure::Unsatisfiable,
        undo,
        ..
    } = &plan.action
    else {
        return None;
    };
    if !is_gated(pod, &settings.gate) {
        return None;
    }
    let objects = source.preemption()?;
    if let Some(nomination) = Nomination::of(pod).filter(|n| !n.expired(now)) {
        let decision = standing(pod, plan, nomination, &objects, undo, now);
        return Some(Preemption::Decide(Box::new(decision)));
    }
    if !preemption_allowed(pod) {
        return Some(Preemption::Why {
            why: "no preemption: its preemptionPolicy is Never, so it preempts nobody".into(),
            budgets: false,
        });
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let searched = in_context(source, uid, |context| {
        let victims = victims_of(context, &objects, settings, now);
        if victims.is_empty() {
            // No running pod holds managed devices: nothing to say about preemption.
            return None;
        }
        let input = input_of(&victims, &objects);
        let searched = preempt_pod(pod, claims, context, settings, &input, now);
        Some(checked(searched, &victims, &objects, source))
    })?;
    match searched.outcome {
        PreemptionOutcome::NotPossible { message, budgets } => Some(Preemption::Why {
            why: message,
            budgets,
        }),
        PreemptionOutcome::Preempt(preemption) => {
            planned(pod, plan, preemption, &objects, undo, now)
                .map(|d| Preemption::Decide(Box::new(d)))
        }
    }
}

/// The running pods holding managed devices, in units, with the budgets covering them; the
/// victims of nominations that stand are nobody else's. The index `objects` carries when the
/// source keeps one, else built now.
fn victims_of(
    context: &PodContext<'_>,
    objects: &PreemptionObjects,
    settings: &Settings,
    now: Timestamp,
) -> Arc<Victims> {
    if let Some(kept) = &objects.victims {
        return kept.clone();
    }
    Arc::new(victim_index(
        &ManagedDevices::new(context.devices),
        &objects.pods,
        &objects.claims,
        &objects.budgets,
        &settings.gate,
        now,
    ))
}

/// `searched`, or no plan when its plan no longer matches the cluster: a victim is gone or
/// finished, or a claim the plan counts on freeing is not the version `victims` read (a kept
/// index behind the caches). A plan is carried out only against what the cluster holds now, so
/// an index that fell behind never evicts a pod that does not hold what the plan frees.
fn checked(
    searched: PreemptionDecision,
    victims: &Victims,
    objects: &PreemptionObjects,
    source: &dyn ClusterSource,
) -> PreemptionDecision {
    let PreemptionOutcome::Preempt(plan) = &searched.outcome else {
        return searched;
    };
    let uids: HashSet<&str> = plan.victims.iter().map(|v| v.uid.as_str()).collect();
    let same = |held: &ResourceClaim| {
        let meta = &held.metadata;
        let live = source.claim(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        );
        live.is_some_and(|l| {
            l.metadata.uid == meta.uid && l.metadata.resource_version == meta.resource_version
        })
    };
    let matches = victims
        .pods
        .iter()
        .filter(|p| uids.contains(p.uid.as_str()))
        .all(|p| {
            find(objects, &p.uid).is_some()
                && p.claims.iter().all(|&c| same(&victims.claims[c].claim))
        });
    if matches {
        return searched;
    }
    PreemptionDecision {
        outcome: PreemptionOutcome::NotPossible {
            message: "no preemption now: a planned victim or its claim changed since the victim \
                      index was read; deciding again at the next change"
                .to_owned(),
            budgets: false,
        },
        ..searched
    }
}

fn input_of<'a>(victims: &'a Victims, objects: &'a PreemptionObjects) -> PreemptionInput<'a> {
    PreemptionInput {
        victims,
        // The context holds the devices nominated for others as in use already.
        reserved: &[],
        refused: &objects.refused,
        settings: &objects.settings,
    }
}

/// Preemption for a group that fits on no free devices (`gated`: its gated members with their
/// claims resolved, as `input` lists them), or `None` when `source` does not preempt or no
/// running pod holds managed devices. While a member's nomination stands the group waits.
pub(crate) fn for_group(
    input: &GroupInput<'_>,
    gated: &[Arc<Pod>],
    source: &dyn ClusterSource,
    settings: &Settings,
    now: Timestamp,
) -> Option<Preemption> {
    let objects = source.preemption()?;
    let standing = gated
        .iter()
        .find_map(|p| Some((p, Nomination::of(p).filter(|n| !n.expired(now))?)));
    if let Some((first, nomination)) = standing {
        let decision = group_standing(input.key, gated, first, nomination, &objects, now);
        return Some(Preemption::Decide(Box::new(decision)));
    }
    let searched = in_context(source, "", |context| {
        let victims = victims_of(context, &objects, settings, now);
        if victims.is_empty() {
            return None;
        }
        let preemption = input_of(&victims, &objects);
        let searched = preempt_group(input, context, settings, &settings.group, &preemption, now);
        Some(checked(searched, &victims, &objects, source))
    })?;
    match searched.outcome {
        PreemptionOutcome::NotPossible { message, budgets } => Some(Preemption::Why {
            why: message,
            budgets,
        }),
        PreemptionOutcome::Preempt(plan) => group_planned(input.key, gated, plan, &objects, now)
            .map(|d| Preemption::Decide(Box::new(d))),
    }
}

/// The decision that carries `preemption` out for a group: each member placed by the plan
/// nominated, the victims evicted once, counted; every gated member told.
fn group_planned(
    key: &GroupKey,
    gated: &[Arc<Pod>],
    preemption: PreemptionPlan,
    objects: &PreemptionObjects,
    now: Timestamp,
) -> Option<Decision> {
    let mut first = Vec::new();
    let mut nominated = Vec::new();
    for reservation in &preemption.reservations {
        let uid = Some(reservation.uid.as_str());
        let pod = gated.iter().find(|p| p.metadata.uid.as_deref() == uid)?;
        let nomination = Nomination::new(&preemption, reservation, now, DEFAULT_NOMINATION_MARGIN);
        first.push(Step::Nominate {
            pod: pod.clone(),
            nomination: Some(nomination.clone()),
        });
        nominated.push((pod, nomination));
    }
    let (preemptor, nomination) = nominated.first()?;
    let nominees: Vec<Arc<Pod>> = nominated.iter().map(|(p, _)| (*p).clone()).collect();
    first.extend(evictions(preemptor, &nominees, nomination, objects, now));
    first.push(Step::Count(Count::Preemption {
        victims: preemption.victims.len() as u64,
        gpu_seconds: preemption.cost.gpu_seconds,
    }));
    let message = format!(
        "{key}: {}",
        preemption
            .message
            .replacen("would preempt", "preempting", 1)
    );
    Some(group_waits(key, gated, first, message, Some(preemption)))
}

/// The decision for a group while a member's nomination stands: victims that still run are
/// evicted again; the group waits.
fn group_standing(
    key: &GroupKey,
    gated: &[Arc<Pod>],
    preemptor: &Arc<Pod>,
    nomination: Nomination,
    objects: &PreemptionObjects,
    now: Timestamp,
) -> Decision {
    let first = evictions(preemptor, gated, &nomination, objects, now);
    let message = format!("{key}: {}", standing_message(&nomination, objects));
    group_waits(key, gated, first, message, None)
}

fn group_waits(
    key: &GroupKey,
    gated: &[Arc<Pod>],
    first: Vec<Step>,
    message: String,
    preemption: Option<PreemptionPlan>,
) -> Decision {
    let per_pod = gated
        .iter()
        .map(|p| vec![waits(p, PodReason::Preempting, &message, EventKind::Normal)])
        .collect();
    Decision {
        ruling: Ruling::Group(GroupVerdict::Preempting {
            key: key.clone(),
            message,
            preemption,
        }),
        first,
        per_pod,
        then: Then::Park,
    }
}

/// The decision that carries `preemption` out for `pod`: the controller's partial allocations
/// undone, the nomination recorded, the victims evicted, counted; the pod waits.
fn planned(
    pod: &Arc<Pod>,
    plan: &PodPlan,
    preemption: PreemptionPlan,
    objects: &PreemptionObjects,
    undo: &[Arc<k8s_openapi::api::resource::v1::ResourceClaim>],
    now: Timestamp,
) -> Option<Decision> {
    let reservation = preemption.reservations.first()?;
    let nomination = Nomination::new(&preemption, reservation, now, DEFAULT_NOMINATION_MARGIN);
    let mut first = undo_steps(pod, undo);
    first.push(Step::Nominate {
        pod: pod.clone(),
        nomination: Some(nomination.clone()),
    });
    first.extend(evictions(
        pod,
        std::slice::from_ref(pod),
        &nomination,
        objects,
        now,
    ));
    first.push(Step::Count(Count::Preemption {
        victims: preemption.victims.len() as u64,
        gpu_seconds: preemption.cost.gpu_seconds,
    }));
    let message = preemption
        .message
        .replacen("would preempt", "preempting", 1);
    let notice = waits(pod, PodReason::Preempting, &message, EventKind::Normal);
    Some(Decision {
        ruling: Ruling::Pod(PodVerdict::Preempting {
            plan: plan.clone(),
            nomination,
            preemption: Some(preemption),
        }),
        first,
        per_pod: vec![vec![notice]],
        then: Then::Park,
    })
}

/// The decision for `pod` while its `nomination` stands: victims that still run and are not
/// stopping are evicted again; the pod waits.
fn standing(
    pod: &Arc<Pod>,
    plan: &PodPlan,
    nomination: Nomination,
    objects: &PreemptionObjects,
    undo: &[Arc<k8s_openapi::api::resource::v1::ResourceClaim>],
    now: Timestamp,
) -> Decision {
    let mut first = undo_steps(pod, undo);
    first.extend(evictions(
        pod,
        std::slice::from_ref(pod),
        &nomination,
        objects,
        now,
    ));
    let message = standing_message(&nomination, objects);
    let notice = waits(pod, PodReason::Preempting, &message, EventKind::Normal);
    Decision {
        ruling: Ruling::Pod(PodVerdict::Preempting {
            plan: plan.clone(),
            nomination,
            preemption: None,
        }),
        first,
        per_pod: vec![vec![notice]],
        then: Then::Park,
    }
}

/// What a pod (or group) whose nomination stands waits for.
fn standing_message(nomination: &Nomination, objects: &PreemptionObjects) -> String {
    let left = nomination.victims_left(|uid| find(objects, uid).is_some());
    let devices: Vec<&str> = nomination
        .devices
        .iter()
        .map(|d| d.device.as_str())
        .collect();
    let freeing = format!(
        "{} of node {} are nominated for the pod",
        devices.join(", "),
        nomination.node
    );
    if left.is_empty() {
        format!("{freeing}; waiting for the evicted pods' claims to be released")
    } else {
        let names: Vec<&str> = left.iter().map(|v| v.pod.as_str()).collect();
        format!(
            "{freeing}; waiting for {} to stop and release them",
            names.join(", ")
        )
    }
}

/// The evictions of `nomination`'s victims that still run and are not stopping, in order. One
/// is committed when the victim is marked already, or an earlier pod of its gang is: a gang is
/// evicted whole once its first pod is.
fn evictions(
    preemptor: &Arc<Pod>,
    nominees: &[Arc<Pod>],
    nomination: &Nomination,
    objects: &PreemptionObjects,
    now: Timestamp,
) -> Vec<Step> {
    let by = PreemptedBy {
        pod: object_key(&preemptor.metadata),
        uid: preemptor.metadata.uid.clone().unwrap_or_default(),
        at: now.to_string(),
    };
    let mut started_gangs: Vec<&str> = Vec::new();
    let mut steps = Vec::new();
    for victim in &nomination.victims {
        let gang_started = victim
            .group
            .as_deref()
            .is_some_and(|g| started_gangs.contains(&g));
        if let Some(group) = victim.group.as_deref() {
            started_gangs.push(group);
        }
        let Some(pod) = find(objects, &victim.uid) else {
            continue;
        };
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        steps.push(Step::Evict {
            victim: pod.clone(),
            preemptor: preemptor.clone(),
            nominees: nominees.to_vec(),
            by: by.clone(),
            committed: gang_started || PreemptedBy::is_marked(pod),
        });
    }
    steps
}

/// The pod with `uid` among the objects, if it is still there and not finished.
fn find<'o>(objects: &'o PreemptionObjects, uid: &str) -> Option<&'o Arc<Pod>> {
    objects
        .pods
        .iter()
        .find(|p| p.metadata.uid.as_deref() == Some(uid) && !crate::protocol::is_terminal(p))
}

/// `plan` with `why` preemption does not help added to its message's summary line; when
/// disruption budgets set victims aside (`budgets`) the pod waits on them, not on capacity.
pub(crate) fn with_reason(mut plan: PodPlan, why: &str, budgets: bool) -> PodPlan {
    if let Action::CannotPlace {
        message, failure, ..
    } = &mut plan.action
    {
        add_to_summary(message, why);
        if budgets && *failure == Failure::Unsatisfiable {
            *failure = Failure::PreemptionBlocked;
        }
    }
    plan
}
