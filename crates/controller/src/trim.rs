//! What the controller's caches keep of each object: only the fields decisions read, so that a
//! large cluster's pods and nodes fit in little memory. Applied to every watched object before it
//! is stored. The controller never writes a cached object back whole (see `tessera_placement::writes`), so
//! nothing dropped here can be lost on the server.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, Node, NodeSpec, NodeStatus, Pod, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_api::names::{
    DEVICE_PLUGIN_CONVERSION_ANNOTATION, GROUP_MIN_COUNT_ANNOTATION, NOMINATION_ANNOTATION,
    PREEMPTED_BY_ANNOTATION,
};

use tessera_placement::protocol::{
    CLAIM_MARK_ANNOTATION, PLACEMENT_CONDITION, POD_PLACEMENT_ANNOTATION,
};

fn keep_annotation(meta: &mut ObjectMeta, name: &str) {
    meta.annotations = meta.annotations.take().and_then(|mut a| {
        a.remove(name)
            .map(|v| BTreeMap::from([(name.to_owned(), v)]))
    });
}

fn identity(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        deletion_timestamp: meta.deletion_timestamp.clone(),
        ..Default::default()
    }
}

fn requests_only(c: &Container) -> Container {
    Container {
        name: c.name.clone(),
        restart_policy: c.restart_policy.clone(),
        resources: c.resources.as_ref().map(|r| ResourceRequirements {
            requests: r.requests.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A pod: identity, the controller's annotation, scheduling inputs, container requests, claims,
/// phase and the controller's condition.
pub fn pod(pod: &mut Pod) {
    let mut meta = identity(&pod.metadata);
    // Group membership and arrival order (crates/placement/src/group), and every label: the
    // PodDisruptionBudgets that preemption honours select pods by them.
    meta.creation_timestamp = pod.metadata.creation_timestamp.take();
    meta.labels = pod.metadata.labels.take();
    let mut annotations = pod.metadata.annotations.take().unwrap_or_default();
    // The conversion's record (which templates the controller creates for the pod) and the
    // preemption marks (a nomination, a victim's preemptor).
    let kept: BTreeMap<String, String> = [
        POD_PLACEMENT_ANNOTATION,
        GROUP_MIN_COUNT_ANNOTATION,
        DEVICE_PLUGIN_CONVERSION_ANNOTATION,
        NOMINATION_ANNOTATION,
        PREEMPTED_BY_ANNOTATION,
    ]
    .into_iter()
    .filter_map(|name| annotations.remove_entry(name))
    .collect();
    meta.annotations = (!kept.is_empty()).then_some(kept);
    let spec = pod.spec.take().map(|s| PodSpec {
        node_name: s.node_name,
        scheduling_gates: s.scheduling_gates,
        scheduling_group: s.scheduling_group,
        resource_claims: s.resource_claims,
        node_selector: s.node_selector,
        affinity: s.affinity.and_then(|a| {
            a.node_affinity.map(|n| Affinity {
                node_affinity: Some(n),
                ..Default::default()
            })
        }),
        tolerations: s.tolerations,
        containers: s.containers.iter().map(requests_only).collect(),
        init_containers: s
            .init_containers
            .map(|cs| cs.iter().map(requests_only).collect()),
        overhead: s.overhead,
        // Preemption: who may preempt whom, and how long a victim takes to stop.
        priority: s.priority,
        preemption_policy: s.preemption_policy,
        termination_grace_period_seconds: s.termination_grace_period_seconds,
        resources: s.resources.map(|r| ResourceRequirements {
            requests: r.requests,
            ..Default::default()
        }),
        ..Default::default()
    });
    let status = pod.status.take().map(|s| PodStatus {
        phase: s.phase,
        start_time: s.start_time,
        nominated_node_name: s.nominated_node_name,
        resource_claim_statuses: s.resource_claim_statuses,
        conditions: s.conditions.map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == PLACEMENT_CONDITION)
                .collect()
        }),
        ..Default::default()
    });
    *pod = Pod {
        metadata: meta,
        spec,
        status,
    };
}

/// A PodDisruptionBudget: its selector and status (what preemption counts).
pub fn budget(budget: &mut PodDisruptionBudget) {
    budget.metadata.managed_fields = None;
    budget.metadata.annotations = None;
}

/// A claim: everything but managed fields and annotations other than the controller's mark
/// (finalizers and owner references stay: the controller patches finalizers and checks owners).
pub fn claim(claim: &mut ResourceClaim) {
    claim.metadata.managed_fields = None;
    claim.metadata.labels = None;
    keep_annotation(&mut claim.metadata, CLAIM_MARK_ANNOTATION);
}

/// A slice: everything but managed fields, labels and annotations.
pub fn slice(slice: &mut ResourceSlice) {
    slice.metadata.managed_fields = None;
    slice.metadata.labels = None;
    slice.metadata.annotations = None;
    slice.metadata.owner_references = None;
}

/// A class: everything but managed fields, labels and annotations.
pub fn class(class: &mut DeviceClass) {
    class.metadata.managed_fields = None;
    class.metadata.labels = None;
    class.metadata.annotations = None;
}

/// A node: name, labels, taints, cordon, allocatable.
pub fn node(node: &mut Node) {
    let mut meta = identity(&node.metadata);
    meta.labels = node.metadata.labels.take();
    let spec = node.spec.take().map(|s| NodeSpec {
        taints: s.taints,
        unschedulable: s.unschedulable,
        ..Default::default()
    });
    let status = node.status.take().map(|s| NodeStatus {
        allocatable: s.allocatable,
        ..Default::default()
    });
    *node = Node {
        metadata: meta,
        spec,
        status,
    };
}

/// A ResourceClaimTemplate: only its identity (templates are only looked up by name).
pub fn template(template: &mut ResourceClaimTemplate) {
    *template = ResourceClaimTemplate {
        metadata: identity(&template.metadata),
        spec: None,
    };
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        EnvVar, NodeAffinity, NodeCondition, NodeSelector, PodCondition, PodSchedulingGate,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;
    use tessera_api::names::GROUP_LABEL;

    /// A pending pod with what placement reads (placement and group annotations, the group label,
    /// scheduling gates, node affinity, requests, conditions) and what it does not.
    fn full_pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                resource_version: Some("9".into()),
                annotations: Some(BTreeMap::from([
                    ("big".to_owned(), "x".repeat(1000)),
                    (POD_PLACEMENT_ANNOTATION.to_owned(), "{}".to_owned()),
                    (GROUP_MIN_COUNT_ANNOTATION.to_owned(), "2".to_owned()),
                    (
                        DEVICE_PLUGIN_CONVERSION_ANNOTATION.to_owned(),
                        "[]".to_owned(),
                    ),
                ])),
                labels: Some(BTreeMap::from([
                    ("app".to_owned(), "x".to_owned()),
                    (GROUP_LABEL.to_owned(), "train".to_owned()),
                ])),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..Default::default()
            },
            spec: Some(PodSpec {
                scheduling_gates: Some(vec![PodSchedulingGate { name: "g".into() }]),
                affinity: Some(Affinity {
                    node_affinity: Some(NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(
                            NodeSelector::default(),
                        ),
                        ..Default::default()
                    }),
                    pod_anti_affinity: Some(Default::default()),
                    ..Default::default()
                }),
                containers: vec![Container {
                    name: "c".into(),
                    image: Some("big/image".into()),
                    env: Some(vec![EnvVar {
                        name: "A".into(),
                        ..Default::default()
                    }]),
                    resources: Some(ResourceRequirements {
                        requests: Some(BTreeMap::from([("cpu".to_owned(), Quantity("1".into()))])),
                        limits: Some(BTreeMap::from([("cpu".to_owned(), Quantity("2".into()))])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                conditions: Some(vec![
                    PodCondition {
                        type_: "PodScheduled".into(),
                        ..Default::default()
                    },
                    PodCondition {
                        type_: PLACEMENT_CONDITION.into(),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_pod_keeps_what_placement_reads() {
        let mut p = full_pod();
        pod(&mut p);
        let meta = &p.metadata;
        assert_eq!(meta.resource_version.as_deref(), Some("9"));
        assert_eq!(
            meta.annotations
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            [
                DEVICE_PLUGIN_CONVERSION_ANNOTATION,
                GROUP_MIN_COUNT_ANNOTATION,
                POD_PLACEMENT_ANNOTATION
            ]
        );
        assert_eq!(
            meta.labels.as_ref().map(BTreeMap::len),
            Some(2),
            "every label is kept: PodDisruptionBudgets select by them"
        );
        assert!(meta.managed_fields.is_none());
        let spec = p.spec.as_ref().unwrap();
        assert!(spec.scheduling_gates.is_some());
        let affinity = spec.affinity.as_ref().unwrap();
        assert!(affinity.node_affinity.is_some() && affinity.pod_anti_affinity.is_none());
        let c = &spec.containers[0];
        assert!(c.image.is_none() && c.env.is_none());
        let resources = c.resources.as_ref().unwrap();
        assert!(resources.requests.is_some() && resources.limits.is_none());
        let conditions = p.status.as_ref().unwrap().conditions.as_ref().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].type_, PLACEMENT_CONDITION);
    }

    #[test]
    fn a_node_keeps_labels_taints_and_allocatable() {
        let mut n = Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: Some(BTreeMap::from([("zone".to_owned(), "a".to_owned())])),
                annotations: Some(BTreeMap::from([("x".to_owned(), "y".to_owned())])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: Some("10.0.0.0/24".into()),
                unschedulable: Some(true),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                allocatable: Some(BTreeMap::from([("cpu".to_owned(), Quantity("8".into()))])),
                conditions: Some(vec![NodeCondition::default()]),
                ..Default::default()
            }),
        };
        node(&mut n);
        assert!(n.metadata.annotations.is_none());
        assert!(n.metadata.labels.is_some());
        let spec = n.spec.unwrap();
        assert_eq!(spec.unschedulable, Some(true));
        assert!(spec.pod_cidr.is_none());
        let status = n.status.unwrap();
        assert!(status.allocatable.is_some() && status.conditions.is_none());
    }

    #[test]
    fn a_claim_keeps_only_the_controllers_annotation() {
        let mut c = ResourceClaim {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([("x".to_owned(), "y".to_owned())])),
                finalizers: Some(vec!["f".into()]),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..Default::default()
            },
            ..Default::default()
        };
        claim(&mut c);
        assert!(c.metadata.annotations.is_none());
        assert!(c.metadata.managed_fields.is_none());
        assert_eq!(c.metadata.finalizers, Some(vec!["f".to_owned()]));
    }
}
