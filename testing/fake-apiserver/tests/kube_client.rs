//! The fake as kube's client and runtime see it: every verb through `kube::Api`, watchers in both
//! initial-list modes, the event recorder, faults, field drops — in-process and over HTTP.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::api::resource::v1::{
    Device, DeviceTaint, ResourceClaim, ResourceClaimStatus, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tessera_fake_apiserver::{FakeApiServer, Fault, Verb};

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

fn slice(name: &str, node: &str, devices: &[&str]) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: "gpu.tessera.dev".into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation: 0,
                resource_slice_count: 1,
            },
            devices: Some(
                devices
                    .iter()
                    .map(|d| Device {
                        name: (*d).into(),
                        taints: Some(vec![DeviceTaint {
                            key: "gpu.tessera.dev/topology-managed".into(),
                            effect: "NoSchedule".into(),
                            ..DeviceTaint::default()
                        }]),
                        ..Device::default()
                    })
                    .collect(),
            ),
            ..ResourceSliceSpec::default()
        },
    }
}

fn claim(name: &str) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("team".into()),
            ..ObjectMeta::default()
        },
        ..ResourceClaim::default()
    }
}

fn api_code(error: kube::Error) -> u16 {
    match error {
        kube::Error::Api(status) => status.code,
        other => panic!("expected an API error, got {other}"),
    }
}

/// Creating node-a twice conflicts; replacing it from a stale copy conflicts.
async fn create_and_replace_with_conflicts(nodes: &Api<Node>) {
    let created = nodes
        .create(&PostParams::default(), &node("node-a"))
        .await
        .unwrap();
    assert!(created.uid().is_some());
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(
        api_code(
            nodes
                .create(&PostParams::default(), &node("node-a"))
                .await
                .unwrap_err()
        ),
        409
    );

    let mut stale = created.clone();
    let mut fresh = created.clone();
    fresh
        .labels_mut()
        .insert("gpu.tessera.dev/topology-managed".into(), "true".into());
    let updated = nodes
        .replace("node-a", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_ne!(updated.resource_version(), created.resource_version());
    stale.labels_mut().insert("x".into(), "y".into());
    assert_eq!(
        api_code(
            nodes
                .replace("node-a", &PostParams::default(), &stale)
                .await
                .unwrap_err()
        ),
        409
    );
}

/// With node-b created: lists by label and field selectors (an unsupported field refused), and in
/// pages.
async fn list_by_selectors_and_in_pages(nodes: &Api<Node>) {
    nodes
        .create(&PostParams::default(), &node("node-b"))
        .await
        .unwrap();
    let managed = nodes
        .list(&ListParams::default().labels("gpu.tessera.dev/topology-managed=true"))
        .await
        .unwrap();
    assert_eq!(
        managed
            .items
            .iter()
            .map(|n| n.name_any())
            .collect::<Vec<_>>(),
        ["node-a"]
    );
    let by_name = nodes
        .list(&ListParams::default().fields("metadata.name=node-b"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);
    assert_eq!(
        api_code(
            nodes
                .list(&ListParams::default().fields("spec.podCIDR=x"))
                .await
                .unwrap_err()
        ),
        400,
        "unsupported field selectors are refused as upstream does"
    );

    let paged = nodes.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(paged.items.len(), 1);
    let token = paged.metadata.continue_.clone().expect("a continue token");
    let rest = nodes
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.items[0].name_any(), "node-b");
    assert!(rest.metadata.continue_.is_none());
}

/// A merge patch adds a label to node-b, a JSON patch removes it.
async fn patch_by_merge_and_json_patch(nodes: &Api<Node>) {
    let patched = nodes
        .patch(
            "node-b",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.labels()["a"], "b");
    let patched = nodes
        .patch(
            "node-b",
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(json!([{"op": "remove", "path": "/metadata/labels/a"}]))
                    .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert!(!patched.labels().contains_key("a"));
}

#[tokio::test]
async fn crud_with_conflicts_and_selectors() {
    let server = FakeApiServer::new();
    let client = server.client();
    let nodes: Api<Node> = Api::all(client.clone());
    create_and_replace_with_conflicts(&nodes).await;
    list_by_selectors_and_in_pages(&nodes).await;
    patch_by_merge_and_json_patch(&nodes).await;
    nodes
        .delete("node-b", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_code(nodes.get("node-b").await.unwrap_err()), 404);
    assert_eq!(server.request_count(Verb::Create, "nodes"), 3);
    assert_eq!(server.request_count(Verb::List, "nodes"), 5);
}

#[tokio::test]
async fn server_side_apply_records_the_manager_and_drops_released_fields() {
    let server = FakeApiServer::new();
    let slices: Api<ResourceSlice> = Api::all(server.client());
    let params = PatchParams::apply("tessera").force();
    let applied = slices
        .patch(
            "node-a-0",
            &params,
            &Patch::Apply(slice("node-a-0", "node-a", &["gpu-0", "gpu-1"])),
        )
        .await
        .unwrap();
    let managers = applied.metadata.managed_fields.clone().unwrap();
    assert_eq!(managers[0].manager.as_deref(), Some("tessera"));
    assert_eq!(managers[0].operation.as_deref(), Some("Apply"));
    let again = slices
        .patch(
            "node-a-0",
            &params,
            &Patch::Apply(slice("node-a-0", "node-a", &["gpu-0", "gpu-1"])),
        )
        .await
        .unwrap();
    assert_eq!(
        again.metadata.generation,
        Some(1),
        "an identical apply changes nothing"
    );
    assert_eq!(
        again.resource_version(),
        applied.resource_version(),
        "a write that changes nothing is not stored"
    );
    let shrunk = slices
        .patch(
            "node-a-0",
            &params,
            &Patch::Apply(slice("node-a-0", "node-a", &["gpu-0"])),
        )
        .await
        .unwrap();
    assert_eq!(shrunk.spec.devices.unwrap().len(), 1);
    assert_eq!(shrunk.metadata.generation, Some(2));

    let no_manager = slices
        .patch(
            "node-a-0",
            &PatchParams::default(),
            &Patch::Apply(slice("node-a-0", "node-a", &[])),
        )
        .await;
    assert_eq!(
        api_code(no_manager.unwrap_err()),
        400,
        "apply needs a field manager"
    );
    assert_eq!(server.request_count(Verb::Apply, "resourceslices"), 4);

    server.disable_device_taints();
    let untainted = slices
        .patch(
            "node-a-0",
            &params,
            &Patch::Apply(slice("node-a-0", "node-a", &["gpu-0"])),
        )
        .await
        .unwrap();
    assert!(
        untainted.spec.devices.unwrap()[0].taints.is_none(),
        "the dropped field is gone"
    );
}

#[tokio::test]
async fn status_subresource_faults_and_finalizers() {
    let server = FakeApiServer::new();
    let claims: Api<ResourceClaim> = Api::namespaced(server.client(), "team");
    let mut created = claims
        .create(&PostParams::default(), &claim("c"))
        .await
        .unwrap();
    created.status = Some(ResourceClaimStatus {
        reserved_for: Some(Vec::new()),
        ..ResourceClaimStatus::default()
    });
    server.inject(
        Fault::on(Verb::Update, "resourceclaims/status")
            .times(2)
            .status(409),
    );
    for _ in 0..2 {
        let error = claims
            .replace_status("c", &PostParams::default(), &created)
            .await
            .unwrap_err();
        assert_eq!(api_code(error), 409);
    }
    let written = claims
        .replace_status("c", &PostParams::default(), &created)
        .await
        .unwrap();
    assert!(written.status.is_some());
    assert_eq!(
        server.request_count(Verb::Update, "resourceclaims/status"),
        3
    );

    server.inject(Fault::on(None, "resourceclaims").named("c").status(500));
    assert_eq!(api_code(claims.get("c").await.unwrap_err()), 500);
    assert!(
        claims.get("c").await.is_ok(),
        "a fault fires as often as it was armed"
    );

    claims
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": ["resource.kubernetes.io/delete-protection"]}}),
            ),
        )
        .await
        .unwrap();
    claims.delete("c", &DeleteParams::default()).await.unwrap();
    let terminating = claims.get("c").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    claims
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert_eq!(api_code(claims.get("c").await.unwrap_err()), 404);
}

async fn next_change(
    stream: &mut (impl futures::Stream<Item = Result<watcher::Event<Node>, watcher::Error>> + Unpin),
) -> watcher::Event<Node> {
    tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .expect("a watcher event in time")
        .expect("no watcher error")
        .expect("the watcher does not end")
}

async fn watcher_sees_changes(config: watcher::Config) {
    let server = FakeApiServer::new();
    server.seed(&node("node-a"));
    server.seed(&node("other"));
    let nodes: Api<Node> = Api::all(server.client());
    let mut stream = watcher(nodes.clone(), config.fields("metadata.name=node-a")).boxed();
    assert!(matches!(
        next_change(&mut stream).await,
        watcher::Event::Init
    ));
    match next_change(&mut stream).await {
        watcher::Event::InitApply(node) => assert_eq!(node.name_any(), "node-a"),
        other => panic!("expected node-a, got {other:?}"),
    }
    assert!(matches!(
        next_change(&mut stream).await,
        watcher::Event::InitDone
    ));

    server.edit::<Node>(None, "node-a", |node| {
        node.labels_mut()
            .insert("gpu.tessera.dev/topology-managed".into(), "true".into());
    });
    match next_change(&mut stream).await {
        watcher::Event::Apply(node) => {
            assert_eq!(node.labels()["gpu.tessera.dev/topology-managed"], "true")
        }
        other => panic!("expected the labelled node, got {other:?}"),
    }
    server.edit::<Node>(None, "other", |node| {
        node.labels_mut().insert("ignored".into(), "yes".into());
    });
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    match next_change(&mut stream).await {
        watcher::Event::Delete(node) => assert_eq!(node.name_any(), "node-a"),
        other => panic!("expected the deletion of node-a only, got {other:?}"),
    }
}

#[tokio::test]
async fn watcher_with_list_then_watch() {
    watcher_sees_changes(watcher::Config::default()).await;
}

#[tokio::test]
async fn watcher_with_streaming_lists() {
    watcher_sees_changes(watcher::Config::default().streaming_lists()).await;
}

#[tokio::test]
async fn expired_history_makes_watches_relist_and_selectors_apply_to_both_sides() {
    let server = FakeApiServer::new();
    server.seed(&node("node-a"));
    let nodes: Api<Node> = Api::all(server.client());
    let start = server.resource_version().to_string();
    server.edit::<Node>(None, "node-a", |n| {
        n.labels_mut().insert("pool".into(), "gpu".into());
    });
    server.compact();
    let mut expired = nodes
        .watch(&WatchParams::default(), &start)
        .await
        .unwrap()
        .boxed();
    match expired.try_next().await.unwrap() {
        Some(WatchEvent::Error(status)) => assert_eq!(status.code, 410),
        other => panic!("expected 410 Expired, got {other:?}"),
    }

    let now = server.resource_version().to_string();
    let mut selected = nodes
        .watch(&WatchParams::default().labels("pool=gpu"), &now)
        .await
        .unwrap()
        .boxed();
    server.edit::<Node>(None, "node-a", |n| {
        n.labels_mut().remove("pool");
    });
    match selected.try_next().await.unwrap() {
        Some(WatchEvent::Deleted(node)) => assert_eq!(node.name_any(), "node-a"),
        other => panic!("leaving the selector must look like a deletion, got {other:?}"),
    }
}

#[tokio::test]
async fn bookmarks_arrive_when_allowed() {
    let server = FakeApiServer::new();
    server.set_bookmark_interval(Duration::from_millis(50));
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let mut stream = pods
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(event, Some(WatchEvent::Bookmark(_))), "{event:?}");
}

#[tokio::test]
async fn event_recorder_and_leases_work() {
    let server = FakeApiServer::new();
    let client = server.client();
    let stored = server.seed(&node("node-a"));
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "tessera-kubelet-plugin".into(),
            instance: Some("node-a".into()),
        },
    );
    let event = Event {
        type_: EventType::Warning,
        reason: "TopologyManagedRefused".into(),
        note: Some("device taints were dropped".into()),
        action: "PublishResourceSlices".into(),
        secondary: None,
    };
    recorder
        .publish(&event, &stored.object_ref(&()))
        .await
        .unwrap();
    recorder
        .publish(&event, &stored.object_ref(&()))
        .await
        .unwrap();
    let events = server.list::<K8sEvent>(Some("default"));
    assert_eq!(events.len(), 1, "the second publish patches the series");
    assert_eq!(events[0].reason.as_deref(), Some("TopologyManagedRefused"));
    assert_eq!(events[0].series.as_ref().map(|s| s.count), Some(2));

    let leases: Api<Lease> = Api::namespaced(client, "tessera");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("tessera-controller".into()),
            ..ObjectMeta::default()
        },
        ..Lease::default()
    };
    leases.create(&PostParams::default(), &lease).await.unwrap();
    assert!(
        server
            .get::<Lease>(Some("tessera"), "tessera-controller")
            .is_some()
    );
}

#[tokio::test]
async fn over_http_with_a_kubeconfig() {
    let server = FakeApiServer::new();
    server.set_version("v1.34.2");
    let http = server.serve_http().await.unwrap();
    let kubeconfig = std::fs::read_to_string(http.kubeconfig_path()).unwrap();
    assert!(kubeconfig.contains(http.url()));
    let client = http.client().await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "34")
    );
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    slices
        .patch(
            "node-a-0",
            &PatchParams::apply("tessera"),
            &Patch::Apply(slice("node-a-0", "node-a", &["gpu-0"])),
        )
        .await
        .unwrap();
    let listed = slices
        .list(&ListParams::default().fields("spec.nodeName=node-a,spec.driver=gpu.tessera.dev"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    assert!(server.get::<ResourceSlice>(None, "node-a-0").is_some());

    let waiter = server.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .wait_for::<Node>(None, "late", Duration::from_secs(10), |n| {
                n.labels().contains_key("ready")
            })
            .await
    });
    let nodes: Api<Node> = Api::all(client);
    let mut late = node("late");
    late.labels_mut().insert("ready".into(), "yes".into());
    nodes.create(&PostParams::default(), &late).await.unwrap();
    assert!(waiting.await.unwrap().is_ok());
}
