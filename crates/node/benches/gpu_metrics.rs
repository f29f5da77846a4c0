//! What the per-device GPU metrics cost the node plugin per sample:
//!
//! - `nvml-sample`: reading every GPU of a `dgx-h100` node (8 GPUs) through the real NVML code
//!   path (`NvmlSource::telemetry`: nvml-wrapper's `utilization_rates`, `memory_info`,
//!   `power_usage`, `temperature`, `total_ecc_errors` twice) on fake-nvml with a samples file;
//!   the fake answers from memory (it checks the samples file for changes on each call), so
//!   this is the plugin's side of the calls, not a GPU driver's;
//! - `label-and-export`: labelling one sample with the claims and pods holding the devices and
//!   updating the Prometheus families (`series` + `GpuMetrics::update`), for 8 GPUs held by 8
//!   claims and for 8 GPUs shared by 64 claims (8 each, consumable shares), one pod each.
//!
//! Run with `cargo bench -p tessera-node --bench gpu_metrics`. fake-nvml reads its topology from
//! the environment at the first `nvmlInit`, so the bench runs itself again with it set.

use std::collections::HashMap;
use std::path::PathBuf;

use criterion::{BenchmarkId, Criterion, criterion_group};
use prometheus_client::registry::Registry;
use tessera_gpu_inventory::{DeviceSource, MockSource};
use tessera_kubelet_grpc::ClaimUid;
use tessera_node::gpu_metrics::{GpuMetrics, PodRef, series};
use tessera_nvml::{GpuTelemetry, NvmlSource};
use tessera_prepare::HeldDevice;

/// The fake NVML library cargo built next to this bench (a dev-dependency).
fn fake_nvml_library() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the bench executable");
    let deps = exe
        .parent()
        .expect("the bench executable is in a directory");
    [
        deps.join(tessera_fake_nvml::LIBRARY_FILE_NAME),
        deps.join("..").join(tessera_fake_nvml::LIBRARY_FILE_NAME),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("libtessera_fake_nvml.so next to the bench executable")
}

fn holders(
    gpus: &[GpuTelemetry],
    per_gpu: usize,
) -> (Vec<HeldDevice>, HashMap<ClaimUid, Vec<PodRef>>) {
    let mut holders = Vec::new();
    let mut pods = HashMap::new();
    for (index, gpu) in gpus.iter().enumerate() {
        for share in 0..per_gpu {
            let uid = format!("claim-{index}-{share}");
            holders.push(HeldDevice {
                claim_uid: ClaimUid::new(&uid),
                namespace: "ml".into(),
                claim: uid.clone(),
                request: "gpu".into(),
                device: format!("gpu-{index}"),
                gpu_uuid: gpu.uuid.clone(),
            });
            pods.insert(
                ClaimUid::new(&uid),
                vec![PodRef {
                    namespace: "ml".into(),
                    name: format!("{uid}-pod"),
                    uid: format!("{uid}-pod-uid"),
                }],
            );
        }
    }
    (holders, pods)
}

fn gpu_metrics(c: &mut Criterion) {
    let nvml = NvmlSource::open(Some(&fake_nvml_library())).expect("open the fake NVML");
    let mut group = c.benchmark_group("gpu-metrics");
    group.bench_function(BenchmarkId::new("nvml-sample", "dgx-h100 (8 GPUs)"), |b| {
        b.iter(|| nvml.telemetry().expect("sample"))
    });

    let gpus = nvml.telemetry().expect("sample");
    assert_eq!(gpus.len(), 8);
    assert_eq!(
        gpus[0].utilization_percent,
        Some(40),
        "the samples file is read"
    );
    let names: HashMap<String, String> = MockSource::new("dgx-h100")
        .unwrap()
        .inventory()
        .unwrap()
        .gpus
        .iter()
        .map(|g| (g.uuid.clone(), format!("gpu-{}", g.minor)))
        .collect();
    for (per_gpu, label) in [(1, "8 GPUs, 8 claims"), (8, "8 GPUs, 64 claims")] {
        let (holders, pods) = holders(&gpus, per_gpu);
        let metrics = GpuMetrics::new(&mut Registry::default());
        group.bench_function(BenchmarkId::new("label-and-export", label), |b| {
            b.iter(|| {
                let labelled = series(&gpus, &holders, &pods, |uuid| names.get(uuid).cloned());
                metrics.update(&labelled, |_| 0);
            })
        });
        assert_eq!(metrics.series_count(), 8 * per_gpu);
    }
    group.finish();
}

criterion_group!(benches, gpu_metrics);

fn main() {
    // fake-nvml answers from the topology and samples file its environment names; set them for
    // a child run of this same bench.
    if std::env::var_os(tessera_fake_nvml::TOPOLOGY_ENV).is_none() {
        let samples = tempfile::NamedTempFile::new().expect("a samples file");
        std::fs::write(
            samples.path(),
            "* utilization=40 power-watts=300 temperature=55\n",
        )
        .expect("write the samples file");
        let status = std::process::Command::new(std::env::current_exe().expect("own path"))
            .args(std::env::args_os().skip(1))
            .env(tessera_fake_nvml::TOPOLOGY_ENV, "dgx-h100")
            .env(tessera_fake_nvml::SAMPLES_ENV, samples.path())
            .status()
            .expect("run the bench again with the fake NVML's topology");
        drop(samples);
        std::process::exit(status.code().unwrap_or(1));
    }
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
