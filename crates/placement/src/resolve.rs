//! Which ResourceClaims a pod uses: claims it names directly, and claims the
//! kube-controller-manager generated from its templates (named in `status.resourceClaimStatuses`).
//! The ResourceClaim controller creates those even while the pod is gated; until it has, the pod
//! waits.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodResourceClaimStatus};
use k8s_openapi::api::resource::v1::ResourceClaim;

/// One claim of a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodClaim {
    /// The entry's name in `spec.resourceClaims`.
    pub pod_claim: String,
    /// The ResourceClaim (same namespace as the pod).
    pub claim: Arc<ResourceClaim>,
}

/// What resolving a pod's claims found.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    /// Every claim the pod needs, each once, in `spec.resourceClaims` order.
    Resolved(Vec<PodClaim>),
    /// A claim does not exist (yet) or is being replaced; try again when claims change.
    Waiting(String),
    /// The pod spec cannot be satisfied as written.
    Invalid(String),
    /// A claim's ResourceClaimTemplate `template` does not exist (why): the pod cannot be
    /// satisfied as written, unless the template is one the controller creates (a pod converted
    /// from the device plugin, docs/admission.md).
    MissingTemplate { template: String, message: String },
}

/// Resolves the claims of `pod`. `claim` looks a claim up by name in the pod's namespace;
/// `template_exists` says whether a ResourceClaimTemplate of that name exists there.
pub fn resolve_claims(
    pod: &Pod,
    claim: impl Fn(&str) -> Option<Arc<ResourceClaim>>,
    template_exists: impl Fn(&str) -> bool,
) -> Resolution {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_deref())
        .unwrap_or_default();
    let mut resolved: Vec<PodClaim> = Vec::new();
    for entry in pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_deref())
        .unwrap_or_default()
    {
        let name = match claim_name(entry, statuses, pod_name, &template_exists) {
            Ok(Some(name)) => name,
            // The ResourceClaim controller decided no claim is needed.
            Ok(None) => continue,
            Err(unresolved) => return unresolved,
        };
        let found = match usable_claim(entry, &name, claim(&name), pod_name, pod_uid) {
            Ok(found) => found,
            Err(unresolved) => return unresolved,
        };
        if !resolved
            .iter()
            .any(|p| p.claim.metadata.name.as_deref() == Some(name.as_str()))
        {
            resolved.push(PodClaim {
                pod_claim: entry.name.clone(),
                claim: found,
            });
        }
    }
    Resolution::Resolved(resolved)
}

/// The name of the ResourceClaim behind one `spec.resourceClaims` entry: the one it names, or
/// the one generated from its template (`None` when the ResourceClaim controller decided no
/// claim is needed); `Err` when the pod must wait or is invalid.
fn claim_name(
    entry: &PodResourceClaim,
    statuses: &[PodResourceClaimStatus],
    pod_name: &str,
    template_exists: impl Fn(&str) -> bool,
) -> Result<Option<String>, Resolution> {
    match (
        &entry.resource_claim_name,
        &entry.resource_claim_template_name,
    ) {
        (Some(claim_name), None) => Ok(Some(claim_name.clone())),
        (None, Some(template)) => {
            let Some(status) = statuses.iter().find(|s| s.name == entry.name) else {
                if !template_exists(template) {
                    return Err(Resolution::MissingTemplate {
                        template: template.clone(),
                        message: format!(
                            "pod {pod_name}: resource claim {}: ResourceClaimTemplate {template} does not exist; \
                             create it or fix resourceClaimTemplateName",
                            entry.name
                        ),
                    });
                }
                return Err(Resolution::Waiting(format!(
                    "pod {pod_name}: resource claim {}: the claim from template {template} has not been \
                     generated yet (the kube-controller-manager's ResourceClaim controller creates it)",
                    entry.name
                )));
            };
            Ok(status.resource_claim_name.clone())
        }
        _ => Err(Resolution::Invalid(format!(
            "pod {pod_name}: resource claim {} must set exactly one of resourceClaimName and \
             resourceClaimTemplateName",
            entry.name
        ))),
    }
}

/// The claim `name` found for `entry`, if the pod can use it now: it exists, a generated one
/// belongs to this pod, and it is not being deleted; otherwise why the pod waits.
fn usable_claim(
    entry: &PodResourceClaim,
    name: &str,
    found: Option<Arc<ResourceClaim>>,
    pod_name: &str,
    pod_uid: &str,
) -> Result<Arc<ResourceClaim>, Resolution> {
    let Some(found) = found else {
        return Err(Resolution::Waiting(format!(
            "pod {pod_name}: resource claim {}: ResourceClaim {name} does not exist yet",
            entry.name
        )));
    };
    if entry.resource_claim_template_name.is_some() && !owned_by(&found, pod_uid) {
        return Err(Resolution::Waiting(format!(
            "pod {pod_name}: resource claim {}: ResourceClaim {name} belongs to another pod; \
             waiting for the ResourceClaim controller to replace it",
            entry.name
        )));
    }
    if found.metadata.deletion_timestamp.is_some() {
        return Err(Resolution::Waiting(format!(
            "pod {pod_name}: resource claim {}: ResourceClaim {name} is being deleted",
            entry.name
        )));
    }
    Ok(found)
}

/// `resourceclaim.IsForPod`: a generated claim is controlled by its pod.
fn owned_by(claim: &ResourceClaim, pod_uid: &str) -> bool {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == pod_uid && o.controller == Some(true))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use k8s_openapi::api::core::v1::{
        PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn pod(claims: Vec<PodResourceClaim>, statuses: Vec<(&str, Option<&str>)>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("trainer".into()),
                namespace: Some("ml".into()),
                uid: Some("pod-uid".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                resource_claims: Some(claims),
                ..Default::default()
            }),
            status: Some(PodStatus {
                resource_claim_statuses: Some(
                    statuses
                        .into_iter()
                        .map(|(name, claim)| PodResourceClaimStatus {
                            name: name.into(),
                            resource_claim_name: claim.map(Into::into),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }
    }

    fn direct(name: &str, claim: &str) -> PodResourceClaim {
        PodResourceClaim {
            name: name.into(),
            resource_claim_name: Some(claim.into()),
            resource_claim_template_name: None,
        }
    }

    fn templated(name: &str, template: &str) -> PodResourceClaim {
        PodResourceClaim {
            name: name.into(),
            resource_claim_name: None,
            resource_claim_template_name: Some(template.into()),
        }
    }

    fn claim(name: &str, owner: Option<&str>) -> Arc<ResourceClaim> {
        Arc::new(ResourceClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ml".into()),
                owner_references: owner.map(|uid| {
                    vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Pod".into(),
                        name: "trainer".into(),
                        uid: uid.into(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                    }]
                }),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn run(pod: &Pod, claims: &[Arc<ResourceClaim>]) -> Resolution {
        let by_name: HashMap<String, Arc<ResourceClaim>> = claims
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap(), c.clone()))
            .collect();
        resolve_claims(pod, |n| by_name.get(n).cloned(), |t| t == "gpus-4")
    }

    fn names(resolution: &Resolution) -> Vec<(String, String)> {
        let Resolution::Resolved(claims) = resolution else {
            panic!("expected resolved claims, got {resolution:?}");
        };
        claims
            .iter()
            .map(|c| {
                (
                    c.pod_claim.clone(),
                    c.claim.metadata.name.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    #[test]
    fn direct_and_generated_claims_resolve_in_spec_order() {
        let p = pod(
            vec![templated("gpus", "gpus-4"), direct("shared", "team-gpus")],
            vec![("gpus", Some("trainer-gpus-x7k2p"))],
        );
        let claims = [
            claim("trainer-gpus-x7k2p", Some("pod-uid")),
            claim("team-gpus", None),
        ];
        assert_eq!(
            names(&run(&p, &claims)),
            [
                ("gpus".to_owned(), "trainer-gpus-x7k2p".to_owned()),
                ("shared".to_owned(), "team-gpus".to_owned())
            ]
        );
    }

    #[test]
    fn waits_until_the_claim_from_a_template_is_generated() {
        let p = pod(vec![templated("gpus", "gpus-4")], vec![]);
        let Resolution::Waiting(why) = run(&p, &[]) else {
            panic!("expected to wait");
        };
        assert!(why.contains("has not been generated yet"), "{why}");
        // Named in the status, not yet in the informer.
        let p = pod(
            vec![templated("gpus", "gpus-4")],
            vec![("gpus", Some("trainer-gpus-x7k2p"))],
        );
        let Resolution::Waiting(why) = run(&p, &[]) else {
            panic!("expected to wait");
        };
        assert!(why.contains("does not exist yet"), "{why}");
    }

    #[test]
    fn a_generated_claim_of_another_pod_is_not_used() {
        let p = pod(
            vec![templated("gpus", "gpus-4")],
            vec![("gpus", Some("trainer-gpus-x7k2p"))],
        );
        let Resolution::Waiting(why) = run(&p, &[claim("trainer-gpus-x7k2p", Some("old-uid"))])
        else {
            panic!("expected to wait");
        };
        assert!(why.contains("belongs to another pod"), "{why}");
    }

    #[test]
    fn a_claim_not_needed_is_skipped_and_duplicates_count_once() {
        let p = pod(
            vec![
                templated("optional", "gpus-4"),
                direct("a", "team-gpus"),
                direct("b", "team-gpus"),
            ],
            vec![("optional", None)],
        );
        assert_eq!(
            names(&run(&p, &[claim("team-gpus", None)])),
            [("a".to_owned(), "team-gpus".to_owned())]
        );
    }

    #[test]
    fn a_missing_template_is_named_and_a_malformed_entry_is_invalid() {
        let p = pod(vec![templated("gpus", "no-such-template")], vec![]);
        let Resolution::MissingTemplate {
            template,
            message: why,
        } = run(&p, &[])
        else {
            panic!("expected a missing template");
        };
        assert_eq!(template, "no-such-template");
        assert!(
            why.contains("ResourceClaimTemplate no-such-template does not exist"),
            "{why}"
        );
        let both = PodResourceClaim {
            name: "x".into(),
            resource_claim_name: Some("a".into()),
            resource_claim_template_name: Some("b".into()),
        };
        assert!(matches!(
            run(&pod(vec![both], vec![]), &[]),
            Resolution::Invalid(_)
        ));
    }

    #[test]
    fn a_claim_being_deleted_is_waited_for() {
        let mut deleting = (*claim("team-gpus", None)).clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let p = pod(vec![direct("a", "team-gpus")], vec![]);
        assert!(matches!(
            run(&p, &[Arc::new(deleting)]),
            Resolution::Waiting(_)
        ));
    }
}
