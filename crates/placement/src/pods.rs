//! The pod rules: which pods the controller works on, which node a pod's resources count on, and
//! what the cluster already uses — devices (every allocated claim) and cpu/memory/pod slots (every
//! pod bound, or released by the controller, to a node).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_allocator::{AllocatedState, DeviceId};

use crate::claims::allocation;
use crate::protocol::{PodPlacement, is_bound, is_gated, is_terminal, object_key};
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
