//! Group (gang) decision cost (a bench binary, not criterion: each case is one decision whose
//! wall time is the result). Run with
//!
//! ```text
//! cargo bench -p tessera-placement --bench group
//! ```
//!
//! The cluster: 1,000 topology-managed dgx-h100 nodes rendered by crates/gpu-inventory (8,000 GPUs), in
//! racks of 16 nodes (`gpu.tessera.dev/rack`) and blocks of 8 racks (`gpu.tessera.dev/block`);
//! every fourth node has 4 GPUs in use. Cases: one 64-pod gang of 8, 4 or 1 GPUs per pod, decided
//! by `decide_group` with the controller's defaults (budget 4,096 pod decisions). Each case runs
//! three times and the fastest is reported; the output is a markdown table, also written as
//! `group.json` and `group.md` under Cargo's benchmark temporary directory, with the machine's
//! load average (`/proc/loadavg`) before and after the cases: wall times on a shared machine mean
//! little without it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod, PodResourceClaim, PodSchedulingGate, PodSpec};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use tessera_allocator::{AllocatedState, DeviceIndex};
use tessera_api::names::{BLOCK_LABEL, GPU_DEVICE_CLASS, RACK_LABEL, TOPOLOGY_AWARE_GATE};
use tessera_gpu_inventory::{DeviceSource, MockSource, RenderOptions, render_slices};
use tessera_placement::claims::tolerating_managed_taint;
use tessera_placement::group::{
    GroupInput, GroupKey, GroupOutcome, GroupSettings, GroupSource, Member, decide_group,
};
use tessera_placement::nodes::NodeFacts;
use tessera_placement::resolve::PodClaim;
use tessera_placement::synthetic::{self, gpu_node};
use tessera_placement::view::{ClusterSnapshot, PodContext, Settings};

const NODES: usize = 1000;
const RACK: usize = 16;
const BLOCK: usize = 8;
const PODS: usize = 64;
const RUNS: usize = 3;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    case: String,
    nodes: usize,
    pods: usize,
    gpus_per_pod: u32,
    placed: bool,
    domain: String,
    nodes_used: usize,
    racks_used: usize,
    steps: usize,
    truncated: bool,
    millis: f64,
}

fn claim(name: &str, gpus: u32) -> ResourceClaim {
    tolerating_managed_taint(&synthetic::device_claim(
        "bench",
        name,
        name,
        GPU_DEVICE_CLASS,
        i64::from(gpus),
    ))
}

fn node(i: usize) -> Node {
    gpu_node(
        &format!("dgx-{i:04}"),
        [
            (RACK_LABEL, format!("rack-{:03}", i / RACK)),
            (BLOCK_LABEL, format!("block-{:02}", i / (RACK * BLOCK))),
        ],
    )
}

fn pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("bench".into()),
            uid: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            scheduling_gates: Some(vec![PodSchedulingGate {
                name: TOPOLOGY_AWARE_GATE.into(),
            }]),
            resource_claims: Some(vec![PodResourceClaim {
                name: "gpus".into(),
                resource_claim_name: Some(name.into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` gives them ("unknown" elsewhere).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The bench's cluster: [`NODES`] topology-managed dgx-h100 nodes, every fourth with 4 GPUs in
/// use.
fn cluster() -> (ClusterSnapshot, AllocatedState) {
    let dgx = MockSource::new("dgx-h100")
        .and_then(|m| m.inventory())
        .expect("the shipped dgx-h100 topology loads");
    let mut slices: Vec<ResourceSlice> = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..NODES {
        let options = RenderOptions {
            topology_managed: true,
            ..RenderOptions::new(format!("dgx-{i:04}"))
        };
        slices.extend(render_slices(&dgx, &options).expect("dgx-h100 renders"));
        nodes.push(node(i));
    }
    let facts: Vec<NodeFacts> = nodes.iter().map(NodeFacts::from).collect();
    let view = ClusterSnapshot::new(slices, vec![synthetic::gpu_class()], facts);
    let mut in_use = AllocatedState::new();
    for i in (0..NODES).step_by(4) {
        let c = claim(&format!("busy-{i}"), 4);
        let outcome = view
            .managed
            .allocate(
                std::slice::from_ref(&c),
                &in_use,
                Some(&format!("dgx-{i:04}")),
                &Default::default(),
            )
            .expect("a busy claim allocates");
        if let tessera_allocator::Outcome::Allocated(a) = outcome {
            in_use
                .add_allocation(&a.claims[0].result)
                .expect("the state takes it");
        }
    }
    (view, in_use)
}

/// A gang of [`PODS`] pods of `gpus` GPUs each, decided [`RUNS`] times on `context`: its row,
/// with the fastest run's time.
fn measure(gpus: u32, context: &PodContext<'_>, settings: &Settings) -> Row {
    let pods: Vec<Pod> = (0..PODS).map(|p| pod(&format!("g{gpus}-{p}"))).collect();
    let claims: Vec<Vec<PodClaim>> = (0..PODS)
        .map(|p| {
            vec![PodClaim {
                pod_claim: "gpus".into(),
                claim: Arc::new(claim(&format!("g{gpus}-{p}"), gpus)),
            }]
        })
        .collect();
    let key = GroupKey {
        namespace: "bench".into(),
        name: format!("gang-{gpus}"),
        source: GroupSource::Label,
    };
    let input = GroupInput {
        key: &key,
        min_count: PODS as u32,
        placed: 0,
        members: pods
            .iter()
            .zip(&claims)
            .map(|(pod, claims)| Member { pod, claims })
            .collect(),
        unresolved: 0,
        held: 0,
        domain_nodes: Default::default(),
    };
    // The decision's clock only dates waiting groups; a fixed instant keeps the bench
    // independent of jiff's `std` feature (not enabled when this package builds alone).
    let mut best = f64::MAX;
    let mut last = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        let decision = decide_group(
            &input,
            context,
            settings,
            &GroupSettings::default(),
            Timestamp::UNIX_EPOCH,
        );
        best = best.min(started.elapsed().as_secs_f64() * 1000.0);
        last = Some(decision);
    }
    let decision = last.expect("ran");
    let (placed, domain, nodes_used, racks_used) = match &decision.outcome {
        GroupOutcome::Place { domain, score, .. } => {
            (true, domain.to_string(), score.nodes, score.domains[0])
        }
        GroupOutcome::Wait { reason, .. } => (false, reason.to_string(), 0, 0),
    };
    Row {
        case: format!("{PODS} pods × {gpus} GPUs"),
        nodes: NODES,
        pods: PODS,
        gpus_per_pod: gpus,
        placed,
        domain,
        nodes_used,
        racks_used,
        steps: decision.steps,
        truncated: decision.truncated,
        millis: (best * 10.0).round() / 10.0,
    }
}

/// The rows as markdown (printed) and JSON, both written to the target's tmp dir.
fn report(rows: &[Row], load_before: &str) {
    let mut md = String::from(
        "| gang | placed | domain | nodes | racks | pod decisions | truncated | decision ms |\n|---|---|---|---:|---:|---:|---|---:|\n",
    );
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.case, r.placed, r.domain, r.nodes_used, r.racks_used, r.steps, r.truncated, r.millis
        ));
    }
    let load_after = load_average();
    md.push_str(&format!(
        "\nload average (1/5/15 min) before: {load_before}; after: {load_after}\n"
    ));
    print!("{md}");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let json = serde_json::json!({
        "cases": rows,
        "loadAverageBefore": load_before,
        "loadAverageAfter": load_after,
    });
    let _ = std::fs::write(
        dir.join("group.json"),
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    );
    let _ = std::fs::write(dir.join("group.md"), &md);
    println!("written: {}", dir.join("group.md").display());
}

fn main() {
    let (view, in_use) = cluster();
    let unmanaged = Arc::new(DeviceIndex::new(Vec::new(), Vec::new(), Vec::new()));
    let unmanaged_fn = || unmanaged.clone();
    let usage = HashMap::new();
    let settings = Settings::new(TOPOLOGY_AWARE_GATE);
    let context = PodContext {
        devices: &view,
        unmanaged: &unmanaged_fn,
        in_use: &in_use,
        usage: &usage,
    };
    let load_before = load_average();
    let rows: Vec<Row> = [8u32, 4, 1]
        .into_iter()
        .map(|gpus| measure(gpus, &context, &settings))
        .collect();
    report(&rows, &load_before);
}
