//! `tessera simulate --tenants`: one cluster shared by production inference (single GPUs, high
//! priority), production training gangs (high priority) and scavenger batch (a Deployment of
//! single-GPU pods of negative priority that never preempts, filling what is idle), over a day
//! of one-minute steps, run three ways: the controller with preemption, the controller without
//! it, and per-pod first fit (kube-scheduler: a priority queue, each pod on the first node that
//! fits, no gangs, no preemption for devices).
//!
//! Each step: workloads whose time is up finish; pods evicted the step before are gone (their
//! grace period is shorter than a step); new production work arrives; the placement runs;
//! a batch pod that finished or was evicted is replaced by a new one (the Deployment). Metrics
//! per mode: production wait (steps from arrival to running, all pods of a gang; work still
//! waiting at the end counts with the time it has waited), GPU utilization (GPUs held by pods of
//! work that runs, mean over the steps after the first hour), preemptions (plans), victims,
//! GPU-hours evicted (GPUs × time the victims had run), and production gangs within one fabric
//! clique (of those on GB200 trays) and one rack.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use anyhow::Context;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use tessera_allocator::{AllocateOptions, Outcome, PlacementMode};
use tessera_api::names::TOPOLOGY_AWARE_GATE;
use tessera_placement::claims::tolerating_managed_taint;
use tessera_placement::preemption::PreemptionSettings;
use tessera_placement::protocol::is_gated;
use tessera_placement::simulation::{ClusterModel, ControllerModel, Event, PodTemplate};
use tessera_placement::view::Settings;

use super::gangs::{GangScenario, cluster};
use super::stats::{percentile, round2};
use super::trace::{Lifetime, Rng};

/// Production priority (a PriorityClass of 1000).
const PRODUCTION: i32 = 1000;
/// Scavenger batch priority: below the default 0, and it never preempts.
const SCAVENGER: i32 = -10;
/// A step is a minute.
const STEP_SECONDS: i64 = 60;
/// Steps before utilization is sampled (the batch Deployment fills the cluster meanwhile).
const WARM_UP: u64 = 60;

/// The scenario.
#[derive(Clone, Debug)]
pub struct TenantScenario {
    /// The cluster: racks of dgx-h100 nodes and GB200 fabric cliques, as `--gangs` builds it.
    pub racks: usize,
    pub nodes_per_rack: usize,
    pub cliques: usize,
    pub trays_per_clique: usize,
    /// Minutes simulated.
    pub steps: u64,
    /// Inference pods (1 GPU) arriving per minute, on average.
    pub inference_per_step: f64,
    pub inference_lifetime: Lifetime,
    /// Minutes between training gangs, on average.
    pub gang_interval: u64,
    /// Pods per gang: relative weight.
    pub gang_pods: BTreeMap<u32, u32>,
    /// GPUs per gang pod.
    pub gang_gpus: u32,
    pub gang_lifetime: Lifetime,
    /// Replicas of the scavenger Deployment (1 GPU each).
    pub batch_replicas: usize,
    pub batch_lifetime: Lifetime,
}

impl Default for TenantScenario {
    /// 64 dgx-h100 in 8 racks and 36 GB200 trays in 2 cliques (656 GPUs); a day; about 1
    /// inference pod a minute living 1-4 hours; a gang of 2/4/8 pods × 4 GPUs every 30 minutes
    /// living 1-6 hours; 720 scavenger replicas living 30 minutes to 4 hours.
    fn default() -> TenantScenario {
        TenantScenario {
            racks: 8,
            nodes_per_rack: 8,
            cliques: 2,
            trays_per_clique: 18,
            steps: 1440,
            inference_per_step: 1.0,
            inference_lifetime: Lifetime { min: 60, max: 240 },
            gang_interval: 30,
            gang_pods: [(2, 50), (4, 35), (8, 15)].into(),
            gang_gpus: 4,
            gang_lifetime: Lifetime { min: 60, max: 360 },
            batch_replicas: 720,
            batch_lifetime: Lifetime { min: 30, max: 240 },
        }
    }
}

/// What one mode achieved.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantMetrics {
    /// Production workloads (inference pods and gangs) that arrived, and that ran.
    pub production: usize,
    pub production_started: usize,
    /// Minutes from arrival to running.
    pub production_wait_p50: u64,
    pub production_wait_p99: u64,
    pub inference_wait_p99: u64,
    pub gang_wait_p99: u64,
    /// Mean percent of the GPUs held by pods of running work, after the first hour.
    pub gpu_utilization_percent: f64,
    pub preemptions: usize,
    pub victims: usize,
    pub gpu_hours_evicted: f64,
    /// Of the production gangs started on GB200 trays, percent within one fabric clique.
    pub gangs_one_clique_percent: f64,
    /// Of the production gangs started, percent within one rack.
    pub gangs_one_rack_percent: f64,
    /// Scavenger pods that ran to completion.
    pub batch_completed: usize,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantReport {
    pub controller_with_preemption: TenantMetrics,
    pub controller_without_preemption: TenantMetrics,
    pub per_pod_first_fit: TenantMetrics,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Inference,
    Gang,
    Batch,
}

/// Production work of the trace: when it arrives, what it is.
#[derive(Clone, Debug)]
struct Arrival {
    step: u64,
    kind: Kind,
    pods: u32,
    gpus: u32,
    lifetime: u64,
}

/// The production trace (batch is a Deployment, replaced as it goes).
fn trace(s: &TenantScenario, seed: u64) -> Vec<Arrival> {
    let mut rng = Rng(seed);
    let mut arrivals = Vec::new();
    let whole = s.inference_per_step.floor() as u64;
    let fraction = ((s.inference_per_step - whole as f64) * 1000.0).round() as u64;
    for step in 0..s.steps {
        let extra = u64::from(rng.below(1000) < fraction);
        for _ in 0..whole + extra {
            arrivals.push(Arrival {
                step,
                kind: Kind::Inference,
                pods: 1,
                gpus: 1,
                lifetime: rng.lifetime(&s.inference_lifetime),
            });
        }
        if rng.below(s.gang_interval.max(1)) == 0 {
            arrivals.push(Arrival {
                step,
                kind: Kind::Gang,
                pods: rng.weighted(&s.gang_pods),
                gpus: s.gang_gpus,
                lifetime: rng.lifetime(&s.gang_lifetime),
            });
        }
    }
    arrivals
}

/// A workload in the cluster: its pods (UIDs), when it arrived and started.
struct Workload {
    kind: Kind,
    pods: Vec<String>,
    arrived: u64,
    lifetime: u64,
    started: Option<u64>,
    done: bool,
}

/// How pending pods are placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Controller { preemption: bool },
    PerPodFirstFit,
}

/// One mode's run.
struct Run<'g> {
    scenario: &'g TenantScenario,
    domains: &'g HashMap<String, (String, Option<String>)>,
    model: ClusterModel,
    controller: ControllerModel,
    mode: Mode,
    workloads: Vec<Workload>,
    of_pod: HashMap<String, usize>,
    names: usize,
    batch_rng: Rng,
    utilization: Vec<f64>,
    gpus: usize,
    gpu_seconds_evicted: f64,
    batch_completed: usize,
    events_seen: usize,
    /// Where each pod of started work ran.
    placed: HashMap<String, String>,
}

impl Run<'_> {
    fn create(&mut self, kind: Kind, pods: u32, gpus: u32, lifetime: u64, step: u64) {
        self.names += 1;
        let name = format!("w{}", self.names);
        let mut uids = Vec::new();
        for p in 0..pods {
            let (priority, never) = match kind {
                Kind::Batch => (SCAVENGER, true),
                _ => (PRODUCTION, false),
            };
            let mut t = PodTemplate::new(&format!("{name}-{p}"), priority, gpus);
            t.never_preempts = never;
            if kind == Kind::Gang {
                t.group = Some((name.clone(), pods));
            }
            uids.push(self.model.create(&t));
        }
        for uid in &uids {
            self.of_pod.insert(uid.clone(), self.workloads.len());
        }
        self.workloads.push(Workload {
            kind,
            pods: uids,
            arrived: step,
            lifetime,
            started: None,
            done: false,
        });
    }

    fn new_batch(&mut self, step: u64) {
        let lifetime = self.batch_rng.lifetime(&self.scenario.batch_lifetime);
        self.create(Kind::Batch, 1, 1, lifetime, step);
    }

    /// Work whose time is up finishes (its pods and claims go); a batch pod is replaced.
    fn finish(&mut self, step: u64) {
        let ended: Vec<usize> = (0..self.workloads.len())
            .filter(|&w| {
                let work = &self.workloads[w];
                !work.done && work.started.is_some_and(|s| s + work.lifetime <= step)
            })
            .collect();
        for w in ended {
            self.workloads[w].done = true;
            for uid in self.workloads[w].pods.clone() {
                self.model.remove(&uid);
            }
            if self.workloads[w].kind == Kind::Batch {
                self.batch_completed += 1;
                self.new_batch(step);
            }
        }
    }

    /// Evicted pods (terminating since the last step) are gone; a batch pod is replaced.
    fn kubelet(&mut self, step: u64) {
        let gone: Vec<String> = self
            .model
            .pods()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        for uid in gone {
            self.model.remove(&uid);
            let Some(&w) = self.of_pod.get(&uid) else {
                continue;
            };
            if !self.workloads[w].done {
                self.workloads[w].done = true;
                if self.workloads[w].kind == Kind::Batch {
                    self.new_batch(step);
                }
            }
        }
    }

    fn place(&mut self) -> anyhow::Result<()> {
        match self.mode {
            Mode::Controller { .. } => {
                self.controller
                    .step(&mut self.model, &mut |m: &mut ClusterModel, uid: &str| {
                        m.evict(uid)
                    })
                    .context("the controller's step")?;
                self.count_evictions();
                Ok(())
            }
            Mode::PerPodFirstFit => self.first_fit(),
        }
    }

    /// GPU-hours of the pods evicted in the last step: GPUs × time run.
    fn count_evictions(&mut self) {
        let events = &self.controller.events[self.events_seen..];
        self.events_seen = self.controller.events.len();
        for event in events {
            let Event::Evicted { pod } = event else {
                continue;
            };
            let Some(p) = self.model.pod(pod) else {
                continue;
            };
            let started = p
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map_or(self.model.now, |t| t.0);
            let gpus: usize = self
                .model
                .claims_of(p)
                .iter()
                .filter_map(|c| c.claim.status.as_ref()?.allocation.as_ref())
                .map(|a| {
                    a.devices
                        .as_ref()
                        .and_then(|d| d.results.as_ref())
                        .map_or(0, Vec::len)
                })
                .sum();
            let seconds = self.model.now.duration_since(started).as_secs_f64();
            self.gpu_seconds_evicted += gpus as f64 * seconds.max(0.0);
        }
    }

    /// kube-scheduler's way: pending pods by priority then arrival, each on the first node
    /// whose free devices hold it; no gangs, no preemption for devices.
    fn first_fit(&mut self) -> anyhow::Result<()> {
        let mut pending: Vec<(i32, Timestamp, String)> = self
            .model
            .gated()
            .into_iter()
            .filter_map(|uid| {
                let pod = self.model.pod(&uid)?;
                let created = pod.metadata.creation_timestamp.as_ref()?.0;
                let priority = pod.spec.as_ref()?.priority.unwrap_or(0);
                Some((priority, created, uid))
            })
            .collect();
        pending.sort_by(|a, b| {
            (std::cmp::Reverse(a.0), a.1, &a.2).cmp(&(std::cmp::Reverse(b.0), b.1, &b.2))
        });
        let options = AllocateOptions {
            mode: PlacementMode::FirstFit,
            ..AllocateOptions::default()
        };
        let mut in_use = self.model.in_use();
        for (_, _, uid) in pending {
            let Some(pod) = self.model.pod(&uid) else {
                continue;
            };
            let claims: Vec<Arc<ResourceClaim>> = self
                .model
                .claims_of(pod)
                .into_iter()
                .map(|c| c.claim)
                .collect();
            let tolerating: Vec<ResourceClaim> =
                claims.iter().map(|c| tolerating_managed_taint(c)).collect();
            let outcome =
                self.model
                    .snapshot
                    .managed
                    .allocate(&tolerating, &in_use, None, &options)?;
            let Outcome::Allocated(a) = outcome else {
                continue;
            };
            for (claim, c) in claims.iter().zip(a.claims) {
                in_use.add_allocation(&c.result)?;
                let name = claim.metadata.name.clone().unwrap_or_default();
                self.model.allocate(&name, c.result)?;
            }
            self.model.run_on(&uid, &a.node)?;
        }
        Ok(())
    }

    /// Work whose pods all run now starts (a gang with its last pod).
    fn note_starts(&mut self, step: u64) {
        for work in self
            .workloads
            .iter_mut()
            .filter(|w| w.started.is_none() && !w.done)
        {
            let running = work.pods.iter().all(|uid| {
                self.model.pod(uid).is_some_and(|p| {
                    !is_gated(p, TOPOLOGY_AWARE_GATE) && p.metadata.deletion_timestamp.is_none()
                })
            });
            if running {
                work.started = Some(step);
                for uid in &work.pods {
                    if let Some(node) = self
                        .model
                        .pod(uid)
                        .and_then(|p| p.spec.as_ref()?.node_name.clone())
                    {
                        self.placed.insert(uid.clone(), node);
                    }
                }
            }
        }
    }

    /// GPUs held by pods of started work, not terminating.
    fn sample(&mut self, step: u64) {
        if step < WARM_UP {
            return;
        }
        let mut held = 0;
        for work in self
            .workloads
            .iter()
            .filter(|w| w.started.is_some() && !w.done)
        {
            for uid in &work.pods {
                let Some(pod) = self
                    .model
                    .pod(uid)
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                else {
                    continue;
                };
                held += self
                    .model
                    .claims_of(pod)
                    .iter()
                    .filter_map(|c| c.claim.status.as_ref()?.allocation.as_ref())
                    .map(|a| {
                        a.devices
                            .as_ref()
                            .and_then(|d| d.results.as_ref())
                            .map_or(0, Vec::len)
                    })
                    .sum::<usize>();
            }
        }
        self.utilization.push(held as f64 / self.gpus.max(1) as f64);
    }
}

/// Runs one mode over the trace.
fn run_mode(
    s: &TenantScenario,
    arrivals: &[Arrival],
    seed: u64,
    mode: Mode,
) -> anyhow::Result<TenantMetrics> {
    let gangs = GangScenario {
        racks: s.racks,
        nodes_per_rack: s.nodes_per_rack,
        cliques: s.cliques,
        trays_per_clique: s.trays_per_clique,
        ..GangScenario::default()
    };
    let cluster = cluster(&gangs)?;
    let gpus = cluster.capacity.values().sum();
    let start: Timestamp = "2026-11-28T00:00:00Z".parse().context("the start time")?;
    let preemption = matches!(mode, Mode::Controller { preemption: true });
    let mut run = Run {
        scenario: s,
        domains: &cluster.domains,
        model: ClusterModel::new(cluster.view, TOPOLOGY_AWARE_GATE, start),
        controller: ControllerModel::new(
            Settings::new(TOPOLOGY_AWARE_GATE),
            preemption.then(PreemptionSettings::default),
        ),
        mode,
        workloads: Vec::new(),
        of_pod: HashMap::new(),
        names: 0,
        batch_rng: Rng(seed ^ 0x5ca7_e4e9),
        utilization: Vec::new(),
        gpus,
        gpu_seconds_evicted: 0.0,
        batch_completed: 0,
        events_seen: 0,
        placed: HashMap::new(),
    };
    for _ in 0..s.batch_replicas {
        run.new_batch(0);
    }
    let mut next = arrivals.iter().peekable();
    for step in 0..s.steps {
        run.model.now = start
            .saturating_add(SignedDuration::from_secs(STEP_SECONDS * step as i64))
            .unwrap_or(start);
        run.finish(step);
        run.kubelet(step);
        while let Some(a) = next.next_if(|a| a.step == step) {
            run.create(a.kind, a.pods, a.gpus, a.lifetime, step);
        }
        run.place()?;
        run.note_starts(step);
        run.sample(step);
    }
    Ok(metrics(&run))
}

fn metrics(run: &Run<'_>) -> TenantMetrics {
    let end = run.scenario.steps;
    let mut all = Vec::new();
    let mut inference = Vec::new();
    let mut gangs = Vec::new();
    let (mut clique_started, mut clique_local, mut rack_local) = (0, 0, 0);
    for work in run.workloads.iter().filter(|w| w.kind != Kind::Batch) {
        let wait = work.started.unwrap_or(end) - work.arrived;
        all.push(wait);
        match work.kind {
            Kind::Inference => inference.push(wait),
            _ => gangs.push(wait),
        }
        if work.kind != Kind::Gang || work.started.is_none() {
            continue;
        }
        let placed: Vec<&(String, Option<String>)> = work
            .pods
            .iter()
            .filter_map(|uid| placed_node(run, uid))
            .filter_map(|node| run.domains.get(&node))
            .collect();
        let racks: BTreeSet<&String> = placed.iter().map(|d| &d.0).collect();
        rack_local += usize::from(racks.len() == 1);
        if placed.iter().any(|d| d.1.is_some()) {
            clique_started += 1;
            let cliques: BTreeSet<&Option<String>> = placed.iter().map(|d| &d.1).collect();
            clique_local += usize::from(cliques.len() == 1);
        }
    }
    for v in [&mut all, &mut inference, &mut gangs] {
        v.sort_unstable();
    }
    let gang_started = run
        .workloads
        .iter()
        .filter(|w| w.kind == Kind::Gang && w.started.is_some())
        .count();
    let percent = |a: usize, b: usize| {
        if b == 0 {
            0.0
        } else {
            round2(100.0 * a as f64 / b as f64)
        }
    };
    let plans = count_events(run, |e| matches!(e, Event::Preempted { .. }));
    let victims = count_events(run, |e| matches!(e, Event::Evicted { .. }));
    TenantMetrics {
        production: all.len(),
        production_started: run
            .workloads
            .iter()
            .filter(|w| w.kind != Kind::Batch && w.started.is_some())
            .count(),
        production_wait_p50: percentile(&all, 50.0),
        production_wait_p99: percentile(&all, 99.0),
        inference_wait_p99: percentile(&inference, 99.0),
        gang_wait_p99: percentile(&gangs, 99.0),
        gpu_utilization_percent: round2(
            100.0 * run.utilization.iter().sum::<f64>() / run.utilization.len().max(1) as f64,
        ),
        preemptions: plans,
        victims,
        gpu_hours_evicted: round2(run.gpu_seconds_evicted / 3600.0),
        gangs_one_clique_percent: percent(clique_local, clique_started),
        gangs_one_rack_percent: percent(rack_local, gang_started),
        batch_completed: run.batch_completed,
    }
}

/// The controller's events of one kind.
fn count_events(run: &Run<'_>, kind: impl Fn(&Event) -> bool) -> usize {
    run.controller.events.iter().filter(|e| kind(e)).count()
}

/// The node a pod of started work ran on.
fn placed_node(run: &Run<'_>, uid: &str) -> Option<String> {
    run.placed.get(uid).cloned()
}

/// Runs the three modes.
pub fn run(s: &TenantScenario, seed: u64) -> anyhow::Result<TenantReport> {
    let arrivals = trace(s, seed);
    Ok(TenantReport {
        controller_with_preemption: run_mode(
            s,
            &arrivals,
            seed,
            Mode::Controller { preemption: true },
        )?,
        controller_without_preemption: run_mode(
            s,
            &arrivals,
            seed,
            Mode::Controller { preemption: false },
        )?,
        per_pod_first_fit: run_mode(s, &arrivals, seed, Mode::PerPodFirstFit)?,
    })
}

/// The comparison as a table.
pub fn write_table(
    out: &mut impl std::io::Write,
    s: &TenantScenario,
    seed: u64,
    report: &TenantReport,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "{} dgx-h100 nodes in {} racks, {} GB200 trays in {} fabric cliques; {} minutes; inference {}/min, \
         a gang of {:?} pods × {} GPUs every {} min, {} scavenger replicas (seed {seed})\n",
        s.racks * s.nodes_per_rack,
        s.racks,
        s.cliques * s.trays_per_clique,
        s.cliques,
        s.steps,
        s.inference_per_step,
        s.gang_pods.keys().collect::<Vec<_>>(),
        s.gang_gpus,
        s.gang_interval,
        s.batch_replicas
    )?;
    writeln!(
        out,
        "| mode | production wait p50 / p99 (min) | inference p99 | gang p99 | GPU utilization % | preemptions | victims | GPU-hours evicted | gangs in one clique % | gangs in one rack % | batch completed |"
    )?;
    writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    for (name, m) in [
        ("controller, preemption", &report.controller_with_preemption),
        (
            "controller, no preemption",
            &report.controller_without_preemption,
        ),
        ("per-pod first fit", &report.per_pod_first_fit),
    ] {
        writeln!(
            out,
            "| {name} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            m.production_wait_p50,
            m.production_wait_p99,
            m.inference_wait_p99,
            m.gang_wait_p99,
            m.gpu_utilization_percent,
            m.preemptions,
            m.victims,
            m.gpu_hours_evicted,
            m.gangs_one_clique_percent,
            m.gangs_one_rack_percent,
            m.batch_completed
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few hours on 4 dgx-h100 in 2 racks and 8 GB200 trays in 2 cliques (64 GPUs), batch
    /// asking for every GPU.
    fn small() -> TenantScenario {
        TenantScenario {
            racks: 2,
            nodes_per_rack: 2,
            cliques: 2,
            trays_per_clique: 4,
            steps: 300,
            inference_per_step: 0.1,
            inference_lifetime: Lifetime { min: 20, max: 60 },
            gang_interval: 25,
            gang_pods: [(2, 1), (4, 1)].into(),
            gang_gpus: 4,
            gang_lifetime: Lifetime { min: 20, max: 80 },
            batch_replicas: 64,
            batch_lifetime: Lifetime { min: 30, max: 120 },
        }
    }

    #[test]
    fn a_seed_gives_the_same_figures_every_time() {
        let (a, b) = (run(&small(), 3).unwrap(), run(&small(), 3).unwrap());
        assert_eq!(a.controller_with_preemption, b.controller_with_preemption);
        assert_eq!(a.per_pod_first_fit, b.per_pod_first_fit);
    }

    #[test]
    fn preemption_puts_production_ahead_of_the_scavenger_batch() {
        let report = run(&small(), 1).unwrap();
        let (with, without, ff) = (
            &report.controller_with_preemption,
            &report.controller_without_preemption,
            &report.per_pod_first_fit,
        );
        let all = format!("with {with:?}\nwithout {without:?}\nfirst fit {ff:?}");
        // Batch asks for every GPU: without preemption production waits for batch to finish.
        assert!(
            with.production_wait_p99 < without.production_wait_p99,
            "{all}"
        );
        assert!(with.production_wait_p99 < ff.production_wait_p99, "{all}");
        assert!(
            with.production_started >= without.production_started,
            "{all}"
        );
        assert_eq!(with.production, without.production, "{all}");
        // Only the controller with preemption evicts, and what it evicts had run.
        assert!(
            with.preemptions > 0 && with.victims >= with.preemptions,
            "{all}"
        );
        assert!(with.gpu_hours_evicted > 0.0, "{all}");
        for m in [without, ff] {
            assert_eq!((m.preemptions, m.victims), (0, 0), "{all}");
            assert_eq!(m.gpu_hours_evicted, 0.0, "{all}");
        }
        // Batch keeps the cluster busy in every mode.
        for m in [with, without, ff] {
            assert!(m.gpu_utilization_percent > 50.0, "{all}");
            assert!(m.gpu_utilization_percent <= 100.0, "{all}");
        }
        // Preemption frees a clique or rack for a gang; without it a gang takes what batch leaves.
        assert!(
            with.gangs_one_clique_percent >= without.gangs_one_clique_percent,
            "{all}"
        );
        assert!(
            with.gangs_one_rack_percent >= without.gangs_one_rack_percent,
            "{all}"
        );
    }
}
