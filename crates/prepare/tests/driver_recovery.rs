//! Start-up recovery: the state a crash leaves at each point of prepare and unprepare is built
//! from a real run (then the checkpoint is set back to what it held at that point), and a new
//! driver must converge. Also: reboots, orphans, corrupt checkpoints.

use std::time::Duration;

use serde_json::json;
use tessera_driver_root::devices::{cap_node, standard_mig_cap_minor};
use tessera_kubelet_grpc::DraDriver;
use tessera_prepare::NodeDriver;
use tessera_prepare::checkpoint::{ClaimState, DeviceTarget};
use tessera_prepare::checkpoint::{LoadOutcome, quarantined_files};
use tessera_prepare::mig::MigControl;
use tessera_prepare::plan::MigMode;
use tessera_prepare_harness::{Harness, claim_config, nodes_of};

/// A claim with a dynamic MIG device, MPS and a whole GPU with a time slice: every kind of
/// side effect.
fn busy_claim(h: &Harness, name: &str) -> tessera_kubelet_grpc::ClaimRef {
    h.claim(
        name,
        &[("gpu", "gpu-6"), ("mig", "gpu-1-mig-1g-10gb-3")],
        vec![
            claim_config(
                &["gpu"],
                "GpuConfig",
                json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Medium"}}),
            ),
            claim_config(&["mig"], "MigDeviceConfig", json!({"strategy": "MPS"})),
        ],
    )
}

fn assert_nothing_left(h: &Harness) {
    assert!(h.spec_uids().is_empty(), "specs: {:?}", h.spec_uids());
    assert!(h.read_checkpoint().claims.is_empty());
    assert!(h.gpu.running_daemons().is_empty(), "daemons left");
    assert!(
        h.gpu.non_default_time_slices().is_empty(),
        "time slices left"
    );
    assert!(
        h.mig.all_instances()[&h.gpu_uuid(1)].is_empty(),
        "MIG instances left"
    );
    assert!(
        std::fs::read_dir(h.config.state_dir.join("mps")).map_or(true, |mut d| d.next().is_none()),
        "MPS directories left"
    );
}

/// Prepares `claim` fully, then rewinds the checkpoint record to `state` (dropping the
/// instances it recorded when `forget_instances`, as before the final write).
async fn crashed_at(
    h: &Harness,
    claim: &tessera_kubelet_grpc::ClaimRef,
    state: ClaimState,
    forget_instances: bool,
) {
    let (driver, _) = h.start().await;
    driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    drop(driver);
    let mut checkpoint = h.read_checkpoint();
    let record = checkpoint.claims.get_mut(&claim.uid).unwrap();
    record.state = state;
    if forget_instances {
        for device in &mut record.devices {
            if let DeviceTarget::Mig { instance, .. } = &mut device.target {
                *instance = None;
            }
        }
    }
    h.write_checkpoint(&checkpoint);
}

#[tokio::test]
async fn an_interrupted_prepare_is_undone() {
    for forget_instances in [false, true] {
        let h = Harness::new("hgx-a100-mig", MigMode::Dynamic);
        let claim = busy_claim(&h, "interrupted");
        crashed_at(&h, &claim, ClaimState::PrepareStarted, forget_instances).await;
        assert_eq!(h.gpu.running_daemons().len(), 1);

        let (driver, report) = h.start().await;
        assert_eq!(report.rolled_back.len(), 1, "{report:?}");
        assert!(report.errors.is_empty(), "{report:?}");
        assert_nothing_left(&h);
        // The kubelet's retry prepares it from scratch.
        driver.prepare(vec![claim.clone()]).await[&claim.uid]
            .clone()
            .unwrap();
        assert_eq!(h.spec_uids().len(), 1);
    }
}

#[tokio::test]
async fn an_interrupted_prepare_before_any_side_effect_is_dropped() {
    let h = Harness::new("hgx-a100-mig", MigMode::Dynamic);
    let claim = busy_claim(&h, "early");
    crashed_at(&h, &claim, ClaimState::PrepareStarted, true).await;
    // Take the side effects away again: the crash came right after the PrepareStarted write.
    let uid = claim.uid.to_string();
    std::fs::remove_file(
        h.cdi_dir()
            .join(format!("gpu.tessera.dev-claim_{uid}.json")),
    )
    .unwrap();
    for instance in h.mig.all_instances()[&h.gpu_uuid(1)].clone() {
        h.mig.destroy(&h.gpu_uuid(1), &instance).unwrap();
    }
    h.gpu.reboot();
    std::fs::remove_dir_all(h.config.state_dir.join("mps").join(&uid)).unwrap();

    let (_, report) = h.start().await;
    assert_eq!(report.rolled_back.len(), 1, "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    assert_nothing_left(&h);
}

#[tokio::test]
async fn an_interrupted_unprepare_is_finished() {
    let h = Harness::new("hgx-a100-mig", MigMode::Dynamic);
    let claim = busy_claim(&h, "leaving");
    crashed_at(&h, &claim, ClaimState::UnprepareStarted, false).await;
    // The spec is already gone (the first step of unprepare).
    std::fs::remove_file(
        h.cdi_dir()
            .join(format!("gpu.tessera.dev-claim_{}.json", claim.uid)),
    )
    .unwrap();
    let (driver, report) = h.start().await;
    assert_eq!(report.finished_unprepare.len(), 1, "{report:?}");
    assert_nothing_left(&h);
    assert_eq!(
        driver.unprepare(vec![claim.clone()]).await[&claim.uid]
            .clone()
            .map_err(|e| e.to_string()),
        Ok(())
    );
}

#[tokio::test]
async fn a_prepared_claim_survives_a_restart_unchanged() {
    let h = Harness::new("hgx-a100-mig", MigMode::Dynamic);
    let claim = busy_claim(&h, "steady");
    let (driver, _) = h.start().await;
    let devices = driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    let spec_before = h.spec(claim.uid.as_str());
    let instances_before = h.mig.all_instances();
    drop(driver);

    let (driver, report) = h.start().await;
    assert_eq!(report.reestablished.len(), 1);
    assert!(
        report.destroyed_mig.is_empty() && report.removed_specs.is_empty(),
        "{report:?}"
    );
    assert_eq!(h.spec(claim.uid.as_str()), spec_before);
    assert_eq!(h.mig.all_instances(), instances_before);
    assert_eq!(
        driver.prepare(vec![claim.clone()]).await[&claim.uid]
            .clone()
            .map_err(|e| e.to_string()),
        Ok(devices)
    );
}

#[tokio::test]
async fn after_a_reboot_mig_devices_and_daemons_are_recreated() {
    let h = Harness::new("hgx-a100-mig", MigMode::Dynamic);
    let claim = busy_claim(&h, "rebooted");
    let (driver, _) = h.start().await;
    let devices = driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    drop(driver);
    let old_instance = h.mig.all_instances()[&h.gpu_uuid(1)][0].clone();

    // The reboot: a new boot id, no MIG instances, no daemons, default time slices.
    h.set_boot_id("boot-2");
    h.mig.destroy(&h.gpu_uuid(1), &old_instance).unwrap();
    h.gpu.reboot();

    let (driver, report) = h.start().await;
    assert!(report.rebooted);
    assert!(report.errors.is_empty(), "{report:?}");
    let new_instance = h.mig.all_instances()[&h.gpu_uuid(1)][0].clone();
    assert_ne!(new_instance.uuid, old_instance.uuid);
    assert_eq!(h.gpu.running_daemons().len(), 1);
    assert_eq!(h.gpu.non_default_time_slices().len(), 1);
    let spec = h.spec(claim.uid.as_str());
    // The rewritten spec names the new instance's capability nodes (what CUDA enumerates by).
    let gi_cap = standard_mig_cap_minor(1, new_instance.gpu_instance_id, None).unwrap();
    let ci_cap = standard_mig_cap_minor(
        1,
        new_instance.gpu_instance_id,
        Some(new_instance.compute_instance_id),
    )
    .unwrap();
    assert_eq!(
        nodes_of(&spec, 1)[1..],
        [cap_node(gi_cap), cap_node(ci_cap)],
        "{:?}",
        nodes_of(&spec, 1)
    );
    let checkpoint = h.read_checkpoint();
    assert_eq!(checkpoint.boot_id, "boot-2");
    // Same CDI ids: the kubelet, which may not ask again, still has the right ones.
    assert_eq!(
        driver.prepare(vec![claim.clone()]).await[&claim.uid]
            .clone()
            .map_err(|e| e.to_string()),
        Ok(devices)
    );
}

#[tokio::test]
async fn orphans_are_removed_at_start() {
    let h = Harness::new("hgx-a100-mig", MigMode::Dynamic);
    let kept = busy_claim(&h, "kept");
    let (driver, _) = h.start().await;
    driver.prepare(vec![kept.clone()]).await[&kept.uid]
        .clone()
        .unwrap();
    drop(driver);
    // A spec, an MPS directory and a MIG instance no record knows.
    let spec_dir = h.cdi_dir();
    let orphan_uid = "0rphan00-0000-4000-8000-000000000000";
    std::fs::copy(
        spec_dir.join(format!("gpu.tessera.dev-claim_{}.json", kept.uid)),
        spec_dir.join(format!("gpu.tessera.dev-claim_{orphan_uid}.json")),
    )
    .unwrap();
    std::fs::create_dir_all(h.config.state_dir.join("mps").join(orphan_uid).join("pipe")).unwrap();
    let stray = h.mig.create(&h.gpu_uuid(0), "1g.10gb", 6).unwrap();
    // Another vendor's spec is not ours to touch.
    std::fs::write(spec_dir.join("other.vendor-thing.json"), "{}").unwrap();

    let (_, report) = h.start().await;
    assert_eq!(report.removed_specs, vec![orphan_uid.to_owned()]);
    assert_eq!(report.stopped_mps, vec![orphan_uid.to_owned()]);
    assert_eq!(report.destroyed_mig, vec![stray.uuid]);
    assert_eq!(h.spec_uids(), vec![kept.uid.to_string()]);
    assert!(spec_dir.join("other.vendor-thing.json").exists());
    assert_eq!(h.gpu.running_daemons().len(), 1);
}

#[tokio::test]
async fn a_corrupt_checkpoint_is_quarantined_and_state_rebuilt() {
    let h = Harness::new("hgx-a100-mig", MigMode::Dynamic);
    let alive = busy_claim(&h, "alive");
    let done = h.claim("done", &[("gpu", "gpu-7")], vec![]);
    let (driver, _) = h.start().await;
    for claim in [&alive, &done] {
        driver.prepare(vec![claim.clone()]).await[&claim.uid]
            .clone()
            .unwrap();
    }
    drop(driver);
    // `done`'s pod finished: the claim is no longer reserved (but still allocated).
    let mut finished =
        tessera_prepare_harness::allocated_claim("done", &[("gpu", "gpu-7")], vec![]);
    finished.status.as_mut().unwrap().reserved_for = None;
    h.claims.put(finished);
    let instances_before = h.mig.all_instances();
    std::fs::write(
        h.checkpoint_path(),
        b"{\"version\": 1, \"checksum\": \"sha256:00\", \"checkpo",
    )
    .unwrap();

    let (driver, report) = h.start().await;
    assert!(
        matches!(report.checkpoint, LoadOutcome::Quarantined { .. }),
        "{report:?}"
    );
    assert_eq!(driver.stats().checkpoint_quarantines, 1);
    assert_eq!(report.rebuilt, vec![format!("ml/alive ({})", alive.uid)]);
    assert_eq!(report.removed_specs, vec![done.uid.to_string()]);
    assert_eq!(quarantined_files(&h.config.state_dir).len(), 1);
    // The surviving claim kept its MIG instance and daemon; nothing was recreated.
    assert_eq!(h.mig.all_instances(), instances_before);
    assert_eq!(h.gpu.running_daemons().len(), 1);
    let checkpoint = h.read_checkpoint();
    assert_eq!(checkpoint.claims.len(), 1);
    assert_eq!(
        checkpoint.claims[&alive.uid].state,
        ClaimState::PrepareCompleted
    );
    assert!(driver.prepare(vec![alive.clone()]).await[&alive.uid].is_ok());
    drop(driver);

    // The next start loads the rebuilt checkpoint: no second quarantine, no crash loop.
    let (driver, report) = h.start().await;
    assert!(matches!(report.checkpoint, LoadOutcome::Loaded { .. }));
    assert_eq!(driver.stats().checkpoint_quarantines, 0);
    assert_eq!(quarantined_files(&h.config.state_dir).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_lost_checkpoint_while_the_api_server_is_down_starts_degraded_and_recovers() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let precious = h.claim("precious", &[("gpu", "gpu-2")], vec![]);
    let gone = h.claim(
        "gone",
        &[("gpu", "gpu-3")],
        vec![claim_config(&[], "GpuConfig", json!({"strategy": "MPS"}))],
    );
    let (driver, _) = h.start().await;
    let devices = driver.prepare(vec![precious.clone(), gone.clone()]).await;
    assert!(devices.values().all(Result::is_ok), "{devices:?}");
    let devices = devices[&precious.uid].clone().unwrap();
    drop(driver);
    std::fs::write(h.checkpoint_path(), b"not json").unwrap();
    h.claims.set_unavailable(true);

    // It starts anyway (no crash loop), says why it is not ready, and keeps the specs.
    let (driver, report) = NodeDriver::start(h.config.clone(), h.parts())
        .await
        .expect("a lost checkpoint and an unreachable API server do not stop the start");
    let mut recovery = driver.recovery();
    let reason = recovery.borrow().clone().expect("recovery is pending");
    assert!(reason.contains("API server"), "{reason}");
    assert!(
        report.errors.iter().any(|e| e.contains("retrying")),
        "{report:?}"
    );
    assert_eq!(quarantined_files(&h.config.state_dir).len(), 1);
    assert_eq!(h.spec_uids().len(), 2);
    // New prepares wait for recovery; unprepare of a claim known by its spec works.
    let err = driver.prepare(vec![precious.clone()]).await[&precious.uid]
        .clone()
        .unwrap_err()
        .to_string();
    assert!(err.contains("still recovering"), "{err}");
    driver.unprepare(vec![gone.clone()]).await[&gone.uid]
        .clone()
        .unwrap();
    assert_eq!(h.spec_uids(), vec![precious.uid.to_string()]);
    assert!(
        h.gpu.running_daemons().is_empty(),
        "the MPS daemon is stopped"
    );

    // The API server comes back: recovery finishes by itself.
    h.claims.set_unavailable(false);
    h.claims.remove("ml", "gone");
    tokio::time::timeout(Duration::from_secs(120), recovery.wait_for(Option::is_none))
        .await
        .expect("recovery finishes once the API server answers")
        .unwrap();
    assert_eq!(
        driver.prepare(vec![precious.clone()]).await[&precious.uid]
            .clone()
            .map_err(|e| e.to_string()),
        Ok(devices)
    );
    let recorded: Vec<String> = h
        .read_checkpoint()
        .claims
        .into_keys()
        .map(|uid| uid.to_string())
        .collect();
    assert_eq!(recorded, vec![precious.uid.to_string()]);
}

/// Recovery pending after a long outage (its backoff at the maximum): once the API server is
/// back, the first prepare triggers an attempt and is served, instead of being refused until
/// the backoff runs out.
#[tokio::test(start_paused = true)]
async fn a_prepare_after_the_api_server_returns_recovers_at_once() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let old = h.claim("old", &[("gpu", "gpu-2")], vec![]);
    let (driver, _) = h.start().await;
    driver.prepare(vec![old.clone()]).await[&old.uid]
        .clone()
        .unwrap();
    drop(driver);
    std::fs::write(h.checkpoint_path(), b"not json").unwrap();
    h.claims.set_unavailable(true);
    let (driver, _) = NodeDriver::start(h.config.clone(), h.parts())
        .await
        .unwrap();
    let new = h.claim("new", &[("gpu", "gpu-4")], vec![]);
    // Two minutes of outage: the retry backoff grows to its 30 s maximum; prepares meanwhile
    // ask for attempts, fail with them and are refused.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let refused = driver.prepare(vec![new.clone()]).await[&new.uid]
        .clone()
        .unwrap_err()
        .to_string();
    assert!(refused.contains("still recovering"), "{refused}");
    assert!(driver.recovery().borrow().is_some());

    h.claims.set_unavailable(false);
    let asked = tokio::time::Instant::now();
    let prepared = driver.prepare(vec![new.clone()]).await;
    assert!(prepared[&new.uid].is_ok(), "{prepared:?}");
    assert!(
        asked.elapsed() <= Duration::from_secs(1),
        "the prepare waited {:?} for recovery",
        asked.elapsed()
    );
    assert_eq!(*driver.recovery().borrow(), None);
}

#[tokio::test]
async fn claims_without_node_local_effects_converge_without_intent_records() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let plain = h.claim("plain", &[("gpu", "gpu-3")], vec![]);
    let (driver, _) = h.start().await;
    driver.prepare(vec![plain.clone()]).await[&plain.uid]
        .clone()
        .unwrap();
    drop(driver);
    let spec_path = h
        .cdi_dir()
        .join(format!("gpu.tessera.dev-claim_{}.json", plain.uid));
    let spec = std::fs::read(&spec_path).unwrap();

    // A crash inside unprepare, after the spec went but before the record did.
    std::fs::remove_file(&spec_path).unwrap();
    let (driver, report) = h.start().await;
    assert_eq!(report.reestablished.len(), 1, "{report:?}");
    assert_eq!(std::fs::read(&spec_path).unwrap(), spec, "the spec is back");
    assert_eq!(
        driver.unprepare(vec![plain.clone()]).await[&plain.uid]
            .clone()
            .map_err(|e| e.to_string()),
        Ok(())
    );
    drop(driver);

    // A crash inside prepare, after the spec was written but before the record: no record.
    std::fs::write(&spec_path, &spec).unwrap();
    let (driver, report) = h.start().await;
    assert_eq!(report.removed_specs, vec![plain.uid.to_string()]);
    assert!(h.spec_uids().is_empty());
    assert!(driver.prepare(vec![plain.clone()]).await[&plain.uid].is_ok());
}
