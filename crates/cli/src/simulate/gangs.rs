//! `tessera simulate --gangs`: gangs (groups of pods that must start together) on a synthetic
//! cluster with racks and GB200 fabric cliques, placed once by the controller's group decision
//! (`tessera_placement::group::decide_group`: all or nothing, one clique / rack first) and once
//! per pod with first fit (what kube-scheduler does for pods that are not a gang: each pod takes
//! the first node that fits, a gang runs when its last pod is placed, and placed pods hold their
//! GPUs while the rest wait).
//!
//! One gang arrives per step; every step, departures first, then each waiting gang in arrival
//! order is tried. Metrics per mode: gangs started, share started within one fabric clique (of
//! those on clique nodes) and within one rack, gangs rejected while capacity existed, mean wait in
//! steps, GPUs held by incomplete gangs at the end.
//!
//! **Rejected while capacity existed** counts the gangs that, at some step, were tried and did not
//! start although the cluster could have run them then: counting only the GPUs that running gangs
//! hold as taken, the nodes had room for every pod of the gang, whole pods per node
//! (`sum over nodes of floor(free GPUs / GPUs per pod) >= pods`; every pod asks that many devices
//! of the one GPU class, with no other constraint, so this count is exact). GPUs that a partly
//! placed gang holds (per-pod first fit keeps them) are capacity that existed: no pod runs on
//! them. Free GPUs that cannot hold a whole pod (a GB200 tray's 4 for an 8-GPU pod, 2 left on a
//! node for a 4-GPU pod) are not.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodSchedulingGate, PodSpec};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use tessera_allocator::{
    AllocateOptions, AllocatedState, DeviceIndex, Outcome, PlacementMode, selector_matches,
};
use tessera_api::names::{RACK_LABEL, TOPOLOGY_AWARE_GATE};
use tessera_gpu_inventory::{
    DeviceSource, HOSTNAME_LABEL, MockSource, RenderOptions, render_slices,
};
use tessera_placement::claims::tolerating_managed_taint;
use tessera_placement::group::{
    GroupInput, GroupKey, GroupOutcome, GroupSettings, GroupSource, Member, decide_group,
};
use tessera_placement::imex::is_domain_claim;
use tessera_placement::nodes::NodeFacts;
use tessera_placement::planner::Action;
use tessera_placement::resolve::PodClaim;
use tessera_placement::synthetic::{self, gpu_node};
use tessera_placement::view::{ClusterSnapshot, PodContext, Settings};

use super::imex::{ChannelBook, ImexMetrics, channel_of};
use super::stats::round2;
use super::trace::{Lifetime, Rng, claim};

/// The default gang scenario: 64 dgx-h100 nodes in 8 racks of 8, and 36 GB200 trays (4 GPUs) in
/// 2 fabric cliques of 18 (one rack each); 400 gangs of 2/4/8/16 pods × 4 GPUs (weights
/// 40/30/20/10) living 5-120 arrivals.
pub struct GangScenario {
    pub racks: usize,
    pub nodes_per_rack: usize,
    pub cliques: usize,
    pub trays_per_clique: usize,
    pub gangs: usize,
    pub pods: BTreeMap<u32, u32>,
    /// GPUs per pod: relative weight, drawn once per gang (every pod of a gang asks the same).
    pub gpus_per_pod: BTreeMap<u32, u32>,
    pub lifetime: Lifetime,
    /// The controller's NUMA policy (`--numa-policy`).
    pub numa: tessera_allocator::NumaPolicy,
    /// `Some(channels)`: every gang asks for one IMEX domain (its pods share one claim of class
    /// `imex.gpu.tessera.dev`), and each fabric clique publishes that many channels.
    pub imex_channels: Option<u32>,
}

impl Default for GangScenario {
    fn default() -> GangScenario {
        GangScenario {
            racks: 8,
            nodes_per_rack: 8,
            cliques: 2,
            trays_per_clique: 18,
            gangs: 400,
            pods: [(2, 40), (4, 30), (8, 20), (16, 10)].into(),
            gpus_per_pod: [(4, 1)].into(),
            lifetime: Lifetime { min: 5, max: 120 },
            numa: tessera_allocator::NumaPolicy::Align,
            imex_channels: None,
        }
    }
}

/// What one mode achieved.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GangMetrics {
    pub gangs: usize,
    pub started: usize,
    /// Of the gangs started on GB200 trays, percent within one fabric clique.
    pub one_clique_percent: f64,
    /// Of the gangs started, percent within one rack.
    pub one_rack_percent: f64,
    /// Gangs that did not start at some step although the GPUs not held by running gangs had
    /// room for every pod of them (whole pods per node).
    pub rejected_while_capacity: usize,
    /// Mean steps from arrival to start, over the gangs started.
    pub mean_wait: f64,
    /// GPUs held at the end by gangs that never completed.
    pub gpus_held_by_incomplete: usize,
    /// With IMEX domains: what the domains got.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imex: Option<ImexMetrics>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GangReport {
    pub per_pod_first_fit: GangMetrics,
    pub controller: GangMetrics,
}

pub(super) struct Cluster {
    pub(super) view: ClusterSnapshot,
    /// clique → its channels (with IMEX domains).
    pub(super) channels: BTreeMap<String, u32>,
    /// node → (rack, clique).
    pub(super) domains: HashMap<String, (String, Option<String>)>,
    /// node → its GPUs (the devices of the GPU class that every claim asks for).
    pub(super) capacity: BTreeMap<String, usize>,
}

/// The gang scenario's cluster: racks of dgx-h100 nodes and GB200 fabric cliques (also the
/// tenants trace's).
pub(super) fn cluster(s: &GangScenario) -> anyhow::Result<Cluster> {
    let mut slices: Vec<ResourceSlice> = Vec::new();
    let mut nodes = Vec::new();
    let mut domains = HashMap::new();
    let mut capacity = BTreeMap::new();
    let mut channels = BTreeMap::new();
    let dgx = MockSource::new("dgx-h100")
        .and_then(|m| m.inventory())
        .context("topology dgx-h100")?;
    for r in 0..s.racks {
        for i in 0..s.nodes_per_rack {
            let name = format!("dgx-{r:02}-{i:02}");
            let rack = format!("rack-{r:02}");
            let options = RenderOptions {
                topology_managed: true,
                ..RenderOptions::new(name.clone())
            };
            slices.extend(render_slices(&dgx, &options).context("render dgx-h100")?);
            capacity.insert(name.clone(), dgx.gpus.len());
            nodes.push(gpu_node(&name, [(RACK_LABEL, rack.clone())]));
            domains.insert(name, (rack, None));
        }
    }
    let mut tray = MockSource::new("gb200-tray")
        .and_then(|m| m.inventory())
        .context("topology gb200-tray")?;
    for c in 0..s.cliques {
        let clique_id = u32::try_from(c + 1).unwrap_or(u32::MAX);
        let mut clique = None;
        let mut trays = Vec::new();
        for gpu in &mut tray.gpus {
            if let Some(f) = gpu.fabric.as_mut() {
                f.clique_id = clique_id;
                clique = Some(format!("{}.{}", f.cluster_uuid, f.clique_id));
            }
        }
        for i in 0..s.trays_per_clique {
            let name = format!("gb200-{c:02}-{i:02}");
            let rack = format!("nvl-{c:02}");
            let options = RenderOptions {
                topology_managed: true,
                ..RenderOptions::new(name.clone())
            };
            slices.extend(render_slices(&tray, &options).context("render gb200-tray")?);
            capacity.insert(name.clone(), tray.gpus.len());
            nodes.push(gpu_node(
                &name,
                [(RACK_LABEL, rack.clone()), (HOSTNAME_LABEL, name.clone())],
            ));
            domains.insert(name.clone(), (rack, clique.clone()));
            trays.push(name);
        }
        if let (Some(n), Some(clique)) = (s.imex_channels, clique.filter(|_| !trays.is_empty())) {
            slices.extend(super::imex::channel_slices(&clique, trays, n)?);
            channels.insert(clique, n);
        }
    }
    let facts = nodes.iter().map(NodeFacts::from).collect();
    let mut classes = vec![synthetic::gpu_class()];
    if s.imex_channels.is_some() {
        classes.push(synthetic::imex_class());
    }
    Ok(Cluster {
        view: ClusterSnapshot::new(slices, classes, facts),
        channels,
        domains,
        capacity,
    })
}

/// One gang of the trace.
struct Gang {
    /// GPUs each pod asks for.
    gpus: u32,
    pods: Vec<Pod>,
    claims: Vec<Arc<ResourceClaim>>,
    /// The IMEX domain its pods share, if it asks for one.
    domain: Option<Arc<ResourceClaim>>,
    lifetime: u64,
}

fn trace(s: &GangScenario, seed: u64) -> Vec<Gang> {
    let mut rng = Rng(seed);
    let mut index = 0;
    (0..s.gangs)
        .map(|g| {
            let size = rng.weighted(&s.pods);
            let lifetime = rng.lifetime(&s.lifetime);
            // One size: no draw, so the default trace stays what it was.
            let gpus = match s.gpus_per_pod.keys().collect::<Vec<_>>()[..] {
                [only] => *only,
                _ => rng.weighted(&s.gpus_per_pod),
            };
            let mut pods = Vec::new();
            let mut claims = Vec::new();
            let domain = s.imex_channels.map(|_| super::imex::domain_claim(g));
            let domain_name = domain.as_ref().and_then(|d| d.metadata.name.as_deref());
            for p in 0..size {
                let c = claim(index, gpus);
                index += 1;
                let name = c.metadata.name.as_deref().unwrap_or_default();
                pods.push(pod(g, p, name, domain_name));
                claims.push(Arc::new(tolerating_managed_taint(&c)));
            }
            Gang {
                gpus,
                pods,
                claims,
                domain: domain.map(|d| Arc::new(tolerating_managed_taint(&d))),
                lifetime,
            }
        })
        .collect()
}

fn pod(gang: usize, index: u32, claim: &str, domain: Option<&str>) -> Pod {
    let domain = domain.map(|d| PodResourceClaim {
        name: "domain".into(),
        resource_claim_name: Some(d.into()),
        ..Default::default()
    });
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("gang-{gang}-{index}")),
            namespace: Some("simulate".into()),
            uid: Some(format!("gang-{gang}-{index}")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            scheduling_gates: Some(vec![PodSchedulingGate {
                name: TOPOLOGY_AWARE_GATE.into(),
            }]),
            resource_claims: Some(
                std::iter::once(PodResourceClaim {
                    name: "gpus".into(),
                    resource_claim_name: Some(claim.into()),
                    ..Default::default()
                })
                .chain(domain)
                .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

/// Where a gang's pods went, and what they hold.
#[derive(Default)]
struct Placed {
    /// Per pod: its node and the GPUs its claim holds there.
    pods: Vec<(String, usize)>,
    allocations: Vec<AllocationResult>,
    /// The domain's allocation (also in `allocations`), once made.
    domain: Option<AllocationResult>,
}

/// Devices an allocation holds.
fn devices(allocation: &AllocationResult) -> usize {
    allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .map_or(0, Vec::len)
}

/// One mode's running state.
struct Run<'c> {
    cluster: &'c Cluster,
    state: AllocatedState,
    /// Per gang: pods placed so far (per-pod first fit keeps partial gangs).
    partial: HashMap<usize, Placed>,
    /// Gang → step it ends.
    running: BTreeMap<usize, u64>,
    /// Node → GPUs held by running gangs.
    running_on: HashMap<String, usize>,
    started: Vec<(usize, u64)>,
    rejected_while_capacity: BTreeSet<usize>,
    clique_started: usize,
    clique_local: usize,
    rack_local: usize,
    /// The channels the domains hold.
    channels: ChannelBook,
    /// Gangs that were tried and did not start at some step.
    waited: BTreeSet<usize>,
    /// Gangs started with every pod in their channel's clique.
    in_channel_clique: usize,
}

impl<'c> Run<'c> {
    fn new(cluster: &'c Cluster) -> Run<'c> {
        Run {
            cluster,
            state: AllocatedState::new(),
            partial: HashMap::new(),
            running: BTreeMap::new(),
            running_on: HashMap::new(),
            started: Vec::new(),
            rejected_while_capacity: BTreeSet::new(),
            clique_started: 0,
            clique_local: 0,
            rack_local: 0,
            channels: ChannelBook::default(),
            waited: BTreeSet::new(),
            in_channel_clique: 0,
        }
    }

    fn hold(&mut self, allocation: &AllocationResult) -> anyhow::Result<()> {
        self.state.add_allocation(allocation)?;
        Ok(())
    }

    /// Holds gang `g`'s domain allocation: its channel, which no other live gang may hold.
    fn hold_domain(
        &mut self,
        g: usize,
        placed: &mut Placed,
        allocation: AllocationResult,
    ) -> anyhow::Result<()> {
        let channel = channel_of(&allocation).context("a domain allocated no channel")?;
        self.channels.hold(channel, g)?;
        self.hold(&allocation)?;
        placed.allocations.push(allocation.clone());
        placed.domain = Some(allocation);
        Ok(())
    }

    /// Whether the cluster could run `gang` now: the GPUs that running gangs do not hold have
    /// room for all its pods, whole pods per node. Partly placed gangs hold nothing here. A gang
    /// with an IMEX domain needs that room in one clique, and a channel there that no running
    /// gang holds.
    fn could_run(&self, gang: &Gang) -> bool {
        let per_pod = (gang.gpus as usize).max(1);
        let room = |node: &String, gpus: &usize| {
            gpus.saturating_sub(self.running_on.get(node).copied().unwrap_or(0)) / per_pod
        };
        if gang.domain.is_none() {
            let room: usize = self.cluster.capacity.iter().map(|(n, g)| room(n, g)).sum();
            return room >= gang.pods.len();
        }
        let mut by_clique: BTreeMap<&str, usize> = BTreeMap::new();
        for (node, gpus) in &self.cluster.capacity {
            if let Some(clique) = self.cluster.domains.get(node).and_then(|d| d.1.as_deref()) {
                *by_clique.entry(clique).or_default() += room(node, gpus);
            }
        }
        by_clique.into_iter().any(|(clique, room)| {
            let channels = self.cluster.channels.get(clique).copied().unwrap_or(0) as usize;
            let held = self
                .channels
                .held_in(clique, |g| self.running.contains_key(&g));
            room >= gang.pods.len() && held < channels
        })
    }

    fn depart(&mut self, now: u64) -> anyhow::Result<()> {
        let ended: Vec<usize> = self
            .running
            .iter()
            .filter(|(_, end)| **end <= now)
            .map(|(g, _)| *g)
            .collect();
        for g in ended {
            self.running.remove(&g);
            self.channels.release(g);
            if let Some(placed) = self.partial.remove(&g) {
                for a in &placed.allocations {
                    self.state.remove_allocation(a)?;
                }
                for (node, gpus) in &placed.pods {
                    if let Some(held) = self.running_on.get_mut(node) {
                        *held = held.saturating_sub(*gpus);
                    }
                }
            }
        }
        Ok(())
    }

    fn start(&mut self, g: usize, gang: &Gang, arrived: u64, now: u64) {
        self.running.insert(g, now + gang.lifetime);
        self.started.push((g, now - arrived));
        let Some(placed) = self.partial.get(&g) else {
            return;
        };
        for (node, gpus) in &placed.pods {
            *self.running_on.entry(node.clone()).or_default() += gpus;
        }
        let racks: BTreeSet<&String> = placed
            .pods
            .iter()
            .filter_map(|(n, _)| self.cluster.domains.get(n).map(|d| &d.0))
            .collect();
        if racks.len() == 1 {
            self.rack_local += 1;
        }
        if let Some((clique, _)) = placed.domain.as_ref().and_then(channel_of) {
            let inside = placed.pods.iter().all(|(n, _)| {
                self.cluster.domains.get(n).and_then(|d| d.1.as_deref()) == Some(clique.as_str())
            });
            self.in_channel_clique += usize::from(inside);
        }
        let cliques: Vec<Option<&String>> = placed
            .pods
            .iter()
            .map(|(n, _)| self.cluster.domains.get(n).and_then(|d| d.1.as_ref()))
            .collect();
        if cliques.iter().any(Option::is_some) {
            self.clique_started += 1;
            let distinct: BTreeSet<Option<&String>> = cliques.into_iter().collect();
            if distinct.len() == 1 {
                self.clique_local += 1;
            }
        }
    }

    fn metrics(&self, gangs: usize) -> GangMetrics {
        let percent = |a: usize, b: usize| {
            if b == 0 {
                0.0
            } else {
                round2(100.0 * a as f64 / b as f64)
            }
        };
        let waits: u64 = self.started.iter().map(|(_, w)| *w).sum();
        let held = self
            .partial
            .iter()
            .filter(|(g, _)| !self.running.contains_key(g))
            .flat_map(|(_, p)| &p.allocations)
            .map(devices)
            .sum();
        GangMetrics {
            gangs,
            started: self.started.len(),
            one_clique_percent: percent(self.clique_local, self.clique_started),
            one_rack_percent: percent(self.rack_local, self.started.len()),
            rejected_while_capacity: self.rejected_while_capacity.len(),
            mean_wait: if self.started.is_empty() {
                0.0
            } else {
                round2(waits as f64 / self.started.len() as f64)
            },
            gpus_held_by_incomplete: held,
            imex: (!self.cluster.channels.is_empty()).then(|| self.imex_metrics()),
        }
    }

    fn imex_metrics(&self) -> ImexMetrics {
        let incomplete = self
            .partial
            .iter()
            .filter(|(g, p)| !self.running.contains_key(g) && p.domain.is_some())
            .count();
        // Every gang that started began with its domain's channel.
        self.channels.metrics(
            self.started.len(),
            self.in_channel_clique,
            self.waited.len(),
            incomplete,
        )
    }
}

/// Per-pod first fit: each pod not placed yet takes the first node that fits; `true` when the
/// gang's last pod is placed.
fn first_fit(run: &mut Run<'_>, g: usize, gang: &Gang) -> anyhow::Result<bool> {
    let options = AllocateOptions {
        mode: PlacementMode::FirstFit,
        ..AllocateOptions::default()
    };
    let inventory: &DeviceIndex = &run.cluster.view.managed;
    let done = run.partial.get(&g).map_or(0, |p| p.pods.len());
    for claim in &gang.claims[done..] {
        let domain = run.partial.get(&g).and_then(|p| p.domain.clone());
        let outcome = match (&gang.domain, &domain) {
            // The first pod allocates the domain with its GPUs, on the first node that fits both.
            (Some(d), None) => {
                let claims = [(**claim).clone(), (**d).clone()];
                inventory.allocate(&claims, &run.state, None, &options)?
            }
            // Later pods: only nodes of the domain's channel's clique (its node selector).
            (Some(_), Some(allocated)) => inventory.allocate_among(
                std::slice::from_ref(&**claim),
                &run.state,
                |n| {
                    allocated
                        .node_selector
                        .as_ref()
                        .is_none_or(|s| selector_matches(s, n))
                },
                &options,
            )?,
            (None, _) => {
                inventory.allocate(std::slice::from_ref(&**claim), &run.state, None, &options)?
            }
        };
        let Outcome::Allocated(a) = outcome else {
            return Ok(false);
        };
        let mut results = a.claims.into_iter().map(|c| c.result);
        let gpus = results.next().context("one result per claim")?;
        run.hold(&gpus)?;
        let mut placed = run.partial.remove(&g).unwrap_or_default();
        placed.pods.push((a.node, devices(&gpus)));
        placed.allocations.push(gpus);
        let held = match results.next() {
            Some(domain) => run.hold_domain(g, &mut placed, domain),
            None => Ok(()),
        };
        run.partial.insert(g, placed);
        held?;
    }
    Ok(true)
}

/// The controller's group decision: all or nothing.
fn controller(
    run: &mut Run<'_>,
    g: usize,
    gang: &Gang,
    settings: &Settings,
) -> anyhow::Result<bool> {
    let claims: Vec<Vec<PodClaim>> = gang
        .claims
        .iter()
        .map(|c| {
            let gpus = PodClaim {
                pod_claim: "gpus".into(),
                claim: c.clone(),
            };
            let domain = gang.domain.as_ref().map(|d| PodClaim {
                pod_claim: "domain".into(),
                claim: d.clone(),
            });
            std::iter::once(gpus).chain(domain).collect()
        })
        .collect();
    let key = GroupKey {
        namespace: "simulate".into(),
        name: format!("gang-{g}"),
        source: GroupSource::Label,
    };
    let input = GroupInput {
        key: &key,
        min_count: u32::try_from(gang.pods.len()).unwrap_or(u32::MAX),
        placed: 0,
        members: gang
            .pods
            .iter()
            .zip(&claims)
            .map(|(pod, claims)| Member { pod, claims })
            .collect(),
        unresolved: 0,
        held: 0,
        domain_nodes: Default::default(),
    };
    let usage = HashMap::new();
    let unmanaged = Arc::new(DeviceIndex::new(Vec::new(), Vec::new(), Vec::new()));
    let unmanaged_fn = || unmanaged.clone();
    let context = PodContext {
        devices: &run.cluster.view,
        unmanaged: &unmanaged_fn,
        in_use: &run.state,
        usage: &usage,
    };
    let decision = decide_group(
        &input,
        &context,
        settings,
        &GroupSettings::default(),
        Timestamp::UNIX_EPOCH,
    );
    let GroupOutcome::Place { plans, .. } = decision.outcome else {
        return Ok(false);
    };
    let mut placed = Placed::default();
    for (_, d) in plans {
        if let Action::Place(p) = d.action {
            let mut gpus = 0;
            for w in p.writes {
                if is_domain_claim(&w.claim) {
                    run.hold_domain(g, &mut placed, w.allocation)?;
                    continue;
                }
                run.hold(&w.allocation)?;
                gpus += devices(&w.allocation);
                placed.allocations.push(w.allocation);
            }
            placed.pods.push((p.node, gpus));
        }
    }
    run.partial.insert(g, placed);
    Ok(true)
}

/// Runs both modes over the trace.
pub fn run(s: &GangScenario, seed: u64) -> anyhow::Result<GangReport> {
    let cluster = cluster(s)?;
    let gangs = trace(s, seed);
    let mut settings = Settings::new(TOPOLOGY_AWARE_GATE);
    settings.options.numa = s.numa;
    let mut report = Vec::new();
    for per_pod in [true, false] {
        let mut run = Run::new(&cluster);
        let mut waiting: Vec<(usize, u64)> = Vec::new();
        let steps = gangs.len() as u64 + s.lifetime.max;
        for now in 0..steps {
            run.depart(now)?;
            if let Some(g) = usize::try_from(now).ok().filter(|g| *g < gangs.len()) {
                waiting.push((g, now));
            }
            let mut still = Vec::new();
            for (g, arrived) in std::mem::take(&mut waiting) {
                let gang = &gangs[g];
                let started = if per_pod {
                    first_fit(&mut run, g, gang)?
                } else {
                    controller(&mut run, g, gang, &settings)?
                };
                if started {
                    run.start(g, gang, arrived, now);
                } else {
                    run.waited.insert(g);
                    if run.could_run(gang) {
                        run.rejected_while_capacity.insert(g);
                    }
                    still.push((g, arrived));
                }
            }
            waiting = still;
        }
        report.push(run.metrics(gangs.len()));
    }
    let controller = report.pop().context("two runs")?;
    let per_pod_first_fit = report.pop().context("two runs")?;
    Ok(GangReport {
        per_pod_first_fit,
        controller,
    })
}

/// The comparison as a table.
pub fn write_table(
    out: &mut impl std::io::Write,
    s: &GangScenario,
    seed: u64,
    report: &GangReport,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "{} dgx-h100 nodes in {} racks, {} GB200 trays in {} fabric cliques; {} gangs of {:?} pods × {:?} GPUs (seed {seed})\n",
        s.racks * s.nodes_per_rack,
        s.racks,
        s.cliques * s.trays_per_clique,
        s.cliques,
        s.gangs,
        s.pods.keys().collect::<Vec<_>>(),
        s.gpus_per_pod.keys().collect::<Vec<_>>()
    )?;
    writeln!(
        out,
        "| mode | started | one clique % | one rack % | rejected while capacity existed | mean wait | GPUs held by incomplete gangs |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|")?;
    for (name, m) in [
        ("per-pod first fit", &report.per_pod_first_fit),
        ("controller (group decision)", &report.controller),
    ] {
        writeln!(
            out,
            "| {name} | {} of {} | {} | {} | {} | {} | {} |",
            m.started,
            m.gangs,
            m.one_clique_percent,
            m.one_rack_percent,
            m.rejected_while_capacity,
            m.mean_wait,
            m.gpus_held_by_incomplete
        )?;
    }
    if let Some(channels) = s.imex_channels {
        super::imex::write_table(
            out,
            channels,
            [
                ("per-pod first fit", report.per_pod_first_fit.imex.as_ref()),
                (
                    "controller (group decision)",
                    report.controller.imex.as_ref(),
                ),
            ],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gang of `pods` pods × `gpus` GPUs, outside any trace.
    fn gang(pods: u32, gpus: u32) -> Gang {
        let claims: Vec<Arc<ResourceClaim>> = (0..pods as usize)
            .map(|i| Arc::new(claim(i, gpus)))
            .collect();
        Gang {
            gpus,
            pods: (0..pods).map(|p| pod(0, p, "c", None)).collect(),
            claims,
            domain: None,
            lifetime: 1,
        }
    }

    #[test]
    fn capacity_exists_only_for_whole_pods_and_includes_what_partial_gangs_hold() {
        // One dgx-h100 (8 GPUs) and two GB200 trays (4 each): 16 GPUs.
        let s = GangScenario {
            racks: 1,
            nodes_per_rack: 1,
            cliques: 1,
            trays_per_clique: 2,
            ..GangScenario::default()
        };
        let cluster = cluster(&s).unwrap();
        let mut run = Run::new(&cluster);
        // 16 GPUs free, but only the dgx holds an 8-GPU pod.
        assert!(!run.could_run(&gang(2, 8)));
        assert!(run.could_run(&gang(1, 8)));
        assert!(run.could_run(&gang(4, 4)));
        assert!(!run.could_run(&gang(5, 4)));
        // Gang 7 placed one pod on the first tray and waits for the rest: what it holds is
        // capacity that existed.
        run.partial.insert(
            7,
            Placed {
                pods: vec![("gb200-00-00".into(), 4)],
                allocations: Vec::new(),
                domain: None,
            },
        );
        assert!(run.could_run(&gang(4, 4)));
        // Once it runs, it is not.
        run.start(7, &gang(1, 4), 0, 0);
        assert!(!run.could_run(&gang(4, 4)));
        assert!(run.could_run(&gang(3, 4)));
        // It ends at step 1 (lifetime 1): the tray is free again.
        run.depart(1).unwrap();
        assert!(run.could_run(&gang(4, 4)));
    }

    /// The controller against per-pod first fit on a small cluster (8 dgx-h100 in 2 racks, 12
    /// GB200 trays in 2 cliques): no worse on any gang metric, ahead on locality and wait.
    fn assert_controller_ahead(gpus_per_pod: BTreeMap<u32, u32>) {
        let s = GangScenario {
            racks: 2,
            nodes_per_rack: 4,
            cliques: 2,
            trays_per_clique: 6,
            gangs: 40,
            pods: [(2, 40), (4, 30), (8, 20)].into(),
            gpus_per_pod,
            lifetime: Lifetime { min: 5, max: 30 },
            ..GangScenario::default()
        };
        let report = run(&s, 1).unwrap();
        let (ff, ctl) = (&report.per_pod_first_fit, &report.controller);
        let both = format!("first fit {ff:?}, controller {ctl:?}");
        assert!(ctl.started >= ff.started, "{both}");
        assert!(ctl.one_clique_percent > ff.one_clique_percent, "{both}");
        assert!(ctl.one_rack_percent > ff.one_rack_percent, "{both}");
        assert!(ctl.mean_wait < ff.mean_wait, "{both}");
        // First fit's partial gangs hold GPUs that could have run waiting gangs; the controller
        // waits only when no placement exists.
        assert!(
            ctl.rejected_while_capacity <= ff.rejected_while_capacity,
            "{both}"
        );
        assert!(ff.rejected_while_capacity > 0, "{both}");
        assert_eq!(ctl.rejected_while_capacity, 0, "{both}");
        assert_eq!(ctl.gpus_held_by_incomplete, 0, "{both}");
    }

    #[test]
    fn imex_domains_stay_in_their_channels_clique_and_the_controller_waits_only_without_room() {
        // 2 GB200 racks of 6 trays, 3 channels each: channels run out before trays do.
        let s = GangScenario {
            racks: 0,
            nodes_per_rack: 0,
            cliques: 2,
            trays_per_clique: 6,
            gangs: 24,
            pods: [(1, 30), (2, 40), (4, 30)].into(),
            gpus_per_pod: [(2, 1)].into(),
            lifetime: Lifetime { min: 3, max: 12 },
            imex_channels: Some(3),
            ..GangScenario::default()
        };
        let report = run(&s, 1).unwrap();
        let (ff, ctl) = (&report.per_pod_first_fit, &report.controller);
        let both = format!("first fit {ff:?}, controller {ctl:?}");
        for m in [ff, ctl] {
            let imex = m.imex.as_ref().expect("IMEX metrics");
            assert_eq!(imex.in_channel_clique_percent, 100.0, "{both}");
            assert!(imex.peak_channels_in_one_clique <= 3, "{both}");
            assert_eq!(m.one_clique_percent, 100.0, "{both}");
        }
        assert_eq!(ctl.rejected_while_capacity, 0, "{both}");
        assert_eq!(ctl.imex.as_ref().unwrap().channels_held_by_incomplete, 0);
        assert!(ctl.started >= ff.started, "{both}");
    }

    #[test]
    fn the_controller_is_ahead_of_per_pod_first_fit_with_4_gpu_pods() {
        assert_controller_ahead([(4, 1)].into());
    }

    #[test]
    fn the_controller_is_ahead_of_per_pod_first_fit_with_mixed_pod_sizes() {
        assert_controller_ahead([(2, 30), (4, 40), (8, 30)].into());
    }
}
