//! Gangs through the API-server fake: a group's claims are written before any pod is released,
//! a group that does not fit places nothing and says why, a failed write leaves no partial group,
//! and a group that has waited holds back later pods.

use tessera_controller_harness as support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use support::harness::*;
use support::*;
use tessera_api::names::{GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION, TOPOLOGY_AWARE_GATE};
use tessera_controller::ControllerConfig;
use tessera_fake_apiserver::{Fault, Verb};
use tessera_placement::protocol::is_gated;

/// Seeds a label-named group of `size` pods with one claim of `gpus` GPUs each.
fn seed_group(
    api: &tessera_fake_apiserver::FakeApiServer,
    name: &str,
    size: usize,
    min: u32,
    gpus: i64,
) {
    for i in 0..size {
        api.seed(&gpu_claim(&format!("{name}-{i}-gpus"), gpus));
        api.seed(&group_pod(name, i, min));
    }
}

fn group_pod(name: &str, i: usize, min: u32) -> Pod {
    let claim = format!("{name}-{i}-gpus");
    let mut pod = gated_pod(&format!("{name}-{i}"), &[("gpus", Source::Claim(&claim))]);
    pod.metadata.labels = Some(BTreeMap::from([(GROUP_LABEL.into(), name.into())]));
    pod.metadata.annotations = Some(BTreeMap::from([(
        GROUP_MIN_COUNT_ANNOTATION.into(),
        min.to_string(),
    )]));
    pod
}

fn is_allocated(api: &tessera_fake_apiserver::FakeApiServer, claim_name: &str) -> bool {
    placement(&claim(api, claim_name)).is_some()
}

fn gated(api: &tessera_fake_apiserver::FakeApiServer, pod: &str) -> bool {
    api.get::<Pod>(Some(NS), pod)
        .is_some_and(|p| is_gated(&p, TOPOLOGY_AWARE_GATE))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gangs_that_do_not_fit_together_one_runs_the_other_waits_then_runs() {
    let api = cluster(3, 0);
    seed_group(&api, "first", 2, 2, 8);
    let controller = start(&api);
    released(&api, "first-0").await;
    released(&api, "first-1").await;
    let (a, _) = allocated_claim(&api, "first-0-gpus").await;
    let (b, _) = allocated_claim(&api, "first-1-gpus").await;
    assert_ne!(a, b, "8 GPUs each: two nodes");

    seed_group(&api, "second", 2, 2, 8);
    let (status, message) = condition(&api, "second-0", "GroupUnsatisfiable").await;
    assert_eq!(status, "False");
    assert!(
        message.contains("group ml/second needs 2 of its 2 gated pods placed together"),
        "{message}"
    );
    condition(&api, "second-1", "GroupUnsatisfiable").await;
    let note = event(&api, "second-1", "GroupUnsatisfiable").await;
    assert!(note.contains("the closest attempt"), "{note}");
    // Let it retry a few times: no claim of the waiting gang is ever allocated.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!is_allocated(&api, "second-0-gpus") && !is_allocated(&api, "second-1-gpus"));
    assert!(gated(&api, "second-0") && gated(&api, "second-1"));

    // The first gang finishes: its pods and claims go.
    for i in 0..2 {
        api.remove::<Pod>(Some(NS), &format!("first-{i}"));
        api.remove::<ResourceClaim>(Some(NS), &format!("first-{i}-gpus"));
    }
    released(&api, "second-0").await;
    released(&api, "second-1").await;
    assert!(is_allocated(&api, "second-0-gpus") && is_allocated(&api, "second-1-gpus"));
    assert!(double_allocations(&api).is_empty());
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_whose_min_count_cannot_be_met_gets_no_allocation() {
    let api = cluster(2, 0);
    seed_group(&api, "big", 3, 3, 8);
    let controller = start(&api);
    for i in 0..3 {
        condition(&api, &format!("big-{i}"), "GroupUnsatisfiable").await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..3 {
        assert!(!is_allocated(&api, &format!("big-{i}-gpus")), "big-{i}");
        assert!(gated(&api, &format!("big-{i}")));
    }
    assert_eq!(
        api.request_count(Verb::Patch, "resourceclaims/status"),
        0,
        "not one allocation was written"
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_short_of_pods_waits_for_them_then_runs() {
    let api = cluster(2, 0);
    api.seed(&gpu_claim("late-0-gpus", 4));
    api.seed(&group_pod("late", 0, 2));
    let controller = start(&api);
    let (_, message) = condition(&api, "late-0", "WaitingForGroup").await;
    assert!(message.contains("waiting for 1 more"), "{message}");
    assert!(!is_allocated(&api, "late-0-gpus"));
    api.seed(&gpu_claim("late-1-gpus", 4));
    api.seed(&group_pod("late", 1, 2));
    released(&api, "late-0").await;
    released(&api, "late-1").await;
    let (a, _) = allocated_claim(&api, "late-0-gpus").await;
    let (b, _) = allocated_claim(&api, "late-1-gpus").await;
    assert_eq!(a, b, "two 4-GPU pods share one 8-GPU node");
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_undoes_the_whole_group() {
    let api = cluster(2, 0);
    // Every allocation write of the second member fails until the fault is cleared.
    api.inject(
        Fault::on(Verb::Patch, "resourceclaims/status")
            .named("pair-1-gpus")
            .times(usize::MAX),
    );
    seed_group(&api, "pair", 2, 2, 8);
    let controller = start(&api);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while controller.metrics.claims_undone.get() < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first member's claim was never undone"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        gated(&api, "pair-0") && gated(&api, "pair-1"),
        "no member is released while the group is incomplete"
    );
    api.clear_faults();
    released(&api, "pair-0").await;
    released(&api, "pair-1").await;
    assert!(is_allocated(&api, "pair-0-gpus") && is_allocated(&api, "pair-1-gpus"));
    assert!(double_allocations(&api).is_empty());
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_that_waited_holds_back_a_later_pod() {
    let api = cluster(2, 0);
    // One node is taken: the gang of two 8-GPU pods waits.
    api.seed(&allocated(
        gpu_claim("held", 8),
        "dgx-0",
        &[
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7",
        ],
    ));
    seed_group(&api, "gang", 2, 2, 8);
    let mut config = ControllerConfig::new(TOPOLOGY_AWARE_GATE);
    config.group_hold = Duration::from_millis(1);
    let controller = start_with(&api, config);
    condition(&api, "gang-0", "GroupUnsatisfiable").await;
    // A pod created after the gang would fit on dgx-1 but waits behind the gang.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    api.seed(&gpu_claim("single-gpus", 1));
    api.seed(&gated_pod(
        "single",
        &[("gpus", Source::Claim("single-gpus"))],
    ));
    let (_, message) = condition(&api, "single", "WaitingBehindGroup").await;
    assert!(message.contains("group ml/gang"), "{message}");
    assert!(!is_allocated(&api, "single-gpus"));
    // The devices free up: the gang runs first, then the pod is placed if anything is left.
    api.remove::<ResourceClaim>(Some(NS), "held");
    released(&api, "gang-0").await;
    released(&api, "gang-1").await;
    assert!(double_allocations(&api).is_empty());
    controller.stop().await;
}
