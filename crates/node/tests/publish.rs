//! The publisher against the API-server fake: what it writes, the generation across restarts and
//! inventory changes, stale slices, managed mode and its refusal, health taints, failures, and
//! the publish loop reacting to the Node, the inventory, a wiped pool and lost GPUs.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
use kube::ResourceExt;
use kube::api::ObjectMeta;
use prometheus_client::registry::Registry;
use tessera_fake_apiserver::{FakeApiServer, Fault, Verb};
use tessera_gpu_inventory::{DeviceSource, GpuInventory, MockSource};
use tessera_kubelet_grpc::{HealthStatus, RegistrationState};
use tessera_node::health::{HealthFindings, SharedFindings};
use tessera_node::metrics::NodeMetrics;
use tessera_node::publish::runner::PublishLoop;
use tessera_node::publish::{
    MANAGED_MODE_REFUSED_REASON, PublishInput, Publisher, PublisherConfig, WatchedNode, watch_node,
};
use tessera_nvml::{HealthEvent, HealthEventKind};
use tessera_prepare::inventory::NodeInventory;
use tessera_process::Heartbeat;
use tokio::sync::watch;

const NODE: &str = "node-a";
const DRIVER: &str = "gpu.tessera.dev";
const MANAGED_TAINT: &str = "gpu.tessera.dev/topology-managed";

fn node(managed: bool) -> Node {
    let mut node = Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    if managed {
        node.labels_mut()
            .insert("gpu.tessera.dev/topology-managed".into(), "true".into());
    }
    node
}

fn inventory(name: &str) -> GpuInventory {
    MockSource::new(name).unwrap().inventory().unwrap()
}

fn publisher(server: &FakeApiServer) -> Publisher {
    sharing_publisher(server, "disabled")
}

fn sharing_publisher(server: &FakeApiServer, consumable_shares: &str) -> Publisher {
    Publisher::new(
        server.client(),
        PublisherConfig {
            node_name: NODE.into(),
            driver_name: DRIVER.into(),
            dynamic_mig: false,
            consumable_shares: consumable_shares.parse().unwrap(),
        },
        NodeMetrics::new(&mut Registry::default()),
    )
}

fn facts(server: &FakeApiServer) -> WatchedNode {
    WatchedNode::of(&server.get::<Node>(None, NODE).unwrap()).unwrap()
}

fn own_slices(server: &FakeApiServer) -> Vec<ResourceSlice> {
    server
        .list::<ResourceSlice>(None)
        .into_iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(NODE))
        .collect()
}

fn device_count(slices: &[ResourceSlice]) -> usize {
    slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum()
}

fn stray_slice(name: &str, node: &str, generation: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation,
                resource_slice_count: 1,
            },
            ..ResourceSliceSpec::default()
        },
    }
}

#[tokio::test]
async fn publishes_one_owned_slice_and_keeps_the_generation_across_restarts() {
    let server = FakeApiServer::new();
    let stored_node = server.seed(&node(false));
    server.seed(&stray_slice("node-a-gpu.tessera.dev-7", NODE, 0));
    server.seed(&stray_slice("node-b-gpu.tessera.dev-0", "node-b", 0));
    let inventory = inventory("dgx-h100");
    let findings = HealthFindings::default();
    let node = facts(&server);
    let input = PublishInput {
        inventory: &inventory,
        node: &node,
        findings: &findings,
    };

    let outcome = publisher(&server).publish(input).await.unwrap();
    assert_eq!(
        outcome.deleted,
        ["node-a-gpu.tessera.dev-7"],
        "stale slices go at start"
    );
    assert!(
        server
            .get::<ResourceSlice>(None, "node-b-gpu.tessera.dev-0")
            .is_some(),
        "other nodes' slices stay"
    );
    let slices = own_slices(&server);
    assert_eq!(slices.len(), 1);
    assert_eq!(device_count(&slices), 8);
    let slice = &slices[0];
    let owner = &slice.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NODE));
    assert_eq!(Some(owner.uid.clone()), stored_node.uid());
    assert_eq!(owner.controller, Some(false));
    assert_eq!(slice.spec.pool.name, NODE);
    let managers = slice.metadata.managed_fields.as_ref().unwrap();
    assert!(managers.iter().any(
        |m| m.manager.as_deref() == Some("tessera") && m.operation.as_deref() == Some("Apply")
    ));
    assert_eq!(server.request_count(Verb::Apply, "resourceslices"), 1);
    let first_generation = slice.spec.pool.generation;

    // A restarted plugin with the same devices keeps the generation and rewrites nothing new.
    let again = publisher(&server).publish(input).await.unwrap();
    assert_eq!(again.generation, first_generation);
    assert_eq!(
        own_slices(&server)[0].metadata.generation,
        slice.metadata.generation
    );

    // Fewer devices: the generation grows, also for a fresh process.
    let mut smaller = inventory.clone();
    smaller.gpus.truncate(4);
    smaller.gpus.iter_mut().for_each(|g| g.nvlinks.clear());
    let shrunk = publisher(&server)
        .publish(PublishInput {
            inventory: &smaller,
            ..input
        })
        .await
        .unwrap();
    assert_eq!(shrunk.generation, first_generation + 1);
    assert_eq!(device_count(&own_slices(&server)), 4);
}

#[tokio::test]
async fn consumable_shares_are_published_and_withdrawn_in_place() {
    let server = FakeApiServer::new();
    server.seed(&node(false));
    let inventory = inventory("dgx-h100");
    let findings = HealthFindings::default();
    let node = facts(&server);
    let input = PublishInput {
        inventory: &inventory,
        node: &node,
        findings: &findings,
    };
    let plain = publisher(&server).publish(input).await.unwrap();

    // A plugin restarted with `--consumable-shares=4`: same devices, now shared in 4.
    let shared = sharing_publisher(&server, "4")
        .publish(input)
        .await
        .unwrap();
    assert_eq!(shared.generation, plain.generation, "written in place");
    let slices = own_slices(&server);
    assert_eq!(device_count(&slices), 8);
    for device in slices[0].spec.devices.iter().flatten() {
        assert_eq!(
            device.allow_multiple_allocations,
            Some(true),
            "{}",
            device.name
        );
        let shares = &device.capacity.as_ref().unwrap()["shares"];
        assert_eq!(shares.value.0, "4");
        assert!(shares.request_policy.is_some());
    }

    // Back to disabled: server-side apply drops what the plugin no longer publishes.
    publisher(&server).publish(input).await.unwrap();
    for device in own_slices(&server)[0].spec.devices.iter().flatten() {
        assert_eq!(device.allow_multiple_allocations, None, "{}", device.name);
        let capacities = device.capacity.as_ref().unwrap();
        assert!(!capacities.contains_key("shares"), "{}", device.name);
        assert!(capacities.values().all(|c| c.request_policy.is_none()));
    }
}

#[tokio::test]
async fn a_managed_node_taints_every_device() {
    let server = FakeApiServer::new();
    server.seed(&node(true));
    let inventory = inventory("dgx-h100");
    let findings = HealthFindings::default();
    let node = facts(&server);
    let mut publisher = publisher(&server);
    let outcome = publisher
        .publish(PublishInput {
            inventory: &inventory,
            node: &node,
            findings: &findings,
        })
        .await
        .unwrap();
    assert!(outcome.topology_managed);
    let devices = own_slices(&server)[0].spec.devices.clone().unwrap();
    for device in &devices {
        let taints = device.taints.as_ref().expect("taints on every device");
        assert!(
            taints
                .iter()
                .any(|t| t.key == MANAGED_TAINT && t.effect == "NoSchedule"),
            "{}",
            device.name
        );
    }
    assert!(publisher.managed_refused().is_none());
}

#[tokio::test]
async fn managed_mode_is_refused_when_the_api_server_drops_device_taints() {
    let server = FakeApiServer::new();
    server.disable_device_taints();
    server.seed(&node(true));
    let inventory = inventory("dgx-h100");
    let findings = HealthFindings::default();
    let node = facts(&server);
    let mut publisher = publisher(&server);
    let input = PublishInput {
        inventory: &inventory,
        node: &node,
        findings: &findings,
    };
    let outcome = publisher.publish(input).await.unwrap();
    assert!(!outcome.topology_managed);
    let reason = publisher
        .managed_refused()
        .expect("managed mode refused")
        .to_owned();
    assert!(reason.contains("DRADeviceTaints"), "{reason}");
    let events = server.list::<K8sEvent>(Some("default"));
    let event = events
        .iter()
        .find(|e| e.reason.as_deref() == Some(MANAGED_MODE_REFUSED_REASON))
        .expect("a Node event");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some(NODE)
    );
    assert!(
        own_slices(&server)[0]
            .spec
            .devices
            .as_ref()
            .unwrap()
            .iter()
            .all(|d| d.taints.is_none())
    );

    // The refusal sticks: the next publish does not try (and does not write twice).
    server.clear_requests();
    publisher.publish(input).await.unwrap();
    assert_eq!(server.request_count(Verb::Apply, "resourceslices"), 1);
}

#[tokio::test]
async fn health_findings_taint_their_devices_and_failures_are_errors() {
    let server = FakeApiServer::new();
    server.seed(&node(false));
    let inventory = inventory("dgx-h100");
    let gpu = &inventory.gpus[5];
    let mut findings = HealthFindings::default();
    findings.record(
        &HealthEvent {
            gpu_uuid: gpu.uuid.clone(),
            kind: HealthEventKind::Xid(79),
            gpu_instance_id: None,
            compute_instance_id: None,
        },
        SystemTime::now(),
    );
    let node = facts(&server);
    let input = PublishInput {
        inventory: &inventory,
        node: &node,
        findings: &findings,
    };
    let mut publisher = publisher(&server);
    server.inject(Fault::on(Verb::Apply, "resourceslices").status(500));
    let error = publisher.publish(input).await.unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("cannot apply ResourceSlice node-a-gpu.tessera.dev-0"),
        "{error}"
    );

    publisher.publish(input).await.unwrap();
    let devices = own_slices(&server)[0].spec.devices.clone().unwrap();
    let tainted: Vec<_> = devices.iter().filter(|d| d.taints.is_some()).collect();
    assert_eq!(tainted.len(), 1);
    assert_eq!(tainted[0].name, format!("gpu-{}", gpu.minor));
    let taint = &tainted[0].taints.as_ref().unwrap()[0];
    assert_eq!(
        (
            taint.key.as_str(),
            taint.value.as_deref(),
            taint.effect.as_str()
        ),
        ("gpu.tessera.dev/xid", Some("79"), "NoExecute")
    );
}

/// A running publish loop and the channels it feeds.
struct RunningLoop {
    kubelet_health: watch::Receiver<Vec<tessera_kubelet_grpc::DeviceHealth>>,
    published: watch::Receiver<bool>,
    registration: watch::Sender<RegistrationState>,
    findings: SharedFindings,
    /// Holds the loop's metrics.
    registry: Registry,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn start_loop(server: &FakeApiServer, source: Arc<dyn DeviceSource>) -> RunningLoop {
    // The watch runs until the test's runtime ends.
    let (node, _node_task) = watch_node(server.client(), NODE, tessera_process::Stop::new());
    let (kubelet_health_tx, kubelet_health) = watch::channel(Vec::new());
    let (published_tx, published) = watch::channel(false);
    let (registration, registration_rx) = watch::channel(RegistrationState::Pending);
    let findings = SharedFindings::default();
    let mut registry = Registry::default();
    let metrics = NodeMetrics::new(&mut registry);
    let publish_loop = PublishLoop {
        publisher: Publisher::new(
            server.client(),
            PublisherConfig {
                node_name: NODE.into(),
                driver_name: DRIVER.into(),
                dynamic_mig: false,
                consumable_shares: Default::default(),
            },
            metrics.clone(),
        ),
        inventory: Arc::new(NodeInventory::read(source).unwrap()),
        findings: findings.clone(),
        node,
        registration: registration_rx,
        kubelet_health: kubelet_health_tx,
        published: published_tx,
        metrics,
        heartbeat: Heartbeat::new("publisher", Duration::from_secs(60)),
        rescan_interval: Duration::from_millis(100),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(publish_loop.run(async {
        stopped.await.ok();
    }));
    RunningLoop {
        kubelet_health,
        published,
        registration,
        findings,
        registry,
        stop,
        task,
    }
}

async fn wait_for_slices(
    server: &FakeApiServer,
    condition: impl Fn(&[ResourceSlice]) -> bool,
) -> Vec<ResourceSlice> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let slices = own_slices(server);
        if condition(&slices) {
            return slices;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out; slices now: {slices:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A double-bit ECC error recorded for GPU `sick` turns its device unhealthy for the kubelet and
/// taints it in the slice.
async fn a_double_bit_ecc_reaches_the_kubelet_and_the_slice(
    server: &FakeApiServer,
    running: &mut RunningLoop,
    sick: String,
) {
    running.findings.record(
        &HealthEvent {
            gpu_uuid: sick,
            kind: HealthEventKind::DoubleBitEcc,
            gpu_instance_id: None,
            compute_instance_id: None,
        },
        SystemTime::now(),
    );
    running
        .kubelet_health
        .wait_for(|h| {
            h.iter()
                .filter(|d| d.status == HealthStatus::Unhealthy)
                .count()
                == 1
        })
        .await
        .unwrap();
    wait_for_slices(server, |s| {
        s.iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .any(|d| {
                d.taints
                    .iter()
                    .flatten()
                    .any(|t| t.key == "gpu.tessera.dev/ecc")
            })
    })
    .await;
}

#[tokio::test]
async fn the_loop_follows_the_node_the_inventory_health_and_a_wiped_pool() {
    let server = FakeApiServer::new();
    let directory = tempfile::tempdir().unwrap();
    let topology = directory.path().join("topology.yaml");
    let full = inventory("pcie-l40s");
    std::fs::write(&topology, serde_yaml::to_string(&full).unwrap()).unwrap();
    let mut running = start_loop(&server, Arc::new(MockSource::from_file(&topology)));

    // Without the Node nothing is published, but the kubelet already gets its device list.
    running
        .kubelet_health
        .wait_for(|h| h.len() == 4)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(own_slices(&server).is_empty());
    assert!(!*running.published.borrow());

    server.seed(&node(false));
    running.published.wait_for(|p| *p).await.unwrap();
    let slices = wait_for_slices(&server, |s| device_count(s) == 4).await;
    let generation = slices[0].spec.pool.generation;

    server.edit::<Node>(None, NODE, |n| {
        n.labels_mut()
            .insert("gpu.tessera.dev/topology-managed".into(), "true".into());
    });
    wait_for_slices(&server, |s| {
        s.iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .all(|d| d.taints.is_some())
    })
    .await;

    let mut smaller = full.clone();
    smaller.gpus.truncate(3);
    std::fs::write(&topology, serde_yaml::to_string(&smaller).unwrap()).unwrap();
    let slices = wait_for_slices(&server, |s| device_count(s) == 3).await;
    assert_eq!(slices[0].spec.pool.generation, generation + 1);
    running
        .kubelet_health
        .wait_for(|h| h.len() == 3)
        .await
        .unwrap();

    let sick = smaller.gpus[1].uuid.clone();
    a_double_bit_ecc_reaches_the_kubelet_and_the_slice(&server, &mut running, sick).await;

    // The kubelet wipes the pool when it restarts; the plugin re-registers and republishes.
    for slice in own_slices(&server) {
        server.remove::<ResourceSlice>(None, &slice.name_any());
    }
    running
        .registration
        .send_replace(RegistrationState::Registered);
    let slices = wait_for_slices(&server, |s| device_count(s) == 3).await;
    assert!(
        slices[0].spec.pool.generation > generation + 1,
        "the generation never goes back"
    );

    running.stop.send(()).unwrap();
    running.task.await.unwrap();
    assert_eq!(own_slices(&server).len(), 1, "stopping leaves the slices");
}

/// A source answering with whatever inventory the test sets, as the NVML backend reads it
/// (GPUs in `lost_gpus` are not in `gpus`).
struct ScriptedSource(std::sync::Mutex<GpuInventory>);

impl ScriptedSource {
    fn set(&self, inventory: GpuInventory) {
        *self.0.lock().unwrap() = inventory;
    }
}

impl DeviceSource for ScriptedSource {
    fn inventory(&self) -> Result<GpuInventory, tessera_gpu_inventory::SourceError> {
        Ok(self.0.lock().unwrap().clone())
    }

    fn describe(&self) -> String {
        "scripted".into()
    }
}

/// `full` as NVML reads it with the GPU `uuid` lost.
fn lost_read(full: &GpuInventory, uuid: &str) -> GpuInventory {
    let mut read = full.clone();
    read.gpus.retain(|g| g.uuid != uuid);
    read.lost_gpus = vec![uuid.to_owned()];
    read
}

fn unreachable_devices(slices: &[ResourceSlice]) -> Vec<(String, String)> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .flat_map(|d| {
            d.taints
                .iter()
                .flatten()
                .filter(|t| t.key == "gpu.tessera.dev/unreachable")
                .map(|t| (d.name.clone(), t.effect.clone()))
        })
        .collect()
}

fn unhealthy_devices_metric(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .find(|l| l.starts_with("tessera_node_unhealthy_devices "))
        .unwrap_or_else(|| panic!("no unhealthy_devices gauge in:\n{text}"))
        .to_owned()
}

#[tokio::test]
async fn a_lost_gpu_stays_published_tainted_unreachable_until_it_answers() {
    let server = FakeApiServer::new();
    server.seed(&node(false));
    let full = inventory("pcie-l40s");
    let never_seen = full.gpus[3].uuid.clone();
    let source = Arc::new(ScriptedSource(std::sync::Mutex::new(lost_read(
        &full,
        &never_seen,
    ))));
    let mut running = start_loop(&server, source.clone());

    // Lost at start: nothing is known about it, so it is not published.
    running.published.wait_for(|p| *p).await.unwrap();
    let slices = wait_for_slices(&server, |s| device_count(s) == 3).await;
    assert!(unreachable_devices(&slices).is_empty());
    assert_eq!(running.kubelet_health.borrow().len(), 3);

    source.set(full.clone());
    wait_for_slices(&server, |s| device_count(s) == 4).await;

    // Lost after it was seen: published with its last facts, tainted, UNHEALTHY.
    let lost = &full.gpus[1];
    let lost_device = format!("gpu-{}", lost.minor);
    source.set(lost_read(&full, &lost.uuid));
    let slices = wait_for_slices(&server, |s| !unreachable_devices(s).is_empty()).await;
    assert_eq!(device_count(&slices), 4, "the lost GPU stays published");
    assert_eq!(
        unreachable_devices(&slices),
        [(lost_device.clone(), "NoExecute".to_owned())]
    );
    let health = running
        .kubelet_health
        .wait_for(|h| h.iter().any(|d| d.status == HealthStatus::Unhealthy))
        .await
        .unwrap()
        .clone();
    let sick: Vec<_> = health
        .iter()
        .filter(|d| d.status == HealthStatus::Unhealthy)
        .collect();
    assert_eq!(sick.len(), 1);
    assert_eq!(sick[0].device_name, lost_device);
    assert!(
        sick[0].message.contains("GPU_IS_LOST"),
        "{}",
        sick[0].message
    );
    assert_eq!(
        unhealthy_devices_metric(&running.registry),
        "tessera_node_unhealthy_devices 1"
    );

    // It answers again: the taint goes at the next rescan.
    source.set(full.clone());
    let slices = wait_for_slices(&server, |s| unreachable_devices(s).is_empty()).await;
    assert_eq!(device_count(&slices), 4);
    running
        .kubelet_health
        .wait_for(|h| h.len() == 4 && h.iter().all(|d| d.status == HealthStatus::Healthy))
        .await
        .unwrap();
    assert_eq!(
        unhealthy_devices_metric(&running.registry),
        "tessera_node_unhealthy_devices 0"
    );

    running.stop.send(()).unwrap();
    running.task.await.unwrap();
}
