//! Rendering time per node: 1,000 nodes mixing the shipped topologies, static and dynamic MIG,
//! 1.34 and 1.35 forms, topology-managed or not. Inventories are loaded up front; only
//! `render_slices` (including its validation and limit checks) is timed.
//!
//! `cargo bench -p tessera-gpu-inventory --bench render` — see docs/benchmarks.md.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tessera_gpu_inventory::{
    DeviceSource, GpuInventory, MockSource, RenderOptions, ServerVersion, render_slices,
};

const NODES: usize = 1_000;

/// (topology, server version, dynamic MIG, topology-managed)
const MIX: &[(&str, ServerVersion, bool, bool)] = &[
    ("dgx-h100", ServerVersion::V1_35, false, true),
    ("hgx-a100-mig", ServerVersion::V1_34, false, false),
    ("hgx-a100-mig", ServerVersion::V1_35, true, true),
    ("hgx-a100-mig", ServerVersion::V1_34, true, false),
    ("pcie-l40s", ServerVersion::V1_34, false, false),
    ("pcie-a100-nvlink-pairs", ServerVersion::V1_35, false, true),
    ("gb200-tray", ServerVersion::V1_35, false, false),
];

fn inventory(name: &str) -> GpuInventory {
    MockSource::new(name)
        .and_then(|s| s.inventory())
        .unwrap_or_else(|e| panic!("shipped topology {name}: {e}"))
}

fn cluster() -> Vec<(GpuInventory, RenderOptions)> {
    let inventories: Vec<GpuInventory> = MIX.iter().map(|(name, ..)| inventory(name)).collect();
    (0..NODES)
        .map(|i| {
            let (_, server, dynamic_mig, managed) = MIX[i % MIX.len()];
            let options = RenderOptions {
                server_version: server,
                dynamic_mig,
                topology_managed: managed,
                ..RenderOptions::new(format!("node-{i:04}"))
            };
            (inventories[i % MIX.len()].clone(), options)
        })
        .collect()
}

fn render_cluster(c: &mut Criterion) {
    let nodes = cluster();
    let mut group = c.benchmark_group("render");
    group.throughput(Throughput::Elements(NODES as u64));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function("1000-nodes-mixed", |b| {
        b.iter(|| {
            let mut slices = 0;
            for (inventory, options) in &nodes {
                slices += render_slices(black_box(inventory), black_box(options))
                    .expect("shipped topologies render")
                    .len();
            }
            slices
        })
    });
    group.finish();
}

fn render_each_topology(c: &mut Criterion) {
    let mut group = c.benchmark_group("render-one-node");
    group.sample_size(50);
    for &(name, server, dynamic_mig, managed) in MIX {
        let inventory = inventory(name);
        let options = RenderOptions {
            server_version: server,
            dynamic_mig,
            topology_managed: managed,
            ..RenderOptions::new("node-1")
        };
        let id = format!(
            "{name}/{server}{}{}",
            if dynamic_mig { "/dynamic-mig" } else { "" },
            if managed { "/managed" } else { "" }
        );
        group.bench_function(id, |b| {
            b.iter(|| render_slices(black_box(&inventory), black_box(&options)))
        });
    }
    group.finish();
}

criterion_group!(benches, render_cluster, render_each_topology);
criterion_main!(benches);
