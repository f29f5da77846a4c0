//! The controller against the API-server fake: gated pods placed, explained, retried.

use tessera_controller_harness as support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodResourceClaimStatus, PodStatus};
use k8s_openapi::api::resource::v1::{
    ResourceClaim, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use support::harness::*;
use support::*;
use tessera_fake_apiserver::{Fault, Verb};
use tessera_placement::protocol::{CLAIM_FINALIZER, PodPlacement};

fn owned_by(mut claim: ResourceClaim, pod: &Pod) -> ResourceClaim {
    claim.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.metadata.name.clone().unwrap(),
        uid: pod.metadata.uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    claim
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_from_a_template_is_placed_once_generated() {
    let api = cluster(1, 0);
    // gpu-0 and gpu-1 are in use: the 4 GPUs go to the other NUMA node.
    api.seed(&allocated(
        gpu_claim("taken", 2),
        "dgx-0",
        &["gpu-0", "gpu-1"],
    ));
    let template = ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some("four-gpus".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimTemplateSpec {
            metadata: None,
            spec: gpu_claim("x", 4).spec,
        }),
    };
    api.seed(&template);
    let pod = api.seed(&gated_pod(
        "trainer",
        &[("gpus", Source::Template("four-gpus"))],
    ));
    let controller = start(&api);

    let (status, message) = condition(&api, "trainer", "WaitingForClaims").await;
    assert_eq!(status, "False");
    assert!(message.contains("has not been generated yet"), "{message}");

    // What the kube-controller-manager's ResourceClaim controller does for the gated pod.
    api.seed(&owned_by(gpu_claim("trainer-gpus-x7k2p", 4), &pod));
    api.edit::<Pod>(Some(NS), "trainer", |p| {
        p.status = Some(PodStatus {
            resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                name: "gpus".into(),
                resource_claim_name: Some("trainer-gpus-x7k2p".into()),
            }]),
            ..p.status.clone().unwrap_or_default()
        });
    });

    let released = released(&api, "trainer").await;
    let (node, devices) = allocated_claim(&api, "trainer-gpus-x7k2p").await;
    assert_eq!(node, "dgx-0");
    assert_eq!(devices, ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]);
    let c = claim(&api, "trainer-gpus-x7k2p");
    assert_eq!(
        c.metadata.finalizers,
        Some(vec![CLAIM_FINALIZER.to_owned()])
    );
    let m = mark(&c).expect("the claim carries the controller's mark");
    assert_eq!(
        (m.pod.as_str(), m.node.as_str(), m.finalizer_added),
        ("trainer", "dgx-0", true)
    );
    assert!(
        c.status
            .unwrap()
            .allocation
            .unwrap()
            .allocation_timestamp
            .is_some()
    );
    assert_eq!(PodPlacement::of(&released).unwrap().node, "dgx-0");
    let (status, message) = condition(&api, "trainer", "Allocated").await;
    assert_eq!(status, "True");
    assert!(
        message.starts_with("allocated ml/trainer-gpus-x7k2p (gpu-4, gpu-5, gpu-6, gpu-7) on node dgx-0 (topology-aware"),
        "{message}"
    );
    assert_eq!(controller.metrics.pods_placed.get(), 1);
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claims_of_a_pod_are_placed_together() {
    let api = cluster(2, 0);
    api.seed(&allocated(
        gpu_claim("taken", 4),
        "dgx-0",
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
    ));
    api.seed(&gpu_claim("a", 4));
    api.seed(&gpu_claim("b", 4));
    api.seed(&gated_pod(
        "trainer",
        &[
            ("first", Source::Claim("a")),
            ("second", Source::Claim("b")),
        ],
    ));
    let controller = start(&api);
    released(&api, "trainer").await;
    let (node_a, _) = allocated_claim(&api, "a").await;
    let (node_b, _) = allocated_claim(&api, "b").await;
    assert_eq!((node_a.as_str(), node_b.as_str()), ("dgx-1", "dgx-1"));
    assert!(
        double_allocations(&api).is_empty(),
        "{:?}",
        double_allocations(&api)
    );
    controller.stop().await;
}

/// `(manager, subresource)` of every `managedFields` entry of a stored object.
fn managers(object: &serde_json::Value) -> Vec<(String, String)> {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["manager"].as_str().unwrap_or_default().to_owned(),
                e["subresource"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_writes_name_tessera_as_their_field_manager() {
    let api = cluster(1, 0);
    api.seed(&gpu_claim("a", 4));
    api.seed(&gated_pod("trainer", &[("gpus", Source::Claim("a"))]));
    let mut config =
        tessera_controller::ControllerConfig::new(tessera_api::names::TOPOLOGY_AWARE_GATE);
    config.lease = Some(test_lease("only"));
    let controller = start_with(&api, config);
    released(&api, "trainer").await;
    allocated_claim(&api, "a").await;
    let claim = api
        .get_json("resourceclaims", Some(NS), "a")
        .expect("claim a");
    let pod = api.get_json("pods", Some(NS), "trainer").expect("pod");
    let lease = api
        .list_json("leases", None)
        .into_iter()
        .next()
        .expect("the controller's lease");
    controller.stop().await;
    let tessera = |subresource: &str| ("tessera".to_owned(), subresource.to_owned());
    // The allocation (status) and the mark and finalizer (metadata) on the claim, the removed
    // gate on the pod, the lease: all Tessera's, none left to the user agent's "unknown".
    assert!(
        managers(&claim).contains(&tessera("status")),
        "{:?}",
        managers(&claim)
    );
    assert!(
        managers(&claim).contains(&tessera("")),
        "{:?}",
        managers(&claim)
    );
    assert!(
        managers(&pod).contains(&tessera("")),
        "{:?}",
        managers(&pod)
    );
    assert!(
        managers(&lease).contains(&tessera("")),
        "{:?}",
        managers(&lease)
    );
    for object in [&claim, &pod, &lease] {
        assert!(
            managers(object).iter().all(|(m, _)| m != "unknown"),
            "{:?}",
            managers(object)
        );
    }
}

/// Waits until the controller's metrics contain `line` (they are read from its caches, which
/// follow the API server's writes within moments).
async fn scraped(controller: &Running, line: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = controller.metrics.encode();
        if text.contains(line) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{line} missing from\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_fits_nowhere_is_told_why_and_placed_when_room_appears() {
    let api = cluster(1, 1);
    api.seed(&allocated(
        gpu_claim("taken", 2),
        "dgx-0",
        &["gpu-0", "gpu-1"],
    ));
    api.seed(&gpu_claim("big", 8));
    api.seed(&gated_pod("trainer", &[("gpus", Source::Claim("big"))]));
    let controller = start(&api);

    let note = event(&api, "trainer", "Unsatisfiable").await;
    let expected = "claim ml/big cannot be allocated (topology-aware): 0 of 2 nodes fit: \
                    1 without enough free devices for the claims, 1 have no topology-managed devices\n\
                    node dgx-0: cannot allocate\n  \
                    claim ml/big, request gpus (class gpu.tessera.dev) wants 8 devices: 8 devices on the node, \
                    8 match the class selectors, 8 match the request selectors, 6 available — not enough\n    \
                    in use by another claim: gpu.tessera.dev/dgx-0/gpu-0, gpu.tessera.dev/dgx-0/gpu-1";
    assert_eq!(note, expected);
    let (status, message) = condition(&api, "trainer", "Unsatisfiable").await;
    assert_eq!(status, "False");
    assert_eq!(message, expected, "the condition says what the event says");
    let pod = api.get::<Pod>(Some(NS), "trainer").unwrap();
    assert!(tessera_placement::protocol::is_gated(
        &pod,
        tessera_api::names::TOPOLOGY_AWARE_GATE
    ));
    assert!(placement(&claim(&api, "big")).is_none());
    let waiting = "tessera_controller_pods_waiting_for_capacity{reason=\"Unsatisfiable\"}";
    scraped(&controller, &format!("{waiting} 1")).await;

    // The other claim goes away: the pod is retried and placed.
    api.remove::<ResourceClaim>(Some(NS), "taken");
    released(&api, "trainer").await;
    let (node, devices) = allocated_claim(&api, "big").await;
    assert_eq!((node.as_str(), devices.len()), ("dgx-0", 8));
    scraped(&controller, &format!("{waiting} 0")).await;
    assert!(
        controller
            .metrics
            .encode()
            .contains("tessera_controller_failures_total{reason=\"Unsatisfiable\"}")
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_conflict_is_retried() {
    let api = cluster(1, 0);
    api.seed(&gpu_claim("a", 2));
    api.seed(&gated_pod("trainer", &[("gpus", Source::Claim("a"))]));
    api.inject(
        Fault::on(Verb::Patch, "resourceclaims/status")
            .named("a")
            .status(409),
    );
    let controller = start(&api);
    released(&api, "trainer").await;
    allocated_claim(&api, "a").await;
    assert_eq!(
        api.request_count(Verb::Patch, "resourceclaims/status"),
        2,
        "one refused, one accepted"
    );
    assert!(
        controller
            .metrics
            .encode()
            .contains("tessera_controller_failures_total{reason=\"Conflict\"} 1")
    );
    assert!(double_allocations(&api).is_empty());
    controller.stop().await;
}

/// `(subresource, code)` of the patches sent to claim `name`.
fn patches_of(api: &tessera_fake_apiserver::FakeApiServer, name: &str) -> Vec<(String, u16)> {
    api.requests()
        .into_iter()
        .filter(|r| r.name == name && r.verb == Verb::Patch)
        .map(|r| (r.subresource, r.code))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_second_write_undoes_the_first() {
    let api = cluster(1, 0);
    api.seed(&gpu_claim("a", 2));
    api.seed(&gpu_claim("b", 2));
    api.seed(&gated_pod(
        "trainer",
        &[
            ("first", Source::Claim("a")),
            ("second", Source::Claim("b")),
        ],
    ));
    // Claim b's allocation cannot be written for now.
    api.inject(
        Fault::on(Verb::Patch, "resourceclaims/status")
            .named("b")
            .times(1_000)
            .status(500),
    );
    let controller = start(&api);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while patches_of(&api, "a").len() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "claim a was not undone: {:?}",
            patches_of(&api, "a")
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(
        patches_of(&api, "a")[..4],
        [
            ("".to_owned(), 200),
            ("status".to_owned(), 200),
            ("status".to_owned(), 200),
            ("".to_owned(), 200)
        ],
        "mark and allocate claim a, then (b failed) clear its allocation and unmark it"
    );
    // Stopped between attempts, claim a is as it was before.
    controller.stop().await;
    let a = claim(&api, "a");
    assert!(
        placement(&a).is_none(),
        "claim a's allocation was cleared: {a:#?}"
    );
    assert_eq!(
        a.metadata.finalizers, None,
        "the finalizer the controller added is gone"
    );
    assert!(mark(&a).is_none(), "the mark is gone");
    // Once b can be written, both are placed together.
    api.clear_faults();
    let controller = start(&api);
    released(&api, "trainer").await;
    let (node_a, _) = allocated_claim(&api, "a").await;
    let (node_b, _) = allocated_claim(&api, "b").await;
    assert_eq!(node_a, node_b);
    assert!(double_allocations(&api).is_empty());
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_for_another_driver_is_left_to_the_scheduler() {
    let api = cluster(1, 0);
    api.seed(&class("nic", "device.driver == \"nic.example.com\""));
    let mut nic = dgx_slices("dgx-0", false).remove(0);
    nic.metadata.name = Some("dgx-0-nic".into());
    nic.spec.driver = "nic.example.com".into();
    nic.spec.pool.name = "dgx-0-nic".into();
    api.seed(&nic);
    api.seed(&gpu_claim("gpus", 2));
    api.seed(&claim_of("net", "nic", 1));
    api.seed(&gated_pod(
        "trainer",
        &[
            ("gpus", Source::Claim("gpus")),
            ("nic", Source::Claim("net")),
        ],
    ));
    let controller = start(&api);
    let pod = released(&api, "trainer").await;
    assert!(
        PodPlacement::of(&pod).is_none(),
        "no placement was recorded"
    );
    let note = event(&api, "trainer", "LeftToScheduler").await;
    assert!(
        note.contains("class nic selects no topology-managed device"),
        "{note}"
    );
    assert!(
        placement(&claim(&api, "gpus")).is_none(),
        "nothing was allocated"
    );
    assert_eq!(controller.metrics.pods_left_to_scheduler.get(), 1);
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_class_is_reported_until_it_exists() {
    let api = cluster(1, 0);
    api.seed(&claim_of("a", "big-gpus", 1));
    api.seed(&gated_pod("trainer", &[("gpus", Source::Claim("a"))]));
    let controller = start(&api);
    let (_, message) = condition(&api, "trainer", "InvalidInput").await;
    assert_eq!(
        message,
        "claim ml/a, request gpus: DeviceClass big-gpus does not exist; create it or fix deviceClassName (the claims wait until it exists)"
    );
    let mut big = shipped_classes().remove(0);
    big.metadata = ObjectMeta {
        name: Some("big-gpus".into()),
        labels: Some(BTreeMap::new()),
        ..Default::default()
    };
    api.seed(&big);
    released(&api, "trainer").await;
    allocated_claim(&api, "a").await;
    controller.stop().await;
}

/// `claim` asking `memory` of one GPU, allocated on `node`'s `device` as a share when `share` is
/// given (what the scheduler writes for a multi-allocatable device).
fn memory_claim(name: &str, memory: &str, share: Option<(&str, &str)>) -> ResourceClaim {
    use k8s_openapi::api::resource::v1::CapacityRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut c = gpu_claim(name, 1);
    let request = &mut c
        .spec
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()[0];
    request.exactly.as_mut().unwrap().capacity = Some(CapacityRequirements {
        requests: Some([("memory".to_owned(), Quantity(memory.to_owned()))].into()),
    });
    let Some((node, device)) = share else {
        return c;
    };
    let mut c = allocated(c, node, &[device]);
    let result = &mut c
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
    result.share_id = Some(format!("0000000{}-0000-4000-8000-000000000000", name.len()));
    result.consumed_capacity = Some(
        [
            ("memory".to_owned(), Quantity(memory.to_owned())),
            ("multiprocessors".to_owned(), Quantity("0".to_owned())),
        ]
        .into(),
    );
    c
}

/// On a managed node published with consumable shares (`memory`), the controller allocates
/// shares: a claim that fits next to what others consumed gets a share of a used GPU, with its
/// own shareID and consumed memory, and nothing is allocated beyond a device's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_shared_devices_the_controller_allocates_shares_within_capacity() {
    use tessera_gpu_inventory::{
        DeviceSource, MockSource, RenderOptions, ServerVersion, render_slices,
    };
    let api = tessera_fake_apiserver::FakeApiServer::new();
    for class in shipped_classes() {
        api.seed(&class);
    }
    api.seed(&node("dgx-0", true));
    let inventory = MockSource::new("dgx-h100").unwrap().inventory().unwrap();
    let mut options = RenderOptions::new("dgx-0");
    options.server_version = ServerVersion::V1_35;
    options.topology_managed = true;
    options.consumable_shares = "memory".parse().unwrap();
    for slice in render_slices(&inventory, &options).unwrap() {
        api.seed(&slice);
    }
    // gpu-0..6 hold 60Gi each in three shares; gpu-7 is free.
    for gpu in 0..7 {
        for i in 0..3 {
            api.seed(&memory_claim(
                &format!("r{gpu}{i}"),
                "20Gi",
                Some(("dgx-0", &format!("gpu-{gpu}"))),
            ));
        }
    }
    api.seed(&memory_claim("small", "15Gi", None));
    api.seed(&memory_claim("whole", "70Gi", None));
    api.seed(&gated_pod("whole-pod", &[("gpu", Source::Claim("whole"))]));
    let controller = start(&api);
    released(&api, "whole-pod").await;
    let (_, whole) = allocated_claim(&api, "whole").await;
    assert_eq!(whole, ["gpu-7"], "70Gi fits only the free GPU");
    // gpu-7 has 9879Mi left now: 15Gi fits only next to three 20Gi shares.
    api.seed(&gated_pod("small-pod", &[("gpu", Source::Claim("small"))]));
    released(&api, "small-pod").await;
    let (_, small) = allocated_claim(&api, "small").await;
    assert_ne!(small, ["gpu-7"], "15Gi cannot fit next to 70Gi");
    for name in ["small", "whole"] {
        let c = claim(&api, name);
        let result = &c
            .status
            .unwrap()
            .allocation
            .unwrap()
            .devices
            .unwrap()
            .results
            .unwrap()[0];
        assert!(result.share_id.is_some(), "{name}: {result:?}");
        let memory = &result.consumed_capacity.as_ref().unwrap()["memory"].0;
        assert_eq!(memory, if name == "small" { "15Gi" } else { "70Gi" });
    }
    controller.stop().await;
}
