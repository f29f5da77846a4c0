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
//! preemptor each time, same cluster). Before each run one running pod finishes and a new pod takes
//! its devices (a busy cluster's churn between decisions). Each run times what one decision of
//! the controller costs: applying that change to the victim index the controller keeps
//! ([`KeptVictims`]: two pods and two claims), the whole decision ([`decide`] with a
//! [`ClusterSource`] that reads as the controller's caches do: devices in use and node usage kept
//! current, nominations scanned, the kept victim index), and — for comparison — building the
//! victim index in full, which the controller does only after a relist, an inventory change or
//! every 10 s. A decision right after a change costs the update and the decision.
//! Reported per case: p50 and p99 (the slowest of the runs), the preemption search's placement
//! checks and victim sets tried and its victims (deterministic counts), and the process's peak
//! memory (VmHWM) after the cases. The output is a markdown table, also written as
//! `preemption.json` and `preemption.md` under Cargo's benchmark temporary directory, with the
//! machine's load average before and after.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use tessera_allocator::{AllocatedState, DeviceIndex};
use tessera_api::names::{RACK_LABEL, TOPOLOGY_AWARE_GATE};
use tessera_gpu_inventory::{DeviceSource, MockSource, RenderOptions, render_slices};
use tessera_placement::decide::decide;
use tessera_placement::decision::{
    ClusterSource, GroupVerdict, PodVerdict, PreemptionObjects, Ruling,
};
use tessera_placement::group::{
    GroupInput, GroupKey, GroupSettings, GroupSource, Member, group_key,
};
use tessera_placement::nodes::NodeFacts;
use tessera_placement::preemption::nomination::{Nomination, Nominations, with_reserved};
use tessera_placement::preemption::pod_priority;
use tessera_placement::preemption::{
    KeptVictims, ManagedDevices, PreemptionDecision, PreemptionInput, PreemptionSettings, Victims,
    preempt_group, preempt_pod, victim_index,
};
use tessera_placement::protocol::object_key;
use tessera_placement::resolve::PodClaim;
use tessera_placement::resources::NodeUsage;
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
    decision_p50_ms: f64,
    decision_p99_ms: f64,
    decision_cpu_p50_ms: f64,
    decision_cpu_p99_ms: f64,
    index_p50_ms: f64,
    index_p99_ms: f64,
    update_p50_ms: f64,
    update_p99_ms: f64,
    changed_p50_ms: f64,
    changed_p99_ms: f64,
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

/// CPU time this thread has run so far, ns (`/proc/thread-self/schedstat`; 0 where unknown): a
/// decision's own work, without the time it waited for a core on a loaded machine.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
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

/// The controller's caches as one decision reads them (`crates/controller/src/worker.rs`): devices
/// in use, node usage and the pods carrying a nomination kept current (here computed before the
/// decision, untimed), the victim index kept across decisions.
struct BenchSource<'a> {
    snapshot: &'a ClusterSnapshot,
    pods: Vec<Arc<Pod>>,
    nominated: Vec<Arc<Pod>>,
    claims: HashMap<String, Arc<ResourceClaim>>,
    budgets: Vec<Arc<PodDisruptionBudget>>,
    in_use: Arc<AllocatedState>,
    usage: Arc<HashMap<String, NodeUsage>>,
    victims: Arc<Victims>,
    now: Timestamp,
}

impl ClusterSource for BenchSource<'_> {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<ResourceClaim>> {
        self.claims.get(&format!("{namespace}/{name}")).cloned()
    }

    fn template_exists(&self, _: &str, _: &str) -> bool {
        false
    }

    fn group_pods(&self, key: &GroupKey) -> Vec<Arc<Pod>> {
        self.pods
            .iter()
            .filter(|p| group_key(p).as_ref() == Some(key))
            .cloned()
            .collect()
    }

    fn pod_group(&self, _: &GroupKey) -> Option<&PodGroup> {
        None
    }

    fn with_context(&self, _: &str, decide: &mut dyn FnMut(&PodContext<'_>)) {
        // As the controller: the nominations of the pods that carry one, read per context.
        let pods = self.nominated.iter().map(AsRef::as_ref);
        let nominations = Nominations::from_pods(pods, TOPOLOGY_AWARE_GATE, self.now);
        let reserved = nominations.reserved_against(i32::MAX, &[], None);
        let in_use = with_reserved(&self.in_use, &reserved);
        let unmanaged = Arc::new(DeviceIndex::new(Vec::new(), Vec::new(), Vec::new()));
        let unmanaged = || unmanaged.clone();
        decide(&PodContext {
            devices: self.snapshot,
            unmanaged: &unmanaged,
            in_use: &in_use,
            usage: &self.usage,
        });
    }

    fn preemption(&self) -> Option<PreemptionObjects> {
        Some(PreemptionObjects {
            pods: self.pods.clone(),
            claims: self.claims.values().cloned().collect(),
            budgets: self.budgets.clone(),
            victims: Some(self.victims.clone()),
            ..PreemptionObjects::default()
        })
    }
}

/// The cluster's pods and claims as the controller's caches hold them (shared, not copied, per
/// decision).
struct Cached {
    pods: Vec<Arc<Pod>>,
    claims: HashMap<String, Arc<ResourceClaim>>,
    /// The victim index the controller keeps, told every change.
    kept: Option<KeptVictims>,
    /// Changes made so far ([`churn`]).
    churned: usize,
}

impl Cached {
    fn of(model: &ClusterModel, devices: &ManagedDevices) -> Cached {
        let pods: Vec<Arc<Pod>> = model.pods().cloned().map(Arc::new).collect();
        let claims: HashMap<String, Arc<ResourceClaim>> = model
            .claims()
            .map(|c| (object_key(&c.metadata), c.clone()))
            .collect();
        let budgets: Vec<Arc<PodDisruptionBudget>> =
            model.budgets().cloned().map(Arc::new).collect();
        let claim_list: Vec<Arc<ResourceClaim>> = claims.values().cloned().collect();
        let kept = KeptVictims::new(
            devices,
            &pods,
            &claim_list,
            &budgets,
            TOPOLOGY_AWARE_GATE,
            model.now,
        );
        Cached {
            pods,
            claims,
            kept: Some(kept),
            churned: 0,
        }
    }
}

/// What one run measured, ms: building the victim index in full, applying one change to the kept
/// index, and the controller's decision with the index kept.
struct Timed {
    index_ms: f64,
    update_ms: f64,
    decision_ms: f64,
    decision_cpu_ms: f64,
}

/// The change before each run, as a busy cluster has them between decisions: a running pod (every
/// 97th of the cached ones, in turn) finishes, its claim is released, and a new pod of
/// the same priority takes its devices; the kept index is told (pods and claims by
/// `namespace/name`, as the controller's watches report them) and the caches follow.
fn churn(
    model: &mut ClusterModel,
    cached: &mut Cached,
    kept: &mut KeptVictims,
    devices: &ManagedDevices,
) -> f64 {
    let run = cached.churned;
    cached.churned += 1;
    let old = cached.pods[(run * 97 + 13) % cached.pods.len()].clone();
    let uid = old.metadata.uid.clone().unwrap_or_default();
    let node = old
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let claim_key = format!("{}-gpus", object_key(&old.metadata));
    let held: Vec<String> = cached.claims[&claim_key]
        .status
        .iter()
        .flat_map(|s| s.allocation.iter())
        .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
        .map(|r| r.device.clone())
        .collect();
    model.remove(&uid);
    let mut t = PodTemplate::new(
        &format!("churn-{run}"),
        pod_priority(&old),
        held.len() as u32,
    );
    t.group = None;
    let new_uid = model
        .run_placed(&t, &node, &held)
        .expect("the freed devices");
    let new = Arc::new(model.pod(&new_uid).expect("created").clone());
    let new_claim = model
        .claims()
        .find(|c| c.metadata.name.as_deref() == Some(&format!("churn-{run}-gpus")))
        .expect("its claim")
        .clone();
    cached
        .pods
        .retain(|p| p.metadata.uid.as_deref() != Some(uid.as_str()));
    cached.pods.push(new.clone());
    cached.claims.remove(&claim_key);
    let new_claim_key = object_key(&new_claim.metadata);
    cached
        .claims
        .insert(new_claim_key.clone(), new_claim.clone());
    let now = model.now;
    let started = Instant::now();
    kept.set_pod(devices, &object_key(&old.metadata), None, now);
    kept.set_claim(devices, &claim_key, None, now);
    kept.set_pod(devices, &object_key(&new.metadata), Some(new), now);
    kept.set_claim(devices, &new_claim_key, Some(new_claim), now);
    let victims = kept.victims();
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    drop(victims);
    ms
}

/// Creates the gated preemptors of `case` (a new group for each run): its key, their UIDs, the
/// pods.
fn create_preemptors(
    model: &mut ClusterModel,
    case: &Case,
    run: usize,
) -> (GroupKey, Vec<String>, Vec<Arc<Pod>>) {
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
    let preemptors: Vec<Arc<Pod>> = uids
        .iter()
        .map(|u| Arc::new(model.pod(u).unwrap().clone()))
        .collect();
    (key, uids, preemptors)
}

/// One decision for a new preemptor of `case` (created gated in `model`): the victim index built
/// (as the controller does after a pod or claim changed), then the controller's whole decision
/// for the preemptor ([`decide`]: claims resolved, planned on free devices, the preemption
/// search, the decision's steps) with that index kept. With `counts`, the search again, untimed,
/// for its counts and message.
fn decide_once(
    model: &mut ClusterModel,
    cached: &mut Cached,
    devices: &ManagedDevices,
    case: &Case,
    run: usize,
    counts: bool,
) -> (Timed, Option<PreemptionDecision>) {
    let mut kept = cached.kept.take().expect("kept between runs");
    let update_ms = churn(model, cached, &mut kept, devices);
    let victims = kept.victims();
    cached.kept = Some(kept);
    let (key, uids, preemptors) = create_preemptors(model, case, run);
    let mut pods = cached.pods.clone();
    pods.extend(preemptors.iter().cloned());
    let mut claims = cached.claims.clone();
    for pod in &preemptors {
        for c in model.claims_of(pod) {
            claims.insert(object_key(&c.claim.metadata), c.claim);
        }
    }
    let budgets: Vec<Arc<PodDisruptionBudget>> = model.budgets().cloned().map(Arc::new).collect();
    let index_ms = full_build(model, devices, &pods, &claims, &budgets, &victims);
    let nominated = pods
        .iter()
        .filter(|p| Nomination::of(p).is_some())
        .cloned()
        .collect();
    let source = BenchSource {
        snapshot: &model.snapshot,
        pods,
        nominated,
        claims,
        budgets,
        in_use: Arc::new(model.in_use()),
        usage: Arc::new(model.usage()),
        victims,
        now: model.now,
    };
    let settings = Settings::new(TOPOLOGY_AWARE_GATE);
    let started = Instant::now();
    let cpu = cpu_ns();
    let decision = decide(&preemptors[0], &source, &[], &settings, model.now);
    let decision_ms = started.elapsed().as_secs_f64() * 1000.0;
    let decision_cpu_ms = cpu_ns().saturating_sub(cpu) as f64 / 1e6;
    assert!(
        matches!(
            decision.ruling,
            Ruling::Pod(PodVerdict::Preempting { .. })
                | Ruling::Group(GroupVerdict::Preempting { .. })
        ),
        "{}: the controller decides to preempt: {:?}",
        case.name(),
        decision.ruling
    );
    let searched = counts.then(|| search(model, &source, &preemptors, &key, case));
    for uid in &uids {
        model.remove(uid);
    }
    let timed = Timed {
        index_ms,
        update_ms,
        decision_ms,
        decision_cpu_ms,
    };
    (timed, searched)
}

/// Builds the victim index of these objects in full, as the controller does at its first search
/// (timed, ms), and checks the kept one has as many units.
fn full_build(
    model: &ClusterModel,
    devices: &ManagedDevices,
    pods: &[Arc<Pod>],
    claims: &HashMap<String, Arc<ResourceClaim>>,
    budgets: &[Arc<PodDisruptionBudget>],
    kept: &Victims,
) -> f64 {
    let claims: Vec<Arc<ResourceClaim>> = claims.values().cloned().collect();
    let started = Instant::now();
    let built = victim_index(
        devices,
        pods,
        &claims,
        budgets,
        TOPOLOGY_AWARE_GATE,
        model.now,
    );
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(
        built.units.iter().filter(|u| !u.is_gone()).count(),
        kept.units.iter().filter(|u| !u.is_gone()).count(),
        "the kept index has the units of a full build"
    );
    ms
}

/// The preemption search alone for the preemptors of `case`, for its counts.
fn search(
    model: &ClusterModel,
    source: &BenchSource<'_>,
    preemptors: &[Arc<Pod>],
    key: &GroupKey,
    case: &Case,
) -> PreemptionDecision {
    let claims: Vec<Vec<PodClaim>> = preemptors.iter().map(|p| model.claims_of(p)).collect();
    let unmanaged = Arc::new(DeviceIndex::new(Vec::new(), Vec::new(), Vec::new()));
    let unmanaged_fn = || unmanaged.clone();
    let context = PodContext {
        devices: &model.snapshot,
        unmanaged: &unmanaged_fn,
        in_use: &source.in_use,
        usage: &source.usage,
    };
    let settings = Settings::new(TOPOLOGY_AWARE_GATE);
    let preemption = PreemptionSettings::default();
    let input = PreemptionInput {
        victims: &source.victims,
        reserved: &[],
        refused: &HashSet::new(),
        settings: &preemption,
    };
    if case.members == 1 {
        return preempt_pod(
            &preemptors[0],
            &claims[0],
            &context,
            &settings,
            &input,
            model.now,
        );
    }
    let group = GroupInput {
        key,
        min_count: case.members as u32,
        placed: 0,
        members: preemptors
            .iter()
            .zip(&claims)
            .map(|(pod, claims)| Member { pod, claims })
            .collect(),
        unresolved: 0,
        held: 0,
        domain_nodes: Default::default(),
    };
    preempt_group(
        &group,
        &context,
        &settings,
        &GroupSettings::default(),
        &input,
        model.now,
    )
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    (values[index] * 10.0).round() / 10.0
}

fn measure(
    model: &mut ClusterModel,
    cached: &mut Cached,
    devices: &ManagedDevices,
    case: &Case,
) -> Row {
    let mut decision = Vec::new();
    let mut cpu = Vec::new();
    let mut index = Vec::new();
    let mut update = Vec::new();
    let mut changed = Vec::new();
    let mut last = None;
    let runs = std::env::var("PREEMPTION_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(RUNS);
    for run in 0..runs {
        let (timed, searched) = decide_once(model, cached, devices, case, run, run + 1 == runs);
        index.push(timed.index_ms);
        update.push(timed.update_ms);
        decision.push(timed.decision_ms);
        cpu.push(timed.decision_cpu_ms);
        changed.push(timed.update_ms + timed.decision_ms);
        last = searched.or(last);
    }
    let searched = last.expect("ran");
    let plan = searched.plan();
    Row {
        case: case.name(),
        nodes: NODES,
        planned: plan.is_some(),
        victims: plan.map_or(0, |p| p.victims.len()),
        steps: searched.steps,
        combinations: searched.combinations,
        truncated: searched.truncated,
        decision_p50_ms: percentile(&mut decision, 0.5),
        decision_p99_ms: percentile(&mut decision, 0.99),
        decision_cpu_p50_ms: percentile(&mut cpu, 0.5),
        decision_cpu_p99_ms: percentile(&mut cpu, 0.99),
        index_p50_ms: percentile(&mut index, 0.5),
        index_p99_ms: percentile(&mut index, 0.99),
        update_p50_ms: percentile(&mut update, 0.5),
        update_p99_ms: percentile(&mut update, 0.99),
        changed_p50_ms: percentile(&mut changed, 0.5),
        changed_p99_ms: percentile(&mut changed, 0.99),
        message: match &searched.outcome {
            tessera_placement::preemption::PreemptionOutcome::Preempt(p) => p.message.clone(),
            tessera_placement::preemption::PreemptionOutcome::NotPossible { message, .. } => {
                message.clone()
            }
        },
    }
}

fn report(rows: &[Row], load_before: &str, setup_mib: u64) {
    let mut md = String::from(
        "| preemptor | plan | victims | placement checks | victim sets | decision p50 / p99 ms (index kept) | its CPU time p50 / p99 ms | index update p50 / p99 ms | decision after a change p50 / p99 ms | full index build p50 / p99 ms |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} / {} | {} / {} | {} / {} | {} / {} | {} / {} |\n",
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
            r.decision_p50_ms,
            r.decision_p99_ms,
            r.decision_cpu_p50_ms,
            r.decision_cpu_p99_ms,
            r.update_p50_ms,
            r.update_p99_ms,
            r.changed_p50_ms,
            r.changed_p99_ms,
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
    let mut cached = Cached::of(&model, &devices);
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
        .map(|c| measure(&mut model, &mut cached, &devices, c))
        .collect();
    report(&rows, &load_before, setup_mib);
}
