//! NodePrepareResources latency through the real path: a simulated kubelet calls the node driver
//! over unix sockets (gRPC `v1`), the driver reads the claims through kube from the in-process
//! API-server fake, plans, records the checkpoint (fsync), writes CDI specs (fsync) and answers.
//! A bench binary, not criterion: the result is the latency distribution (p50/p99) of many
//! sequential calls. Each prepare is followed by an (also timed) unprepare of the same batch.
//!
//! ```text
//! cargo bench -p tessera-node --bench prepare
//! TESSERA_BENCH_STATE_DIR=/dev/shm/x cargo bench -p tessera-node --bench prepare   # state on tmpfs
//! ```
//!
//! Two layouts are measured: the checkpoint on the target disk with the CDI specs on `/dev/shm`
//! (tmpfs, as `/var/run/cdi` is on nodes), and both on the target disk (Cargo's benchmark
//! temporary directory). `TESSERA_BENCH_STATE_DIR` / `TESSERA_BENCH_CDI_ROOT` measure one
//! layout of your choice instead; `TESSERA_BENCH_ITERATIONS` sets the calls per row. Prints a markdown table and writes
//! `node-prepare.json` and `node-prepare.md` under Cargo's benchmark temporary directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};
use tessera_api::DRIVER_NAME;
use tessera_fake_apiserver::FakeApiServer;
use tessera_gpu_inventory::{DeviceSource, MockSource};
use tessera_kubelet_grpc::simulator::KubeletSimulator;
use tessera_kubelet_grpc::{ClaimRef, PluginConfig};
use tessera_node::claims::KubeClaimSource;
use tessera_prepare::inventory::NodeInventory;
use tessera_prepare::mig::SimulatedMig;
use tessera_prepare::plan::MigMode;
use tessera_prepare::sharing::SimulatedGpuControl;
use tessera_prepare::{DriverParts, NodeDriver, NodeDriverConfig};

const NODE: &str = "node-a";

struct Scenario {
    name: &'static str,
    topology: &'static str,
    mig_mode: MigMode,
    /// (request, device) of each claim of the batch, one claim per entry.
    devices: Vec<&'static str>,
    config: Option<Value>,
}

fn scenarios() -> Vec<Scenario> {
    let gpus = |n: usize| -> Vec<&'static str> {
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7",
        ][..n]
            .to_vec()
    };
    vec![
        Scenario {
            name: "1 claim, whole GPU",
            topology: "dgx-h100",
            mig_mode: MigMode::Static,
            devices: gpus(1),
            config: None,
        },
        Scenario {
            name: "8 claims, whole GPUs",
            topology: "dgx-h100",
            mig_mode: MigMode::Static,
            devices: gpus(8),
            config: None,
        },
        Scenario {
            name: "8 claims, whole GPUs, MPS (simulated)",
            topology: "dgx-h100",
            mig_mode: MigMode::Static,
            devices: gpus(8),
            config: Some(
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig",
                                "sharing": {"strategy": "MPS"}}),
            ),
        },
        Scenario {
            name: "8 claims, dynamic MIG (simulated)",
            topology: "hgx-a100-mig",
            mig_mode: MigMode::Dynamic,
            devices: vec![
                "gpu-0-mig-1g-10gb-0",
                "gpu-0-mig-1g-10gb-1",
                "gpu-1-mig-1g-10gb-0",
                "gpu-1-mig-1g-10gb-1",
                "gpu-2-mig-1g-10gb-0",
                "gpu-2-mig-1g-10gb-1",
                "gpu-3-mig-1g-10gb-0",
                "gpu-3-mig-1g-10gb-1",
            ],
            config: None,
        },
    ]
}

fn claim(index: usize, device: &str, config: Option<&Value>) -> (ResourceClaim, ClaimRef) {
    let name = format!("bench-{index}");
    let uid = format!("be0c0000-0000-4000-8000-{index:012}");
    let configs: Vec<Value> = config
        .map(|parameters| {
            vec![json!({"source": "FromClaim", "requests": [],
                        "opaque": {"driver": DRIVER_NAME, "parameters": parameters}})]
        })
        .unwrap_or_default();
    let object = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "bench", "name": name, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": NODE, "device": device}],
            "config": configs}},
          "reservedFor": [{"resource": "pods", "name": "p", "uid": "p"}]},
    }))
    .expect("a valid claim");
    (object, ClaimRef::new("bench", name, uid))
}

#[derive(Debug, serde::Serialize)]
struct Distribution {
    p50_micros: u64,
    p90_micros: u64,
    p99_micros: u64,
    max_micros: u64,
}

fn distribution(mut samples: Vec<Duration>) -> Distribution {
    samples.sort();
    let at = |q: f64| {
        let index = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[index].as_micros() as u64
    };
    Distribution {
        p50_micros: at(0.50),
        p90_micros: at(0.90),
        p99_micros: at(0.99),
        max_micros: samples.last().map_or(0, |d| d.as_micros() as u64),
    }
}

#[derive(Debug, serde::Serialize)]
struct Outcome {
    scenario: &'static str,
    claims_per_call: usize,
    calls: usize,
    prepare: Distribution,
    unprepare: Distribution,
}

async fn run(scenario: &Scenario, state_dir: &Path, cdi_root: &Path, iterations: usize) -> Outcome {
    let api = FakeApiServer::new();
    let claims: Vec<ClaimRef> = scenario
        .devices
        .iter()
        .enumerate()
        .map(|(i, device)| {
            let (object, reference) = claim(i, device, scenario.config.as_ref());
            api.seed(&object);
            reference
        })
        .collect();
    let source = MockSource::new(scenario.topology).expect("shipped topology");
    let inventory = source.inventory().expect("inventory");
    let boot_id = state_dir.join("boot_id");
    std::fs::create_dir_all(state_dir).expect("state dir");
    std::fs::write(&boot_id, "bench").expect("boot id");
    let config = NodeDriverConfig::new(NODE, cdi_root, state_dir.join("state"))
        .mig_mode(scenario.mig_mode)
        .boot_id_path(boot_id);
    let parts = DriverParts {
        inventory: Arc::new(NodeInventory::read(Arc::new(source)).expect("inventory")),
        claims: Arc::new(KubeClaimSource::new(api.client())),
        gpu: Arc::new(SimulatedGpuControl::new(state_dir.join("simulated-gpu"))),
        mig: Arc::new(SimulatedMig::in_memory(&inventory)),
        imex: Arc::new(tessera_prepare::imex::NoImex),
    };
    let (driver, _) = NodeDriver::start(config, parts)
        .await
        .expect("driver starts");
    let kubelet_dir = tempfile::tempdir().expect("kubelet dir");
    let plugin = PluginConfig::new(DRIVER_NAME)
        .registrar_dir(kubelet_dir.path().join("registry"))
        .plugins_dir(kubelet_dir.path().join("plugins"))
        .bind(Arc::new(driver))
        .expect("sockets");
    let registration = plugin.socket_paths().registration.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(plugin.serve(async {
        let _ = stopped.await;
    }));
    let kubelet = KubeletSimulator::register(&registration)
        .await
        .expect("registers");

    let warmup = 20;
    let mut prepares = Vec::with_capacity(iterations);
    let mut unprepares = Vec::with_capacity(iterations);
    for i in 0..warmup + iterations {
        let start = Instant::now();
        let prepared = kubelet.prepare(&claims).await.expect("prepare call");
        let prepare = start.elapsed();
        assert!(prepared.values().all(Result::is_ok), "{prepared:?}");
        let start = Instant::now();
        let unprepared = kubelet.unprepare(&claims).await.expect("unprepare call");
        let unprepare = start.elapsed();
        assert!(unprepared.values().all(Result::is_ok), "{unprepared:?}");
        if i >= warmup {
            prepares.push(prepare);
            unprepares.push(unprepare);
        }
    }
    let _ = stop.send(());
    serving.await.expect("serve task").expect("serve");
    Outcome {
        scenario: scenario.name,
        claims_per_call: claims.len(),
        calls: iterations,
        prepare: distribution(prepares),
        unprepare: distribution(unprepares),
    }
}

/// The file system type of `path` (longest mount point prefix in /proc/mounts).
fn file_system(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, mount, kind) = (fields.next()?, fields.next()?, fields.next()?);
            path.starts_with(mount)
                .then(|| (mount.len(), kind.to_owned()))
        })
        .max()
        .map_or_else(|| "unknown".to_owned(), |(_, kind)| kind)
}

/// Where the checkpoint (state directory) and the CDI specs go.
struct Layout {
    state_root: PathBuf,
    cdi_root: PathBuf,
}

impl Layout {
    fn describe(&self) -> String {
        format!(
            "checkpoint on {}, CDI specs on {}",
            file_system(&self.state_root),
            file_system(&self.cdi_root)
        )
    }
}

/// The layouts to measure: those the environment names, or the node's (checkpoint on disk,
/// CDI specs on tmpfs as /var/run/cdi is) and everything on the disk.
fn layouts(target_tmp: &Path, guards: &mut Vec<tempfile::TempDir>) -> Vec<Layout> {
    let mut temp = |parent: &Path| {
        let dir = tempfile::tempdir_in(parent).expect("temporary directory");
        let path = dir.path().to_owned();
        guards.push(dir);
        path
    };
    let state = std::env::var_os("TESSERA_BENCH_STATE_DIR").map(PathBuf::from);
    let cdi = std::env::var_os("TESSERA_BENCH_CDI_ROOT").map(PathBuf::from);
    if state.is_some() || cdi.is_some() {
        return vec![Layout {
            state_root: state.unwrap_or_else(|| temp(target_tmp)),
            cdi_root: cdi.unwrap_or_else(|| temp(target_tmp)),
        }];
    }
    let shm = Path::new("/dev/shm");
    let mut layouts = Vec::new();
    if shm.is_dir() {
        layouts.push(Layout {
            state_root: temp(target_tmp),
            cdi_root: temp(shm),
        });
    }
    layouts.push(Layout {
        state_root: temp(target_tmp),
        cdi_root: temp(target_tmp),
    });
    layouts
}

fn main() {
    let target_tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let mut guards = Vec::new();
    let layouts = layouts(target_tmp, &mut guards);
    let iterations: usize = std::env::var("TESSERA_BENCH_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut md = format!(
        "{iterations} sequential calls per row after 20 warm-up calls; every file write is fsynced \
         (file and directory).\n\n\
         | layout | scenario | claims per call | prepare p50 | prepare p99 | prepare max | unprepare p50 | unprepare p99 |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    let ms = |micros: u64| format!("{:.2} ms", micros as f64 / 1000.0);
    let mut results = Vec::new();
    for layout in &layouts {
        let described = layout.describe();
        for (n, scenario) in scenarios().iter().enumerate() {
            let state_dir = layout.state_root.join(format!("scenario-{n}"));
            let cdi = layout.cdi_root.join(format!("scenario-{n}"));
            let o = runtime.block_on(run(scenario, &state_dir, &cdi, iterations));
            let _ = std::fs::remove_dir_all(&state_dir);
            let _ = std::fs::remove_dir_all(&cdi);
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                described,
                o.scenario,
                o.claims_per_call,
                ms(o.prepare.p50_micros),
                ms(o.prepare.p99_micros),
                ms(o.prepare.max_micros),
                ms(o.unprepare.p50_micros),
                ms(o.unprepare.p99_micros),
            ));
            results.push(json!({"layout": described, "outcome": o}));
        }
    }
    print!("{md}");
    let json = json!({"iterations": iterations, "results": results});
    std::fs::write(
        target_tmp.join("node-prepare.json"),
        serde_json::to_string_pretty(&json).expect("serializes"),
    )
    .expect("write json");
    std::fs::write(target_tmp.join("node-prepare.md"), &md).expect("write markdown");
    println!("wrote {}/node-prepare.{{json,md}}", target_tmp.display());
}
