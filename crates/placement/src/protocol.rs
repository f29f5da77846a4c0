//! The marks the controller leaves on API objects and reads back — after a restart, after a leader
//! change, or when the scheduler has undone part of its work (docs/protocol.md). Pure data: building
//! and parsing the annotation values, no IO.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

/// The finalizer kube-scheduler adds to a claim before it writes an allocation; the controller
/// adds the same one, so the kube-controller-manager treats our allocations like the scheduler's.
pub const CLAIM_FINALIZER: &str = "resource.kubernetes.io/delete-protection";

/// Pod condition that says whether (and why not) the controller placed the pod's claims.
pub const PLACEMENT_CONDITION: &str = "gpu.tessera.dev/TopologyAwarePlacement";

/// Claim annotation: the controller allocated this claim for a pod ([`ClaimMark`], JSON).
pub const CLAIM_MARK_ANNOTATION: &str = "gpu.tessera.dev/allocated-for";

/// Pod annotation: where the controller placed the pod's claims, and which nodes it avoids for
/// the pod because the scheduler gave back an allocation there ([`PodPlacement`], JSON).
pub const POD_PLACEMENT_ANNOTATION: &str = "gpu.tessera.dev/placement";

/// The name the controller reports events and field ownership under.
pub const CONTROLLER_NAME: &str = "tessera-controller";

/// What the controller writes on a claim it allocates, in the same update that adds the
/// finalizer, before the allocation itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimMark {
    /// UID of the pod the claim was allocated for.
    pub pod_uid: String,
    /// Name of that pod (same namespace as the claim).
    pub pod: String,
    /// The node the allocation is for.
    pub node: String,
    /// Whether the controller added [`CLAIM_FINALIZER`] (then undoing the allocation removes it).
    pub finalizer_added: bool,
}

impl ClaimMark {
    /// The mark on a claim, if it has a readable one.
    pub fn of(claim: &ResourceClaim) -> Option<ClaimMark> {
        let value = claim
            .metadata
            .annotations
            .as_ref()?
            .get(CLAIM_MARK_ANNOTATION)?;
        serde_json::from_str(value).ok()
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a ClaimMark always serializes")
    }

    /// Whether the mark names this pod.
    pub fn is_for(&self, pod: &Pod) -> bool {
        pod.metadata.uid.as_deref() == Some(self.pod_uid.as_str())
    }
}

/// What the controller records on a pod it placed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodPlacement {
    /// The node the pod's claims were last allocated for (empty while re-placing).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// When, RFC 3339.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub placed_at: String,
    /// Nodes to avoid, with the time (RFC 3339) until which to avoid each.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub avoid: BTreeMap<String, String>,
}

impl PodPlacement {
    /// The placement recorded on a pod; an unreadable value counts as none (the controller then
    /// simply avoids nothing), never as an error that would block the pod.
    pub fn of(pod: &Pod) -> Option<PodPlacement> {
        let value = pod
            .metadata
            .annotations
            .as_ref()?
            .get(POD_PLACEMENT_ANNOTATION)?;
        serde_json::from_str(value).ok()
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a PodPlacement always serializes")
    }

    /// The nodes still avoided at `now`.
    pub fn avoided_at(&self, now: Timestamp) -> Vec<String> {
        self.avoid
            .iter()
            .filter(|(_, until)| until.parse::<Timestamp>().is_ok_and(|until| until > now))
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// Adds `node` to the avoided nodes until `now + duration` and drops entries that expired.
    pub fn avoid_node(&mut self, node: &str, now: Timestamp, duration: SignedDuration) {
        self.forget_expired(now);
        let until = now.saturating_add(duration).unwrap_or(now);
        self.avoid.insert(node.to_owned(), until.to_string());
    }

    /// Drops avoided nodes whose time has passed (and unreadable entries).
    pub fn forget_expired(&mut self, now: Timestamp) {
        self.avoid
            .retain(|_, until| until.parse::<Timestamp>().is_ok_and(|until| until > now));
    }
}

/// Whether the pod carries the scheduling gate `gate`.
pub fn is_gated(pod: &Pod, gate: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|g| g.name == gate))
}

/// The pod's scheduling gates other than `gate`, in the pod's order: someone else's hold on the
/// pod (Kueue's `kueue.x-k8s.io/admission` and `kueue.x-k8s.io/topology` until it admits the
/// workload, any other). The controller decides a pod only once none is left.
pub fn foreign_gates(pod: &Pod, gate: &str) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .into_iter()
        .flatten()
        .filter(|g| g.name != gate)
        .map(|g| g.name.clone())
        .collect()
}

/// Whether the pod is bound to a node.
pub fn is_bound(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// Whether the pod has finished (it no longer uses node resources).
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// `namespace/name` of an object.
pub fn object_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn claim_mark_round_trips_through_the_annotation() {
        let mark = ClaimMark {
            pod_uid: "uid-1".into(),
            pod: "trainer".into(),
            node: "node-a".into(),
            finalizer_added: true,
        };
        let claim = ResourceClaim {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    CLAIM_MARK_ANNOTATION.to_owned(),
                    mark.to_annotation(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(ClaimMark::of(&claim), Some(mark));
        assert_eq!(
            ClaimMark::of(&ResourceClaim::default()),
            None,
            "no annotation, no mark"
        );
    }

    #[test]
    fn avoided_nodes_expire() {
        let now = at("2026-11-22T10:00:00Z");
        let mut placement = PodPlacement::default();
        placement.avoid_node("node-a", now, SignedDuration::from_mins(5));
        placement
            .avoid
            .insert("node-old".into(), "2026-11-22T09:00:00Z".into());
        placement
            .avoid
            .insert("node-bad".into(), "yesterday".into());
        assert_eq!(placement.avoided_at(now), ["node-a"]);
        assert!(placement.avoided_at(at("2026-11-22T10:05:01Z")).is_empty());
        placement.avoid_node(
            "node-b",
            at("2026-11-22T10:01:00Z"),
            SignedDuration::from_mins(5),
        );
        let kept: Vec<&str> = placement.avoid.keys().map(String::as_str).collect();
        assert_eq!(
            kept,
            ["node-a", "node-b"],
            "expired and unreadable entries are dropped"
        );
    }

    #[test]
    fn placement_annotation_is_compact_and_tolerant() {
        let placement = PodPlacement {
            node: "node-a".into(),
            placed_at: "2026-11-22T10:00:00Z".into(),
            avoid: BTreeMap::new(),
        };
        assert_eq!(
            placement.to_annotation(),
            r#"{"node":"node-a","placedAt":"2026-11-22T10:00:00Z"}"#
        );
        let pod = Pod {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    POD_PLACEMENT_ANNOTATION.to_owned(),
                    "not json".to_owned(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(PodPlacement::of(&pod), None);
    }
}
