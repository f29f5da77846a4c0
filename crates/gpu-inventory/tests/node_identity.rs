//! Per-node UUIDs of the mock backend: nodes sharing a topology do not share GPU identities.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::Device;
use pretty_assertions::assert_eq;
use tessera_api::names::attr;
use tessera_gpu_inventory::{
    DeviceSource, GpuInventory, MockSource, RenderOptions, ResolvedDevice, SHIPPED_TOPOLOGIES,
    render_slices,
};

fn on_node(topology: &str, node: &str) -> GpuInventory {
    MockSource::new(topology)
        .unwrap()
        .for_node(node)
        .inventory()
        .unwrap_or_else(|e| panic!("{topology} on {node}: {e}"))
}

fn file_inventory(topology: &str) -> GpuInventory {
    MockSource::new(topology).unwrap().inventory().unwrap()
}

/// Every GPU and MIG-device UUID of the inventory.
fn uuids(inventory: &GpuInventory) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for gpu in &inventory.gpus {
        out.insert(gpu.uuid.clone());
        for instance in gpu.mig.iter().flat_map(|m| &m.instances) {
            out.insert(instance.uuid.clone());
        }
    }
    out
}

/// The inventory with every UUID blanked, to compare everything else.
fn without_uuids(mut inventory: GpuInventory) -> GpuInventory {
    for gpu in &mut inventory.gpus {
        gpu.uuid.clear();
        for instance in gpu.mig.iter_mut().flat_map(|m| &mut m.instances) {
            instance.uuid.clear();
        }
    }
    inventory
}

fn string_attribute(device: &Device, name: &str) -> Option<String> {
    device
        .attributes
        .as_ref()?
        .get(name)
        .and_then(|a| a.string.clone())
}

fn published_devices(inventory: &GpuInventory, node: &str, dynamic_mig: bool) -> Vec<Device> {
    let options = RenderOptions {
        dynamic_mig,
        ..RenderOptions::new(node)
    };
    render_slices(inventory, &options)
        .unwrap()
        .into_iter()
        .flat_map(|slice| slice.spec.devices.unwrap_or_default())
        .collect()
}

#[test]
fn two_nodes_of_one_topology_share_no_uuid() {
    for (topology, _) in SHIPPED_TOPOLOGIES {
        let a = on_node(topology, "gpu-node-a");
        let b = on_node(topology, "gpu-node-b");
        let (uuids_a, uuids_b) = (uuids(&a), uuids(&b));
        assert_eq!(uuids_a.len(), uuids(&file_inventory(topology)).len());
        assert!(uuids_a.is_disjoint(&uuids_b), "{topology}");
        assert!(uuids_a.is_disjoint(&uuids(&file_inventory(topology))));
        // Only the UUIDs change; the derived inventories still validate (prefixes, uniqueness).
        assert_eq!(
            without_uuids(a.clone()),
            without_uuids(file_inventory(topology))
        );
        let yaml = serde_yaml::to_string(&a).unwrap();
        assert_eq!(
            tessera_gpu_inventory::parse_topology("derived", &yaml).unwrap(),
            a
        );
    }
}

#[test]
fn the_same_node_gets_the_same_uuids_every_time() {
    // A second source stands for a restarted plugin.
    for (topology, _) in SHIPPED_TOPOLOGIES {
        let source = MockSource::new(topology).unwrap().for_node("gpu-node-a");
        assert_eq!(source.inventory().unwrap(), source.inventory().unwrap());
        assert_eq!(source.inventory().unwrap(), on_node(topology, "gpu-node-a"));
    }
}

#[test]
fn without_a_node_name_the_file_uuids_are_kept() {
    let inventory = file_inventory("dgx-h100");
    assert_eq!(
        inventory.gpus[0].uuid,
        "GPU-c9bb4c18-b064-5292-b9c3-057c912026de"
    );
    let text = tessera_gpu_inventory::mock::shipped_topology("dgx-h100").unwrap();
    assert_eq!(
        tessera_gpu_inventory::parse_topology("dgx-h100", text).unwrap(),
        inventory
    );
}

#[test]
fn dgx_h100_is_still_one_island_per_node_with_its_own_id() {
    let a = on_node("dgx-h100", "gpu-node-a");
    let b = on_node("dgx-h100", "gpu-node-b");
    let (islands_a, islands_b) = (a.nvlink_islands(), b.nvlink_islands());
    assert_eq!(islands_a.len(), 1);
    assert_eq!(islands_b.len(), 1);
    let members: BTreeSet<String> = a.gpus.iter().map(|g| g.uuid.clone()).collect();
    assert_eq!(
        islands_a[0]
            .members
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        members
    );
    assert_ne!(islands_a[0].id, islands_b[0].id);
    // Every published GPU names its node's island.
    for device in published_devices(&a, "gpu-node-a", false) {
        assert_eq!(
            string_attribute(&device, attr::NVLINK_ISLAND).as_deref(),
            Some(islands_a[0].id.as_str()),
            "{}",
            device.name
        );
    }
}

#[test]
fn nvlink_pairs_still_form_the_same_islands() {
    let file = file_inventory("pcie-a100-nvlink-pairs");
    let node = on_node("pcie-a100-nvlink-pairs", "gpu-node-a");
    let minors = |inventory: &GpuInventory| -> Vec<Vec<u32>> {
        let mut islands: Vec<Vec<u32>> = inventory
            .nvlink_islands()
            .iter()
            .map(|island| {
                let mut m: Vec<u32> = island
                    .members
                    .iter()
                    .map(|uuid| inventory.gpu_by_uuid(uuid).unwrap().minor)
                    .collect();
                m.sort_unstable();
                m
            })
            .collect();
        islands.sort();
        islands
    };
    assert_eq!(minors(&node), minors(&file));
    assert_eq!(minors(&node).len(), 2);
}

#[test]
fn mig_devices_name_their_parent_on_the_same_node() {
    let node = "gpu-node-a";
    let inventory = on_node("hgx-a100-mig", node);
    let gpu_uuids: BTreeSet<String> = inventory.gpus.iter().map(|g| g.uuid.clone()).collect();
    let mut mig_devices = 0;
    for dynamic_mig in [false, true] {
        for device in published_devices(&inventory, node, dynamic_mig) {
            let Some(parent) = string_attribute(&device, attr::PARENT_UUID) else {
                continue;
            };
            mig_devices += 1;
            assert!(gpu_uuids.contains(&parent), "{}: {parent}", device.name);
            match inventory.resolve_device(&device.name) {
                Some(ResolvedDevice::Mig { gpu, instance, .. }) => {
                    assert_eq!(gpu.uuid, parent, "{}", device.name);
                    if let Some(instance) = instance
                        && !dynamic_mig
                    {
                        assert_eq!(
                            string_attribute(&device, attr::UUID).as_deref(),
                            Some(instance.uuid.as_str()),
                            "{}",
                            device.name
                        );
                    }
                }
                other => panic!("{}: {other:?}", device.name),
            }
        }
    }
    assert!(mig_devices > 0, "hgx-a100-mig publishes MIG devices");
}

#[test]
fn describe_names_the_node() {
    let source = MockSource::new("dgx-h100").unwrap().for_node("gpu-node-a");
    assert_eq!(
        source.describe(),
        "mock topology dgx-h100 (UUIDs of node gpu-node-a)"
    );
}
