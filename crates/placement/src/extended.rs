//! Extended resources backed by DRA (Kubernetes 1.34+, GA in 1.37): a DeviceClass stands for the
//! extended resource named in its `extendedResourceName`, and every class for its implicit name
//! `deviceclass.resource.kubernetes.io/<class>`. kube-scheduler allocates such a resource itself
//! and creates the claim for it while binding the pod; the controller cannot place it
//! (docs/user-guide.md, "Topology-aware placement needs a claim", says why), so it leaves a pod
//! that asks for one to the scheduler.
//!
//! The mapping follows the scheduler's (`k8s.io/dynamic-resource-allocation`'s extended-resource
//! cache): when several classes carry one name, the newest wins, ties going to the lower name.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};

/// The prefix of every class's implicit extended-resource name.
pub const DEVICE_CLASS_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// The annotation (value `"true"`) kube-scheduler puts on the claim it makes for a pod's extended
/// resources; the pod is the claim's controlling owner.
pub const EXTENDED_RESOURCE_CLAIM_ANNOTATION: &str =
    "resource.kubernetes.io/extended-resource-claim";

/// Which DeviceClass each extended-resource name stands for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtendedResources {
    by_name: BTreeMap<String, String>,
}

impl ExtendedResources {
    pub fn new(classes: &[DeviceClass]) -> ExtendedResources {
        let mut by_name = BTreeMap::new();
        // (creation time, name) of the class holding each explicit name.
        let mut holder: BTreeMap<&str, (i128, &str)> = BTreeMap::new();
        for class in classes {
            let Some(name) = class.metadata.name.as_deref() else {
                continue;
            };
            by_name.insert(format!("{DEVICE_CLASS_PREFIX}{name}"), name.to_owned());
            let Some(resource) = class
                .spec
                .as_ref()
                .and_then(|s| s.extended_resource_name.as_deref())
            else {
                continue;
            };
            let created = class
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_nanosecond())
                .unwrap_or_default();
            let wins = match holder.get(resource) {
                None => true,
                Some((time, held)) => created > *time || (created == *time && name < *held),
            };
            if wins {
                holder.insert(resource, (created, name));
                by_name.insert(resource.to_owned(), name.to_owned());
            }
        }
        ExtendedResources { by_name }
    }

    /// The class `resource` stands for.
    pub fn class_of(&self, resource: &str) -> Option<&str> {
        self.by_name.get(resource).map(String::as_str)
    }

    /// The extended resources backed by a class that `pod` asks for (a non-zero request or
    /// limit of any container), each with its class, sorted by name.
    pub fn requested_by(&self, pod: &Pod) -> Vec<(String, String)> {
        let mut found = BTreeMap::new();
        let containers = pod.spec.iter().flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        });
        for resources in containers.flat_map(|c| c.resources.iter()) {
            let named = resources
                .requests
                .iter()
                .flatten()
                .chain(resources.limits.iter().flatten());
            for (resource, quantity) in named {
                if is_zero(&quantity.0) {
                    continue;
                }
                if let Some(class) = self.class_of(resource) {
                    found.insert(resource.clone(), class.to_owned());
                }
            }
        }
        found.into_iter().collect()
    }
}

/// Whether the quantity's number is zero (`0`, `0.0`, `0m`, `+0Gi`).
fn is_zero(quantity: &str) -> bool {
    let number: String = quantity
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | '+' | '-'))
        .collect();
    number.chars().any(|c| c.is_ascii_digit())
        && number.chars().all(|c| !c.is_ascii_digit() || c == '0')
}

/// Whether `claim` is one kube-scheduler made for a pod's extended resources.
pub fn is_extended_resource_claim(claim: &ResourceClaim) -> bool {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// The pod that owns (controls) `claim`, by name, when the claim is one kube-scheduler made for
/// that pod's extended resources.
pub fn extended_resource_claim_owner(claim: &ResourceClaim) -> Option<&str> {
    if !is_extended_resource_claim(claim) {
        return None;
    }
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Pod" && o.controller == Some(true))
        .map(|o| o.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str, resource: Option<&str>, created: &str) -> DeviceClass {
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"extendedResourceName": resource}
        }))
        .unwrap()
    }

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p"}, "spec": {"containers": containers}}),
        )
        .unwrap()
    }

    #[test]
    fn explicit_and_implicit_names_map_to_their_class_the_newest_winning() {
        let classes = [
            class(
                "gpu.tessera.dev",
                Some("nvidia.com/gpu"),
                "2026-01-01T00:00:00Z",
            ),
            class("mig.gpu.tessera.dev", None, "2026-01-01T00:00:00Z"),
            // Newer: takes nvidia.com/gpu over, as kube-scheduler's cache does during a migration.
            class("new-gpu", Some("nvidia.com/gpu"), "2026-02-01T00:00:00Z"),
            // Older and equal-time with a higher name: loses.
            class("old-gpu", Some("nvidia.com/gpu"), "2025-01-01T00:00:00Z"),
            class("b", Some("example.com/x"), "2026-01-01T00:00:00Z"),
            class("a", Some("example.com/x"), "2026-01-01T00:00:00Z"),
        ];
        let map = ExtendedResources::new(&classes);
        assert_eq!(map.class_of("nvidia.com/gpu"), Some("new-gpu"));
        assert_eq!(map.class_of("example.com/x"), Some("a"));
        assert_eq!(
            map.class_of("deviceclass.resource.kubernetes.io/mig.gpu.tessera.dev"),
            Some("mig.gpu.tessera.dev")
        );
        assert_eq!(
            map.class_of("deviceclass.resource.kubernetes.io/old-gpu"),
            Some("old-gpu")
        );
        assert_eq!(map.class_of("nvidia.com/mig-1g.10gb"), None);
    }

    #[test]
    fn a_pod_asks_for_the_mapped_names_it_requests_or_limits_above_zero() {
        let map = ExtendedResources::new(&[
            class(
                "gpu.tessera.dev",
                Some("nvidia.com/gpu"),
                "2026-01-01T00:00:00Z",
            ),
            class(
                "mig-1g.10gb.gpu.tessera.dev",
                Some("nvidia.com/mig-1g.10gb"),
                "2026-01-01T00:00:00Z",
            ),
        ]);
        let asking = pod(json!([
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}},
            {"name": "b", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1", "example.com/fpga": "1"}}},
            {"name": "c", "resources": {"limits": {"deviceclass.resource.kubernetes.io/gpu.tessera.dev": "1"}}}
        ]));
        assert_eq!(
            map.requested_by(&asking),
            [
                (
                    "deviceclass.resource.kubernetes.io/gpu.tessera.dev".to_owned(),
                    "gpu.tessera.dev".to_owned()
                ),
                ("nvidia.com/gpu".to_owned(), "gpu.tessera.dev".to_owned()),
                (
                    "nvidia.com/mig-1g.10gb".to_owned(),
                    "mig-1g.10gb.gpu.tessera.dev".to_owned()
                ),
            ]
        );
        let zero = pod(
            json!([{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "0", "memory": "1Gi"}}}]),
        );
        assert!(map.requested_by(&zero).is_empty());
        // Nothing maps the names when the chart's extendedResources are off.
        assert!(
            ExtendedResources::default()
                .requested_by(&asking)
                .is_empty()
        );
    }

    #[test]
    fn zero_quantities() {
        for zero in ["0", "0.0", "0m", "+0Gi", " 0 "] {
            assert!(is_zero(zero), "{zero}");
        }
        for nonzero in ["1", "0.5", "10m", "2Gi", "1e3", ""] {
            assert!(!is_zero(nonzero), "{nonzero}");
        }
    }

    #[test]
    fn the_schedulers_claim_is_recognised_with_its_pod() {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {
                "name": "p-extended-resources-x1", "namespace": "ns",
                "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": true}]
            },
            "spec": {}
        }))
        .unwrap();
        assert!(is_extended_resource_claim(&claim));
        assert_eq!(extended_resource_claim_owner(&claim), Some("p"));
        let mut plain = claim.clone();
        plain.metadata.annotations = None;
        assert!(!is_extended_resource_claim(&plain));
        assert_eq!(extended_resource_claim_owner(&plain), None);
    }
}
