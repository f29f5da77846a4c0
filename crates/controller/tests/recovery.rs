//! Recovery: the scheduler giving an allocation back, a leader dying half-way through a pod, a
//! leader handing over on shutdown.

use tessera_controller_harness as support;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use support::harness::*;
use support::*;
use tessera_api::names::TOPOLOGY_AWARE_GATE;
use tessera_controller::ControllerConfig;
use tessera_fake_apiserver::{Fault, Verb};
use tessera_placement::protocol::PodPlacement;

fn with_lease(identity: &str) -> ControllerConfig {
    let mut config = ControllerConfig::new(TOPOLOGY_AWARE_GATE);
    config.lease = Some(test_lease(identity));
    config
}

async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn lease_holder(api: &tessera_fake_apiserver::FakeApiServer) -> Option<String> {
    api.get::<Lease>(Some("tessera-system"), "tessera-controller")
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_back_allocation_is_placed_again_on_another_node() {
    let api = cluster(2, 0);
    api.seed(&gpu_claim("a", 2));
    api.seed(&gpu_claim("b", 2));
    api.seed(&gated_pod(
        "trainer",
        &[
            ("first", Source::Claim("a")),
            ("second", Source::Claim("b")),
        ],
    ));
    let controller = start(&api);
    released(&api, "trainer").await;
    let (first_node, _) = allocated_claim(&api, "a").await;
    let (node_b, _) = allocated_claim(&api, "b").await;
    assert_eq!(first_node, node_b);

    // The pod did not fit on that node for another reason: the scheduler's PostFilter clears one
    // claim's allocation and reservation (and leaves the finalizer).
    api.edit::<ResourceClaim>(Some(NS), "b", |c| {
        let status = c.status.as_mut().unwrap();
        status.allocation = None;
        status.reserved_for = None;
    });

    let pod = api
        .wait_for::<Pod>(Some(NS), "trainer", PATIENCE, |p| {
            PodPlacement::of(p).is_some_and(|r| !r.node.is_empty() && r.node != first_node)
        })
        .await
        .expect("the pod is placed again");
    let record = PodPlacement::of(&pod).unwrap();
    assert!(
        record.avoid.contains_key(&first_node),
        "the first node is avoided for a while: {record:?}"
    );
    let (node_a, _) = allocated_claim(&api, "a").await;
    let (node_b, _) = allocated_claim(&api, "b").await;
    assert_eq!(
        (node_a.as_str(), node_b.as_str()),
        (record.node.as_str(), record.node.as_str())
    );
    assert_ne!(node_a, first_node, "both claims moved off the node");
    assert!(
        controller.metrics.claims_undone.get() >= 1,
        "claim a was undone first"
    );
    assert!(double_allocations(&api).is_empty());
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_completes_what_a_dead_leader_left_half_written() {
    let api = cluster(2, 0);
    api.seed(&gpu_claim("a", 2));
    api.seed(&gpu_claim("b", 2));
    // The leader hangs in the write of claim b's allocation and dies there.
    api.inject(
        Fault::on(Verb::Patch, "resourceclaims/status")
            .named("b")
            .delay(Duration::from_secs(60)),
    );
    let first = start_with(&api, with_lease("first"));
    until("the first controller leads", || {
        first.leadership.is_leader()
    })
    .await;
    let second = start_with(&api, with_lease("second"));
    api.seed(&gated_pod(
        "trainer",
        &[
            ("first", Source::Claim("a")),
            ("second", Source::Claim("b")),
        ],
    ));
    let (node, devices_a) = allocated_claim(&api, "a").await;
    until("the first controller is writing claim b", || {
        api.request_count(Verb::Patch, "resourceclaims/status") >= 1
            && api
                .requests()
                .iter()
                .all(|r| !(r.name == "b" && r.subresource == "status"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!second.leadership.is_leader(), "one leader at a time");
    let a_before = claim(&api, "a");
    first.kill();

    // The second controller waits out the lease, then completes the pod on the same node.
    released(&api, "trainer").await;
    assert!(second.leadership.is_leader());
    assert_eq!(
        lease_holder(&api)
            .as_deref()
            .map(|h| h.starts_with("second")),
        Some(true)
    );
    let (node_b, _) = allocated_claim(&api, "b").await;
    assert_eq!(node_b, node, "the pod's claims are on one node");
    let a_after = claim(&api, "a");
    assert_eq!(
        a_after.status.as_ref().unwrap().allocation,
        a_before.status.as_ref().unwrap().allocation,
        "claim a was left as the first leader wrote it"
    );
    assert_eq!(placement(&a_after).unwrap().1, devices_a);
    assert_eq!(
        second.metrics.claims_allocated.get(),
        1,
        "only claim b was written by the new leader"
    );
    assert!(
        double_allocations(&api).is_empty(),
        "{:?}",
        double_allocations(&api)
    );
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_at_once() {
    let api = cluster(1, 0);
    let first = start_with(&api, with_lease("first"));
    until("the first controller leads", || {
        first.leadership.is_leader()
    })
    .await;
    let second = start_with(&api, with_lease("second"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!second.leadership.is_leader());
    first.stop().await;
    // Released: the second takes over within a retry period or two, not a lease duration.
    let handed_over = tokio::time::Instant::now();
    until("the second controller leads", || {
        second.leadership.is_leader()
    })
    .await;
    assert!(
        handed_over.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        handed_over.elapsed()
    );
    api.seed(&gpu_claim("a", 1));
    api.seed(&gated_pod("trainer", &[("gpus", Source::Claim("a"))]));
    released(&api, "trainer").await;
    allocated_claim(&api, "a").await;
    second.stop().await;
}
