//! Gate etiquette against the API-server fake: a pod that another component's scheduling gate
//! still holds (a queue such as Kueue that has not admitted it) gets nothing allocated; once the
//! other gates are removed it is placed, within the node selector the queue added on admission.

use tessera_controller_harness as support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSchedulingGate};
use support::harness::*;
use support::*;
use tessera_api::names::TOPOLOGY_AWARE_GATE;

const KUEUE_GATES: [&str; 2] = ["kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology"];

fn gate(name: &str) -> PodSchedulingGate {
    PodSchedulingGate { name: name.into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_is_placed_only_once_the_other_gates_are_gone_and_honours_the_added_selector() {
    let api = cluster(2, 0);
    api.seed(&gpu_claim("gpus", 4));
    let mut pod = gated_pod("queued", &[("gpus", Source::Claim("gpus"))]);
    let spec = pod.spec.as_mut().unwrap();
    spec.scheduling_gates = Some(
        [TOPOLOGY_AWARE_GATE]
            .into_iter()
            .chain(KUEUE_GATES)
            .map(gate)
            .collect(),
    );
    api.seed(&pod);
    let controller = start(&api);

    let (status, message) = condition(&api, "queued", "WaitingForGates").await;
    assert_eq!(status, "Unknown", "not decided yet");
    assert!(
        message.contains("kueue.x-k8s.io/admission, kueue.x-k8s.io/topology"),
        "{message}"
    );
    // Nothing is allocated however long it waits (the condition was written after the decision).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(placement(&claim(&api, "gpus")).is_none());
    let held = api.get::<Pod>(Some(NS), "queued").unwrap();
    assert_eq!(held.spec.unwrap().scheduling_gates.unwrap().len(), 3);
    assert!(
        !controller
            .metrics
            .encode()
            .contains("reason=\"WaitingForGates\""),
        "waiting for another component is not a failed attempt"
    );

    // Admission as Kueue does it: its flavor's node labels into nodeSelector, its gates removed,
    // in one write. dgx-0 comes first by name; the selector names dgx-1.
    api.edit::<Pod>(Some(NS), "queued", |p| {
        let spec = p.spec.as_mut().unwrap();
        spec.node_selector = Some(BTreeMap::from([(
            "kubernetes.io/hostname".to_owned(),
            "dgx-1".to_owned(),
        )]));
        spec.scheduling_gates = Some(vec![gate(TOPOLOGY_AWARE_GATE)]);
    });
    let released = released(&api, "queued").await;
    assert_eq!(released.spec.unwrap().scheduling_gates, None);
    let (node, devices) = allocated_claim(&api, "gpus").await;
    assert_eq!(node, "dgx-1");
    assert_eq!(devices.len(), 4);
    condition(&api, "queued", "Allocated").await;
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_gate_listed_before_tesseras_holds_the_pod_too() {
    let api = cluster(1, 0);
    api.seed(&gpu_claim("gpus", 2));
    let mut pod = gated_pod("held", &[("gpus", Source::Claim("gpus"))]);
    pod.spec.as_mut().unwrap().scheduling_gates =
        Some(vec![gate("example.com/hold"), gate(TOPOLOGY_AWARE_GATE)]);
    api.seed(&pod);
    let controller = start(&api);

    let (_, message) = condition(&api, "held", "WaitingForGates").await;
    assert!(message.contains("example.com/hold"), "{message}");
    assert!(placement(&claim(&api, "gpus")).is_none());
    api.edit::<Pod>(Some(NS), "held", |p| {
        p.spec.as_mut().unwrap().scheduling_gates = Some(vec![gate(TOPOLOGY_AWARE_GATE)]);
    });
    released(&api, "held").await;
    let (node, _) = allocated_claim(&api, "gpus").await;
    assert_eq!(node, "dgx-0");
    controller.stop().await;
}
