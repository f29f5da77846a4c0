//! Who may preempt whom: a pod's priority and its preemption policy.

use k8s_openapi::api::core::v1::Pod;

/// A pod's priority: `spec.priority`, which admission sets from its PriorityClass when the pod
/// is created and which never changes; 0 without one.
pub fn pod_priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// Whether the pod may preempt others: its `spec.preemptionPolicy` is not `Never`.
pub fn preemption_allowed(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref())
        != Some("Never")
}
