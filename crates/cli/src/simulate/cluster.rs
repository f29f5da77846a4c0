//! The synthetic cluster a simulation allocates on: every node group rendered from its topology,
//! indexed, with what the metrics need per GPU.

use std::collections::HashMap;

use anyhow::Context;
use k8s_openapi::api::resource::v1::ResourceSlice;
use tessera_allocator::{DeviceId, DeviceIndex};
use tessera_api::names::attr;
use tessera_api::shares::ConsumableShares;
use tessera_gpu_inventory::{DeviceSource, MockSource, RenderOptions, render_slices};
use tessera_placement::synthetic;

use super::scenario::SimulationScenario;

/// The synthetic cluster: rendered slices, the class, and what the metrics need per GPU.
pub(super) struct Cluster {
    pub(super) inventory: DeviceIndex,
    pub(super) gpus: Vec<DeviceId>,
    pub(super) islands: HashMap<(String, String), Option<String>>,
    /// `(pool, device)` → its NUMA node, for every GPU.
    pub(super) numa: HashMap<(String, String), i64>,
}

pub(super) fn cluster(scenario: &SimulationScenario) -> anyhow::Result<Cluster> {
    cluster_with(scenario, ConsumableShares::Disabled)
}

/// The cluster with every node's devices published in consumable-shares mode `shares`.
pub(super) fn cluster_with(
    scenario: &SimulationScenario,
    shares: ConsumableShares,
) -> anyhow::Result<Cluster> {
    let mut slices: Vec<ResourceSlice> = Vec::new();
    for group in &scenario.nodes {
        let inventory = MockSource::new(&group.topology)
            .and_then(|s| s.inventory())
            .with_context(|| format!("topology {}", group.topology))?;
        let prefix = group
            .name_prefix
            .clone()
            .unwrap_or_else(|| group.topology.clone());
        for i in 0..group.count {
            let options = RenderOptions {
                consumable_shares: shares,
                ..RenderOptions::new(format!("{prefix}-{i:03}"))
            };
            slices.extend(
                render_slices(&inventory, &options)
                    .with_context(|| format!("render topology {}", group.topology))?,
            );
        }
    }
    let mut gpus = Vec::new();
    let mut islands = HashMap::new();
    let mut numa = HashMap::new();
    for slice in &slices {
        for d in slice.spec.devices.iter().flatten() {
            let attrs = d.attributes.as_ref();
            let get = |name: &str| {
                attrs
                    .and_then(|a| a.get(name))
                    .and_then(|v| v.string.clone())
            };
            if get(attr::TYPE).as_deref() == Some("gpu") {
                if let Some(node) = attrs
                    .and_then(|a| a.get(attr::NUMA_NODE))
                    .and_then(|v| v.int)
                {
                    numa.insert((slice.spec.pool.name.clone(), d.name.clone()), node);
                }
                gpus.push(DeviceId::new(
                    &slice.spec.driver,
                    &slice.spec.pool.name,
                    &d.name,
                ));
            }
            islands.insert(
                (slice.spec.pool.name.clone(), d.name.clone()),
                get(attr::NVLINK_ISLAND),
            );
        }
    }
    Ok(Cluster {
        inventory: DeviceIndex::new(slices, vec![synthetic::gpu_class()], vec![]),
        gpus,
        islands,
        numa,
    })
}
