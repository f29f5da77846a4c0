//! Two plugin processes on one node, as during a DaemonSet rolling update with surge: two
//! drivers on one state directory and one CDI directory (each with its own memory, as two
//! processes have), the kubelet sending any call to either. Every prepare and unprepare must
//! succeed, and the state on disk must be what the calls did.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tessera_api::config::TimeSliceInterval;
use tessera_kubelet_grpc::{ClaimRef, DraDriver};
use tessera_prepare::NodeDriver;
use tessera_prepare::checkpoint::ClaimState;
use tessera_prepare::plan::MigMode;
use tessera_prepare::sharing::{
    GpuControl, MpsDaemon, MpsDirectories, RecordingGpuControl, SharingError,
};
use tessera_prepare_harness::{Harness, claim_config};
use tessera_test_support::SplitMix64;

async fn prepared(driver: &NodeDriver, claim: &ClaimRef) {
    let results = driver.prepare(vec![claim.clone()]).await;
    if let Err(e) = &results[&claim.uid] {
        panic!("prepare of {claim} failed: {e}");
    }
}

async fn unprepared(driver: &NodeDriver, claim: &ClaimRef) {
    let results = driver.unprepare(vec![claim.clone()]).await;
    if let Err(e) = &results[&claim.uid] {
        panic!("unprepare of {claim} failed: {e}");
    }
}

#[tokio::test]
async fn a_claim_unprepared_by_the_other_plugin_is_prepared_again_not_answered_from_memory() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (old, _) = h.start().await;
    let (new, _) = h.start().await;
    let claim = h.claim("train", &[("gpu", "gpu-1")], vec![]);
    prepared(&old, &claim).await;
    unprepared(&new, &claim).await;
    assert!(h.spec_uids().is_empty());
    assert!(h.read_checkpoint().claims.is_empty());

    // The old plugin prepared it last, but the other one took it back since.
    prepared(&old, &claim).await;
    assert_eq!(
        h.spec_uids(),
        vec![claim.uid.to_string()],
        "its spec is back"
    );
    let checkpoint = h.read_checkpoint();
    assert_eq!(
        checkpoint.claims[&claim.uid].state,
        ClaimState::PrepareCompleted
    );
    // And the new plugin knows it is prepared, from the file.
    h.claims.remove("ml", "train");
    prepared(&new, &claim).await;
    unprepared(&new, &claim).await;
    assert!(h.spec_uids().is_empty());
}

#[tokio::test]
async fn changes_of_both_plugins_are_kept() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (old, _) = h.start().await;
    let (new, _) = h.start().await;
    let a = h.claim("a", &[("gpu", "gpu-0")], vec![]);
    let b = h.claim("b", &[("gpu", "gpu-1")], vec![]);
    prepared(&old, &a).await;
    // Without reading the old plugin's record first, this write would drop it.
    prepared(&new, &b).await;
    let recorded: Vec<String> = h
        .read_checkpoint()
        .claims
        .keys()
        .map(ToString::to_string)
        .collect();
    assert_eq!(recorded, h.spec_uids());
    assert_eq!(recorded.len(), 2);
    unprepared(&old, &b).await;
    unprepared(&new, &a).await;
    assert!(h.read_checkpoint().claims.is_empty());
    assert!(h.spec_uids().is_empty());
}

/// A sharing control whose next MPS start waits until the test lets it go, so a batch can be
/// stopped half-way (its claim recorded as `PrepareStarted`).
struct PausedGpuControl {
    inner: RecordingGpuControl,
    paused: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
}

impl GpuControl for PausedGpuControl {
    fn set_time_slice(&self, gpu: &str, interval: TimeSliceInterval) -> Result<(), SharingError> {
        self.inner.set_time_slice(gpu, interval)
    }

    fn start_mps(&self, daemon: &MpsDaemon) -> Result<(), SharingError> {
        let paused = self.paused.lock().unwrap().take();
        if let Some((reached, go_on)) = paused {
            reached.send(()).unwrap();
            go_on.recv().unwrap();
        }
        self.inner.start_mps(daemon)
    }

    fn stop_mps(&self, directories: &MpsDirectories) -> Result<(), SharingError> {
        self.inner.stop_mps(directories)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_starting_beside_a_busy_one_waits_instead_of_undoing_its_work() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (reached_sender, reached) = mpsc::channel();
    let (go_on, go_on_receiver) = mpsc::channel();
    let gpu = Arc::new(PausedGpuControl {
        inner: RecordingGpuControl::new(),
        paused: Mutex::new(Some((reached_sender, go_on_receiver))),
    });
    let mut parts = h.parts();
    parts.gpu = gpu.clone();
    let (old, _) = NodeDriver::start(h.config.clone(), parts).await.unwrap();
    let claim = h.claim(
        "mps",
        &[("gpu", "gpu-2")],
        vec![claim_config(&[], "GpuConfig", json!({"strategy": "MPS"}))],
    );
    let preparing = {
        let (old, claim) = (old.clone(), claim.clone());
        tokio::spawn(async move { old.prepare(vec![claim]).await })
    };
    tokio::task::spawn_blocking(move || reached.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the old plugin's batch reached the MPS start");
    assert_eq!(
        h.read_checkpoint().claims[&claim.uid].state,
        ClaimState::PrepareStarted
    );
    // A new plugin starts meanwhile: its recovery must not roll back the claim in flight.
    let mut parts = h.parts();
    parts.gpu = gpu.clone();
    let starting = tokio::spawn(NodeDriver::start(h.config.clone(), parts));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!starting.is_finished(), "it waits for the state lock");
    go_on.send(()).unwrap();
    let results = preparing.await.unwrap();
    assert!(results[&claim.uid].is_ok(), "{results:?}");
    let (new, report) = starting.await.unwrap().unwrap();
    assert!(report.rolled_back.is_empty(), "{report:?}");
    assert_eq!(report.reestablished.len(), 1, "{report:?}");
    assert_eq!(gpu.inner.running_daemons().len(), 1);
    unprepared(&new, &claim).await;
    assert!(gpu.inner.running_daemons().is_empty());
    assert!(h.spec_uids().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_spread_over_two_plugins_all_succeed_and_leave_a_consistent_node() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (old, _) = h.start().await;
    let (new, _) = h.start().await;
    let drivers = [old, new];
    let claims: Vec<ClaimRef> = (0..8)
        .map(|i| {
            let configs = if i % 2 == 0 {
                vec![claim_config(&[], "GpuConfig", json!({"strategy": "MPS"}))]
            } else {
                vec![]
            };
            h.claim(&format!("c{i}"), &[("gpu", &format!("gpu-{i}"))], configs)
        })
        .collect();
    // Each claim is prepared and unprepared in turn, each call to either plugin at random;
    // the claims run side by side.
    let tasks: Vec<_> = claims
        .iter()
        .enumerate()
        .map(|(i, claim)| {
            let (drivers, claim) = (drivers.clone(), claim.clone());
            tokio::spawn(async move {
                let mut random = SplitMix64::new(i as u64);
                for _ in 0..6 {
                    let driver = &drivers[random.below(2) as usize];
                    prepared(driver, &claim).await;
                    let driver = &drivers[random.below(2) as usize];
                    unprepared(driver, &claim).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert!(h.read_checkpoint().claims.is_empty());
    assert!(h.spec_uids().is_empty());
    assert!(h.gpu.running_daemons().is_empty());
}
