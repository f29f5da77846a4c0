//! Synthetic objects for simulations, benchmarks and tests (`tessera simulate`, the group
//! bench, the controller's tests): one builder each, so what they decide over is what the
//! controller sees.

use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClaim, DeviceClass, DeviceClassSpec, DeviceRequest, DeviceSelector,
    ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_api::imex::{CHANNEL_TYPE, IMEX_DEVICE_CLASS};
use tessera_api::names::{DRIVER_NAME, GPU_DEVICE_CLASS, TOPOLOGY_MANAGED_LABEL, attr};

/// A topology-managed GPU node named `name` with `labels` (rack, block, ...) besides the
/// managed label, and room for any pod: 256 CPUs, 2 TiB of memory, 110 pods allocatable, so
/// node resources never decide where a simulated pod goes, its GPUs do.
pub fn gpu_node<'l>(name: &str, labels: impl IntoIterator<Item = (&'l str, String)>) -> Node {
    let labels = std::iter::once((TOPOLOGY_MANAGED_LABEL.to_owned(), "true".to_owned()))
        .chain(labels.into_iter().map(|(k, v)| (k.to_owned(), v)))
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: None,
        status: Some(NodeStatus {
            allocatable: Some(
                [
                    ("cpu".to_owned(), Quantity("256".into())),
                    ("memory".to_owned(), Quantity("2Ti".into())),
                    ("pods".to_owned(), Quantity("110".into())),
                ]
                .into(),
            ),
            ..Default::default()
        }),
    }
}

/// The whole-GPU class, `gpu.tessera.dev`, selecting Tessera's devices of type `gpu` (as the
/// shipped class does).
pub fn gpu_class() -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(GPU_DEVICE_CLASS.into()),
            ..Default::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!(
                        "device.driver == \"{DRIVER_NAME}\" && device.attributes[\"{DRIVER_NAME}\"].{} == \"gpu\"",
                        attr::TYPE
                    ),
                }),
            }]),
            ..Default::default()
        }),
    }
}

/// The IMEX channel class, `imex.gpu.tessera.dev`, selecting Tessera's devices of type
/// `imex-channel` (as the shipped class does).
pub fn imex_class() -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(IMEX_DEVICE_CLASS.into()),
            ..Default::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!(
                        "device.driver == \"{DRIVER_NAME}\" && device.attributes[\"{DRIVER_NAME}\"].{} == \"{CHANNEL_TYPE}\"",
                        attr::TYPE
                    ),
                }),
            }]),
            ..Default::default()
        }),
    }
}

/// The request name of a [`device_claim`].
pub const REQUEST: &str = "gpus";

/// A claim `namespace/name` (uid `uid`) with one request, [`REQUEST`], for exactly `count`
/// devices of `class`; no status.
pub fn device_claim(
    namespace: &str,
    name: &str,
    uid: &str,
    class: &str,
    count: i64,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: REQUEST.into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: class.into(),
                        count: Some(count),
                        ..Default::default()
                    }),
                    first_available: None,
                }]),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::NodeFacts;

    #[test]
    fn a_synthetic_node_is_managed_labelled_and_roomy() {
        let node = gpu_node("dgx-0", [("gpu.tessera.dev/rack", "r1".to_owned())]);
        let labels = node.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[TOPOLOGY_MANAGED_LABEL], "true");
        assert_eq!(labels["gpu.tessera.dev/rack"], "r1");
        let facts = NodeFacts::from(&node);
        assert_eq!(facts.info.name, "dgx-0");
        assert!(!facts.unschedulable);
        assert!(facts.taints.is_empty());
        let allocatable = &node.status.as_ref().unwrap().allocatable.as_ref().unwrap();
        assert_eq!(allocatable["pods"].0, "110");
    }

    #[test]
    fn a_synthetic_claim_asks_for_count_devices_of_its_class() {
        let claim = device_claim("ns", "c", "uid-c", "gpu.tessera.dev", 4);
        assert_eq!(claim.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(claim.metadata.uid.as_deref(), Some("uid-c"));
        let requests = claim.spec.unwrap().devices.unwrap().requests.unwrap();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].name, REQUEST);
        let exactly = requests[0].exactly.as_ref().unwrap();
        assert_eq!(exactly.device_class_name, "gpu.tessera.dev");
        assert_eq!(exactly.count, Some(4));
        assert!(claim.status.is_none());
    }
}
