//! The pod rules: which pods the controller works on, which node a pod's resources count on, and
//! what the cluster already uses — devices (every allocated claim) and cpu/memory/pod slots (every
//! pod bound, or released by the controller, to a node).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_allocator::{AllocatedState, DeviceId};

use crate::claims::allocation;
use crate::protocol::{
    PLACEMENT_CONDITION, PodPlacement, is_bound, is_gated, is_terminal, object_key,
};
use crate::reason::PodReason;
use crate::resources::{NodeUsage, Requests, pod_requests};

/// The node whose resources a pod uses or is about to use: its node when bound; when released by
/// the controller but not bound yet, the node its claims were placed on.
pub fn usage_node(pod: &Pod) -> Option<String> {
    if is_terminal(pod) {
        return None;
    }
    if is_bound(pod) {
        return pod.spec.as_ref().and_then(|s| s.node_name.clone());
    }
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty())
    {
        return None;
    }
    PodPlacement::of(pod)
        .map(|p| p.node)
        .filter(|n| !n.is_empty())
}

/// What the pod requests (zero without a spec).
pub fn pod_usage_requests(pod: &Pod) -> Requests {
    pod.spec.as_ref().map(pod_requests).unwrap_or_default()
}

/// Whether the controller has work with this pod: gated by `gate`, or released by the controller
/// and not bound yet (its claims may be given back by the scheduler).
pub fn is_candidate(pod: &Pod, gate: &str) -> bool {
    if pod.metadata.deletion_timestamp.is_some() || is_terminal(pod) || is_bound(pod) {
        return false;
    }
    is_gated(pod, gate) || PodPlacement::of(pod).is_some()
}

/// Why `pod` waits for room, and since when: a pod the controller works on, still gated by
/// `gate`, whose condition [`PLACEMENT_CONDITION`] is `False` with a reason that is a lack of
/// capacity ([`PodReason::lacks_capacity`]: `Unsatisfiable` alone, `GroupUnsatisfiable` with its
/// group, `PreemptionBlocked` when only evictions a disruption budget refuses would make room). `since`: the condition's `lastTransitionTime` (when the pod stopped being placed or
/// started waiting), if set.
pub fn capacity_wait(pod: &Pod, gate: &str) -> Option<(PodReason, Option<Timestamp>)> {
    if !is_candidate(pod, gate) || !is_gated(pod, gate) {
        return None;
    }
    let condition = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == PLACEMENT_CONDITION && c.status == "False")?;
    let reason = PodReason::from_wire(condition.reason.as_deref()?)?;
    reason
        .lacks_capacity()
        .then(|| (reason, condition.last_transition_time.as_ref().map(|t| t.0)))
}

/// The pods that wait for room ([`capacity_wait`]): how many per reason, and the longest wait.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CapacityWaits {
    /// Pods per reason that is a lack of capacity ([`PodReason::lacking_capacity`]), each always
    /// present.
    pub pods: BTreeMap<PodReason, u64>,
    /// How long the pod that has waited longest has waited, at the time given.
    pub longest: SignedDuration,
}

impl CapacityWaits {
    /// The waits among `pods` at `now`.
    pub fn of<'p>(pods: impl IntoIterator<Item = &'p Pod>, gate: &str, now: Timestamp) -> Self {
        let mut waits = CapacityWaits {
            pods: PodReason::lacking_capacity().map(|r| (r, 0)).collect(),
            longest: SignedDuration::ZERO,
        };
        for (reason, since) in pods.into_iter().filter_map(|p| capacity_wait(p, gate)) {
            *waits.pods.entry(reason).or_default() += 1;
            let waited = since.map_or(SignedDuration::ZERO, |since| now.duration_since(since));
            waits.longest = waits.longest.max(waited);
        }
        waits
    }
}

/// What the pods on each node request, except the pod with UID `except` (the one being placed).
pub fn node_usage<'p>(
    pods: impl IntoIterator<Item = &'p Pod>,
    except: &str,
) -> HashMap<String, NodeUsage> {
    let mut usage: HashMap<String, NodeUsage> = HashMap::new();
    for pod in pods {
        if pod.metadata.uid.as_deref() == Some(except) {
            continue;
        }
        if let Some(node) = usage_node(pod) {
            usage
                .entry(node)
                .or_default()
                .add_pod(pod_usage_requests(pod));
        }
    }
    usage
}

/// A claim whose allocation does not parse; its devices count as exclusively in use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadableAllocation {
    /// `namespace/name` of the claim.
    pub claim: String,
    pub error: String,
}

/// Every device allocated by any of `claims`, whoever allocated it. A claim whose allocation
/// cannot be parsed still blocks its devices (exclusively), rather than letting them be allocated
/// twice; such claims are returned for the caller to report.
pub fn devices_in_use<'c>(
    claims: impl IntoIterator<Item = &'c ResourceClaim>,
) -> (AllocatedState, Vec<UnreadableAllocation>) {
    let mut state = AllocatedState::new();
    let mut unreadable = Vec::new();
    for claim in claims {
        let Some(allocation) = allocation(claim) else {
            continue;
        };
        if let Err(e) = state.add_allocation(allocation) {
            unreadable.push(UnreadableAllocation {
                claim: object_key(&claim.metadata),
                error: e.to_string(),
            });
            for r in allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
            {
                state.insert_device(DeviceId::new(&r.driver, &r.pool, &r.device));
            }
        }
    }
    (state, unreadable)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodSchedulingGate, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;

    const GATE: &str = "gpu.tessera.dev/topology-aware";

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// A pod gated by [`GATE`] (when `gated`) whose condition says `status`/`reason` since `since`.
    fn pod(gated: bool, status: &str, reason: &str, since: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ml".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                scheduling_gates: gated.then(|| vec![PodSchedulingGate { name: GATE.into() }]),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: PLACEMENT_CONDITION.into(),
                    status: status.into(),
                    reason: Some(reason.into()),
                    last_transition_time: Some(Time(at(since))),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn only_gated_pods_told_there_is_no_room_wait_for_capacity() {
        let since = "2026-11-22T09:00:00Z";
        let waiting = pod(true, "False", "Unsatisfiable", since);
        assert_eq!(
            capacity_wait(&waiting, GATE),
            Some((PodReason::Unsatisfiable, Some(at(since))))
        );
        let group = pod(true, "False", "GroupUnsatisfiable", since);
        assert_eq!(
            capacity_wait(&group, GATE).map(|w| w.0),
            Some(PodReason::GroupUnsatisfiable)
        );
        for (other, why) in [
            (
                pod(true, "False", "WaitingForGates", since),
                "a queue holds it",
            ),
            (pod(true, "False", "WaitingForClaims", since), "its claims"),
            (
                pod(true, "False", "InvalidInput", since),
                "its spec is wrong",
            ),
            (pod(true, "True", "Allocated", since), "placed"),
            (
                pod(false, "False", "Unsatisfiable", since),
                "no longer gated",
            ),
            (pod(true, "False", "Unschedulable", since), "not our reason"),
        ] {
            assert_eq!(capacity_wait(&other, GATE), None, "{why}");
        }
    }

    #[test]
    fn waits_are_counted_per_reason_with_the_longest() {
        let pods = [
            pod(true, "False", "Unsatisfiable", "2026-11-22T09:00:00Z"),
            pod(true, "False", "Unsatisfiable", "2026-11-22T09:50:00Z"),
            pod(true, "False", "WaitingForGates", "2026-11-22T08:00:00Z"),
            pod(true, "False", "PreemptionBlocked", "2026-11-22T09:30:00Z"),
        ];
        let waits = CapacityWaits::of(&pods, GATE, at("2026-11-22T10:00:00Z"));
        assert_eq!(
            waits.pods,
            BTreeMap::from([
                (PodReason::Unsatisfiable, 2),
                (PodReason::GroupUnsatisfiable, 0),
                (PodReason::PreemptionBlocked, 1)
            ])
        );
        assert_eq!(waits.longest, SignedDuration::from_hours(1));
        let none = CapacityWaits::of(&[], GATE, at("2026-11-22T10:00:00Z"));
        assert_eq!(none.longest, SignedDuration::ZERO);
        assert_eq!(none.pods.values().sum::<u64>(), 0);
    }
}
