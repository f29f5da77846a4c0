//! The controller at scale (issue 6): the real `tessera-controller` binary, run as a child process
//! against the API-server fake served over loopback HTTP, places a stream of gated pods on a
//! cluster of 1,000 topology-managed dgx-h100 nodes. Run with
//!
//! ```text
//! cargo bench -p tessera-controller --bench placement
//! ```
//!
//! It prints a markdown report and writes `controller-placement.json` and
//! `controller-placement.md` under Cargo's benchmark temporary directory (the path is printed).
//!
//! The cluster: `TESSERA_BENCH_NODES` (default 1,000) nodes labelled topology-managed, each with
//! the ResourceSlices `tessera_gpu_inventory::render_slices` publishes for a dgx-h100 (8 GPUs, one
//! NVLink island, two NUMA nodes), the shipped DeviceClasses, and three of every four nodes
//! fragmented by claims allocated to running pods (1, 2 or 4 GPUs spread over both NUMA nodes).
//!
//! The workload: gated pods, each with one claim of 1, 2, 4 or 8 GPUs (weights 40/25/20/15, fixed
//! seed). First a paced stream (`TESSERA_BENCH_PACED_PODS`, default 300, one every
//! `TESSERA_BENCH_PACED_INTERVAL_MS`, default 50), then a burst created at once
//! (`TESSERA_BENCH_BURST_PODS`, default 200). `TESSERA_BENCH_CONTROLLER` names another
//! `tessera-controller` binary to run instead of this build's (a before/after comparison).
//!
//! Measured: per claim, the time from creating the claim (its pod right after) in the fake to the
//! claim's allocation arriving on a watch the benchmark holds on the fake; claims/s of the burst;
//! the controller's own decision histogram (`/metrics`); the controller process's memory
//! (`VmRSS`, `VmHWM` from `/proc/<pid>/status`) after the initial sync and after the workload;
//! per claim, a timeline (in the JSON, and for the slowest claims in the markdown): when the
//! controller saw the claim and the pod, took the pod off its queue, decided, wrote the allocation
//! and released the pod, from its `tessera_controller::timing` debug events (the controller runs
//! with JSON logs and `RUST_LOG=info,tessera_controller::timing=debug`).
//! Checked: every claim allocated with its count of GPUs on one node and one NVLink island, no
//! device allocated twice, every pod released; 4-GPU claims on one NUMA node are counted.

use tessera_controller_harness as support;

#[path = "placement/support.rs"]
mod placement_support;

#[path = "placement/timeline.rs"]
mod timeline;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::runtime::watcher::{self, Event};
use placement_support::{
    ControllerProcess, Memory, MetricsSummary, Report, SizeStream, Topology, fragment, percentile,
};
use support::{NS, Source, devices_of, gated_pod, gpu_claim, node, shipped_classes};
use tessera_fake_apiserver::FakeApiServer;
use tessera_placement::protocol::is_gated;
use timeline::{ClaimTimeline, Clock, controller_steps};

/// How long the benchmark waits for the controller before declaring it stuck.
const PATIENCE: Duration = Duration::from_secs(300);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The claim names the benchmark created, with their GPU counts and creation instants.
#[derive(Default)]
struct Created {
    claims: Vec<(String, i64, Instant)>,
}

/// When each claim's allocation was first seen on the benchmark's watch.
type Allocated = Arc<Mutex<HashMap<String, Instant>>>;

/// Watches the claims in the fake (in-process) and records when each first has an allocation.
fn watch_allocations(api: &FakeApiServer) -> (Allocated, tokio::task::JoinHandle<()>) {
    let seen: Allocated = Arc::default();
    let claims: Api<ResourceClaim> = Api::namespaced(api.client(), NS);
    let record = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher::watcher(claims, watcher::Config::default()));
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            let claim = match event {
                Ok(Event::Apply(c) | Event::InitApply(c)) => c,
                Ok(_) => continue,
                Err(e) => panic!("the benchmark's claim watch failed: {e}"),
            };
            let allocated = claim
                .status
                .as_ref()
                .is_some_and(|s| s.allocation.is_some());
            if allocated && let Some(name) = claim.metadata.name {
                record
                    .lock()
                    .expect("allocation log")
                    .entry(name)
                    .or_insert(now);
            }
        }
    });
    (seen, task)
}

/// Creates one gated pod with one claim of `gpus` GPUs; returns the claim's name.
fn create_pod(api: &FakeApiServer, phase: &str, index: usize, gpus: i64) -> String {
    let claim = format!("{phase}-{index:04}-gpus");
    let pod = format!("{phase}-{index:04}");
    api.seed(&gpu_claim(&claim, gpus));
    api.seed(&gated_pod(&pod, &[("gpus", Source::Claim(&claim))]));
    claim
}

/// Waits until every claim in `created` is allocated.
async fn wait_allocated(seen: &Allocated, created: &Created) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let missing = {
            let seen = seen.lock().expect("allocation log");
            created
                .claims
                .iter()
                .filter(|(name, _, _)| !seen.contains_key(name))
                .count()
        };
        if missing == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} claims were not allocated within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The timelines of one phase's claims.
fn timelines(
    phase: &'static str,
    created: &Created,
    seen: &Allocated,
    clock: &Clock,
    steps: &HashMap<String, Vec<(String, f64)>>,
) -> Vec<ClaimTimeline> {
    let seen = seen.lock().expect("allocation log");
    let Some(start) = created.claims.iter().map(|c| c.2).min() else {
        return Vec::new();
    };
    created
        .claims
        .iter()
        .map(|(name, gpus, at)| {
            let instants = (
                clock.unix_micros(start),
                clock.unix_micros(*at),
                clock.unix_micros(seen[name]),
            );
            timeline::timeline(name, phase, *gpus, instants, steps)
        })
        .collect()
}

/// Latency figures of one phase.
fn phase_result(
    phase: &'static str,
    created: &Created,
    seen: &Allocated,
) -> placement_support::Phase {
    let seen = seen.lock().expect("allocation log");
    let mut latencies: Vec<Duration> = created
        .claims
        .iter()
        .map(|(name, _, at)| seen[name].saturating_duration_since(*at))
        .collect();
    latencies.sort_unstable();
    let first = created.claims.iter().map(|c| c.2).min().expect("claims");
    let last = created
        .claims
        .iter()
        .map(|(name, _, _)| seen[name])
        .max()
        .expect("claims");
    let seconds = last.saturating_duration_since(first).as_secs_f64();
    let mut slowest: Vec<(String, i64, f64)> = created
        .claims
        .iter()
        .map(|(name, gpus, at)| {
            let millis = seen[name].saturating_duration_since(*at).as_secs_f64() * 1e3;
            (name.clone(), *gpus, millis)
        })
        .collect();
    slowest.sort_by(|a, b| b.2.total_cmp(&a.2));
    slowest.truncate(5);
    let mut by_size: BTreeMap<i64, usize> = BTreeMap::new();
    for (_, gpus, _) in &created.claims {
        *by_size.entry(*gpus).or_default() += 1;
    }
    placement_support::Phase {
        phase,
        claims: created.claims.len(),
        claims_by_gpus: by_size,
        seconds,
        claims_per_second: created.claims.len() as f64 / seconds,
        p50_millis: percentile(&latencies, 50),
        p99_millis: percentile(&latencies, 99),
        max_millis: percentile(&latencies, 100),
        slowest,
    }
}

/// Waits until no benchmark pod is gated any more.
async fn wait_released(api: &FakeApiServer, pods: usize) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let released = api
            .list::<Pod>(Some(NS))
            .iter()
            .filter(|p| {
                let name = p.metadata.name.as_deref().unwrap_or_default();
                (name.starts_with("paced-") || name.starts_with("burst-"))
                    && !is_gated(p, tessera_api::names::TOPOLOGY_AWARE_GATE)
            })
            .count();
        if released == pods {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {released} of {pods} pods were released within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks every benchmark claim's allocation; returns how many 4-GPU claims are on one NUMA node.
fn check_allocations(api: &FakeApiServer, topology: &Topology, created: &[(String, i64)]) -> usize {
    let doubles = support::harness::double_allocations(api);
    assert!(doubles.is_empty(), "devices allocated twice: {doubles:?}");
    let claims: HashMap<String, ResourceClaim> = api
        .list::<ResourceClaim>(Some(NS))
        .into_iter()
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
        .collect();
    let mut numa_local_fours = 0;
    for (name, gpus) in created {
        let allocation = claims[name]
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .unwrap_or_else(|| panic!("claim {name} lost its allocation"));
        let results: Vec<_> = allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
            .collect();
        assert_eq!(
            results.len(),
            usize::try_from(*gpus).expect("positive"),
            "claim {name}: {:?}",
            devices_of(allocation)
        );
        let places: Vec<_> = results
            .iter()
            .map(|r| topology.place(&r.pool, &r.device))
            .collect();
        let (island, numa) = (&places[0].0, &places[0].1);
        assert!(
            results.iter().all(|r| r.pool == results[0].pool)
                && places.iter().all(|p| &p.0 == island),
            "claim {name} spans nodes or NVLink islands: {places:?}"
        );
        if *gpus == 4 && places.iter().all(|p| &p.1 == numa) {
            numa_local_fours += 1;
        }
    }
    numa_local_fours
}

/// The shipped classes and `nodes` topology-managed DGX H100 nodes with their slices, each
/// fragmented by pre-allocated claims: the topology seen, and how many claims were pre-allocated.
fn seed(api: &FakeApiServer, nodes: usize) -> (Topology, usize) {
    let seeding = Instant::now();
    for class in shipped_classes() {
        api.seed(&class);
    }
    let mut topology = Topology::default();
    let mut preallocated = 0;
    for i in 0..nodes {
        let name = format!("dgx-{i:04}");
        api.seed(&node(&name, true));
        for slice in support::dgx_slices(&name, true) {
            topology.add(&slice);
            api.seed(&slice);
        }
        preallocated += fragment(api, &name, i);
    }
    let seed_seconds = seeding.elapsed().as_secs_f64();
    println!(
        "seeded {nodes} nodes ({} GPUs, {preallocated} pre-allocated claims) in {seed_seconds:.1}s",
        topology.devices()
    );
    (topology, preallocated)
}

/// `count` gated pods with a claim each (`phase`-0, `phase`-1, ...), sizes from `sizes`: one per
/// `interval` (a paced stream, late ticks delayed rather than bunched), or all at once.
async fn create_pods(
    api: &FakeApiServer,
    phase: &str,
    count: usize,
    sizes: &mut SizeStream,
    interval: Option<Duration>,
) -> Created {
    let mut created = Created::default();
    let mut ticks = interval.map(|interval| {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    for i in 0..count {
        if let Some(ticks) = ticks.as_mut() {
            ticks.tick().await;
        }
        let gpus = sizes.next_size();
        let at = Instant::now();
        let claim = create_pod(api, phase, i, gpus);
        created.claims.push((claim, gpus, at));
    }
    created
}

/// Starts the controller against the fake API server, waits until it leads and its first sync has
/// settled, and reads its memory then: the controller, the seconds it took to lead, the memory.
async fn start_controller(
    kubeconfig: &std::path::Path,
    log: &std::path::Path,
) -> (ControllerProcess, f64, Memory) {
    // Another build of the controller (to compare two versions under the same load) may be named.
    let binary = std::env::var("TESSERA_BENCH_CONTROLLER")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_tessera-controller").to_owned());
    let controller = ControllerProcess::spawn(&binary, kubeconfig, log);
    let sync_seconds = controller.wait_leading(PATIENCE).await;
    // Let the allocator of the first sync settle before reading memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after_sync = Memory::of(controller.pid());
    println!(
        "controller ready and leading after {sync_seconds:.1}s; VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        after_sync.rss_mib, after_sync.hwm_mib
    );
    (controller, sync_seconds, after_sync)
}

async fn run() -> Report {
    let nodes = env_usize("TESSERA_BENCH_NODES", 1000);
    let paced_pods = env_usize("TESSERA_BENCH_PACED_PODS", 300);
    let interval = Duration::from_millis(
        env_usize("TESSERA_BENCH_PACED_INTERVAL_MS", 50)
            .try_into()
            .unwrap_or(50),
    );
    let burst_pods = env_usize("TESSERA_BENCH_BURST_PODS", 200);

    let clock = Clock::now();
    let api = FakeApiServer::new();
    // A real API server's watch cache holds far more than the fake's default 2,000 events; a
    // shorter history would make the controller relist (slices included) during the burst.
    api.set_history_limit(100_000);
    let (topology, preallocated) = seed(&api, nodes);

    let http = api.serve_http().await.expect("serve the fake over HTTP");
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("controller-placement.log");
    let (controller, sync_seconds, after_sync) =
        start_controller(http.kubeconfig_path(), &log).await;

    let (seen, watch) = watch_allocations(&api);
    let mut sizes = SizeStream::new(0x7e55_e7a5);
    let paced = create_pods(&api, "paced", paced_pods, &mut sizes, Some(interval)).await;
    wait_allocated(&seen, &paced).await;
    let after_paced = Memory::of(controller.pid());
    let burst = create_pods(&api, "burst", burst_pods, &mut sizes, None).await;
    wait_allocated(&seen, &burst).await;
    wait_released(&api, paced_pods + burst_pods).await;
    let after_workload = Memory::of(controller.pid());
    let metrics = MetricsSummary::parse(&controller.metrics().await);
    watch.abort();

    let created: Vec<(String, i64)> = paced
        .claims
        .iter()
        .chain(&burst.claims)
        .map(|(name, gpus, _)| (name.clone(), *gpus))
        .collect();
    let numa_local_fours = check_allocations(&api, &topology, &created);
    assert_eq!(
        metrics.claims_allocated,
        created.len() as u64,
        "the controller wrote exactly one allocation per claim"
    );
    let phases = vec![
        phase_result("paced", &paced, &seen),
        phase_result("burst", &burst, &seen),
    ];
    let fours = created.iter().filter(|(_, gpus)| *gpus == 4).count();
    controller.stop().await;
    let steps = controller_steps(&log);
    let mut claims = timelines("paced", &paced, &seen, &clock, &steps);
    claims.extend(timelines("burst", &burst, &seen, &clock, &steps));
    Report {
        nodes,
        gpus: topology.devices(),
        preallocated_claims: preallocated,
        paced_interval_millis: interval.as_secs_f64() * 1e3,
        sync_seconds,
        memory_after_sync: after_sync,
        memory_after_paced: after_paced,
        memory_after_workload: after_workload,
        phases,
        metrics,
        four_gpu_claims: fours,
        four_gpu_claims_numa_local: numa_local_fours,
        claims,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too, so keep it cheap then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("placement bench: run with `cargo bench -p tessera-controller --bench placement`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let report = runtime.block_on(run());
    let md = report.markdown();
    print!("{md}");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(
        dir.join("controller-placement.json"),
        serde_json::to_string_pretty(&report).expect("serializes"),
    )
    .expect("write json");
    std::fs::write(dir.join("controller-placement.md"), &md).expect("write markdown");
    println!("wrote {}/controller-placement.{{json,md}}", dir.display());
}
