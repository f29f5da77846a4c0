//! Prepare and unprepare through the driver (no gRPC): results, CDI specs, checkpoint,
//! sharing and MIG side effects, per-claim errors, idempotence and concurrency.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};
use tessera_api::config::TimeSliceInterval;
use tessera_driver_root::devices::{cap_node, standard_mig_cap_minor};
use tessera_kubelet_grpc::{ClaimRef, DraDriver};
use tessera_prepare::NodeDriver;
use tessera_prepare::checkpoint::ClaimState;
use tessera_prepare::injection::{CurrentInjection, DriverInjection};
use tessera_prepare::plan::MigMode;
use tessera_prepare::sharing::{GpuCall, GpuOperation};
use tessera_prepare_harness::{Harness, allocated_claim, claim_config, env_of, nodes_of, uid_of};

#[tokio::test]
async fn whole_gpus_are_prepared_once_and_unprepared() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, report) = h.start().await;
    assert!(report.errors.is_empty(), "{report:?}");
    let claim = h.claim("train", &[("gpus", "gpu-0"), ("gpus", "gpu-3")], vec![]);
    let uid = claim.uid.clone();

    let results = driver.prepare(vec![claim.clone()]).await;
    let devices = results[&uid].clone().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1].device_name, "gpu-3");
    assert_eq!(devices[1].pool_name, "node-a");
    assert_eq!(devices[1].request_names, vec!["gpus".to_owned()]);
    assert_eq!(
        devices[1].cdi_device_ids,
        vec![format!("gpu.tessera.dev/claim={uid}-gpu-3")]
    );

    let spec = h.spec(uid.as_str());
    assert_eq!(spec["kind"], "gpu.tessera.dev/claim");
    // What CUDA sees follows from the device nodes; no per-claim list of UUIDs (docs: a
    // container with two claims must see both).
    assert!(
        env_of(&spec, 0)
            .iter()
            .all(|e| !e.contains("VISIBLE_DEVICES"))
    );
    assert!(
        env_of(&spec, 1)
            .iter()
            .all(|e| !e.contains("VISIBLE_DEVICES"))
    );
    assert_eq!(
        spec["containerEdits"]["env"],
        json!(["NVIDIA_VISIBLE_DEVICES=void"])
    );
    assert_eq!(nodes_of(&spec, 0), vec!["/dev/nvidia0"]);
    assert_eq!(nodes_of(&spec, 1), vec!["/dev/nvidia3"]);
    assert_eq!(
        spec["containerEdits"]["deviceNodes"],
        json!([{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}, {"path": "/dev/nvidia-uvm-tools"}])
    );
    let checkpoint = h.read_checkpoint();
    assert_eq!(checkpoint.boot_id, "boot-1");
    assert_eq!(checkpoint.claims[&uid].state, ClaimState::PrepareCompleted);
    assert_eq!(driver.stats().prepared_devices, 2);

    // Prepared claims are answered from the checkpoint: the API server is not even asked.
    h.claims.remove("ml", "train");
    let again = driver.prepare(vec![claim.clone()]).await;
    assert_eq!(again[&uid].clone().map_err(|e| e.to_string()), Ok(devices));

    assert_eq!(
        driver.unprepare(vec![claim.clone()]).await[&uid]
            .clone()
            .map_err(|e| e.to_string()),
        Ok(())
    );
    assert!(h.spec_uids().is_empty());
    assert!(h.read_checkpoint().claims.is_empty());
    assert_eq!(driver.stats().prepared_claims, 0);
    // Unprepare is idempotent, and an unknown claim succeeds.
    assert_eq!(
        driver.unprepare(vec![claim.clone()]).await[&uid]
            .clone()
            .map_err(|e| e.to_string()),
        Ok(())
    );
    let stranger = tessera_kubelet_grpc::ClaimRef::new("ml", "never", uid_of("never"));
    assert_eq!(
        driver.unprepare(vec![stranger.clone()]).await[&stranger.uid]
            .clone()
            .map_err(|e| e.to_string()),
        Ok(())
    );
}

#[tokio::test]
async fn bad_claims_fail_alone_with_a_message_naming_them() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    let good = h.claim("good", &[("gpu", "gpu-1")], vec![]);
    let unknown = h.claim("unknown-device", &[("gpu", "gpu-99")], vec![]);
    let bad_config = h.claim(
        "bad-config",
        &[("gpu", "gpu-2")],
        vec![claim_config(
            &["gpu"],
            "GpuConfig",
            json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 101}}),
        )],
    );
    let mut not_allocated = tessera_prepare_harness::allocated_claim("unallocated", &[], vec![]);
    not_allocated.status = None;
    h.claims.put(not_allocated);
    let unallocated =
        tessera_kubelet_grpc::ClaimRef::new("ml", "unallocated", uid_of("unallocated"));
    let wrong_uid =
        tessera_kubelet_grpc::ClaimRef::new("ml", "good", "00000000-0000-4000-8000-00000000beef");
    let missing = tessera_kubelet_grpc::ClaimRef::new("ml", "missing", uid_of("missing"));

    let results = driver
        .prepare(vec![
            good.clone(),
            unknown.clone(),
            bad_config.clone(),
            unallocated.clone(),
            wrong_uid.clone(),
            missing.clone(),
        ])
        .await;
    assert!(results[&good.uid].is_ok(), "{results:?}");
    for (claim, want) in [
        (&unknown, "names device `gpu-99`"),
        (
            &bad_config,
            "field `sharing.mps.defaultActiveThreadPercentage`",
        ),
        (&unallocated, "not allocated"),
        (&wrong_uid, "not 00000000-0000-4000-8000-00000000beef"),
        (&missing, "does not exist"),
    ] {
        let err = results[&claim.uid].clone().unwrap_err().to_string();
        assert!(err.contains(&format!("claim {claim}")), "{err}");
        assert!(err.contains(want), "{err} lacks {want}");
    }
    // Only the good claim left anything behind.
    assert_eq!(h.spec_uids(), vec![good.uid.to_string()]);
    assert_eq!(h.read_checkpoint().claims.len(), 1);
    // The API server being down fails the claims that need it, not the prepared ones.
    h.claims.set_unavailable(true);
    let results = driver.prepare(vec![good.clone(), unknown.clone()]).await;
    assert!(results[&good.uid].is_ok());
    assert!(
        results[&unknown.uid]
            .clone()
            .unwrap_err()
            .to_string()
            .contains("unavailable")
    );
}

#[tokio::test]
async fn time_slicing_is_set_and_reset() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    let claim = h.claim(
        "sliced",
        &[("gpu", "gpu-4")],
        vec![claim_config(
            &[],
            "GpuConfig",
            json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        )],
    );
    driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    assert_eq!(h.gpu.time_slice(&h.gpu_uuid(4)), TimeSliceInterval::Long);
    driver.unprepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    assert!(h.gpu.non_default_time_slices().is_empty());
}

#[tokio::test]
async fn mps_gets_a_daemon_env_and_mounts_and_is_stopped() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    let claim = h.claim(
        "shared",
        &[("gpu", "gpu-5"), ("gpu", "gpu-6")],
        vec![claim_config(
            &["gpu"],
            "GpuConfig",
            json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50,
                   "defaultPinnedDeviceMemoryLimit": "4Gi",
                   "perDevicePinnedMemoryLimit": {"gpu-6": "2Gi"}}}),
        )],
    );
    let uid = claim.uid.to_string();
    driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    let daemons = h.gpu.running_daemons();
    assert_eq!(daemons.len(), 1);
    let daemon = &daemons[0];
    assert_eq!(daemon.claim_uid, uid);
    assert_eq!(daemon.active_thread_percentage, Some(50));
    let limits: Vec<(String, Option<u64>)> = daemon
        .devices
        .iter()
        .map(|d| (d.uuid.clone(), d.pinned_memory_limit_bytes))
        .collect();
    assert_eq!(
        limits,
        vec![
            (h.gpu_uuid(5), Some(4 << 30)),
            (h.gpu_uuid(6), Some(2 << 30))
        ]
    );
    let pipe = h.config.state_dir.join("mps").join(&uid).join("pipe");
    assert_eq!(daemon.directories.pipe, pipe);
    assert!(
        pipe.is_dir(),
        "the directory mounted into containers exists"
    );

    let spec = h.spec(&uid);
    let env = env_of(&spec, 1);
    assert!(
        env.contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_owned()),
        "{env:?}"
    );
    assert!(
        env.contains(&"CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps".to_owned()),
        "{env:?}"
    );
    let mounts = &spec["devices"][1]["containerEdits"]["mounts"];
    assert_eq!(mounts[0]["hostPath"], pipe.to_string_lossy().as_ref());
    assert_eq!(mounts[0]["containerPath"], "/tmp/nvidia-mps");

    driver.unprepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    assert!(h.gpu.running_daemons().is_empty());
    assert!(!pipe.exists());
}

/// An NVIDIA-schema config (driver `gpu.nvidia.com`, `resource.nvidia.com/v1beta1`) prepares the
/// MPS it means in NVIDIA's driver, and the translation is noted on the claim once.
#[tokio::test]
async fn nvidia_mps_config_prepares_mps_and_is_noted_on_the_claim() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    let mut config = claim_config(
        &["gpu"],
        "GpuConfig",
        json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25,
               "defaultPinnedDeviceMemoryLimit": "3Gi",
               "defaultPerDevicePinnedMemoryLimit": {"1": "1Gi"}}}),
    );
    config["opaque"]["driver"] = json!("gpu.nvidia.com");
    config["opaque"]["parameters"]["apiVersion"] = json!("resource.nvidia.com/v1beta1");
    let claim = h.claim("nv", &[("gpu", "gpu-5"), ("gpu", "gpu-6")], vec![config]);
    driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    let daemons = h.gpu.running_daemons();
    assert_eq!(daemons.len(), 1);
    assert_eq!(daemons[0].active_thread_percentage, Some(25));
    let limits: Vec<(String, Option<u64>)> = daemons[0]
        .devices
        .iter()
        .map(|d| (d.uuid.clone(), d.pinned_memory_limit_bytes))
        .collect();
    assert_eq!(
        limits,
        vec![
            (h.gpu_uuid(5), Some(3 << 30)),
            (h.gpu_uuid(6), Some(1 << 30))
        ]
    );
    // The Event is written in the background.
    let mut notes = h.claims.notes();
    for _ in 0..100 {
        if !notes.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        notes = h.claims.notes();
    }
    assert_eq!(notes.len(), 1, "{notes:?}");
    let (namespace, name, note) = &notes[0];
    assert_eq!((namespace.as_str(), name.as_str()), ("ml", "nv"));
    assert!(
        note.contains("driver gpu.nvidia.com taken as gpu.tessera.dev")
            && note.contains("sharing.mpsConfig → sharing.mps"),
        "{note}"
    );
    // A second prepare is answered from the checkpoint: no second note.
    driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    tokio::task::yield_now().await;
    assert_eq!(h.claims.notes().len(), 1);
    driver.unprepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    assert!(h.gpu.running_daemons().is_empty());
}

#[tokio::test]
async fn dynamic_mig_creates_on_prepare_and_destroys_on_unprepare() {
    let h = Harness::new("hgx-a100-mig", MigMode::Dynamic);
    let (driver, report) = h.start().await;
    // Dynamic MIG owns every instance: the topology's pre-existing ones are removed at start.
    assert!(!report.destroyed_mig.is_empty());
    let gpu = h.gpu_uuid(1);
    assert!(h.mig.all_instances()[&gpu].is_empty());

    let claim = h.claim(
        "slice",
        &[
            ("mig", "gpu-1-mig-1g-10gb-3"),
            ("mig", "gpu-1-mig-2g-20gb-4"),
        ],
        vec![],
    );
    let uid = claim.uid.to_string();
    driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    let instances = h.mig.all_instances()[&gpu].clone();
    assert_eq!(instances.len(), 2);
    let spec = h.spec(&uid);
    // Each MIG device is named by its own capability nodes (what CUDA enumerates by).
    let caps = |device: usize| -> Vec<String> {
        nodes_of(&spec, device)
            .into_iter()
            .filter(|n| n.starts_with("/dev/nvidia-caps/"))
            .collect()
    };
    let wanted = |i: usize| -> Vec<String> {
        let instance = &instances[i];
        [None, Some(instance.compute_instance_id)]
            .into_iter()
            .map(|ci| {
                let minor = standard_mig_cap_minor(1, instance.gpu_instance_id, ci).unwrap();
                cap_node(minor)
            })
            .collect()
    };
    let mut named = vec![caps(0), caps(1)];
    named.sort();
    let mut expected = vec![wanted(0), wanted(1)];
    expected.sort();
    assert_eq!(named, expected);
    let nodes = nodes_of(&spec, 0);
    assert_eq!(nodes[0], "/dev/nvidia1");
    assert!(
        nodes[1].starts_with("/dev/nvidia-caps/nvidia-cap"),
        "{nodes:?}"
    );

    // Another claim for an overlapping placement cannot be created while this one holds it.
    let overlap = h.claim("overlap", &[("mig", "gpu-1-mig-2g-20gb-2")], vec![]);
    let err = driver.prepare(vec![overlap.clone()]).await[&overlap.uid]
        .clone()
        .unwrap_err()
        .to_string();
    assert!(err.contains("overlaps"), "{err}");
    // And one naming the very same placement is told to wait, not handed the instance.
    let same = h.claim("same", &[("mig", "gpu-1-mig-1g-10gb-3")], vec![]);
    let err = driver.prepare(vec![same.clone()]).await[&same.uid]
        .clone()
        .unwrap_err()
        .to_string();
    assert!(err.contains("still held by claim ml/slice"), "{err}");
    assert_eq!(h.spec_uids(), vec![uid.clone()]);

    driver.unprepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    assert!(h.mig.all_instances()[&gpu].is_empty());
    // Now the placement is free for the waiting claim.
    driver.prepare(vec![same.clone()]).await[&same.uid]
        .clone()
        .unwrap();
}

#[tokio::test]
async fn a_failing_side_effect_undoes_the_claim() {
    let h = Harness::new("hgx-a100-mig", MigMode::Dynamic);
    let (driver, _) = h.start().await;
    let claim = h.claim(
        "doomed",
        &[("gpu", "gpu-6"), ("mig", "gpu-1-mig-1g-10gb-3")],
        vec![
            claim_config(
                &["gpu"],
                "GpuConfig",
                json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}),
            ),
            claim_config(&["mig"], "MigDeviceConfig", json!({"strategy": "MPS"})),
        ],
    );
    h.gpu.fail_next(GpuOperation::StartMps);
    let err = driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot start the MPS daemon"), "{err}");
    assert!(h.spec_uids().is_empty());
    assert!(h.read_checkpoint().claims.is_empty());
    assert!(
        h.mig.all_instances()[&h.gpu_uuid(1)].is_empty(),
        "the created MIG device is destroyed"
    );
    assert!(
        h.gpu.non_default_time_slices().is_empty(),
        "the time slice is reset"
    );
    // The kubelet's retry succeeds.
    driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    assert_eq!(h.gpu.running_daemons().len(), 1);
}

#[tokio::test]
async fn a_failed_undo_is_retried_by_the_next_call() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    let claim = h.claim(
        "sticky",
        &[("gpu", "gpu-0")],
        vec![claim_config(&[], "GpuConfig", json!({"strategy": "MPS"}))],
    );
    driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    h.gpu.fail_next(GpuOperation::StopMps);
    let err = driver.unprepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot stop the MPS daemon"), "{err}");
    assert_eq!(
        h.read_checkpoint().claims[&claim.uid].state,
        ClaimState::UnprepareStarted
    );
    // The daemon's pipe directory stays: it is how the retry reaches the daemon to stop it.
    let pipe = h
        .config
        .state_dir
        .join("mps")
        .join(claim.uid.as_str())
        .join("pipe");
    assert!(pipe.is_dir(), "{} was removed", pipe.display());
    driver.unprepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    assert!(h.gpu.running_daemons().is_empty());
    assert!(h.read_checkpoint().claims.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_prepare_each_claim_once() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    let driver = Arc::new(driver);
    let claims: Vec<_> = (0..8)
        .map(|i| {
            h.claim(
                &format!("c{i}"),
                &[("gpu", &format!("gpu-{i}"))],
                vec![claim_config(&[], "GpuConfig", json!({"strategy": "MPS"}))],
            )
        })
        .collect();
    // 16 calls, each with an overlapping window of 3 claims.
    let calls: Vec<_> = (0..16)
        .map(|n| {
            let driver = Arc::clone(&driver);
            let batch: Vec<_> = (0..3).map(|k| claims[(n + k) % 8].clone()).collect();
            tokio::spawn(async move { driver.prepare(batch).await })
        })
        .collect();
    let mut answers = std::collections::BTreeMap::new();
    for call in calls {
        for (uid, result) in call.await.unwrap() {
            let devices = result.unwrap();
            let previous = answers.insert(uid, devices.clone());
            assert!(
                previous.is_none_or(|p| p == devices),
                "same answer every time"
            );
        }
    }
    assert_eq!(answers.len(), 8);
    let starts = h
        .gpu
        .calls()
        .into_iter()
        .filter(|c| matches!(c, GpuCall::StartMps(_)))
        .count();
    assert_eq!(starts, 8, "one MPS daemon start per claim");
    assert_eq!(h.spec_uids().len(), 8);
    assert_eq!(driver.stats().prepared_claims, 8);
}

#[tokio::test]
async fn a_plain_claim_whose_unprepare_is_not_recorded_keeps_its_spec() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    let claim = h.claim("plain", &[("gpu", "gpu-2")], vec![]);
    let devices = driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();

    // The final checkpoint write fails: its path becomes a non-empty directory.
    let checkpoint = h.checkpoint_path();
    let saved = std::fs::read(&checkpoint).unwrap();
    std::fs::remove_file(&checkpoint).unwrap();
    std::fs::create_dir_all(checkpoint.join("in-the-way")).unwrap();
    let err = driver.unprepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot write the checkpoint"), "{err}");
    // Still recorded as prepared, so its spec is back: a prepare call hands out ids that work.
    assert_eq!(h.spec_uids(), vec![claim.uid.to_string()]);
    assert_eq!(
        driver.prepare(vec![claim.clone()]).await[&claim.uid]
            .clone()
            .map_err(|e| e.to_string()),
        Ok(devices)
    );

    std::fs::remove_dir_all(&checkpoint).unwrap();
    std::fs::write(&checkpoint, saved).unwrap();
    driver.unprepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    assert!(h.spec_uids().is_empty());
    assert!(h.read_checkpoint().claims.is_empty());
}

/// The last part of [`a_spec_that_cannot_be_written_or_removed_fails_only_its_claim`], once the
/// batch `[plain, sliced, mps]` is prepared: the MPS claim's spec cannot be removed, which fails
/// that claim's unprepare alone until the spec can go.
async fn unprepare_with_an_unremovable_spec(
    h: &Harness,
    driver: &NodeDriver,
    batch: Vec<ClaimRef>,
) {
    let [plain, sliced, mps] = [&batch[0], &batch[1], &batch[2]].map(Clone::clone);
    // The MPS claim's spec cannot be unlinked: the batch remove fails, and the claim-by-claim
    // fallback fails only that claim's unprepare; it stays recorded for the retry.
    let mps_spec = driver.cdi_spec_path(&mps.uid).unwrap();
    std::fs::remove_file(&mps_spec).unwrap();
    std::fs::create_dir(&mps_spec).unwrap();
    let results = driver.unprepare(batch.clone()).await;
    assert_eq!(
        results[&plain.uid].clone().map_err(|e| e.to_string()),
        Ok(())
    );
    assert_eq!(
        results[&sliced.uid].clone().map_err(|e| e.to_string()),
        Ok(())
    );
    let err = results[&mps.uid].clone().unwrap_err().to_string();
    assert!(
        err.contains(&format!("cannot remove CDI spec {}", mps_spec.display())),
        "{err}"
    );
    let recorded: Vec<String> = h
        .read_checkpoint()
        .claims
        .into_keys()
        .map(|uid| uid.to_string())
        .collect();
    assert_eq!(recorded, vec![mps.uid.to_string()]);
    std::fs::remove_dir(&mps_spec).unwrap();
    assert_eq!(
        driver.unprepare(batch).await[&mps.uid]
            .clone()
            .map_err(|e| e.to_string()),
        Ok(())
    );
    assert!(h.spec_uids().is_empty());
    assert!(h.read_checkpoint().claims.is_empty());
    assert!(h.gpu.running_daemons().is_empty());
}

#[tokio::test]
async fn a_spec_that_cannot_be_written_or_removed_fails_only_its_claim() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    let plain = h.claim("plain", &[("gpu", "gpu-0")], vec![]);
    let sliced = h.claim(
        "sliced",
        &[("gpu", "gpu-1")],
        vec![claim_config(
            &["gpu"],
            "GpuConfig",
            json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        )],
    );
    let mps = h.claim(
        "mps",
        &[("gpu", "gpu-2")],
        vec![claim_config(
            &["gpu"],
            "GpuConfig",
            json!({"strategy": "MPS"}),
        )],
    );
    let batch = vec![plain.clone(), sliced.clone(), mps.clone()];

    // A directory where the time-sliced claim's spec goes: that claim fails, naming the file;
    // the other claims of the batch are prepared.
    let blocker = driver.cdi_spec_path(&sliced.uid).unwrap();
    std::fs::create_dir_all(&blocker).unwrap();
    let results = driver.prepare(batch.clone()).await;
    assert!(results[&plain.uid].is_ok(), "{results:?}");
    assert!(results[&mps.uid].is_ok(), "{results:?}");
    let err = results[&sliced.uid].clone().unwrap_err().to_string();
    assert!(
        err.contains(&format!("CDI spec {}", blocker.display())),
        "{err}"
    );
    assert!(
        h.gpu.non_default_time_slices().is_empty(),
        "the failed claim's time slice is reset"
    );
    assert_eq!(h.gpu.running_daemons().len(), 1);
    // Its undo could not remove the "spec" either, so its intent stays for the retry.
    let states: Vec<(String, ClaimState)> = h
        .read_checkpoint()
        .claims
        .into_iter()
        .map(|(uid, record)| (uid.to_string(), record.state))
        .collect();
    let mut expected = vec![
        (plain.uid.to_string(), ClaimState::PrepareCompleted),
        (sliced.uid.to_string(), ClaimState::PrepareStarted),
        (mps.uid.to_string(), ClaimState::PrepareCompleted),
    ];
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(states, expected);
    std::fs::remove_dir(&blocker).unwrap();
    let mut with_specs = vec![plain.uid.to_string(), mps.uid.to_string()];
    with_specs.sort();
    assert_eq!(h.spec_uids(), with_specs);

    // The kubelet's retry prepares it; the others are answered from the checkpoint.
    let retried = driver.prepare(batch.clone()).await;
    assert!(retried.values().all(Result::is_ok), "{retried:?}");
    assert_eq!(h.spec_uids().len(), 3);

    unprepare_with_an_unremovable_spec(&h, &driver, batch).await;
}

#[tokio::test]
async fn a_claim_uid_never_names_a_path_outside_the_state_directory() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    // A directory outside the state directory that a UID with `..` would reach.
    let victim = h.dir.path().join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("precious"), b"data").unwrap();
    let uid = "../../victim";
    let mut object = tessera_prepare_harness::allocated_claim(
        "evil",
        &[("gpu", "gpu-0")],
        vec![claim_config(&[], "GpuConfig", json!({"strategy": "MPS"}))],
    );
    object.metadata.uid = Some(uid.to_owned());
    h.claims.put(object);
    let claim = tessera_kubelet_grpc::ClaimRef::new("ml", "evil", uid);

    let answer = driver.prepare(vec![claim.clone()]).await[&claim.uid].clone();
    let unprepared = driver.unprepare(vec![claim.clone()]).await[&claim.uid].clone();
    assert!(
        victim.join("precious").exists(),
        "the victim directory is intact"
    );
    assert!(!victim.join("pipe").exists() && !victim.join("log").exists());
    let error = answer
        .expect_err("the UID cannot name an MPS directory")
        .to_string();
    assert!(error.contains("cannot name an entry"), "{error}");
    unprepared.unwrap();
    assert!(h.read_checkpoint().claims.is_empty());
}

/// A claim `name` of the harness allocated gpu-3 as a share of it, consuming `memory`, with
/// `config`; put where the driver reads claims.
fn shared_claim(h: &Harness, name: &str, memory: &str, config: Value) -> ClaimRef {
    let mut claim = allocated_claim(name, &[("gpu", "gpu-3")], vec![config]);
    let result = &mut claim
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap()[0];
    result.share_id = Some(format!("share-{name}"));
    result.consumed_capacity = Some(
        [("memory".to_owned(), Quantity(memory.to_owned()))]
            .into_iter()
            .collect(),
    );
    h.claims.put(claim);
    ClaimRef::new("ml", name, uid_of(name))
}

/// Two claims allocated one multi-allocatable GPU (consumable shares), each with its share id and
/// the memory it consumed: each gets its own record, spec, MPS daemon and limits; unpreparing
/// one leaves everything of the other in place, including the GPU's time slice it still runs
/// under; a restart keeps both.
#[tokio::test]
async fn claims_sharing_one_gpu_are_prepared_and_unprepared_independently() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    let sliced = shared_claim(
        &h,
        "sliced",
        "20Gi",
        claim_config(
            &[],
            "GpuConfig",
            json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        ),
    );
    let mps = shared_claim(
        &h,
        "mps",
        "30Gi",
        claim_config(&[], "GpuConfig", json!({"strategy": "MPS"})),
    );
    let results = driver.prepare(vec![sliced.clone(), mps.clone()]).await;
    for claim in [&sliced, &mps] {
        let devices = results[&claim.uid].clone().unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].device_name, "gpu-3");
        assert_eq!(
            devices[0].share_id.as_deref(),
            Some(format!("share-{}", claim.name).as_str())
        );
    }
    assert_eq!(h.spec_uids().len(), 2, "one spec per claim");
    assert!(
        env_of(&h.spec(&mps.uid.to_string()), 0)
            .contains(&format!("TESSERA_GPU_MEMORY_LIMIT={}", 30u64 << 30))
    );
    let daemons = h.gpu.running_daemons();
    assert_eq!(daemons.len(), 1);
    assert_eq!(
        daemons[0].devices[0].pinned_memory_limit_bytes,
        Some(30 << 30)
    );
    assert_eq!(h.gpu.time_slice(&h.gpu_uuid(3)), TimeSliceInterval::Long);

    // The time-sliced claim goes first: the MPS claim still uses gpu-3, whose slice stays.
    driver.unprepare(vec![sliced.clone()]).await[&sliced.uid]
        .clone()
        .unwrap();
    assert_eq!(h.spec_uids(), vec![mps.uid.to_string()]);
    assert_eq!(
        h.gpu.running_daemons().len(),
        1,
        "the other claim's daemon runs on"
    );
    assert_eq!(h.gpu.time_slice(&h.gpu_uuid(3)), TimeSliceInterval::Long);

    // A restart recovers the remaining claim as it was, with its share.
    drop(driver);
    let (driver, report) = h.start().await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let again = driver.prepare(vec![mps.clone()]).await[&mps.uid]
        .clone()
        .unwrap();
    assert_eq!(again[0].share_id.as_deref(), Some("share-mps"));
    driver.unprepare(vec![mps.clone()]).await[&mps.uid]
        .clone()
        .unwrap();
    assert!(h.spec_uids().is_empty());
    assert!(h.gpu.running_daemons().is_empty());
}

/// The first claim of a shared GPU to go resets the time slice only when no other claim holds
/// the GPU: the same two claims unprepared in the other order end with the default slice.
#[tokio::test]
async fn the_last_claim_of_a_shared_gpu_resets_its_time_slice() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    let config = claim_config(
        &[],
        "GpuConfig",
        json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Medium"}}),
    );
    let a = h.claim("slice-a", &[("gpu", "gpu-1")], vec![config.clone()]);
    let b = h.claim("slice-b", &[("gpu", "gpu-1")], vec![config]);
    let results = driver.prepare(vec![a.clone(), b.clone()]).await;
    assert!(results.values().all(Result::is_ok));
    driver.unprepare(vec![a.clone()]).await[&a.uid]
        .clone()
        .unwrap();
    assert_eq!(h.gpu.time_slice(&h.gpu_uuid(1)), TimeSliceInterval::Medium);
    driver.unprepare(vec![b.clone()]).await[&b.uid]
        .clone()
        .unwrap();
    assert!(h.gpu.non_default_time_slices().is_empty());
}

#[tokio::test]
async fn a_replaced_injection_reaches_the_next_claims_spec_only() {
    let mut h = Harness::new("dgx-h100", MigMode::Static);
    let current = CurrentInjection::new(DriverInjection::none());
    h.config = h.config.clone().current_injection(current.clone());
    let (driver, _) = h.start().await;
    let before = h.claim("before", &[("gpus", "gpu-0")], vec![]);
    assert!(driver.prepare(vec![before.clone()]).await[&before.uid].is_ok());

    // The driver under the root was upgraded: its files are mounted from elsewhere.
    let mut upgraded = DriverInjection::none();
    upgraded.edits.mounts.push(tessera_cdi::Mount {
        host_path: "/usr/lib64/libcuda.so.590.10.01".into(),
        container_path: "/usr/lib64/libcuda.so.590.10.01".into(),
        options: vec!["ro".into()],
        mount_type: None,
    });
    current.replace(upgraded);
    let after = h.claim("after", &[("gpus", "gpu-1")], vec![]);
    assert!(driver.prepare(vec![after.clone()]).await[&after.uid].is_ok());

    let mounted = |uid: &str| -> Vec<String> {
        h.spec(uid)["containerEdits"]["mounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["hostPath"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        mounted(after.uid.as_str()),
        vec!["/usr/lib64/libcuda.so.590.10.01"]
    );
    // A claim already prepared keeps the spec its containers were started with.
    assert!(mounted(before.uid.as_str()).is_empty());
}
