//! IMEX channel claims through the driver: the domain's daemon is started before the claim is
//! answered (and a daemon that is not ready fails prepare with its reason, leaving nothing
//! behind), the channel reaches the containers through the CDI spec, unprepare stops the daemon,
//! and a restart stops the daemons of domains no record holds.

use serde_json::json;
use tessera_kubelet_grpc::DraDriver;
use tessera_prepare::imex::{ImexCall, ImexControl};
use tessera_prepare::plan::MigMode;
use tessera_prepare_harness::{CLIQUE, Harness, channel_claim, env_of, nodes_of, uid_of};

#[tokio::test]
async fn a_channel_claim_starts_its_domains_daemon_and_gives_containers_the_channel() {
    let h = Harness::new("gb200-tray", MigMode::Static);
    let (driver, _) = h.start().await;
    let claim = h.channel_claim("domain", 7);
    let uid = claim.uid.clone();

    let results = driver.prepare(vec![claim.clone()]).await;
    let devices = results[&uid].clone().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device_name, "channel-7");
    assert_eq!(devices[0].pool_name, format!("imex-{CLIQUE}"));
    assert_eq!(
        devices[0].cdi_device_ids,
        [format!("gpu.tessera.dev/claim={uid}-channel-7")]
    );
    assert_eq!(
        h.imex.calls(),
        [ImexCall::Start {
            claim_uid: uid.to_string(),
            channel: 7
        }]
    );

    let spec = h.spec(uid.as_str());
    assert_eq!(
        nodes_of(&spec, 0),
        ["/dev/nvidia-caps-imex-channels/channel7"]
    );
    assert_eq!(
        env_of(&spec, 0),
        [
            "TESSERA_IMEX_CHANNEL=7".to_owned(),
            format!("TESSERA_IMEX_DOMAIN={uid}")
        ]
    );
    let directory = h.config.state_dir.join("imex").join(uid.as_str());
    assert_eq!(
        spec["devices"][0]["containerEdits"]["mounts"],
        json!([{"hostPath": directory.display().to_string(), "containerPath": "/etc/nvidia-imex",
            "options": ["rbind", "ro", "nosuid", "nodev"], "type": "bind"}])
    );
    assert_eq!(
        spec.get("containerEdits"),
        None,
        "a claim with only a channel injects no driver"
    );
    let record = &h.read_checkpoint().claims[&uid];
    assert_eq!(record.imex.as_ref().unwrap().channel, 7);

    driver.unprepare(vec![claim.clone()]).await[&uid]
        .clone()
        .unwrap();
    assert_eq!(
        h.imex.calls().last(),
        Some(&ImexCall::Stop {
            claim_uid: uid.to_string()
        })
    );
    assert!(h.imex.running().is_empty());
    assert!(h.spec_uids().is_empty());
}

#[tokio::test]
async fn a_daemon_that_is_not_ready_fails_prepare_with_its_reason_and_leaves_nothing() {
    let h = Harness::new("gb200-tray", MigMode::Static);
    let (driver, _) = h.start().await;
    let claim = h.channel_claim("domain", 3);
    let uid = claim.uid.clone();
    h.imex.fail_starts(Some("UNAVAILABLE link down"));
    let error = driver.prepare(vec![claim.clone()]).await[&uid]
        .clone()
        .unwrap_err()
        .to_string();
    assert!(error.contains("UNAVAILABLE link down"), "{error}");
    assert!(error.contains("not ready on this node"), "{error}");
    assert!(
        h.spec_uids().is_empty(),
        "no spec before the daemon is ready"
    );
    assert!(!h.read_checkpoint().claims.contains_key(&uid));
    assert!(h.imex.running().is_empty(), "the failed start was undone");

    // The kubelet retries once the daemon recovered.
    h.imex.fail_starts(None);
    assert!(driver.prepare(vec![claim]).await[&uid].is_ok());
    assert_eq!(h.imex.running().len(), 1);
}

#[tokio::test]
async fn a_claim_is_one_domain_with_one_channel() {
    let h = Harness::new("gb200-tray", MigMode::Static);
    let (driver, _) = h.start().await;
    h.claims.put(channel_claim("two", &[1, 2]));
    let claim = tessera_kubelet_grpc::ClaimRef::new("ml", "two", uid_of("two"));
    let error = driver.prepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("one IMEX domain with one channel"),
        "{error}"
    );
    assert!(h.imex.calls().is_empty());
}

#[tokio::test]
async fn a_restart_stops_the_daemons_of_domains_no_record_holds() {
    let h = Harness::new("gb200-tray", MigMode::Static);
    let (driver, _) = h.start().await;
    let kept = h.channel_claim("kept", 1);
    driver.prepare(vec![kept.clone()]).await[&kept.uid]
        .clone()
        .unwrap();
    drop(driver);
    // A daemon of a domain whose claim this node never recorded (its record was lost).
    let stray = tessera_prepare::imex::ImexDomain {
        claim_uid: "5a5a5a5a-0000-4000-8000-000000000001".into(),
        namespace: "ml".into(),
        name: "gone".into(),
        channel: 9,
        clique: CLIQUE.into(),
        directory: h
            .config
            .state_dir
            .join("imex/5a5a5a5a-0000-4000-8000-000000000001"),
    };
    h.imex.start(&stray).unwrap();
    let (_driver, report) = h.start().await;
    assert_eq!(report.stopped_imex, std::slice::from_ref(&stray.claim_uid));
    assert_eq!(
        h.imex.running().into_iter().collect::<Vec<_>>(),
        [kept.uid.to_string()],
        "the recorded domain's daemon stays"
    );
}
