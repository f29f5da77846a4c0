//! What publishing a node's pool costs, end to end through kube's client, against the
//! in-process API-server fake (so the figures are the plugin's side plus a cheap server):
//! render, GET /version (cached after the first), LIST of the node's slices, one server-side
//! apply per slice, and the taint check.
//!
//! - `first`: a new pool (every slice created);
//! - `unchanged`: republishing the same inventory (what a restart or a verify-triggered
//!   republish costs);
//! - `health-change`: a GPU's health taint set or cleared in turn (the path of a health event).
//!
//! Run with `cargo bench -p tessera-node --bench publish`.

use std::time::SystemTime;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Node;
use kube::api::ObjectMeta;
use prometheus_client::registry::Registry;
use tessera_fake_apiserver::FakeApiServer;
use tessera_gpu_inventory::{DeviceSource, MockSource};
use tessera_node::health::HealthFindings;
use tessera_node::metrics::NodeMetrics;
use tessera_node::publish::{PublishInput, Publisher, PublisherConfig, WatchedNode};
use tessera_nvml::{HealthEvent, HealthEventKind};

const CASES: &[(&str, &str, bool)] = &[
    ("dgx-h100", "8 devices", false),
    ("hgx-a100-mig", "21 devices, static MIG", false),
    ("hgx-a100-mig", "108 devices, dynamic MIG", true),
];

fn setup(dynamic_mig: bool) -> (FakeApiServer, Publisher, WatchedNode) {
    let server = FakeApiServer::new();
    let node = server.seed(&Node {
        metadata: ObjectMeta {
            name: Some("node-a".into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    });
    let publisher = Publisher::new(
        server.client(),
        PublisherConfig {
            node_name: "node-a".into(),
            driver_name: "gpu.tessera.dev".into(),
            dynamic_mig,
            consumable_shares: Default::default(),
        },
        NodeMetrics::new(&mut Registry::default()),
    );
    (
        server,
        publisher,
        WatchedNode::of(&node).expect("seeded nodes have a uid"),
    )
}

fn publish(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let mut group = c.benchmark_group("publish");
    for (topology, label, dynamic_mig) in CASES {
        let inventory = MockSource::new(topology).unwrap().inventory().unwrap();
        let none = HealthFindings::default();
        let id = |what: &str| BenchmarkId::new(what, format!("{topology} ({label})"));

        group.bench_function(id("first"), |b| {
            b.iter_batched(
                || runtime.block_on(async { setup(*dynamic_mig) }),
                |(_server, mut publisher, node)| {
                    runtime.block_on(async {
                        let input = PublishInput {
                            inventory: &inventory,
                            node: &node,
                            findings: &none,
                        };
                        publisher.publish(input).await.expect("publish");
                    })
                },
                criterion::BatchSize::SmallInput,
            )
        });

        let (_server, mut publisher, node) = runtime.block_on(async { setup(*dynamic_mig) });
        group.bench_function(id("unchanged"), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let input = PublishInput {
                        inventory: &inventory,
                        node: &node,
                        findings: &none,
                    };
                    publisher.publish(input).await.expect("publish");
                })
            })
        });

        // Alternates between no finding and one tainted GPU: every publish changes a slice.
        let mut tainted = HealthFindings::default();
        tainted.record(
            &HealthEvent {
                gpu_uuid: inventory.gpus[0].uuid.clone(),
                kind: HealthEventKind::Xid(79),
                gpu_instance_id: None,
                compute_instance_id: None,
            },
            SystemTime::now(),
        );
        let mut sick = false;
        group.bench_function(id("health-change"), |b| {
            b.iter(|| {
                sick = !sick;
                let findings = if sick { &tainted } else { &none };
                runtime.block_on(async {
                    let input = PublishInput {
                        inventory: &inventory,
                        node: &node,
                        findings,
                    };
                    publisher.publish(input).await.expect("publish");
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, publish);
criterion_main!(benches);
