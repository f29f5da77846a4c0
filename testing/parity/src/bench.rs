//! Side-by-side benchmarks: the same input through upstream's allocator (the oracle's `bench-*`
//! ops) and through `tessera_allocator` in first-fit mode, in interleaved rounds in one run
//! (upstream, ours, upstream, ours, ...) so that both see the same machine load. Each side does
//! the same work in the timed region, and both are warm or both cold:
//!
//! - Workloads: claims allocated one after the other from an empty state, each on the node it
//!   fits (the node is given: this measures the per-node allocation the scheduler's Filter does,
//!   not node choice). Upstream: `NewAllocator` with the state so far, then `Allocate` on the
//!   node, timed; ours: `DeviceIndex::allocate` on the node, timed, on an inventory built at the
//!   start of the round (as the scheduler's informer caches are built before it schedules).
//!   Both warm: one untimed round on each side first; upstream keeps its CEL cache from round to
//!   round as kube-scheduler keeps its own, ours keeps its process-wide compiler.
//! - CEL: each expression evaluated many times on one device, from the API object to the
//!   verdict on every call on both sides: upstream's `DeviceMatches` on the device (which builds
//!   its CEL input each call), ours the allocator's own path (a `DeviceView` of the object for a
//!   selector that reads one-step paths only, else a `DeviceContext` built from it). Compiled
//!   once, outside the timed loop, on both sides.
//! - Adversarial: claims that cannot fit on their node, where a plain depth-first search tries
//!   every combination: time until the allocator says so, each round on a fresh allocator on
//!   both sides (upstream stops at its 10 s Filter timeout).
//!
//! Every row reports the median of the rounds and their range (at least five rounds), and the
//! 1-minute load average before and after it.

use std::time::Instant;

use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceClaim, ResourceSlice};
use serde::{Deserialize, Serialize};
use tessera_allocator::{AllocateOptions, AllocatedState, Outcome, PlacementMode};
use tessera_cel::{DeviceContext, DeviceView, SelectorCompiler};
use tessera_test_support::scheduler_perf::{
    self as perf, DRIVER as PERF_DRIVER, claim, class, device as perf_device, request,
};

use crate::cel::CelDevice;
use crate::instance::{Instance, VerdictKind, apply_defaults};
use crate::oracle::Oracle;
use crate::ours;

/// A workload: a cluster, claims in arrival order and the node each is allocated on.
pub struct Workload {
    pub name: &'static str,
    pub instance: Instance,
    pub targets: Vec<String>,
}

/// One side's run of a workload.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    pub nanos: Vec<i64>,
    pub allocated: usize,
    #[serde(default)]
    pub failed: usize,
    #[serde(default)]
    pub errors: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// Figures of one side on one workload.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Figures {
    pub claims: usize,
    pub allocated: usize,
    pub claims_per_second: f64,
    pub p50_micros: f64,
    pub p99_micros: f64,
}

impl Figures {
    fn of(run: &Run) -> Figures {
        let mut n = run.nanos.clone();
        n.sort_unstable();
        let total: i64 = n.iter().sum();
        let pct = |p: usize| n[(n.len() * p / 100).min(n.len() - 1)] as f64 / 1e3;
        Figures {
            claims: n.len(),
            allocated: run.allocated,
            claims_per_second: n.len() as f64 / (total as f64 / 1e9),
            p50_micros: pct(50),
            p99_micros: pct(99),
        }
    }
}

/// The median of some rounds and their range.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (at least one).
    pub fn of(values: &[f64]) -> Spread {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// One row of the report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub benchmark: String,
    pub upstream: Spread,
    pub ours: Spread,
    pub unit: &'static str,
    /// How many times better ours is, of the medians (throughput ours/upstream, times
    /// upstream/ours).
    pub speedup: f64,
    pub rounds: usize,
    /// The 1-minute load average before and after the row's rounds.
    pub load: [f64; 2],
}

/// The 1-minute load average (0 where /proc/loadavg cannot be read).
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn perf_slice(node: usize, devices: i64) -> ResourceSlice {
    perf::slice(node, devices)
}

fn instance(
    name: &str,
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    claims: Vec<ResourceClaim>,
) -> Instance {
    let mut inst = Instance {
        name: name.into(),
        nodes: Vec::new(),
        slices,
        classes,
        claims,
        ..Default::default()
    };
    apply_defaults(&mut inst);
    inst
}

/// scheduler_perf's `SchedulingWithResourceClaimTemplate` shape: 500 nodes × 10 devices, a class
/// with one CEL selector, 5,000 single-device claims, claim i on node i / 10.
pub fn scheduler_perf() -> Workload {
    let slices = (0..500).map(|n| perf_slice(n, 10)).collect();
    let classes = vec![class(
        "perf",
        &format!("device.driver == \"{PERF_DRIVER}\""),
    )];
    let claims = (0..5000)
        .map(|i| claim(i, vec![request("req-0", "perf", 1)]))
        .collect();
    Workload {
        name: "scheduler-perf (500 nodes × 10 devices, 5,000 1-device claims)",
        instance: instance("scheduler-perf", slices, classes, claims),
        targets: (0..5000).map(|i| format!("node-{:03}", i / 10)).collect(),
    }
}

/// The dgx-h100 shape as the node plugin publishes it (crates/gpu-inventory, every device the mock
/// node has), 64 nodes, 4-GPU claims, two per node.
pub fn dgx_h100() -> anyhow::Result<Workload> {
    let inventory = tessera_gpu_inventory::MockSource::new("dgx-h100")
        .and_then(|s| tessera_gpu_inventory::DeviceSource::inventory(&s))?;
    let mut slices = Vec::new();
    for n in 0..64 {
        slices.extend(tessera_gpu_inventory::render_slices(
            &inventory,
            &tessera_gpu_inventory::RenderOptions::new(format!("dgx-{n:03}")),
        )?);
    }
    let classes = vec![class(
        "gpu.tessera.dev",
        "device.driver == \"gpu.tessera.dev\" && device.attributes[\"gpu.tessera.dev\"].type == \"gpu\"",
    )];
    let claims = (0..128)
        .map(|i| claim(i, vec![request("gpus", "gpu.tessera.dev", 4)]))
        .collect();
    Ok(Workload {
        name: "dgx-h100 (64 nodes as published, 128 4-GPU claims)",
        instance: instance("dgx-h100", slices, classes, claims),
        targets: (0..128).map(|i| format!("dgx-{:03}", i / 2)).collect(),
    })
}

/// Our run of a workload: each claim on its node, in order, into the state.
pub fn run_ours(w: &Workload) -> anyhow::Result<Run> {
    let inv = ours::inventory(&w.instance);
    let options = AllocateOptions {
        mode: PlacementMode::FirstFit,
        explain: false,
        ..AllocateOptions::default()
    };
    let mut state = AllocatedState::new();
    let mut run = Run::default();
    for (claim, node) in w.instance.claims.iter().zip(&w.targets) {
        let start = Instant::now();
        let outcome = inv.allocate(std::slice::from_ref(claim), &state, Some(node), &options);
        run.nanos
            .push(i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX));
        match outcome {
            Ok(Outcome::Allocated(a)) => {
                run.allocated += 1;
                state.add_allocation(&a.claims[0].result)?;
            }
            Ok(Outcome::Unsatisfiable(_)) => run.failed += 1,
            Err(e) => {
                run.errors += 1;
                run.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    Ok(run)
}

#[derive(Serialize)]
struct BenchRequest<'a> {
    op: &'static str,
    bench: BenchBody<'a>,
}

#[derive(Serialize, Default)]
struct BenchBody<'a> {
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instance: Option<&'a Instance>,
    #[serde(skip_serializing_if = "Option::is_none")]
    targets: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expressions: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<&'a CelDevice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    iterations: Option<usize>,
}

/// Both sides on a workload: one untimed round each, then `rounds` interleaved rounds; per side,
/// each round's claims/s, p50 and p99.
pub fn workload(
    oracle: &mut Oracle,
    w: &Workload,
    rounds: usize,
) -> anyhow::Result<(Vec<Figures>, Vec<Figures>)> {
    let _: serde_json::Value = oracle.ask(&BenchRequest {
        op: "bench-load",
        bench: BenchBody {
            id: w.instance.name.as_str(),
            instance: Some(&w.instance),
            targets: Some(&w.targets),
            ..Default::default()
        },
    })?;
    let (mut up, mut mine) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        let u: Run = oracle.ask(&BenchRequest {
            op: "bench-run",
            bench: BenchBody {
                id: w.instance.name.as_str(),
                ..Default::default()
            },
        })?;
        let o = run_ours(w)?;
        for (run, side) in [(&u, "upstream"), (&o, "ours")] {
            if run.allocated != w.targets.len() {
                anyhow::bail!(
                    "{}: {side} allocated {} of {} claims (first error: {})",
                    w.name,
                    run.allocated,
                    w.targets.len(),
                    run.first_error.as_deref().unwrap_or("none")
                );
            }
        }
        if round > 0 {
            up.push(Figures::of(&u));
            mine.push(Figures::of(&o));
        }
    }
    Ok((up, mine))
}

/// Selector expressions of the kinds classes and claims use, on scheduler_perf's device.
pub fn cel_expressions() -> Vec<String> {
    let d = PERF_DRIVER;
    [
        format!("device.driver == \"{d}\""),
        format!("device.attributes[\"{d}\"].model == \"A100\""),
        format!("device.attributes[\"{d}\"].index >= 3 && device.attributes[\"{d}\"].family == \"GPU\""),
        format!("device.attributes[\"{d}\"].driverVersion.isGreaterThan(semver(\"1.0.0\"))"),
        format!("device.capacity[\"{d}\"].memory.compareTo(quantity(\"512Mi\")) >= 0"),
        format!("\"model\" in device.attributes[\"{d}\"] && device.attributes[\"{d}\"].model in [\"A100\", \"H100\"]"),
    ]
    .into()
}

/// An expression's nanoseconds per evaluation, per round: upstream's and ours.
pub type CelRounds = (String, Vec<f64>, Vec<f64>);

/// Nanoseconds per evaluation from the API object, per expression and round.
pub fn cel(
    oracle: &mut Oracle,
    rounds: usize,
    iterations: usize,
) -> anyhow::Result<Vec<CelRounds>> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Answer {
        nanos_per_eval: Vec<f64>,
        results: Vec<String>,
    }
    let expressions = cel_expressions();
    let device = CelDevice {
        driver: PERF_DRIVER.into(),
        device: perf_device(4),
    };
    let compiler = SelectorCompiler::new();
    let compiled = expressions
        .iter()
        .map(|e| compiler.compile(e))
        .collect::<Result<Vec<_>, _>>()?;
    let mut up = vec![Vec::new(); expressions.len()];
    let mut mine = vec![Vec::new(); expressions.len()];
    for _ in 0..rounds {
        let a: Answer = oracle.ask(&BenchRequest {
            op: "bench-cel",
            bench: BenchBody {
                id: "cel",
                expressions: Some(&expressions),
                device: Some(&device),
                iterations: Some(iterations),
                ..Default::default()
            },
        })?;
        for (i, r) in a.results.iter().enumerate() {
            if r != "true" {
                anyhow::bail!("upstream: {} gives {r}, expected true", expressions[i]);
            }
            up[i].push(a.nanos_per_eval[i]);
        }
        for (i, s) in compiled.iter().enumerate() {
            let start = Instant::now();
            let mut all = true;
            for _ in 0..iterations {
                let d = std::hint::black_box(&device);
                // The allocator's own path from the API object to the verdict.
                let verdict = if s.reads_paths_only() {
                    s.evaluate_view(&DeviceView::new(&d.driver, &d.device))
                } else {
                    s.evaluate(&DeviceContext::new(&d.driver, &d.device))
                };
                all &= std::hint::black_box(verdict)?;
            }
            if !all {
                anyhow::bail!("ours: {} is not true", expressions[i]);
            }
            mine[i].push(start.elapsed().as_nanos() as f64 / iterations as f64);
        }
    }
    Ok(expressions
        .into_iter()
        .zip(up)
        .zip(mine)
        .map(|((e, u), m)| (e, u, m))
        .collect())
}

/// An unsatisfiable claim on one node of `devices` devices: `take` of them plus one device of a
/// class that matches none (upstream issue 131730's shape).
pub fn adversarial(devices: i64, take: i64) -> Instance {
    let mut slice = perf_slice(0, devices);
    slice.spec.devices = Some(
        (0..devices)
            .map(|d| Device {
                name: format!("device-{d:02}"),
                ..Default::default()
            })
            .collect(),
    );
    let classes = vec![
        class("perf", &format!("device.driver == \"{PERF_DRIVER}\"")),
        class("none", "false"),
    ];
    let claims = vec![claim(
        0,
        vec![request("req-0", "perf", take), request("req-1", "none", 1)],
    )];
    let mut inst = instance(
        &format!("adversarial-{take}-of-{devices}"),
        vec![slice],
        classes,
        claims,
    );
    inst.node = Some("node-000".into());
    inst
}

/// Time to fail per round, upstream and ours, each round on a fresh allocator (upstream: a new
/// `Allocator`, its Filter's time; ours: a new inventory, its first `allocate`), and each side's
/// outcome.
pub fn time_to_fail(
    oracle: &mut Oracle,
    inst: &Instance,
    rounds: usize,
) -> anyhow::Result<(Vec<f64>, String, Vec<f64>, String)> {
    let node = inst.node.clone().unwrap_or_default();
    let options = AllocateOptions {
        mode: PlacementMode::FirstFit,
        explain: false,
        ..AllocateOptions::default()
    };
    let (mut up, mut mine) = (Vec::new(), Vec::new());
    let (mut up_kind, mut our_kind) = (String::new(), String::new());
    for _ in 0..rounds {
        let u = oracle.allocate(inst)?;
        let n = u.nodes.first().ok_or_else(|| anyhow::anyhow!("no node"))?;
        up.push(n.micros.max(0) as f64 / 1e3);
        up_kind = kind(n.outcome, n.error_class.as_deref());
        let inventory = ours::inventory(inst);
        let state = ours::allocated_state(inst)?;
        let start = Instant::now();
        let outcome = inventory.allocate(&inst.claims, &state, Some(&node), &options);
        mine.push(start.elapsed().as_secs_f64() * 1e3);
        our_kind = match outcome {
            Ok(Outcome::Allocated(_)) => "allocated".into(),
            Ok(Outcome::Unsatisfiable(_)) => "unsatisfiable".into(),
            Err(e) => format!("error ({})", ours::error_class(&e)),
        };
    }
    Ok((up, up_kind, mine, our_kind))
}

fn kind(k: VerdictKind, class: Option<&str>) -> String {
    match class {
        Some(c) => format!("{k} ({c})"),
        None => k.to_string(),
    }
}

/// The benchmark groups, as `--only` names them.
pub const GROUPS: [&str; 4] = ["scheduler-perf", "dgx-h100", "cel", "adversarial"];

/// A workload figure: its name, unit, how to read it from a round, whether more is better.
type Measure = (&'static str, &'static str, fn(&Figures) -> f64, bool);

/// The fewest rounds a row is measured over.
pub const LEAST_ROUNDS: usize = 5;

/// Every benchmark (or only the groups in `only`, from [`GROUPS`]), as rows.
pub fn all(oracle: &mut Oracle, rounds: usize, only: &[String]) -> anyhow::Result<Vec<Row>> {
    anyhow::ensure!(
        rounds >= LEAST_ROUNDS,
        "--rounds must be at least {LEAST_ROUNDS} (medians with their range)"
    );
    if let Some(unknown) = only.iter().find(|g| !GROUPS.contains(&g.as_str())) {
        anyhow::bail!(
            "unknown benchmark group {unknown}: one of {}",
            GROUPS.join(", ")
        );
    }
    let wanted = |group: &str| only.is_empty() || only.iter().any(|g| g == group);
    let mut rows = Vec::new();
    let workloads = [
        wanted("scheduler-perf").then(scheduler_perf),
        wanted("dgx-h100").then(dgx_h100).transpose()?,
    ];
    for w in workloads.into_iter().flatten() {
        let before = load_average();
        let (u, o) = workload(oracle, &w, rounds)?;
        let load = [before, load_average()];
        let pick = |f: &[Figures], g: fn(&Figures) -> f64| f.iter().map(g).collect::<Vec<_>>();
        let measures: [Measure; 3] = [
            ("claims/s", "claims/s", |f| f.claims_per_second, true),
            ("p50 per claim", "µs", |f| f.p50_micros, false),
            ("p99 per claim", "µs", |f| f.p99_micros, false),
        ];
        for (what, unit, g, higher_is_better) in measures {
            rows.push(row(
                format!("{}: {what}", w.name),
                unit,
                &pick(&u, g),
                &pick(&o, g),
                higher_is_better,
                load,
            ));
        }
    }
    if wanted("cel") {
        let before = load_average();
        let measured = cel(oracle, rounds, 20_000)?;
        let load = [before, load_average()];
        for (e, u, o) in measured {
            rows.push(row(format!("CEL `{e}`"), "ns/eval", &u, &o, false, load));
        }
    }
    let adversarial_shapes: &[(i64, i64)] = if wanted("adversarial") {
        &[(20, 6), (40, 12)]
    } else {
        &[]
    };
    for &(devices, take) in adversarial_shapes {
        let inst = adversarial(devices, take);
        let before = load_average();
        let (u, uk, o, ok) = time_to_fail(oracle, &inst, rounds)?;
        let load = [before, load_average()];
        rows.push(row(
            format!(
                "adversarial: {take} of {devices} devices + 1 of none, time to fail (upstream: {uk}; ours: {ok})"
            ),
            "ms",
            &u,
            &o,
            false,
            load,
        ));
    }
    Ok(rows)
}

fn row(
    benchmark: String,
    unit: &'static str,
    upstream: &[f64],
    ours: &[f64],
    higher_is_better: bool,
    load: [f64; 2],
) -> Row {
    let (u, o) = (Spread::of(upstream), Spread::of(ours));
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    Row {
        benchmark,
        upstream: u,
        ours: o,
        unit,
        speedup: if higher_is_better {
            ratio(o.median, u.median)
        } else {
            ratio(u.median, o.median.max(1e-6))
        },
        rounds: upstream.len(),
        load,
    }
}

/// The rows as a markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut md = String::from(
        "| benchmark | upstream, median (range) | ours, median (range) | unit | ours vs upstream | rounds | load |\n|---|---:|---:|---|---:|---:|---|\n",
    );
    let figure = |v: f64| {
        if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    };
    for r in rows {
        md.push_str(&format!(
            "| {} | {} ({}–{}) | {} ({}–{}) | {} | {:.1}× | {} | {:.1} → {:.1} |\n",
            r.benchmark,
            figure(r.upstream.median),
            figure(r.upstream.min),
            figure(r.upstream.max),
            figure(r.ours.median),
            figure(r.ours.min),
            figure(r.ours.max),
            r.unit,
            r.speedup,
            r.rounds,
            r.load[0],
            r.load[1],
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_are_medians_with_their_range() {
        let s = Spread::of(&[5.0, 1.0, 3.0, 9.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 9.0));
        assert_eq!(Spread::of(&[4.0, 1.0, 3.0, 2.0]).median, 2.5);
        let r = row(
            "x".into(),
            "µs",
            &[10.0, 20.0, 30.0],
            &[5.0, 5.0, 6.0],
            false,
            [1.0, 2.0],
        );
        assert_eq!(r.speedup, 4.0);
        let r = row(
            "x".into(),
            "claims/s",
            &[10.0; 3],
            &[30.0; 3],
            true,
            [1.0, 2.0],
        );
        assert_eq!(r.speedup, 3.0);
        assert!(markdown(&[r]).contains("| 30.0 (30.0–30.0) |"));
    }
}
