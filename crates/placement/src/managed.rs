//! Which devices the controller may allocate — only those carrying the
//! `gpu.tessera.dev/topology-managed` taint (docs/protocol.md) — and which the scheduler allocates.
//! Pure functions from ResourceSlices to the slices each allocator inventory is built from.

use std::collections::{BTreeSet, HashSet};

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use tessera_api::names::{DRIVER_NAME, TOPOLOGY_MANAGED_TAINT};

/// Whether the device carries the topology-managed taint.
pub fn is_managed(device: &Device) -> bool {
    device
        .taints
        .iter()
        .flatten()
        .any(|t| t.key == TOPOLOGY_MANAGED_TAINT)
}

fn keep_devices(mut slice: ResourceSlice, keep: impl Fn(&Device) -> bool) -> ResourceSlice {
    if let Some(devices) = slice.spec.devices.as_mut() {
        devices.retain(|d| keep(d));
    }
    slice
}

/// The slices of the controller's inventory: every slice of each Tessera pool that publishes at
/// least one managed device (counter-only slices included, so pools stay complete and counters
/// resolve), with the unmanaged devices left out. Also the nodes those devices are on.
pub fn managed_slices(slices: Vec<ResourceSlice>) -> (Vec<ResourceSlice>, HashSet<String>) {
    let mut pools: BTreeSet<String> = BTreeSet::new();
    let mut nodes = HashSet::new();
    for slice in slices.iter().filter(|s| s.spec.driver == DRIVER_NAME) {
        for device in slice
            .spec
            .devices
            .iter()
            .flatten()
            .filter(|d| is_managed(d))
        {
            pools.insert(slice.spec.pool.name.clone());
            if let Some(node) = device
                .node_name
                .as_ref()
                .or(slice.spec.node_name.as_ref())
                .filter(|n| !n.is_empty())
            {
                nodes.insert(node.clone());
            }
        }
    }
    let managed = slices
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER_NAME && pools.contains(&s.spec.pool.name))
        .map(|s| keep_devices(s, is_managed))
        .collect();
    (managed, nodes)
}

/// The slices of the devices the scheduler may allocate: every device without the managed taint,
/// of any driver.
pub fn unmanaged_slices(slices: Vec<ResourceSlice>) -> Vec<ResourceSlice> {
    slices
        .into_iter()
        .map(|s| keep_devices(s, |d| !is_managed(d)))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{
        CounterSet, DeviceTaint, ResourcePool, ResourceSliceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn device(name: &str, managed: bool) -> Device {
        Device {
            name: name.into(),
            taints: managed.then(|| {
                vec![DeviceTaint {
                    key: TOPOLOGY_MANAGED_TAINT.into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }
    }

    fn slice(name: &str, driver: &str, node: &str, devices: Vec<Device>) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.into(),
                node_name: Some(node.into()),
                pool: ResourcePool {
                    name: node.into(),
                    generation: 1,
                    resource_slice_count: 2,
                },
                devices: Some(devices),
                ..Default::default()
            },
        }
    }

    fn names(slice: &ResourceSlice) -> Vec<&str> {
        slice
            .spec
            .devices
            .iter()
            .flatten()
            .map(|d| d.name.as_str())
            .collect()
    }

    #[test]
    fn only_managed_devices_of_managed_pools() {
        let mut counters = slice("dgx-1-counters", DRIVER_NAME, "dgx-1", vec![]);
        counters.spec.devices = None;
        counters.spec.shared_counters = Some(vec![CounterSet {
            name: "gpu-0-counters".into(),
            counters: Default::default(),
        }]);
        let slices = vec![
            slice(
                "dgx-1-gpus",
                DRIVER_NAME,
                "dgx-1",
                vec![device("gpu-0", true), device("gpu-1", false)],
            ),
            counters,
            slice(
                "plain-gpus",
                DRIVER_NAME,
                "plain",
                vec![device("gpu-0", false)],
            ),
            slice(
                "nic",
                "nic.example.com",
                "dgx-1",
                vec![device("eth0", true)],
            ),
        ];
        let (managed, nodes) = managed_slices(slices.clone());
        let kept: Vec<(&str, Vec<&str>)> = managed
            .iter()
            .map(|s| (s.metadata.name.as_deref().unwrap(), names(s)))
            .collect();
        assert_eq!(
            kept,
            [("dgx-1-gpus", vec!["gpu-0"]), ("dgx-1-counters", vec![])],
            "the counter slice of the managed pool stays; other pools and drivers go"
        );
        assert_eq!(nodes, HashSet::from(["dgx-1".to_owned()]));

        let unmanaged = unmanaged_slices(slices);
        let kept: Vec<Vec<&str>> = unmanaged.iter().map(names).collect();
        assert_eq!(kept, [vec!["gpu-1"], vec![], vec!["gpu-0"], vec![]]);
    }
}
