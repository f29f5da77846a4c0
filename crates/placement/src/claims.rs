//! How the controller sees a pod's claims: allocated or not, by whom, and the copy of a claim the
//! allocator is given (its requests tolerate the topology-managed taint, so the allocator may pick
//! managed devices and the results record the toleration, as docs/protocol.md describes).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceToleration, ResourceClaim};
use tessera_api::names::TOPOLOGY_MANAGED_TAINT;

use crate::protocol::ClaimMark;
use crate::resolve::PodClaim;

/// The allocation of a claim, if it has one.
pub fn allocation(claim: &ResourceClaim) -> Option<&AllocationResult> {
    claim.status.as_ref().and_then(|s| s.allocation.as_ref())
}

/// Whether any consumer has reserved the claim.
pub fn is_reserved(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .is_some_and(|r| !r.is_empty())
}

/// A pod's claims, sorted by what the controller may do with them.
#[derive(Clone, Debug, Default)]
pub struct PodClaims {
    /// Not allocated: to allocate.
    pub pending: Vec<Arc<ResourceClaim>>,
    /// Allocated by the controller for this pod and not reserved by anyone: the controller may
    /// undo these to place the pod's claims together again.
    pub own: Vec<Arc<ResourceClaim>>,
    /// Allocated otherwise (by the scheduler, for another pod, or already reserved): fixed.
    pub fixed: Vec<Arc<ResourceClaim>>,
    /// Nodes of allocations the controller made for this pod that someone else cleared since
    /// (the scheduler's PostFilter gives back an allocation when the pod does not fit).
    pub given_back: Vec<String>,
}

impl PodClaims {
    pub fn sort(pod: &Pod, claims: &[PodClaim]) -> PodClaims {
        let mut sorted = PodClaims::default();
        for c in claims {
            let mark = ClaimMark::of(&c.claim).filter(|m| m.is_for(pod));
            match (allocation(&c.claim), mark) {
                (None, Some(mark)) => {
                    sorted.given_back.push(mark.node);
                    sorted.pending.push(c.claim.clone());
                }
                (None, None) => sorted.pending.push(c.claim.clone()),
                (Some(_), Some(_)) if !is_reserved(&c.claim) => sorted.own.push(c.claim.clone()),
                (Some(_), _) => sorted.fixed.push(c.claim.clone()),
            }
        }
        sorted.given_back.sort();
        sorted.given_back.dedup();
        sorted
    }
}

/// The toleration the controller adds to every request it allocates.
pub fn managed_toleration() -> DeviceToleration {
    DeviceToleration {
        key: Some(TOPOLOGY_MANAGED_TAINT.to_owned()),
        operator: Some("Exists".to_owned()),
        effect: Some("NoSchedule".to_owned()),
        value: None,
        toleration_seconds: None,
    }
}

fn tolerates_managed_taint(tolerations: &[DeviceToleration]) -> bool {
    tolerations.iter().any(|t| {
        let key = t.key.as_deref().unwrap_or_default();
        let effect = t.effect.as_deref().unwrap_or_default();
        (key.is_empty() || key == TOPOLOGY_MANAGED_TAINT)
            && (effect.is_empty() || effect == "NoSchedule")
            && t.operator.as_deref() == Some("Exists")
    })
}

fn add_toleration(tolerations: &mut Option<Vec<DeviceToleration>>) {
    let list = tolerations.get_or_insert_with(Vec::new);
    if !tolerates_managed_taint(list) {
        list.push(managed_toleration());
    }
}

/// `claim` with every request and subrequest tolerating the topology-managed taint.
pub fn tolerating_managed_taint(claim: &ResourceClaim) -> ResourceClaim {
    let mut claim = claim.clone();
    let requests = claim
        .spec
        .as_mut()
        .and_then(|s| s.devices.as_mut())
        .and_then(|d| d.requests.as_mut());
    for request in requests.into_iter().flatten() {
        if let Some(exactly) = request.exactly.as_mut() {
            add_toleration(&mut exactly.tolerations);
        }
        for sub in request.first_available.iter_mut().flatten() {
            add_toleration(&mut sub.tolerations);
        }
    }
    claim
}

/// The device classes one request may be satisfied from: its class, or one per subrequest.
pub fn request_classes(claim: &ResourceClaim) -> Vec<(String, Vec<String>)> {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .map(|r| {
            let classes = match (&r.exactly, &r.first_available) {
                (Some(e), _) => vec![e.device_class_name.clone()],
                (None, Some(subs)) => subs.iter().map(|s| s.device_class_name.clone()).collect(),
                (None, None) => Vec::new(),
            };
            (r.name.clone(), classes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{
        DeviceAllocationResult, DeviceClaim, DeviceRequest, DeviceSubRequest, ExactDeviceRequest,
        ResourceClaimConsumerReference, ResourceClaimSpec, ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::protocol::CLAIM_MARK_ANNOTATION;

    fn claim(name: &str, allocated: bool, mark_for: Option<&str>, reserved: bool) -> PodClaim {
        let annotations = mark_for.map(|uid| {
            [(
                CLAIM_MARK_ANNOTATION.to_owned(),
                ClaimMark {
                    pod_uid: uid.into(),
                    pod: "p".into(),
                    node: format!("node-of-{name}"),
                    finalizer_added: true,
                }
                .to_annotation(),
            )]
            .into()
        });
        PodClaim {
            pod_claim: name.into(),
            claim: Arc::new(ResourceClaim {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    annotations,
                    ..Default::default()
                },
                spec: None,
                status: Some(ResourceClaimStatus {
                    allocation: allocated.then(|| AllocationResult {
                        devices: Some(DeviceAllocationResult::default()),
                        ..Default::default()
                    }),
                    reserved_for: reserved.then(|| {
                        vec![ResourceClaimConsumerReference {
                            resource: "pods".into(),
                            name: "other".into(),
                            uid: "other-uid".into(),
                            ..Default::default()
                        }]
                    }),
                    ..Default::default()
                }),
            }),
        }
    }

    fn names(claims: &[Arc<ResourceClaim>]) -> Vec<&str> {
        claims
            .iter()
            .map(|c| c.metadata.name.as_deref().unwrap())
            .collect()
    }

    #[test]
    fn claims_sort_by_who_allocated_them() {
        let pod = Pod {
            metadata: ObjectMeta {
                uid: Some("me".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let claims = [
            claim("new", false, None, false),
            claim("mine", true, Some("me"), false),
            claim("mine-reserved", true, Some("me"), true),
            claim("other-pods", true, Some("someone"), false),
            claim("scheduler", true, None, false),
            claim("given-back", false, Some("me"), false),
        ];
        let sorted = PodClaims::sort(&pod, &claims);
        assert_eq!(names(&sorted.pending), ["new", "given-back"]);
        assert_eq!(names(&sorted.own), ["mine"]);
        assert_eq!(
            names(&sorted.fixed),
            ["mine-reserved", "other-pods", "scheduler"]
        );
        assert_eq!(sorted.given_back, ["node-of-given-back"]);
    }

    #[test]
    fn every_request_tolerates_the_managed_taint_once() {
        let c = ResourceClaim {
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![
                        DeviceRequest {
                            name: "a".into(),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: "gpu.tessera.dev".into(),
                                tolerations: Some(vec![managed_toleration()]),
                                ..Default::default()
                            }),
                            first_available: None,
                        },
                        DeviceRequest {
                            name: "b".into(),
                            exactly: None,
                            first_available: Some(vec![
                                DeviceSubRequest {
                                    name: "big".into(),
                                    device_class_name: "gpu.tessera.dev".into(),
                                    ..Default::default()
                                },
                                DeviceSubRequest {
                                    name: "small".into(),
                                    device_class_name: "mig.gpu.tessera.dev".into(),
                                    ..Default::default()
                                },
                            ]),
                        },
                    ]),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let tolerant = tolerating_managed_taint(&c);
        let requests = tolerant.spec.unwrap().devices.unwrap().requests.unwrap();
        assert_eq!(
            requests[0].exactly.as_ref().unwrap().tolerations,
            Some(vec![managed_toleration()]),
            "an existing toleration is not repeated"
        );
        for sub in requests[1].first_available.as_ref().unwrap() {
            assert_eq!(sub.tolerations, Some(vec![managed_toleration()]));
        }
        assert_eq!(
            request_classes(&c),
            [
                ("a".to_owned(), vec!["gpu.tessera.dev".to_owned()]),
                (
                    "b".to_owned(),
                    vec![
                        "gpu.tessera.dev".to_owned(),
                        "mig.gpu.tessera.dev".to_owned()
                    ]
                )
            ]
        );
    }
}
