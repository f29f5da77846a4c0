//! Reading pods and their claims: which claim a pod's entry resolved to, what was allocated, for
//! which node, with which config, and what each container asked for.

use anyhow::Context;
use k8s_openapi::api::core::v1::{NodeSelector, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use tessera_api::names::DRIVER_NAME;

/// One allocated device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedDevice {
    /// The request (or `request/subrequest`) it satisfies.
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub admin_access: bool,
    /// `shareID` of a multi-allocatable device's allocation (consumable shares).
    pub share_id: Option<String>,
    /// `consumedCapacity`: capacity name → quantity as the scheduler wrote it.
    pub consumed: std::collections::BTreeMap<String, String>,
}

/// One config entry of an allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatedConfig {
    /// `FromClass` or `FromClaim`.
    pub source: String,
    pub requests: Vec<String>,
    pub driver: String,
    pub parameters: serde_json::Value,
}

/// A claim's allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocationStatus {
    pub devices: Vec<AllocatedDevice>,
    pub config: Vec<AllocatedConfig>,
    /// The node the allocation's node selector names, when it names exactly one.
    pub node: Option<String>,
}

impl AllocationStatus {
    /// The allocation of `claim`, if it is allocated.
    pub fn of(claim: &ResourceClaim) -> Option<Self> {
        let allocation = claim.status.as_ref()?.allocation.as_ref()?;
        let result = allocation.devices.as_ref();
        let devices = result
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
            .map(|r| AllocatedDevice {
                request: r.request.clone(),
                driver: r.driver.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                admin_access: r.admin_access.unwrap_or(false),
                share_id: r.share_id.clone(),
                consumed: r
                    .consumed_capacity
                    .iter()
                    .flatten()
                    .map(|(k, q)| (k.clone(), q.0.clone()))
                    .collect(),
            })
            .collect();
        let config = result
            .and_then(|d| d.config.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| {
                let opaque = c.opaque.as_ref()?;
                Some(AllocatedConfig {
                    source: c.source.clone(),
                    requests: c.requests.clone().unwrap_or_default(),
                    driver: opaque.driver.clone(),
                    parameters: opaque.parameters.0.clone(),
                })
            })
            .collect();
        Some(Self {
            devices,
            config,
            node: allocation.node_selector.as_ref().and_then(single_node),
        })
    }

    /// The devices of Tessera's driver.
    pub fn ours(&self) -> impl Iterator<Item = &AllocatedDevice> {
        self.devices.iter().filter(|d| d.driver == DRIVER_NAME)
    }

    /// `gpu-0, gpu-3` (device names, natural order).
    pub fn device_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.ours().map(|d| d.device.clone()).collect();
        names.sort_by(|a, b| crate::devices::natural_order(a, b));
        names
    }
}

/// The node of a node selector of the form the allocator writes for node-local devices:
/// one term, a `metadata.name In [node]` field (or `kubernetes.io/hostname` label) requirement.
pub fn single_node(selector: &NodeSelector) -> Option<String> {
    let [term] = selector.node_selector_terms.as_slice() else {
        return None;
    };
    let requirements = term
        .match_fields
        .iter()
        .flatten()
        .filter(|r| r.key == "metadata.name")
        .chain(
            term.match_expressions
                .iter()
                .flatten()
                .filter(|r| r.key == "kubernetes.io/hostname"),
        );
    for requirement in requirements {
        if requirement.operator == "In"
            && let Some([node]) = requirement.values.as_deref()
        {
            return Some(node.clone());
        }
    }
    None
}

/// A pod's claim entry and the ResourceClaim it resolved to (none yet for a template whose
/// claim has not been generated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaimEntry {
    /// `spec.resourceClaims[].name`.
    pub entry: String,
    pub claim_name: Option<String>,
}

/// The entry name standing for the claim kube-scheduler makes for a pod's extended resources
/// (`resources.limits: {nvidia.com/gpu: 2}`); not a valid entry name, so it never collides.
pub const EXTENDED_RESOURCES_ENTRY: &str = "<extended-resources>";

/// Whether `name` is an extended resource (`<domain>/<name>` outside `kubernetes.io`): on the
/// test clusters no device plugin runs, so every one a pod asks for is backed by DRA.
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/")
}

/// Whether a container of `pod` asks for an extended resource.
fn asks_for_extended_resources(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .flat_map(|c| c.resources.iter())
        .flat_map(|r| r.limits.iter().flatten().chain(r.requests.iter().flatten()))
        .any(|(name, _)| is_extended_resource(name))
}

/// The claims of `pod`: direct references, generated claims from `status.resourceClaimStatuses`,
/// and the claim for its extended resources ([`EXTENDED_RESOURCES_ENTRY`], named in
/// `status.extendedResourceClaimStatus` once the scheduler made it).
pub fn pod_claims(pod: &Pod) -> Vec<PodClaimEntry> {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    let extended = asks_for_extended_resources(pod).then(|| PodClaimEntry {
        entry: EXTENDED_RESOURCES_ENTRY.to_owned(),
        claim_name: pod
            .status
            .as_ref()
            .and_then(|s| s.extended_resource_claim_status.as_ref())
            .map(|s| s.resource_claim_name.clone()),
    });
    pod.spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .map(|entry| {
            let generated = statuses
                .into_iter()
                .flatten()
                .find(|s| s.name == entry.name)
                .and_then(|s| s.resource_claim_name.clone());
            PodClaimEntry {
                entry: entry.name.clone(),
                claim_name: entry.resource_claim_name.clone().or(generated),
            }
        })
        .chain(extended)
        .collect()
}

/// Which claim entries (and optional request) `container` of `pod` uses: its `resources.claims`,
/// and the requests `status.extendedResourceClaimStatus` maps its extended resources to.
pub fn container_claims(pod: &Pod, container: &str) -> Vec<(String, Option<String>)> {
    let extended = pod
        .status
        .iter()
        .flat_map(|s| s.extended_resource_claim_status.iter())
        .flat_map(|s| s.request_mappings.iter())
        .filter(|m| m.container_name == container)
        .map(|m| {
            (
                EXTENDED_RESOURCES_ENTRY.to_owned(),
                Some(m.request_name.clone()),
            )
        });
    pod.spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .filter(|c| c.name == container)
        .flat_map(|c| c.resources.iter().flat_map(|r| r.claims.iter().flatten()))
        .map(|c| (c.name.clone(), c.request.clone()))
        .chain(extended)
        .collect()
}

/// Reads a claim by name.
pub async fn get_claim(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<ResourceClaim> {
    Api::<ResourceClaim>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| format!("cannot read ResourceClaim {namespace}/{name}"))
}

/// The names of the pods in a claim's `status.reservedFor`.
pub fn reserved_for(claim: &ResourceClaim) -> Vec<String> {
    let mut names: Vec<String> = claim
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .filter(|r| r.resource == "pods")
        .map(|r| r.name.clone())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn claim(json: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn allocation_fields_are_read() {
        let claim = claim(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": []}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpus", "driver": "gpu.tessera.dev", "pool": "n1", "device": "gpu-10"},
                            {"request": "gpus", "driver": "gpu.tessera.dev", "pool": "n1", "device": "gpu-2", "adminAccess": true},
                            {"request": "nic", "driver": "nic.example.com", "pool": "n1", "device": "eth0"}
                        ],
                        "config": [{"source": "FromClaim", "requests": ["gpus"], "opaque": {
                            "driver": "gpu.tessera.dev",
                            "parameters": {"kind": "GpuConfig"}}}]
                    },
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
                },
                "reservedFor": [{"resource": "pods", "name": "b", "uid": "2"}, {"resource": "pods", "name": "a", "uid": "1"}]
            }
        }));
        let allocation = AllocationStatus::of(&claim).unwrap();
        assert_eq!(allocation.node.as_deref(), Some("n1"));
        assert_eq!(allocation.device_names(), ["gpu-2", "gpu-10"]);
        assert!(allocation.devices[1].admin_access);
        assert_eq!(allocation.config[0].source, "FromClaim");
        assert_eq!(allocation.config[0].parameters["kind"], "GpuConfig");
        assert_eq!(reserved_for(&claim), ["a", "b"]);
    }

    #[test]
    fn an_unallocated_claim_has_no_allocation() {
        let claim = claim(serde_json::json!({
            "metadata": {"name": "c"}, "spec": {"devices": {"requests": []}}
        }));
        assert_eq!(AllocationStatus::of(&claim), None);
    }

    #[test]
    fn pod_claims_resolve_templates_through_the_status() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "resourceClaims": [
                    {"name": "direct", "resourceClaimName": "shared"},
                    {"name": "templated", "resourceClaimTemplateName": "t"},
                    {"name": "pending", "resourceClaimTemplateName": "t"}
                ],
                "containers": [{"name": "c", "resources": {"claims": [{"name": "templated", "request": "gpu"}]}}]
            },
            "status": {"resourceClaimStatuses": [{"name": "templated", "resourceClaimName": "p-templated-x1"}]}
        }))
        .unwrap();
        assert_eq!(
            pod_claims(&pod),
            [
                PodClaimEntry {
                    entry: "direct".into(),
                    claim_name: Some("shared".into())
                },
                PodClaimEntry {
                    entry: "templated".into(),
                    claim_name: Some("p-templated-x1".into())
                },
                PodClaimEntry {
                    entry: "pending".into(),
                    claim_name: None
                },
            ]
        );
        assert_eq!(
            container_claims(&pod, "c"),
            [("templated".to_owned(), Some("gpu".to_owned()))]
        );
        assert!(container_claims(&pod, "other").is_empty());
    }

    #[test]
    fn the_extended_resource_claim_is_an_entry_of_its_own() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "gpu", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}},
                    {"name": "plain", "resources": {"limits": {"memory": "1Gi", "hugepages-2Mi": "2Mi"}}}
                ]
            }
        }))
        .unwrap();
        // Before the scheduler made the claim: the entry is there, unresolved.
        assert_eq!(
            pod_claims(&pod),
            [PodClaimEntry {
                entry: EXTENDED_RESOURCES_ENTRY.into(),
                claim_name: None
            }]
        );
        assert!(container_claims(&pod, "gpu").is_empty());
        pod.status = Some(
            serde_json::from_value(serde_json::json!({
                "extendedResourceClaimStatus": {
                    "resourceClaimName": "p-extended-resources-x1",
                    "requestMappings": [{"containerName": "gpu", "resourceName": "nvidia.com/gpu",
                                         "requestName": "container-0-request-1"}]
                }
            }))
            .unwrap(),
        );
        assert_eq!(
            pod_claims(&pod),
            [PodClaimEntry {
                entry: EXTENDED_RESOURCES_ENTRY.into(),
                claim_name: Some("p-extended-resources-x1".into())
            }]
        );
        assert_eq!(
            container_claims(&pod, "gpu"),
            [(
                EXTENDED_RESOURCES_ENTRY.to_owned(),
                Some("container-0-request-1".to_owned())
            )]
        );
        assert!(container_claims(&pod, "plain").is_empty());
        // A pod with neither claims nor extended resources has no claim.
        pod.spec.as_mut().unwrap().containers.remove(0);
        assert!(pod_claims(&pod).is_empty());
    }
}
