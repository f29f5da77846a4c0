//! Preemption against the API-server fake: a gated pod that fits on no free devices evicts pods
//! of lower priority through the Eviction API, is nominated for the devices they free, and is
//! placed once their claims are released — never before, never on devices anyone else holds.

use tessera_controller_harness as support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodStatus};
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimConsumerReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use support::harness::*;
use support::*;
use tessera_api::names::{
    GROUP_LABEL, NOMINATION_ANNOTATION, PREEMPTED_BY_ANNOTATION, TOPOLOGY_AWARE_GATE,
};
use tessera_controller::ControllerConfig;
use tessera_fake_apiserver::{FakeApiServer, Fault, Verb};

/// A running pod on `node` of `priority`, started `minutes` ago, holding `devices` through its
/// claim (named like the pod), with `labels`.
fn running(
    api: &FakeApiServer,
    name: &str,
    node: &str,
    priority: i32,
    minutes: i64,
    devices: &[&str],
    labels: &[(&str, &str)],
) {
    let mut claim = allocated(gpu_claim(name, devices.len() as i64), node, devices);
    let status = claim.status.as_mut().expect("allocated");
    status.reserved_for = Some(vec![ResourceClaimConsumerReference {
        resource: "pods".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        api_group: None,
    }]);
    api.seed(&claim);
    let mut pod = gated_pod(name, &[]);
    pod.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    let spec = pod.spec.as_mut().expect("spec");
    spec.scheduling_gates = None;
    spec.node_name = Some(node.into());
    spec.priority = Some(priority);
    spec.resource_claims = Some(vec![PodResourceClaim {
        name: "gpus".into(),
        resource_claim_name: Some(name.into()),
        resource_claim_template_name: None,
    }]);
    let started = Timestamp::now() - SignedDuration::from_mins(minutes);
    pod.status = Some(PodStatus {
        phase: Some("Running".into()),
        start_time: Some(Time(started)),
        ..Default::default()
    });
    api.seed(&pod);
}

/// A gated pod of `priority` asking for `count` GPUs (claim named like the pod).
fn preemptor(api: &FakeApiServer, name: &str, priority: i32, count: i64, policy: Option<&str>) {
    api.seed(&gpu_claim(name, count));
    let mut pod = gated_pod(name, &[("gpus", Source::Claim(name))]);
    let spec = pod.spec.as_mut().expect("spec");
    spec.priority = Some(priority);
    spec.preemption_policy = policy.map(str::to_owned);
    api.seed(&pod);
}

/// A budget over pods labelled `app=<app>` allowing `allowed` disruptions.
fn budget(api: &FakeApiServer, app: &str, allowed: i32) {
    api.seed(&PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(format!("{app}-budget")),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
                match_expressions: None,
            }),
            ..Default::default()
        }),
        status: Some(PodDisruptionBudgetStatus {
            disruptions_allowed: Some(allowed),
            ..Default::default()
        }),
    });
}

fn gone(api: &FakeApiServer, pod: &str) -> bool {
    api.get::<Pod>(Some(NS), pod).is_none()
}

fn evictions(api: &FakeApiServer) -> usize {
    api.request_count(Verb::Create, "pods/eviction")
}

/// What the resourceclaim controller does once an evicted pod is gone: the claim is released.
fn release_claim(api: &FakeApiServer, claim: &str) {
    api.remove::<ResourceClaim>(Some(NS), claim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_pod_evicts_a_lower_one_and_waits_for_its_claim() {
    let api = cluster(1, 0);
    // Both hold one NUMA node's four GPUs; `young` has run less, so evicting it loses less work.
    running(
        &api,
        "old",
        "dgx-0",
        0,
        600,
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
        &[],
    );
    running(
        &api,
        "young",
        "dgx-0",
        0,
        5,
        &["gpu-4", "gpu-5", "gpu-6", "gpu-7"],
        &[],
    );
    preemptor(&api, "prod", 1000, 4, None);
    let controller = start(&api);

    let note = event(&api, "young", "Preempted").await;
    assert!(note.contains("ml/prod (priority 1000)"), "{note}");
    let (_, message) = condition(&api, "prod", "Preempting").await;
    assert!(message.contains("preempting ml/young"), "{message}");
    assert!(gone(&api, "young"), "evicted through the Eviction API");
    assert!(!gone(&api, "old"), "one victim is enough");
    let pod = api.get::<Pod>(Some(NS), "prod").expect("prod");
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert!(
        annotations.contains_key(NOMINATION_ANNOTATION),
        "{annotations:?}"
    );
    let nominated = pod
        .status
        .as_ref()
        .and_then(|s| s.nominated_node_name.clone());
    assert_eq!(nominated.as_deref(), Some("dgx-0"));

    // The victim's claim still holds its devices: the preemptor is not placed on them yet.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(placement(&claim(&api, "prod")).is_none());
    assert!(tessera_placement::protocol::is_gated(
        &api.get::<Pod>(Some(NS), "prod").unwrap(),
        tessera_api::names::TOPOLOGY_AWARE_GATE
    ));
    release_claim(&api, "young");
    let pod = released(&api, "prod").await;
    let (node, devices) = allocated_claim(&api, "prod").await;
    assert_eq!(node, "dgx-0");
    assert_eq!(devices, ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]);
    assert!(double_allocations(&api).is_empty());
    let settled = api
        .wait_for::<Pod>(Some(NS), "prod", PATIENCE, |p| {
            !p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(NOMINATION_ANNOTATION))
        })
        .await;
    assert!(
        settled.is_ok(),
        "the nomination is removed once placed: {pod:?}"
    );
    let metrics = controller.metrics.encode();
    assert!(
        metrics.contains("tessera_controller_preemptions_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tessera_controller_preemption_victims_total 1"),
        "{metrics}"
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_priority_and_policy_never_preempt_nobody() {
    let api = cluster(1, 0);
    let all = [
        "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7",
    ];
    running(&api, "peer", "dgx-0", 1000, 60, &all, &[]);
    preemptor(&api, "same", 1000, 4, None);
    let controller = start(&api);
    let (_, message) = condition(&api, "same", "Unsatisfiable").await;
    assert!(message.contains("preemption cannot make room"), "{message}");
    controller.stop().await;

    let api = cluster(1, 0);
    running(&api, "batch", "dgx-0", 0, 60, &all, &[]);
    preemptor(&api, "polite", 1000, 4, Some("Never"));
    let controller = start(&api);
    let (_, message) = condition(&api, "polite", "Unsatisfiable").await;
    assert!(message.contains("preemptionPolicy is Never"), "{message}");
    assert_eq!(evictions(&api), 0);
    assert!(!gone(&api, "batch"));
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_preemption_off_nobody_is_evicted() {
    let api = cluster(1, 0);
    let all = [
        "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7",
    ];
    running(&api, "batch", "dgx-0", 0, 60, &all, &[]);
    preemptor(&api, "prod", 1000, 4, None);
    let mut config = ControllerConfig::new(TOPOLOGY_AWARE_GATE);
    config.preemption = false;
    let controller = start_with(&api, config);
    let (_, message) = condition(&api, "prod", "Unsatisfiable").await;
    assert!(!message.contains("would preempt"), "{message}");
    assert!(!message.contains("preempting"), "{message}");
    assert_eq!(evictions(&api), 0);
    assert!(!gone(&api, "batch"));
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_is_evicted_whole() {
    let api = cluster(1, 0);
    let gang = [(GROUP_LABEL, "sweep")];
    running(
        &api,
        "sweep-0",
        "dgx-0",
        0,
        30,
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
        &gang,
    );
    running(
        &api,
        "sweep-1",
        "dgx-0",
        0,
        30,
        &["gpu-4", "gpu-5", "gpu-6", "gpu-7"],
        &gang,
    );
    // Two GPUs would fit in either member's devices, but the gang goes whole or not at all.
    preemptor(&api, "prod", 1000, 2, None);
    let controller = start(&api);
    event(&api, "sweep-0", "Preempted").await;
    event(&api, "sweep-1", "Preempted").await;
    assert!(gone(&api, "sweep-0") && gone(&api, "sweep-1"));
    release_claim(&api, "sweep-0");
    release_claim(&api, "sweep-1");
    released(&api, "prod").await;
    assert!(double_allocations(&api).is_empty());
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_that_allows_no_disruption_is_honoured() {
    // The budget leaves the lowest-priority pod alone: the other one is the victim.
    let api = cluster(1, 0);
    running(
        &api,
        "guarded",
        "dgx-0",
        0,
        5,
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
        &[("app", "guarded")],
    );
    running(
        &api,
        "other",
        "dgx-0",
        10,
        5,
        &["gpu-4", "gpu-5", "gpu-6", "gpu-7"],
        &[],
    );
    budget(&api, "guarded", 0);
    preemptor(&api, "prod", 1000, 4, None);
    let controller = start(&api);
    event(&api, "other", "Preempted").await;
    assert!(!gone(&api, "guarded"));
    controller.stop().await;

    // With every candidate guarded nothing is evicted and the pod says why.
    let api = cluster(1, 0);
    let all = [
        "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7",
    ];
    running(&api, "guarded", "dgx-0", 0, 5, &all, &[("app", "guarded")]);
    budget(&api, "guarded", 0);
    preemptor(&api, "prod", 1000, 4, None);
    let controller = start(&api);
    let (_, message) = condition(&api, "prod", "PreemptionBlocked").await;
    assert!(message.contains("preemption cannot make room"), "{message}");
    assert!(
        message.contains("guarded-budget"),
        "the budget is named: {message}"
    );
    assert_eq!(evictions(&api), 0);
    assert!(!gone(&api, "guarded"));
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_of_a_pod_a_budget_protects_names_the_budget_however_long_the_message() {
    // Three full nodes: the account of why the pod fits on none of them is longer than an
    // event's note may be (1 KiB), and the budget is what the user needs to read.
    let api = cluster(3, 0);
    let all = [
        "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7",
    ];
    for i in 0..3 {
        let (name, node) = (format!("guarded-{i}"), format!("dgx-{i}"));
        running(&api, &name, &node, 0, 5, &all, &[("app", "guarded")]);
    }
    budget(&api, "guarded", 0);
    preemptor(&api, "prod", 1000, 4, None);
    let controller = start(&api);
    let (_, message) = condition(&api, "prod", "PreemptionBlocked").await;
    assert!(
        message.len() > 1024,
        "the case needs a long message: {message}"
    );
    let note = event(&api, "prod", "PreemptionBlocked").await;
    assert!(
        note.contains("protected by PodDisruptionBudget ml/guarded-budget"),
        "the event names the budget: {note}"
    );
    assert_eq!(evictions(&api), 0);
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_eviction_withdraws_the_plan_and_another_set_is_tried() {
    let api = cluster(1, 0);
    running(
        &api,
        "first",
        "dgx-0",
        0,
        5,
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
        &[],
    );
    running(
        &api,
        "second",
        "dgx-0",
        0,
        600,
        &["gpu-4", "gpu-5", "gpu-6", "gpu-7"],
        &[],
    );
    // The API server refuses the first eviction (a budget the controller had not seen yet).
    api.inject(
        Fault::on(Verb::Create, "pods/eviction")
            .named("first")
            .status_with_message(
                429,
                "Cannot evict pod as it would violate the pod's disruption budget.",
            )
            .times(100),
    );
    preemptor(&api, "prod", 1000, 4, None);
    let controller = start(&api);
    let note = event(&api, "prod", "PreemptionBlocked").await;
    assert!(note.contains("ml/first"), "{note}");
    event(&api, "second", "Preempted").await;
    assert!(!gone(&api, "first") && gone(&api, "second"));
    let pod = api.get::<Pod>(Some(NS), "prod").unwrap();
    let marked = api.get::<Pod>(Some(NS), "first").unwrap();
    assert!(
        !marked
            .metadata
            .annotations
            .is_some_and(|a| a.contains_key(PREEMPTED_BY_ANNOTATION)),
        "the refused victim is unmarked when the plan is withdrawn"
    );
    assert!(pod.metadata.annotations.is_some());
    release_claim(&api, "second");
    released(&api, "prod").await;
    assert_eq!(
        allocated_claim(&api, "prod").await.1,
        ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_preempts_a_whole_gang_of_lower_priority() {
    let api = cluster(1, 0);
    let low = [(GROUP_LABEL, "sweep")];
    running(
        &api,
        "sweep-0",
        "dgx-0",
        0,
        30,
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
        &low,
    );
    running(
        &api,
        "sweep-1",
        "dgx-0",
        0,
        30,
        &["gpu-4", "gpu-5", "gpu-6", "gpu-7"],
        &low,
    );
    for i in 0..2 {
        let name = format!("prod-{i}");
        preemptor(&api, &name, 1000, 4, None);
        let mut pod = api.get::<Pod>(Some(NS), &name).expect("seeded");
        pod.metadata.labels = Some(BTreeMap::from([(
            GROUP_LABEL.to_owned(),
            "prod".to_owned(),
        )]));
        pod.metadata.annotations = Some(BTreeMap::from([(
            tessera_api::names::GROUP_MIN_COUNT_ANNOTATION.to_owned(),
            "2".to_owned(),
        )]));
        api.seed(&pod);
    }
    let controller = start(&api);
    let note = event(&api, "sweep-0", "Preempted").await;
    assert!(note.contains("ml/prod-"), "{note}");
    event(&api, "sweep-1", "Preempted").await;
    condition(&api, "prod-0", "Preempting").await;
    condition(&api, "prod-1", "Preempting").await;
    for pod in ["prod-0", "prod-1"] {
        let nominated = api.get::<Pod>(Some(NS), pod).unwrap();
        assert!(
            nominated
                .metadata
                .annotations
                .is_some_and(|a| a.contains_key(NOMINATION_ANNOTATION)),
            "every member the plan places is nominated: {pod}"
        );
    }
    release_claim(&api, "sweep-0");
    release_claim(&api, "sweep-1");
    released(&api, "prod-0").await;
    released(&api, "prod-1").await;
    let mut devices: Vec<String> = Vec::new();
    for claim_name in ["prod-0", "prod-1"] {
        devices.extend(allocated_claim(&api, claim_name).await.1);
    }
    devices.sort();
    assert_eq!(devices.len(), 8);
    assert!(double_allocations(&api).is_empty());
    controller.stop().await;
}
