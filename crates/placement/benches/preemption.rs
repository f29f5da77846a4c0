//! Preemption decision cost on a full cluster (a bench binary, not criterion: each decision's
//! wall time is measured). Run with
//!
//! ```text
//! cargo bench -p tessera-placement --bench preemption
//! ```
//!
//! The cluster: 5,000 topology-managed dgx-h100 nodes rendered by crates/gpu-inventory (40,000
//! GPUs) in racks of 16, every GPU held by a running pod: per node, pods of 1, 2, 4 or 8 GPUs
//! (seeded), priority -10, 0 or 100, started over the previous 10 hours; every 20th pair of
//! nodes runs a 2-pod gang of 8 GPUs per pod instead. Cases: one preemptor of priority 1000
//! (1, 2, 4 and 8 GPUs) and a gang of 2 × 4 and 4 × 8 GPUs, each decided [`RUNS`] times (a new
//! preemptor each time, same cluster). Reported per case: p50 and p99 (the slowest of the runs)
//! of the search alone and of building the victim index it reads (once per decision unless the
//! caller keeps it), placement checks and victim sets tried, victims, and the process's peak
//! memory (VmHWM) after the cases. The output is a markdown table, also written as
//! `preemption.json` and `preemption.md` under Cargo's benchmark temporary directory, with the
//! machine's load average before and after.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use tessera_allocator::DeviceIndex;
use tessera_api::names::{RACK_LABEL, TOPOLOGY_AWARE_GATE};
use tessera_gpu_inventory::{DeviceSource, MockSource, RenderOptions, render_slices};
use tessera_placement::group::{GroupInput, GroupKey, GroupSettings, GroupSource, Member};
use tessera_placement::nodes::NodeFacts;
use tessera_placement::preemption::{
    DisruptionBudgets, ManagedDevices, PreemptionDecision, PreemptionInput, PreemptionSettings,
    Victims, preempt_group, preempt_pod,
};
use tessera_placement::resolve::PodClaim;
use tessera_placement::simulation::{ClusterModel, PodTemplate};
use tessera_placement::synthetic::{self, gpu_node};
use tessera_placement::view::{ClusterSnapshot, PodContext, Settings};

const NODES: usize = 5000;
const RACK: usize = 16;
const RUNS: usize = 20;
const GPUS: usize = 8;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    case: String,
    nodes: usize,
    planned: bool,
    victims: usize,
    steps: usize,
    combinations: usize,
    truncated: bool,
    search_p50_ms: f64,
    search_p99_ms: f64,
    index_p50_ms: f64,
    index_p99_ms: f64,
    message: String,
}

/// SplitMix64, as the other benches and simulate seed their traces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Peak resident memory of this process, MiB (`VmHWM`), 0 where unknown.
fn peak_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}

fn snapshot() -> ClusterSnapshot {
    let dgx = MockSource::new("dgx-h100")
        .and_then(|m| m.inventory())
        .expect("the shipped dgx-h100 topology loads");
    let mut slices: Vec<ResourceSlice> = Vec::new();
    let mut facts = Vec::new();
    for i in 0..NODES {
        let name = format!("dgx-{i:04}");
        let options = RenderOptions {
            topology_managed: true,
            ..RenderOptions::new(name.clone())
        };
        slices.extend(render_slices(&dgx, &options).expect("dgx-h100 renders"));
        let rack = format!("rack-{:03}", i / RACK);
        facts.push(NodeFacts::from(&gpu_node(&name, [(RACK_LABEL, rack)])));
    }
    ClusterSnapshot::new(slices, vec![synthetic::gpu_class()], facts)
}

/// Every GPU of every node held by a running pod.
fn fill(model: &mut ClusterModel, rng: &mut Rng) {
    let start = model.now;
    let mut n = 0;
    let mut run = |model: &mut ClusterModel, t: &PodTemplate, node: &str, devices: Vec<String>| {
        model.now = start
            .saturating_sub(SignedDuration::from_secs(1 + (n * 7919 % 36_000) as i64))
            .unwrap_or(start);
        n += 1;
        model
            .run_placed(t, node, &devices)
            .expect("a free device is allocated once");
    };
    let priorities = [-10, 0, 0, 100];
    for i in 0..NODES {
        let node = format!("dgx-{i:04}");
        if i % 40 < 2 {
            let mut t = PodTemplate::new(&format!("gang{}-{}", i / 40, i % 40), 0, GPUS as u32);
            t.group = Some((format!("gang{}", i / 40), 2));
            run(
                model,
                &t,
                &node,
                (0..GPUS).map(|g| format!("gpu-{g}")).collect(),
            );
            continue;
        }
        let mut next = 0;
        while next < GPUS {
            let size = [1, 2, 4, 8][rng.below(4) as usize].min(GPUS - next);
            let size = size.min(1 << (GPUS - next).ilog2());
            let priority = priorities[rng.below(4) as usize];
            let t = PodTemplate::new(&format!("p{i}-{next}"), priority, size as u32);
            run(
                model,
                &t,
                &node,
                (next..next + size).map(|g| format!("gpu-{g}")).collect(),
            );
            next += size;
        }
    }
    model.now = start;
}

/// A case: preemptor pods of `gpus` GPUs, `members` of them (1: a single pod).
struct Case {
    members: usize,
    gpus: u32,
}

impl Case {
    fn name(&self) -> String {
        match self.members {
            1 => format!("pod, {} GPUs", self.gpus),
            m => format!("gang, {m} × {} GPUs", self.gpus),
        }
    }
}

/// One decision for a new preemptor of `case` (created gated in `model`), and how long the
/// index and the search took, ms.
fn decide(
    model: &mut ClusterModel,
    devices: &ManagedDevices,
    case: &Case,
    run: usize,
) -> (PreemptionDecision, f64, f64) {
    let key = GroupKey {
        namespace: tessera_placement::simulation::NAMESPACE.into(),
        name: format!("prod-{}-{}-{run}", case.members, case.gpus),
        source: GroupSource::Label,
    };
    let mut uids = Vec::new();
    for m in 0..case.members {
        let mut t = PodTemplate::new(&format!("{}-{m}", key.name), 1000, case.gpus);
        if case.members > 1 {
            t.group = Some((key.name.clone(), case.members as u32));
        }
        uids.push(model.create(&t));
    }
    let pods: Vec<Pod> = uids.iter().map(|u| model.pod(u).unwrap().clone()).collect();
    let claims: Vec<Vec<PodClaim>> = pods.iter().map(|p| model.claims_of(p)).collect();
    let started = Instant::now();
    let victims = Victims::new(
        devices,
        model.pods(),
        model.claims().cloned(),
        DisruptionBudgets::new(model.budgets()),
        &HashSet::new(),
        model.now,
    );
    let index_ms = started.elapsed().as_secs_f64() * 1000.0;
    let in_use = model.in_use();
    let usage = model.usage();
    let unmanaged = Arc::new(DeviceIndex::new(Vec::new(), Vec::new(), Vec::new()));
    let unmanaged_fn = || unmanaged.clone();
    let context = PodContext {
        devices: &model.snapshot,
        unmanaged: &unmanaged_fn,
        in_use: &in_use,
        usage: &usage,
    };
    let settings = Settings::new(TOPOLOGY_AWARE_GATE);
    let preemption = PreemptionSettings::default();
    let input = PreemptionInput {
        victims: &victims,
        reserved: &[],
        refused: &HashSet::new(),
        settings: &preemption,
    };
    let started = Instant::now();
    let decision = if case.members == 1 {
        preempt_pod(&pods[0], &claims[0], &context, &settings, &input, model.now)
    } else {
        let group = GroupInput {
            key: &key,
            min_count: case.members as u32,
            placed: 0,
            members: pods
                .iter()
                .zip(&claims)
                .map(|(pod, claims)| Member { pod, claims })
                .collect(),
            unresolved: 0,
            held: 0,
        };
        preempt_group(
            &group,
            &context,
            &settings,
            &GroupSettings::default(),
            &input,
            model.now,
        )
    };
    let search_ms = started.elapsed().as_secs_f64() * 1000.0;
    for uid in &uids {
        model.remove(uid);
    }
    (decision, index_ms, search_ms)
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    (values[index] * 10.0).round() / 10.0
}

fn measure(model: &mut ClusterModel, devices: &ManagedDevices, case: &Case) -> Row {
    let mut search = Vec::new();
    let mut index = Vec::new();
    let mut last = None;
    let runs = std::env::var("PREEMPTION_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(RUNS);
    for run in 0..runs {
        let (decision, index_ms, search_ms) = decide(model, devices, case, run);
        index.push(index_ms);
        search.push(search_ms);
        last = Some(decision);
    }
    let decision = last.expect("ran");
    let plan = decision.plan();
    Row {
        case: case.name(),
        nodes: NODES,
        planned: plan.is_some(),
        victims: plan.map_or(0, |p| p.victims.len()),
        steps: decision.steps,
        combinations: decision.combinations,
        truncated: decision.truncated,
        search_p50_ms: percentile(&mut search, 0.5),
        search_p99_ms: percentile(&mut search, 0.99),
        index_p50_ms: percentile(&mut index, 0.5),
        index_p99_ms: percentile(&mut index, 0.99),
        message: match &decision.outcome {
            tessera_placement::preemption::PreemptionOutcome::Preempt(p) => p.message.clone(),
            tessera_placement::preemption::PreemptionOutcome::NotPossible { message } => {
                message.clone()
            }
        },
    }
}

fn report(rows: &[Row], load_before: &str, setup_mib: u64) {
    let mut md = String::from(
        "| preemptor | plan | victims | placement checks | victim sets | search p50 ms | search p99 ms | index p50 ms | index p99 ms |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.case,
            if r.truncated {
                "yes (budget)"
            } else if r.planned {
                "yes"
            } else {
                "no"
            },
            r.victims,
            r.steps,
            r.combinations,
            r.search_p50_ms,
            r.search_p99_ms,
            r.index_p50_ms,
            r.index_p99_ms
        ));
    }
    let load_after = load_average();
    let peak = peak_mib();
    md.push_str(&format!(
        "\npeak memory (VmHWM): {setup_mib} MiB after building the cluster, {peak} MiB after the cases\nload average (1/5/15 min) before: {load_before}; after: {load_after}\n"
    ));
    for r in rows {
        md.push_str(&format!("\n{}: {}", r.case, r.message));
    }
    md.push('\n');
    print!("{md}");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let json = serde_json::json!({
        "cases": rows,
        "peakMiB": peak,
        "setupMiB": setup_mib,
        "loadAverageBefore": load_before,
        "loadAverageAfter": load_after,
    });
    let _ = std::fs::write(
        dir.join("preemption.json"),
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    );
    let _ = std::fs::write(dir.join("preemption.md"), &md);
    println!("written: {}", dir.join("preemption.md").display());
}

fn main() {
    let now: Timestamp = "2026-11-28T10:00:00Z".parse().expect("a time");
    let mut model = ClusterModel::new(snapshot(), TOPOLOGY_AWARE_GATE, now);
    fill(&mut model, &mut Rng(7));
    // Built once per snapshot, as the controller keeps it.
    let devices = ManagedDevices::new(&model.snapshot);
    let setup_mib = peak_mib();
    let load_before = load_average();
    let cases = [
        Case {
            members: 1,
            gpus: 1,
        },
        Case {
            members: 1,
            gpus: 2,
        },
        Case {
            members: 1,
            gpus: 4,
        },
        Case {
            members: 1,
            gpus: 8,
        },
        Case {
            members: 2,
            gpus: 4,
        },
        Case {
            members: 4,
            gpus: 8,
        },
    ];
    // `PREEMPTION_BENCH_CASES=gang` runs the cases whose name contains it (for profiling).
    let only = std::env::var("PREEMPTION_BENCH_CASES").unwrap_or_default();
    let rows: Vec<Row> = cases
        .iter()
        .filter(|c| c.name().contains(&only))
        .map(|c| measure(&mut model, &devices, c))
        .collect();
    report(&rows, &load_before, setup_mib);
}
