//! A DaemonSet rolling update with surge, as processes: the old plugin serves, a new one starts
//! beside it on the same node (per-pod sockets from `--pod-uid`, one state directory), the
//! kubelet switches to the newer registration, the old one gets SIGTERM — while a loop prepares
//! and unprepares claims the whole time. No call may fail or take more than 2 s, and the old
//! plugin removes only its own sockets. A plugin killed without removing its sockets has them
//! removed by the next one that starts.

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use serde_json::json;
use support::process::*;
use tessera_kubelet_grpc::ClaimRef;
use tessera_kubelet_grpc::simulator::KubeletSimulator;
use tokio::sync::{RwLock, watch};

const OLD_POD: &str = "0a0a0a0a-1111-4111-8111-000000000001";
const NEW_POD: &str = "0b0b0b0b-2222-4222-8222-000000000002";
const LAST_POD: &str = "0c0c0c0c-3333-4333-8333-000000000003";
const MOST_A_CALL_MAY_TAKE: Duration = Duration::from_secs(2);

fn registration_socket(dirs: &PluginDirs, pod: &str) -> PathBuf {
    dirs.path("reg")
        .join(format!("gpu.tessera.dev-{pod}-reg.sock"))
}

fn dra_socket(dirs: &PluginDirs, pod: &str) -> PathBuf {
    dirs.path("plugins")
        .join("gpu.tessera.dev")
        .join(format!("dra-{pod}.sock"))
}

fn start(http: &tessera_fake_apiserver::HttpServer, dirs: &PluginDirs, pod: &str) -> PluginProcess {
    PluginProcess::start(
        http.kubeconfig_path(),
        dirs,
        &["--topology", "dgx-h100"],
        &[("TESSERA_POD_UID", pod.to_owned())],
    )
}

async fn register_with(dirs: &PluginDirs, pod: &str) -> KubeletSimulator {
    let socket = registration_socket(dirs, pod);
    eventually(
        dirs,
        &format!("pod {pod} to register"),
        Duration::from_secs(30),
        async || {
            if !socket.exists() {
                return None;
            }
            KubeletSimulator::register(&socket).await.ok()
        },
    )
    .await
}

/// What the loop saw: calls made, failures, the slowest call.
#[derive(Debug, Default)]
struct Calls {
    made: usize,
    failures: Vec<String>,
    slowest: Duration,
}

/// Prepares and unprepares `claims` in turn through whichever plugin `kubelet` holds now, until
/// `stop` turns true.
async fn prepare_loop(
    kubelet: Arc<RwLock<KubeletSimulator>>,
    claims: Vec<ClaimRef>,
    mut stop: watch::Receiver<bool>,
) -> Calls {
    let mut calls = Calls::default();
    while !*stop.borrow_and_update() {
        for claim in &claims {
            for prepare in [true, false] {
                let plugin = kubelet.read().await;
                let started = Instant::now();
                let failure = if prepare {
                    match plugin.prepare(std::slice::from_ref(claim)).await {
                        Ok(results) => results[&claim.uid].clone().err().map(|e| e.to_string()),
                        Err(e) => Some(e.to_string()),
                    }
                } else {
                    match plugin.unprepare(std::slice::from_ref(claim)).await {
                        Ok(results) => results[&claim.uid].clone().err().map(|e| e.to_string()),
                        Err(e) => Some(e.to_string()),
                    }
                };
                calls.slowest = calls.slowest.max(started.elapsed());
                calls.made += 1;
                if let Some(failure) = failure {
                    calls.failures.push(format!("{claim}: {failure}"));
                }
            }
        }
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_update_hands_over_without_a_failed_or_slow_call() {
    let (server, http, _node) = api_server_with_node().await;
    let dirs = PluginDirs::new();
    let claims: Vec<ClaimRef> = (0..4)
        .map(|i| {
            let configs = if i % 2 == 0 {
                vec![tessera_prepare_harness::claim_config(
                    &[],
                    "GpuConfig",
                    json!({"strategy": "MPS"}),
                )]
            } else {
                Vec::new()
            };
            let name = format!("c{i}");
            let claim = server.seed(&tessera_prepare_harness::allocated_claim(
                &name,
                &[("gpu", &format!("gpu-{i}"))],
                configs,
            ));
            ClaimRef::new("ml", &name, claim.uid().unwrap())
        })
        .collect();
    let old = start(&http, &dirs, OLD_POD);
    let kubelet = Arc::new(RwLock::new(register_with(&dirs, OLD_POD).await));
    let (stop, stopped) = watch::channel(false);
    let looping = tokio::spawn(prepare_loop(Arc::clone(&kubelet), claims.clone(), stopped));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The surge: a new pod on the node, beside the old one; the kubelet prefers the newer.
    let new = start(&http, &dirs, NEW_POD);
    let newer = register_with(&dirs, NEW_POD).await;
    *kubelet.write().await = newer;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The old pod is deleted once the new one is ready.
    assert!(old.terminate().success(), "{}", plugin_logs(&dirs));
    assert!(!registration_socket(&dirs, OLD_POD).exists());
    assert!(!dra_socket(&dirs, OLD_POD).exists());
    assert!(registration_socket(&dirs, NEW_POD).exists());
    assert!(dra_socket(&dirs, NEW_POD).exists());
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.send(true).unwrap();
    let calls = looping.await.unwrap();
    println!(
        "calls during the rollout: {} made, slowest {:?}",
        calls.made, calls.slowest
    );
    assert!(
        calls.failures.is_empty(),
        "{calls:?}\n{}",
        plugin_logs(&dirs)
    );
    assert!(calls.slowest <= MOST_A_CALL_MAY_TAKE, "{calls:?}");
    assert!(calls.made >= 16, "{calls:?}");

    // A plugin killed without cleaning up: the next one removes its sockets.
    new.kill();
    assert!(registration_socket(&dirs, NEW_POD).exists());
    let last = start(&http, &dirs, LAST_POD);
    let kubelet = register_with(&dirs, LAST_POD).await;
    assert!(!registration_socket(&dirs, NEW_POD).exists());
    assert!(!dra_socket(&dirs, NEW_POD).exists());
    // Everything the loop left prepared is still known (and unprepared) by the last one.
    let unprepared = kubelet.unprepare(&claims).await.unwrap();
    assert!(unprepared.values().all(Result::is_ok), "{unprepared:?}");
    let specs = std::fs::read_dir(dirs.path("cdi")).map_or(0, |d| d.count());
    assert_eq!(specs, 0);
    drop(last);
}
