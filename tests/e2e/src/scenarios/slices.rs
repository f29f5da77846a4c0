//! The ResourceSlices the plugins published, read back from the API server (so they passed its
//! validation): one pool per node named after it and owned by the Node, the devices and
//! attributes of each topology, and the managed-node taint exactly on managed nodes.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::ensure;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams};
use tessera_api::names::{DRIVER_NAME, TOPOLOGY_MANAGED_TAINT, attr};

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::devices::{Published, PublishedDevice, natural_order};
use crate::observer::RuntimeObserver;

pub async fn slices(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let slices = Api::<ResourceSlice>::all(ctx.client.clone())
        .list(&ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")))
        .await?
        .items;
    let published = Published::from_slices(&slices);
    ensure!(
        !published.is_empty(),
        "no node publishes {DRIVER_NAME} devices"
    );
    let nodes = published.nodes();
    if let RuntimeObserver::Local { local, .. } = &ctx.observer {
        let with_plugin: Vec<&String> = local
            .nodes
            .values()
            .filter(|n| n.plugin.is_some() || n.plugin_state_dir.is_some())
            .map(|n| &n.name)
            .collect();
        for node in with_plugin {
            ensure!(
                nodes.contains(node),
                "{node} runs a plugin but publishes no devices (publishing: {nodes:?})"
            );
        }
    }
    check_slice_objects(&slices)?;

    let managed = ctx.managed_nodes().await?;
    for node in &managed {
        ensure!(
            nodes.contains(node),
            "managed node {node} publishes no devices"
        );
    }
    for node in &nodes {
        let devices: Vec<&PublishedDevice> = published.on_node(node).collect();
        check_common_attributes(node, &devices)?;
        let is_managed = managed.contains(node);
        check_managed_taint(node, &devices, is_managed)?;
        let whole = published.whole_gpus(node);
        let mig = devices.iter().filter(|d| d.is_mig()).count();
        let products: BTreeSet<&str> = whole.iter().filter_map(|d| d.product()).collect();
        ctx.say(format!(
            "{node}: {} devices ({} whole GPUs {:?}, {mig} MIG){}",
            devices.len(),
            whole.len(),
            products,
            if is_managed {
                ", managed: every device tainted"
            } else {
                ""
            }
        ));
        if is_dgx_h100(&whole) {
            check_dgx_h100(node, &whole)?;
            ctx.say(format!(
                "{node}: dgx-h100 layout: gpu-0..3 on NUMA 0, gpu-4..7 on NUMA 1, one NVLink island"
            ));
        }
        check_mig_parents(node, &devices)?;
    }
    check_identities_are_per_node(&published, &nodes)?;
    ctx.say(format!(
        "{} nodes: no GPU/MIG UUID or NVLink island id is published by two nodes",
        nodes.len()
    ));
    Ok(ScenarioOutcome::Passed)
}

/// Real GPUs never share UUIDs across nodes, and islands are per node; the mock backend derives
/// both from the node name, so nodes running the same topology must not collide either.
fn check_identities_are_per_node(published: &Published, nodes: &[String]) -> anyhow::Result<()> {
    let mut uuid_owner: BTreeMap<&str, &str> = BTreeMap::new();
    let mut island_owner: BTreeMap<&str, &str> = BTreeMap::new();
    for node in nodes {
        let mut islands = BTreeSet::new();
        for device in published.on_node(node) {
            // Duplicates within one node are check_common_attributes' to report.
            if let Some(uuid) = device.uuid()
                && let Some(other) = uuid_owner.insert(uuid, node)
            {
                ensure!(
                    other == node.as_str(),
                    "uuid {uuid} is published by both {other} and {node}/{}",
                    device.name
                );
            }
            islands.extend(device.island());
        }
        for island in islands {
            if let Some(other) = island_owner.insert(island, node) {
                anyhow::bail!("nvlinkIsland {island} is published by both {other} and {node}");
            }
        }
    }
    Ok(())
}

/// Eight whole H100s: the dgx-h100 topology (or a real DGX H100).
pub fn is_dgx_h100(whole: &[&PublishedDevice]) -> bool {
    whole.len() == 8
        && whole
            .iter()
            .all(|d| d.product().is_some_and(|p| p.contains("H100")))
}

fn check_slice_objects(slices: &[ResourceSlice]) -> anyhow::Result<()> {
    for slice in slices {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        let node = slice.spec.node_name.as_deref();
        ensure!(node.is_some(), "slice {name} has no spec.nodeName");
        ensure!(
            Some(slice.spec.pool.name.as_str()) == node,
            "slice {name}: pool {} is not named after its node {node:?}",
            slice.spec.pool.name
        );
        let owned_by_node = slice
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Node" && Some(o.name.as_str()) == node);
        ensure!(
            owned_by_node,
            "slice {name} is not owned by its Node {node:?}"
        );
    }
    // A pool's slices agree on the generation and the slice count.
    let mut pools: BTreeMap<&str, BTreeSet<(i64, i64)>> = BTreeMap::new();
    for slice in slices {
        pools.entry(&slice.spec.pool.name).or_default().insert((
            slice.spec.pool.generation,
            slice.spec.pool.resource_slice_count,
        ));
    }
    for (pool, generations) in pools {
        let newest = generations.iter().map(|g| g.0).max().unwrap_or_default();
        let count = slices
            .iter()
            .filter(|s| s.spec.pool.name == pool && s.spec.pool.generation == newest)
            .count() as i64;
        let expected: BTreeSet<i64> = generations
            .iter()
            .filter(|g| g.0 == newest)
            .map(|g| g.1)
            .collect();
        ensure!(
            expected == BTreeSet::from([count]),
            "pool {pool} generation {newest}: {count} slices, but they declare resourceSliceCount {expected:?}"
        );
    }
    Ok(())
}

fn check_common_attributes(node: &str, devices: &[&PublishedDevice]) -> anyhow::Result<()> {
    let mut uuids = BTreeSet::new();
    for device in devices {
        ensure!(
            device.is_whole_gpu() || device.is_mig(),
            "{node}/{}: type {:?}, expected gpu or mig",
            device.name,
            device.kind()
        );
        let uuid = device.uuid();
        ensure!(uuid.is_some(), "{node}/{} has no uuid", device.name);
        ensure!(
            uuids.insert(uuid),
            "{node}/{}: uuid {uuid:?} is published twice",
            device.name
        );
        for name in [attr::PRODUCT_NAME, attr::DRIVER_VERSION, attr::MINOR] {
            ensure!(
                device.attribute(name).is_some(),
                "{node}/{} lacks attribute {name}",
                device.name
            );
        }
        ensure!(
            device.capacity_bytes("memory").is_some(),
            "{node}/{} has no memory capacity",
            device.name
        );
    }
    Ok(())
}

fn check_managed_taint(
    node: &str,
    devices: &[&PublishedDevice],
    managed: bool,
) -> anyhow::Result<()> {
    for device in devices {
        let taint = device
            .taints
            .iter()
            .find(|t| t.key == TOPOLOGY_MANAGED_TAINT);
        match (managed, taint) {
            (true, Some(t)) => ensure!(
                t.effect == "NoSchedule",
                "{node}/{}: taint {TOPOLOGY_MANAGED_TAINT} has effect {}, expected NoSchedule",
                device.name,
                t.effect
            ),
            (true, None) => anyhow::bail!(
                "{node} is labelled topology-managed but {} lacks the {TOPOLOGY_MANAGED_TAINT} taint",
                device.name
            ),
            (false, Some(_)) => anyhow::bail!(
                "{node} is not topology-managed but {} carries the {TOPOLOGY_MANAGED_TAINT} taint",
                device.name
            ),
            (false, None) => {}
        }
    }
    Ok(())
}

fn check_dgx_h100(node: &str, whole: &[&PublishedDevice]) -> anyhow::Result<()> {
    let mut names: Vec<&str> = whole.iter().map(|d| d.name.as_str()).collect();
    names.sort_by(|a, b| natural_order(a, b));
    let expected: Vec<String> = (0..8).map(|i| format!("gpu-{i}")).collect();
    ensure!(
        names == expected,
        "{node}: whole GPUs {names:?}, expected gpu-0 … gpu-7"
    );
    for device in whole {
        let minor = device.minor().unwrap_or(-1);
        let expected_numa = if minor < 4 { 0 } else { 1 };
        ensure!(
            device.numa_node() == Some(expected_numa),
            "{node}/{}: NUMA node {:?}, expected {expected_numa} (GPUs 0-3 on socket 0, 4-7 on socket 1)",
            device.name,
            device.numa_node()
        );
    }
    let islands: BTreeSet<Option<&str>> = whole.iter().map(|d| d.island()).collect();
    ensure!(
        islands.len() == 1 && !islands.contains(&None),
        "{node}: the NVSwitch connects all eight GPUs, so they share one nvlinkIsland; found {islands:?}"
    );
    Ok(())
}

fn check_mig_parents(node: &str, devices: &[&PublishedDevice]) -> anyhow::Result<()> {
    let gpu_uuids: BTreeSet<&str> = devices
        .iter()
        .filter(|d| d.is_whole_gpu())
        .filter_map(|d| d.uuid())
        .collect();
    for device in devices.iter().filter(|d| d.is_mig()) {
        ensure!(
            device.profile().is_some(),
            "{node}/{}: MIG device without a profile",
            device.name
        );
        let parent = match device.attribute(attr::PARENT_UUID) {
            Some(crate::devices::PublishedAttribute::String(p)) => p.as_str(),
            _ => anyhow::bail!("{node}/{}: MIG device without parentUUID", device.name),
        };
        ensure!(
            parent.starts_with("GPU-") && !gpu_uuids.contains(device.uuid().unwrap_or_default()),
            "{node}/{}: parentUUID {parent} is not a GPU UUID distinct from the device's own",
            device.name
        );
    }
    Ok(())
}
