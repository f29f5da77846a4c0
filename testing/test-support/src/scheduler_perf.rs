//! The fixture of scheduler_perf's `SchedulingWithResourceClaimTemplate` (kubernetes
//! `test/integration/scheduler_perf/dra`): nodes with one slice of devices that each carry four
//! attributes and 1Gi of memory, a class with one CEL selector, and single-request claims. The
//! allocator benchmark and the parity benchmark (upstream's allocator on the same input) build
//! their workloads from it.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, DeviceClaim, DeviceRequest, ResourceClaim,
    ResourceClaimSpec, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// scheduler_perf's driver name.
pub const DRIVER: &str = "test-driver.cdi.k8s.io";

pub use crate::objects::{cel_class as class, exact_request as request};

/// Claim `claim-<index>` (uid `uid-<index>`) in namespace `bench` with `requests`.
pub fn claim(index: usize, requests: Vec<DeviceRequest>) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("claim-{index}")),
            namespace: Some("bench".into()),
            uid: Some(format!("uid-{index}")),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.into()),
        ..Default::default()
    }
}

/// scheduler_perf's device `device-<index>`: 4 attributes and 1Gi of memory.
pub fn device(index: i64) -> Device {
    Device {
        name: format!("device-{index:02}"),
        attributes: Some(BTreeMap::from([
            ("model".into(), string("A100")),
            ("family".into(), string("GPU")),
            (
                "driverVersion".into(),
                DeviceAttribute {
                    version: Some("1.2.3".into()),
                    ..Default::default()
                },
            ),
            (
                "index".into(),
                DeviceAttribute {
                    int: Some(index),
                    ..Default::default()
                },
            ),
        ])),
        capacity: Some(BTreeMap::from([(
            "memory".into(),
            DeviceCapacity {
                value: Quantity("1Gi".into()),
                request_policy: None,
            },
        )])),
        ..Default::default()
    }
}

/// Node `node-<node>`'s slice: one pool named after the node, `devices` devices.
pub fn slice(node: usize, devices: i64) -> ResourceSlice {
    let name = format!("node-{node:03}");
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("{name}-slice")),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(name.clone()),
            pool: ResourcePool {
                name,
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some((0..devices).map(device).collect()),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_slice_has_its_devices_in_one_pool() {
        let slice = slice(7, 10);
        assert_eq!(slice.spec.node_name.as_deref(), Some("node-007"));
        assert_eq!(slice.spec.pool.name, "node-007");
        let devices = slice.spec.devices.unwrap();
        assert_eq!(devices.len(), 10);
        assert_eq!(devices[9].name, "device-09");
        assert_eq!(devices[9].attributes.as_ref().unwrap().len(), 4);
        let claim = claim(3, vec![request("req-0", "perf", 1)]);
        assert_eq!(claim.metadata.uid.as_deref(), Some("uid-3"));
    }
}
