//! The writes the controller makes, as data: JSON merge patches that carry the resourceVersion
//! they were computed from (so a concurrent change makes them fail with 409 Conflict instead of
//! overwriting it), and the plan that undoes a placement written only in part. No IO.
//!
//! Objects in the controller's caches are trimmed, so it never replaces whole objects; a merge
//! patch touches only the fields it names.
//!
//! Writing one claim is two steps, as kube-scheduler does it: first the finalizer (and the
//! controller's mark) in a metadata update, then `status.allocation`. Undoing reverses them.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};
use serde_json::{Value, json};

use crate::protocol::{
    CLAIM_FINALIZER, CLAIM_MARK_ANNOTATION, ClaimMark, POD_PLACEMENT_ANNOTATION, PodPlacement,
};

fn resource_version(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Value {
    meta.resource_version
        .clone()
        .map(Value::String)
        .unwrap_or(Value::Null)
}

fn has_finalizer(claim: &ResourceClaim) -> bool {
    claim
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == CLAIM_FINALIZER)
}

/// The mark to write on `claim` for a placement of `pod` on `node`; `finalizer_added` remembers a
/// finalizer the controller added in an earlier attempt for the same pod.
pub fn mark_for(claim: &ResourceClaim, pod: &Pod, node: &str) -> ClaimMark {
    let earlier = ClaimMark::of(claim)
        .filter(|m| m.is_for(pod))
        .is_some_and(|m| m.finalizer_added);
    ClaimMark {
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        node: node.to_owned(),
        finalizer_added: !has_finalizer(claim) || earlier,
    }
}

/// Whether `claim` already carries exactly this mark and the finalizer (no metadata write needed).
pub fn is_marked(claim: &ResourceClaim, mark: &ClaimMark) -> bool {
    has_finalizer(claim) && ClaimMark::of(claim).as_ref() == Some(mark)
}

/// Metadata patch: the finalizer and the mark.
pub fn mark_patch(claim: &ResourceClaim, mark: &ClaimMark) -> Value {
    let mut finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
    if !finalizers.iter().any(|f| f == CLAIM_FINALIZER) {
        finalizers.push(CLAIM_FINALIZER.to_owned());
    }
    json!({
        "metadata": {
            "resourceVersion": resource_version(&claim.metadata),
            "finalizers": finalizers,
            "annotations": { CLAIM_MARK_ANNOTATION: mark.to_annotation() },
        }
    })
}

/// Metadata patch undoing [`mark_patch`]: the mark goes, the finalizer too if the controller
/// added it.
pub fn unmark_patch(claim: &ResourceClaim, remove_finalizer: bool) -> Value {
    let finalizers: Vec<String> = claim
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| !(remove_finalizer && *f == CLAIM_FINALIZER))
        .cloned()
        .collect();
    json!({
        "metadata": {
            "resourceVersion": resource_version(&claim.metadata),
            "finalizers": if finalizers.is_empty() { Value::Null } else { json!(finalizers) },
            "annotations": { CLAIM_MARK_ANNOTATION: null },
        }
    })
}

/// Status patch writing the allocation.
pub fn allocation_patch(claim: &ResourceClaim, allocation: &AllocationResult) -> Value {
    json!({
        "metadata": { "resourceVersion": resource_version(&claim.metadata) },
        "status": { "allocation": allocation },
    })
}

/// Status patch clearing the allocation.
pub fn deallocation_patch(claim: &ResourceClaim) -> Value {
    json!({
        "metadata": { "resourceVersion": resource_version(&claim.metadata) },
        "status": { "allocation": null },
    })
}

/// Pod patch recording the placement (when given) and removing the scheduling gate `gate`
/// (when given).
pub fn pod_patch(pod: &Pod, record: Option<&PodPlacement>, gate: Option<&str>) -> Value {
    let mut patch = json!({
        "metadata": { "resourceVersion": resource_version(&pod.metadata) }
    });
    if let Some(record) = record {
        patch["metadata"]["annotations"] =
            json!({ POD_PLACEMENT_ANNOTATION: record.to_annotation() });
    }
    if let Some(gate) = gate {
        let remaining: Vec<Value> = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .into_iter()
            .flatten()
            .filter(|g| g.name != gate)
            .map(|g| json!({ "name": g.name }))
            .collect();
        patch["spec"] = json!({
            "schedulingGates": if remaining.is_empty() { Value::Null } else { Value::Array(remaining) }
        });
    }
    patch
}

/// How far writing one claim got; `claim` is the newest version the server returned.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimProgress {
    pub claim: Arc<ResourceClaim>,
    /// The mark (and finalizer) were written.
    pub marked: bool,
    /// The finalizer was added by this controller.
    pub finalizer_added: bool,
    /// The allocation was written.
    pub allocated: bool,
}

impl ClaimProgress {
    /// A claim the controller allocated earlier (it carries the controller's mark).
    pub fn of_own(claim: Arc<ResourceClaim>) -> ClaimProgress {
        let mark = ClaimMark::of(&claim);
        ClaimProgress {
            marked: mark.is_some(),
            finalizer_added: mark.is_some_and(|m| m.finalizer_added),
            allocated: crate::claims::allocation(&claim).is_some(),
            claim,
        }
    }
}

/// One step of undoing.
#[derive(Clone, Debug, PartialEq)]
pub enum UndoStep {
    /// Clear `status.allocation`.
    Deallocate(Arc<ResourceClaim>),
    /// Remove the mark, and the finalizer if the controller added it.
    Unmark {
        claim: Arc<ResourceClaim>,
        remove_finalizer: bool,
    },
}

impl UndoStep {
    pub fn claim(&self) -> &Arc<ResourceClaim> {
        match self {
            UndoStep::Deallocate(c) | UndoStep::Unmark { claim: c, .. } => c,
        }
    }
}

/// The steps that return the claims in `progress` to how they were, last written first. Per
/// claim the allocation goes before the finalizer (the finalizer protects an allocated claim).
pub fn undo_plan(progress: &[ClaimProgress]) -> Vec<UndoStep> {
    let mut steps = Vec::new();
    for p in progress.iter().rev() {
        if p.allocated {
            steps.push(UndoStep::Deallocate(p.claim.clone()));
        }
        if p.marked {
            steps.push(UndoStep::Unmark {
                claim: p.claim.clone(),
                remove_finalizer: p.finalizer_added,
            });
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSchedulingGate, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use pretty_assertions::assert_eq;

    use super::*;

    fn claim(name: &str, finalizers: &[&str]) -> Arc<ResourceClaim> {
        Arc::new(ResourceClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some("41".into()),
                finalizers: (!finalizers.is_empty())
                    .then(|| finalizers.iter().map(|f| (*f).to_owned()).collect()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("trainer".into()),
                uid: Some("uid-1".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                scheduling_gates: Some(vec![
                    PodSchedulingGate {
                        name: "other/gate".into(),
                    },
                    PodSchedulingGate {
                        name: "gpu.tessera.dev/topology-aware".into(),
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn undo_reverses_claims_and_steps() {
        let a = claim("a", &[]);
        let b = claim("b", &[]);
        let c = claim("c", &[]);
        let progress = [
            ClaimProgress {
                claim: a.clone(),
                marked: true,
                finalizer_added: true,
                allocated: true,
            },
            ClaimProgress {
                claim: b.clone(),
                marked: true,
                finalizer_added: false,
                allocated: false,
            },
            ClaimProgress {
                claim: c,
                marked: false,
                finalizer_added: false,
                allocated: false,
            },
        ];
        assert_eq!(
            undo_plan(&progress),
            [
                UndoStep::Unmark {
                    claim: b,
                    remove_finalizer: false
                },
                UndoStep::Deallocate(a.clone()),
                UndoStep::Unmark {
                    claim: a,
                    remove_finalizer: true
                },
            ]
        );
    }

    #[test]
    fn a_finalizer_someone_else_added_stays() {
        let owned = claim("a", &["example.com/keep", CLAIM_FINALIZER]);
        let mark = mark_for(&owned, &pod(), "node-1");
        assert!(!mark.finalizer_added, "the finalizer was there before");
        assert_eq!(
            unmark_patch(&owned, mark.finalizer_added)["metadata"]["finalizers"],
            json!(["example.com/keep", CLAIM_FINALIZER])
        );
        let fresh = claim("b", &["example.com/keep"]);
        let mark = mark_for(&fresh, &pod(), "node-1");
        assert!(mark.finalizer_added);
        assert_eq!(
            mark_patch(&fresh, &mark)["metadata"]["finalizers"],
            json!(["example.com/keep", CLAIM_FINALIZER])
        );
        assert_eq!(
            unmark_patch(&claim("c", &[CLAIM_FINALIZER]), true)["metadata"]["finalizers"],
            Value::Null
        );
    }

    #[test]
    fn patches_carry_the_resource_version() {
        let c = claim("a", &[]);
        let allocation = AllocationResult::default();
        for patch in [
            allocation_patch(&c, &allocation),
            deallocation_patch(&c),
            unmark_patch(&c, true),
            mark_patch(&c, &mark_for(&c, &pod(), "n")),
        ] {
            assert_eq!(patch["metadata"]["resourceVersion"], json!("41"), "{patch}");
        }
        assert_eq!(
            deallocation_patch(&c)["status"],
            json!({"allocation": null})
        );
    }

    #[test]
    fn releasing_the_pod_keeps_other_gates() {
        let record = PodPlacement {
            node: "node-1".into(),
            ..Default::default()
        };
        let patch = pod_patch(
            &pod(),
            Some(&record),
            Some("gpu.tessera.dev/topology-aware"),
        );
        assert_eq!(
            patch,
            json!({
                "metadata": {
                    "resourceVersion": "7",
                    "annotations": { POD_PLACEMENT_ANNOTATION: "{\"node\":\"node-1\"}" }
                },
                "spec": { "schedulingGates": [{ "name": "other/gate" }] }
            })
        );
        let only_record = pod_patch(&pod(), Some(&record), None);
        assert!(only_record.get("spec").is_none());
        let only_gate = pod_patch(&pod(), None, Some("other/gate"));
        assert!(only_gate["metadata"].get("annotations").is_none());
        assert_eq!(
            only_gate["spec"],
            json!({ "schedulingGates": [{ "name": "gpu.tessera.dev/topology-aware" }] })
        );
    }
}
