//! `tessera explain` on IMEX domains, run as a binary on objects written to a temporary directory:
//! three topology-managed GB200 trays of one fabric clique with two channels, both held by domains
//! kube-scheduler allocated; a 4-tray gang and a 2-tray gang, each sharing a domain claim. The pod
//! explains why its gang waits (no clique with enough free trays); the domain claim explains its
//! clique's channels, who holds them and the controller's reason.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodSchedulingGate, PodSpec};
use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
    ResourceClaim, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use serde::Serialize;
use tessera_api::imex::{IMEX_DEVICE_CLASS, pool_name};
use tessera_api::names::{
    DRIVER_NAME, GPU_DEVICE_CLASS, GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION, TOPOLOGY_AWARE_GATE,
};
use tessera_gpu_inventory::{
    ChannelPool, DeviceSource, HOSTNAME_LABEL, MockSource, RenderOptions, ServerVersion,
    render_channel_slices, render_slices,
};
use tessera_placement::synthetic::{self, device_claim, gpu_node};

/// The clique of the shipped gb200-tray topology.
const CLIQUE: &str = "522c88f3-2731-5718-acd9-980cbf3d0f20.32766";
const NS: &str = "ml";

fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("the tessera binary runs")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "tessera failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

fn write<T: Serialize>(dir: &Path, file: &str, objects: &[T]) {
    let docs: Vec<String> = objects
        .iter()
        .map(|o| serde_json::to_string(o).unwrap())
        .collect();
    std::fs::write(dir.join(file), docs.join("\n---\n")).unwrap();
}

/// A domain claim allocated channel `channel` of the clique (as kube-scheduler allocates it).
fn held_domain(name: &str, channel: u32) -> ResourceClaim {
    let mut claim = device_claim(NS, name, name, IMEX_DEVICE_CLASS, 1);
    claim.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![DeviceRequestAllocationResult {
                    request: synthetic::REQUEST.into(),
                    driver: DRIVER_NAME.into(),
                    pool: pool_name(CLIQUE),
                    device: format!("channel-{channel}"),
                    ..Default::default()
                }]),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    claim
}

/// Gang `name` of `pods` gated pods of 4 GPUs each, sharing the claim `<name>-domain`.
fn gang(name: &str, pods: usize, claims: &mut Vec<ResourceClaim>) -> Vec<Pod> {
    let domain = format!("{name}-domain");
    claims.push(device_claim(NS, &domain, &domain, IMEX_DEVICE_CLASS, 1));
    (0..pods)
        .map(|i| {
            let gpus = format!("{name}-{i}-gpus");
            claims.push(device_claim(NS, &gpus, &gpus, GPU_DEVICE_CLASS, 4));
            let pod_claim = |n: &str, claim: &str| PodResourceClaim {
                name: n.into(),
                resource_claim_name: Some(claim.into()),
                ..Default::default()
            };
            Pod {
                metadata: ObjectMeta {
                    name: Some(format!("{name}-{i}")),
                    namespace: Some(NS.into()),
                    uid: Some(format!("uid-{name}-{i}")),
                    labels: Some(BTreeMap::from([(GROUP_LABEL.into(), name.into())])),
                    annotations: Some(BTreeMap::from([(
                        GROUP_MIN_COUNT_ANNOTATION.into(),
                        pods.to_string(),
                    )])),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    scheduling_gates: Some(vec![PodSchedulingGate {
                        name: TOPOLOGY_AWARE_GATE.into(),
                    }]),
                    resource_claims: Some(vec![
                        pod_claim("gpus", &gpus),
                        pod_claim("domain", &domain),
                    ]),
                    ..Default::default()
                }),
                status: None,
            }
        })
        .collect()
}

fn objects(dir: &Path) {
    let tray = MockSource::new("gb200-tray").unwrap().inventory().unwrap();
    let names: Vec<String> = (0..3).map(|i| format!("tray-{i}")).collect();
    let mut slices = Vec::new();
    let mut nodes = Vec::new();
    for name in &names {
        let mut options = RenderOptions::new(name.clone());
        options.topology_managed = true;
        options.server_version = ServerVersion::V1_35;
        slices.extend(render_slices(&tray, &options).unwrap());
        nodes.push(gpu_node(name, [(HOSTNAME_LABEL, name.clone())]));
    }
    slices.extend(
        render_channel_slices(&ChannelPool {
            driver: DRIVER_NAME.into(),
            clique: CLIQUE.into(),
            nodes: names.clone(),
            channels: 2,
            managed: true,
            generation: 1,
            server_version: ServerVersion::V1_35,
        })
        .unwrap(),
    );
    let mut claims = vec![held_domain("old-a", 0), held_domain("old-b", 1)];
    let mut pods = gang("big", 4, &mut claims);
    pods.extend(gang("late", 2, &mut claims));
    write(dir, "slices.yaml", &slices);
    write(dir, "nodes.yaml", &nodes);
    write(
        dir,
        "classes.yaml",
        &[synthetic::gpu_class(), synthetic::imex_class()],
    );
    write(dir, "claims.yaml", &claims);
    write(dir, "pods.yaml", &pods);
}

fn explain(dir: &Path, what: &str) -> String {
    ok(&tessera(&[
        "explain",
        what,
        "-n",
        NS,
        "--objects",
        dir.to_str().unwrap(),
    ]))
}

#[test]
fn a_domain_gang_too_big_for_every_clique_says_which_clique_came_closest() {
    let dir = tempfile::tempdir().unwrap();
    objects(dir.path());
    let text = explain(dir.path(), "pod/big-0");
    let expected = format!(
        "no fabric clique has 4 free trays for the IMEX domain ml/big-domain: the most, 3, are in clique {CLIQUE}"
    );
    assert!(text.contains(&expected), "{text}");
}

#[test]
fn a_domain_claim_says_who_holds_its_cliques_channels_and_why_its_pods_wait() {
    let dir = tempfile::tempdir().unwrap();
    objects(dir.path());
    let text = explain(dir.path(), "claim/late-domain");
    for expected in [
        "note: claim ml/late-domain is an IMEX domain (class imex.gpu.tessera.dev): its pods share one channel of \
         one fabric clique; pods: ml/late-0 (gated), ml/late-1 (gated)"
            .to_owned(),
        format!("note: clique {CLIQUE}: 2 of 2 channels in use (ml/old-a, ml/old-b)"),
        "note: the controller, deciding pod ml/late-0: group ml/late needs 2 of its 2 gated pods placed together"
            .to_owned(),
        format!(
            "no free IMEX channel in clique {CLIQUE} (2 of 2 in use); the channels of clique {CLIQUE} are held by the domains ml/old-a, ml/old-b"
        ),
    ] {
        assert!(text.contains(&expected), "missing {expected:?} in:\n{text}");
    }
    // The pod says the same.
    let pod = explain(dir.path(), "pod/late-1");
    assert!(
        pod.contains(&format!(
            "no free IMEX channel in clique {CLIQUE} (2 of 2 in use)"
        )),
        "{pod}"
    );
}

/// Node `node`'s daemon condition on a domain's channel entry, as the node's plugin writes it.
fn daemon_condition(node: &str, ready: bool, message: &str) -> Condition {
    Condition {
        type_: format!("{node}/IMEXDaemonReady"),
        status: if ready { "True" } else { "False" }.into(),
        reason: if ready {
            "IMEXDaemonReady"
        } else {
            "IMEXDaemonNotReady"
        }
        .into(),
        message: message.into(),
        last_transition_time: Time("2026-11-29T08:00:00Z".parse().unwrap()),
        observed_generation: None,
    }
}

#[test]
fn a_domain_claim_names_the_nodes_whose_imex_daemon_is_not_ready_with_its_answer() {
    let dir = tempfile::tempdir().unwrap();
    objects(dir.path());
    let mut claim = held_domain("old-a", 0);
    let status = claim.status.as_mut().unwrap();
    status.devices = Some(vec![AllocatedDeviceStatus {
        driver: DRIVER_NAME.into(),
        pool: pool_name(CLIQUE),
        device: "channel-0".into(),
        conditions: Some(vec![
            daemon_condition("tray-1", true, "READY"),
            daemon_condition("tray-2", false, "UNAVAILABLE link down"),
            daemon_condition("tray-0", true, "READY"),
        ]),
        ..Default::default()
    }]);
    // The claims file holds the other objects' claims; this one replaces its namesake.
    write(dir.path(), "z-claim.yaml", &[claim]);
    std::fs::write(
        dir.path().join("claims.yaml"),
        std::fs::read_to_string(dir.path().join("claims.yaml"))
            .unwrap()
            .split("\n---\n")
            .filter(|doc| !doc.contains("\"name\":\"old-a\""))
            .collect::<Vec<_>>()
            .join("\n---\n"),
    )
    .unwrap();
    let text = explain(dir.path(), "claim/old-a");
    for expected in [
        "note: IMEX daemon ready on node(s) tray-0, tray-1",
        "note: IMEX daemon not ready on node tray-2 since 2026-11-29T08:00:00Z: UNAVAILABLE link down",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    // A domain without conditions (no daemon started yet) says nothing of daemons.
    let other = explain(dir.path(), "claim/old-b");
    assert!(!other.contains("IMEX daemon"), "{other}");
}
