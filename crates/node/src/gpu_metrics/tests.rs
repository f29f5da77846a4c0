use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use tessera_gpu_inventory::MockSource;
use tessera_prepare::claims::InMemoryClaims;
use tessera_prepare::inventory::NodeInventory;
use tessera_process::Heartbeat;

use super::idle::IdleSettings;
use super::monitor::{GpuMonitor, GpuMonitorSettings, MonitorState, RecordedPodEvents, XidCounts};
use super::*;

fn gpu(uuid: &str, utilization: u32) -> GpuTelemetry {
    GpuTelemetry {
        uuid: uuid.into(),
        utilization_percent: Some(utilization),
        memory_utilization_percent: Some(10),
        memory_used_bytes: Some(1 << 30),
        memory_total_bytes: Some(80 << 30),
        power_milliwatts: Some(350_500),
        temperature_celsius: Some(61),
        ecc_corrected: Some(0),
        ecc_uncorrected: None,
        failures: Vec::new(),
    }
}

fn holder(uid: &str, claim: &str, device: &str, gpu_uuid: &str) -> HeldDevice {
    HeldDevice {
        claim_uid: uid.into(),
        namespace: "ml".into(),
        claim: claim.into(),
        request: "gpu".into(),
        device: device.into(),
        gpu_uuid: gpu_uuid.into(),
    }
}

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "ml".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

fn text(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text
}

#[test]
fn series_label_free_gpus_by_name_and_held_devices_by_claim_and_pod() {
    let gpus = [gpu("GPU-0", 0), gpu("GPU-1", 80), gpu("GPU-2", 3)];
    let holders = [
        holder("u-train", "train", "gpu-1", "GPU-1"),
        // Two MIG devices of GPU-2, two claims: each carries the whole GPU's values.
        holder("u-a", "a", "gpu-2-mig-1g-10gb-0", "GPU-2"),
        holder("u-b", "b", "gpu-2-mig-1g-10gb-1", "GPU-2"),
    ];
    let pods = HashMap::from([
        ("u-train".into(), vec![pod("train-0"), pod("train-1")]),
        ("u-a".into(), Vec::new()),
    ]);
    let labelled = series(&gpus, &holders, &pods, |uuid| {
        (uuid == "GPU-0").then(|| "gpu-0".to_owned())
    });
    let rows: Vec<(&str, &str, &str, &str)> = labelled
        .iter()
        .map(|(l, g)| {
            (
                l.claim.as_str(),
                l.pod.as_str(),
                l.device.as_str(),
                g.uuid.as_str(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("", "", "gpu-0", "GPU-0"),
            ("a", "", "gpu-2-mig-1g-10gb-0", "GPU-2"),
            ("b", "", "gpu-2-mig-1g-10gb-1", "GPU-2"),
            ("train", "train-0", "gpu-1", "GPU-1"),
            ("train", "train-1", "gpu-1", "GPU-1"),
        ]
    );
    assert_eq!(labelled[3].0.namespace, "ml");
    assert_eq!(labelled[3].0.request, "gpu");
    assert_eq!(
        labelled[0].0.namespace, "",
        "a free GPU has no claim labels"
    );
}

#[test]
fn updates_remove_the_series_of_claims_that_went() {
    let mut registry = Registry::default();
    let metrics = GpuMetrics::new(&mut registry);
    let gpus = [gpu("GPU-0", 80), gpu("GPU-1", 0)];
    let name = |uuid: &str| Some(format!("gpu-{}", &uuid[4..]));
    let no_pods = HashMap::new();
    let held = [
        holder("u-a", "a", "gpu-0", "GPU-0"),
        holder("u-b", "b", "gpu-1", "GPU-1"),
    ];
    metrics.update(&series(&gpus, &held, &no_pods, name), |_| 2);
    let first = text(&registry);
    assert!(
        first.contains(r#"tessera_node_gpu_utilization_percent{namespace="ml",pod="",claim="a",request="gpu",device="gpu-0",uuid="GPU-0"} 80"#),
        "{first}"
    );
    assert!(first.contains(r#"tessera_node_gpu_power_watts{namespace="ml",pod="",claim="a",request="gpu",device="gpu-0",uuid="GPU-0"} 350.5"#), "{first}");
    assert!(first.contains(r#"tessera_node_gpu_xid_errors{namespace="ml",pod="",claim="b",request="gpu",device="gpu-1",uuid="GPU-1"} 2"#), "{first}");
    assert!(
        !first.contains("tessera_node_gpu_ecc_uncorrected_errors{"),
        "a value the GPU does not report has no series: {first}"
    );

    // Claim a goes: its series go, GPU-0 is reported free; nothing else remains of it.
    for _ in 0..50 {
        metrics.update(&series(&gpus, &held[1..], &no_pods, name), |_| 2);
    }
    let after = text(&registry);
    assert!(!after.contains(r#"claim="a""#), "{after}");
    assert!(
        after.contains(r#"tessera_node_gpu_utilization_percent{namespace="",pod="",claim="",request="",device="gpu-0",uuid="GPU-0"} 80"#),
        "{after}"
    );
    assert_eq!(metrics.series_count(), 2, "one series per GPU and holder");
    let utilization_lines = after
        .lines()
        .filter(|l| l.starts_with("tessera_node_gpu_utilization_percent{"))
        .count();
    assert_eq!(utilization_lines, 2, "{after}");
}

/// Values a test scripts.
struct Scripted(Mutex<Vec<(String, u32)>>);

impl TelemetrySource for Scripted {
    fn sample(&self) -> Result<Vec<GpuTelemetry>, String> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(uuid, utilization)| gpu(uuid, *utilization))
            .collect())
    }
}

fn reserved_claim(
    name: &str,
    uid: &str,
    pods: &[&str],
) -> k8s_openapi::api::resource::v1::ResourceClaim {
    let reserved: Vec<serde_json::Value> = pods
        .iter()
        .map(|p| serde_json::json!({"resource": "pods", "name": p, "uid": format!("uid-{p}")}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "ml", "name": name, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"reservedFor": reserved},
    }))
    .unwrap()
}

#[tokio::test]
async fn the_monitor_labels_pods_and_reports_an_idle_claim_once() {
    let source = Arc::new(MockSource::new("dgx-h100").unwrap());
    let inventory = Arc::new(NodeInventory::read(source).unwrap());
    let uuids: Vec<String> = inventory
        .current()
        .gpus
        .iter()
        .map(|g| g.uuid.clone())
        .collect();
    let scripted = Arc::new(Scripted(Mutex::new(
        uuids.iter().map(|u| (u.clone(), 0)).collect(),
    )));
    let claims = Arc::new(InMemoryClaims::new());
    claims.put(reserved_claim("idle", "u-idle", &["idle-pod"]));
    claims.put(reserved_claim("busy", "u-busy", &["busy-pod"]));
    let holders = vec![
        holder("u-idle", "idle", "gpu-0", &uuids[0]),
        holder("u-busy", "busy", "gpu-1", &uuids[1]),
    ];
    let events = Arc::new(RecordedPodEvents::default());
    let mut registry = Registry::default();
    let settings = GpuMonitorSettings {
        interval: Duration::from_secs(1),
        idle: Some(IdleSettings {
            threshold_percent: 5,
            window: Duration::ZERO,
        }),
    };
    let monitor = GpuMonitor {
        source: scripted.clone(),
        holders: Arc::new(move || holders.clone()),
        inventory,
        claims,
        events: events.clone(),
        metrics: GpuMetrics::new(&mut registry),
        xids: XidCounts::default(),
        settings,
        heartbeat: Heartbeat::new("GPU monitor", settings.max_silence()),
    };
    scripted.0.lock().unwrap()[1].1 = 80;
    let mut state = MonitorState::new(&settings);
    monitor.sample_once(&mut state).await;
    let metrics = text(&registry);
    let busy = format!(
        r#"tessera_node_gpu_utilization_percent{{namespace="ml",pod="busy-pod",claim="busy",request="gpu",device="gpu-1",uuid="{}"}} 80"#,
        uuids[1]
    );
    assert!(metrics.contains(&busy), "{metrics}");
    assert!(
        metrics.contains(r#"tessera_node_idle_claim{namespace="ml",claim="idle"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains("tessera_node_idle_claims 1"), "{metrics}");
    assert!(
        metrics.contains(r#"device="gpu-7""#),
        "free GPUs are named: {metrics}"
    );
    let recorded = events.events();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].0, pod("idle-pod"));
    assert!(
        recorded[0].1.contains("claim ml/idle holds gpu-0"),
        "{}",
        recorded[0].1
    );

    monitor.sample_once(&mut state).await;
    assert_eq!(events.events().len(), 1, "an idle claim is reported once");

    // Busy again: no longer idle.
    scripted.0.lock().unwrap()[0].1 = 50;
    monitor.sample_once(&mut state).await;
    let metrics = text(&registry);
    assert!(!metrics.contains("tessera_node_idle_claim{"), "{metrics}");
    assert!(metrics.contains("tessera_node_idle_claims 0"), "{metrics}");
    assert!(
        metrics.contains(r#"tessera_node_gpu_samples_total{result="success"} 3"#),
        "{metrics}"
    );
}
