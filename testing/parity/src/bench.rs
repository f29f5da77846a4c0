//! Side-by-side benchmarks: the same input through upstream's allocator (the oracle's `bench-*`
//! ops) and through `tessera_allocator` in first-fit mode, in interleaved rounds in one run
//! (upstream, ours, upstream, ours, ...) so that both see the same machine load.
//!
//! - Workloads: claims allocated one after the other from an empty state, each on the node it
//!   fits (the node is given: this measures the per-node allocation the scheduler's Filter does,
//!   not node choice). Upstream: `NewAllocator` with the state so far, then `Allocate` on the node,
//!   timed; ours: `DeviceIndex::allocate` on the node, timed (the inventory is built once, as the
//!   scheduler's informer caches are).
//! - CEL: each expression evaluated many times on one device, nanoseconds per evaluation.
//! - Adversarial: claims that cannot fit on their node, where a plain depth-first search tries
//!   every combination: time until the allocator says so (upstream stops at its 10 s Filter
//!   timeout).
//!
//! Each side's fastest round is reported (the machine is shared).

use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceClaim, ResourceSlice};
use serde::{Deserialize, Serialize};
use tessera_allocator::{AllocateOptions, AllocatedState, Outcome, PlacementMode};
use tessera_cel::{DeviceContext, SelectorCompiler};
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

/// One row of the report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub benchmark: String,
    pub upstream: f64,
    pub ours: f64,
    pub unit: &'static str,
    /// How many times faster ours is (upstream time / our time).
    pub speedup: f64,
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

/// Both sides on a workload, `rounds` interleaved rounds; the fastest round of each.
pub fn workload(
    oracle: &mut Oracle,
    w: &Workload,
    rounds: usize,
) -> anyhow::Result<(Figures, Figures)> {
    let _: serde_json::Value = oracle.ask(&BenchRequest {
        op: "bench-load",
        bench: BenchBody {
            id: w.instance.name.as_str(),
            instance: Some(&w.instance),
            targets: Some(&w.targets),
            ..Default::default()
        },
    })?;
    let (mut best_up, mut best_ours): (Option<Figures>, Option<Figures>) = (None, None);
    for _ in 0..rounds {
        let up: Run = oracle.ask(&BenchRequest {
            op: "bench-run",
            bench: BenchBody {
                id: w.instance.name.as_str(),
                ..Default::default()
            },
        })?;
        let mine = run_ours(w)?;
        for (run, side) in [(&up, "upstream"), (&mine, "ours")] {
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
        let keep = |best: &mut Option<Figures>, f: Figures| {
            if best
                .as_ref()
                .is_none_or(|b| f.claims_per_second > b.claims_per_second)
            {
                *best = Some(f);
            }
        };
        keep(&mut best_up, Figures::of(&up));
        keep(&mut best_ours, Figures::of(&mine));
    }
    Ok((best_up.expect("rounds > 0"), best_ours.expect("rounds > 0")))
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

/// Nanoseconds per evaluation, upstream and ours, per expression (fastest of `rounds`).
pub fn cel(
    oracle: &mut Oracle,
    rounds: usize,
    iterations: usize,
) -> anyhow::Result<Vec<(String, f64, f64)>> {
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
    let ctx = DeviceContext::new(&device.driver, &device.device);
    let compiled = expressions
        .iter()
        .map(|e| compiler.compile(e))
        .collect::<Result<Vec<_>, _>>()?;
    let mut up = vec![f64::INFINITY; expressions.len()];
    let mut mine = vec![f64::INFINITY; expressions.len()];
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
            up[i] = up[i].min(a.nanos_per_eval[i]);
        }
        for (i, s) in compiled.iter().enumerate() {
            let start = Instant::now();
            let mut all = true;
            for _ in 0..iterations {
                all &= std::hint::black_box(s.evaluate(std::hint::black_box(&ctx)))?;
            }
            if !all {
                anyhow::bail!("ours: {} is not true", expressions[i]);
            }
            mine[i] = mine[i].min(start.elapsed().as_nanos() as f64 / iterations as f64);
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

/// Time to fail, upstream and ours (fastest of `rounds`), and each side's outcome.
pub fn time_to_fail(
    oracle: &mut Oracle,
    inst: &Instance,
    rounds: usize,
) -> anyhow::Result<(Duration, String, Duration, String)> {
    let (mut up, mut mine) = (Duration::MAX, Duration::MAX);
    let (mut up_kind, mut our_kind) = (String::new(), String::new());
    for _ in 0..rounds {
        let u = oracle.allocate(inst)?;
        let n = u.nodes.first().ok_or_else(|| anyhow::anyhow!("no node"))?;
        up = up.min(Duration::from_micros(n.micros.max(0) as u64));
        up_kind = kind(n.outcome, n.error_class.as_deref());
        let o = ours::run(inst)?;
        let n = o.nodes.first().ok_or_else(|| anyhow::anyhow!("no node"))?;
        mine = mine.min(Duration::from_micros(n.micros.max(0) as u64));
        our_kind = kind(n.outcome, n.error_class.as_deref());
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

/// Every benchmark (or only the groups in `only`, from [`GROUPS`]), as rows.
pub fn all(oracle: &mut Oracle, rounds: usize, only: &[String]) -> anyhow::Result<Vec<Row>> {
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
        let (u, o) = workload(oracle, &w, rounds)?;
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
        rows.push(Row {
            benchmark: format!("{}: claims/s", w.name),
            upstream: u.claims_per_second,
            ours: o.claims_per_second,
            unit: "claims/s",
            speedup: ratio(o.claims_per_second, u.claims_per_second),
        });
        rows.push(Row {
            benchmark: format!("{}: p50 per claim", w.name),
            upstream: u.p50_micros,
            ours: o.p50_micros,
            unit: "µs",
            speedup: ratio(u.p50_micros, o.p50_micros),
        });
        rows.push(Row {
            benchmark: format!("{}: p99 per claim", w.name),
            upstream: u.p99_micros,
            ours: o.p99_micros,
            unit: "µs",
            speedup: ratio(u.p99_micros, o.p99_micros),
        });
    }
    let cel_rows = if wanted("cel") {
        cel(oracle, rounds, 20_000)?
    } else {
        Vec::new()
    };
    for (e, u, o) in cel_rows {
        rows.push(Row {
            benchmark: format!("CEL `{e}`"),
            upstream: u,
            ours: o,
            unit: "ns/eval",
            speedup: u / o,
        });
    }
    let adversarial_shapes: &[(i64, i64)] = if wanted("adversarial") {
        &[(20, 6), (40, 12)]
    } else {
        &[]
    };
    for &(devices, take) in adversarial_shapes {
        let inst = adversarial(devices, take);
        let (u, uk, o, ok) = time_to_fail(oracle, &inst, rounds.min(2))?;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        rows.push(Row {
            benchmark: format!(
                "adversarial: {take} of {devices} devices + 1 of none, time to fail (upstream: {uk}; ours: {ok})"
            ),
            upstream: ms(u),
            ours: ms(o),
            unit: "ms",
            speedup: ms(u) / ms(o).max(1e-3),
        });
    }
    Ok(rows)
}

/// The rows as a markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut md = String::from(
        "| benchmark | upstream | ours | unit | ours vs upstream |\n|---|---:|---:|---|---:|\n",
    );
    for r in rows {
        md.push_str(&format!(
            "| {} | {:.1} | {:.1} | {} | {:.1}× |\n",
            r.benchmark, r.upstream, r.ours, r.unit, r.speedup
        ));
    }
    md
}
