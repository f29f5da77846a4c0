//! `status.devices` (KEP-4817): what the driver reports for prepared and unprepared claims, and
//! how the writer puts it on the claim through the API server (server-side apply of the status,
//! retried in the background, never for a claim that is gone).

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_fake_apiserver::{FakeApiServer, Fault, Verb};
use tessera_kubelet_grpc::{ClaimRef, ClaimUid, DraDriver};
use tessera_node::claim_status::{MAX_RETRY, StatusWriter, WARNING_INTERVAL};
use tessera_prepare::device_status::{ClaimStatusSink, RecordedStatus};
use tessera_prepare::plan::MigMode;
use tessera_prepare_harness::{Harness, allocated_claim, uid_of};
use tessera_process::Stop;

fn data(status: &k8s_openapi::api::resource::v1::AllocatedDeviceStatus) -> Value {
    status
        .data
        .as_ref()
        .map(|d| d.0.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn prepare_reports_each_device_with_its_uuid_and_unprepare_takes_it_back() {
    let h = Harness::new("dgx-h100", MigMode::Static);
    let (driver, _) = h.start().await;
    let recorded = Arc::new(RecordedStatus::default());
    // A claim prepared before the sink is attached is reported when it is attached (restart).
    let early = h.claim("early", &[("gpu", "gpu-2")], vec![]);
    driver.prepare(vec![early.clone()]).await[&early.uid]
        .clone()
        .unwrap();
    let driver = driver.report_status(recorded.clone());
    let reported = |uid: &ClaimUid| recorded.claims.lock().unwrap().get(uid).cloned();
    let early_devices = reported(&early.uid).expect("the earlier claim is reported");
    assert_eq!(data(&early_devices[0])["uuid"], json!(h.gpu_uuid(2)));

    let claim = h.claim("train", &[("gpus", "gpu-0"), ("gpus", "gpu-3")], vec![]);
    driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    let devices = reported(&claim.uid).expect("the prepared claim is reported");
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1].driver, "gpu.tessera.dev");
    assert_eq!(devices[1].pool, "node-a");
    assert_eq!(devices[1].device, "gpu-3");
    assert_eq!(devices[1].share_id, None);
    let gpu3 = data(&devices[1]);
    assert_eq!(gpu3["uuid"], json!(h.gpu_uuid(3)));
    assert_eq!(gpu3["gpuUUID"], json!(h.gpu_uuid(3)));
    assert_eq!(gpu3["minor"], json!(3));
    assert!(
        gpu3["product"]
            .as_str()
            .unwrap_or_default()
            .contains("H100"),
        "{gpu3}"
    );
    assert_eq!(gpu3.get("migProfile"), None);

    // A failed claim is not reported.
    let bad = h.claim("bad", &[("gpu", "gpu-99")], vec![]);
    assert!(driver.prepare(vec![bad.clone()]).await[&bad.uid].is_err());
    assert_eq!(reported(&bad.uid), None);

    driver.unprepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    assert_eq!(reported(&claim.uid), Some(Vec::new()));
}

#[tokio::test]
async fn mig_devices_report_the_mig_uuid_and_profile() {
    let h = Harness::new("hgx-a100-mig", MigMode::Static);
    let (driver, _) = h.start().await;
    let recorded = Arc::new(RecordedStatus::default());
    let driver = driver.report_status(recorded.clone());
    let mig = h
        .inventory
        .gpus
        .iter()
        .find_map(|g| {
            let state = g.mig.as_ref()?;
            let instance = state.instances.first()?;
            let profile = state.profiles.iter().find(|p| p.name == instance.profile)?;
            let label = tessera_gpu_inventory::profile_label(&profile.name);
            Some((
                format!("gpu-{}-mig-{label}-{}", g.minor, instance.placement_start),
                instance.uuid.clone(),
                profile.name.clone(),
            ))
        })
        .expect("hgx-a100-mig has a MIG instance");
    let claim = h.claim("slice", &[("mig", &mig.0)], vec![]);
    let prepared = driver.prepare(vec![claim.clone()]).await;
    prepared[&claim.uid].clone().unwrap();
    let devices = recorded.claims.lock().unwrap()[&claim.uid].clone();
    let slice = data(&devices[0]);
    assert_eq!(slice["uuid"], json!(mig.1));
    assert_eq!(slice["migProfile"], json!(mig.2));
    assert_ne!(slice["gpuUUID"], slice["uuid"]);
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

fn devices_on_server(server: &FakeApiServer, name: &str) -> Value {
    let claim = server
        .get_json("resourceclaims", Some("ml"), name)
        .expect("the claim exists");
    claim["status"]["devices"].clone()
}

#[tokio::test]
async fn the_writer_applies_entries_retries_failures_and_removes_them() {
    let server = FakeApiServer::new();
    server.seed(&allocated_claim("train", &[("gpus", "gpu-0")], vec![]));
    let stop = Stop::new();
    let (writer, task) = StatusWriter::spawn(server.client(), stop.clone());
    let key = ClaimRef::new("ml", "train", uid_of("train"));
    let entry: k8s_openapi::api::resource::v1::AllocatedDeviceStatus =
        serde_json::from_value(json!({
            "driver": "gpu.tessera.dev", "pool": "node-a", "device": "gpu-0",
            "data": {"uuid": "GPU-0000", "gpuUUID": "GPU-0000", "minor": 0},
        }))
        .unwrap();

    // The first two writes fail; the writer keeps the claim and tries again.
    server.inject(Fault::on(Verb::Apply, "resourceclaims/status").times(2));
    writer.prepared(key.clone(), vec![entry.clone()]);
    eventually("status.devices written", || {
        devices_on_server(&server, "train")[0]["data"]["uuid"] == json!("GPU-0000")
    })
    .await;
    assert!(server.request_count(Verb::Apply, "resourceclaims/status") >= 3);
    eventually("nothing pending", || writer.pending() == 0).await;
    let written = devices_on_server(&server, "train");
    assert_eq!(written[0]["device"], json!("gpu-0"));
    assert_eq!(written[0]["pool"], json!("node-a"));

    writer.unprepared(key.clone());
    eventually("status.devices removed", || {
        devices_on_server(&server, "train")
            .as_array()
            .is_none_or(Vec::is_empty)
    })
    .await;

    // A claim that is gone, or replaced under the same name (another UID), is not retried.
    writer.prepared(
        ClaimRef {
            name: "gone".into(),
            uid: uid_of("gone").into(),
            ..key.clone()
        },
        vec![entry.clone()],
    );
    writer.prepared(
        ClaimRef {
            uid: "another-uid".into(),
            ..key.clone()
        },
        vec![entry],
    );
    eventually("both dropped", || writer.pending() == 0).await;
    assert!(
        devices_on_server(&server, "train")
            .as_array()
            .is_none_or(Vec::is_empty),
        "a write with another claim's UID must not land"
    );

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the writer stops")
        .unwrap();
}

/// What a claim's one device reports (the writer does not look at it).
fn an_entry() -> k8s_openapi::api::resource::v1::AllocatedDeviceStatus {
    serde_json::from_value(json!({
        "driver": "gpu.tessera.dev", "pool": "node-a", "device": "gpu-0",
        "data": {"uuid": "GPU-0000", "gpuUUID": "GPU-0000", "minor": 0},
    }))
    .unwrap()
}

/// The API server down (every status write answered 503) while 5,000 claims are prepared and
/// unprepared and 7 stay prepared: no write is made for a claim no longer prepared, the writer
/// probes with one write per backoff instead of one per claim, and the log is a few lines. When
/// the API server is back, the 7 are written. Virtual time: 5 minutes take no wall time.
#[tokio::test(start_paused = true)]
async fn with_the_api_server_down_gone_claims_are_not_written_and_the_log_is_bounded() {
    const GONE: usize = 5_000;
    const OUTAGE: Duration = Duration::from_secs(300);
    let server = FakeApiServer::new();
    let down = Fault::on(Verb::Apply, "resourceclaims/status")
        .status(503)
        .times(usize::MAX);
    server.inject(down);
    let stop = Stop::new();
    let (writer, task) = StatusWriter::spawn(server.client(), stop.clone());

    let kept: Vec<ClaimRef> = (0..7)
        .map(|i| {
            let name = format!("kept-{i}");
            server.seed(&allocated_claim(&name, &[("gpu", "gpu-0")], vec![]));
            ClaimRef::new("ml", &name, uid_of(&name))
        })
        .collect();
    for claim in &kept {
        writer.prepared(claim.clone(), vec![an_entry()]);
    }
    for i in 0..GONE {
        let name = format!("gone-{i}");
        let claim = ClaimRef::new("ml", &name, uid_of(&name));
        writer.prepared(claim.clone(), vec![an_entry()]);
        if i % 100 == 0 {
            // Prepares come and go over a minute while the writer probes.
            tokio::time::sleep(Duration::from_millis(1_200)).await;
        }
        writer.unprepared(claim);
    }
    assert_eq!(writer.pending(), kept.len(), "gone claims are forgotten");
    let writes_while_preparing = server.request_count(Verb::Apply, "resourceclaims/status");
    server.clear_requests();
    let warnings_before = writer.warnings_logged();

    tokio::time::sleep(OUTAGE).await;
    let writes: Vec<String> = server
        .requests()
        .into_iter()
        .filter(|r| r.verb == Verb::Apply && r.subresource == "status")
        .map(|r| r.name)
        .collect();
    let gone_written = writes.iter().filter(|n| n.starts_with("gone-")).count();
    assert_eq!(gone_written, 0, "{writes:?}");
    // One probe per backoff (1 s doubling to 60 s): at most 300/60 + the 7 steps of the ramp.
    let most_probes = (OUTAGE.as_secs() / MAX_RETRY.as_secs()) as usize + 7;
    assert!(
        writes.len() <= most_probes && writes_while_preparing <= most_probes,
        "{} writes in the outage, {writes_while_preparing} while preparing",
        writes.len()
    );
    let warnings = writer.warnings_logged() - warnings_before;
    let most_warnings = OUTAGE.as_secs() / WARNING_INTERVAL.as_secs() + 1;
    assert!(
        (1..=most_warnings).contains(&warnings),
        "{warnings} warning lines"
    );
    assert_eq!(writer.pending(), kept.len());

    // The API server is back: the claims still prepared get their entries.
    server.clear_faults();
    tokio::time::sleep(MAX_RETRY * 2).await;
    assert_eq!(writer.pending(), 0);
    for claim in &kept {
        assert_eq!(
            devices_on_server(&server, &claim.name)[0]["data"]["uuid"],
            json!("GPU-0000"),
            "{}",
            claim.name
        );
    }
    stop.cancel();
    task.await.unwrap();
}
