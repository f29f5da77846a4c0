//! The one entry point: [`decide`] makes the [`Decision`] for a pod — the controller's worker
//! carries it out, `tessera explain --pod` prints its ruling — so the two cannot disagree.
//!
//! A gated pod of a group (gang) is decided with its group ([`group`]), every other pod alone
//! ([`pod`]). Both end in the planner: [`crate::view::decide_pod`] for each pod. A gated pod
//! alone that fits on no free devices may preempt pods of lower priority ([`preempt`]). What they
//! share: [`steps`].

pub mod group;
pub mod pod;
pub mod preempt;
pub mod steps;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::decision::{ClusterSource, Decision, Notice, PodVerdict, Ruling, Step, Then};
use crate::group::membership::{GroupKey, GroupSource, group_key};
use crate::group::starvation::Waiting;
use crate::pods::is_candidate;
use crate::protocol::{foreign_gates, is_bound, is_gated, is_terminal, object_key};
use crate::reason::{EventKind, PodReason};
use crate::view::Settings;

/// What the controller configured with `settings` does with `pod` at `now`, reading the cluster
/// from `source`; `waiting`: the groups waiting for capacity (the starvation policy's memory).
pub fn decide(
    pod: &Arc<Pod>,
    source: &dyn ClusterSource,
    waiting: &[Waiting],
    settings: &Settings,
    now: Timestamp,
) -> Decision {
    let gate = settings.gate.as_str();
    if !is_candidate(pod, gate) {
        let why = not_candidate_reason(pod, gate);
        return Decision::nothing(Ruling::Pod(PodVerdict::NotCandidate(why)));
    }
    let foreign = foreign_gates(pod, gate);
    if !foreign.is_empty() {
        return waiting_for_gates(pod, foreign, source, gate);
    }
    match is_gated(pod, gate).then(|| group_key(pod)).flatten() {
        Some(key) => group::decide_for_group(pod, key, source, waiting, settings, now),
        None => pod::decide_alone(pod, source, waiting, settings, now),
    }
}

/// `pod` still carries other components' scheduling `gates`: nothing is allocated for it. A
/// pod gated by the controller is told which gates it waits for, and the template its
/// device-plugin conversion names is created meanwhile (a queue such as Kueue reads the template
/// to count the pod's devices before it admits it); one the controller released
/// already (its gate removed by someone else first, or released before a foreign gate was seen)
/// keeps its claims and its condition and is bound once the gates are gone. Either way the pod
/// leaves the queue: removing a gate changes the pod, which queues it again.
fn waiting_for_gates(
    pod: &Arc<Pod>,
    gates: Vec<String>,
    source: &dyn ClusterSource,
    gate: &str,
) -> Decision {
    let listed = gates.join(", ");
    let kueue = if gates.iter().any(|g| g.starts_with("kueue.x-k8s.io/")) {
        " (Kueue removes its gates when it admits the pod's workload)"
    } else {
        ""
    };
    let message = if is_gated(pod, gate) {
        format!(
            "waiting for the scheduling gates {listed} to be removed{kueue}: the controller places a \
             pod only once its own gate {gate} is the last one"
        )
    } else {
        format!(
            "released already; kube-scheduler binds it once the scheduling gates {listed} are \
             removed{kueue}"
        )
    };
    let notify = is_gated(pod, gate).then(|| Step::Notify {
        pod: pod.clone(),
        notice: Notice {
            reason: PodReason::WaitingForGates,
            message: message.clone(),
            kind: EventKind::Normal,
        },
    });
    let creates = if is_gated(pod, gate) {
        pod::resolve(pod, source).1
    } else {
        Vec::new()
    };
    Decision {
        ruling: Ruling::Pod(PodVerdict::WaitingForGates { gates, message }),
        first: creates,
        per_pod: notify.map(|step| vec![vec![step]]).unwrap_or_default(),
        then: Then::Done,
    }
}

/// The PodGroup the decision for `pod` reads, if any ([`ClusterSource::pod_group`]): the
/// controller does not watch PodGroups, it reads this one before deciding.
pub fn pod_group_needed(pod: &Pod, settings: &Settings) -> Option<GroupKey> {
    gang_of(pod, settings).filter(|key| key.source == GroupSource::PodGroup)
}

/// The group `pod` is decided with: a gated pod the controller works on that names a group.
fn gang_of(pod: &Pod, settings: &Settings) -> Option<GroupKey> {
    let gate = settings.gate.as_str();
    if is_candidate(pod, gate) && is_gated(pod, gate) && foreign_gates(pod, gate).is_empty() {
        group_key(pod)
    } else {
        None
    }
}

/// Why the controller leaves `pod` alone.
fn not_candidate_reason(pod: &Pod, gate: &str) -> String {
    let key = object_key(&pod.metadata);
    if pod.metadata.deletion_timestamp.is_some() {
        format!("pod {key} is being deleted")
    } else if is_terminal(pod) {
        format!("pod {key} has finished")
    } else if is_bound(pod) {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        format!("pod {key} is bound to node {node} already")
    } else {
        format!(
            "pod {key} does not carry the scheduling gate {gate} and was not placed by the controller; \
             kube-scheduler places it"
        )
    }
}
