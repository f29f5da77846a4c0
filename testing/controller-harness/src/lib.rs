//! Test-only (a dev-dependency, never shipped): the objects the controller's tests are made of
//! — DGX H100 nodes rendered by crates/gpu-inventory, the shipped DeviceClasses, claims, gated pods —
//! and, in [`harness`], controllers running in-process against the API-server fake.
//!
//! A crate of its own so that the controller's tests and the CLI's explain-equals-controller
//! test (which must live beside the `tessera` binary it runs) share one copy, and so that
//! tessera-test-support, which the parity tool takes as a normal dependency, stays free of kube
//! and the controller.

pub mod harness;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Node, NodeSpec, NodeStatus, Pod, PodResourceClaim, PodSchedulingGate, PodSpec,
    ResourceRequirements,
};
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceClass, DeviceRequestAllocationResult,
    ResourceClaim, ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_api::names::{DRIVER_NAME, TOPOLOGY_AWARE_GATE, TOPOLOGY_MANAGED_LABEL};
use tessera_gpu_inventory::render::ServerVersion;
use tessera_gpu_inventory::{DeviceSource, MockSource, RenderOptions, render_slices};
use tessera_placement::claims::managed_toleration;
use tessera_placement::synthetic;

pub const NS: &str = "ml";
pub const GPU_CLASS: &str = "gpu.tessera.dev";

/// The slices of a DGX H100 node (8 GPUs on one NVSwitch island, NUMA 0: gpu-0..3, NUMA 1:
/// gpu-4..7), topology-managed or not.
pub fn dgx_slices(node: &str, managed: bool) -> Vec<ResourceSlice> {
    let inventory = MockSource::new("dgx-h100")
        .and_then(|s| s.inventory())
        .expect("the shipped dgx-h100 topology loads");
    let mut options = RenderOptions::new(node);
    options.server_version = ServerVersion::V1_35;
    options.topology_managed = managed;
    render_slices(&inventory, &options).expect("dgx-h100 renders")
}

/// The DeviceClasses the Helm chart ships.
pub fn shipped_classes() -> Vec<DeviceClass> {
    let text = include_str!("../../../deploy/helm/tessera/files/deviceclasses.yaml");
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("a DeviceClass"))
        .collect()
}

/// A class with one CEL selector.
pub fn class(name: &str, expression: &str) -> DeviceClass {
    tessera_test_support::objects::cel_class(name, expression)
}

/// A node with 64 cpus, 512Gi, 110 pods; labelled topology-managed when `managed`.
pub fn node(name: &str, managed: bool) -> Node {
    let mut labels = BTreeMap::from([("kubernetes.io/hostname".to_owned(), name.to_owned())]);
    if managed {
        labels.insert(TOPOLOGY_MANAGED_LABEL.to_owned(), "true".to_owned());
    }
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("64".into())),
                ("memory".to_owned(), Quantity("512Gi".into())),
                ("pods".to_owned(), Quantity("110".into())),
            ])),
            ..Default::default()
        }),
    }
}

/// A claim for `count` devices of `class`.
pub fn claim_of(name: &str, class: &str, count: i64) -> ResourceClaim {
    let mut claim = synthetic::device_claim(NS, name, &format!("uid-{name}"), class, count);
    claim.metadata.resource_version = Some("1".into());
    claim
}

/// A claim for `count` whole GPUs.
pub fn gpu_claim(name: &str, count: i64) -> ResourceClaim {
    claim_of(name, GPU_CLASS, count)
}

/// `claim` allocated on `node` with `devices` (what the scheduler or another pod holds).
pub fn allocated(mut claim: ResourceClaim, node: &str, devices: &[&str]) -> ResourceClaim {
    claim.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    devices
                        .iter()
                        .map(|d| DeviceRequestAllocationResult {
                            request: "gpus".into(),
                            driver: DRIVER_NAME.into(),
                            pool: node.into(),
                            device: (*d).into(),
                            tolerations: Some(vec![managed_toleration()]),
                            ..Default::default()
                        })
                        .collect(),
                ),
                config: None,
            }),
            node_selector: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.into()]),
                    }]),
                    match_expressions: None,
                }],
            }),
            allocation_timestamp: None,
        }),
        ..Default::default()
    });
    claim
}

/// How a pod names a claim.
pub enum Source<'a> {
    Claim(&'a str),
    Template(&'a str),
}

/// A pod gated for topology-aware placement, requesting 1 cpu, with these claims.
pub fn gated_pod(name: &str, claims: &[(&str, Source<'_>)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            scheduling_gates: Some(vec![PodSchedulingGate {
                name: TOPOLOGY_AWARE_GATE.into(),
            }]),
            containers: vec![Container {
                name: "main".into(),
                image: Some("registry.k8s.io/pause:3.10".into()),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([("cpu".to_owned(), Quantity("1".into()))])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            resource_claims: Some(
                claims
                    .iter()
                    .map(|(name, source)| PodResourceClaim {
                        name: (*name).into(),
                        resource_claim_name: match source {
                            Source::Claim(c) => Some((*c).into()),
                            Source::Template(_) => None,
                        },
                        resource_claim_template_name: match source {
                            Source::Template(t) => Some((*t).into()),
                            Source::Claim(_) => None,
                        },
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

/// The device names of an allocation, in result order.
pub fn devices_of(allocation: &AllocationResult) -> Vec<String> {
    allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .map(|r| r.device.clone())
        .collect()
}
