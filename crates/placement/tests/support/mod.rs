//! A small cluster of dgx-h100 nodes (8 GPUs, 4 per NUMA node, one NVLink island) for the
//! preemption tests, and the controller model acting on it.

#![allow(dead_code)]

pub mod imex;

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_api::names::{RACK_LABEL, TOPOLOGY_AWARE_GATE};
use tessera_gpu_inventory::{DeviceSource, MockSource, RenderOptions, render_slices};
use tessera_placement::nodes::NodeFacts;
use tessera_placement::preemption::PreemptionSettings;
use tessera_placement::simulation::{ClusterModel, ControllerModel, Event};
use tessera_placement::synthetic::{self, gpu_node};
use tessera_placement::view::{ClusterSnapshot, Settings};

/// `nodes` dgx-h100 nodes `dgx-000`, ... in racks of `per_rack`.
pub fn cluster(nodes: usize, per_rack: usize) -> ClusterModel {
    let dgx = MockSource::new("dgx-h100")
        .and_then(|m| m.inventory())
        .expect("the shipped dgx-h100 topology loads");
    let mut slices: Vec<ResourceSlice> = Vec::new();
    let mut facts = Vec::new();
    for i in 0..nodes {
        let name = format!("dgx-{i:03}");
        let options = RenderOptions {
            topology_managed: true,
            ..RenderOptions::new(name.clone())
        };
        slices.extend(render_slices(&dgx, &options).expect("render dgx-h100"));
        let rack = format!("rack-{:02}", i / per_rack.max(1));
        facts.push(NodeFacts::from(&gpu_node(&name, [(RACK_LABEL, rack)])));
    }
    let snapshot = ClusterSnapshot::new(slices, vec![synthetic::gpu_class()], facts);
    ClusterModel::new(
        snapshot,
        TOPOLOGY_AWARE_GATE,
        "2026-11-28T10:00:00Z".parse::<Timestamp>().unwrap(),
    )
}

/// The controller, preempting with the default settings or not at all.
pub fn controller(preempt: bool) -> ControllerModel {
    ControllerModel::new(
        Settings::new(TOPOLOGY_AWARE_GATE),
        preempt.then(PreemptionSettings::default),
    )
}

/// One controller pass with the model's own Eviction API, then `seconds` pass.
pub fn step(controller: &mut ControllerModel, model: &mut ClusterModel, seconds: i64) {
    controller
        .step(model, &mut |m: &mut ClusterModel, uid: &str| m.evict(uid))
        .expect("the model accepts every write");
    model.now = model
        .now
        .saturating_add(SignedDuration::from_secs(seconds))
        .unwrap();
}

/// Removes every terminating pod (its kubelet reported it gone).
pub fn finish_terminating(model: &mut ClusterModel) {
    let gone: Vec<String> = model
        .pods()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    for uid in gone {
        model.remove(&uid);
    }
}

/// The node a pod runs on.
pub fn node_of(model: &ClusterModel, uid: &str) -> Option<String> {
    model
        .pod(uid)
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.node_name.clone())
}

/// The plans made so far.
pub fn plans(controller: &ControllerModel) -> Vec<&tessera_placement::preemption::PreemptionPlan> {
    controller
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Preempted { plan, .. } => Some(plan),
            _ => None,
        })
        .collect()
}
