//! What the gRPC plumbing alone costs a NodePrepareResources call: a simulated kubelet calls a
//! driver that answers at once, over real unix sockets, with batches of 1 and 8 claims.
//! The node plugin's own benchmark adds its work (API reads, CDI, checkpoint) on top.
//!
//! Run with `cargo bench -p tessera-kubelet-grpc`.

use std::collections::BTreeMap;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tessera_kubelet_grpc::simulator::KubeletSimulator;
use tessera_kubelet_grpc::{
    ClaimRef, ClaimUid, DraDriver, PluginConfig, PrepareResult, PreparedDevice, UnprepareResult,
};

/// Answers every claim with one device, doing no work.
struct InstantDriver;

impl DraDriver for InstantDriver {
    type Error = String;

    async fn prepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, PrepareResult> {
        claims
            .into_iter()
            .map(|claim| {
                let device = PreparedDevice {
                    request_names: vec!["gpu".into()],
                    pool_name: "node-a".into(),
                    device_name: "gpu-0".into(),
                    cdi_device_ids: vec![format!("gpu.tessera.dev/claim={}-gpu-0", claim.uid)],
                    share_id: None,
                };
                (claim.uid, Ok(vec![device]))
            })
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, UnprepareResult> {
        claims
            .into_iter()
            .map(|claim| (claim.uid, Ok(())))
            .collect()
    }
}

fn prepare_roundtrip(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let root = tempfile::tempdir().expect("temporary directory");
    let plugin = PluginConfig::new("gpu.tessera.dev")
        .registrar_dir(root.path().join("plugins_registry"))
        .plugins_dir(root.path().join("plugins"))
        .bind(Arc::new(InstantDriver))
        .expect("bind");
    let registration = plugin.socket_paths().registration.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = runtime.spawn(plugin.serve(async {
        let _ = stopped.await;
    }));
    let kubelet = runtime
        .block_on(KubeletSimulator::register(&registration))
        .expect("register");

    let mut group = c.benchmark_group("NodePrepareResources round trip (no-op driver)");
    for batch in [1, 8] {
        let claims: Vec<ClaimRef> = (0..batch)
            .map(|i| ClaimRef::new("bench", format!("claim-{i}"), format!("uid-{i}")))
            .collect();
        group.bench_with_input(BenchmarkId::from_parameter(batch), &claims, |b, claims| {
            b.iter(|| runtime.block_on(kubelet.prepare(claims)).expect("prepare"));
        });
    }
    group.finish();

    let _ = stop.send(());
    runtime
        .block_on(serving)
        .expect("serve task")
        .expect("serve");
}

criterion_group!(benches, prepare_roundtrip);
criterion_main!(benches);
