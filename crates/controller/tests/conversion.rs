//! A pod converted from the device plugin (docs/admission.md) against the API-server fake: the
//! controller creates the ResourceClaimTemplate its conversion names, and places the pod once
//! kube-controller-manager made the claim from it.

use tessera_controller_harness as support;

use k8s_openapi::api::core::v1::{Pod, PodResourceClaimStatus, PodSchedulingGate, PodStatus};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::json;
use support::harness::*;
use support::*;
use tessera_admission::{ConversionTable, convert};

/// `limits: {nvidia.com/gpu: 4}` as the user wrote it, converted as the webhook converts it.
fn converted_pod(name: &str) -> Pod {
    let written = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}")},
        "spec": {"containers": [{
            "name": "main",
            "image": "registry.k8s.io/pause:3.10",
            "resources": {"limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}}
        }]}
    });
    let classes: Vec<DeviceClass> = shipped_classes();
    let table = ConversionTable::from_device_classes(&classes);
    let conversion = convert(&written, &table).expect("a device-plugin pod converts");
    serde_json::from_value(conversion.object).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_template_a_converted_pod_names_is_created_and_the_pod_placed() {
    let api = cluster(1, 0);
    api.seed(&allocated(gpu_claim("taken", 1), "dgx-0", &["gpu-0"]));
    let pod = api.seed(&converted_pod("trainer"));
    let controller = start(&api);

    let template = api
        .wait_for::<ResourceClaimTemplate>(Some(NS), "tessera-gpu-4", PATIENCE, |_| true)
        .await
        .expect("the controller creates the template");
    let request = &template
        .spec
        .unwrap()
        .spec
        .unwrap()
        .devices
        .unwrap()
        .requests
        .unwrap()[0];
    let exactly = request.exactly.as_ref().unwrap();
    assert_eq!(
        (exactly.device_class_name.as_str(), exactly.count),
        ("gpu.tessera.dev", Some(4))
    );
    let (_, message) = condition(&api, "trainer", "WaitingForClaims").await;
    assert!(
        message.contains("the controller creates the template"),
        "{message}"
    );

    // What kube-controller-manager's ResourceClaim controller does once the template exists.
    let mut claim = gpu_claim("trainer-tessera-gpu-c0-x7k2p", 4);
    claim.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: "trainer".into(),
        uid: pod.metadata.uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    api.seed(&claim);
    api.edit::<Pod>(Some(NS), "trainer", |p| {
        p.status = Some(PodStatus {
            resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                name: "tessera-gpu-c0".into(),
                resource_claim_name: Some("trainer-tessera-gpu-c0-x7k2p".into()),
            }]),
            ..p.status.clone().unwrap_or_default()
        });
    });
    released(&api, "trainer").await;
    let (node, devices) = allocated_claim(&api, "trainer-tessera-gpu-c0-x7k2p").await;
    assert_eq!(node, "dgx-0");
    assert_eq!(
        devices,
        ["gpu-4", "gpu-5", "gpu-6", "gpu-7"],
        "one NVLink island and NUMA node, clear of the GPU in use"
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_converted_pod_a_queue_holds_gets_its_template_but_no_allocation() {
    let api = cluster(1, 0);
    let mut pod = converted_pod("queued");
    // Kueue's webhook adds its gates at creation too; it counts the template's devices before
    // it admits the pod, so the template must exist while its gate holds the pod.
    let gates = pod
        .spec
        .as_mut()
        .unwrap()
        .scheduling_gates
        .get_or_insert_default();
    gates.push(PodSchedulingGate {
        name: "kueue.x-k8s.io/admission".into(),
    });
    api.seed(&pod);
    let controller = start(&api);

    api.wait_for::<ResourceClaimTemplate>(Some(NS), "tessera-gpu-4", PATIENCE, |_| true)
        .await
        .expect("the template is created while the queue holds the pod");
    let (status, message) = condition(&api, "queued", "WaitingForGates").await;
    assert_eq!(status, "Unknown");
    assert!(message.contains("kueue.x-k8s.io/admission"), "{message}");
    let held = api.get::<Pod>(Some(NS), "queued").unwrap();
    assert_eq!(
        held.spec.unwrap().scheduling_gates.unwrap().len(),
        2,
        "both gates stay until the queue admits the pod"
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_the_pod_was_not_converted_to_is_not_created() {
    let api = cluster(1, 0);
    api.seed(&gated_pod(
        "trainer",
        &[("gpus", Source::Template("tessera-gpu-4"))],
    ));
    let controller = start(&api);
    let (_, message) = condition(&api, "trainer", "InvalidInput").await;
    assert!(
        message.contains("ResourceClaimTemplate tessera-gpu-4 does not exist"),
        "{message}"
    );
    assert!(
        api.get::<ResourceClaimTemplate>(Some(NS), "tessera-gpu-4")
            .is_none()
    );
    controller.stop().await;
}
