//! `tessera simulate`: placement quality of first fit and topology-aware allocation on a synthetic
//! cluster (nodes rendered from shipped or custom topologies) under a trace of GPU claims arriving
//! and departing.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceSlice};
use serde::{Deserialize, Serialize};
use tessera_allocator::{
    AllocateOptions, Allocation, DeviceId, DeviceIndex, Outcome, PlacementMode,
};
use tessera_api::names::{GPU_DEVICE_CLASS, attr};
use tessera_api::shares::ConsumableShares;
use tessera_gpu_inventory::{DeviceSource, MockSource, RenderOptions, render_slices};
use tessera_placement::synthetic;

mod gangs;
mod live;
mod sharing;

use live::LiveClaims;
pub use sharing::SharingSpec;

pub const LONG_ABOUT: &str = "\
Allocates a trace of GPU claims (arriving and departing) on a synthetic cluster, once with \
first fit (what kube-scheduler does) and once topology-aware, and compares placement quality.

With --gangs it runs a gang trace instead (groups of pods that must start together), placed \
by the controller's group decision (all or nothing, one fabric clique or rack first) and by \
per-pod first fit (each pod takes the first node that fits; placed pods hold their GPUs until \
the gang's last pod is placed). Gang metrics per mode: started, oneCliquePercent (of the gangs \
started on GB200 trays, percent within one fabric clique), oneRackPercent, \
rejectedWhileCapacity (gangs that waited at some step although the cluster could have run them \
then: counting only GPUs held by running gangs as taken, the nodes had room for every pod, whole \
pods per node; GPUs held by a partly placed gang count as free, a GB200 tray's 4 free GPUs do not \
hold an 8-GPU pod), meanWait (steps from arrival to start, over the gangs started) and \
gpusHeldByIncomplete. See docs/benchmarks.md, section Gangs.

The default scenario is 64 dgx-h100 and 64 pcie-l40s nodes and 3000 claims of 1, 2, 4 or 8 GPUs \
(weights 40/25/20/15) living 1-480 arrivals each. A scenario file (YAML) describes its own:

  nodes:
    - topology: dgx-h100        # shipped topology name or topology file path
      count: 64
      namePrefix: dgx           # optional; nodes are <prefix>-000, <prefix>-001, ...
  trace:
    claims: 3000
    sizes: {1: 40, 2: 25, 4: 20, 8: 15}   # GPUs per claim: relative weight
    lifetime: {min: 1, max: 480}          # arrivals a claim stays, uniform

Metrics per mode: claims, allocated, nvlinkLocalPercent (multi-GPU claims whose GPUs share one \
NVLink island, percent of allocated multi-GPU claims), meanCommCost (mean over allocated \
multi-GPU claims of the average pair cost of the TopologyScore), rejectedWhileFree (claims \
rejected although the cluster had at least as many free GPUs as they asked for), \
numaAlignedPercent (claims of 2-4 GPUs allocated while some node had that many GPUs free on one \
NUMA node: percent of them placed on one NUMA node), \
p50LatencyMicros and p99LatencyMicros (per allocation). All metrics except the two latencies \
are deterministic for a scenario and seed; the latencies are measurements. With -o json: \
`{\"firstFit\": METRICS, \"topologyAware\": METRICS}`.

With --sharing it runs a sharing trace instead: single-GPU claims each needing some device memory, \
allocated first fit once on the nodes published whole (a GPU per claim) and once with consumable \
shares in `memory` mode (claims share a GPU while their memory fits), and reports the GPUs in use \
(peak and mean over the arrivals), claims per GPU and the GPUs sharing saved. The default trace is \
3000 claims of 5/10/20/40 GiB (weights 40/30/20/10) living 1-480 arrivals; a scenario file may set \
its own:

  sharing:
    claims: 3000
    memoryGiB: {5: 40, 10: 30, 20: 20, 40: 10}   # GiB per claim: relative weight
    lifetime: {min: 1, max: 480}";

use crate::output::OutputFormat;

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// `default`, or the path of a scenario file (format in --help).
    #[arg(long, env = "TESSERA_SCENARIO", default_value = "default")]
    pub scenario: String,

    /// Seed of the claim trace; the same seed gives the same trace and the same placements.
    #[arg(long, env = "TESSERA_SEED", default_value_t = 1)]
    pub seed: u64,

    #[command(flatten)]
    pub output: crate::output::Output,

    /// Run the sharing trace (GPUs saved by consumable shares) instead of the placement comparison.
    #[arg(long, env = "TESSERA_SHARING", conflicts_with = "gangs")]
    pub sharing: bool,

    /// Run the gang trace instead: gangs of 4-GPU pods on 8 racks of 8 dgx-h100 nodes and 2
    /// GB200 fabric cliques of 18 trays, placed by the controller's group decision and by
    /// per-pod first fit.
    #[arg(long, env = "TESSERA_GANGS")]
    pub gangs: bool,

    /// Gangs in the gang trace.
    #[arg(
        long,
        env = "TESSERA_GANG_COUNT",
        default_value_t = 400,
        requires = "gangs"
    )]
    pub gang_count: usize,

    /// GPUs per pod in the gang trace, one size per gang: `4`, or sizes with relative weights,
    /// `2:30,4:40,8:30` (mixed sizes fragment nodes, which per-pod first fit handles worst).
    #[arg(
        long,
        env = "TESSERA_GANG_POD_GPUS",
        default_value = "4",
        value_parser = parse_pod_gpus,
        requires = "gangs"
    )]
    pub gang_pod_gpus: BTreeMap<u32, u32>,

    /// Topology-aware placement's NUMA policy, as the controller's `--numa-policy`: `align` (a
    /// claim that fits one NUMA node gets one) or `pack` (partly used nodes first).
    #[arg(long, env = "TESSERA_NUMA_POLICY", default_value = "align")]
    pub numa_policy: tessera_allocator::NumaPolicy,
}

/// A scenario: the cluster and the trace.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimulationScenario {
    pub nodes: Vec<NodeGroup>,
    pub trace: TraceSpec,
    /// The sharing trace (`--sharing`); the default one when absent.
    #[serde(default)]
    pub sharing: Option<SharingSpec>,
}

/// `count` nodes rendered from one topology.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeGroup {
    pub topology: String,
    pub count: usize,
    #[serde(default)]
    pub name_prefix: Option<String>,
}

/// The claim trace.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TraceSpec {
    pub claims: usize,
    /// GPUs per claim → relative weight.
    pub sizes: BTreeMap<u32, u32>,
    pub lifetime: Lifetime,
}

/// How many arrivals a claim stays, uniformly in `min..=max`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lifetime {
    pub min: u64,
    pub max: u64,
}

impl SimulationScenario {
    pub fn default_scenario() -> SimulationScenario {
        SimulationScenario {
            nodes: vec![
                NodeGroup {
                    topology: "dgx-h100".into(),
                    count: 64,
                    name_prefix: None,
                },
                NodeGroup {
                    topology: "pcie-l40s".into(),
                    count: 64,
                    name_prefix: None,
                },
            ],
            trace: TraceSpec {
                claims: 3000,
                sizes: [(1, 40), (2, 25), (4, 20), (8, 15)].into(),
                lifetime: Lifetime { min: 1, max: 480 },
            },
            sharing: None,
        }
    }

    fn load(path: &Path) -> anyhow::Result<SimulationScenario> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read scenario {}", path.display()))?;
        let scenario: SimulationScenario = serde_yaml::from_str(&text).with_context(|| {
            format!(
                "scenario {}: invalid (see tessera simulate --help)",
                path.display()
            )
        })?;
        scenario
            .check()
            .with_context(|| format!("scenario {}", path.display()))?;
        Ok(scenario)
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.nodes.iter().all(|g| g.count == 0) {
            bail!("nodes: at least one node is needed");
        }
        if self.trace.sizes.is_empty() || self.trace.sizes.values().all(|w| *w == 0) {
            bail!("trace.sizes: give at least one size with a positive weight");
        }
        if let Some(size) = self.trace.sizes.keys().find(|s| **s == 0 || **s > 32) {
            bail!("trace.sizes: {size} GPUs per claim is outside 1..=32");
        }
        if let Some(sharing) = &self.sharing {
            sharing.check()?;
        }
        if self.trace.lifetime.min > self.trace.lifetime.max {
            bail!(
                "trace.lifetime: min {} is above max {}",
                self.trace.lifetime.min,
                self.trace.lifetime.max
            );
        }
        Ok(())
    }
}

/// SplitMix64: small, fast, and the same on every platform and release.
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

    /// A key of `weights` drawn with probability proportional to its weight (1 if all are 0).
    fn weighted(&mut self, weights: &BTreeMap<u32, u32>) -> u32 {
        let total: u64 = weights.values().map(|w| u64::from(*w)).sum();
        let mut pick = self.below(total);
        weights
            .iter()
            .find(|(_, w)| {
                let w = u64::from(**w);
                if pick < w {
                    true
                } else {
                    pick -= w;
                    false
                }
            })
            .map(|(key, _)| *key)
            .unwrap_or(1)
    }

    /// A lifetime drawn uniformly from `lifetime.min..=lifetime.max`.
    fn lifetime(&mut self, lifetime: &Lifetime) -> u64 {
        lifetime.min + self.below(lifetime.max - lifetime.min + 1)
    }
}

/// One claim of the trace: when it arrives (its index), how many GPUs, how long it stays.
#[derive(Debug, Clone, Copy)]
struct TraceClaim {
    gpus: u32,
    lifetime: u64,
}

fn trace(spec: &TraceSpec, seed: u64) -> Vec<TraceClaim> {
    draw_trace(spec.claims, &spec.sizes, &spec.lifetime, seed)
        .map(|(gpus, lifetime)| TraceClaim { gpus, lifetime })
        .collect()
}

/// A trace of `claims` arrivals from the generator seeded with `seed`: each a size drawn by
/// `weights` (GPUs, GiB, ...), then a lifetime in `lifetime`.
fn draw_trace(
    claims: usize,
    weights: &BTreeMap<u32, u32>,
    lifetime: &Lifetime,
    seed: u64,
) -> impl Iterator<Item = (u32, u64)> {
    let mut rng = Rng(seed);
    (0..claims).map(move |_| {
        let size = rng.weighted(weights);
        (size, rng.lifetime(lifetime))
    })
}

/// The synthetic cluster: rendered slices, the class, and what the metrics need per GPU.
struct Cluster {
    inventory: DeviceIndex,
    gpus: Vec<DeviceId>,
    islands: HashMap<(String, String), Option<String>>,
    /// `(pool, device)` → its NUMA node, for every GPU.
    numa: HashMap<(String, String), i64>,
}

fn cluster(scenario: &SimulationScenario) -> anyhow::Result<Cluster> {
    cluster_with(scenario, ConsumableShares::Disabled)
}

/// The cluster with every node's devices published in consumable-shares mode `shares`.
fn cluster_with(
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

/// What one mode achieved.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModeMetrics {
    pub claims: usize,
    pub allocated: usize,
    pub nvlink_local_percent: f64,
    pub mean_comm_cost: f64,
    pub rejected_while_free: usize,
    pub numa_aligned_percent: f64,
    pub p50_latency_micros: u64,
    pub p99_latency_micros: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    first_fit: ModeMetrics,
    topology_aware: ModeMetrics,
}

fn claim(index: usize, gpus: u32) -> ResourceClaim {
    synthetic::device_claim(
        "simulate",
        &format!("claim-{index}"),
        &format!("sim-{index}"),
        GPU_DEVICE_CLASS,
        i64::from(gpus),
    )
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The running state of one mode over the trace.
struct Run<'c> {
    cluster: &'c Cluster,
    live: LiveClaims<()>,
    allocated: usize,
    rejected_while_free: usize,
    multi: usize,
    local: usize,
    pair_cost_sum: f64,
    /// Claims of 2-4 GPUs allocated while one NUMA node somewhere had that many free ...
    alignable: usize,
    /// ... and of those, the ones placed on one NUMA node.
    aligned: usize,
    latencies: Vec<u64>,
}

impl Run<'_> {
    /// Whether some NUMA node of the cluster has `gpus` GPUs free.
    fn numa_has_free(&self, gpus: u32) -> bool {
        let mut free: HashMap<(&str, i64), u32> = HashMap::new();
        for gpu in &self.cluster.gpus {
            if self.live.state.is_in_use(gpu) {
                continue;
            }
            let key = (gpu.pool().to_owned(), gpu.device().to_owned());
            if let Some(&node) = self.cluster.numa.get(&key) {
                let count = free.entry((gpu.pool(), node)).or_default();
                *count += 1;
                if *count >= gpus {
                    return true;
                }
            }
        }
        false
    }

    fn allocated(
        &mut self,
        index: usize,
        tc: TraceClaim,
        a: Allocation,
        alignable: bool,
    ) -> anyhow::Result<()> {
        self.allocated += 1;
        let result = a
            .claims
            .into_iter()
            .next()
            .map(|c| c.result)
            .unwrap_or_default();
        if alignable {
            self.alignable += 1;
            self.aligned += usize::from(one_numa_node(self.cluster, &result));
        }
        if tc.gpus >= 2 {
            let n = f64::from(tc.gpus);
            self.multi += 1;
            self.pair_cost_sum += a.score.comm_cost as f64 / (n * (n - 1.0) / 2.0);
            self.local += usize::from(one_island(self.cluster, &result));
        }
        self.live.arrive(index, tc.lifetime, result, ())
    }

    fn rejected(&mut self, tc: TraceClaim) {
        let free = self
            .cluster
            .gpus
            .iter()
            .filter(|g| !self.live.state.is_in_use(g))
            .count();
        if free >= tc.gpus as usize {
            self.rejected_while_free += 1;
        }
    }

    fn metrics(mut self, claims: usize) -> ModeMetrics {
        self.latencies.sort_unstable();
        let ratio = |part: f64, whole: usize| {
            if whole == 0 {
                0.0
            } else {
                round2(part / whole as f64)
            }
        };
        ModeMetrics {
            claims,
            allocated: self.allocated,
            nvlink_local_percent: ratio(100.0 * self.local as f64, self.multi),
            mean_comm_cost: ratio(self.pair_cost_sum, self.multi),
            rejected_while_free: self.rejected_while_free,
            numa_aligned_percent: ratio(100.0 * self.aligned as f64, self.alignable),
            p50_latency_micros: percentile(&self.latencies, 50.0),
            p99_latency_micros: percentile(&self.latencies, 99.0),
        }
    }
}

fn run_mode(
    cluster: &Cluster,
    trace: &[TraceClaim],
    mode: PlacementMode,
    numa: tessera_allocator::NumaPolicy,
) -> anyhow::Result<ModeMetrics> {
    let options = AllocateOptions {
        mode,
        explain: false,
        numa,
        ..AllocateOptions::default()
    };
    let mut run = Run {
        cluster,
        live: LiveClaims::new(),
        allocated: 0,
        rejected_while_free: 0,
        multi: 0,
        local: 0,
        pair_cost_sum: 0.0,
        alignable: 0,
        aligned: 0,
        latencies: Vec::with_capacity(trace.len()),
    };
    for (index, tc) in trace.iter().enumerate() {
        run.live.depart(index as u64, |()| {})?;
        let claims = [claim(index, tc.gpus)];
        let alignable = (2..=4).contains(&tc.gpus) && run.numa_has_free(tc.gpus);
        let start = Instant::now();
        let outcome = cluster
            .inventory
            .allocate(&claims, &run.live.state, None, &options)?;
        run.latencies
            .push(u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX));
        match outcome {
            Outcome::Allocated(a) => run.allocated(index, *tc, a, alignable)?,
            Outcome::Unsatisfiable(_) => run.rejected(*tc),
        }
    }
    Ok(run.metrics(trace.len()))
}

fn one_numa_node(cluster: &Cluster, result: &AllocationResult) -> bool {
    let results = result
        .devices
        .as_ref()
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let nodes: std::collections::BTreeSet<(&str, Option<&i64>)> = results
        .iter()
        .map(|r| {
            (
                r.pool.as_str(),
                cluster.numa.get(&(r.pool.clone(), r.device.clone())),
            )
        })
        .collect();
    nodes.len() == 1 && nodes.iter().all(|(_, n)| n.is_some())
}

fn one_island(cluster: &Cluster, result: &AllocationResult) -> bool {
    let results = result
        .devices
        .as_ref()
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let island = |r: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult| {
        cluster
            .islands
            .get(&(r.pool.clone(), r.device.clone()))
            .cloned()
            .flatten()
    };
    let first = results.first().and_then(island);
    first.is_some() && results.iter().all(|r| island(r) == first)
}

/// `--gang-pod-gpus`: `N` or `N:WEIGHT,...` with N in 1..=8 and positive weights.
fn parse_pod_gpus(text: &str) -> Result<BTreeMap<u32, u32>, String> {
    let mut sizes = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (gpus, weight) = item.split_once(':').unwrap_or((item, "1"));
        let gpus: u32 = gpus
            .trim()
            .parse()
            .ok()
            .filter(|g| (1..=8).contains(g))
            .ok_or_else(|| format!("`{item}`: GPUs per pod must be 1 to 8 (a node's GPUs)"))?;
        let weight: u32 = weight
            .trim()
            .parse()
            .ok()
            .filter(|w| *w > 0)
            .ok_or_else(|| format!("`{item}`: the weight after `:` must be a positive integer"))?;
        sizes.insert(gpus, weight);
    }
    if sizes.is_empty() {
        return Err("expected `N` or `N:WEIGHT,...`, e.g. `4` or `2:30,4:40,8:30`".to_owned());
    }
    Ok(sizes)
}

pub fn run(args: &SimulateArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let scenario = if args.scenario == "default" {
        SimulationScenario::default_scenario()
    } else {
        SimulationScenario::load(Path::new(&args.scenario))?
    };
    if args.gangs {
        let scenario = gangs::GangScenario {
            gangs: args.gang_count,
            gpus_per_pod: args.gang_pod_gpus.clone(),
            numa: args.numa_policy,
            ..gangs::GangScenario::default()
        };
        let report = gangs::run(&scenario, args.seed)?;
        match args.output.format {
            OutputFormat::Json => {
                serde_json::to_writer_pretty(&mut *out, &report)?;
                writeln!(out)?;
            }
            OutputFormat::Text => gangs::write_table(out, &scenario, args.seed, &report)?,
        }
        return Ok(());
    }
    if args.sharing {
        return sharing::run(&scenario, args.seed, args.output.json(), out);
    }
    let cluster = cluster(&scenario)?;
    let trace = trace(&scenario.trace, args.seed);
    let report = Report {
        first_fit: run_mode(&cluster, &trace, PlacementMode::FirstFit, args.numa_policy)?,
        topology_aware: run_mode(
            &cluster,
            &trace,
            PlacementMode::TopologyAware,
            args.numa_policy,
        )?,
    };
    match args.output.format {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &report)?;
            writeln!(out)?;
        }
        OutputFormat::Text => {
            let nodes: usize = scenario.nodes.iter().map(|g| g.count).sum();
            writeln!(
                out,
                "{nodes} nodes, {} GPUs, {} claims (seed {})\n",
                cluster.gpus.len(),
                trace.len(),
                args.seed
            )?;
            write_table(out, &report)?;
        }
    }
    Ok(())
}

fn write_table(out: &mut impl Write, report: &Report) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<22} {:>12} {:>15}",
        "METRIC", "FIRST-FIT", "TOPOLOGY-AWARE"
    )?;
    let row = |m: &ModeMetrics| -> [String; 8] {
        [
            m.claims.to_string(),
            m.allocated.to_string(),
            m.nvlink_local_percent.to_string(),
            m.mean_comm_cost.to_string(),
            m.rejected_while_free.to_string(),
            m.numa_aligned_percent.to_string(),
            m.p50_latency_micros.to_string(),
            m.p99_latency_micros.to_string(),
        ]
    };
    let names = [
        "claims",
        "allocated",
        "nvlinkLocalPercent",
        "meanCommCost",
        "rejectedWhileFree",
        "numaAlignedPercent",
        "p50LatencyMicros",
        "p99LatencyMicros",
    ];
    let (f, t) = (row(&report.first_fit), row(&report.topology_aware));
    for ((name, a), b) in names.iter().zip(&f).zip(&t) {
        writeln!(out, "{name:<22} {a:>12} {b:>15}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gang_pod_sizes_parse_with_weights_and_refuse_what_no_node_holds() {
        assert_eq!(parse_pod_gpus("4"), Ok([(4, 1)].into()));
        assert_eq!(
            parse_pod_gpus(" 2:30, 4:40,8:30 "),
            Ok([(2, 30), (4, 40), (8, 30)].into())
        );
        for (bad, says) in [
            ("9", "1 to 8"),
            ("0", "1 to 8"),
            ("4:0", "positive"),
            ("4:x", "positive"),
            ("", "expected"),
        ] {
            let error = parse_pod_gpus(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn traces_are_deterministic_and_follow_the_weights() {
        let spec = SimulationScenario::default_scenario().trace;
        let a = trace(&spec, 7);
        let b = trace(&spec, 7);
        assert_eq!(a.len(), 3000);
        assert!(
            a.iter()
                .zip(&b)
                .all(|(x, y)| x.gpus == y.gpus && x.lifetime == y.lifetime)
        );
        let ones = a.iter().filter(|c| c.gpus == 1).count();
        assert!((1000..1400).contains(&ones), "weight 40% of 3000: {ones}");
        assert!(a.iter().all(|c| (1..=480).contains(&c.lifetime)));
        assert_ne!(
            trace(&spec, 8).iter().map(|c| c.gpus).collect::<Vec<_>>(),
            a.iter().map(|c| c.gpus).collect::<Vec<_>>()
        );
    }

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn bad_scenarios_are_refused_with_the_field() {
        let mut s = SimulationScenario::default_scenario();
        s.trace.sizes = [(64, 1)].into();
        assert!(
            s.check()
                .unwrap_err()
                .to_string()
                .contains("trace.sizes: 64 GPUs")
        );
        let mut s = SimulationScenario::default_scenario();
        s.trace.lifetime = Lifetime { min: 5, max: 1 };
        assert!(
            s.check()
                .unwrap_err()
                .to_string()
                .contains("trace.lifetime")
        );
    }
}
