//! `tessera-kubelet-plugin` as a process against the API-server fake over HTTP, with the
//! kubelet simulator on its sockets: registration, the published pool, readiness, managed mode,
//! a graceful restart that keeps the pool generation and removes stale slices, and — through
//! fake-nvml — an injected XID reaching the slice taints and the kubelet health stream; a
//! corrupt checkpoint (garbage, truncated, wrong checksum, unknown version) quarantined and
//! state rebuilt without a crash loop.

mod support;

use std::io::Write;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
use kube::ResourceExt;
use kube::api::ObjectMeta;
use support::process::*;
use tessera_fake_apiserver::FakeApiServer;
use tessera_gpu_inventory::{DeviceSource, GpuInventory, MockSource};
use tessera_kubelet_grpc::simulator::KubeletSimulator;
use tessera_kubelet_grpc::{ClaimRef, HealthStatus, PreparedDevice};

const WAIT: Duration = Duration::from_secs(30);

fn stale_slice(name: &str) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: "gpu.tessera.dev".into(),
            node_name: Some(NODE.into()),
            pool: ResourcePool {
                name: NODE.into(),
                generation: 0,
                resource_slice_count: 1,
            },
            ..ResourceSliceSpec::default()
        },
    }
}

/// A claim allocated gpu-0 gets its CDI spec and is counted in the metrics; unprepare removes
/// the spec.
async fn prepare_and_unprepare_a_claim(
    server: &FakeApiServer,
    kubelet: &KubeletSimulator,
    dirs: &PluginDirs,
    plugin: &PluginProcess,
) {
    let (reference, devices_of_claim) = prepare_train(server, kubelet).await;
    assert_eq!(devices_of_claim[0].device_name, "gpu-0");
    assert!(!devices_of_claim[0].cdi_device_ids.is_empty());
    let specs = || std::fs::read_dir(dirs.path("cdi")).map_or(0, |d| d.count());
    assert_eq!(specs(), 1, "one CDI spec for the claim");
    let (_, metrics) = eventually(dirs, "the metrics endpoint", WAIT, async || {
        plugin.http_get("/metrics").await
    })
    .await;
    assert!(
        metrics.contains(r#"tessera_node_claims_total{operation="prepare",result="success"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("tessera_node_prepared_devices 1"),
        "{metrics}"
    );
    unprepare_ok(kubelet, &reference).await;
    assert_eq!(specs(), 0, "unprepare removes the spec");
}

/// `/readyz` turns ready, the metrics count the published devices, `/healthz` answers, and the
/// kubelet's health stream lists every device healthy.
async fn assert_ready_and_healthy(
    plugin: &PluginProcess,
    kubelet: &KubeletSimulator,
    dirs: &PluginDirs,
) {
    eventually(dirs, "/readyz to turn ready", WAIT, async || {
        plugin
            .http_get("/readyz")
            .await
            .filter(|(code, _)| *code == 200)
    })
    .await;
    let (code, metrics) = plugin.http_get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("tessera_node_published_devices 8"),
        "{metrics}"
    );
    assert_eq!(plugin.http_get("/healthz").await.unwrap().0, 200);

    let mut health = kubelet.watch_health().await.unwrap();
    let listed = tokio::time::timeout(WAIT, health.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(listed.len(), 8);
    assert!(listed.iter().all(|d| d.status == HealthStatus::Healthy));
}

/// Labels the node topology-managed and waits until every published device carries the
/// managed taint: the slices then.
async fn turn_managed(server: &FakeApiServer, dirs: &PluginDirs) -> Vec<ResourceSlice> {
    server.edit::<Node>(None, support::process::NODE, |n| {
        n.labels_mut().insert(MANAGED_LABEL.into(), "true".into());
    });
    eventually(
        dirs,
        "the topology-managed taint on every device",
        WAIT,
        async || {
            let slices = own_slices(server);
            let tainted = devices(&slices).iter().all(|d| {
                d.taints
                    .iter()
                    .flatten()
                    .any(|t| t.key == MANAGED_LABEL && t.effect == "NoSchedule")
            });
            (tainted && !slices.is_empty()).then_some(slices)
        },
    )
    .await
}

/// A plugin started again with a stale slice of its pool published removes that slice, keeps
/// the pool generation from going back below `generation`, and turns ready.
async fn restart_over_a_stale_slice(
    server: &FakeApiServer,
    kubeconfig: &std::path::Path,
    dirs: &PluginDirs,
    generation: i64,
) {
    server.seed(&stale_slice("node-a-gpu.tessera.dev-9"));
    let restarted = PluginProcess::start(kubeconfig, dirs, &["--topology", "dgx-h100"], &[]);
    register(dirs).await;
    let slices = eventually(dirs, "the stale slice to go", WAIT, async || {
        let slices = own_slices(server);
        (slices.len() == 1).then_some(slices)
    })
    .await;
    assert_eq!(slices[0].name_any(), "node-a-gpu.tessera.dev-0");
    assert!(
        slices[0].spec.pool.generation >= generation,
        "the generation went back from {generation} to {}",
        slices[0].spec.pool.generation
    );
    assert_eq!(devices(&slices).len(), 8);
    eventually(dirs, "/readyz after the restart", WAIT, async || {
        restarted
            .http_get("/readyz")
            .await
            .filter(|(code, _)| *code == 200)
    })
    .await;
    assert!(restarted.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_publishes_turns_ready_and_restarts_without_going_back() {
    let (server, http, node) = api_server_with_node().await;
    let dirs = PluginDirs::new();
    let plugin = PluginProcess::start(
        http.kubeconfig_path(),
        &dirs,
        &["--topology", "dgx-h100"],
        &[],
    );

    let kubelet = register(&dirs).await;
    assert_eq!(kubelet.info().name, "gpu.tessera.dev");

    // The real claim-preparation driver is wired: a claim allocated gpu-0 gets its CDI spec.
    prepare_and_unprepare_a_claim(&server, &kubelet, &dirs, &plugin).await;

    let slices = eventually(&dirs, "8 devices in one slice", WAIT, async || {
        let slices = own_slices(&server);
        (slices.len() == 1 && devices(&slices).len() == 8).then_some(slices)
    })
    .await;
    let owner = &slices[0].owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", support::process::NODE)
    );
    assert_eq!(Some(owner.uid.clone()), node.uid());

    assert_ready_and_healthy(&plugin, &kubelet, &dirs).await;

    let slices = turn_managed(&server, &dirs).await;
    let generation = slices[0].spec.pool.generation;

    let status = plugin.terminate();
    assert!(
        status.success(),
        "SIGTERM is a clean stop: {status}\n{}",
        plugin_logs(&dirs)
    );
    assert!(
        !dirs.registration_socket().exists(),
        "the registration socket is gone"
    );
    assert_eq!(
        own_slices(&server).len(),
        1,
        "stopping does not delete the slices"
    );

    restart_over_a_stale_slice(&server, http.kubeconfig_path(), &dirs, generation).await;
}

/// A dgx-h100 behind the fake NVML: its inventory, and the plugin flags and environment that
/// load the fake library with a fake sysfs tree under `dirs` (a test adds its own to both).
fn fake_nvml_node(dirs: &PluginDirs) -> (GpuInventory, Vec<String>, Vec<(&'static str, String)>) {
    let inventory = MockSource::new("dgx-h100").unwrap().inventory().unwrap();
    let sysfs = dirs.path("sys");
    tessera_fake_nvml::sysfs::write_fake_sysfs(&sysfs, &inventory).unwrap();
    let library = fake_nvml_library();
    let flags = vec![
        "--nvml-lib".to_owned(),
        library.display().to_string(),
        "--sysfs-root".to_owned(),
        sysfs.display().to_string(),
    ];
    let env = vec![(tessera_fake_nvml::TOPOLOGY_ENV, "dgx-h100".to_owned())];
    (inventory, flags, env)
}

/// Seeds `ml/train`, allocated gpu-0, and prepares it through `kubelet`: its reference and the
/// devices prepared.
async fn prepare_train(
    server: &FakeApiServer,
    kubelet: &KubeletSimulator,
) -> (ClaimRef, Vec<PreparedDevice>) {
    let claim = server.seed(&tessera_prepare_harness::allocated_claim(
        "train",
        &[("gpu", "gpu-0")],
        Vec::new(),
    ));
    let reference = ClaimRef::new("ml", "train", claim.uid().unwrap());
    let prepared = kubelet
        .prepare(std::slice::from_ref(&reference))
        .await
        .unwrap();
    let devices = prepared[&reference.uid]
        .clone()
        .expect("the claim is prepared");
    (reference, devices)
}

/// Unprepares `reference` through `kubelet`; it must succeed.
async fn unprepare_ok(kubelet: &KubeletSimulator, reference: &ClaimRef) {
    let unprepared = kubelet
        .unprepare(std::slice::from_ref(reference))
        .await
        .unwrap();
    assert!(unprepared[&reference.uid].is_ok(), "{unprepared:?}");
}

/// The fake NVML library cargo built next to this test (it is a dev-dependency).
fn fake_nvml_library() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        deps.join(tessera_fake_nvml::LIBRARY_FILE_NAME),
        deps.join("..").join(tessera_fake_nvml::LIBRARY_FILE_NAME),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("libtessera_fake_nvml.so next to the test executable")
}

/// Waits until the 8 GPUs the fake NVML shows are published, each with its PCIe root read from
/// the fake sysfs tree.
async fn assert_the_nvml_inventory_published(server: &FakeApiServer, dirs: &PluginDirs) {
    let slices = eventually(dirs, "the NVML inventory published", WAIT, async || {
        let slices = own_slices(server);
        (devices(&slices).len() == 8).then_some(slices)
    })
    .await;
    let pcie_roots = devices(&slices)
        .iter()
        .filter(|d| {
            d.attributes
                .as_ref()
                .is_some_and(|a| a.contains_key("resource.kubernetes.io/pcieRoot"))
        })
        .count();
    assert_eq!(pcie_roots, 8, "PCI facts come from --sysfs-root");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_xid_taints_the_device_and_reaches_the_kubelet() {
    let (server, http, _) = api_server_with_node().await;
    let dirs = PluginDirs::new();
    let (inventory, flags, mut env) = fake_nvml_node(&dirs);
    let events = dirs.path("nvml-events");
    std::fs::write(&events, "").unwrap();
    env.push((tessera_fake_nvml::EVENTS_ENV, events.display().to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &flags, &env);
    let kubelet = register(&dirs).await;
    assert_the_nvml_inventory_published(&server, &dirs).await;

    let mut health = kubelet.watch_health().await.unwrap();
    let first = tokio::time::timeout(WAIT, health.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first.iter().all(|d| d.status == HealthStatus::Healthy));

    let sick = &inventory.gpus[3];
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(&events)
        .unwrap();
    writeln!(log, "xid {} 13", sick.uuid).unwrap();
    writeln!(log, "xid {} 79", sick.uuid).unwrap();
    drop(log);

    let device = format!("gpu-{}", sick.minor);
    let unhealthy = loop {
        let update = tokio::time::timeout(WAIT, health.next())
            .await
            .expect("a health update in time")
            .expect("the stream stays open")
            .unwrap();
        if let Some(found) = update.iter().find(|d| d.status == HealthStatus::Unhealthy) {
            break found.clone();
        }
    };
    assert_eq!(unhealthy.device_name, device);
    assert_eq!(unhealthy.pool_name, support::process::NODE);
    assert!(
        unhealthy.message.contains("XID 79"),
        "{}",
        unhealthy.message
    );

    let taint = eventually(&dirs, "the XID taint in the slice", WAIT, async || {
        let slices = own_slices(&server);
        devices(&slices)
            .iter()
            .find(|d| d.name == device)
            .and_then(|d| d.taints.clone())
            .and_then(|t| t.into_iter().find(|t| t.key == "gpu.tessera.dev/xid"))
    })
    .await;
    assert_eq!(
        (taint.value.as_deref(), taint.effect.as_str()),
        (Some("79"), "NoExecute")
    );
    let others_clean = devices(&own_slices(&server))
        .iter()
        .filter(|d| d.name != device)
        .all(|d| d.taints.is_none());
    assert!(
        others_clean,
        "the application XID 13 and other GPUs leave no taint"
    );
    let (_, metrics) = plugin.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains(r#"tessera_node_health_events_total{kind="xid",action="ignore"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"tessera_node_health_events_total{kind="xid",action="taint"} 1"#),
        "{metrics}"
    );
    assert!(plugin.terminate().success());
}

/// Writes the fake NVML's samples file through a new file, as a script would.
fn script_samples(path: &std::path::Path, text: &str) {
    let next = path.with_extension("new");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// Waits for the GPUIdle Event, a warning on the claim's pod, and the claim's idle series.
async fn assert_an_idle_event_on_the_pod(
    server: &FakeApiServer,
    dirs: &PluginDirs,
    plugin: &PluginProcess,
) {
    use k8s_openapi::api::events::v1::Event as K8sEvent;

    let event = eventually(
        dirs,
        "a GPUIdle Event on the claim's pod",
        WAIT,
        async || {
            server
                .list::<K8sEvent>(Some("ml"))
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("GPUIdle"))
        },
    )
    .await;
    let regarding = event.regarding.expect("the Event names its pod");
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("Pod"), Some("train-pod"))
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let (_, metrics) = plugin.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains(r#"tessera_node_idle_claim{namespace="ml",claim="train"} 1"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_metrics_label_the_pod_and_an_idle_claim_gets_an_event() {
    let (server, http, _) = api_server_with_node().await;
    let dirs = PluginDirs::new();
    let (inventory, mut flags, mut env) = fake_nvml_node(&dirs);
    let samples = dirs.path("nvml-samples");
    let held = &inventory.gpus[0];
    script_samples(
        &samples,
        &format!(
            "* utilization=0\n{} utilization=80 power-watts=300\n",
            held.uuid
        ),
    );
    flags.extend(["--gpu-metrics-interval", "200ms", "--idle-window", "1s"].map(str::to_owned));
    env.push((
        tessera_fake_nvml::SAMPLES_ENV,
        samples.display().to_string(),
    ));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &flags, &env);
    let kubelet = register(&dirs).await;
    let (reference, _) = prepare_train(&server, &kubelet).await;

    // The scripted 80% on gpu-0, labelled with the claim's pod (its status.reservedFor).
    let labels = format!(
        r#"{{namespace="ml",pod="train-pod",claim="train",request="gpu",device="gpu-0",uuid="{}"}}"#,
        held.uuid
    );
    let busy = format!("tessera_node_gpu_utilization_percent{labels} 80");
    let metrics = eventually(
        &dirs,
        "the scripted utilization of gpu-0",
        WAIT,
        async || {
            let (_, metrics) = plugin.http_get("/metrics").await?;
            metrics.contains(&busy).then_some(metrics)
        },
    )
    .await;
    assert!(
        metrics.contains(&format!("tessera_node_gpu_power_watts{labels} 300.0")),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"device="gpu-7""#) && metrics.contains(r#"claim="",request="""#),
        "free GPUs have series without claim labels: {metrics}"
    );
    assert!(
        !metrics.contains("tessera_node_idle_claim{"),
        "a busy claim is not idle: {metrics}"
    );

    // Scripted 0%: within the 1 s window (plus a sample), a GPUIdle Event on the pod.
    script_samples(&samples, "* utilization=0\n");
    assert_an_idle_event_on_the_pod(&server, &dirs, &plugin).await;

    // Unprepared: the claim's series go (bounded cardinality); gpu-0 is free again.
    unprepare_ok(&kubelet, &reference).await;
    let metrics = eventually(&dirs, "the claim's series to go", WAIT, async || {
        let (_, metrics) = plugin.http_get("/metrics").await?;
        (!metrics.contains(r#"claim="train""#)).then_some(metrics)
    })
    .await;
    assert!(
        metrics.contains(&format!(
            r#"tessera_node_gpu_utilization_percent{{namespace="",pod="",claim="",request="",device="gpu-0",uuid="{}"}} 0"#,
            held.uuid
        )),
        "{metrics}"
    );
    assert!(metrics.contains("tessera_node_idle_claims 0"), "{metrics}");
    assert!(plugin.terminate().success());
}

/// The damaged checkpoints a node may find: (what, damage, what the log must say).
fn damaged_checkpoints(good: &[u8]) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let mut envelope: serde_json::Value = serde_json::from_slice(good).unwrap();
    envelope["checksum"] = serde_json::Value::from("0".repeat(64));
    let wrong_checksum = serde_json::to_vec_pretty(&envelope).unwrap();
    envelope = serde_json::from_slice(good).unwrap();
    envelope["version"] = serde_json::Value::from(99);
    let future_version = serde_json::to_vec_pretty(&envelope).unwrap();
    vec![
        (
            "garbage",
            b"\x00\x13not a checkpoint".to_vec(),
            "cannot be parsed",
        ),
        (
            "truncated",
            good[..good.len() / 2].to_vec(),
            "cannot be parsed",
        ),
        ("wrong checksum", wrong_checksum, "checksum does not match"),
        ("unknown version", future_version, "has version 99"),
    ]
}

/// Seeds claims "whole" (gpu-0), "shared" (gpu-1, MPS) and "later" (gpu-2).
fn seed_three_claims(server: &FakeApiServer) -> Vec<ClaimRef> {
    use tessera_prepare_harness::{allocated_claim, claim_config, uid_of};

    let mps = claim_config(&[], "GpuConfig", serde_json::json!({"strategy": "MPS"}));
    [("whole", vec![]), ("shared", vec![mps]), ("later", vec![])]
        .into_iter()
        .enumerate()
        .map(|(i, (name, configs))| {
            let device = format!("gpu-{i}");
            server.seed(&allocated_claim(name, &[("gpu", &device)], configs));
            ClaimRef::new("ml", name, uid_of(name))
        })
        .collect()
}

/// The damaged checkpoint of `round` is kept, renamed, never deleted: one more quarantined file
/// per round, byte for byte; one clear log line says which file, what was wrong (`complaint`)
/// and where it went.
fn assert_quarantined_and_logged(
    dirs: &PluginDirs,
    plugin: &PluginProcess,
    damaged: &[u8],
    complaint: &str,
    round: usize,
    context: &dyn Fn() -> String,
) {
    use tessera_prepare::checkpoint::quarantined_files;

    let state = dirs.path("state");
    let checkpoint = state.join("checkpoint.json");
    let quarantined = quarantined_files(&state);
    assert_eq!(quarantined.len(), round + 1, "{}", context());
    let moved_to = quarantined
        .iter()
        .find(|p| std::fs::read(p).unwrap() == damaged)
        .unwrap_or_else(|| panic!("the damaged file is kept: {}", context()));
    // One clear log line: which file, what was wrong, where it went.
    let log =
        std::fs::read_to_string(dirs.path(&format!("plugin-{}.log", plugin.metrics_port))).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("could not be trusted"))
        .unwrap_or_else(|| panic!("no quarantine log line: {}", context()));
    for part in [
        checkpoint.display().to_string(),
        complaint.to_owned(),
        moved_to.display().to_string(),
    ] {
        assert!(line.contains(&part), "{part:?} not in {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_checkpoint_is_quarantined_and_state_rebuilt_without_a_crash_loop() {
    use tessera_prepare::checkpoint::quarantined_files;

    let (server, http, _) = api_server_with_node().await;
    let dirs = PluginDirs::new();
    let backend = ["--topology", "dgx-h100"];
    let claims = seed_three_claims(&server);
    let (held, later) = (&claims[..2], &claims[2]);

    let plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &backend, &[]);
    let kubelet = register(&dirs).await;
    let prepared = kubelet.prepare(held).await.unwrap();
    assert!(prepared.values().all(Result::is_ok), "{prepared:?}");
    plugin.kill();
    let state = dirs.path("state");
    let checkpoint = state.join("checkpoint.json");
    let good = std::fs::read(&checkpoint).unwrap();
    let specs = || {
        let mut names: Vec<String> = std::fs::read_dir(dirs.path("cdi"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let held_specs = specs();
    assert_eq!(held_specs.len(), 2);

    for (round, (what, damaged, complaint)) in damaged_checkpoints(&good).into_iter().enumerate() {
        std::fs::write(&checkpoint, &damaged).unwrap();
        let plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &backend, &[]);
        let kubelet = register(&dirs).await;
        let context = || format!("{what}\n{}", plugin_logs(&dirs));

        assert_quarantined_and_logged(&dirs, &plugin, &damaged, complaint, round, &context);

        // Rebuilt from the CDI specs and the API server: the same claims, the same answers.
        let rebuilt = tessera_prepare::checkpoint::decode(&std::fs::read(&checkpoint).unwrap())
            .unwrap_or_else(|e| panic!("the rebuilt checkpoint loads: {e}: {}", context()));
        let mut recorded: Vec<String> = rebuilt.claims.keys().map(ToString::to_string).collect();
        recorded.sort();
        let mut wanted: Vec<String> = held.iter().map(|c| c.uid.to_string()).collect();
        wanted.sort();
        assert_eq!(recorded, wanted, "{}", context());
        assert_eq!(specs(), held_specs, "{}", context());
        assert_eq!(
            kubelet.prepare(held).await.unwrap(),
            prepared,
            "{}",
            context()
        );
        let (_, metrics) = eventually(&dirs, "the metrics endpoint", WAIT, async || {
            plugin.http_get("/metrics").await
        })
        .await;
        assert!(
            metrics.contains("tessera_node_checkpoint_quarantines_total 1"),
            "{metrics}"
        );
        // No crash loop: the process is still up after serving.
        assert!(
            plugin.child.lock().unwrap().try_wait().unwrap().is_none(),
            "{}",
            context()
        );
        plugin.kill();
    }

    // And the node keeps working: a new claim is prepared, everything is unprepared.
    let plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &backend, &[]);
    let kubelet = register(&dirs).await;
    let answer = kubelet.prepare(std::slice::from_ref(later)).await.unwrap();
    assert!(answer[&later.uid].is_ok(), "{answer:?}");
    let answers = kubelet.unprepare(&claims).await.unwrap();
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    assert!(specs().is_empty());
    assert_eq!(quarantined_files(&state).len(), 4, "no new quarantine");
    assert!(plugin.terminate().success());
}
