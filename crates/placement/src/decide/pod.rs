//! The decision for a pod placed alone: whether a waiting group holds it back, its claims
//! resolved, then the planner ([`crate::view::decide_pod`]) — and the steps that carry the plan
//! out.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::decide::preempt::{self, Preemption};
use crate::decide::steps::{in_context, undo_steps, waits};
use crate::decision::{
    ClusterSource, Count, Decision, Notice, PodPatch, PodVerdict, Ruling, Step, Then,
};
use crate::group::membership::{GroupKey, member_arrival};
use crate::group::starvation::{Waiting, held_back_by};
use crate::imex::DomainJob;
use crate::message::claim_list;
use crate::planner::{Action, Placement, PodPlan};
use crate::preemption::nomination::Nomination;
use crate::preemption::pod_priority;
use crate::protocol::{PodPlacement, is_gated};
use crate::reason::{EventKind, PodReason};
use crate::resolve::{PodClaim, Resolution, resolve_claims};
use crate::view::{Settings, decide_domain_pod, decide_pod, decide_released};
use tessera_admission::conversion::recorded_template;

/// The decision for `pod`, a pod the controller works on ([`crate::pods::is_candidate`]),
/// placed alone at `now`; `waiting`: the groups waiting for capacity.
pub fn decide_alone(
    pod: &Arc<Pod>,
    source: &dyn ClusterSource,
    waiting: &[Waiting],
    settings: &Settings,
    now: Timestamp,
) -> Decision {
    let gated = is_gated(pod, &settings.gate);
    let mut forget = Vec::new();
    if gated && let Some(by) = held_back(pod, None, source, waiting, settings, now, &mut forget) {
        let message = format!(
            "waiting behind {}, which arrived earlier and has waited for capacity since {}: \
             pods that arrived later are not placed before it",
            by.key, by.since
        );
        let report = waits(
            pod,
            PodReason::WaitingBehindGroup,
            &message,
            EventKind::Normal,
        );
        let verdict = Ruling::Pod(PodVerdict::HeldBack { by, message });
        let count = Some(PodReason::WaitingBehindGroup);
        return waiting_decision(verdict, forget, count, vec![report]);
    }
    let (resolution, creates) = resolve(pod, source);
    forget.extend(creates);
    let claims = match resolution {
        Resolution::Resolved(claims) => claims,
        Resolution::Waiting(message) => {
            let report = waits(
                pod,
                PodReason::WaitingForClaims,
                &message,
                EventKind::Normal,
            );
            let verdict = Ruling::Pod(PodVerdict::WaitingForClaims(message));
            let count = Some(PodReason::WaitingForClaims);
            return waiting_decision(verdict, forget, count, vec![report]);
        }
        Resolution::Invalid(message) | Resolution::MissingTemplate { message, .. } => {
            let report = waits(pod, PodReason::InvalidInput, &message, EventKind::Warning);
            let verdict = Ruling::Pod(PodVerdict::InvalidClaims(message));
            let count = Some(PodReason::InvalidInput);
            return waiting_decision(verdict, forget, count, vec![report]);
        }
    };
    let mut plan = plan(pod, &claims, source, settings, now);
    match preempt::for_pod(pod, &claims, &plan, source, settings, now) {
        Some(Preemption::Decide(mut decision)) => {
            forget.append(&mut decision.first);
            decision.first = forget;
            return *decision;
        }
        Some(Preemption::Why { why, budgets }) => plan = preempt::with_reason(plan, &why, budgets),
        None => {}
    }
    let (first, mut per_pod, then) = steps(pod, gated.then_some(settings.gate.as_str()), &plan);
    forget.extend(first);
    if gated && Nomination::of(pod).is_some() {
        // Placed, or no plan stands any more: the devices are nobody's to keep.
        per_pod.push(Step::Nominate {
            pod: pod.clone(),
            nomination: None,
        });
    }
    Decision {
        ruling: Ruling::Pod(PodVerdict::Decided(plan)),
        first: forget,
        per_pod: if per_pod.is_empty() {
            Vec::new()
        } else {
            vec![per_pod]
        },
        then,
    }
}

/// The claims of `pod`, from `source`, and the steps that create what the controller keeps for
/// them: a pod converted from the device plugin whose template is missing waits for its claims
/// while the controller creates the template (kube-controller-manager then makes the claim).
pub(crate) fn resolve(pod: &Arc<Pod>, source: &dyn ClusterSource) -> (Resolution, Vec<Step>) {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let resolution = resolve_claims(
        pod,
        |claim| source.claim(namespace, claim),
        |template| source.template_exists(namespace, template),
    );
    let Resolution::MissingTemplate { template, message } = &resolution else {
        return (resolution, Vec::new());
    };
    let annotations = pod.metadata.annotations.as_ref();
    match recorded_template(annotations, template, namespace) {
        Some(object) => {
            let message = format!(
                "{message}: the pod was converted from the device plugin, so the controller \
                 creates the template; the claim follows"
            );
            let create = Step::CreateTemplate {
                pod: pod.clone(),
                template: Arc::new(object),
            };
            (Resolution::Waiting(message), vec![create])
        }
        None => (resolution, Vec::new()),
    }
}

/// The planner's plan for `pod`. A released pod whose claims are all allocated (each placed pod
/// is looked at once more after its release) needs neither the devices nor what is in use.
fn plan(
    pod: &Pod,
    claims: &[PodClaim],
    source: &dyn ClusterSource,
    settings: &Settings,
    now: Timestamp,
) -> PodPlan {
    if let Some(plan) = decide_released(pod, claims, settings) {
        return plan;
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    // Where the IMEX domains run is read only for a pod that asks for one.
    let domain = DomainJob::of([claims]).map(|job| (job, source.domain_nodes()));
    in_context(source, uid, |context| match &domain {
        Some((job, domains)) => {
            decide_domain_pod(pod, claims, context, settings, now, (job, domains))
        }
        None => decide_pod(pod, claims, context, settings, now),
    })
}

/// The steps of `plan` for `pod` (`gate`: the scheduling gate the pod carries, if any): the
/// steps carried out first, the pod's own, and how the pod leaves the queue.
fn steps(pod: &Arc<Pod>, gate: Option<&str>, plan: &PodPlan) -> (Vec<Step>, Vec<Step>, Then) {
    let mut first = Vec::new();
    if plan.record_first {
        first.push(Step::PatchPod {
            pod: pod.clone(),
            patch: PodPatch::AvoidNodes(plan.record.clone()),
        });
    }
    let release = |record: Option<PodPlacement>| Step::PatchPod {
        pod: pod.clone(),
        patch: PodPatch::Release {
            record,
            gate: gate.map(str::to_owned),
        },
    };
    let report = |reason, message: &str, kind| Step::Notify {
        pod: pod.clone(),
        notice: Notice {
            reason,
            message: message.to_owned(),
            kind,
        },
    };
    let (per_pod, then) = match &plan.action {
        Action::Nothing => (Vec::new(), Then::Done),
        Action::Release { node } => {
            let mut record = plan.record.clone();
            if let Some(node) = node {
                record.node = node.clone();
            }
            let message =
                "every claim of the pod was already allocated; released it to the scheduler";
            let steps = vec![
                release(Some(record)),
                report(PodReason::AlreadyAllocated, message, EventKind::Normal),
            ];
            (steps, Then::Done)
        }
        Action::LeaveToScheduler { message } => {
            let steps = vec![
                release(None),
                Step::Count(Count::LeftToScheduler),
                report(PodReason::LeftToScheduler, message, EventKind::Normal),
            ];
            (steps, Then::Done)
        }
        Action::CannotPlace {
            failure,
            message,
            undo,
        } => {
            let reason = failure.reason();
            first.extend(undo_steps(pod, undo));
            first.push(Step::Count(Count::Failure(reason)));
            let steps = vec![report(reason, message, EventKind::Warning)];
            (steps, Then::Park)
        }
        Action::Place(placement) => {
            first.extend(placement_steps(pod, placement));
            let mut record = plan.record.clone();
            record.node = placement.node.clone();
            let steps = vec![
                release(Some(record)),
                Step::Count(Count::PodPlaced),
                report(
                    PodReason::Allocated,
                    &placed_message(placement),
                    EventKind::Normal,
                ),
            ];
            (steps, Then::Done)
        }
    };
    (first, per_pod, then)
}

/// The claim steps of a placement: the controller's earlier allocations it replaces undone, the
/// claims written in order, then counted.
pub(crate) fn placement_steps(pod: &Arc<Pod>, placement: &Placement) -> Vec<Step> {
    let mut steps = undo_steps(pod, &placement.undo);
    steps.extend(placement.writes.iter().map(|write| Step::Allocate {
        pod: pod.clone(),
        node: placement.node.clone(),
        write: write.clone(),
    }));
    steps.push(Step::Count(Count::ClaimsAllocated(
        placement.writes.len() as u64
    )));
    steps
}

/// A decision that parks the pod(s): `first`, then `count` (an attempt that did not place the
/// pod, by reason), then one report per pod.
pub(crate) fn waiting_decision(
    ruling: Ruling,
    mut first: Vec<Step>,
    count: Option<PodReason>,
    reports: Vec<Step>,
) -> Decision {
    first.extend(count.map(|reason| Step::Count(Count::Failure(reason))));
    Decision {
        ruling,
        first,
        per_pod: reports.into_iter().map(|r| vec![r]).collect(),
        then: Then::Park,
    }
}

/// The waiting group that holds back `pod` (of group `own`, if any); the groups that no longer
/// have a gated pod are added to `forget` and hold back nothing.
pub(crate) fn held_back(
    pod: &Pod,
    own: Option<&GroupKey>,
    source: &dyn ClusterSource,
    waiting: &[Waiting],
    settings: &Settings,
    now: Timestamp,
    forget: &mut Vec<Step>,
) -> Option<Waiting> {
    let mut still = Vec::new();
    for w in waiting {
        let gated = source
            .group_pods(&w.key)
            .iter()
            .any(|p| is_gated(p, &settings.gate));
        if gated {
            still.push(w);
        } else {
            forget.push(Step::Forget(w.key.clone()));
        }
    }
    held_back_by(
        pod_priority(pod),
        member_arrival(pod),
        own,
        still,
        now,
        settings.group_hold,
    )
    .cloned()
}

/// `allocated claims ns/a (gpu-4, gpu-5), ns/b (gpu-6) on node n (topology-aware, score …)`.
pub(crate) fn placed_message(placement: &Placement) -> String {
    let claims: Vec<String> = placement
        .writes
        .iter()
        .map(|w| {
            let devices: Vec<&str> = w
                .allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
                .map(|r| r.device.as_str())
                .collect();
            format!(
                "{} ({})",
                claim_list(std::slice::from_ref(&w.claim)),
                devices.join(", ")
            )
        })
        .collect();
    let truncated = if placement.truncated {
        "; the search stopped at its step budget, a better placement may exist"
    } else {
        ""
    };
    format!(
        "allocated {} on node {} (topology-aware; {}){truncated}",
        claims.join(", "),
        placement.node,
        placement.score
    )
}
