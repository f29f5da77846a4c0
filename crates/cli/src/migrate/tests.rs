use std::path::Path;

use super::*;

fn migrate(text: &str) -> Migration {
    let mut migration = Migration::default();
    migrate_text(&mut migration, Path::new("in.yaml"), text);
    migration
}

fn lines(migration: &Migration, not_carried: bool) -> Vec<&str> {
    migration
        .report
        .iter()
        .filter(|(bad, _)| *bad == not_carried)
        .map(|(_, l)| l.as_str())
        .collect()
}

#[test]
fn a_v1beta1_claim_template_is_lifted_renamed_and_its_config_translated() {
    let m = migrate(
        r#"
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {namespace: ns, name: t}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: "device.attributes['gpu.nvidia.com'].productName == 'x'"}
      constraints:
      - matchAttribute: gpu.nvidia.com/productName
      config:
      - requests: [gpu]
        opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Long}}
"#,
    );
    let object = &m.files[0].1[0];
    assert_eq!(object["apiVersion"], "resource.k8s.io/v1");
    let devices = &object["spec"]["spec"]["devices"];
    let exactly = &devices["requests"][0]["exactly"];
    assert_eq!(exactly["deviceClassName"], "gpu.tessera.dev");
    assert_eq!(
        exactly["selectors"][0]["cel"]["expression"],
        "device.attributes['gpu.tessera.dev'].productName == 'x'"
    );
    assert_eq!(
        devices["constraints"][0]["matchAttribute"],
        "gpu.tessera.dev/productName"
    );
    let opaque = &devices["config"][0]["opaque"];
    assert_eq!(opaque["driver"], "gpu.tessera.dev");
    assert_eq!(
        opaque["parameters"]["apiVersion"],
        "gpu.tessera.dev/v1alpha1"
    );
    assert_eq!(
        opaque["parameters"]["sharing"]["timeSlicing"]["interval"],
        "Long"
    );
    assert!(lines(&m, true).is_empty(), "{:?}", lines(&m, true));
    let changes = lines(&m, false);
    assert!(
        changes.iter().any(|l| l.contains(
            "ResourceClaimTemplate/ns/t: spec.spec.devices.requests[0].exactly.deviceClassName: gpu.nvidia.com → gpu.tessera.dev"
        )),
        "{changes:?}"
    );
}

#[test]
fn nvidia_classes_are_dropped_and_what_cannot_be_honoured_is_reported() {
    let m = migrate(
        r#"
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com}
spec:
  selectors: [{cel: {expression: "device.driver == 'gpu.nvidia.com'"}}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {namespace: ns, name: c}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: mig.nvidia.com
        selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].addressingMode == 'HMM'"}}]
    config:
    - opaque:
        driver: gpu.nvidia.com
        parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: MigDeviceConfig, sharing: {strategy: MPS, mpsConfig: {multiUser: true}}}
---
apiVersion: gpu.resource.nvidia.com/v1alpha1
kind: GpuClaimParameters
metadata: {namespace: ns, name: p}
---
apiVersion: v1
kind: Pod
metadata: {namespace: ns, name: pod}
"#,
    );
    let objects = &m.files[0].1;
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["ResourceClaim", "Pod"]);
    let claim = &objects[0];
    assert_eq!(
        claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
        "mig.gpu.tessera.dev"
    );
    assert_eq!(
        claim["spec"]["devices"]["config"],
        Value::Sequence(vec![]),
        "the config that cannot be honoured is dropped"
    );
    let bad = lines(&m, true);
    assert_eq!(bad.len(), 3, "{bad:?}");
    assert!(
        bad[0].contains("attribute `addressingMode`: Tessera does not publish"),
        "{bad:?}"
    );
    assert!(
        bad[1].contains("field `sharing.mpsConfig.multiUser`"),
        "{bad:?}"
    );
    assert!(
        bad[2].contains("GpuClaimParameters/ns/p: not carried over"),
        "{bad:?}"
    );
    assert!(
        lines(&m, false)
            .iter()
            .any(|l| l.contains("NVIDIA's DeviceClass `gpu.nvidia.com` dropped"))
    );
}

#[test]
fn device_plugin_replicas_and_mig_strategy_become_chart_values() {
    let m = migrate(
        r#"
version: v1
flags:
  migStrategy: mixed
  nvidiaDriverRoot: /run/nvidia/driver
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
    - name: nvidia.com/mig-1g.10gb
      replicas: 2
"#,
    );
    assert!(m.files[0].1.is_empty());
    let values: Value = Value::Mapping(m.values.clone());
    assert_eq!(values["kubeletPlugin"]["sharing"]["consumableShares"], 4);
    assert_eq!(values["kubeletPlugin"]["driverRoot"], "/run/nvidia/driver");
    assert_eq!(values["extendedResources"]["migPrefix"], "nvidia.com/mig-");
    let bad = lines(&m, true);
    assert_eq!(bad.len(), 2, "{bad:?}");
    // Without renameByDefault, `nvidia.com/gpu` meant a share; on Tessera it is a whole GPU.
    assert!(
        bad[0].contains("sharing.timeSlicing.renameByDefault"),
        "{bad:?}"
    );
    assert!(
        bad[1].contains("sharing.timeSlicing.resources[1]"),
        "{bad:?}"
    );
}

#[test]
fn device_plugin_config_in_a_config_map_with_mps() {
    let m = migrate(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {namespace: gpu-operator, name: dp-config}
data:
  any: |-
    version: v1
    sharing:
      mps:
        renameByDefault: true
        resources:
        - name: nvidia.com/gpu
          replicas: 10
  big: |-
    version: v1
    sharing:
      timeSlicing:
        resources:
        - name: nvidia.com/gpu
          replicas: 100
"#,
    );
    let values: Value = Value::Mapping(m.values.clone());
    assert_eq!(values["kubeletPlugin"]["sharing"]["consumableShares"], 10);
    assert_eq!(
        values["extendedResources"]["sharedGpu"],
        "nvidia.com/gpu.shared"
    );
    assert!(
        lines(&m, false)
            .iter()
            .any(|l| l.contains("MPS: give the claims")),
        "{:?}",
        m.report
    );
    let bad = lines(&m, true);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].contains("data.big"), "{bad:?}");
}

fn migrate_converting_pods(text: &str) -> Migration {
    let mut migration = Migration {
        pod_conversion: Some(pods::chart_table()),
        ..Migration::default()
    };
    migrate_text(&mut migration, Path::new("in.yaml"), text);
    migration
}

const DEVICE_PLUGIN_WORKLOADS: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: train, namespace: team-a}
spec:
  template:
    spec:
      containers:
      - name: main
        resources: {limits: {nvidia.com/gpu: 4, memory: 1Gi}}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly, namespace: team-a}
spec:
  jobTemplate:
    spec:
      template:
        spec:
          containers:
          - name: main
            resources: {limits: {nvidia.com/gpu: 4}}
---
apiVersion: v1
kind: Pod
metadata: {name: pinned, namespace: team-a}
spec:
  nodeName: node-1
  containers:
  - name: main
    resources: {limits: {nvidia.com/mig-1g.10gb: 1}}
"#;

#[test]
fn device_plugin_pods_are_converted_only_when_asked() {
    let plain = migrate(DEVICE_PLUGIN_WORKLOADS);
    assert_eq!(plain.files[0].1.len(), 3, "objects pass through");
    assert_eq!(
        plain.files[0].1[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        4
    );
    assert!(plain.report.is_empty(), "{:?}", plain.report);
}

#[test]
fn device_plugin_pods_get_claims_the_gate_and_their_templates() {
    let m = migrate_converting_pods(DEVICE_PLUGIN_WORKLOADS);
    let objects = &m.files[0].1;
    // Deployment, its template, CronJob (same template, printed once), Pod.
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["Deployment", "ResourceClaimTemplate", "CronJob", "Pod"]
    );
    let deployment = &objects[0]["spec"]["template"]["spec"];
    assert_eq!(
        deployment["resourceClaims"][0]["resourceClaimTemplateName"],
        "tessera-gpu-4"
    );
    assert_eq!(
        deployment["schedulingGates"][0]["name"],
        "gpu.tessera.dev/topology-aware"
    );
    assert_eq!(
        serde_json::to_value(&deployment["containers"][0]["resources"]).unwrap(),
        serde_json::json!({"claims": [{"name": "tessera-gpu-c0"}], "limits": {"memory": "1Gi"}})
    );
    let cron = &objects[2]["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert_eq!(cron["resourceClaims"][0]["name"], "tessera-gpu-c0");
    let template = &objects[1];
    assert_eq!(template["metadata"]["namespace"], "team-a");
    assert_eq!(
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"],
        4
    );
    // The bound pod is left as written, and the report says why.
    assert_eq!(
        objects[3]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"],
        1
    );
    assert_eq!(
        lines(&m, true),
        [
            "in.yaml: Pod/team-a/pinned: not carried over: spec: device-plugin conversion skipped: the pod is bound to node node-1 (spec.nodeName): a bound pod cannot get a scheduling gate"
        ]
    );
    assert_eq!(
        lines(&m, false)[0],
        "in.yaml: Deployment/team-a/train: spec.template.spec.containers[main].resources: nvidia.com/gpu: 4 → claim tessera-gpu-c0 from ResourceClaimTemplate tessera-gpu-4 (class gpu.tessera.dev), gate gpu.tessera.dev/topology-aware"
    );
}

/// NVIDIA's extended-resources MIG example: a user-written class for one MIG profile, with
/// the extended resource name the device plugin used, and a pod's claim naming it.
#[test]
fn a_user_written_mig_profile_class_is_carried_with_tessera_selectors() {
    let m = migrate(
        r#"
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: mig-1g-12gb.gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile == '1g.12gb'"
  extendedResourceName: nvidia.com/mig-1g.12gb
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {namespace: ns, name: slice}
spec:
  devices:
    requests:
    - name: mig
      exactly: {deviceClassName: mig-1g-12gb.gpu.nvidia.com}
"#,
    );
    assert!(lines(&m, true).is_empty(), "{:?}", lines(&m, true));
    let objects = &m.files[0].1;
    assert_eq!(objects.len(), 2, "both objects are carried");
    let class = &objects[0];
    assert_eq!(class["metadata"]["name"], "mig-1g-12gb.gpu.nvidia.com");
    assert_eq!(
        class["spec"]["selectors"][0]["cel"]["expression"],
        "device.driver == 'gpu.tessera.dev' && device.attributes['gpu.tessera.dev'].type == 'mig' && device.attributes['gpu.tessera.dev'].profile == '1g.12gb'"
    );
    assert_eq!(class["spec"].get("extendedResourceName"), None);
    assert_eq!(
        objects[1]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
        "mig-1g-12gb.gpu.nvidia.com"
    );
    let changes = lines(&m, false);
    for wanted in [
        "written for NVIDIA's devices (MIG profile `1g.12gb`): carried",
        "`nvidia.com/mig-1g.12gb` removed: Tessera's chart serves it from class `mig-1g.12gb.gpu.tessera.dev`",
    ] {
        assert!(
            changes.iter().any(|l| l.contains(wanted)),
            "{wanted}: {changes:?}"
        );
    }

    // NVIDIA's own classes for what Tessera does not offer are still dropped.
    let m = migrate(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: compute-domain-daemon.nvidia.com}\nspec: {}\n",
    );
    assert!(m.files[0].1.is_empty());
    assert!(
        lines(&m, true)
            .iter()
            .any(|l| l.contains("VFIO passthrough or ComputeDomains")),
        "{:?}",
        lines(&m, true)
    );
}
