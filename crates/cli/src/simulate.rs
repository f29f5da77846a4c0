//! `tessera simulate`: placement quality of first fit and topology-aware allocation on a synthetic
//! cluster (nodes rendered from shipped or custom topologies) under a trace of GPU claims arriving
//! and departing. Its other traces live in submodules: `gangs` (`--gangs`: gangs placed by the
//! controller's group decision and by per-pod first fit), `sharing` (`--sharing`: GPUs saved by
//! consumable shares) and `tenants` (`--tenants`: production and scavenger batch by priority,
//! with and without preemption).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use k8s_openapi::api::resource::v1::AllocationResult;
use serde::Serialize;
use tessera_allocator::{AllocateOptions, Allocation, Outcome, PlacementMode};

mod cluster;
mod live;
mod scenario;
mod stats;
mod trace;

mod gangs;
mod imex;
mod sharing;
mod tenants;

use cluster::{Cluster, cluster};
use live::LiveClaims;
use scenario::{SimulationScenario, TraceSpec};
use stats::{percentile, round2};
use trace::{claim, draw_trace};

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
gpusHeldByIncomplete. See docs/benchmarks.md, section Gangs. With --imex-racks N the gang trace \
runs on N GB200 NVL72 racks (18 trays of 4 GPUs, one fabric clique each) and every gang asks for \
one IMEX domain; the imex metrics add domainsStarted, inChannelCliquePercent, peakChannelsInUse, \
peakChannelsInOneClique, channelsUsed, gangsThatWaited and channelsHeldByIncomplete (docs/benchmarks.md, \
section IMEX domains on GB200 racks).

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
    lifetime: {min: 1, max: 480}

With --tenants it runs a multi-tenant trace on the gang trace's cluster: production inference \
(single GPUs) and production training gangs (4-GPU pods) of priority 1000, and a scavenger batch \
Deployment (single GPUs, priority -10, never preempting) asking for more GPUs than are idle, one \
step a minute (--tenant-minutes, a day by default). It is placed three ways: the controller \
model with preemption, without it, and per-pod first fit (priority order, no gangs, no \
preemption for devices). Metrics per mode: productionWaitP50/P99 (minutes from arrival to \
running; work still waiting at the end counts what it waited), inference and gang p99, \
gpuUtilizationPercent (GPUs held by pods of running work, mean after the first hour), \
preemptions (plans), victims, gpuHoursEvicted (GPUs x time the victims had run), \
gangsOneCliquePercent, gangsOneRackPercent, batchCompleted. All are deterministic for a seed. See \
docs/benchmarks.md, section Priorities and preemption.";

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

    /// Run the multi-tenant trace instead: production inference and training gangs (priority
    /// 1000) and scavenger batch (priority -10, never preempting) sharing the gang trace's
    /// cluster for a day, placed by the controller with preemption, without it, and by per-pod
    /// first fit.
    #[arg(long, env = "TESSERA_TENANTS", conflicts_with_all = ["gangs", "sharing"])]
    pub tenants: bool,

    /// Minutes the multi-tenant trace lasts (one step each).
    #[arg(
        long,
        env = "TESSERA_TENANT_MINUTES",
        default_value_t = 1440,
        requires = "tenants"
    )]
    pub tenant_minutes: u64,

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

    /// Run the gang trace on this many GB200 NVL72 racks instead (18 trays of 4 GPUs each, one
    /// fabric clique per rack, no dgx-h100 nodes), every gang asking for one IMEX domain: its
    /// pods share a claim of class imex.gpu.tessera.dev.
    #[arg(long, env = "TESSERA_IMEX_RACKS", requires = "gangs")]
    pub imex_racks: Option<usize>,

    /// IMEX channels each clique publishes in the `--imex-racks` trace (the controller's
    /// `--imex-channels`).
    #[arg(
        long,
        env = "TESSERA_IMEX_CHANNELS",
        default_value_t = tessera_api::imex::DEFAULT_CHANNELS,
        requires = "imex_racks"
    )]
    pub imex_channels: u32,

    /// Topology-aware placement's NUMA policy, as the controller's `--numa-policy`: `align` (a
    /// claim that fits one NUMA node gets one) or `pack` (partly used nodes first).
    #[arg(long, env = "TESSERA_NUMA_POLICY", default_value = "align")]
    pub numa_policy: tessera_allocator::NumaPolicy,
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
    if args.tenants {
        let scenario = tenants::TenantScenario {
            steps: args.tenant_minutes,
            ..tenants::TenantScenario::default()
        };
        let report = tenants::run(&scenario, args.seed)?;
        match args.output.format {
            OutputFormat::Json => {
                serde_json::to_writer_pretty(&mut *out, &report)?;
                writeln!(out)?;
            }
            OutputFormat::Text => tenants::write_table(out, &scenario, args.seed, &report)?,
        }
        return Ok(());
    }
    if args.gangs {
        let mut scenario = gangs::GangScenario {
            gangs: args.gang_count,
            gpus_per_pod: args.gang_pod_gpus.clone(),
            numa: args.numa_policy,
            ..gangs::GangScenario::default()
        };
        if let Some(racks) = args.imex_racks {
            scenario.racks = 0;
            scenario.nodes_per_rack = 0;
            scenario.cliques = racks;
            scenario.trays_per_clique = imex::TRAYS_PER_RACK;
            scenario.imex_channels = Some(args.imex_channels);
        }
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
}
