//! `tessera explain` run as a binary on objects written to a temporary directory: slices rendered
//! by `tessera inventory`, a DeviceClass, claims (some allocated), Node objects.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("the tessera binary runs")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "tessera failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

const CLASS: &str = r#"
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.tessera.dev
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "gpu"
"#;

fn claim(name: &str, count: u32) -> String {
    format!(
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}
  namespace: team-a
spec:
  devices:
    requests:
    - name: gpus
      exactly:
        deviceClassName: gpu.tessera.dev
        count: {count}
"#
    )
}

/// An allocated claim holding `gpus` of `node`.
fn allocated_claim(name: &str, node: &str, gpus: &[u32]) -> String {
    let results: String = gpus
        .iter()
        .map(|g| {
            format!(
                "\n        - request: gpus\n          driver: gpu.tessera.dev\n          pool: {node}\n          device: gpu-{g}"
            )
        })
        .collect();
    format!(
        "{}status:\n  allocation:\n    devices:\n      results:{results}\n",
        claim(name, gpus.len() as u32)
    )
}

/// A directory with two DGX H100 nodes' slices (rendered by `tessera inventory`), the class and
/// the given extra documents.
fn objects(dir: &Path, extra: &[String]) {
    for node in ["node-a", "node-b"] {
        let slices = ok(&tessera(&[
            "inventory",
            "--topology",
            "dgx-h100",
            "--node-name",
            node,
            "-o",
            "yaml",
        ]));
        std::fs::write(dir.join(format!("{node}.yaml")), slices).unwrap();
    }
    std::fs::write(dir.join("class.yaml"), CLASS).unwrap();
    std::fs::write(dir.join("claims.yaml"), extra.join("\n---\n")).unwrap();
}

fn explain_json(dir: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["explain", "--objects", dir.to_str().unwrap(), "-o", "json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(&tessera(&args))).expect("JSON output")
}

fn devices(report: &Value) -> Vec<String> {
    report["allocation"]["devices"]["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            format!(
                "{}/{}",
                r["pool"].as_str().unwrap(),
                r["device"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn an_allocatable_claim_gets_the_first_fit_node_and_devices() {
    let dir = tempfile::tempdir().unwrap();
    objects(dir.path(), &[claim("train", 2)]);
    let report = explain_json(dir.path(), &["--claim", "team-a/train"]);
    assert_eq!(report["node"], "node-a");
    assert_eq!(devices(&report), ["node-a/gpu-0", "node-a/gpu-1"]);
    assert_eq!(
        report["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0],
        "node-a"
    );
    assert_eq!(report["unsatisfiable"], Value::Array(vec![]));
}

#[test]
fn allocated_claims_in_the_objects_count_as_in_use() {
    let dir = tempfile::tempdir().unwrap();
    objects(
        dir.path(),
        &[
            allocated_claim("big", "node-a", &[0, 1, 2, 3, 4, 5, 6]),
            claim("train", 2),
        ],
    );
    let report = explain_json(dir.path(), &["--claim", "team-a/train"]);
    assert_eq!(report["node"], "node-b", "node-a has one GPU left");

    let report = explain_json(dir.path(), &["--claim", "team-a/train", "--node", "node-a"]);
    assert_eq!(report["node"], Value::Null);
    assert_eq!(report["allocation"], Value::Null);
    let unsatisfiable = report["unsatisfiable"].as_array().unwrap();
    assert_eq!(unsatisfiable.len(), 1);
    assert_eq!(unsatisfiable[0]["node"], "node-a");
    let reasons: Vec<&str> = unsatisfiable[0]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert!(
        reasons[0].starts_with("claim team-a/train, request gpus (class gpu.tessera.dev) wants 2 devices: 8 devices on the node, 8 match the class selectors, 8 match the request selectors, 1 available"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].contains("in use by another claim: gpu.tessera.dev/node-a/gpu-0"),
        "{reasons:?}"
    );
}

#[test]
fn an_unsatisfiable_claim_is_explained_for_every_node_in_text() {
    let dir = tempfile::tempdir().unwrap();
    objects(dir.path(), &[claim("huge", 9)]);
    let out = ok(&tessera(&[
        "explain",
        "--objects",
        dir.path().to_str().unwrap(),
        "--claim",
        "team-a/huge",
        "--mode",
        "topology-aware",
    ]));
    assert!(
        out.starts_with("claim team-a/huge cannot be allocated (topology-aware):\n"),
        "{out}"
    );
    for node in ["node-a", "node-b"] {
        assert!(
            out.contains(&format!("node {node}: cannot allocate\n")),
            "{out}"
        );
    }
    assert!(
        out.contains("wants 9 devices: 8 devices on the node"),
        "{out}"
    );
    assert!(out.contains("8 available — not enough"), "{out}");
}

#[test]
fn topology_aware_text_names_the_node_devices_and_score() {
    let dir = tempfile::tempdir().unwrap();
    objects(
        dir.path(),
        &[allocated_claim("other", "node-b", &[0]), claim("train", 1)],
    );
    let out = ok(&tessera(&[
        "explain",
        "--objects",
        dir.path().to_str().unwrap(),
        "--claim",
        "team-a/train",
        "--mode",
        "topology-aware",
    ]));
    // A partly used node is filled before a whole one is broken.
    assert!(
        out.starts_with("claim team-a/train can be allocated on node node-b (topology-aware):\n"),
        "{out}"
    );
    assert!(
        out.contains("  request gpus -> gpu.tessera.dev/node-b/gpu-1\n"),
        "{out}"
    );
    assert!(out.contains("  score: communication cost 0,"), "{out}");
}

#[test]
fn node_objects_and_lists_are_read() {
    let dir = tempfile::tempdir().unwrap();
    objects(dir.path(), &[claim("train", 1)]);
    let nodes = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: node-b
    labels: {zone: z1}
- apiVersion: v1
  kind: ConfigMap
  metadata:
    name: unrelated
"#;
    std::fs::write(dir.path().join("nodes.yaml"), nodes).unwrap();
    // Only node-b is a known node now; node-a's slices name a node that does not exist.
    let report = explain_json(dir.path(), &["--claim", "team-a/train"]);
    assert_eq!(report["node"], "node-b");
}

#[test]
fn a_missing_claim_fails_with_the_claims_found() {
    let dir = tempfile::tempdir().unwrap();
    objects(dir.path(), &[claim("train", 1)]);
    let out = tessera(&[
        "explain",
        "--objects",
        dir.path().to_str().unwrap(),
        "--claim",
        "team-a/nope",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("claim team-a/nope is not among the objects (claims found: team-a/train)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("pass the file that holds the claim with --objects"),
        "from files, the hint is to add a file: {stderr}"
    );
}

#[test]
fn a_selector_error_fails_naming_claim_selector_and_device() {
    let dir = tempfile::tempdir().unwrap();
    let bad = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: bad
  namespace: team-a
spec:
  devices:
    requests:
    - name: gpus
      exactly:
        deviceClassName: gpu.tessera.dev
        selectors:
        - cel:
            expression: device.attributes["gpu.tessera.dev"].noSuchAttribute == "x"
"#;
    objects(dir.path(), &[bad.to_owned()]);
    let out = tessera(&[
        "explain",
        "--objects",
        dir.path().to_str().unwrap(),
        "--claim",
        "team-a/bad",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("claim team-a/bad, request gpus: selector #0 on device gpu.tessera.dev/node-a/gpu-0: CEL runtime error"),
        "{stderr}"
    );
}

/// The claim kube-scheduler made for pod `p`'s `nvidia.com/gpu: 2`, allocated on node-a.
const SCHEDULER_CLAIM: &str = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: p-extended-resources-x7k2p
  namespace: team-a
  annotations: {resource.kubernetes.io/extended-resource-claim: "true"}
  ownerReferences:
  - {apiVersion: v1, kind: Pod, name: p, uid: uid-p, controller: true}
spec:
  devices:
    requests:
    - name: container-0-request-0
      exactly: {deviceClassName: gpu.tessera.dev, allocationMode: ExactCount, count: 2}
status:
  allocation:
    devices:
      results:
      - {request: container-0-request-0, driver: gpu.tessera.dev, pool: node-a, device: gpu-0}
      - {request: container-0-request-0, driver: gpu.tessera.dev, pool: node-a, device: gpu-1}
"#;

/// Pod `p` (bound, its claim made) and pod `gated` (asking for the same, still gated), the two
/// nodes, and the chart's DeviceClasses in place of the test's class.
fn extended_resource_objects(dir: &Path) {
    objects(dir, &[SCHEDULER_CLAIM.to_owned()]);
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/tessera/files/deviceclasses.yaml");
    std::fs::copy(shipped, dir.join("class.yaml")).unwrap();
    let pods = r#"
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: team-a, uid: uid-p}
spec:
  nodeName: node-a
  containers:
  - name: ctr
    resources:
      limits: {nvidia.com/gpu: "2"}
      requests: {nvidia.com/gpu: "2"}
status:
  phase: Running
  extendedResourceClaimStatus:
    resourceClaimName: p-extended-resources-x7k2p
    requestMappings:
    - {containerName: ctr, resourceName: nvidia.com/gpu, requestName: container-0-request-0}
---
apiVersion: v1
kind: Pod
metadata: {name: gated, namespace: team-a, uid: uid-gated}
spec:
  schedulingGates: [{name: gpu.tessera.dev/topology-aware}]
  containers:
  - name: ctr
    resources:
      limits: {nvidia.com/gpu: "4"}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
status: {allocatable: {cpu: "64", memory: 512Gi, pods: "110"}}
---
apiVersion: v1
kind: Node
metadata: {name: node-b}
status: {allocatable: {cpu: "64", memory: 512Gi, pods: "110"}}
"#;
    std::fs::write(dir.join("pods.yaml"), pods).unwrap();
}

#[test]
fn the_claim_the_scheduler_made_for_extended_resources_is_explained_like_any_claim() {
    let dir = tempfile::tempdir().unwrap();
    extended_resource_objects(dir.path());
    let claim = "team-a/p-extended-resources-x7k2p";
    let text = ok(&tessera(&[
        "explain",
        "--objects",
        dir.path().to_str().unwrap(),
        "--claim",
        claim,
    ]));
    assert!(
        text.contains(&format!(
            "note: claim {claim} is the one kube-scheduler made for the extended resources of pod p"
        )) && text.contains("is already allocated; explaining a fresh allocation"),
        "{text}"
    );
    // Its own allocation does not count against it: first fit gives the same two GPUs.
    let report = explain_json(dir.path(), &["--claim", claim]);
    assert_eq!(devices(&report), ["node-a/gpu-0", "node-a/gpu-1"]);
    assert!(
        report["allocation"]["devices"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["request"] == "container-0-request-0")
    );
}

#[test]
fn a_pod_with_extended_resources_is_left_to_the_scheduler_and_points_at_its_claim() {
    let dir = tempfile::tempdir().unwrap();
    extended_resource_objects(dir.path());
    let gated = explain_json(dir.path(), &["--pod", "team-a/gated"]);
    assert_eq!(gated["action"], "LeaveToScheduler", "{gated}");
    let message = gated["message"].as_str().unwrap();
    assert!(
        message.contains("nvidia.com/gpu (DeviceClass gpu.tessera.dev)")
            && message.contains("kube-scheduler allocates those itself"),
        "{message}"
    );
    assert!(gated.get("extendedResourceClaim").is_none(), "{gated}");
    // The running pod: not the controller's, and explain says where its devices are.
    let running = explain_json(dir.path(), &["--pod", "team-a/p"]);
    assert_eq!(running["action"], "NotCandidate", "{running}");
    assert_eq!(
        running["extendedResourceClaim"],
        "team-a/p-extended-resources-x7k2p"
    );
    let text = ok(&tessera(&[
        "explain",
        "--objects",
        dir.path().to_str().unwrap(),
        "--pod",
        "team-a/p",
    ]));
    assert!(
        text.contains("its extended resources are in claim team-a/p-extended-resources-x7k2p, made and allocated by kube-scheduler"),
        "{text}"
    );
}

#[test]
fn the_shared_class_selects_only_gpus_published_for_sharing() {
    // shared.gpu.tessera.dev (nvidia.com/gpu.shared): whole GPUs with allowMultipleAllocations.
    // Without them nothing matches; publishing gpu-5 of node-b shared makes it the only choice.
    let dir = tempfile::tempdir().unwrap();
    let claim = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: share, namespace: team-a}
spec:
  devices:
    requests:
    - name: container-0-request-0
      exactly: {deviceClassName: shared.gpu.tessera.dev, count: 1}
"#;
    objects(dir.path(), &[claim.to_owned()]);
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/tessera/files/deviceclasses.yaml");
    std::fs::copy(shipped, dir.path().join("class.yaml")).unwrap();
    let report = explain_json(dir.path(), &["--claim", "team-a/share"]);
    assert!(report["allocation"].is_null(), "{report}");

    let path = dir.path().join("node-b.yaml");
    let mut slices: Vec<serde_yaml::Value> =
        serde_yaml::Deserializer::from_str(&std::fs::read_to_string(&path).unwrap())
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
    let mut marked = 0;
    for slice in &mut slices {
        for device in slice["spec"]["devices"]
            .as_sequence_mut()
            .into_iter()
            .flatten()
        {
            if device["name"] == "gpu-5" {
                device["allowMultipleAllocations"] = true.into();
                marked += 1;
            }
        }
    }
    assert_eq!(marked, 1);
    let text: Vec<String> = slices
        .iter()
        .map(|s| serde_yaml::to_string(s).unwrap())
        .collect();
    std::fs::write(&path, text.join("---\n")).unwrap();
    let report = explain_json(dir.path(), &["--claim", "team-a/share"]);
    assert_eq!(devices(&report), ["node-b/gpu-5"], "{report}");
}

/// A claim of `memory` on one GPU; `allocated` = (node, gpu, share id) writes its allocation as
/// the scheduler does for a multi-allocatable device.
fn memory_claim(name: &str, memory: &str, allocated: Option<(&str, u32, &str)>) -> String {
    let claim = format!(
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}
  namespace: team-a
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.tessera.dev
        capacity:
          requests:
            memory: {memory}
"#
    );
    match allocated {
        None => claim,
        Some((node, gpu, share)) => format!(
            "{claim}status:\n  allocation:\n    devices:\n      results:\n      - request: gpu\n        driver: gpu.tessera.dev\n        pool: {node}\n        device: gpu-{gpu}\n        shareID: {share}\n        consumedCapacity:\n          memory: {memory}\n          multiprocessors: \"0\"\n"
        ),
    }
}

#[test]
fn shared_devices_are_explained_with_what_their_claims_consumed() {
    let dir = tempfile::tempdir().unwrap();
    let shared = ok(&tessera(&[
        "inventory",
        "--topology",
        "dgx-h100",
        "--node-name",
        "node-s",
        "--consumable-shares",
        "memory",
        "-o",
        "yaml",
    ]));
    assert!(
        shared.contains("allowMultipleAllocations: true"),
        "{shared}"
    );
    std::fs::write(dir.path().join("node-s.yaml"), shared).unwrap();
    std::fs::write(dir.path().join("class.yaml"), CLASS).unwrap();
    let claims = [
        memory_claim(
            "r0",
            "20Gi",
            Some(("node-s", 0, "a0000000-0000-4000-8000-000000000000")),
        ),
        memory_claim(
            "r1",
            "20Gi",
            Some(("node-s", 0, "a0000000-0000-4000-8000-000000000001")),
        ),
        memory_claim(
            "r2",
            "20Gi",
            Some(("node-s", 0, "a0000000-0000-4000-8000-000000000002")),
        ),
        memory_claim("small", "15Gi", None),
        memory_claim("large", "30Gi", None),
    ];
    std::fs::write(dir.path().join("claims.yaml"), claims.join("\n---\n")).unwrap();

    // 60Gi of gpu-0's 81559Mi are consumed: 15Gi still fits there, 30Gi goes to gpu-1.
    let small = explain_json(dir.path(), &["--claim", "team-a/small"]);
    assert_eq!(devices(&small), ["node-s/gpu-0"]);
    let result = &small["allocation"]["devices"]["results"][0];
    assert!(result["shareID"].is_string(), "{result}");
    assert_eq!(result["consumedCapacity"]["memory"], "15Gi");
    let large = explain_json(dir.path(), &["--claim", "team-a/large"]);
    assert_eq!(devices(&large), ["node-s/gpu-1"]);

    let text = ok(&tessera(&[
        "explain",
        "--objects",
        dir.path().to_str().unwrap(),
        "--claim",
        "team-a/small",
    ]));
    assert!(text.contains("share "), "the text names the share: {text}");

    // Pinned to gpu-0, the large claim is explained by the memory left there.
    let pinned = memory_claim("large", "30Gi", None).replace(
        "deviceClassName: gpu.tessera.dev\n",
        "deviceClassName: gpu.tessera.dev\n        selectors:\n        - cel:\n            expression: device.attributes[\"gpu.tessera.dev\"].minor == 0\n",
    );
    let claims = [&claims[..3], &[pinned]].concat();
    std::fs::write(dir.path().join("claims.yaml"), claims.join("\n---\n")).unwrap();
    let report = explain_json(dir.path(), &["--claim", "team-a/large"]);
    let reasons = report["unsatisfiable"][0]["reasons"].to_string();
    assert!(
        reasons.contains("gpu-0") && reasons.contains("memory"),
        "the refusal names the device and its exhausted memory: {reasons}"
    );
}

#[test]
fn a_pod_another_gate_holds_is_explained_with_the_gates_it_waits_for() {
    let dir = tempfile::tempdir().unwrap();
    let pod = r#"
apiVersion: v1
kind: Pod
metadata: {name: queued, namespace: team-a, uid: uid-queued}
spec:
  schedulingGates:
  - {name: gpu.tessera.dev/topology-aware}
  - {name: kueue.x-k8s.io/admission}
  resourceClaims: [{name: gpus, resourceClaimName: train}]
  containers:
  - name: ctr
    resources: {claims: [{name: gpus}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
status: {allocatable: {cpu: "64", memory: 512Gi, pods: "110"}}
"#;
    objects(dir.path(), &[claim("train", 4), pod.to_owned()]);
    let report = explain_json(dir.path(), &["--pod", "team-a/queued"]);
    assert_eq!(report["action"], "WaitingForGates", "{report}");
    assert_eq!(
        report["gates"],
        serde_json::json!(["kueue.x-k8s.io/admission"])
    );
    let text = ok(&tessera(&[
        "explain",
        "--objects",
        dir.path().to_str().unwrap(),
        "--pod",
        "team-a/queued",
    ]));
    assert!(
        text.starts_with(
            "pod team-a/queued waits for other scheduling gates (kueue.x-k8s.io/admission): "
        ) && text.contains("Kueue removes its gates when it admits"),
        "{text}"
    );
}

/// A pod without the controller's gate, pending, whose MIG claim asks for an H100 profile on a
/// node of A100s (NVIDIA's quickstart on the wrong GPUs): explain says why kube-scheduler cannot
/// allocate the claim, and which profiles the node has.
#[test]
fn an_ungated_pending_pod_gets_its_claims_explained_with_the_profiles_present() {
    let dir = tempfile::tempdir().unwrap();
    let slices = ok(&tessera(&[
        "inventory",
        "--topology",
        "hgx-a100-mig",
        "--node-name",
        "node-m",
        "-o",
        "yaml",
    ]));
    std::fs::write(dir.path().join("node-m.yaml"), slices).unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/tessera/files/deviceclasses.yaml");
    std::fs::copy(shipped, dir.path().join("class.yaml")).unwrap();
    let pod = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: slice, namespace: team-a}
spec:
  devices:
    requests:
    - name: mig
      exactly:
        deviceClassName: mig.gpu.tessera.dev
        selectors:
        - cel: {expression: "device.attributes['gpu.tessera.dev'].profile == '1g.12gb'"}
---
apiVersion: v1
kind: Pod
metadata: {name: quickstart, namespace: team-a, uid: uid-q}
spec:
  resourceClaims:
  - {name: mig, resourceClaimName: slice}
  containers:
  - name: ctr
    resources: {claims: [{name: mig}]}
status: {phase: Pending}
---
apiVersion: v1
kind: Node
metadata: {name: node-m}
status: {allocatable: {cpu: "64", memory: 512Gi, pods: "110"}}
"#;
    std::fs::write(dir.path().join("pod.yaml"), pod).unwrap();
    let text = ok(&tessera(&[
        "explain",
        "pod/quickstart",
        "-n",
        "team-a",
        "--objects",
        dir.path().to_str().unwrap(),
    ]));
    for wanted in [
        "kube-scheduler places it",
        "claim team-a/slice: cannot be allocated on any node",
        "0 match the request selectors",
        "MIG profiles of the class's devices on this node: 1g.10gb",
    ] {
        assert!(text.contains(wanted), "{wanted}:\n{text}");
    }
    let report = explain_json(dir.path(), &["--pod", "team-a/quickstart"]);
    assert_eq!(
        report["schedulerClaims"][0]["claim"], "team-a/slice",
        "{report}"
    );
    assert!(report["schedulerClaims"][0].get("allocatableOn").is_none());
}
